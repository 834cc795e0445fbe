#!/usr/bin/env python
"""Tuning wall time and best latency: stock MetaSchedule vs the platform's engine.

For each workload and the same trial budget, interleaved in one run, each
tuning job in a fresh interpreter (both sides pay their own imports and
start-ups, as a tuning worker would):

  stock  TVM 0.27's own path: ``ms.tune_tir`` (TIR workloads) or
         ``extract_tasks`` + ``ms.tune_tasks`` (ONNX through Relax) with the
         default LocalBuilder / LocalRunner, gradient task scheduler,
         evolutionary search and evaluator (number=3, repeat=1,
         min_repeat_ms=100); TVM_NUM_THREADS = --threads. The only change: the
         builder timeout is 120 s instead of 30 s, because on a loaded 2-core
         host a fresh builder worker's 11 s ``import tvm.s_tir.tensor_intrin``
         alone can exceed 30 s and every build then fails.
  ours   ``tuning.engine.session.run_tuning(mode="doppler", dop="auto")``:
         persistent builder (.so), target-specific intrinsic import, pooled
         asynchronous runner with core partitioning and DOPpler's DOP control,
         final serial re-measure of the top 10 %; same search, evaluator,
         thread count and trials.

Then both winners of every workload are re-measured in ONE fresh process with
the same evaluator (number=3, repeat=5, min_repeat_ms=100, medians over
alternating rounds); ONNX models are compiled end to end with each database.
Kernel winners are timed as MetaSchedule times them (weight-layout rewrite
block removed, i.e. pre-laid-out weights); ONNX models run end to end.
Ablation: the mechanisms switched on in turn (on every TIR workload; with
--quick on the first workload, "persistent builder + target-specific
intrinsics, TVM's LocalRunner" as its first step, to stay under 10 minutes):
+ async pooled runner (DOP 1), + deferred cost model (XGBoost trained only
when its booster is used, search.train_when_needed), then ours (+ DOP auto and
the final re-measure). Parallel measurement on its own: the same engine at
T = 1, DOP auto against DOP 1, with six ablations of DOP auto (DOPpler's
serial first round; DOPpler's fixed 20 % serial sample every round; DOPpler's
error threshold against one serial timing taken as exact, instead of above the
host's measured serial noise; DOPpler's serial re-measure of every outlier,
instead of leaving slow ones past DOP x the round's median as measured;
DOPpler's immediate back-off on the first serial timings, instead of a second
serial look at the sample of a round about to back off; DOPpler's probe of
20 % of a round, instead of the 4 pairs the pooled rule decides on), and
the least wall ratio the machine allows (measuring at the most DOP with no
serial sample; DOP 1's CPU seconds spread over all cores), and the whole-run
ratio the measuring phase alone accounts for (``parallel_wall_ratio_mechanism``:
the rest of each run taken as long as DOP 1's). The pairs run --parallel-trials
(192 with --quick) in rounds of 32. Runs diverge once their timings rank
candidates differently (and from the start with a multi-threaded search), so
they visit different candidates: ``cand.s`` (sum of the measured candidates'
latencies) shows how much of a wall-time difference the trajectory alone
explains.

Paired searches (--search-threads, default 1): every side searches with one
thread (TVM hands sampling work to its threads in arrival order, so only a
one-thread search proposes the same candidates from the same seed) and seeds
numpy's global generator (XGBoost's predictions below its 100-result warm-up
are numpy draws), so both sides of a comparison propose the same first round
and diverge only where their measurements rank candidates differently.
XGBoost still trains on the physical cores (TVM's default) on both sides.
``shared_candidates`` (share of one side's measured candidates the other side
measured too) says how far the pairing held; the latency ratios then compare
what the engines measured and picked, not two random searches' luck (at 64
trials both searches are random: XGBoost's warm-up). --search-threads 0
restores TVM's default (physical cores: unpaired searches).

    .venv/bin/python bench/tuning_time.py [--quick] [--threads 2] [--json bench/results/tuning_time.json]
    .venv/bin/python bench/tuning_time.py --quick --only-parallel --seeds 1,2,3 \
        [--parallel-sides dop1,dop_auto,dop_auto_fixed_sample]   # the pairs over seeds: medians of each seed's
    .venv/bin/python bench/tuning_time.py --report a.json,b.json [--json all.json]   # saved runs' seeds, pooled
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

from bench.common import (chosen_sides, fmt_s, geomean, machine_info, run_child, tuning_config,  # noqa: E402
                          write_json, write_result)

SCRIPT = str(Path(__file__).resolve())

# name -> (kind, description)
WORKLOADS = {
    "matmul512": ("tir", "C = A @ B, 512x512x512 float32"),
    "conv3x3_resnet": ("tir", "conv2d NCHW 1x64x56x56, 64 out, 3x3, pad 1 (ResNet-18 stage 1)"),
    "dwconv_mobilenet": ("tir", "depthwise conv2d NCHW 1x128x56x56, 3x3, pad 1 (MobileNet)"),
    "small_cnn": ("onnx", "zoo small_cnn through Relax (5 tasks)"),
}
TIR_WORKLOADS = [name for name, (kind, _) in WORKLOADS.items() if kind == "tir"]  # single PrimFuncs

ABLATION = {
    # label -> TuningConfig overrides (all on top of mode="doppler")
    "persistent_builder": dict(builder="persistent", runner="local", light_intrinsics=False, final_remeasure=False,
                               deferred_cost_model=False),
    "+light_intrinsics": dict(builder="persistent", runner="local", light_intrinsics=True, final_remeasure=False,
                              deferred_cost_model=False),
    "+async_pooled_runner": dict(builder="persistent", runner="pooled", dop=1, light_intrinsics=True, final_remeasure=False,
                                 deferred_cost_model=False),
    # XGBoost trained only when its booster is used (search.train_when_needed), still DOP 1
    "+deferred_cost_model": dict(builder="persistent", runner="pooled", dop=1, light_intrinsics=True, final_remeasure=False),
    "+dop_auto+final_remeasure": dict(),  # = ours
}
# parallel measurement on its own: the same engine at a deployment thread count that leaves room for
# DOP > 1 (T = PARALLEL_THREADS: one slot per core), DOP 1 against DOPpler's auto DOP
PARALLEL_THREADS = 1
# DOP auto as the platform runs it (the first round probes a parallel DOP, calm rounds sample less, the
# error threshold counts above the host's measured serial noise), the same engine at DOP 1, and ablations
# of DOP auto that each put back one of DOPpler's published choices: its start (the first round serial at
# DOP 1), its fixed 20 % serial sample every round, its threshold against one serial timing taken as exact,
# its serial re-measure of every outlier, its back-off on the first serial timings, and its probe of 20 % of a
# round (the pooled rule's probes the 4 pairs it decides on): bench/dop_presets.py, named here because the
# sides' overrides travel to the child processes as JSON
PARALLEL_SIDES = {"dop1": dict(dop=1), "dop_auto": dict(dop="auto"),
                  "dop_auto_serial_start": dict(dop="auto", dop_rule="serial_start"),
                  "dop_auto_fixed_sample": dict(dop="auto", dop_rule="fixed_sample"),
                  "dop_auto_dopplers_threshold": dict(dop="auto", dop_rule="dopplers_threshold"),
                  "dop_auto_all_outliers": dict(dop="auto", dop_rule="all_outliers"),
                  "dop_auto_immediate_back_off": dict(dop="auto", dop_rule="immediate_back_off"),
                  "dop_auto_share_probe": dict(dop="auto", dop_rule="share_probe")}
# the ablation sides (each puts back one of DOPpler's published choices), with the overall keys' suffix
PARALLEL_ABLATIONS = {"dop_auto_serial_start": "serial_start", "dop_auto_fixed_sample": "fixed_sample",
                      "dop_auto_dopplers_threshold": "dopplers_threshold", "dop_auto_all_outliers": "all_outliers",
                      "dop_auto_immediate_back_off": "immediate_back_off", "dop_auto_share_probe": "share_probe"}


# --------------------------------------------------------------------------- workloads
def make_workload(name: str):
    from tuning.engine import testing

    if name == "matmul512":
        return testing.matmul_primfunc(512)
    if name == "conv3x3_resnet":
        return testing.conv2d_primfunc(1, 64, 56, 56, 64, 3, 3, 1, 1)
    if name == "dwconv_mobilenet":
        return testing.depthwise_conv2d_primfunc(1, 128, 56, 56, 3, 1, 1)
    if name == "small_cnn":
        try:
            from core.onnx_models.zoo import build_model

            return build_model("small_cnn")
        except Exception:  # noqa: BLE001 - zoo not importable: same-shaped local net
            return testing.tiny_cnn_onnx(channels=16, size=32)
    if name == "tiny_cnn":
        return testing.tiny_cnn_onnx()
    raise KeyError(name)


# --------------------------------------------------------------------------- child jobs
def _strategy(spec: dict):
    from tvm.s_tir import meta_schedule as ms

    pop, iters = spec.get("population"), spec.get("genetic_iters")
    if not pop and not iters:
        return "evolutionary"
    kw = {}
    if pop:
        kw.update(population_size=int(pop), init_min_unmeasured=min(50, int(pop)))
    if iters:
        kw["genetic_num_iters"] = int(iters)
    return ms.search_strategy.EvolutionarySearch(**kw)


def _job_stock(spec: dict) -> dict:
    from tvm.s_tir import meta_schedule as ms

    from tuning.engine.compile.pipeline import make_target

    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    target = make_target(spec["target"])
    wl = make_workload(spec["workload"])
    builder = ms.builder.LocalBuilder(timeout_sec=120.0)
    runner = ms.runner.LocalRunner(evaluator_config=ms.runner.EvaluatorConfig())
    strategy = _strategy(spec)
    search_threads = _search_threads(spec)
    # TVM's default cost model (XGBoost on the physical cores), also when the search has one thread
    cost_model = ms.cost_model.XGBModel(num_tuning_cores=None, tree_method="auto")
    t0 = time.perf_counter()
    if WORKLOADS.get(spec["workload"], ("onnx",))[0] == "tir":
        ms.tune_tir(
            wl,
            target,
            spec["work_dir"],
            spec["trials"],
            num_trials_per_iter=spec["per_round"],
            builder=builder,
            runner=runner,
            strategy=strategy,
            cost_model=cost_model,
            num_tuning_cores=search_threads,
            seed=spec["seed"],
        )
    else:
        from tuning.engine.compile.pipeline import extract_tasks

        tasks = extract_tasks(wl, target)
        ctxs, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
            tasks, spec["work_dir"], strategy=strategy, num_threads=search_threads, seed=spec["seed"]
        )
        ms.tune_tasks(
            tasks=ctxs,
            task_weights=weights,
            work_dir=spec["work_dir"],
            max_trials_global=spec["trials"],
            num_trials_per_iter=spec["per_round"],
            builder=builder,
            runner=runner,
            cost_model=cost_model,
        )
    wall = time.perf_counter() - t0
    return {"wall_s": wall, **_db_stats(spec["work_dir"])}


def _db_stats(work_dir: str) -> dict:
    """Records in the run's database; ``candidate_time_s`` (sum of the measured
    candidates' mean latencies) shows how much of a run's measuring time its
    search trajectory alone implies (slow candidates cost more to time)."""
    from tvm.s_tir import meta_schedule as ms

    from tuning.engine.events import candidate_key

    recs = ms.database.JSONDatabase(work_dir=work_dir).get_all_tuning_records()
    lats = [sum(float(x) for x in r.run_secs) / len(r.run_secs) for r in recs if r.run_secs]
    lats = [x for x in lats if x < 1e9]
    return {"n_records": len(recs), "recorded_best_s": min(lats) if lats else None, "candidate_time_s": sum(lats),
            # the engine's candidate key, on the trace alone: stock and the engine name tasks differently
            "candidates": sorted({candidate_key("", r.trace) for r in recs})}


def _search_threads(spec: dict) -> int | str:
    """The search's threads (--search-threads): 1 pairs the sides' searches; 0 is TVM's default."""
    n = int(spec.get("search_threads") or 0)
    return n if n > 0 else "physical"


