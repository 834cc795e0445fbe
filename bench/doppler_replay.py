#!/usr/bin/env python
"""DOPpler's measuring on its own: the same candidates measured at DOP 1 and at DOP auto.

``bench/tuning_time.py`` compares whole tuning runs, whose search visits different candidates on each
side (the measured latencies steer it), so a run's search, build and cost-model time moves by +-30 %
with its trajectory and hides a measuring gain of at most 1 - 1/DOP of the measuring share. Here the
trajectory is taken out: N candidates of one workload (MetaSchedule's design space, decisions sampled
at random, MetaSchedule's postprocessors) are built once, then measured in rounds of R through the
engine's own ``PooledAsyncRunner`` (its slots, worker pools and DOPpler rounds) at DOP 1, at DOP auto,
and at DOP auto with one of DOPpler's published choices put back, the sides alternating, K times each.

Per side it reports the measuring wall time (median over its K passes; each pass on a fresh runner
whose workers have started), the ratio to DOP 1, the final DOP and the rounds run above DOP 1, the
serial timings by reason, and how faithful its numbers are to the reference (per candidate, the
median of its DOP 1 timings): the Spearman rank correlation over all candidates, and the regret of
its pick (the reference latency of the candidate it timed fastest over the reference's best) and of
the fastest tenth it times (``regret_top10``: the engine re-measures that tenth serially at the end of
a run, so this is what a run's pick can lose).

    .venv/bin/python bench/doppler_replay.py [--workload matmul512] [--candidates 64] [--per-round 16]
        [--passes 3] [--sides dop1,dop_auto,immediate_back_off] [--json bench/results/doppler_replay.json]

``overall``: ``replay_measure_ratio`` (DOP auto / DOP 1 measuring wall, median of pass ratios),
``replay_final_dop``, ``replay_spearman`` and ``replay_regret`` (DOP auto), the same keys suffixed
with each ablation's name, and ``replay_spearman_dop1`` (one DOP 1 pass against the others' median:
the host's own repeatability, the best any side can do).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import chosen_sides, machine_info  # noqa: E402
from bench.tuning_time import TIR_WORKLOADS  # noqa: E402

THREADS = 1  # each core a measurement slot (as bench/tuning_time.py's parallel pairs)
SIDES = {
    "dop1": dict(dop=1),
    "dop_auto": dict(dop="auto"),
    # the platform's rule with one of DOPpler's choices put back (bench/dop_presets.py)
    **{name: dict(dop="auto", dop_rule=name)
       for name in ("all_outliers", "dopplers_threshold", "fixed_sample", "immediate_back_off", "share_probe")},
}


def sample_candidates(func, target, n: int, seed: int) -> list:
    """Up to ``n`` distinct schedules of ``func``: MetaSchedule's design spaces, each generated with a
    fresh random state (its sampling instructions draw new tiles, unroll steps and compute locations),
    post-processed as the tuner does; the ones a postprocessor rejects are skipped."""
    from tvm.s_tir import meta_schedule as ms

    mods, seen = [], set()
    for k in range(n * 8):
        if len(mods) >= n:
            break
        ctx = ms.TuneContext(mod=func, target=target, space_generator="post-order-apply", num_threads=1,
                             rand_state=seed * 100003 + k)
        for sch in ctx.space_generator.generate_design_space(ctx.mod):
            if not all(p.apply(sch) for p in ctx.space_generator.postprocs):
                continue
            key = str(sch.trace)
            if key in seen:
                continue
            seen.add(key)
            mods.append(sch.mod)
            if len(mods) >= n:
                break
    return mods


def build(mods, target, artifact_dir: str) -> list:
    """The candidates exported as ``.so`` by the engine's persistent builder (failed builds dropped)."""
    from tvm.s_tir import meta_schedule as ms

    from tuning.engine.runners.builder import PersistentBuilder

    builder = PersistentBuilder(artifact_dir=artifact_dir)
    try:
        paths = builder.build_many(mods, target)
    finally:
        builder.shutdown(remove_artifacts=False)
    out = []
    for mod, path in zip(mods, paths):
        if path:
            out.append((path, ms.arg_info.ArgInfo.from_prim_func(mod["main"])))
    return out


def slot_target():
    """The target candidates are built for: the host's CPU, one core a measuring slot (T = THREADS)."""
    from tuning.engine.compile.pipeline import make_target
    from tuning.engine.compile.targets import resolve_cpu_target

    return make_target(resolve_cpu_target(num_cores=THREADS))


def built_candidates(workload: str, n: int, seed: int, target, artifact_dir: str) -> list:
    """Up to ``n`` schedules of ``workload`` (:func:`sample_candidates`), built (:func:`build`)."""
    from bench.tuning_time import make_workload

    return build(sample_candidates(make_workload(workload), target, n, seed), target, artifact_dir)


