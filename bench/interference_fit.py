"""Fit error of the work-conserving interference model on Gavel's measured pairs.

    python bench/interference_fit.py --quick                 # V100 held-out only, ~20 s
    python bench/interference_fit.py --json out.json         # all GPU types, ~1 min
    python bench/interference_fit.py --write-params          # refit and rewrite the cache

Per GPU type (K80, P100, V100): the fitted parameter, the in-sample error, the
leave-one-model-family-out error (held-out job types' utilizations estimated
from their pairs with a probe half of the training types only) next to three
baselines (a constant, the old flat +20 % penalty, each job's mean speed),
and the pair's combined normalized throughput predicted vs measured. Then the
physics checks the simulator relies on, fitted model vs the flat penalty.
``overall``: ``heldout_mae_<gpu>``, ``heldout_mae_vs_flat_<gpu>`` (ours / flat
penalty), ``heldout_mae_vs_constant_<gpu>``, ``cache_matches_refit``.
Data: data/interference/ (Gavel, OSDI 2020, MIT). Single process, no threads.
"""

from __future__ import annotations

import os

# One BLAS thread: on a busy 2-core machine a threaded SVD in scipy's solver is 20x slower.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# bench/ is sys.path[0] and bench/scheduling.py would shadow the scheduling package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench.common import machine_info  # noqa: E402
from scheduling.horus.interference import (  # noqa: E402
    FITTED_GPU_TYPES, PARAMS_FILE, FittedInterference, FlatSharingPenalty, GpuParams, fit_all,
    heldout_by_family, load_pairs, pair_speeds, write_params,
)

PHYSICS_CASES = {"3 x 100 %": [1.0] * 3, "3 x 25 %": [0.25] * 3, "2 x 50 %": [0.5] * 2, "90 % + 20 %": [0.9, 0.2]}


def in_sample(pairs, fit: dict) -> dict:
    """All measured pairs predicted with the full fit's utilizations."""
    utils = np.array([fit["utils"][j] for j in pairs.jobs])
    p = GpuParams(**fit["params"])
    pred = pair_speeds(np.stack([utils[pairs.a], utils[pairs.b]], 1), p.capacity, p.interference)
    comb_p, comb_m = pred.sum(axis=1), pairs.speeds.sum(axis=1)
    return {"mae": float(np.abs(pred - pairs.speeds).mean()), "n_pairs": int(len(pred)),
            "combined_predicted": [float(np.median(comb_p)), float(comb_p.min()), float(comb_p.max())],
            "combined_measured": [float(np.median(comb_m)), float(comb_m.min()), float(comb_m.max())]}


def cache_diff(refit: dict) -> float:
    """Largest absolute difference between the refit and the cached parameters/utilizations."""
    if not PARAMS_FILE.exists():
        return float("inf")
    cached = json.loads(PARAMS_FILE.read_text())["gpu_types"]
    diffs = [0.0]
    for gpu, fit in refit["gpu_types"].items():
        old = cached.get(gpu)
        if old is None:
            return float("inf")
        diffs.append(abs(fit["params"]["interference"] - old["params"]["interference"]))
        diffs += [abs(u - old["utils"].get(j, np.inf)) for j, u in fit["utils"].items()]
    return max(diffs)


def physics(model) -> dict:
    out = {}
    for name, utils in PHYSICS_CASES.items():
        for gpu in ("V100", "P100", "K80"):
            s = model.speeds(utils, None, gpu)
            out[f"{name} {gpu}"] = {"speeds": [round(v, 4) for v in s],
                                    "work_gpus": round(sum(u * v for u, v in zip(utils, s)), 4),
                                    "hours_for_1h_jobs": round(1.0 / min(s), 3)}
    return out


def _range(c: dict) -> str:
    return f"{c['median']:.2f} ({c['min']:.2f}-{c['max']:.2f})"


