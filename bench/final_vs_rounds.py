#!/usr/bin/env python
"""Which per-task figure predicts a tuned kernel's time in the compiled model: the best the search's rounds
measured, or DOPpler's final serial re-measure of the top candidates? Read from the stored
``bench/vs_onnxruntime.py`` results (no tuning, no timing: seconds).

For every task of every job with a profile (``tasks[]``: ``best_us`` the rounds' best, ``final_us`` the
final re-measure's best; ``profile.rows``: ``in_model_us``, the task's kernels timed inside the compiled
model, over ``calls``), the ratios in-model / rounds and in-model / final, and how far each is off
(|log ratio|). ``--above R`` keeps the tasks whose final re-measure read more than R times their rounds' best:
the case for retaking the final re-measure (keep the faster of two serial readings) if the rounds' best
predicts the compiled kernel better there.

    .venv/bin/python bench/final_vs_rounds.py [--above 1.3] [--json PATH] [RESULT.json ...]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def task_rows(result: dict) -> list[dict]:
    """One row per profiled task of each job: rounds' best, final re-measure, in-model time per call (us)."""
    rows = []
    for model in result.get("models", []):
        jobs = model.get("jobs")
        if not isinstance(jobs, dict):
            continue
        for label, job in jobs.items():
            profile = {r["row"]: r for r in (job.get("profile") or {}).get("rows", []) if r.get("kind") == "task"}
            for task in job.get("tasks") or []:
                prof = profile.get(task.get("name"))
                best, final = task.get("best_us"), task.get("final_us")
                if not (best and final and prof and prof.get("in_model_us") and prof.get("calls")):
                    continue
                rows.append({"model": model.get("model"), "row": label, "task": task["name"], "best_us": best,
                             "final_us": final, "in_model_us": prof["in_model_us"] / prof["calls"]})
    return rows


def summarize(rows: list[dict]) -> dict:
    def med(values):
        return statistics.median(values) if values else None

    return {
        "tasks": len(rows),
        "in_model_vs_rounds_median": med([r["in_model_us"] / r["best_us"] for r in rows]),
        "in_model_vs_final_median": med([r["in_model_us"] / r["final_us"] for r in rows]),
        "rounds_abs_log_error_median": med([abs(math.log(r["in_model_us"] / r["best_us"])) for r in rows]),
        "final_abs_log_error_median": med([abs(math.log(r["in_model_us"] / r["final_us"])) for r in rows]),
        "final_closer": sum(abs(math.log(r["in_model_us"] / r["final_us"])) < abs(math.log(r["in_model_us"] / r["best_us"]))
                            for r in rows),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="*", type=Path, help="vs_onnxruntime result files (default: all stored)")
    ap.add_argument("--above", type=float, default=1.3, help="final / rounds ratio above which a task is counted")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    files = args.results or sorted(RESULTS.glob("vs_onnxruntime*.json"))
    rows = []
    for path in files:
        for row in task_rows(json.loads(path.read_text())):
            rows.append({**row, "file": path.name})
    above = [r for r in rows if r["final_us"] > args.above * r["best_us"]]
    overall = {"all": summarize(rows), f"final_above_{args.above:g}x_rounds": summarize(above)}
    print(f"# {len(files)} result files, {len(rows)} profiled tasks, {len(above)} whose final re-measure read "
          f"more than {args.above:g}x their rounds' best")
    for name, s in overall.items():
        if not s["tasks"]:
            print(f"{name}: no task")
            continue
        print(f"{name}: {s['tasks']} tasks; in-model / rounds' best {s['in_model_vs_rounds_median']:.2f}, "
              f"in-model / final {s['in_model_vs_final_median']:.2f} (medians); |log error| rounds "
              f"{s['rounds_abs_log_error_median']:.2f}, final {s['final_abs_log_error_median']:.2f}; "
              f"final closer on {s['final_closer']}")
    if args.json:
        # the tasks over the threshold only: every row is recomputed from the stored results in seconds
        args.json.write_text(json.dumps({"overall": overall, "files": [p.name for p in files], "above": above},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
