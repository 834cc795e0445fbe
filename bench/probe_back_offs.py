#!/usr/bin/env python
"""How often DOPpler's probe backs off where nothing interferes: per-slot timings, then the rule replayed.

A DOP auto run's first round probes DOP 2 on a few candidates: timed in parallel, then serially, the
pairs' error decides whether the run keeps DOP 2. On a shared 2-core VM one serial timing is itself off
by tens of percent now and then, and a probe that reads such a glitch as interference sends the next
rounds to DOP 1. This script separates the two. It times each of N candidates (MetaSchedule's design
space of one workload, built once by the engine's persistent builder) on the engine's measuring
workers, one per core at T = 1 (pinned like the runner's slots), in every pass:

  s0   alone on slot 0 (the serial reference's slot)     s1   alone on slot 1
  p0   on slot 0 while its neighbour runs on slot 1     p1   on slot 1 while its neighbour runs on slot 0
  s0b  alone on slot 0 again (a serial repeat)

and reports the relative differences (signed median, mean and largest absolute): slot 1 against slot 0,
the serial repeat, and each parallel timing against the serial one. Interference shows as parallel
timings slower than serial ones by more than serial timings differ from each other.

Then the engine's own round (``rounds.measure_round`` and the platform's ``PlatformRule(2)``) is replayed
over those timings: R probe rounds of 16 candidates drawn from the timed ones (a first serial timing is
s0, a second one s0b, a parallel one p0 or p1 by the candidate's place in the round), under each
back-off rule: "confirmed" (the platform's: a round about to back off times its sample serially once
more) and "immediate" (DOPpler's: ``bench/dop_presets.py``'s ImmediateBackOff). The share of probes that back off is how often that rule would have
sent a run to DOP 1 for nothing but the host's noise, at the serial timings it paid.

    .venv/bin/python bench/probe_back_offs.py [--workload matmul512] [--candidates 16] [--passes 3]
        [--replays 2000] [--json bench/results/probe_back_offs.json]

Whole runs too (``--runs N``): N runs of ``--run-rounds`` rounds of ``--run-round`` candidates (6 x 32:
the quick bench's parallel pairs) drawn from the timed rows, replayed through the same round and a
rule that carries its state from round to round, for the platform's rule and each of DOPpler's
choices put back (``RUN_RULES``, presets of ``bench/dop_presets.py``): serial timings a run by reason and rounds above DOP 1, what the rule
pays for its error control on this host's timings with no search trajectory in the way.
``--rows-from FILE.json`` replays the rows an earlier run wrote instead of timing new ones (seconds, not
minutes; no cores needed).

``overall``: ``serial_repeat_error`` / ``parallel_error`` / ``slot1_error`` (mean absolute relative
differences), ``parallel_signed_median``, ``probe_back_off_share_<rule>`` and
``probe_serial_timings_<rule>`` (mean a probe round) for each rule.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine_info  # noqa: E402
from bench.dop_presets import FixedSample, ImmediateBackOff, PlatformRule, ShareProbe  # noqa: E402
from bench.doppler_replay import built_candidates, slot_target  # noqa: E402
from bench.tuning_time import TIR_WORKLOADS  # noqa: E402

EVALUATOR = {"number": 3, "repeat": 1, "min_repeat_ms": 100}  # the tuning evaluator (bench/tuning_time.py)
ROUND = 16  # candidates a replayed round (the quick bench's rounds)
# whole-run replays: the platform's rule, and DOPpler's choices put back one at a time
RUN_RULES = {"platform": PlatformRule, "share_probe": ShareProbe, "fixed_sample": FixedSample,
             "immediate_back_off": ImmediateBackOff}
# probe replays: the back-off rules compared
PROBE_RULES = {"confirmed": PlatformRule, "immediate": ImmediateBackOff}
COMPARISONS = {  # name -> (timing, reference)
    "slot1_error": ("s1", "s0"),
    "serial_repeat_error": ("s0b", "s0"),
    "parallel_slot0_error": ("p0", "s0"),
    "parallel_slot1_error": ("p1", "s0"),
}


def time_on_slots(cands, passes: int) -> list[dict]:
    """Each candidate's five timings a pass (module doc), on one pinned 1-thread worker per slot."""
    from tuning.engine.measuring.measure import _jsonable
    from tuning.engine.process.procpool import ProcessPool, WorkerSpec, available_cpus

    cpus = available_cpus()[:2]
    pools = [ProcessPool([WorkerSpec(name=f"slot{k}", cpu_ids=[c], threads=1)], initializer="tuning.engine.measuring.measure:warmup")
             for k, c in enumerate(cpus)]
    try:
        for pool in pools:
            pool.wait_ready()

        def start(slot: int, cand):
            path, args = cand
            return pools[slot].submit("tuning.engine.measuring.measure:measure_path", path, device_type="cpu",
                                      args_info_json=[_jsonable(a.as_json()) for a in args], evaluator=EVALUATOR,
                                      timeout=60)

        def latency(fut) -> float | None:
            out = fut.result()
            secs = getattr(out, "run_secs", None)
            return statistics.mean(secs) if secs and not getattr(out, "error", None) else None

        rows, t0 = [], time.perf_counter()
        for k in range(passes):
            for i, cand in enumerate(cands):
                other = cands[(i + 1) % len(cands)]
                s0 = latency(start(0, cand))
                s1 = latency(start(1, cand))
                a, b = start(0, cand), start(1, other)
                p0, _ = latency(a), latency(b)
                a, b = start(0, other), start(1, cand)
                _, p1 = latency(a), latency(b)
                s0b = latency(start(0, cand))
                rows.append({"pass": k, "candidate": i, "t": time.perf_counter() - t0,
                             "s0": s0, "s1": s1, "p0": p0, "p1": p1, "s0b": s0b})
            print(f"  pass {k + 1}: {len(cands)} candidates timed ({time.perf_counter() - t0:.0f} s)", flush=True)
        return rows
    finally:
        for pool in pools:
            pool.shutdown()