def shared_candidates(a: dict | None, b: dict | None) -> float | None:
    """Share of the candidates one run measured that the other measured too (over the larger set): 1.0
    when two runs' searches proposed the same candidates, near 0 for independent searches."""
    ka, kb = set((a or {}).get("candidates") or ()), set((b or {}).get("candidates") or ())
    if not ka or not kb:
        return None
    return len(ka & kb) / max(len(ka), len(kb))


def _job_ours(spec: dict) -> dict:
    from tuning.engine.session import run_tuning

    from bench.dop_presets import rule_named

    wl = make_workload(spec["workload"])
    overrides = dict(spec.get("overrides") or {})
    if "dop_rule" in overrides:  # an ablation's name (bench/dop_presets.py)
        overrides["dop_rule"] = rule_named(overrides["dop_rule"])
    cfg = tuning_config(spec, search_threads=_search_threads(spec), **overrides)
    t0 = time.perf_counter()
    s = run_tuning(wl, cfg)
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        **_db_stats(spec["work_dir"]),
        "final_dop": s.final_dop,
        "dop_history": s.dop_history,
        "mean_parallel_error": s.mean_parallel_error,
        "phase_secs": s.phase_secs,
        "serial_by_reason": s.serial_by_reason,
        "final_remeasured": len(s.final_remeasure),
        "status": s.status,
    }