def measure_pass(cands, per_round: int, side: dict) -> dict:
    """One pass over every candidate, R a round, on a fresh runner: wall of the rounds, each
    candidate's latency as the runner reports it, and what the DOPpler rounds did."""
    from tvm.s_tir import meta_schedule as ms

    from bench.dop_presets import rule_named
    from tuning.engine.doppler.rounds import serial_totals
    from tuning.engine.runners.pooled import PooledAsyncRunner

    runner = PooledAsyncRunner(threads=THREADS, dop=side["dop"], dop_rule=rule_named(side.get("dop_rule")))
    try:
        runner.wait_ready()  # workers up (TVM imported) before the clock starts
        lat: list[float | None] = []
        t0 = time.perf_counter()
        for start in range(0, len(cands), per_round):
            batch = cands[start:start + per_round]
            futs = runner.run([ms.runner.RunnerInput(path, "cpu", args) for path, args in batch])
            for f in futs:
                res = f.result()
                secs = [float(getattr(x, "value", x)) for x in res.run_secs] if res.run_secs is not None and not res.error_msg else []
                lat.append(statistics.mean(secs) if secs else None)
        wall = time.perf_counter() - t0
        hist = runner.rule.history_dicts()
        return {
            "wall_s": wall,
            "latencies": lat,
            "final_dop": runner.rule.dop,
            "dops": [h["dop"] for h in hist],
            "rounds_above_dop1": sum(1 for h in hist if h["dop"] > 1),
            "serial_by_reason": serial_totals(runner.ledger.rounds.values()),
            "outliers_skipped": sum(h.get("outliers_skipped") or 0 for h in hist),
            "errors": [h["mean_error"] for h in hist if h.get("n_sampled")],
        }
    finally:
        runner.shutdown()


def spearman(a, b) -> float | None:
    """Spearman rank correlation over the candidates both timed (scipy's: ties share a rank)."""
    from scipy.stats import spearmanr

    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    if len(pairs) < 3:
        return None
    rho = float(spearmanr([p[0] for p in pairs], [p[1] for p in pairs]).statistic)
    return None if math.isnan(rho) else rho


def regret(lat, ref) -> float | None:
    """Reference latency of the candidate ``lat`` times fastest, over the reference's best, minus 1."""
    timed = [i for i, x in enumerate(lat) if x is not None and ref[i] is not None]
    if not timed:
        return None
    pick = min(timed, key=lambda i: lat[i])
    return ref[pick] / min(ref[i] for i in timed) - 1.0


def regret_of_top(lat, ref, share: float = 0.1) -> float | None:
    """The regret after the engine's final re-measure: the best reference latency among the ``share``
    of candidates ``lat`` times fastest (what the final serial re-measure picks from), over the best."""
    timed = [i for i, x in enumerate(lat) if x is not None and ref[i] is not None]
    if not timed:
        return None
    top = sorted(timed, key=lambda i: lat[i])[:max(1, math.ceil(len(timed) * share))]
    return min(ref[i] for i in top) / min(ref[i] for i in timed) - 1.0


def reference(passes: list[dict]) -> list[float | None]:
    n = len(passes[0]["latencies"])
    out = []
    for i in range(n):
        vals = [p["latencies"][i] for p in passes if p["latencies"][i] is not None]
        out.append(statistics.median(vals) if vals else None)
    return out