def differences(rows: list[dict]) -> dict:
    out = {}
    for name, (x, ref) in COMPARISONS.items():
        d = [(r[x] - r[ref]) / r[ref] for r in rows if r[x] and r[ref]]
        out[name] = {"signed_median": statistics.median(d), "abs_mean": statistics.mean(abs(v) for v in d),
                     "abs_max": max(abs(v) for v in d), "n": len(d)} if d else None
    return out


class ReplayMeasure:
    """``rounds.Measure`` over recorded timings: job j is row ``rows[j]``; its first serial timing is s0,
    the next s0b (then s0 again), a parallel one p0 or p1 by the job's place in the call."""

    def __init__(self, rows: list[dict]) -> None:
        self.rows = rows
        self.serial_calls: dict[int, int] = {}

    def __call__(self, jobs, dop):
        from tuning.engine.measuring.measure import MeasureOutcome

        out = []
        for k, j in enumerate(jobs):
            r = self.rows[j]
            if dop > 1:
                secs = r["p0"] if k % 2 == 0 else r["p1"]
            else:
                n = self.serial_calls.get(j, 0)
                self.serial_calls[j] = n + 1
                secs = r["s0b"] if n % 2 == 1 else r["s0"]
            out.append((MeasureOutcome([secs] if secs else [], None if secs else "failed", f"replay-d{dop}"), None))
        return out


def _replayable(rows: list[dict]) -> list[dict]:
    """The rows with every timing a replayed round reads (a first and second serial one, both parallel ones)."""
    return [r for r in rows if all(r[k] for k in ("s0", "s0b", "p0", "p1"))]


def replay_probes(rows: list[dict], rule: str, replays: int, seed: int) -> dict:
    """``replays`` probe rounds of ROUND rows drawn at random, through the engine's round and the
    ``PROBE_RULES[rule]`` rule."""
    from tuning.engine.doppler.rounds import measure_round

    usable = _replayable(rows)
    rng = random.Random(seed)
    backed, serial = 0, []
    for _ in range(replays):
        picked = rng.sample(usable, min(ROUND, len(usable)))
        res = measure_round(list(range(len(picked))), ReplayMeasure(picked), PROBE_RULES[rule](2),
                            is_serial_config=lambda d: d <= 1)
        backed += res.decision.backed_off
        serial.append(sum(row["n"] for row in res.serial_by_reason.values()))
    return {"back_off_share": backed / replays, "serial_timings_mean": statistics.mean(serial), "replays": replays,
            "round": min(ROUND, len(usable))}