def _job_remeasure(spec: dict) -> dict:
    """Re-measure the winners of every (workload, side) in this one process."""
    import numpy as np
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tuning.engine.compile.pipeline import compile_model, make_target, random_inputs, run_and_time
    from tuning.engine.compile.workloads import collect_tasks
    from tuning.engine.workdir import open_database
    from tuning.engine.measuring.timer import EvaluatorConfig, time_module

    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    target = make_target(spec["target"])
    cfg = EvaluatorConfig(number=3, repeat=5, min_repeat_ms=100)
    rounds = int(spec.get("rounds", 3))
    out = {}
    for wname, sides in spec["items"].items():
        wl = make_workload(wname)
        runners = {}
        for side, work_dir in sides.items():
            db = open_database(work_dir) if side != "stock" else ms.database.JSONDatabase(work_dir=work_dir)
            if WORKLOADS.get(wname, ("onnx",))[0] == "tir":
                (task,) = collect_tasks(wl, target)
                sch_mod = db.query_ir_module(task.mod, target, "main")
                if sch_mod is None:
                    runners[side] = None
                    continue
                from tvm.driver import build as tvm_build
                from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

                # as MetaSchedule measured it (both sides): weights pre-laid-out
                sch_mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(sch_mod)
                rt = tvm_build(sch_mod, target=target)
                dev = tvm.cpu()
                rng = np.random.default_rng(0)
                args = [
                    tvm.runtime.tensor(rng.standard_normal([int(s) for s in a.shape]).astype(a.dtype), device=dev)
                    for a in ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])
                ]
                runners[side] = ("tir", rt, dev, args)
            else:
                ex = compile_model(wl, target, database=db)
                runners[side] = ("onnx", ex, random_inputs(wl), None)
        samples: dict[str, list[float]] = {s: [] for s in runners}
        outputs = {}
        for r in range(rounds):
            order = list(runners) if r % 2 == 0 else list(reversed(list(runners)))
            for side in order:
                item = runners[side]
                if item is None:
                    continue
                if item[0] == "tir":
                    _, rt, dev, args = item
                    samples[side].extend(time_module(rt, dev, args, cfg))
                else:
                    _, ex, inputs, _ = item
                    outs, med = run_and_time(
                        ex, inputs, target, number=cfg.number, repeat=cfg.repeat, min_repeat_ms=cfg.min_repeat_ms
                    )
                    outputs[side] = outs
                    samples[side].append(med)
        res = {side: (statistics.median(v) if v else None) for side, v in samples.items()}
        if len(outputs) == 2:
            a, b = list(outputs.values())
            res["max_abs_diff"] = float(max(np.max(np.abs(x - y)) for x, y in zip(a, b)))
        out[wname] = res
    return out


def child_main(spec: dict) -> None:
    os.environ["TVM_NUM_THREADS"] = str(spec["threads"])
    logging.basicConfig(level=logging.WARNING)
    if spec.get("seed") is not None:
        import numpy as np

        # XGBoost's warm-up predictions are numpy's global draws: the same seed on every side
        np.random.seed(int(spec["seed"]))
    kind = spec["kind"]
    if kind == "stock":
        res = _job_stock(spec)
    elif kind == "ours":
        res = _job_ours(spec)
    elif kind == "remeasure":
        res = _job_remeasure(spec)
    else:
        raise ValueError(kind)
    Path(spec["out"]).write_text(json.dumps(res, indent=1, default=str))


# --------------------------------------------------------------------------- parallel measurement alone
def _parallel_pairs(args, names, spec, root: Path, seed: int, sides: list[str]) -> list[dict]:
    """DOP 1 vs DOP auto (and the ``sides`` ablations), the same engine, workloads, trials and ``seed``, at
    T = PARALLEL_THREADS (so each core is a measurement slot); interleaved so drifting machine load hits
    both sides alike."""
    target = {"kind": "llvm", "num-cores": PARALLEL_THREADS}
    tir = [n for n in names if WORKLOADS.get(n, ("onnx",))[0] == "tir"]
    # 32 a round: six rounds of --quick's 192 trials (--parallel-trials), eight of 256. Fewer rounds (two of
    # 64 trials) leave the DOP rule no round to recover in after a noisy probe (it re-probes two rounds
    # after a back-off), and its fixed costs (the probe, the first pooled pairs) a large share of its
    # serial timings; smaller rounds pay the search's fixed cost a round more often and a pooled round's
    # serial timing of its fastest (1/16 of a round's measuring at 16 a round) twice as often
    per_round = args.parallel_per_round
    pairs = []
    for i, name in enumerate(tir[:2] if args.quick else tir):
        pair = {"workload": name, "threads": PARALLEL_THREADS, "seed": seed}
        for side in (sides if i % 2 == 0 else list(reversed(sides))):
            sp = spec("ours", name, f"par_s{seed}_{side}", overrides=PARALLEL_SIDES[side], threads=PARALLEL_THREADS,
                      target=target, per_round=per_round, seed=seed, trials=args.parallel_trials)
            pair[side] = run_child(SCRIPT, sp, timeout=1800)
            pair[side]["work_dir"] = sp["work_dir"]
            print(f"  {name:18s} seed {seed} T={PARALLEL_THREADS} {side:8s} wall {pair[side]['wall_s']:7.1f} s  "
                  f"final DOP {pair[side].get('final_dop')}  load {os.getloadavg()[0]:.1f}", flush=True)
        pairs.append(pair)
    return pairs


def _sides(pair: dict) -> list[str]:
    """The PARALLEL_SIDES a pair ran."""
    return [side for side in PARALLEL_SIDES if side in pair]


