"""Scheduling benchmark: Horus vs the baselines on the Philly and Alibaba-2023 traces.

    python bench/scheduling.py --quick            # ~2 min on 2 cores
    python bench/scheduling.py --json out.json    # full run, ~8 min

Every policy runs in the same process on the same jobs, cluster and seed, through the same
path the dashboard and ``manage.py simulate`` use (``scheduling.horus.experiments.run_experiment``).
Per-policy wall times are printed (the simulator's speed is measured here, not in tests).
Experiments (scale stated in each table's header):

* ``philly-256gpu`` (headline): all 82k Philly jobs at their real submit times
  on 256 GPUs, strict FIFO queue, every policy. ``overall`` = Horus / FIFO
  exclusive on it.
* ``alibaba-fill``: the ATC'23 fill method on the real 1,213-node cluster.
* ``alibaba-replay``: time-compressed replay on a 1/32 node sample.
* ``predictor-error``: Philly-256, Horus with oracle predictions plus
  log-normal noise (sigma), next to the real predictor's out-of-fold output.
* ``philly-256gpu-share-penalty``: sensitivity, the Horus paper's interference
  model (+20 % while sharing, not work-conserving) - what the headline used to be.
* full run only: the "capped" sensitivity, cluster-size sweep, FIFO with
  backfill, a higher-utilization workload, two more workload seeds.

Interference: every replay uses the default ``fitted`` model unless its table
says otherwise - work-conserving, fitted per GPU type to Gavel's measured
co-location throughputs (``scheduling/horus/interference.py``,
``bench/interference_fit.py`` for its fit error). ``util%`` is DELIVERED work
(standalone-equivalent GPU time per GPU time, <= 100 %); ``occ%`` is occupancy
(each GPU's sum of its jobs' utilizations, capped at 100 %).

Utilization and memory per job come from SYNTHETIC profiles
(``synthetic-roofline-v1``, no GPU was used); see scheduling/horus/profiles.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if sys.path[0] != str(ROOT):  # first, so the package wins over this file's own name (bench/scheduling.py)
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from scheduling.horus.experiments import reference_predictor, run_experiment  # noqa: E402
from scheduling.horus.policies import POLICIES  # noqa: E402
from scheduling.horus.predictor import UtilizationPredictor  # noqa: E402
from scheduling.horus.profiles import load_profiles  # noqa: E402

ALL = ["fifo_exclusive", "gandiva", "best_fit", "random_fit", "fgd", "horus", "horus_migrate"]
BASE = "fifo_exclusive"
GOALS = {"makespan_ratio": ("<=", 0.65), "wait_ratio": ("<=", 0.30), "util_ratio": (">=", 1.6)}


def log(msg: str = "") -> None:
    print(msg, flush=True)


def _fmt_t(s: float) -> str:
    if s >= 2 * 86400:
        return f"{s / 86400:.1f}d"
    if s >= 3600:
        return f"{s / 3600:.1f}h"
    if s >= 60:
        return f"{s / 60:.1f}m"
    return f"{s:.0f}s"


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _r(x: float | None) -> str:
    return "   -" if x is None else f"{x:4.2f}"


def replay_table(title: str, scale: str, results: list[dict[str, Any]], base: dict[str, Any] | None) -> None:
    w = max(22, max(len(r["label"]) for r in results) + 2)
    log(f"\n== {title}")
    log(f"   scale: {scale}")
    log(f"   {'policy':<{w}}{'makespan':>9}{'wait':>8}{'p95wait':>9}{'JCT':>8}{'util%':>7}{'occ%':>7}{'busy%':>7}"
        f"{'mk/FIFO':>8}{'wt/FIFO':>8}{'ut/FIFO':>8}{'oversub':>8}{'OOM':>6}{'migr':>6}{'wall':>6}")
    for r in results:
        mk = _ratio(r["makespan_s"], base["makespan_s"]) if base else None
        wt = _ratio(r["mean_wait_s"], base["mean_wait_s"]) if base else None
        ut = _ratio(r["util_mean_pct"], base["util_mean_pct"]) if base else None
        log(f"   {r['label']:<{w}}{_fmt_t(r['makespan_s']):>9}{_fmt_t(r['mean_wait_s']):>8}{_fmt_t(r['p95_wait_s']):>9}"
            f"{_fmt_t(r['mean_jct_s']):>8}{r['util_mean_pct']:7.1f}{r.get('occupancy_pct', 0.0):7.1f}{r['util_busy_pct']:7.1f}"
            f"{_r(mk):>8}{_r(wt):>8}{_r(ut):>8}{r['oversub_gpu_time_frac']:8.2f}{r['oom_events']:6d}{r['migrations']:6d}"
            f"{r['wall_s']:5.1f}s")


def add_ratios(results: list[dict[str, Any]], base: dict[str, Any] | None) -> None:
    for r in results:
        r["ratios_vs_fifo_exclusive"] = None if base is None else {
            "makespan_ratio": _ratio(r["makespan_s"], base["makespan_s"]),
            "wait_ratio": _ratio(r["mean_wait_s"], base["mean_wait_s"]),
            "p95_wait_ratio": _ratio(r["p95_wait_s"], base["p95_wait_s"]),
            "jct_ratio": _ratio(r["mean_jct_s"], base["mean_jct_s"]),
            "util_ratio": _ratio(r["util_mean_pct"], base["util_mean_pct"]),
        }


PHILLY = {"jobs": 100_000, "gpus": 256, "gpus_per_node": 8, "timeseries_points": 100}  # all 82k jobs
ALIBABA_FILL = {"method": "fill", "scale": 1.0}  # the whole 1,213-node cluster
ALIBABA_REPLAY = {"method": "replay", "scale": 1 / 32, "jobs": 100_000, "from_day": 114.0, "max_duration_s": 86400.0,
                  "target_load": 1.5, "backfill": 64, "timeseries_points": 100}


class Bench:
    """Runs experiments through the one path (``horus.experiments.run_experiment``) and keeps their records."""

    def __init__(self, seed: int, records, predictor):
        self.seed, self.records, self.predictor = seed, records, predictor
        self.experiments: list[dict[str, Any]] = []

    def run(self, trace: str, policies: list[str], *, seed: int | None = None,
            **params: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """``(experiment result, per-policy results each with a 'label')``."""
        out = run_experiment(trace=trace, policies=policies, seed=self.seed if seed is None else seed,
                             params=params, profiles=self.records, predictor=self.predictor)
        return out, [{**r, "label": name} for name, r in out["policies"].items()]

    def record(self, name: str, out: dict[str, Any], results: list[dict[str, Any]], **extra: Any) -> None:
        self.experiments.append({"name": name, "method": out["method"], "scale": out["scale"],
                                 "cluster": out["cluster"], "assumptions": out["assumptions"],
                                 "results": results, **extra})

    def replay(self, name: str, title: str, trace: str, policies: list[str], *, seed: int | None = None,
               extra: dict[str, Any] | None = None, **params: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Run, add ratios to FIFO exclusive, print the table and record it."""
        out, res = self.run(trace, policies, seed=seed, **params)
        base = next((r for r in res if r["label"] == BASE), None)
        add_ratios(res, base)
        replay_table(title, out["scale"], res, base)
        self.record(name, out, res, **(extra or {}))
        return out, res


