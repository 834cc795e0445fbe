#!/usr/bin/env python
"""Would one compiled checkpoint during tuning bring the per-task estimate within 15 % of the compiled
model (issue 41's ``estimate_vs_compiled``)?

A run's estimate is the sum over tasks of weight x best latency; the compiled model also spends time
the tasks' timings do not see (VM calls and dispatch, caches between many short kernels: research notes,
"the final re-measure against the rounds"). This replays a finished job's records: at checkpoints (the
end of its first round, where every task has a record, and fractions of its records) it compiles the
model from the records committed by then, times it, and carries the checkpoint's gap to the end in two
ways: **added** (compiled - estimate, a fixed overhead) and **scaled** (compiled / estimate). The end's
model (the job's final database, as the bench compiles it) and every checkpoint's are timed in the same
process, in alternating rounds, so a host's drift falls on all of them alike.

    .venv/bin/python bench/estimate_checkpoint.py WORK_DIR [WORK_DIR ...] [--at first_round,0.25,0.5]
                                                  [--rounds 5] [--json PATH]

WORK_DIR: a job's work directory kept by ``bench/vs_onnxruntime.py --keep`` (its ``bench_job.json``
names the model, target and passes). ``overall`` holds, per rule and checkpoint, the largest relative
gap over the jobs (``estimate_vs_compiled`` as the bench defines it) next to the uncalibrated one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FIRST_ROUND = "first_round"


def parse_at(text: str) -> list[str | float]:
    out: list[str | float] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part == FIRST_ROUND:
            out.append(part)
            continue
        value = float(part)
        if not 0 < value < 1:
            raise ValueError(f"a checkpoint is {FIRST_ROUND} or a fraction of the records in (0, 1), not {part}")
        out.append(value)
    return out


def best_by_task(records) -> dict[int, float]:
    """Task index -> least valid latency (seconds) among ``records`` ((task, record) pairs)."""
    from tuning.engine.workdir import record_latency

    best: dict[int, float] = {}
    for task, rec in records:
        latency = record_latency(rec)
        if latency is not None and latency < best.get(task, math.inf):
            best[task] = latency
    return best


def first_round_end(records, n_tasks: int) -> int | None:
    """How many records (in commit order) it took until every task had a valid one; None if never."""
    from tuning.engine.workdir import record_latency

    seen: set[int] = set()
    for n, (task, rec) in enumerate(records, start=1):
        if record_latency(rec) is not None:
            seen.add(task)
            if len(seen) == n_tasks:
                return n
    return None


def memory_database(records, tasks):
    """A TVM in-memory database holding ``records``, each under its task's workload (what the compiler
    queries)."""
    from tvm.s_tir import meta_schedule as ms

    db = ms.database.MemoryDatabase()
    workloads = {}
    for task, rec in records:
        if task not in workloads:
            workloads[task] = db.commit_workload(tasks[task].mod)
        db.commit_tuning_record(ms.database.TuningRecord(
            rec.trace, workloads[task], rec.run_secs, rec.target, rec.args_info))
    return db


def analyse_job(work_dir: str, at: list[str | float], rounds: int) -> dict:
    from bench.paired_timing import interleave, job_threads
    from bench.tuned_tasks import load_job, open_snapshot, task_table
    from tuning.engine.compile.passes import use_passes
    from tuning.engine.compile.pipeline import compile_model, random_inputs, run_and_time
    from tuning.engine.workdir import open_database, records_in_commit_order

    job = load_job(work_dir)
    target = job["target"]
    threads = job_threads(job)
    with tempfile.TemporaryDirectory(prefix="estimate_checkpoint_") as tmp, use_passes(job.get("passes")):
        snap, model, mod, tasks, _ = open_snapshot(work_dir, job, tmp)
        records = records_in_commit_order(snap, tasks)
        end_estimate_s = sum(r["estimate_us"] or 0 for r in task_table(snap, tasks)) / 1e6
        points = []
        for point in at:
            n = first_round_end(records, len(tasks)) if point == FIRST_ROUND else max(1, round(point * len(records)))
            best = best_by_task(records[:n]) if n else {}
            if not n or len(best) < len(tasks):  # a task without a record has no estimate yet
                points.append({"at": point, "records": n, "skipped": "not every task has a record by then"})
                continue
            started = time.perf_counter()
            executable = compile_model(mod, target, database=memory_database(records[:n], tasks))
            points.append({"at": point, "records": n, "compile_s": time.perf_counter() - started,
                           "estimate_s": sum(float(tasks[i].weight) * best[i] for i in best),
                           "executable": executable})
        started = time.perf_counter()
        executable = compile_model(mod, target, database=open_database(snap))
        end = {"records": len(records), "estimate_s": end_estimate_s, "compile_s": time.perf_counter() - started,
               "executable": executable}
        inputs = random_inputs(model, seed=0)
        timed = [p for p in points if "executable" in p] + [end]
        timing_s = [0.0 for _ in timed]

        def sampler(k: int):
            def sample() -> float:  # median of ten timings, and what taking it cost
                started = time.perf_counter()
                secs = run_and_time(timed[k]["executable"], inputs, target, number=1, repeat=10, threads=threads,
                                    min_repeat_ms=50)[1]
                timing_s[k] += time.perf_counter() - started
                return secs
            return sample

        # rounds of one sample of every build, the order rotated: drift falls on every build alike
        samples = interleave({str(k): sampler(k) for k in range(len(timed))}, rounds)
        for k, p in enumerate(timed):
            del p["executable"]
            p["compiled_s"] = statistics.median(samples[str(k)])
            p["compiled_samples_s"] = samples[str(k)]
            p["timing_s_a_round"] = timing_s[k] / rounds  # what one timing of the build costs
    end_gap = abs(end["compiled_s"] - end["estimate_s"]) / end["compiled_s"]
    for p in points:
        if "compiled_s" not in p:
            continue
        p["offset_s"] = p["compiled_s"] - p["estimate_s"]
        p["ratio"] = p["compiled_s"] / p["estimate_s"]
        added = end["estimate_s"] + p["offset_s"]
        scaled = end["estimate_s"] * p["ratio"]
        p["added_estimate_s"], p["scaled_estimate_s"] = added, scaled
        p["added_gap"] = abs(end["compiled_s"] - added) / end["compiled_s"]
        p["scaled_gap"] = abs(end["compiled_s"] - scaled) / end["compiled_s"]
    return {"work_dir": work_dir, "model": job["model"], "passes": job.get("passes"), "target": target,
            "n_tasks": len(tasks), "end": end, "end_gap": end_gap, "checkpoints": points}


def overall(jobs: list[dict]) -> dict:
    out: dict = {"estimate_vs_compiled": max(j["end_gap"] for j in jobs)}
    keys = {str(p["at"]) for j in jobs for p in j["checkpoints"]}
    for key in sorted(keys):
        for rule in ("added", "scaled"):
            gaps = [p[f"{rule}_gap"] for j in jobs for p in j["checkpoints"] if str(p["at"]) == key and f"{rule}_gap" in p]
            if len(gaps) == len(jobs):
                out[f"estimate_vs_compiled_{rule}_at_{key}"] = max(gaps)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work_dirs", nargs="+")
    ap.add_argument("--at", default=f"{FIRST_ROUND},0.25,0.5", help="checkpoints: first_round and/or fractions")
    ap.add_argument("--rounds", type=int, default=5, help="alternating timing rounds of every build")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)
    try:
        at = parse_at(args.at)
    except ValueError as exc:
        ap.error(str(exc))
    if args.rounds < 1:
        ap.error("--rounds must be positive")
    from bench.paired_timing import job_threads
    from bench.tuned_tasks import load_job

    threads = {job_threads(load_job(w)) for w in args.work_dirs}
    if len(threads) == 1 and None not in threads:  # before TVM's thread pool starts
        os.environ["TVM_NUM_THREADS"] = str(threads.pop())
    import logging

    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    jobs = [analyse_job(w, at, args.rounds) for w in args.work_dirs]
    from bench.common import machine_info

    result = {"benchmark": "estimate_checkpoint", "overall": overall(jobs), "jobs": jobs,
              "settings": {"at": [str(a) for a in at], "rounds": args.rounds}, "machine": machine_info()}
    for j in jobs:
        e = j["end"]
        print(f"# {j['model']} ({j['n_tasks']} tasks, {e['records']} records): end estimate "
              f"{e['estimate_s'] * 1e3:.3f} ms, compiled {e['compiled_s'] * 1e3:.3f} ms, gap {j['end_gap']:.1%} "
              f"(compiled in {e['compile_s']:.1f} s, timed in {e['timing_s_a_round']:.1f} s a round)")
        for p in j["checkpoints"]:
            if "skipped" in p:
                print(f"  at {p['at']}: skipped ({p['skipped']})")
                continue
            print(f"  at {p['at']} ({p['records']} records): estimate {p['estimate_s'] * 1e3:.3f} ms, compiled "
                  f"{p['compiled_s'] * 1e3:.3f} ms (offset {p['offset_s'] * 1e3:+.3f} ms, x{p['ratio']:.3f}) -> "
                  f"end estimate added {p['added_estimate_s'] * 1e3:.3f} ms (gap {p['added_gap']:.1%}), "
                  f"scaled {p['scaled_estimate_s'] * 1e3:.3f} ms (gap {p['scaled_gap']:.1%}); compiled in "
                  f"{p['compile_s']:.1f} s")
    print("overall:", json.dumps(result["overall"], indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