def _remeasure_parallel(pairs: list[dict], target: dict, root: Path) -> None:
    """The winners of every side of a seed's pairs re-measured in one fresh process at the pairs' thread count."""
    items = {p["workload"]: {side: p[side]["work_dir"] for side in _sides(p)} for p in pairs}
    tag = "_".join(sorted({f"s{p['seed']}" for p in pairs}))
    rm = run_child(SCRIPT, {"kind": "remeasure", "label": f"remeasure_parallel_{tag}",
                            "target": {**target, "num-cores": PARALLEL_THREADS}, "threads": PARALLEL_THREADS,
                            "items": items, "rounds": 3, "out": str(root / f"remeasure_parallel_{tag}.json")},
                   timeout=1800)
    for p in pairs:
        m = rm.get(p["workload"], {})
        for side in _sides(p):
            p[side]["best_latency_s"] = m.get(side)
        p["wall_ratio"] = p["dop_auto"]["wall_s"] / p["dop1"]["wall_s"]
        p["latency_ratio"] = m["dop_auto"] / m["dop1"] if m.get("dop_auto") and m.get("dop1") else None
        p["shared_candidates"] = shared_candidates(p["dop1"], p["dop_auto"])
        t1 = (p["dop1"].get("phase_secs") or {}).get("measure_rounds")
        ta = (p["dop_auto"].get("phase_secs") or {}).get("measure_rounds")
        p["measure_phase_ratio"] = ta / t1 if t1 and ta else None
        # what that phase's saving alone makes of the whole run, the rest of the run as long as DOP 1's: the
        # mechanism's share of wall_ratio (the rest of a pair's wall ratio is its search's trajectory and the
        # host's moments, which move a pair's non-measuring time by +-35 %; docs/research/doppler.md)
        p["wall_ratio_mechanism"] = (1.0 - (t1 / p["dop1"]["wall_s"]) * (1.0 - ta / t1)
                                     if t1 and ta and p["dop1"].get("wall_s") else None)
        # DOP auto's measuring time split against DOP 1's: the measure calls at the rounds' DOP (what
        # approaches 1/DOP) and DOPpler's serial re-measures (sample, failures, serial-noise repeats)
        ph = p["dop_auto"].get("phase_secs") or {}
        tp, tser = ph.get("measure_parallel"), ph.get("measure_serial")
        p["measure_at_dop_ratio"] = tp / t1 if t1 and tp else None
        p["serial_sample_ratio"] = tser / t1 if t1 and tser is not None else None
        # ... and that serial share by why it was spent (probe, sample, noise pairs, uncorrectable rounds)
        p["serial_ratio_by_reason"] = {reason: row["secs"] / t1 for reason, row in
                                       (p["dop_auto"].get("serial_by_reason") or {}).items()} if t1 else {}
        p["error_at_final_dop"] = _error_at_final_dop(p["dop_auto"])
        p["wall_ratio_floor"] = _wall_ratio_floor(p["dop1"], len(os.sched_getaffinity(0)))
        p["busy_cores"] = {side: (p[side].get("cpu") or {}).get("busy_cores") for side in _sides(p)}
        for side, key in PARALLEL_ABLATIONS.items():
            ss = p.get(side)
            if ss:
                ts = (ss.get("phase_secs") or {}).get("measure_rounds")
                p[key] = {
                    "wall_ratio": ss["wall_s"] / p["dop1"]["wall_s"],
                    "latency_ratio": m[side] / m["dop1"] if m.get(side) and m.get("dop1") else None,
                    "measure_phase_ratio": ts / t1 if t1 and ts else None,
                    "final_dop": ss.get("final_dop"),
                }