def predictor_section(records, pred, seed: int) -> dict[str, Any]:
    ungrouped = UtilizationPredictor().train(records, seed=seed, group_by_model=False)
    pm = pred.metrics
    log("== predictor (XGBoost, graph features -> GPU util %, peak memory MB)")
    log(f"   trained on {pred.n_records} SYNTHETIC profile records ({', '.join(pred.sources)}), "
        f"{len({r.model for r in records})} zoo models x batch 1..256 x {len({r.gpu_model for r in records})} GPU models")
    log(f"   {pm['k_folds']}-fold, grouped by model (held-out models unseen): util RMSLE {pm['util']['rmsle']:.3f}, "
        f"MAE {pm['util']['mae_pct']:.1f} pct-pts; memory RMSLE {pm['mem']['rmsle']:.3f}, MAE {pm['mem']['mae_mb']:.0f} MB")
    um = ungrouped.metrics
    log(f"   {um['k_folds']}-fold by record (models seen, other batch sizes/GPUs): util RMSLE {um['util']['rmsle']:.3f}, "
        f"MAE {um['util']['mae_pct']:.1f}; memory RMSLE {um['mem']['rmsle']:.3f}, MAE {um['mem']['mae_mb']:.0f} MB")
    log("   (Horus paper: RMSLE 0.154 on real profiles; these are synthetic, so neither number predicts real accuracy)")
    for f in pm["per_fold"]:
        log(f"     fold {f['fold']}: held out {', '.join(f['held_out'])}: util RMSLE {f['util_rmsle']:.3f}, mem RMSLE {f['mem_rmsle']:.3f}")
    return {"grouped_by_model": dict(pm), "by_record": {k: v for k, v in um.items() if k != "per_fold"},
            "n_records": pred.n_records, "sources": pred.sources, "paper_rmsle": 0.154, "synthetic": True}


