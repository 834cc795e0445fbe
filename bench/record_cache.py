#!/usr/bin/env python
"""Never tune the same workload twice: model B tuned cold vs warm from the record cache filled by model A.

  A        zoo ``small_cnn`` (10 classes, weight seed 0), tuned cold (cache empty). Its trusted cache entries are what
           the platform publishes: the records of its final serial re-measure (``records.publish.
           entries_from_run``), and the cache's XGBoost cost model is trained on them.
  B cold   ``--pair finetuned`` (default): A with other weights (a fine-tuned copy: every task is one of
           A's workloads); ``--pair head``: A with a 100-class head (the convolutions, the pool and the
           flatten are A's, the Gemm is new). Tuned with the cache off.
  B warm   the same B, same budget and seed, with the cache filled by A: each task is looked up by its
           workload hash under the same key (target key, hardware fingerprint, TVM version), the hits
           (top-k per task) are seeded through the imported-record path, re-timed serially on this host,
           verified against the cache's best (tolerance ``DEFAULT_TOLERANCE``); a verified task whose
           record is converged (``records.settle.convergence``: A's search had plateaued or run out, or
           two runs agree) gets no further trials (Trimmer's share allocation gives them
           to the rest), the others are searched on from their seeds (plateau-judged after their share);
           the cost model is loaded.

Every run: the platform's engine (``run_tuning``, DOPpler mode: persistent builder, pooled runner,
final serial re-measure), one fresh interpreter each, same threads, search and budget. Curves: the
end-to-end estimate (sum of weight x best measured latency) after every measured batch, with the
trial count and the wall time since the run started (warm: the lookup's own task extraction counted).
"Trials / wall to match": the first point where B's estimate is within 3 % of B cold's final estimate.
Final latency: both B modules compiled with their databases in one process and timed alternately
(number=3, repeat=5, 5 rounds, median; ``final_latency_paired_ratio``: the median of the rounds' own
warm/cold ratios, the two timed back to back). ``trials_total_ratio``: all trials warm / cold.

    .venv/bin/python bench/record_cache.py [--quick] [--json bench/results/record_cache.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import fmt_s, machine_info, run_child, tuning_config, write_result  # noqa: E402

SCRIPT = str(Path(__file__).resolve())
MATCH = 1.03
# small_cnn (classes, weight seed) of A and of B, per pair
PAIRS = {"finetuned": {"A": (10, 0), "B": (10, 1)},  # B: a fine-tuned copy of A (other weights): every task shared
         "head": {"A": (10, 0), "B": (100, 0)}}  # B: A with a 100-class head: 4 of 5 tasks shared


def make_model(pair: str, name: str):
    from core.onnx_models.zoo import small_cnn

    classes, seed = PAIRS[pair][name]
    return small_cnn(classes=classes, seed=seed)


class _CurveSink:
    """(trials measured, wall since start, end-to-end estimate) after every measured batch."""

    def __init__(self, t0: float) -> None:
        self.t0, self.weights, self.best, self.n, self.curve = t0, {}, {}, 0, []

    def on_tasks(self, tasks):
        self.weights = {t.index: float(t.weight) for t in tasks}

    def on_measurements(self, records):
        for r in records:
            self.n += 1
            lat = r.latency_s
            if lat is not None and lat < self.best.get(r.task_index, float("inf")):
                self.best[r.task_index] = lat
        ready = self.weights and all(i in self.best for i in self.weights)
        est = sum(w * self.best[i] for i, w in self.weights.items()) if ready else None
        self.curve.append((self.n, time.perf_counter() - self.t0, est))

    def on_round(self, info):
        pass

    def control(self):
        return None


def _seed_from_cache(spec: dict, model) -> dict:
    """The platform's lookup (services.seed_run without the rows): hash the tasks, match the key, seed."""
    from tuning.engine.records import cache_key, publish, seeds

    cache = json.loads(Path(spec["cache"]).read_text())
    key = {"hardware": cache_key.hardware_fingerprint(spec["target"]), "tvm_version": cache_key.tvm_version()}
    if {k: cache["key"][k] for k in key} != key:
        return {"hits": 0, "seeds": 0, "why": "another key"}
    by_hash: dict[str, list[dict]] = {}
    for e in sorted(cache["entries"], key=lambda e: e["latency_s"]):
        by_hash.setdefault(e["workload_hash"], []).append(e)
    tasks = publish.task_workloads(model, spec["target"])
    hits = {t["index"]: by_hash[t["workload_hash"]][:seeds.DEFAULT_TOP_K]
            for t in tasks if t["workload_hash"] in by_hash}
    n = seeds.write_seeds(spec["work_dir"], hits)
    publish.place_cost_model(spec["work_dir"], cache.get("cost_model"))
    return {"hits": len(hits), "seeds": n, "tasks": len(tasks)}