def _wall_ratio_floor(dop1: dict, cores: int) -> dict:
    """The least wall ratio any DOP could give against this DOP 1 run on this machine (estimates):
    ``amdahl``, measuring at the most DOP (one slot a core) with no serial sample, everything else as
    long as at DOP 1; ``cpu``, the same CPU seconds spread over all cores (a DOP 1 run that already keeps
    the cores busy searching and building next to its measuring leaves parallel measuring nothing to
    use); ``floor``, the larger."""
    max_dop = max(1, cores // PARALLEL_THREADS)
    t1 = (dop1.get("phase_secs") or {}).get("measure_rounds")
    amdahl = 1.0 - (t1 / dop1["wall_s"]) * (1.0 - 1.0 / max_dop) if t1 and dop1.get("wall_s") else None
    cpu = dop1.get("cpu") or {}
    cpu_floor = cpu["cpu_s"] / (cores * cpu["wall_s"]) if cpu.get("cpu_s") and cpu.get("wall_s") else None
    known = [v for v in (amdahl, cpu_floor) if v is not None]
    return {"amdahl": amdahl, "cpu": cpu_floor, "floor": max(known) if known else None}


def _error_at_final_dop(res: dict) -> float | None:
    """Mean measured parallel-vs-serial error of the rounds run at the run's final DOP (the run's mean
    parallel error when it ended at DOP 1)."""
    final = res.get("final_dop")
    errs = [h["mean_error"] for h in res.get("dop_history") or []
            if h.get("dop") == final and h.get("n_sampled") and h.get("mean_error") is not None]
    return statistics.mean(errs) if errs else res.get("mean_parallel_error")


def _parallel_overall(pairs: list[dict]) -> dict:
    errs = [p["error_at_final_dop"] for p in pairs if p.get("error_at_final_dop") is not None]
    dops = [p["dop_auto"].get("final_dop") for p in pairs if p["dop_auto"].get("final_dop") is not None]
    phase = [p["measure_phase_ratio"] for p in pairs if p.get("measure_phase_ratio")]
    out = {
        "parallel_threads": PARALLEL_THREADS,
        "parallel_wall_ratio": geomean(p["wall_ratio"] for p in pairs),
        "parallel_latency_ratio": geomean(p["latency_ratio"] for p in pairs if p["latency_ratio"]),
        "parallel_final_dop": statistics.median(dops) if dops else None,
        # how far DOP auto's and DOP 1's searches proposed the same candidates (--search-threads)
        "parallel_shared_candidates": _mean_or_none(p.get("shared_candidates") for p in pairs),
        # the host's serial noise DOP auto measured (mean |serial - serial again| / serial of its repeats)
        "parallel_serial_noise": _mean_or_none(_last_noise(p["dop_auto"]) for p in pairs),
        "parallel_error": statistics.mean(errs) if errs else None,
        "parallel_measure_phase_ratio": geomean(phase) if phase else None,
        "parallel_wall_ratio_mechanism": geomean(p.get("wall_ratio_mechanism") for p in pairs),
        # of that phase: DOP auto's measure calls at its DOP / DOP 1's measuring (-> 1/DOP when the
        # slots do not interfere), and its serial re-measures / DOP 1's measuring (the sample's cost)
        "parallel_measure_at_dop_ratio": geomean(p.get("measure_at_dop_ratio") for p in pairs),
        "parallel_serial_sample_ratio": _mean_or_none(p.get("serial_sample_ratio") for p in pairs),
        # ... split by why it was spent (rounds.SERIAL_REASONS; a reason a pair never paid for counts 0)
        "parallel_serial_ratio_by_reason": {
            reason: statistics.mean((p.get("serial_ratio_by_reason") or {}).get(reason, 0.0) for p in pairs)
            for reason in sorted({r for p in pairs for r in (p.get("serial_ratio_by_reason") or {})})},
        # share of DOP auto's rounds measured at DOP > 1 (the final DOP is where the rule ended,
        # after the last round)
        "parallel_rounds_above_dop1": _share_above_dop1(pairs),
        # the least wall ratio this machine allows (_wall_ratio_floor) and the cores each side kept busy
        "parallel_wall_ratio_floor": geomean((p.get("wall_ratio_floor") or {}).get("floor") for p in pairs),
        "parallel_wall_ratio_floor_amdahl": geomean((p.get("wall_ratio_floor") or {}).get("amdahl") for p in pairs),
        "parallel_wall_ratio_floor_cpu": geomean((p.get("wall_ratio_floor") or {}).get("cpu") for p in pairs),
        "parallel_busy_cores": {side: _mean_or_none((p.get("busy_cores") or {}).get(side) for p in pairs)
                                for side in PARALLEL_SIDES if any(side in p for p in pairs)},
        # the measuring share of DOP 1's run: the most DOP auto can save is this share x (1 - 1/DOP - sample)
        "parallel_measure_share_dop1": geomean(
            p["dop1"]["phase_secs"]["measure_rounds"] / p["dop1"]["wall_s"] for p in pairs
            if (p["dop1"].get("phase_secs") or {}).get("measure_rounds")) if pairs else None,
    }
    # ablations: DOPpler's published start (first round serial) instead of the probe start, and its
    # fixed 20 % serial sample instead of the adaptive one
    for key in PARALLEL_ABLATIONS.values():
        rows = [p[key] for p in pairs if p.get(key)]
        out[f"parallel_wall_ratio_{key}"] = geomean(r["wall_ratio"] for r in rows) if rows else None
        out[f"parallel_measure_phase_ratio_{key}"] = geomean(
            r["measure_phase_ratio"] for r in rows if r["measure_phase_ratio"]) if rows else None
        out[f"parallel_latency_ratio_{key}"] = geomean(r["latency_ratio"] for r in rows if r["latency_ratio"]) if rows else None
    return out


# the ratios a run over several seeds reports as the median of each seed's own (the search's trajectory moves
# a single seed's wall and latency by tens of percent: docs/research/doppler.md)
SEED_MEDIAN_KEYS = ("parallel_wall_ratio", "parallel_latency_ratio", "parallel_measure_phase_ratio",
                    "parallel_wall_ratio_mechanism",
                    "parallel_measure_at_dop_ratio", "parallel_serial_sample_ratio", "parallel_wall_ratio_floor",
                    *(f"parallel_{kind}_ratio_{key}" for key in PARALLEL_ABLATIONS.values()
                      for kind in ("wall", "measure_phase", "latency")))


def _parallel_over_seeds(pairs: list[dict]) -> dict:
    """``_parallel_overall`` of every (seed, workload) pair; over several seeds, the SEED_MEDIAN_KEYS are the
    median of each seed's own figure instead, each seed's kept under ``parallel_by_seed``."""
    seeds = sorted({p["seed"] for p in pairs})
    out = _parallel_overall(pairs)
    out["parallel_seeds"] = seeds
    if len(seeds) > 1:
        by_seed = {seed: _parallel_overall([p for p in pairs if p["seed"] == seed]) for seed in seeds}
        for key in SEED_MEDIAN_KEYS:
            vals = [by_seed[seed].get(key) for seed in seeds if by_seed[seed].get(key) is not None]
            out[key] = statistics.median(vals) if vals else None
        out["parallel_by_seed"] = {str(seed): {key: by_seed[seed].get(key) for key in SEED_MEDIAN_KEYS}
                                   for seed in seeds}
        out["parallel_aggregate"] = f"median over {len(seeds)} seeds of each seed's geomean over its workloads"
    return out


def _last_noise(res: dict) -> float | None:
    noise = [h["serial_noise"] for h in res.get("dop_history") or [] if h.get("serial_noise") is not None]
    return noise[-1] if noise else None


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.0f} %"


def _mean_or_none(values) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.mean(vals) if vals else None


def _share_above_dop1(pairs: list[dict]) -> float | None:
    hist = [h for p in pairs for h in p["dop_auto"].get("dop_history") or []]
    return sum(1 for h in hist if h.get("dop", 1) > 1) / len(hist) if hist else None