def print_fit_table(rows: list[dict]) -> None:
    print(f"{'gpu':<5} {'b':>6} {'pairs':>5} {'in-sample':>9} {'held-out':>8} {'constant':>8} {'flat+20%':>8} "
          f"{'job-mean':>8}   combined held-out: predicted (median, range) | measured")
    for r in rows:
        h, s = r["heldout"], r["in_sample"]
        head = f"{r['gpu']:<5} {r['b']:>6.3f} {s['n_pairs']:>5} {s['mae']:>9.3f}"
        if h is None:
            print(f"{head}  (held-out skipped: --quick)")
            continue
        b = h["baseline_mae"]
        print(f"{head} {h['mae']:>8.3f} {b['constant']:>8.3f} {b['flat_0.2']:>8.3f} {b['job_mean']:>8.3f}   "
              f"{_range(h['combined_predicted'])} | {_range(h['combined_measured'])}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="held-out evaluation on V100 only")
    ap.add_argument("--json", metavar="PATH", help="write results as JSON")
    ap.add_argument("--write-params", action="store_true", help=f"rewrite {PARAMS_FILE.name} from this refit")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    pairs = load_pairs()
    refit = fit_all()
    diff = cache_diff(refit)
    if args.write_params:
        print(f"wrote {write_params(refit)}")
    rows = []
    for gpu in FITTED_GPU_TYPES:
        fit = refit["gpu_types"][gpu]
        held = None if args.quick and gpu != "v100" else heldout_by_family(pairs[gpu])
        rows.append({"gpu": gpu, "b": fit["params"]["interference"], "anchor": fit["anchor"],
                     "in_sample": in_sample(pairs[gpu], fit), "heldout": held})
    print("Work-conserving interference model on Gavel's measured pairs (normalized throughput MAE)")
    print_fit_table(rows)
    for r in rows:
        s = r["in_sample"]
        print(f"  {r['gpu']} all {s['n_pairs']} pairs, full fit (anchor u=1: {r['anchor']}): combined predicted "
              "{:.2f} ({:.2f}-{:.2f}) | measured {:.2f} ({:.2f}-{:.2f})".format(*s["combined_predicted"],
                                                                            *s["combined_measured"]))
    print(f"cache {PARAMS_FILE.name}: largest difference to this refit {diff:.2e}")

    fitted = FittedInterference({g: GpuParams(**v["params"]) for g, v in refit["gpu_types"].items()})
    checks = {"fitted": physics(fitted), "flat_0.2 (sensitivity)": physics(FlatSharingPenalty(0.2))}
    print("\nPhysics: speeds of co-located jobs, GPUs of work delivered, hours three/two 1-hour jobs take")
    for label, res in checks.items():
        for case, r in res.items():
            print(f"  {label:<24} {case:<18} speeds {r['speeds']}  work {r['work_gpus']:.3f}  "
                  f"{r['hours_for_1h_jobs']:.2f} h")

    overall: dict = {"cache_matches_refit": bool(diff <= 5e-3)}
    for r in rows:
        if r["heldout"] is not None:
            h = r["heldout"]
            overall[f"heldout_mae_{r['gpu']}"] = h["mae"]
            overall[f"heldout_mae_vs_flat_{r['gpu']}"] = round(h["mae"] / h["baseline_mae"]["flat_0.2"], 4)
            overall[f"heldout_mae_vs_constant_{r['gpu']}"] = round(h["mae"] / h["baseline_mae"]["constant"], 4)
            overall[f"heldout_combined_median_predicted_{r['gpu']}"] = h["combined_predicted"]["median"]
            overall[f"heldout_combined_median_measured_{r['gpu']}"] = h["combined_measured"]["median"]
    print("\noverall:", json.dumps(overall))
    if args.json:
        result = {"overall": overall, "gpu_types": rows, "physics": checks, "fit": refit,
                  "machine": machine_info(wall_s=round(time.perf_counter() - t0, 1), blas_threads=1)}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