def _publish(spec: dict, model) -> dict:
    """What the platform publishes after A: its final (serial) records and a cost model trained on them."""
    from tuning.engine.records import cache_key, publish

    entries = publish.entries_from_run(spec["work_dir"], model, spec["target"])
    for i, e in enumerate(entries):
        e["id"], e["source_run"] = i, "A"
    cm = str(Path(spec["work_dir"]) / "cache_cost_model.xgb")
    n_cm = publish.train_cost_model(entries, spec["target"], cm, num_cores=spec["threads"])
    key = {"hardware": cache_key.hardware_fingerprint(spec["target"]), "tvm_version": cache_key.tvm_version()}
    Path(spec["publish"]).write_text(json.dumps({"key": key, "entries": entries,
                                                 "cost_model": cm if n_cm else None}))
    tasks = sorted({e["task_index"] for e in entries})
    return {"entries": len(entries), "tasks": len(tasks),
            "converged_tasks": sorted({e["task_index"] for e in entries if e.get("source_converged")}),
            "source_trials": {i: max(e["source_trials"] for e in entries if e["task_index"] == i) for i in tasks}}


def _job_tune(spec: dict) -> dict:
    from tuning.engine.records import seeds
    from tuning.engine.session import run_tuning

    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    model = make_model(spec["pair"], spec["model"])
    t0 = time.perf_counter()
    seeding = _seed_from_cache(spec, model) if spec.get("cache") else None
    sink = _CurveSink(t0)
    s = run_tuning(model, tuning_config(spec, trimmer=spec.get("trimmer")), sink)  # TuningConfig parses the dict
    wall = time.perf_counter() - t0
    published = _publish(spec, model) if spec.get("publish") else None
    return {"wall_s": wall, "status": s.status, "n_measured": s.n_measurements + s.n_duplicates,
            "estimated_latency_s": s.best_latency_s, "seeding": seeding,
            "verification": seeds.load_verification(spec["work_dir"]), "curve": sink.curve,
            "stop_reason": s.stop_reason, "published": published,
            "tasks": [{"name": t.name, "records": t.n_records, "best_s": t.best_latency_s} for t in s.tasks]}


def _job_remeasure(spec: dict) -> dict:
    from tuning.engine.compile.pipeline import compile_model, make_target, random_inputs, run_and_time
    from tuning.engine.workdir import open_database

    target = make_target(spec["target"])
    model = make_model(spec["pair"], "B")
    inputs = random_inputs(model)
    exes = {side: compile_model(model, target, database=open_database(wd)) for side, wd in spec["sides"].items()}
    samples: dict[str, list[float]] = {s: [] for s in exes}
    for r in range(5):
        for side in (list(exes) if r % 2 == 0 else list(reversed(list(exes)))):
            _, med = run_and_time(exes[side], inputs, target, number=3, repeat=5, min_repeat_ms=100,
                                  threads=spec["threads"])
            samples[side].append(med)
    return {side: statistics.median(v) for side, v in samples.items()} | {"samples": samples}


def child_main(spec: dict) -> None:
    os.environ["TVM_NUM_THREADS"] = str(spec["threads"])
    logging.basicConfig(level=logging.WARNING)
    res = _job_tune(spec) if spec["kind"] == "tune" else _job_remeasure(spec)
    Path(spec["out"]).write_text(json.dumps(res, indent=1, default=str))


def to_match(curve: list, target_s: float | None) -> tuple[int | None, float | None]:
    """Trials and wall at the first point whose estimate is within MATCH of ``target_s``."""
    if target_s is None:
        return None, None
    for n, wall, est in curve:
        if est is not None and est <= target_s * MATCH:
            return n, wall
    return None, None