def _print_parallel(pairs: list[dict], overall: dict) -> None:
    print(f"\nparallel measurement alone (same engine, T={PARALLEL_THREADS}, DOP auto vs DOP 1; "
          "measure = wall time of the DOPpler rounds):")
    for p in pairs:
        lr, mr, e = p.get("latency_ratio"), p.get("measure_phase_ratio"), p.get("error_at_final_dop")
        print(f"  {p['workload'][:12]:12s} s{p['seed']:<3d} dop1 {p['dop1']['wall_s']:7.1f} s  auto {p['dop_auto']['wall_s']:7.1f} s  "
              f"wall x{p['wall_ratio']:.3f}  measure x{(mr or float('nan')):.3f}  lat x{(lr or float('nan')):.3f}  "
              f"final DOP {p['dop_auto'].get('final_dop')}  err {(e if e is not None else float('nan')):.3f}  "
              f"shared {_pct(p.get('shared_candidates'))}")
        if p.get("measure_at_dop_ratio"):
            print(f"  {'':18s} of DOP 1's measuring: at DOP x{p['measure_at_dop_ratio']:.3f} "
                  f"+ serial sample x{(p.get('serial_sample_ratio') or 0.0):.3f}")
        by = p["dop_auto"].get("serial_by_reason") or {}
        if by:
            hist = p["dop_auto"].get("dop_history") or []
            skipped = sum(h.get("outliers_skipped") or 0 for h in hist)
            topped = sum(h.get("sample_topped_up") or 0 for h in hist)
            print(f"  {'':18s} serial timings: " + ", ".join(
                f"{reason} {row['n']} x{p['serial_ratio_by_reason'].get(reason, 0.0):.3f}"
                + (f" ({row['failed']} failed in parallel)" if row.get("failed") else "")
                for reason, row in sorted(by.items())) + f"; slow outliers left as measured: {skipped}"
                + f"; sample topped up by {topped}")
        fl, busy = p.get("wall_ratio_floor") or {}, p.get("busy_cores") or {}
        if fl.get("floor"):
            print(f"  {'':18s} least wall ratio here x{fl['floor']:.3f} (amdahl x{fl['amdahl'] or float('nan'):.3f}, "
                  f"cores x{fl['cpu'] or float('nan'):.3f}); busy cores: " + ", ".join(
                      f"{side} {v:.2f}" for side, v in busy.items() if v is not None))
        for key in PARALLEL_ABLATIONS.values():
            ss = p.get(key)
            if ss:
                print(f"  {'':18s} {key.replace('_', ' ') + ':':13s} wall x{ss['wall_ratio']:.3f}  "
                      f"measure x{(ss['measure_phase_ratio'] or float('nan')):.3f}  "
                      f"lat x{(ss['latency_ratio'] or float('nan')):.3f}  final DOP {ss['final_dop']}")
    print(f"  {'overall':18s} wall x{overall['parallel_wall_ratio']:.3f}  "
          f"measure x{(overall['parallel_measure_phase_ratio'] or float('nan')):.3f}  "
          f"lat x{(overall['parallel_latency_ratio'] or float('nan')):.3f}  "
          f"median final DOP {overall['parallel_final_dop']}  error {overall['parallel_error']}  "
          f"serial noise {overall['parallel_serial_noise']}  shared candidates {_pct(overall.get('parallel_shared_candidates'))}")
    if overall.get("parallel_wall_ratio_mechanism"):
        print(f"  {'':18s} wall the measuring phase accounts for x{overall['parallel_wall_ratio_mechanism']:.3f} "
              "(the rest of each run as long as DOP 1's)")
    if overall.get("parallel_measure_at_dop_ratio"):
        print(f"  {'':18s} of DOP 1's measuring: at DOP x{overall['parallel_measure_at_dop_ratio']:.3f} "
              f"+ serial sample x{(overall.get('parallel_serial_sample_ratio') or 0.0):.3f}")
    if overall.get("parallel_wall_ratio_floor"):
        print(f"  {'':18s} least wall ratio this machine allows x{overall['parallel_wall_ratio_floor']:.3f} "
              f"(measuring at the most DOP with no sample x{overall['parallel_wall_ratio_floor_amdahl'] or float('nan'):.3f}, "
              f"DOP 1's CPU seconds on all cores x{overall['parallel_wall_ratio_floor_cpu'] or float('nan'):.3f})")
    if overall.get("parallel_serial_ratio_by_reason"):
        print(f"  {'':18s} serial sample by reason: " + ", ".join(
            f"{reason} x{ratio:.3f}" for reason, ratio in overall["parallel_serial_ratio_by_reason"].items()))


def _print_seeds(overall: dict) -> None:
    print(f"\nparallel measurement over seeds {overall['parallel_seeds']} ({overall['parallel_aggregate']}):")
    for seed, row in overall["parallel_by_seed"].items():
        print(f"  seed {seed:>3s}  wall x{row['parallel_wall_ratio']:.3f}  "
              f"(mechanism x{(row['parallel_wall_ratio_mechanism'] or float('nan')):.3f})  "
              f"measure x{(row['parallel_measure_phase_ratio'] or float('nan')):.3f}  "
              f"lat x{(row['parallel_latency_ratio'] or float('nan')):.3f}")
    print(f"  {'median':9s} wall x{overall['parallel_wall_ratio']:.3f}  "
          f"(mechanism x{(overall['parallel_wall_ratio_mechanism'] or float('nan')):.3f})  "
          f"measure x{(overall['parallel_measure_phase_ratio'] or float('nan')):.3f}  "
          f"lat x{(overall['parallel_latency_ratio'] or float('nan')):.3f}  "
          f"final DOP (median of all pairs) {overall['parallel_final_dop']}")


def report(paths: list[str], json_path: str | None) -> int:
    """``--report``: the parallel pairs of several saved ``--json`` results (each seed once), summarized as one
    run over all their seeds would be (``_parallel_over_seeds``). 2 with a one-line message for a file that
    cannot be read or holds no parallel pairs, or a seed that two files hold."""
    pairs, seen = [], {}
    for path in paths:
        try:
            saved = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            print(f"tuning_time --report: cannot read {path}: {exc}", file=sys.stderr)
            return 2
        found = saved.get("parallel") if isinstance(saved, dict) else None
        if not found or not all(isinstance(p, dict) and {"seed", "dop1", "dop_auto"} <= p.keys() for p in found):
            print(f"tuning_time --report: {path} holds no parallel pairs (a tuning_time.py --json result "
                  "with the DOP auto vs DOP 1 pairs)", file=sys.stderr)
            return 2
        for seed in sorted({p["seed"] for p in found}):
            if seed in seen:
                print(f"tuning_time --report: seed {seed} is in both {seen[seed]} and {path}: a seed's pairs "
                      "would be pooled with another run's", file=sys.stderr)
                return 2
            seen[seed] = path
        pairs += found
    overall = _parallel_over_seeds(pairs)
    if len(overall["parallel_seeds"]) > 1:
        _print_seeds(overall)
    else:
        _print_parallel(pairs, overall)
    write_json({"benchmark": "tuning_time", "report_of": paths, "overall": overall, "parallel": pairs}, json_path)
    return 0