def philly_headline(bench: Bench) -> tuple[list[dict[str, Any]], float]:
    """Every policy on the whole Philly trace; ``(results, RMSLE of the predictions the policies saw)``."""
    out, res = bench.run("philly", ALL, **PHILLY)
    u = out["assumptions"]["utilization"]
    log(f"\n   job utilization assumption (true, from profiles): mean {u['true_mean']:.0f} %, quartiles "
        f"{u['true_p25']:.0f}/{u['true_median']:.0f}/{u['true_p75']:.0f} %, {u['share_below_20'] * 100:.0f} % of jobs < 20 %, "
        f"{u['share_above_90'] * 100:.0f} % > 90 %; policies see predictions with MAE {u['pred_mae']:.1f} pct-pts")
    base = next(r for r in res if r["label"] == BASE)
    add_ratios(res, base)
    replay_table("Philly replay, strict FIFO queue, interference fitted to Gavel's measured pairs (work-conserving)",
                 out["scale"], res, base)
    bench.record("philly-256gpu", out, res, headline=True, queue="strict FIFO")
    walls = ", ".join(f"{r['label']} {r['wall_s']:.1f} s" for r in res)
    log(f"   simulator speed, full trace ({out['trace']['jobs_used']} jobs) per policy: {walls} (goal <= 30 s on 2 cores)")
    return res, out["assumptions"]["prediction_util_rmsle"]


def fill_section(bench: Bench) -> None:
    out, fill = bench.run("alibaba", ALL, **ALIBABA_FILL)
    log("\n== Alibaba-2023 fill method (ATC'23): sampled pods submitted until the request reaches 100 % of capacity")
    log(f"   scale: {out['scale']}")
    log(f"   {'policy':<16}{'allocated':>10}{'unalloc GPUs':>13}{'frag rate':>10}{'frag GPUs':>10}{'failed':>8}{'1st fail at':>12}{'wall':>7}")
    for r in fill:
        ff = r["first_failure_arrived_share"]
        log(f"   {r['label']:<16}{r['allocated_share'] * 100:9.1f}%{r['unallocated_gpus']:13.0f}{r['frag_rate']:10.2f}"
            f"{r['frag_gpus']:10.0f}{r['failed']:8d}{'' if ff is None else f'{ff * 100:.0f}%':>12}{r['wall_s']:6.1f}s")
    bench.record("alibaba-fill", out, fill)


def error_sweep(bench: Bench, headline: list[dict[str, Any]], headline_rmsle: float, base: dict[str, Any],
                quick: bool) -> None:
    """Horus with oracle predictions x exp(N(0, sigma)), beside the trained predictor's own output."""
    sigmas = [0.0, 0.5] if quick else [0.0, 0.25, 0.5, 1.0]
    pols = ["horus"] if quick else ["horus", "horus_migrate"]
    sweep: list[dict[str, Any]] = []
    for sg in sigmas:
        out, res = bench.run("philly", pols, **{**PHILLY, "predictions": "oracle", "predictor_error": sg})
        for d in res:
            d.update(label=f"{d['label']} oracle+s{sg:g}", sigma=sg,
                     util_rmsle_of_predictions=out["assumptions"]["prediction_util_rmsle"])
            sweep.append(d)
    for p in pols:
        d = dict(next(r for r in headline if r["label"] == p))
        d.update(label=f"{p} predictor(oof)", sigma=None, util_rmsle_of_predictions=headline_rmsle)
        sweep.append(d)
    add_ratios(sweep, base)
    replay_table("Predictor error sweep (Philly-256): oracle predictions x exp(N(0, sigma)) vs the trained predictor",
                 out["scale"], sweep, base)
    for d in sweep:
        log(f"     {d['label']:<28} prediction RMSLE {d['util_rmsle_of_predictions']:.3f}")
    bench.record("predictor-error", out, sweep)


