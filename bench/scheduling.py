"""Scheduling benchmark: Horus vs the baselines on the Philly and Alibaba-2023 traces.

    python bench/scheduling.py --quick            # ~2 min on 2 cores
    python bench/scheduling.py --json out.json    # full run, ~8 min

Every policy runs in the same process on the same jobs, cluster and seed.
Experiments (scale stated in each table's header):

* ``philly-256gpu`` (headline): all 82k Philly jobs at their real submit times
  on 256 GPUs, strict FIFO queue, every policy. ``overall`` = Horus / FIFO
  exclusive on it.
* ``alibaba-fill``: the ATC'23 fill method on the real 1,213-node cluster.
* ``alibaba-replay``: time-compressed replay on a 1/32 node sample.
* ``predictor-error``: Philly-256, Horus with oracle predictions plus
  log-normal noise (sigma), next to the real predictor's out-of-fold output.
* full run only: cluster-size sweep, the Horus paper's interference model
  (+20 % only), FIFO with backfill, a higher-utilization workload, two more
  workload seeds.

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
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from scheduling.horus.experiments import (  # noqa: E402
    alibaba_fill_setup,
    alibaba_replay_setup,
    philly_setup,
    reference_predictor,
)
from scheduling.horus.policies import POLICIES, make_policy  # noqa: E402
from scheduling.horus.predictor import UtilizationPredictor, rmsle  # noqa: E402
from scheduling.horus.profiles import load_profiles  # noqa: E402
from scheduling.horus.simulator import Interference, simulate, simulate_fill  # noqa: E402

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
    log(f"   {'policy':<{w}}{'makespan':>9}{'wait':>8}{'p95wait':>9}{'JCT':>8}{'util%':>7}{'busy%':>7}"
        f"{'mk/FIFO':>8}{'wt/FIFO':>8}{'ut/FIFO':>8}{'oversub':>8}{'OOM':>6}{'migr':>6}{'wall':>6}")
    for r in results:
        mk = _ratio(r["makespan_s"], base["makespan_s"]) if base else None
        wt = _ratio(r["mean_wait_s"], base["mean_wait_s"]) if base else None
        ut = _ratio(r["util_mean_pct"], base["util_mean_pct"]) if base else None
        log(f"   {r['label']:<{w}}{_fmt_t(r['makespan_s']):>9}{_fmt_t(r['mean_wait_s']):>8}{_fmt_t(r['p95_wait_s']):>9}"
            f"{_fmt_t(r['mean_jct_s']):>8}{r['util_mean_pct']:7.1f}{r['util_busy_pct']:7.1f}"
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


def run_replay(setup, policies: list[str | tuple[str, str, dict]], *, seed: int = 0, ts_points: int = 100,
               **sim_kw: Any) -> list[dict[str, Any]]:
    out = []
    for p in policies:
        label, name, opts = (p, p, {}) if isinstance(p, str) else p
        res = simulate(setup.jobs, setup.cluster, make_policy(name, **opts), seed=seed, timeseries_points=ts_points, **sim_kw)
        d = res.to_dict()
        d["label"] = label
        out.append(d)
    return out


def experiment(name: str, method: str, setup, results: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"name": name, "method": method, "scale": setup.scale, "cluster": setup.cluster.summary(),
            "assumptions": setup.assumptions, "results": results, **extra}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="headline experiments only (~2 min)")
    ap.add_argument("--json", metavar="PATH", help="write results as JSON")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    seed = args.seed
    experiments: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ predictor
    records = load_profiles()
    pred = reference_predictor(seed=seed)
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
    predictor_info = {"grouped_by_model": {k: v for k, v in pm.items()}, "by_record": {k: v for k, v in um.items() if k != "per_fold"},
                      "n_records": pred.n_records, "sources": pred.sources, "paper_rmsle": 0.154, "synthetic": True}

    # ------------------------------------------------------------------ Philly headline
    ph = philly_setup(256, seed=seed)
    u = ph.assumptions["utilization"]
    log(f"\n   job utilization assumption (true, from profiles): mean {u['true_mean']:.0f} %, quartiles "
        f"{u['true_p25']:.0f}/{u['true_median']:.0f}/{u['true_p75']:.0f} %, {u['share_below_20'] * 100:.0f} % of jobs < 20 %, "
        f"{u['share_above_90'] * 100:.0f} % > 90 %; policies see predictions with MAE {u['pred_mae']:.1f} pct-pts")
    res = run_replay(ph, ALL, seed=seed)
    base = next(r for r in res if r["label"] == BASE)
    add_ratios(res, base)
    replay_table("Philly replay, strict FIFO queue, interference +20 % while sharing (Horus's simulator)", ph.scale, res, base)
    experiments.append(experiment("philly-256gpu", "replay", ph, res, headline=True, queue="strict FIFO"))
    horus = next(r for r in res if r["label"] == "horus")
    mig = next(r for r in res if r["label"] == "horus_migrate")
    others = [r for r in res if not r["label"].startswith("horus")]
    best_other = min(others, key=lambda r: r["makespan_s"])

    # ------------------------------------------------------------------ capped interference
    # Sensitivity: over-subscribed GPUs also time-share (demand 150 % -> 1.5x slower), which
    # the paper's model leaves free. Reported beside the headline, never instead of it.
    capped_model = Interference(share_penalty=0.2, oversub_exponent=1.0)
    capped = run_replay(ph, ["fifo_exclusive", "gandiva", "best_fit", "horus", "horus_migrate"], seed=seed,
                        interference=capped_model)
    cbase = next(r for r in capped if r["label"] == BASE)
    add_ratios(capped, cbase)
    replay_table("Sensitivity: capped interference (+20 % while sharing AND time-shared over 100 % demand)",
                 ph.scale, capped, cbase)
    experiments.append(experiment("philly-256gpu-capped-interference", "replay", ph, capped, interference="capped"))
    capped_horus = next(r for r in capped if r["label"] == "horus")["ratios_vs_fifo_exclusive"]
    capped_mig = next(r for r in capped if r["label"] == "horus_migrate")["ratios_vs_fifo_exclusive"]

    # ------------------------------------------------------------------ Alibaba fill
    fs = alibaba_fill_setup(1, seed=seed)
    fill = []
    for name in ALL:
        fr = simulate_fill(fs.jobs, fs.cluster, make_policy(name), seed=seed).to_dict()
        fr["label"] = name
        fill.append(fr)
    log(f"\n== Alibaba-2023 fill method (ATC'23): sampled pods submitted until the request reaches 100 % of capacity")
    log(f"   scale: {fs.scale}")
    log(f"   {'policy':<16}{'allocated':>10}{'unalloc GPUs':>13}{'frag rate':>10}{'frag GPUs':>10}{'failed':>8}{'1st fail at':>12}{'wall':>7}")
    for r in fill:
        ff = r["first_failure_arrived_share"]
        log(f"   {r['label']:<16}{r['allocated_share'] * 100:9.1f}%{r['unallocated_gpus']:13.0f}{r['frag_rate']:10.2f}"
            f"{r['frag_gpus']:10.0f}{r['failed']:8d}{'' if ff is None else f'{ff * 100:.0f}%':>12}{r['wall_s']:6.1f}s")
    experiments.append(experiment("alibaba-fill", "fill", fs, fill))

    # ------------------------------------------------------------------ Alibaba replay
    ar = alibaba_replay_setup(32, seed=seed)
    ares = run_replay(ar, ALL, seed=seed, backfill=64)
    abase = next(r for r in ares if r["label"] == BASE)
    add_ratios(ares, abase)
    replay_table("Alibaba-2023 replay, queue skips pods that do not fit (first 64 waiting), gpu_milli enforced", ar.scale, ares, abase)
    experiments.append(experiment("alibaba-replay-1/32", "replay", ar, ares, queue="backfill 64"))

    # ------------------------------------------------------------------ predictor error
    sigmas = [0.0, 0.5] if args.quick else [0.0, 0.25, 0.5, 1.0]
    pols = ["horus"] if args.quick else ["horus", "horus_migrate"]
    oracle = philly_setup(256, seed=seed, prediction="oracle")
    sweep = []
    true_u = np.array([j.true_util_pct for j in oracle.jobs])
    for sg in sigmas:
        rng = np.random.default_rng([seed, 0x5EED])
        noisy = np.clip(true_u * np.exp(rng.normal(0, sg, len(true_u))), 1, 100) if sg > 0 else true_u
        for p in pols:
            d = run_replay(oracle, [(f"{p} oracle+s{sg:g}", p, {})], seed=seed, predictor_error=sg)[0]
            d["sigma"] = sg
            d["util_rmsle_of_predictions"] = rmsle(noisy, true_u)
            sweep.append(d)
    for p in pols:
        d = dict(next(r for r in res if r["label"] == p))
        d["label"] = f"{p} predictor(oof)"
        d["sigma"] = None
        d["util_rmsle_of_predictions"] = rmsle(np.array([j.pred_util_pct for j in ph.jobs]), np.array([j.true_util_pct for j in ph.jobs]))
        sweep.append(d)
    add_ratios(sweep, base)
    replay_table("Predictor error sweep (Philly-256): oracle predictions x exp(N(0, sigma)) vs the trained predictor",
                 oracle.scale, sweep, base)
    for d in sweep:
        log(f"     {d['label']:<28} prediction RMSLE {d['util_rmsle_of_predictions']:.3f}")
    experiments.append(experiment("predictor-error", "replay", oracle, sweep))

    # ------------------------------------------------------------------ full-run extras
    if not args.quick:
        main_pols = ["fifo_exclusive", "gandiva", "best_fit", "horus", "horus_migrate"]
        for n in (320, 384, 512):
            s = philly_setup(n, seed=seed)
            rr = run_replay(s, main_pols, seed=seed)
            b = next(r for r in rr if r["label"] == BASE)
            add_ratios(rr, b)
            replay_table(f"Cluster-size sweep: Philly on {n} GPUs (offered load {s.assumptions['offered_load']:.2f})", s.scale, rr, b)
            experiments.append(experiment(f"philly-{n}gpu", "replay", s, rr, queue="strict FIFO"))

        rr = run_replay(ph, ["fifo_exclusive", "horus", "horus_migrate", "best_fit"], seed=seed, backfill=8)
        b = next(r for r in rr if r["label"] == BASE)
        add_ratios(rr, b)
        replay_table("Ablation: queue with backfill (first 8 waiting jobs may start out of order)", ph.scale, rr, b)
        experiments.append(experiment("philly-256gpu-backfill8", "replay", ph, rr, queue="backfill 8"))

        hv = philly_setup(256, seed=seed, min_batch=16)
        rr = run_replay(hv, ["fifo_exclusive", "horus", "horus_migrate"], seed=seed)
        b = next(r for r in rr if r["label"] == BASE)
        add_ratios(rr, b)
        hu = hv.assumptions["utilization"]
        replay_table(f"Sensitivity: busier jobs (batch >= 16 only; mean util {hu['true_mean']:.0f} %, median {hu['true_median']:.0f} %)",
                     hv.scale, rr, b)
        experiments.append(experiment("philly-256gpu-busier-jobs", "replay", hv, rr))

        for sd in (1, 2):
            s = philly_setup(256, seed=sd)
            rr = run_replay(s, ["fifo_exclusive", "horus", "horus_migrate"], seed=sd)
            b = next(r for r in rr if r["label"] == BASE)
            add_ratios(rr, b)
            replay_table(f"Seed {sd} (another model/batch assignment and noise)", s.scale, rr, b)
            experiments.append(experiment(f"philly-256gpu-seed{sd}", "replay", s, rr, seed=sd))

    # ------------------------------------------------------------------ overall
    hr = horus["ratios_vs_fifo_exclusive"]
    mr = mig["ratios_vs_fifo_exclusive"]
    overall = {
        "makespan_ratio": hr["makespan_ratio"],
        "wait_ratio": hr["wait_ratio"],
        "util_ratio": hr["util_ratio"],
        "jct_ratio": hr["jct_ratio"],
        "migrate_makespan_ratio": mr["makespan_ratio"],
        "migrate_wait_ratio": mr["wait_ratio"],
        "migrate_util_ratio": mr["util_ratio"],
        "horus_vs_best_other_makespan": horus["makespan_s"] / best_other["makespan_s"],
        "best_other_policy": best_other["label"],
        "experiment": "philly-256gpu",
        "interference": "paper: +20 % while sharing",
        "capped_makespan_ratio": capped_horus["makespan_ratio"],
        "capped_wait_ratio": capped_horus["wait_ratio"],
        "capped_util_ratio": capped_horus["util_ratio"],
        "capped_migrate_makespan_ratio": capped_mig["makespan_ratio"],
        "capped_migrate_wait_ratio": capped_mig["wait_ratio"],
        "predictor_util_rmsle": pm["util"]["rmsle"],
        "profiles": "synthetic-roofline-v1",
    }
    goals = {}
    for k, (op, v) in GOALS.items():
        for who, val in (("horus", overall[k]), ("horus_migrate", overall[f"migrate_{k}"])):
            ok = val is not None and (val <= v if op == "<=" else val >= v)
            goals[f"{who}:{k}"] = {"goal": f"{op} {v}", "value": val, "met": ok}
    goals["horus:not_worse_than_best_other_makespan"] = {"goal": "<= 1.0", "value": overall["horus_vs_best_other_makespan"],
                                                        "met": overall["horus_vs_best_other_makespan"] <= 1.0}
    mo = mig["makespan_s"] / best_other["makespan_s"]
    goals["horus_migrate:not_worse_than_best_other_makespan"] = {"goal": "<= 1.0", "value": mo, "met": mo <= 1.0}

    log("\n== overall (philly-256gpu, ours / fifo_exclusive)")
    log(f"   horus:         makespan {_r(overall['makespan_ratio'])}  wait {_r(overall['wait_ratio'])}  util {_r(overall['util_ratio'])}  "
        f"JCT {_r(overall['jct_ratio'])}")
    log(f"   horus_migrate: makespan {_r(overall['migrate_makespan_ratio'])}  wait {_r(overall['migrate_wait_ratio'])}  "
        f"util {_r(overall['migrate_util_ratio'])}")
    log(f"   capped interference: horus makespan {_r(overall['capped_makespan_ratio'])}  wait "
        f"{_r(overall['capped_wait_ratio'])}  util {_r(overall['capped_util_ratio'])}; horus_migrate makespan "
        f"{_r(overall['capped_migrate_makespan_ratio'])}  wait {_r(overall['capped_migrate_wait_ratio'])}")
    log(f"   best non-Horus policy on makespan: {best_other['label']}; horus / it = {overall['horus_vs_best_other_makespan']:.2f}, "
        f"horus_migrate / it = {mo:.2f}")
    for k, g in goals.items():
        log(f"   goal {k:<52} {g['goal']:>8}  got {g['value']:.3f}  {'MET' if g['met'] else 'not met'}")

    machine = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "xgboost": __import__("xgboost").__version__,
        "threads": "simulation single-threaded; XGBoost nthread=1",
        "gpu": "none (profiles are synthetic)",
    }
    wall = time.perf_counter() - t_start
    log(f"\n   total wall {wall:.0f} s ({'quick' if args.quick else 'full'}), policies: {', '.join(POLICIES)}")
    if args.json:
        body = {"overall": overall, "goals": goals, "experiments": experiments, "predictor": predictor_info,
                "machine": machine, "mode": "quick" if args.quick else "full", "seed": seed, "wall_s": wall}
        p = Path(args.json)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(body, indent=1, allow_nan=False))
        log(f"   wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