# --------------------------------------------------------------------------- driver
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="small budgets, ablation on one workload (< 10 min on 2 cores)")
    ap.add_argument("--threads", type=int, default=None, help="measurement/deployment threads (default: all cores)")
    ap.add_argument("--trials", type=int, default=None, help="trials per TIR workload (default 64 quick / 256 full)")
    ap.add_argument("--parallel-trials", type=int, default=None,
                    help="trials of each DOP auto / DOP 1 run (default: --trials if given, else 192 quick / 256 full)")
    ap.add_argument("--parallel-per-round", type=int, default=32, help="trials a round in the DOP auto / DOP 1 runs (default 32)")
    ap.add_argument("--workloads", default=None, help="comma list (default: all)")
    ap.add_argument("--no-ablation", action="store_true")
    ap.add_argument("--no-parallel", action="store_true", help="skip the DOP auto vs DOP 1 pair at T=1")
    ap.add_argument("--only-parallel", action="store_true", help="only the DOP auto vs DOP 1 pair at T=1")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seeds", default=None,
                    help="comma list of seeds for the DOP auto vs DOP 1 pairs (paired by seed; the ratios are "
                         "the median of each seed's); default: --seed")
    ap.add_argument("--parallel-sides", default=",".join(PARALLEL_SIDES),
                    help=f"comma list of the parallel pair's sides (dop1 and dop_auto always; default all: "
                         f"{', '.join(PARALLEL_SIDES)})")
    ap.add_argument("--population", type=int, default=None, help="evolutionary population, both sides (quick: 128, else TVM's 512)")
    ap.add_argument("--genetic-iters", type=int, default=None, help="genetic iterations, both sides (quick: 2, else TVM's 4)")
    ap.add_argument("--search-threads", type=int, default=1,
                    help="the search's threads on every side (default 1: the sides' searches propose the same "
                         "candidates from a seed; 0: TVM's default, physical cores, unpaired)")
    ap.add_argument("--json", default=None, help="write the result JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the work directories")
    ap.add_argument("--report", default=None, metavar="JSON[,JSON...]",
                    help="run nothing: summarize the parallel pairs of these saved --json results over all their "
                         "seeds (each seed in one file only)")
    args = ap.parse_args(argv)
    if args.job:
        child_main(json.loads(args.job))
        return 0
    if args.report:
        return report([p for p in args.report.split(",") if p], args.json)

    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    sides = chosen_sides(ap, "--parallel-sides", args.parallel_sides, PARALLEL_SIDES, ("dop1", "dop_auto"))
    cores = len(os.sched_getaffinity(0))
    threads = args.threads or cores
    target = {"kind": "llvm", "num-cores": cores}
    tir_trials = args.trials or (64 if args.quick else 256)
    args.parallel_trials = args.parallel_trials or args.trials or (192 if args.quick else 256)
    per_round = 32 if args.quick else 64
    names = args.workloads.split(",") if args.workloads else list(WORKLOADS)
    # the same search on both sides; --quick shrinks it (as the platform's
    # search_population knob does) so four workloads fit in 10 minutes
    population = args.population or (128 if args.quick else None)
    genetic_iters = args.genetic_iters or (2 if args.quick else None)
    root = Path(tempfile.mkdtemp(prefix="bench_tuning_"))
    started = time.perf_counter()
    machine = machine_info(threads=threads, target=target)
    print(f"# tuning_time: {len(names)} workloads, threads={threads}, cores={cores}, quick={args.quick}")
    print(f"# machine: {machine['cpu']}, load average at start {machine.get('loadavg')}")

    def budget(name: str) -> tuple[int, int]:
        if WORKLOADS.get(name, ("onnx",))[0] == "tir":
            return tir_trials, per_round
        # one round per task (5 tasks): 8 per round quick, 16 full
        pr = 8 if args.quick else 16
        return pr * 5 * (1 if args.quick else 2), pr

    def spec(kind, name, label, **extra):
        trials, pr = budget(name)
        wd = root / f"{name}__{label}"
        return {
            "kind": kind,
            "label": f"{name}/{label}",
            "workload": name,
            "target": target,
            "threads": threads,
            "trials": trials,
            "per_round": pr,
            "seed": args.seed,
            "population": population,
            "genetic_iters": genetic_iters,
            "search_threads": args.search_threads,
            "work_dir": str(wd),
            "out": str(root / f"{name}__{label}.json"),
            **extra,
        }

    # parallel measurement alone first (on a shared machine the load drifts: its figures come early)
    parallel: list[dict] = []
    for seed in [] if args.no_parallel else seeds:
        pairs = _parallel_pairs(args, names, spec, root, seed, sides)
        _remeasure_parallel(pairs, target, root)
        _print_parallel(pairs, _parallel_overall(pairs))
        parallel += pairs
    if len(seeds) > 1 and parallel:
        _print_seeds(_parallel_over_seeds(parallel))
    rows = []
    for i, name in enumerate([] if args.only_parallel else names):
        order = ["stock", "ours"] if i % 2 == 0 else ["ours", "stock"]
        res = {}
        for side in order:
            sp = spec(side, name, side)
            t0 = time.perf_counter()
            res[side] = run_child(SCRIPT, sp, timeout=1800)
            res[side]["work_dir"] = sp["work_dir"]
            print(f"  {name:18s} {side:5s} wall {res[side]['wall_s']:7.1f} s  (job {time.perf_counter() - t0:5.1f} s)", flush=True)
        trials, pr = budget(name)
        rows.append({"workload": name, "kind": WORKLOADS.get(name, ("onnx", ""))[0], "description": WORKLOADS.get(name, ("", name))[1],
                     "trials": trials, "trials_per_round": pr, "stock": res["stock"], "ours": res["ours"]})

    ablation = []
    if not (args.no_ablation or args.only_parallel):
        abl_names = [n for n in names if WORKLOADS.get(n, ("onnx",))[0] == "tir"]
        abl_names = abl_names[:1] if args.quick else abl_names
        labels = ["+light_intrinsics", "+async_pooled_runner", "+deferred_cost_model"] if args.quick else list(ABLATION)[:-1]
        for name in abl_names:
            row = next(r for r in rows if r["workload"] == name)
            ablation.append({"workload": name, "config": "stock", "wall_s": row["stock"]["wall_s"], "wall_ratio": 1.0,
                             "candidate_time_s": row["stock"].get("candidate_time_s")})
            for label in labels:
                overrides = dict(ABLATION[label])
                if args.quick and label == "+light_intrinsics":
                    label = "persistent_builder+light_intrinsics"
                sp = spec("ours", name, "abl_" + label.replace("+", "p"), overrides=overrides)
                r = run_child(SCRIPT, sp, timeout=1800)
                ablation.append({"workload": name, "config": label, "wall_s": r["wall_s"],
                                 "wall_ratio": r["wall_s"] / row["stock"]["wall_s"], "recorded_best_s": r["recorded_best_s"],
                                 "candidate_time_s": r.get("candidate_time_s")})
                print(f"  {name:18s} ablation {label:34s} wall {r['wall_s']:7.1f} s", flush=True)
            ablation.append({"workload": name, "config": "+dop_auto+final_remeasure (ours)", "wall_s": row["ours"]["wall_s"],
                             "wall_ratio": row["ours"]["wall_s"] / row["stock"]["wall_s"],
                             "candidate_time_s": row["ours"].get("candidate_time_s")})

    # -- re-measure every winner in one fresh process
    items = {r["workload"]: {"stock": r["stock"]["work_dir"], "ours": r["ours"]["work_dir"]} for r in rows}
    rm = {} if not rows else run_child(SCRIPT, {"kind": "remeasure", "label": "remeasure", "target": target, "threads": threads,
                            "items": items, "rounds": 3, "out": str(root / "remeasure.json")}, timeout=1800)
    for r in rows:
        m = rm.get(r["workload"], {})
        r["stock"]["best_latency_s"] = m.get("stock")
        r["ours"]["best_latency_s"] = m.get("ours")
        r["max_abs_diff_outputs"] = m.get("max_abs_diff")
        r["wall_ratio"] = r["ours"]["wall_s"] / r["stock"]["wall_s"]
        r["latency_ratio"] = (m["ours"] / m["stock"]) if m.get("ours") and m.get("stock") else None
        r["mean_parallel_error"] = r["ours"].get("mean_parallel_error")
        r["final_dop"] = r["ours"].get("final_dop")
        r["shared_candidates"] = shared_candidates(r["stock"], r["ours"])

    errs = [r["mean_parallel_error"] for r in rows if r.get("mean_parallel_error") is not None]
    overall = {
        "wall_ratio": geomean(r["wall_ratio"] for r in rows),
        "latency_ratio": geomean(r["latency_ratio"] for r in rows if r["latency_ratio"]),
        "mean_parallel_error": (sum(errs) / len(errs)) if errs else None,
        "stock_wall_s_total": sum(r["stock"]["wall_s"] for r in rows),
        "ours_wall_s_total": sum(r["ours"]["wall_s"] for r in rows),
        "shared_candidates": _mean_or_none(r.get("shared_candidates") for r in rows),
    }
    if parallel:
        overall.update(_parallel_over_seeds(parallel))
    machine["loadavg_end"] = list(os.getloadavg())
    result = {
        "benchmark": "tuning_time",
        "overall": overall,
        "workloads": rows,
        "machine": machine,
        "ablation": ablation,
        "parallel": parallel,
        "settings": {
            "quick": args.quick,
            "threads": threads,
            "tir_trials": tir_trials,
            "parallel_trials": args.parallel_trials,
            "parallel_trials_per_round": args.parallel_per_round,
            "trials_per_round": per_round,
            "evaluator_tuning": {"number": 3, "repeat": 1, "min_repeat_ms": 100},
            "evaluator_remeasure": {"number": 3, "repeat": 5, "min_repeat_ms": 100, "rounds": 3},
            "search": {"population": population or 512, "genetic_iters": genetic_iters or 4, "same_on_both_sides": True,
                       "threads": args.search_threads or "physical", "paired": args.search_threads == 1},
            "seed": args.seed,
            "parallel_seeds": seeds,
            "parallel_sides": sides,
        },
        "bench_wall_s": time.perf_counter() - started,
    }

    # -- table (with --only-parallel the parallel section above is the whole result)
    if rows:
        _print_table(rows, overall, ablation)
        if parallel:  # again, beside the table it is ablated from
            _print_parallel(parallel, overall)
    print(f"\nthreads={threads}; best latency = winners re-measured in one fresh process "
          f"(number=3, repeat=5, min_repeat_ms=100, median of 3 alternating rounds); "
          f"search population {population or 512}, genetic iters {genetic_iters or 4}, "
          f"{args.search_threads or 'physical'} search thread(s) on both sides"
          f"{' (paired: the same seed proposes the same candidates)' if args.search_threads == 1 else ''}; "
          f"load average start {machine['loadavg']} end {machine['loadavg_end']}; bench {result['bench_wall_s']:.0f} s")

    write_result(result, json_path=args.json, work_root=root, keep=args.keep)
    return 0