def _median(values) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def summarize(runs: dict[str, list[dict]]) -> tuple[dict, dict]:
    """(per side, overall) from every side's passes (``measure_pass`` results, in turn order)."""
    ref = reference(runs["dop1"])
    sides_out = {}
    for side, passes in runs.items():
        serial: dict[str, dict] = {}
        for p in passes:
            for reason, row in p["serial_by_reason"].items():
                tot = serial.setdefault(reason, {"n": 0, "secs": 0.0})
                tot["n"] += row["n"] / len(passes)
                tot["secs"] += row["secs"] / len(passes)
        sides_out[side] = {
            "wall_s": statistics.median(p["wall_s"] for p in passes),
            "measure_ratio": statistics.median(p["wall_s"] / d["wall_s"] for p, d in zip(passes, runs["dop1"])),
            "final_dop": statistics.median(p["final_dop"] for p in passes),
            "rounds_above_dop1": statistics.mean(p["rounds_above_dop1"] for p in passes),
            "spearman": _median(spearman(p["latencies"], ref) for p in passes),
            "regret": _median(regret(p["latencies"], ref) for p in passes),
            "regret_top10": _median(regret_of_top(p["latencies"], ref) for p in passes),
            "serial_by_reason": serial,
            "outliers_skipped": statistics.mean(p["outliers_skipped"] for p in passes),
            "passes": passes,
        }
    # the host's own repeatability: each DOP 1 pass against the median of the other DOP 1 passes
    d1 = runs["dop1"]
    self_rho = [spearman(p["latencies"], reference([q for q in d1 if q is not p])) for p in d1] if len(d1) > 1 else []
    overall = {
        "replay_measure_ratio": sides_out["dop_auto"]["measure_ratio"],
        "replay_final_dop": sides_out["dop_auto"]["final_dop"],
        "replay_spearman": sides_out["dop_auto"]["spearman"],
        "replay_regret": sides_out["dop_auto"]["regret"],
        "replay_regret_top10": sides_out["dop_auto"]["regret_top10"],
        "replay_spearman_dop1": _median(self_rho),
    }
    for side in runs:
        if side not in ("dop1", "dop_auto"):
            for key in ("measure_ratio", "final_dop", "spearman", "regret", "regret_top10"):
                overall[f"replay_{key}_{side}"] = sides_out[side][key]
    return sides_out, overall


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def print_report(sides_out: dict, overall: dict, settings: dict) -> None:
    print(f"\nthe same {settings['candidates']} candidates, {settings['per_round']} a round, median of "
          f"{settings['passes']} passes (ratios against the DOP 1 pass of the same turn; reference = median DOP 1 timing):")
    for side, s in sides_out.items():
        ser = ", ".join(f"{reason} {row['n']:.0f} {row['secs']:.1f} s" for reason, row in sorted(s["serial_by_reason"].items()))
        print(f"  {side:18s} wall {s['wall_s']:6.1f} s  x{s['measure_ratio']:.3f}  final DOP {s['final_dop']}  "
              f"rounds > DOP 1 {s['rounds_above_dop1']:.1f}  spearman {_fmt(s['spearman'])}  "
              f"regret {_fmt(s['regret'])} (top 10 % {_fmt(s['regret_top10'])})"
              + (f"  serial: {ser}; slow outliers left {s['outliers_skipped']:.1f}" if ser else ""))
    print(f"  DOP 1 against itself: spearman {_fmt(overall['replay_spearman_dop1'])}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="matmul512", choices=TIR_WORKLOADS)
    ap.add_argument("--candidates", type=int, default=64)
    ap.add_argument("--per-round", type=int, default=16)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default=None)
    ap.add_argument("--sides", default=",".join(SIDES),
                    help=f"comma list of the sides to measure (dop1 always; default all: {', '.join(SIDES)})")
    ap.add_argument("--report", default=None, metavar="JSON",
                    help="measure nothing: summarize a JSON this script wrote again (its passes), into --json or itself")
    args = ap.parse_args(argv)

    if args.report:
        saved = json.loads(Path(args.report).read_text())
        runs = {side: s["passes"] for side, s in saved["sides"].items()}
        sides_out, overall = summarize(runs)
        print_report(sides_out, overall, saved["settings"])
        out = Path(args.json or args.report)
        out.write_text(json.dumps({**saved, "overall": overall, "sides": sides_out}, indent=1, default=str))
        print(f"wrote {out}")
        return 0

    import tempfile

    sides = chosen_sides(ap, "--sides", args.sides, SIDES, ("dop1",))
    cores = len(os.sched_getaffinity(0))
    target = slot_target()
    print(f"# doppler_replay: {args.workload}, {args.candidates} candidates, {args.per_round} a round, "
          f"{args.passes} passes a side, T={THREADS}, cores={cores}, target {target}", flush=True)
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="doppler_replay_") as tmp:
        t0 = time.perf_counter()
        cands = built_candidates(args.workload, args.candidates, args.seed, target, tmp)
        print(f"  {len(cands)} candidates built in {time.perf_counter() - t0:.1f} s", flush=True)
        runs: dict[str, list[dict]] = {s: [] for s in sides}
        for k in range(args.passes):
            order = sides if k % 2 == 0 else list(reversed(sides))
            for side in order:
                r = measure_pass(cands, args.per_round, SIDES[side])
                runs[side].append(r)
                print(f"  pass {k + 1} {side:18s} wall {r['wall_s']:6.1f} s  DOPs {r['dops']}  "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)

    settings = {"workload": args.workload, "candidates": len(cands), "per_round": args.per_round,
                "passes": args.passes, "seed": args.seed, "threads": THREADS}
    sides_out, overall = summarize(runs)
    print_report(sides_out, overall, settings)
    print(f"  bench {time.perf_counter() - t_all:.0f} s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "benchmark": "doppler_replay", "overall": overall, "sides": sides_out, "settings": settings,
            "machine": machine_info(),
        }, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
