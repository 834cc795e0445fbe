"""Predictor evaluation: the Horus utilization predictor beside a constant and an analytic FLOPs baseline.

    python bench/predictor_eval.py                # table, ~20 s on 2 cores
    python bench/predictor_eval.py --json out.json

Leave one model FAMILY out (``scheduling/horus/predictor_eval.py``): every record of a family is
predicted by models fitted on the other families. Metrics: MAE (utilization points), Spearman rank
correlation (pooled, and within each held-out family), and the decision metric a scheduler cares
about: of the pairs of configurations (same GPU model) a method calls safe to co-locate (predicted
sum <= 100 %), the share whose TRUE sum exceeds 100 %. ``manage.py train_predictor --eval`` prints the
same figures for the stored profiles.

The shipped profiles are SYNTHETIC (``synthetic-roofline-v1``, no GPU measured them) until
``profile_gpu`` records real ones: the figures describe the predictor on a roofline model, whose
structure the analytic baseline shares.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path[0] != str(ROOT):
    sys.path.insert(0, str(ROOT))

from bench.common import machine_info  # noqa: E402
from scheduling.horus.predictor_eval import evaluate_predictor, format_evaluation  # noqa: E402
from scheduling.horus.profiles import load_profiles  # noqa: E402


def overall(ev: dict) -> dict:
    """Headline ratios: the predictor's MAE over each baseline's, and the unsafe-of-safe shares."""
    m = ev["methods"]
    p = m["predictor"]

    def unsafe(name: str):
        return m[name]["colocation"]["unsafe_share_of_safe"]

    return {
        "mae_pct": p["mae_pct"], "spearman": p["spearman"], "unsafe_share_of_safe": unsafe("predictor"),
        "mae_ratio_vs_constant": p["mae_pct"] / m["constant"]["mae_pct"],
        "mae_ratio_vs_analytic": p["mae_pct"] / m["analytic_flops"]["mae_pct"],
        "constant_unsafe_share_of_safe": unsafe("constant"), "analytic_unsafe_share_of_safe": unsafe("analytic_flops"),
        "base_rate_over_100": p["colocation"]["base_rate_over_100"], "synthetic_profiles": ev["synthetic"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="same run (it is already short)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    ev = evaluate_predictor(load_profiles(), seed=args.seed)
    print(format_evaluation(ev))
    body = {"overall": overall(ev), "evaluation": ev, "wall_s": time.perf_counter() - t0,
            "machine": machine_info(threads="XGBoost n_jobs=1")}
    print(f"\n  predictor MAE / constant {body['overall']['mae_ratio_vs_constant']:.2f}, "
          f"/ analytic {body['overall']['mae_ratio_vs_analytic']:.2f}; wall {body['wall_s']:.0f} s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(body, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