def _print_table(rows: list[dict], overall: dict, ablation: list[dict]) -> None:
    print()
    print(f"{'workload':18s} {'trials':>6s} {'stock s':>8s} {'ours s':>8s} {'wall x':>7s} "
          f"{'stock us':>10s} {'ours us':>10s} {'lat x':>6s} {'DOP':>4s} {'par.err':>7s} {'shared':>6s}")
    for r in rows:
        pe = r.get("mean_parallel_error")
        print(f"{r['workload']:18s} {r['trials']:6d} {r['stock']['wall_s']:8.1f} {r['ours']['wall_s']:8.1f} "
              f"{r['wall_ratio']:7.3f} {fmt_s(r['stock']['best_latency_s'], 'us'):>10s} "
              f"{fmt_s(r['ours']['best_latency_s'], 'us'):>10s} "
              f"{(r['latency_ratio'] or float('nan')):6.3f} {str(r.get('final_dop')):>4s} "
              f"{(pe if pe is not None else float('nan')):7.3f} {_pct(r.get('shared_candidates')):>6s}")
    print(f"{'overall (geomean)':18s} {'':6s} {overall['stock_wall_s_total']:8.1f} {overall['ours_wall_s_total']:8.1f} "
          f"{overall['wall_ratio']:7.3f} {'':>10s} {'':>10s} {(overall['latency_ratio'] or float('nan')):6.3f}"
          f" {'':>4s} {'':>7s} {_pct(overall.get('shared_candidates')):>6s}")
    if ablation:
        print("\nablation (wall time, ratio to stock; cand.s = sum of the measured candidates' latencies,"
              " i.e. how slow the programs this run's search happened to visit were):")
        for a in ablation:
            ct = a.get("candidate_time_s")
            print(f"  {a['workload']:18s} {a['config']:36s} {a['wall_s']:8.1f} s  x{a['wall_ratio']:.3f}"
                  f"  cand.s {ct if ct is None else round(ct, 2)}")


if __name__ == "__main__":
    sys.exit(main())