def full_extras(bench: Bench) -> None:
    main_pols = ["fifo_exclusive", "gandiva", "best_fit", "horus", "horus_migrate"]
    bench.replay("philly-256gpu-capped-interference",
                 "Sensitivity: capped interference (+20 % while sharing AND time-shared over 100 % demand)",
                 "philly", main_pols, extra={"interference": "capped"}, **{**PHILLY, "interference": "capped"})
    for n in (320, 384, 512):
        bench.replay(f"philly-{n}gpu", f"Cluster-size sweep: Philly on {n} GPUs", "philly", main_pols,
                     extra={"queue": "strict FIFO"}, **{**PHILLY, "gpus": n})
    bench.replay("philly-256gpu-backfill8", "Ablation: queue with backfill (first 8 waiting jobs may start out of order)",
                 "philly", ["fifo_exclusive", "horus", "horus_migrate", "best_fit"], extra={"queue": "backfill 8"},
                 **{**PHILLY, "backfill": 8})
    out, _ = bench.replay("philly-256gpu-busier-jobs", "Sensitivity: busier jobs (batch >= 16 only)", "philly",
                          ["fifo_exclusive", "horus", "horus_migrate"], **{**PHILLY, "min_batch": 16})
    hu = out["assumptions"]["utilization"]
    log(f"   (busier jobs: mean util {hu['true_mean']:.0f} %, median {hu['true_median']:.0f} %)")
    for sd in (1, 2):
        bench.replay(f"philly-256gpu-seed{sd}", f"Seed {sd} (another model/batch assignment and noise)", "philly",
                     ALL, seed=sd, extra={"seed": sd}, **PHILLY)


SHARING = ("gandiva", "best_fit", "random_fit", "horus", "horus_migrate")


def sharing_spread(results: list[dict[str, Any]]) -> float | None:
    """Slowest / fastest makespan among the sharing policies (1.0: they tie)."""
    mk = [r["makespan_s"] for r in results if r["label"] in SHARING]
    return max(mk) / min(mk) if len(mk) >= 2 else None


def overall_and_goals(res: list[dict[str, Any]], flat: list[dict[str, Any]], predictor_rmsle: float
                      ) -> tuple[dict[str, Any], dict[str, Any]]:
    horus = next(r for r in res if r["label"] == "horus")
    mig = next(r for r in res if r["label"] == "horus_migrate")
    best_other = min((r for r in res if not r["label"].startswith("horus")), key=lambda r: r["makespan_s"])
    hr, mr = horus["ratios_vs_fifo_exclusive"], mig["ratios_vs_fifo_exclusive"]
    ch = next(r for r in flat if r["label"] == "horus")["ratios_vs_fifo_exclusive"]
    cm = next(r for r in flat if r["label"] == "horus_migrate")["ratios_vs_fifo_exclusive"]
    overall = {
        "makespan_ratio": hr["makespan_ratio"], "wait_ratio": hr["wait_ratio"], "util_ratio": hr["util_ratio"],
        "jct_ratio": hr["jct_ratio"], "migrate_makespan_ratio": mr["makespan_ratio"],
        "migrate_wait_ratio": mr["wait_ratio"], "migrate_util_ratio": mr["util_ratio"],
        "horus_vs_best_other_makespan": horus["makespan_s"] / best_other["makespan_s"],
        "best_other_policy": best_other["label"], "experiment": "philly-256gpu",
        "interference": "fitted: work-conserving, fitted to Gavel's measured pairs",
        "horus_util_pct": horus["util_mean_pct"], "horus_occupancy_pct": horus.get("occupancy_pct"),
        "sharing_makespan_spread": sharing_spread(res), "flat_sharing_makespan_spread": sharing_spread(flat),
        "flat_makespan_ratio": ch["makespan_ratio"], "flat_wait_ratio": ch["wait_ratio"],
        "flat_util_ratio": ch["util_ratio"], "flat_migrate_makespan_ratio": cm["makespan_ratio"],
        "flat_migrate_wait_ratio": cm["wait_ratio"], "predictor_util_rmsle": predictor_rmsle,
        "profiles": "synthetic-roofline-v1",
    }
    goals = {}
    for k, (op, v) in GOALS.items():
        for who, val in (("horus", overall[k]), ("horus_migrate", overall[f"migrate_{k}"])):
            ok = val is not None and (val <= v if op == "<=" else val >= v)
            goals[f"{who}:{k}"] = {"goal": f"{op} {v}", "value": val, "met": ok}
    mo = mig["makespan_s"] / best_other["makespan_s"]
    for who, val in (("horus", overall["horus_vs_best_other_makespan"]), ("horus_migrate", mo)):
        goals[f"{who}:not_worse_than_best_other_makespan"] = {"goal": "<= 1.0", "value": val, "met": val <= 1.0}
    log("\n== overall (philly-256gpu, ours / fifo_exclusive)")
    log(f"   horus:         makespan {_r(overall['makespan_ratio'])}  wait {_r(overall['wait_ratio'])}  util {_r(overall['util_ratio'])}  "
        f"JCT {_r(overall['jct_ratio'])}")
    log(f"   horus_migrate: makespan {_r(overall['migrate_makespan_ratio'])}  wait {_r(overall['migrate_wait_ratio'])}  "
        f"util {_r(overall['migrate_util_ratio'])}")
    log(f"   sensitivity, flat +20 % (old model): horus makespan {_r(ch['makespan_ratio'])}  wait {_r(ch['wait_ratio'])}  "
        f"util {_r(ch['util_ratio'])}; horus_migrate makespan {_r(cm['makespan_ratio'])}  wait {_r(cm['wait_ratio'])}")
    log(f"   sharing policies' makespan spread (slowest / fastest): fitted {_r(overall['sharing_makespan_spread'])}, "
        f"flat +20 % {_r(overall['flat_sharing_makespan_spread'])}")
    log(f"   best non-Horus policy on makespan: {best_other['label']}; horus / it = {overall['horus_vs_best_other_makespan']:.2f}, "
        f"horus_migrate / it = {mo:.2f}")
    for k, g in goals.items():
        log(f"   goal {k:<52} {g['goal']:>8}  got {g['value']:.3f}  {'MET' if g['met'] else 'not met'}")
    return overall, goals


