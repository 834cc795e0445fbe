#!/usr/bin/env python
"""Per task of a tuned job: how far its search got and whether it was still improving; and where the
compiled tuned model's time goes next to the tuning's estimate (issue 41).

The task table comes from the job's work directory, through the engine's readers
(``tuning.engine.workdir``: the TVM database in commit order, the final serial re-measure, the
exhausted tasks). One row per task: weight (calls per inference), trials (candidates reported, as the
bench's sink counts them: a record whose candidate was reported before is no trial), best measured
latency (the least mean over the task's records: what the estimate and the compiler take), the final
serial re-measure where the run did one, its weighted share of the estimate (sum over tasks of weight x
best, the final one where re-measured: ``TuningSummary.best_latency_s``), the trial (of the task and of
the run) that found the best, and a trend: ``still falling`` when the best improved by more than 2 %
over the task's last quarter of trials, else ``flat``.

``--profile`` compiles the tuned model from the records (``compile_model`` with the run's database, as
the bench does) and the untuned one, and times every VM call of one inference with the VM's
instrument hook (TVM 0.27's Relax VM has no ``profile=True``): each tuned kernel in the model, each
tuned kernel alone (``time_evaluator`` on the kernel with the arguments the model gave it, timed warm, as
TVM's default evaluator does, and cold, as the product's CPU evaluator does: ``alone_regimes`` says which of
the two sums the kernels' time in the model more closely), VM builtins (allocation, reshape views, shape checks),
kernels no task names, and the VM's own time between calls. The rows add up to the instrumented inference; the
uninstrumented compiled latency is timed in the same process. The ``steps`` walk from the estimate to it through
the kernels timed alone the way the job's tuning timed its candidates (the job's evaluator; a bench row that
saved none was tuned warm, TVM's default then; a work directory no bench wrote: the product's choice, cold on
CPUs): "alone vs their records" is then the search's own error, "in the model vs alone" what that way of timing
misses. Kernels are matched to tasks by the
structure of the fused functions tasks are extracted from (``layout_rewrite`` renames a kernel
``<name>_prepacked``). The untuned build's per-call kernel times fill the table's ``untuned_us``.

    .venv/bin/python bench/tuned_tasks.py WORK_DIR [--json] [--profile] [--repeat 10]
                                          [--model NAME|FILE.onnx] [--target JSON] [--passes LIST]

The job (model, target, graph passes, evaluator) is read from ``WORK_DIR/bench_job.json``
(bench/vs_onnxruntime.py writes it), else from the bench's row next to the work directory (``WORK_DIR.json``,
the model from the directory's label); the flags override. The tool reads a snapshot of the work directory's database
files (copied to a temporary directory): it never writes where a run may still be tuning.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

JOB_FILE = "bench_job.json"
FALLING, FLAT, TOO_FEW, UNMEASURED = "still falling", "flat", "too few trials", "no valid record"
TREND_WINDOW = 0.25  # the last quarter of a task's trials
TREND_GAIN = 0.02  # "still falling": its best improved by more than this over the window
MIN_TREND_TRIALS = 4  # fewer: a quarter is no window
PREPACKED = "_prepacked"  # SplitLayoutRewritePreproc's name for a kernel reading prepacked weights
VM_GAP = "VM between calls, instrumented"
# a kernel timed alone, per way of timing it: the profile's column for each
ALONE_COLUMN = {"warm": "standalone_us", "cold": "standalone_cold_us"}


# --------------------------------------------------------------------------- task table
def trend(latencies: Sequence[float | None]) -> tuple[str, float | None]:
    """(label, gain): how much a task's best improved over its last quarter of trials, as a fraction of
    the best before that quarter. ``latencies`` in measurement order, None for a failed trial."""
    valid = [x for x in latencies if x is not None]
    if not valid:
        return UNMEASURED, None
    n = len(latencies)
    if n < MIN_TREND_TRIALS:
        return TOO_FEW, None
    window = math.ceil(n * TREND_WINDOW)
    before = [x for x in latencies[: n - window] if x is not None]
    best = min(valid)
    if not before:  # the first valid measurement came in the last quarter
        return FALLING, None
    gain = (min(before) - best) / min(before)
    return (FALLING if gain > TREND_GAIN else FLAT), gain


def task_table(work_dir: str, tasks: Sequence[Any], *, untuned_us: dict[int, float] | None = None) -> list[dict]:
    """One row per task (see the module doc), in task order. ``tasks``: the engine's tasks of the job
    (``collect_tasks`` under the job's target and passes); ``untuned_us``: task index -> per-call latency
    of the default schedule, where known."""
    from tuning.engine.events import candidate_key
    from tuning.engine.workdir import load_exhausted, load_final_rows, record_latency, records_in_commit_order

    series: dict[int, list[float | None]] = {i: [] for i in range(len(tasks))}
    trials = dict.fromkeys(range(len(tasks)), 0)
    duplicates = dict.fromkeys(range(len(tasks)), 0)
    best: dict[int, tuple[float, int, int]] = {}  # task -> (latency, task trial, run trial)
    seen: set[str] = set()
    overall = 0
    for i, rec in records_in_commit_order(work_dir, tasks):
        key = candidate_key(tasks[i].name, rec.trace)
        latency = record_latency(rec)
        if key in seen:  # the sink reported it once: no second trial (its latency still counts for the best)
            duplicates[i] += 1
        else:
            seen.add(key)
            trials[i] += 1
            overall += 1
            series[i].append(latency)
        if latency is not None and latency < best.get(i, (math.inf, 0, 0))[0]:
            best[i] = (latency, trials[i], overall)
    final: dict[int, float] = {}
    for row in (load_final_rows(work_dir) or {}).get("rows", []):
        secs = row.get("serial_latency_s")
        if secs is not None:
            final[row["task_index"]] = min(final.get(row["task_index"], math.inf), float(secs))
    exhausted = load_exhausted(work_dir)
    rows = []
    for i, task in enumerate(tasks):
        label, gain = trend(series[i])
        found = best.get(i)
        used = final.get(i, found[0] if found else None)
        rows.append({
            "index": i, "name": task.name, "weight": float(task.weight), "trials": trials[i],
            "failed": sum(1 for x in series[i] if x is None), "duplicates": duplicates[i],
            "best_us": found[0] * 1e6 if found else None,
            "final_us": final[i] * 1e6 if i in final else None,
            "estimate_us": float(task.weight) * used * 1e6 if used is not None else None,
            "best_trial": found[1] if found else None, "best_trial_overall": found[2] if found else None,
            "trend": label, "last_quarter_gain_pct": gain * 100 if gain is not None else None,
            "exhausted": i in exhausted,
            "untuned_us": (untuned_us or {}).get(i),
        })
    total = sum(r["estimate_us"] for r in rows if r["estimate_us"] is not None)
    for r in rows:
        r["share_pct"] = 100 * r["estimate_us"] / total if r["estimate_us"] is not None and total else None
    return rows


def _f(v, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def print_task_table(rows: Sequence[dict], file=None) -> None:
    """The table, largest share of the estimate first."""
    out = file or sys.stdout
    print(f"{'task':34s} {'w':>3s} {'trials':>6s} {'best us':>10s} {'final us':>9s} {'share %':>7s} "
          f"{'best@task':>9s} {'@run':>6s} {'trend':>14s} {'gain %':>6s} {'untuned us':>11s}", file=out)
    for r in sorted(rows, key=lambda r: -(r["share_pct"] or 0)):
        print(f"{r['name'][:34]:34s} {r['weight']:3.0f} {r['trials']:6d} {_f(r['best_us']):>10s} "
              f"{_f(r['final_us']):>9s} {_f(r['share_pct']):>7s} {_f(r['best_trial'], 0):>9s} "
              f"{_f(r['best_trial_overall'], 0):>6s} {r['trend'] + ('*' if r['exhausted'] else ''):>14s} "
              f"{_f(r['last_quarter_gain_pct']):>6s} {_f(r['untuned_us']):>11s}", file=out)
    total = sum(r["estimate_us"] or 0 for r in rows)
    falling = [r for r in rows if r["trend"] == FALLING]
    missing = sum(1 for r in rows if r["estimate_us"] is None)
    print(f"estimate {total / 1e3:,.3f} ms{f' (partial: {missing} task(s) without a valid record)' if missing else ''}"
          f" over {sum(r['trials'] for r in rows)} trials; still falling: "
          f"{len(falling)} task(s), {sum(r['share_pct'] or 0 for r in falling):.1f} % of the estimate"
          f"{'; * search space exhausted' if any(r['exhausted'] for r in rows) else ''}", file=out)


# --------------------------------------------------------------------------- profile
def kernel_tasks(mod, target, tasks: Sequence[Any]) -> dict[str, int]:
    """Name of each fused function of the prepared module -> the index of its task (by structure: the
    module a task is extracted from holds the function as ``main``)."""
    import tvm
    import tvm_ffi
    from tvm import tirx

    from tuning.engine.compile.pipeline import make_target, prepare_for_tuning

    hashes = {int(tvm_ffi.structural_hash(t.mod)): i for i, t in enumerate(tasks)}
    out = {}
    for gv, func in prepare_for_tuning(mod, make_target(target)).functions_items():
        if isinstance(func, tirx.PrimFunc):
            task = hashes.get(int(tvm_ffi.structural_hash(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}))))
            if task is not None:
                out[gv.name_hint] = task
    return out


def task_of(symbol: str, kernels: dict[str, int]) -> int | None:
    if symbol in kernels:
        return kernels[symbol]
    if symbol.endswith(PREPACKED):
        return kernels.get(symbol[: -len(PREPACKED)])
    return None


def profile_executable(executable, inputs, target, *, threads: int | None = None, repeat: int = 10,
                       standalone: bool = True, time_compiled: bool = True) -> dict:
    """Every VM call of one inference, timed: ``calls`` symbol -> {count, in_model_us (per inference, median
    over ``repeat`` instrumented runs after one warm-up), standalone_us (per call, kernels only, timed warm
    as TVM's default evaluator times a candidate), standalone_cold_us (the same, timed as the cold
    evaluator, the product's on CPUs, does: the cache flushed before each of ten single calls)},
    ``profiled_us`` (the instrumented inference, median), ``compiled_us`` (uninstrumented, median of
    ``repeat``; None without ``time_compiled``). A call's window also holds the VM handing the call's
    arguments to the instrument's second callback: 0.3-1 us a call (``vm.builtin.null_value``, which does
    nothing, reads 0.45 us), so builtin rows are upper bounds (resnet18: ~200 calls, ~0.15 ms); the rest
    of the callbacks lands in the instrumented VM row."""
    import tvm
    from tvm import relax

    from tuning.engine.compile.pipeline import run_and_time, set_runtime_threads, target_device_type
    from tuning.engine.measuring.timer import COLD_CPU_EVALUATOR, CPU_CACHE_FLUSH, EvaluatorConfig

    compiled_s = None
    if time_compiled:  # as the bench times the model
        _, compiled_s = run_and_time(executable, inputs, target, number=1, repeat=repeat, threads=threads,
                                     min_repeat_ms=50)
    else:
        set_runtime_threads(threads)
    device_type = target_device_type(target)
    dev = tvm.runtime.device(device_type, 0)
    sync = dev.sync if device_type != "cpu" else (lambda: None)  # a GPU kernel returns before it ran
    rt = executable.jit()
    vm = relax.VirtualMachine(rt, dev)
    args = [tvm.runtime.tensor(a, device=dev) for a in (inputs.values() if isinstance(inputs, dict) else inputs)]
    runs: list[dict[str, list[float]]] = []
    captured: dict[str, tuple] = {}
    started = [0]

    def instrument(func, symbol, before, ret, *call_args):
        if before:
            if not symbol.startswith("vm.builtin."):
                captured[symbol] = call_args
            sync()
            started[0] = time.perf_counter_ns()
            return 0
        sync()
        runs[-1].setdefault(symbol, []).append((time.perf_counter_ns() - started[0]) / 1e3)
        return 0

    vm.set_instrument(instrument)
    walls = []
    for _ in range(repeat + 1):  # the first run warms caches and the allocator's pools
        runs.append({})
        t0 = time.perf_counter_ns()
        vm["main"](*args)
        sync()
        walls.append((time.perf_counter_ns() - t0) / 1e3)
    runs, walls = runs[1:], walls[1:]
    calls = {}
    for symbol in runs[0]:  # medians: on a shared host one preempted call would move a mean
        calls[symbol] = {
            "count": len(runs[0][symbol]),
            "in_model_us": statistics.median(sum(r.get(symbol, [])) for r in runs),
            "standalone_us": None,
            "standalone_cold_us": None,
        }
    if standalone:
        warm = EvaluatorConfig()  # TVM MetaSchedule's own defaults
        libs = [rt, *rt.imports]  # the kernels live in the executable's imported library
        for symbol, call_args in captured.items():
            lib = next((m for m in libs if m.implements_function(symbol)), None)
            if lib is None:
                continue
            try:  # warm, as TVM's default evaluator times a candidate; median of three samples
                timer = lib.time_evaluator(symbol, dev, number=warm.number, repeat=3, min_repeat_ms=warm.min_repeat_ms)
                calls[symbol]["standalone_us"] = statistics.median(timer(*call_args).results) * 1e6
                if device_type == "cpu":  # as the cold evaluator times one
                    timer = lib.time_evaluator(symbol, dev, number=COLD_CPU_EVALUATOR.number,
                                               repeat=COLD_CPU_EVALUATOR.repeat,
                                               min_repeat_ms=COLD_CPU_EVALUATOR.min_repeat_ms,
                                               f_preproc=CPU_CACHE_FLUSH)
                    calls[symbol]["standalone_cold_us"] = statistics.median(timer(*call_args).results) * 1e6
            except Exception:  # noqa: BLE001 - a kernel that cannot be timed alone keeps its in-model time
                pass
    return {"calls": calls, "profiled_us": statistics.median(walls),
            "compiled_us": compiled_s * 1e6 if compiled_s is not None else None, "repeat": repeat}


def untuned_per_call(profile: dict, kernels: dict[str, int]) -> dict[int, float]:
    """Task index -> per-call in-model latency (us) of its kernels in an untuned build's profile."""
    total: dict[int, list[float]] = {}
    for symbol, c in profile["calls"].items():
        task = task_of(symbol, kernels)
        if task is not None:
            t = total.setdefault(task, [0.0, 0.0])
            t[0] += c["in_model_us"]
            t[1] += c["count"]
    return {task: us / count for task, (us, count) in total.items() if count}


def tuning_regime(evaluator: dict | None, target: dict | str) -> str:
    """How the job's tuning timed its candidates: "cold" (caches flushed before each sample) or "warm";
    without the job's evaluator (a work directory no bench wrote), what the product chooses for the target's
    kind (cold on CPUs). :func:`load_job` gives older bench jobs their evaluator."""
    if evaluator is not None:
        return "cold" if evaluator.get("enable_cpu_cache_flush") else "warm"
    from tuning.engine.compile.target_schema import target_kind
    from tuning.engine.measuring.timer import choose_evaluator

    regime = choose_evaluator(target_kind(target)).regime
    return regime if regime == "cold" else "warm"


def time_breakdown(table: Sequence[dict], profile: dict, kernels: dict[str, int], *, regime: str = "cold") -> dict:
    """Where the compiled model's time goes, next to the estimate: one row per task (estimate, its kernels
    alone, its kernels in the model), then the calls no task accounts for and the VM's time between
    calls (the instrumented inference less every call: medians do not add up, so this row also takes
    their difference). The ``in_model_us`` of the rows adds up to ``profiled_us``; ``steps`` walks from the estimate
    to the compiled latency in parts that add up exactly, through the kernels timed alone as the tuning timed
    its candidates (``regime``, :func:`tuning_regime`): so "alone vs tuning records" is the search's own error
    and "in the model vs alone" what timing a kernel alone that way misses."""
    if regime not in ALONE_COLUMN:
        raise ValueError(f"regime must be 'warm' or 'cold', not {regime!r}")
    alone_key = ALONE_COLUMN[regime]
    by_task: dict[int, list[str]] = {}
    rest = []
    for symbol in profile["calls"]:
        task = task_of(symbol, kernels)
        (by_task.setdefault(task, []) if task is not None else rest).append(symbol)
    rows = []
    for r in sorted(table, key=lambda r: -(r["estimate_us"] or 0)):
        symbols = by_task.get(r["index"], [])
        calls = [profile["calls"][s] for s in symbols]
        alone = [c["standalone_us"] * c["count"] for c in calls if c["standalone_us"] is not None]
        cold = [c["standalone_cold_us"] * c["count"] for c in calls if c.get("standalone_cold_us") is not None]
        rows.append({
            "row": r["name"], "kind": "task" if symbols else "task, no kernel in the compiled model",
            "kernels": symbols, "calls": sum(c["count"] for c in calls), "weight": r["weight"],
            "estimate_us": r["estimate_us"],
            "standalone_us": sum(alone) if symbols and len(alone) == len(calls) else None,
            "standalone_cold_us": sum(cold) if symbols and len(cold) == len(calls) else None,
            "in_model_us": sum(c["in_model_us"] for c in calls),
        })
    for symbol in sorted(rest, key=lambda s: -profile["calls"][s]["in_model_us"]):
        c = profile["calls"][symbol]
        rows.append({"row": symbol, "kind": "VM builtin" if symbol.startswith("vm.") else "kernel, no task",
                     "kernels": [symbol], "calls": c["count"], "weight": None, "estimate_us": None,
                     "standalone_us": None, "in_model_us": c["in_model_us"]})
    called = sum(c["in_model_us"] for c in profile["calls"].values())
    # the instrumented inference less every call: the VM's dispatch and the instrument's Python callbacks
    rows.append({"row": VM_GAP, "kind": "VM", "kernels": [], "calls": None, "weight": None, "estimate_us": None,
                 "standalone_us": None, "in_model_us": profile["profiled_us"] - called})
    tasks = [x for x in rows if x["kind"] == "task"]
    estimate = sum(r["estimate_us"] or 0 for r in table)
    timed = [x for x in tasks if x.get(alone_key) is not None and x["estimate_us"] is not None]
    steps = {
        "estimate_us": estimate,
        "tasks_without_kernel_us": -sum(x["estimate_us"] or 0 for x in rows if x["kind"].startswith("task, no")),
        "kernels_untimed_alone_us": sum(x["in_model_us"] - (x["estimate_us"] or 0) for x in tasks if x not in timed),
        "alone_vs_tuning_us": sum(x[alone_key] - x["estimate_us"] for x in timed),
        "in_model_vs_alone_us": sum(x["in_model_us"] - x[alone_key] for x in timed),
        "calls_without_task_us": sum(x["in_model_us"] for x in rows if x["kind"] in ("VM builtin", "kernel, no task")),
        # the uninstrumented inference less every call timed: the VM's dispatch between calls (the
        # instrumented runs' VM row also holds the instrument's Python callbacks)
        "vm_rest_us": profile["compiled_us"] - called,
    }
    return {"rows": rows, "profiled_us": profile["profiled_us"], "compiled_us": profile["compiled_us"],
            "estimate_us": estimate, "steps": steps, "steps_regime": regime, "alone_regimes": alone_regimes(tasks)}


def alone_regimes(tasks: Sequence[dict]) -> dict | None:
    """Which way of timing a kernel alone predicts it inside the model (the evaluator rule,
    ``timer.choose_evaluator``): over the tasks whose kernels were timed both warm and cold, their
    in-model sum, each regime's sum, and each regime's median relative error per task. None where no
    task was timed cold (a GPU target)."""
    both = [x for x in tasks if x["standalone_us"] is not None and x.get("standalone_cold_us") is not None
            and x["in_model_us"] > 0]
    if not both:
        return None
    out: dict = {"tasks": len(both), "in_model_us": sum(x["in_model_us"] for x in both)}
    for regime, key in ALONE_COLUMN.items():
        out[f"{regime}_us"] = sum(x[key] for x in both)
        out[f"{regime}_median_error"] = statistics.median(abs(x[key] - x["in_model_us"]) / x["in_model_us"]
                                                          for x in both)
    return out


def print_breakdown(breakdown: dict, file=None) -> None:
    out = file or sys.stdout
    regime = breakdown.get("steps_regime", "warm")  # results written before the steps followed the tuning's
    alone_key = ALONE_COLUMN[regime]
    print(f"{'where the time goes':40s} {'kind':>9s} {'calls':>5s} {'estimate us':>11s} {'alone ' + regime:>10s} "
          f"{'in model us':>11s} {'model-est':>9s}", file=out)
    for x in breakdown["rows"]:
        gap = x["in_model_us"] - x["estimate_us"] if x["estimate_us"] is not None else None
        kind = {"task": "task", "task, no kernel in the compiled model": "no kernel",
                "VM builtin": "builtin", "kernel, no task": "no task", "VM": "VM"}[x["kind"]]
        print(f"{x['row'][:40]:40s} {kind:>9s} {_f(x['calls'], 0):>5s} {_f(x['estimate_us']):>11s} "
              f"{_f(x.get(alone_key)):>10s} {_f(x['in_model_us']):>11s} {_f(gap):>9s}", file=out)
    s = breakdown["steps"]
    gap = (breakdown["compiled_us"] - s["estimate_us"]) / breakdown["compiled_us"]
    print(f"estimate {s['estimate_us']:,.1f} us -> compiled {breakdown['compiled_us']:,.1f} us ({gap:+.1%} of it; "
          f"instrumented {breakdown['profiled_us']:,.1f} us):", file=out)
    for key, label in (("tasks_without_kernel_us", "tasks the compiled model runs no kernel of"),
                       ("alone_vs_tuning_us", f"tuned kernels timed alone ({regime}, as tuned) vs their records"),
                       ("in_model_vs_alone_us", f"the same kernels in the model vs alone ({regime})"),
                       ("kernels_untimed_alone_us", "kernels not timed alone, in the model vs estimate"),
                       ("calls_without_task_us", "calls no task accounts for (builtins, untuned kernels)"),
                       ("vm_rest_us", "the rest: compiled latency less every call timed (VM dispatch, less "
                                      "the instrument's share of the calls' windows)")):
        print(f"  {s[key]:+12,.1f} us  {label}", file=out)
    regimes = breakdown.get("alone_regimes")
    if regimes:
        inside = regimes["in_model_us"]
        print(f"the {regimes['tasks']} tasks' kernels: {inside:,.1f} us in the model; alone, timed warm "
              f"{regimes['warm_us']:,.1f} us ({regimes['warm_us'] / inside - 1:+.1%}, median task off by "
              f"{regimes['warm_median_error']:.1%}), timed cold {regimes['cold_us']:,.1f} us "
              f"({regimes['cold_us'] / inside - 1:+.1%}, {regimes['cold_median_error']:.1%})", file=out)


# --------------------------------------------------------------------------- the job
def write_job(work_dir: str, *, model: str, target: dict, passes: Sequence[str], threads: int | None = None,
              evaluator: dict | None = None) -> None:
    """What this tool needs to analyse a work directory later (bench/vs_onnxruntime.py writes it)."""
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    Path(work_dir, JOB_FILE).write_text(json.dumps({"model": model, "target": target, "passes": list(passes),
                                                    "threads": threads, "evaluator": evaluator}))


def load_job(work_dir: str, *, model: str | None = None, target: str | dict | None = None,
             passes: str | None = None) -> dict:
    """The job's model, target, passes and evaluator: the flags, else ``bench_job.json``, else the bench's row
    next to the work directory (its label starts with the model's name). A job file without an evaluator takes
    the row's; a row that saved none (``null`` or no key: rows written before the bench saved the product's
    choice) was tuned warm, with TVM's default evaluator."""
    job: dict = {}
    with_file = Path(work_dir, JOB_FILE)
    row = Path(str(Path(work_dir)) + ".json")
    saved = json.loads(row.read_text()) if row.exists() else None
    if with_file.exists():
        job = json.loads(with_file.read_text())
    elif saved is not None:
        job = {"model": Path(work_dir).name.split("__")[0], "target": saved.get("target"),
               "passes": saved.get("passes")}
    if job.get("evaluator") is None and saved is not None:
        from tuning.engine.measuring.timer import EvaluatorConfig

        job["evaluator"] = saved.get("evaluator") or EvaluatorConfig().to_dict()
    if model:
        job["model"] = model
    if target:
        job["target"] = json.loads(target) if isinstance(target, str) else target
    if passes is not None:
        job["passes"] = passes
    missing = [k for k in ("model", "target") if not job.get(k)]
    if missing:
        raise ValueError(f"no {' nor '.join(missing)} for {work_dir}: give --model/--target or write {JOB_FILE}")
    return job


def snapshot(work_dir: str, dest: str) -> str:
    """Copy the files the readers open (TVM's database, the stream journal, the final re-measure, the
    exhausted tasks) to ``dest``: opening a TVM database may create files, and the run may still be
    tuning there."""
    from tuning.engine import workdir as wd

    src, out = Path(work_dir), Path(dest)
    if not (src / wd.DB_RECORDS).exists() and not wd.has_journal(work_dir):
        raise FileNotFoundError(f"{work_dir} holds no TVM tuning database ({wd.DB_RECORDS}) nor stream journal")
    for rel in (wd.DB_WORKLOAD, wd.DB_RECORDS, wd.FINAL_ROWS, wd.EXHAUSTED_FILE, wd.STREAM_JOURNAL, wd.JOURNAL_SETTLED,
                f"{wd.FINAL_DIR}/{wd.DB_WORKLOAD}", f"{wd.FINAL_DIR}/{wd.DB_RECORDS}"):
        if (src / rel).exists():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, out / rel)
    return str(out)


def _model(name: str):
    if name.endswith(".onnx"):
        import onnx

        return onnx.load(name)
    from core.onnx_models.zoo import build_model

    return build_model(name)


def analyse_executables(work_dir: str, mod, target, inputs, *, tuned, untuned, threads: int | None = None,
                        repeat: int = 10, untuned_repeat: int = 2, evaluator: dict | None = None) -> dict:
    """The task table (with the untuned kernels' latencies) and where the tuned executable's time goes, for a
    job whose tuning database is in ``work_dir`` and whose Relax module ``mod`` was compiled to ``tuned`` and
    ``untuned`` (under the job's graph passes); ``evaluator``: how the job timed its candidates (None: the
    product's choice for the target), which the breakdown's steps walk through."""
    from tuning.engine.compile.pipeline import make_target
    from tuning.engine.compile.workloads import collect_tasks

    tasks = collect_tasks(mod, make_target(target))
    kernels = kernel_tasks(mod, target, tasks)
    untuned_profile = profile_executable(untuned, inputs, target, threads=threads, repeat=untuned_repeat,
                                         standalone=False, time_compiled=False)
    tuned_profile = profile_executable(tuned, inputs, target, threads=threads, repeat=repeat)
    table = task_table(work_dir, tasks, untuned_us=untuned_per_call(untuned_profile, kernels))
    return {"tasks": table,
            "profile": time_breakdown(table, tuned_profile, kernels, regime=tuning_regime(evaluator, target))}


def open_snapshot(work_dir: str, job: dict, dest: str) -> tuple:
    """(snapshot dir, ONNX model, Relax module, tasks, results committed from the journal) of a job, its
    records snapshotted to ``dest``; call under the job's graph passes (``use_passes``)."""
    from tuning.engine.compile.pipeline import make_target, onnx_to_relax
    from tuning.engine.compile.workloads import collect_tasks
    from tuning.engine.workdir import commit_streamed, journal_settled, open_json_db

    snap = snapshot(work_dir, dest)
    model = _model(job["model"])
    mod = onnx_to_relax(model)
    tasks = collect_tasks(mod, make_target(job["target"]))
    # what a killed or still-running job measured but TVM's joins had not committed, committed to the
    # copy as the engine's next call on the work dir would (not when the run settled its journal itself)
    committed = 0 if journal_settled(snap, 0) else commit_streamed(snap, open_json_db(snap), tasks,
                                                                    make_target(job["target"]))
    return snap, model, mod, tasks, committed


def analyse(work_dir: str, job: dict, *, profile: bool = False, repeat: int = 10) -> dict:
    """The task table of a job's work directory and, with ``profile``, where its compiled model's time goes
    (both builds compiled here, the tuned one from a snapshot of the records, as the bench compiles it)."""
    from tuning.engine.compile.passes import use_passes
    from tuning.engine.compile.pipeline import compile_model, random_inputs
    from tuning.engine.workdir import open_database

    target = job["target"]
    with tempfile.TemporaryDirectory(prefix="tuned_tasks_") as tmp, use_passes(job.get("passes")):
        snap, model, mod, tasks, committed = open_snapshot(work_dir, job, tmp)
        result: dict = {"work_dir": work_dir, "job": job, "journal_committed": committed}
        if not profile:
            result["tasks"] = task_table(snap, tasks)
            return result
        result.update(analyse_executables(
            snap, mod, target, random_inputs(model, seed=0),
            tuned=compile_model(mod, target, database=open_database(snap)), untuned=compile_model(mod, target),
            threads=job.get("threads") or target.get("num-cores"), repeat=repeat, evaluator=job.get("evaluator")))
        return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work_dir")
    ap.add_argument("--json", action="store_true", help="print the result as JSON instead of tables")
    ap.add_argument("--profile", action="store_true", help="compile the tuned and untuned model and profile them")
    ap.add_argument("--repeat", type=int, default=10, help="profiled inferences of the tuned model")
    ap.add_argument("--model", help="zoo model name or an .onnx file (default: from the work directory)")
    ap.add_argument("--target", help="target JSON (default: from the work directory)")
    ap.add_argument("--passes", help="graph passes, comma list or 'none' (default: from the work directory)")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be positive")
    try:
        job = load_job(args.work_dir, model=args.model, target=args.target, passes=args.passes)
    except (ValueError, OSError) as exc:
        ap.error(str(exc))
    threads = job.get("threads") or job["target"].get("num-cores")
    if threads:  # before TVM's thread pool starts: it can shrink later, not grow
        os.environ["TVM_NUM_THREADS"] = str(threads)
    import logging

    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    result = analyse(args.work_dir, job, profile=args.profile, repeat=args.repeat)
    from bench.common import machine_info

    result["machine"] = machine_info(threads=threads)  # where the profile was timed (results/INDEX.md reads it)
    if args.json:
        print(json.dumps(result, indent=1, default=str))
        return 0
    print(f"# {args.work_dir}: {job['model']}, passes {job.get('passes')}, target {json.dumps(job['target'])}")
    print_task_table(result["tasks"])
    if "profile" in result:
        print()
        print_breakdown(result["profile"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