def replay_runs(rows: list[dict], rule_class, runs: int, rounds: int, per_round: int, seed: int) -> dict:
    """``runs`` whole runs of ``rounds`` rounds of ``per_round`` rows drawn at random (with replacement), each
    run's rule (``rule_class(2)``) carried from round to round."""
    from tuning.engine.doppler.rounds import measure_round, serial_totals

    usable = _replayable(rows)
    rng = random.Random(seed)
    serial, above, final, by_reason = [], [], [], {}
    for _ in range(runs):
        rule, validated, results = rule_class(2), set(), []
        for _ in range(rounds):
            picked = [rng.choice(usable) for _ in range(per_round)]
            res = measure_round(list(range(per_round)), ReplayMeasure(picked), rule, is_serial_config=lambda d: d <= 1,
                                validated=validated)
            validated = res.validated
            results.append(res)
        totals = serial_totals(results)
        for reason, row in totals.items():
            by_reason[reason] = by_reason.get(reason, 0) + row["n"]
        serial.append(sum(row["n"] for row in totals.values()))
        above.append(sum(1 for r in results if r.dop > 1))
        final.append(rule.dop)
    return {"serial_timings_mean": statistics.mean(serial), "rounds_above_dop1_mean": statistics.mean(above),
            "final_dop_median": statistics.median(final),
            "serial_timings_by_reason": {k: v / runs for k, v in sorted(by_reason.items())},
            "runs": runs, "rounds": rounds, "per_round": per_round}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="matmul512", choices=TIR_WORKLOADS)
    ap.add_argument("--candidates", type=int, default=16)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--replays", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runs", type=int, default=400, help="whole runs replayed per rule (0: none)")
    ap.add_argument("--run-rounds", type=int, default=6)
    ap.add_argument("--run-round", type=int, default=32)
    ap.add_argument("--rows-from", default=None, help="replay the rows of an earlier --json instead of timing")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    t_all = time.perf_counter()
    if args.rows_from:
        try:
            earlier = json.loads(Path(args.rows_from).read_text())
            rows, workload = earlier["rows"], earlier["settings"]["workload"]
            n_cands = earlier["settings"]["candidates"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"probe_back_offs: {args.rows_from} holds no rows this script wrote ({type(exc).__name__}: {exc})")
            return 2
        print(f"# probe_back_offs: the {len(rows)} rows of {args.rows_from} ({workload}), replayed", flush=True)
    else:
        from tuning.engine.process.procpool import available_cpus

        if len(available_cpus()) < 2:
            print("probe_back_offs: needs 2 cores in this process's affinity set (one measuring slot each)")
            return 2
        target, workload = slot_target(), args.workload
        print(f"# probe_back_offs: {workload}, {args.candidates} candidates, {args.passes} passes, target {target}",
              flush=True)
        with tempfile.TemporaryDirectory(prefix="probe_back_offs_") as tmp:
            cands = built_candidates(workload, args.candidates, args.seed, target, tmp)
            rows = time_on_slots(cands, args.passes)
        n_cands = len(cands)
    diffs = differences(rows)
    rules = {rule: replay_probes(rows, rule, args.replays, args.seed) for rule in PROBE_RULES}

    print(f"\n  {'timing vs reference':24s} {'signed median':>13s} {'mean |d|':>9s} {'max |d|':>8s}")
    for name, d in diffs.items():
        if d:
            print(f"  {name:24s} {d['signed_median']:+13.3f} {d['abs_mean']:9.3f} {d['abs_max']:8.3f}")
    size = rules["confirmed"]["round"]
    print(f"\n  {'probe ' if size > 4 else ''}rounds replayed ({args.replays} of {size} candidates, DOP 2, "
          f"nothing but these timings{'' if size > 4 else '; too few candidates for a probe'}):")
    for rule, r in rules.items():
        print(f"  back_off={rule:10s} backs off {r['back_off_share']:6.1%}   serial timings a probe round "
              f"{r['serial_timings_mean']:.2f}")
    par = [d for k, d in diffs.items() if k.startswith("parallel") and d]
    overall = {
        "slot1_error": (diffs["slot1_error"] or {}).get("abs_mean"),
        "serial_repeat_error": (diffs["serial_repeat_error"] or {}).get("abs_mean"),
        "parallel_error": statistics.mean(d["abs_mean"] for d in par) if par else None,
        "parallel_signed_median": statistics.mean(d["signed_median"] for d in par) if par else None,
        **{f"probe_back_off_share_{rule}": r["back_off_share"] for rule, r in rules.items()},
        **{f"probe_serial_timings_{rule}": r["serial_timings_mean"] for rule, r in rules.items()},
    }
    runs = {name: replay_runs(rows, rule, args.runs, args.run_rounds, args.run_round, args.seed)
            for name, rule in RUN_RULES.items()} if args.runs > 0 else {}
    if runs:
        print(f"\n  whole runs replayed ({args.runs} of {args.run_rounds} rounds of {args.run_round}, DOP auto on 2 slots):")
        for name, r in runs.items():
            reasons = " ".join(f"{k} {v:.1f}" for k, v in r["serial_timings_by_reason"].items())
            print(f"  {name:20s} serial timings a run {r['serial_timings_mean']:5.1f} ({reasons})   rounds above "
                  f"DOP 1 {r['rounds_above_dop1_mean']:.2f}   final DOP {r['final_dop_median']:g}")
        overall.update({f"run_serial_timings_{name}": r["serial_timings_mean"] for name, r in runs.items()})
        overall.update({f"run_rounds_above_dop1_{name}": r["rounds_above_dop1_mean"] for name, r in runs.items()})
    print(f"  bench {time.perf_counter() - t_all:.0f} s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "benchmark": "probe_back_offs", "overall": overall, "differences": diffs, "rules": rules, "runs": runs,
            "rows": rows,
            "settings": {"workload": workload, "candidates": n_cands, "passes": args.passes,
                         "replays": args.replays, "seed": args.seed, "evaluator": EVALUATOR, "round": ROUND,
                         "rows_from": args.rows_from},
            "machine": machine_info(),
        }, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