def machine_info() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "xgboost": __import__("xgboost").__version__,
        "threads": "simulation single-threaded; XGBoost nthread=1",
        "gpu": "none (profiles are synthetic)",
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="headline experiments only (~2 min)")
    ap.add_argument("--json", metavar="PATH", help="write results as JSON")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    records = load_profiles()
    pred = reference_predictor(seed=args.seed)
    predictor_info = predictor_section(records, pred, args.seed)
    bench = Bench(args.seed, records, pred)

    res, headline_rmsle = philly_headline(bench)
    base = next(r for r in res if r["label"] == BASE)
    # Sensitivity: the old flat model (Horus's simulator, +20 % while sharing whatever the load; not
    # work-conserving), what the headline used to report. Beside the headline, never instead of it.
    _, flat = bench.replay("philly-256gpu-share-penalty",
                           "Sensitivity: the Horus paper's model, +20 % while sharing (NOT work-conserving)",
                           "philly", ["fifo_exclusive", "gandiva", "best_fit", "random_fit", "horus", "horus_migrate"],
                           extra={"interference": "share_penalty"}, **{**PHILLY, "interference": "share_penalty"})
    fill_section(bench)
    bench.replay("alibaba-replay-1/32", "Alibaba-2023 replay, queue skips pods that do not fit (first 64 waiting), "
                 "gpu_milli enforced", "alibaba", ALL, extra={"queue": "backfill 64"}, **ALIBABA_REPLAY)
    error_sweep(bench, res, headline_rmsle, base, args.quick)
    if not args.quick:
        full_extras(bench)
    overall, goals = overall_and_goals(res, flat, pred.metrics["util"]["rmsle"])

    wall = time.perf_counter() - t_start
    log(f"\n   total wall {wall:.0f} s ({'quick' if args.quick else 'full'}), policies: {', '.join(POLICIES)}")
    if args.json:
        body = {"overall": overall, "goals": goals, "experiments": bench.experiments, "predictor": predictor_info,
                "machine": machine_info(), "mode": "quick" if args.quick else "full", "seed": args.seed, "wall_s": wall}
        p = Path(args.json)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(body, indent=1, allow_nan=False))
        log(f"   wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