def _ratio(a, b):
    return (a / b) if a is not None and b else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="96 trials a run, population 64 (< 10 min on 2 cores)")
    ap.add_argument("--trials", type=int, default=None, help="budget of every run (quick 96, full 320)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pair", choices=list(PAIRS), default="finetuned",
                    help="B = A fine-tuned (other weights, every task shared) or A with a 100-class head (4 of 5)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args(argv)
    if args.job:
        child_main(json.loads(args.job))
        return 0
    cores = len(os.sched_getaffinity(0))
    threads = args.threads or cores
    target = {"kind": "llvm", "num-cores": threads}
    from tuning.engine.compile.targets import resolve_cpu_target

    target.update(resolve_cpu_target(num_cores=threads))  # named CPU (mcpu), as the platform's runs
    trials = args.trials or (96 if args.quick else 320)
    root = Path(tempfile.mkdtemp(prefix="bench_record_cache_"))
    machine = machine_info(threads=threads, target=target)
    print(f"# record_cache: pair {args.pair} (small_cnn classes, weight seed: {PAIRS[args.pair]}), {trials} trials a "
          f"run, threads={threads}")
    print(f"# machine: {machine['cpu']}, load average at start {machine.get('loadavg')} (shared, noisy)")

    def spec(label: str, model: str, **extra) -> dict:
        wd = root / label
        return {"kind": "tune", "label": label, "model": model, "pair": args.pair, "target": target,
                "threads": threads,
                "trials": trials, "per_round": 16, "seed": args.seed, "population": 64 if args.quick else None,
                "genetic_iters": 2 if args.quick else None, "work_dir": str(wd), "out": str(wd) + ".json", **extra}

    publish = str(root / "cache.json")
    runs = {"A cold": run_child(SCRIPT, spec("A_cold", "A", publish=publish), timeout=3600)}
    runs["B cold"] = run_child(SCRIPT, spec("B_cold", "B"), timeout=3600)
    runs["B warm"] = run_child(SCRIPT, spec("B_warm", "B", cache=publish), timeout=3600)
    rm = run_child(SCRIPT, {"kind": "remeasure", "label": "remeasure", "pair": args.pair, "target": target,
                            "threads": threads,
                            "sides": {"cold": str(root / "B_cold"), "warm": str(root / "B_warm")},
                            "out": str(root / "remeasure.json")}, timeout=3600)
    cold, warm = runs["B cold"], runs["B warm"]
    goal = next((est for _, _, est in reversed(cold["curve"]) if est is not None), None)
    rows = {}
    for label, res in runs.items():
        n, wall = to_match(res["curve"], goal) if label != "A cold" else (None, None)
        ver = (res.get("verification") or {}).get("tasks") or []
        rows[label] = {"tasks_with_hits": (res.get("seeding") or {}).get("hits", 0),
                       "verified": sum(1 for v in ver if v["verified"]),
                       "settled": sum(1 for v in ver if v.get("settled", v["verified"])),
                       "trials_to_match": n, "wall_to_match_s": wall,
                       "trials": res["n_measured"], "wall_s": res["wall_s"], "estimate_s": res["estimated_latency_s"]}
        print(f"  {label:7s} hits {rows[label]['tasks_with_hits']} (verified {rows[label]['verified']}, settled "
              f"{rows[label]['settled']})  trials "
              f"{res['n_measured']:4d}  wall {res['wall_s']:6.1f} s  to match: {n} trials, {fmt_s(wall)} s  "
              f"estimate {fmt_s(res['estimated_latency_s'], 'ms')} ms", flush=True)
    final = {"cold": rm["cold"], "warm": rm["warm"]}
    # rounds alternate the order, so each round's warm/cold pair was timed back to back: their ratio is
    # what drift in the machine's load (a shared host) disturbs least
    paired = [w / c for c, w in zip(rm["samples"]["cold"], rm["samples"]["warm"]) if c and w]
    print(f"  final latency B: cold {fmt_s(final['cold'], 'ms')} ms, warm {fmt_s(final['warm'], 'ms')} ms "
          f"(medians of {len(paired)} alternated rounds; per-round warm/cold {', '.join(f'{x:.3f}' for x in paired)})")
    for v in (warm.get("verification") or {}).get("tasks") or []:
        print(f"    {v['task_name']:28s} cache {fmt_s(v['cache_best_s'], 'us')} us  here "
              f"{fmt_s(v['measured_best_s'], 'us')} us  {'verified' if v['verified'] else 'not verified'}  "
              f"(re-timed {v.get('n_retimed', 0)})  {'settled' if v.get('settled') else 'searched'}: "
              f"{v.get('convergence', '')}")
    overall = {
        "trials_to_match_ratio": _ratio(rows["B warm"]["trials_to_match"], rows["B cold"]["trials_to_match"]),
        "wall_to_match_ratio": _ratio(rows["B warm"]["wall_to_match_s"], rows["B cold"]["wall_to_match_s"]),
        "final_latency_ratio": _ratio(final["warm"], final["cold"]),
        "final_latency_paired_ratio": statistics.median(paired) if paired else None,
        "trials_total_ratio": _ratio(rows["B warm"]["trials"], rows["B cold"]["trials"]),
        "tasks_with_hits": rows["B warm"]["tasks_with_hits"], "tasks_verified": rows["B warm"]["verified"],
        "tasks_settled": rows["B warm"]["settled"],
    }
    print("# overall (warm / cold): " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                  for k, v in overall.items()))
    result = {"overall": overall, "pair": args.pair, "pair_models": PAIRS[args.pair], "models": rows,
              "final_latency_s": final, "match_within": MATCH,
              "goal_estimate_s": goal, "runs": runs, "trials": trials, "quick": args.quick,
              "machine": machine | {"loadavg_end": list(os.getloadavg())}}
    write_result(result, json_path=args.json, work_root=root, keep=args.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
