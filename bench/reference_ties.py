#!/usr/bin/env python
"""How the reference baselines' score ties move them against the ATC'23 artifact (issue 42).

The artifact renames every node ``"<k>-<name>"`` (``k`` from a random permutation drawn per run) before it
schedules, so its "smallest node name" tie-break is a random node order; breaking ties by the raw names
instead piles GpuPacking's and GpuClustering's ties (CPU-only pods, idle nodes of one size) onto the
first nodes. This runs chosen policies on chosen pod lists with both orders, beside the artifact's mean:

    python bench/reference_ties.py                                   # GpuPacking, GpuClustering; default, multigpu20
    python bench/reference_ties.py --policies best_fit_ref --pod-lists gpushare40 --seeds 0-9
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path[0] != str(ROOT):
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from scheduling.horus.profiles import load_profiles  # noqa: E402
from scheduling.horus.reference_policies import REFERENCE_POLICIES, TIE_ORDERS  # noqa: E402

from bench import scheduling as bench_scheduling  # noqa: E402  (the artifact's figures, the bench's fill)


def seeds_of(text: str) -> list[int]:
    """``"0-4"`` or ``"0,3,7"``."""
    if "-" in text:
        lo, hi = (int(x) for x in text.split("-", 1))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policies", default="gpu_packing_ref,gpu_clustering_ref",
                    help=f"comma list of {', '.join(REFERENCE_POLICIES)}")
    ap.add_argument("--pod-lists", default="default,multigpu20",
                    help="comma list of default, gpushare40, gpushare100, multigpu20")
    ap.add_argument("--seeds", default="0-4", help='"0-4" or "0,3,7" (default 0-4, the bench\'s quick seeds)')
    ap.add_argument("--ties", default="shuffled,name", help=f"comma list of {', '.join(TIE_ORDERS)}")
    args = ap.parse_args(argv)
    seeds, ties = seeds_of(args.seeds), args.ties.split(",")
    bench = bench_scheduling.Bench(0, load_profiles(), None)
    print(f"unallocated GPUs at 100 % arrived, full scale; seeds {seeds}; artifact: mean of its 10 seeds")
    print(f"{'pod list':<12}{'policy':<20}{'artifact':>9}" + "".join(f"{t:>10}{'dev':>8}" for t in ties)
          + "   per seed")
    for short in args.pod_lists.split(","):
        pod_list = f"openb_pod_list_{short}"
        trace = bench_scheduling.SHIPPED_POD_LISTS[pod_list]
        for name in args.policies.split(","):
            art = bench_scheduling.ARTIFACT_UNALLOC[pod_list][name][0]
            cells, per_seed = "", []
            for t in ties:
                t0 = time.perf_counter()
                un = [bench_scheduling.reference_fill(bench, trace, name, sd, t)["unallocated_gpus"] for sd in seeds]
                mean = float(np.mean(un))
                cells += f"{mean:10.1f}{(mean - art) / art * 100:+7.1f}%"
                per_seed.append(f"{t}: {' '.join(f'{u:.0f}' for u in un)} ({time.perf_counter() - t0:.0f} s)")
            print(f"{short:<12}{name:<20}{art:9.1f}{cells}   {'; '.join(per_seed)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
