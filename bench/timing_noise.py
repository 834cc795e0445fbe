#!/usr/bin/env python
"""How much a concurrent CPU load disturbs serial timings, and whether a lower priority undoes it.

DOPpler judges parallel timings against serial ones, and on this 2-core VM the serial timings of a
tuning run repeat only to 10-29 % (``serial_noise`` in the rounds of ``bench/tuning_time.py``), against
6-8 % with nothing else running. In a run, the search of the next task (evolutionary search, cost
model) runs beside the measurement of this one (builds already wait for it: ``session._pace``).
This script measures that effect without a search: the same N candidates timed twice serially by the
engine's ``PooledAsyncRunner`` (DOP 1, T = 1) on an idle host, beside 1 or 2 busy processes at nice 0,
and beside them at nice 19, conditions alternating, twice each.

Per condition: the serial noise (relative difference of a candidate's two timings: mean and median),
and the inflation (a timing over the candidate's median idle timing: median and mean).

    .venv/bin/python bench/timing_noise.py [--workload matmul512] [--candidates 32] [--json F]

``overall``: ``noise_<condition>``, ``inflation_<condition>`` (medians) for the conditions ``idle``,
``load1_nice0``, ``load1_nice19``, ``load2_nice0``, ``load2_nice19``. The load is a busy loop, not a
search: it tells what priority can and cannot do about time-slicing, not a run's own figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine_info  # noqa: E402
from bench.doppler_replay import SIDES, built_candidates, measure_pass, slot_target  # noqa: E402
from bench.tuning_time import TIR_WORKLOADS  # noqa: E402

CONDITIONS = [("idle", 0, 0), ("load1_nice0", 1, 0), ("load1_nice19", 1, 19), ("load2_nice0", 2, 0),
              ("load2_nice19", 2, 19)]


def busy_processes(n: int, nice: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=lambda: os.nice(nice))
            for _ in range(n)]


def summarize(runs: dict[str, list[tuple[list, list]]]) -> dict:
    idle_timings = [t for a, b in runs["idle"] for t in (a, b)]
    ref = [statistics.median(xs) if xs else None
           for xs in ([x for x in col if x] for col in zip(*idle_timings))]
    out = {}
    for name, pairs in runs.items():
        noise = [abs(x - y) / x for a, b in pairs for x, y in zip(a, b) if x and y]
        infl = [x / r for a, b in pairs for t in (a, b) for x, r in zip(t, ref) if x and r]
        out[name] = {"noise_mean": statistics.mean(noise), "noise_median": statistics.median(noise),
                     "inflation_median": statistics.median(infl), "inflation_mean": statistics.mean(infl),
                     "pairs": len(noise)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="matmul512", choices=TIR_WORKLOADS)
    ap.add_argument("--candidates", type=int, default=32)
    ap.add_argument("--per-round", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    target = slot_target()
    print(f"# timing_noise: {args.workload}, {args.candidates} candidates, T=1, cores={len(os.sched_getaffinity(0))}",
          flush=True)
    t_all = time.perf_counter()
    runs: dict[str, list] = {}
    with tempfile.TemporaryDirectory(prefix="timing_noise_") as tmp:
        cands = built_candidates(args.workload, args.candidates, args.seed, target, tmp)
        print(f"  {len(cands)} candidates built", flush=True)
        for rep in range(args.repeats):
            for name, n, nice in (CONDITIONS if rep % 2 == 0 else CONDITIONS[::-1]):
                load = busy_processes(n, nice)
                try:
                    time.sleep(0.5)
                    a = measure_pass(cands, args.per_round, SIDES["dop1"])["latencies"]
                    b = measure_pass(cands, args.per_round, SIDES["dop1"])["latencies"]
                finally:
                    for p in load:
                        p.kill()
                        p.wait()
                runs.setdefault(name, []).append((a, b))
                print(f"  {name:13s} repeat {rep + 1} done, load {os.getloadavg()[0]:.1f}", flush=True)
    res = summarize(runs)
    print("\nserial timings of the same candidates, two passes a condition (noise: |t1 - t2| / t1; "
          "inflation: a timing over the candidate's median idle timing):")
    for name, r in res.items():
        print(f"  {name:13s} noise mean {r['noise_mean']:.3f} median {r['noise_median']:.3f}   "
              f"inflation median x{r['inflation_median']:.3f} mean x{r['inflation_mean']:.3f}")
    print(f"  bench {time.perf_counter() - t_all:.0f} s")
    overall = {}
    for name, r in res.items():
        overall[f"noise_{name}"] = r["noise_median"]
        overall[f"inflation_{name}"] = r["inflation_median"]
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "benchmark": "timing_noise", "overall": overall, "conditions": res, "runs": runs,
            "settings": vars(args), "machine": machine_info(), "load": "synthetic busy loop (python)",
        }, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
