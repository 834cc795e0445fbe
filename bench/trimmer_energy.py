#!/usr/bin/env python
"""Tuning energy with and without Trimmer, same workloads and budget.

For each workload, both sides run interleaved in one benchmark run, each
tuning job in a fresh interpreter, with the same engine, search, seed,
evaluator, thread count and trial budget:

  untrimmed  ``run_tuning(mode="doppler")``: persistent builder, pooled
             asynchronous runner, DOPpler's DOP control and final serial
             re-measure; the whole budget is measured.
  trimmed    the same plus Trimmer with the platform's default options
             (``TrimmerConfig()``): per-task plateau pre-emption (2 rounds
             without a 1 % gain, never before half of an equal split of the
             budget; parked tasks resumable), budget re-allocation by share of
             end-to-end latency, whole-model stop (windows of 2 rounds, 3 misses
             of 0.5 %), candidate filter (4x oversampling; the search's own
             batch, minus what an independent ridge predictor trained on the
             run's own measurements says is worse than the task's best).

Two budgets per workload (small and full), each side against the untrimmed run
of the same budget: at a small budget Trimmer must not cost latency.

Filter audit: the trimmed runs keep a sample of the candidates the search
would have measured and the filter vetoed (``TrimmerConfig.audit_sample``); the
bench builds each of them and the task's best record, times both the same way
in the same process, and counts how many vetoed candidates would have lost
(slower than the task's best). Only the bench measures them.

Energy: the best meter this host has (``tuning.engine.energy.available_meters``,
as the platform uses): RAPL package energy where ``/sys/class/powercap`` is
readable, else ``modeled`` = CPU-seconds of the tuning process and all its
workers (builders, measuring pool) x watts per core (``--watts-per-core``,
the platform's ENERGY_CPU_WATTS_PER_CORE default, 10 W). Read from just before
``run_tuning`` to just after it, sampled every 0.25 s so reaped workers are
not lost. A modeled ratio does not depend on the wattage; it is a CPU-time
ratio. Measured candidates = records the run measured. Wall = run_tuning's
wall time (other processes on the host inflate it; energy as CPU time is
steadier).

Final latency: both tuned models of a workload are compiled with their
databases in ONE fresh process and timed end to end alternately
(number=3, repeat=5, min_repeat_ms=100; median of the alternating rounds).

Ablation (full run, or ``--ablation`` with ``--quick``) on the first workload:
Trimmer's mechanisms switched on in turn - the share-of-latency task
allocation alone (Trimmer replaces TVM's gradient scheduler), + the candidate
filter, pre-emption + model stop without the filter, all (= trimmed).

Budgets (trials; 16 per round): --quick full = small_cnn 256, resnet_block
128, small = half of that, one repeat, population 128 / 2 genetic iterations
(a smoke test: at these budgets the untrimmed run has barely plateaued);
full: 640 / 480 and small = 40 % of that, three repeats (medians), TVM's search
defaults (512 / 4).
Trimmer can only save what the untrimmed run spends after its plateau, so
the saving grows with the budget (``--trials-scale``); the per-run curves of
the end-to-end estimate are in the JSON (``runs[*].curve``).

    .venv/bin/python bench/trimmer_energy.py [--quick] [--json bench/results/trimmer_energy.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import fmt_s, geomean, machine_info, run_child, tuning_config, write_result  # noqa: E402

SCRIPT = str(Path(__file__).resolve())

WORKLOADS = {
    "small_cnn": "zoo small_cnn (Conv-ReLU-Conv-ReLU-MaxPool-Gemm, 3x32x32) through Relax: 5 tasks",
    "resnet_block": "ResNet basic block subgraph: 2 x (3x3 conv 64->64 on 28x28) + ReLU + residual Add: 2 tasks",
}

AUDIT_SAMPLE = 12  # vetoed candidates kept per trimmed run for the bench to measure
SIDES = {
    "untrimmed": None,
    "trimmed": {"audit_sample": AUDIT_SAMPLE},  # TrimmerConfig() defaults, as the platform's form
}
BUDGETS = {"small": {"quick": 0.5, "full": 0.4}, "full": {"quick": 1.0, "full": 1.0}}

# Trimmer's mechanisms in turn. With Trimmer on, the task scheduler always gives the next round by
# share of end-to-end latency (not TVM's gradient), so that is the first row.
NEVER = {"plateau_rounds": 100000, "model_patience": 100000}
ABLATION = {
    "share allocation only": {"filter_enabled": False, **NEVER},
    "+ candidate filter": dict(NEVER),
    "pre-emption + stop, no filter": {"filter_enabled": False},
    "all (trimmed)": {},
}


# --------------------------------------------------------------------------- workloads
def resnet_block_onnx(channels: int = 64, size: int = 28, seed: int = 0):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    c = channels
    inits = [
        numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) * 0.05).astype(np.float32), "w1"),
        numpy_helper.from_array((rng.standard_normal((c,)) * 0.1).astype(np.float32), "b1"),
        numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) * 0.05).astype(np.float32), "w2"),
        numpy_helper.from_array((rng.standard_normal((c,)) * 0.1).astype(np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "x"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "resnet_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, size, size])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def make_workload(name: str):
    if name == "small_cnn":
        from core.onnx_models.zoo import build_model

        return build_model("small_cnn")
    if name == "resnet_block":
        return resnet_block_onnx()
    if name == "tiny_cnn":
        from tuning.engine.testing import tiny_cnn_onnx

        return tiny_cnn_onnx()
    raise KeyError(name)


# --------------------------------------------------------------------------- child jobs
class _Sampler:
    """Reads a meter every ``every`` s in the background (ModeledMeter keeps the maximum)."""

    def __init__(self, meter, every: float = 0.25) -> None:
        self.meter, self.every = meter, every
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.wait(self.every):
            try:
                self.meter.read()
            except Exception:  # noqa: BLE001
                pass

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=5)
        return False


class _CurveSink:
    """Records the end-to-end estimate (sum of weight x best) after every measured batch."""

    def __init__(self) -> None:
        self.weights: dict[int, float] = {}
        self.best: dict[int, float] = {}
        self.n = 0
        self.curve: list[tuple[int, float | None]] = []
        self.lock = threading.Lock()  # measurements arrive from the engine's progress thread too

    def on_tasks(self, tasks):
        self.weights = {t.index: float(t.weight) for t in tasks}

    def on_measurements(self, records):
        with self.lock:
            self._add(records)

    def _add(self, records):
        for r in records:
            self.n += 1
            lat = r.latency_s
            if lat is not None and lat < self.best.get(r.task_index, float("inf")):
                self.best[r.task_index] = lat
        est = (sum(w * self.best[i] for i, w in self.weights.items())
               if self.weights and all(i in self.best for i in self.weights) else None)
        self.curve.append((self.n, est))

    def on_round(self, info):
        pass

    def control(self):
        return None


def _job_tune(spec: dict) -> dict:
    from tuning.engine.energy import available_meters
    from tuning.engine.session import run_tuning

    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    wl = make_workload(spec["workload"])
    cfg = tuning_config(spec, trimmer=spec.get("trimmer"))
    meter = available_meters(cpu_watts_per_core=spec["watts_per_core"], gpu_board_watts=0.0)
    j0 = meter.read().joules
    t0 = time.perf_counter()
    sink = _CurveSink()
    with _Sampler(meter):
        s = run_tuning(wl, cfg, sink)
    wall = time.perf_counter() - t0
    energy = meter.read().joules - j0
    audit = _audit_vetoed(wl, spec, s) if (s.trimmer or {}).get("audit") else None
    return {
        "audit": audit,
        "wall_s": wall,
        "energy_j": energy,
        "energy_source": meter.source,
        "status": s.status,
        "n_measured": s.n_measurements + s.n_duplicates,
        "n_records": s.n_total_records,
        "estimated_latency_s": s.best_latency_s,
        "stop_reason": s.stop_reason,
        "trimmer": s.trimmer,
        "final_dop": s.final_dop,
        "phase_secs": s.phase_secs,
        "tasks": [{"name": t.name, "records": t.n_records, "best_s": t.best_latency_s} for t in s.tasks],
        "curve": sink.curve,  # (records measured so far, end-to-end estimate) after every batch
    }


def _time_schedule(mod, target, dev, trace_text: str | None = None) -> float | None:
    """Build a task (after replaying a candidate's trace) and time it with the tuning's timer."""
    import numpy as np
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.schedule import Schedule, Trace

    sch = Schedule(mod)
    if trace_text is not None:
        Trace.apply_json_to_schedule(json.loads(trace_text), sch)
    from tuning.engine.measuring.timer import EvaluatorConfig, time_module

    rt_mod = tvm.compile(sch.mod, target=target).mod
    args = [tvm.runtime.tensor(np.random.default_rng(0).standard_normal([int(x) for x in a.shape])
                               .astype(a.dtype), dev) for a in ms.arg_info.ArgInfo.from_prim_func(sch.mod["main"])]
    # the tuning's own timer and evaluator (EvaluatorConfig() defaults, as tuning_config sets)
    return float(statistics.median(time_module(rt_mod, dev, args, EvaluatorConfig())))


def _audit_vetoed(wl, spec: dict, summary) -> dict:
    """Time each vetoed candidate of the sample and its task's best record, the same way, here."""
    from tuning.engine.workdir import open_json_db, record_latency, records_by_task
    from tuning.engine.events import trace_json
    from tuning.engine.compile.pipeline import make_target
    from tuning.engine.compile.workloads import collect_tasks

    import tvm

    target = make_target(spec["target"])
    dev = tvm.cpu(0)
    tasks = collect_tasks(wl, target)
    by_task = records_by_task(open_json_db(spec["work_dir"]), tasks)
    best_s: dict[int, float | None] = {}
    items = []
    for item in summary.trimmer["audit"]:
        i = int(item["task"])
        try:
            if i not in best_s:
                recs = [r for r in by_task[i] if record_latency(r) is not None]
                top = min(recs, key=record_latency) if recs else None
                best_s[i] = _time_schedule(tasks[i].mod, target, dev, trace_json(top.trace)) if top else None
            lat = _time_schedule(tasks[i].mod, target, dev, item["trace"])
        except Exception as exc:  # noqa: BLE001 - a candidate that does not build is reported, not fatal
            items.append({"task": i, "error": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        items.append({"task": i, "latency_s": lat, "task_best_s": best_s[i], "predicted_s": item.get("predicted_s"),
                      "worse_than_best": bool(best_s[i] is not None and lat > best_s[i])})
    timed = [x for x in items if "latency_s" in x and x["task_best_s"] is not None]
    return {"sampled": len(items), "timed": len(timed), "worse_than_best": sum(x["worse_than_best"] for x in timed),
            "items": items}


def _job_remeasure(spec: dict) -> dict:
    """Compile every (workload, side) with its database and time them alternately in this process."""
    import numpy as np

    from tuning.engine.compile.pipeline import compile_model, make_target, random_inputs, run_and_time
    from tuning.engine.workdir import open_database

    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    target = make_target(spec["target"])
    rounds = int(spec.get("rounds", 5))
    out = {}
    for wname, sides in spec["items"].items():
        wl = make_workload(wname)
        inputs = random_inputs(wl)
        exes = {side: compile_model(wl, target, database=open_database(wd)) for side, wd in sides.items()}
        samples: dict[str, list[float]] = {s: [] for s in exes}
        outputs = {}
        for r in range(rounds):
            order = list(exes) if r % 2 == 0 else list(reversed(list(exes)))
            for side in order:
                outs, med = run_and_time(exes[side], inputs, target, number=3, repeat=5, min_repeat_ms=100,
                                         threads=spec["threads"])
                outputs[side] = outs
                samples[side].append(med)
        res = {side: statistics.median(v) for side, v in samples.items()}
        res["samples"] = samples
        vals = list(outputs.values())
        if len(vals) >= 2:
            res["max_abs_diff"] = float(max(float(np.max(np.abs(a - b))) for a, b in zip(vals[0], vals[1])))
        out[wname] = res
    return out


def reaudit(root: str, json_out: str | None) -> int:
    """Audit again the trimmed runs kept under ``root`` (``--keep``): the vetoed sample of each child's
    JSON is timed against its task's best record, as the tuning job does after its run."""
    from types import SimpleNamespace

    from tuning.engine.compile.pipeline import make_target  # noqa: F401 - TVM up before the jobs

    out = {}
    for path in sorted(Path(root).glob("*__trimmed__*.json")):
        res = json.loads(path.read_text())
        spec = {"target": res.get("target") or {"kind": "llvm", "num-cores": len(os.sched_getaffinity(0))},
                "work_dir": str(path.with_suffix(""))}
        wl = make_workload(path.name.split("__")[0])
        audit = _audit_vetoed(wl, spec, SimpleNamespace(trimmer=res["trimmer"]))
        out[path.stem] = audit
        print(f"{path.stem}: {audit['worse_than_best']} of {audit['timed']} vetoed candidates timed were slower "
              f"than the task's best ({audit['sampled']} sampled, {res['trimmer'].get('vetoed')} vetoed)")
    if json_out:
        Path(json_out).write_text(json.dumps(out, indent=1, default=str))
    return 0


def child_main(spec: dict) -> None:
    os.environ["TVM_NUM_THREADS"] = str(spec["threads"])
    logging.basicConfig(level=logging.WARNING)
    res = _job_tune(spec) if spec["kind"] == "tune" else _job_remeasure(spec)
    Path(spec["out"]).write_text(json.dumps(res, indent=1, default=str))


# --------------------------------------------------------------------------- driver
def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="smaller budgets, one repeat, no ablation")
    ap.add_argument("--workloads", default=None, help=f"comma list (default: {','.join(WORKLOADS)})")
    ap.add_argument("--budgets", default=None, help=f"comma list of budgets to run (default: {','.join(BUDGETS)})")
    ap.add_argument("--repeats", type=int, default=None, help="tuning jobs per side and workload (quick 1, full 3)")
    ap.add_argument("--threads", type=int, default=None, help="measurement/deployment threads (default: all cores)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--population", type=int, default=None, help="evolutionary population (quick 128, full TVM's 512)")
    ap.add_argument("--genetic-iters", type=int, default=None, help="genetic iterations (quick 2, full TVM's 4)")
    ap.add_argument("--trials-scale", type=float, default=1.0, help="multiply every workload's trial budget")
    ap.add_argument("--per-round", type=int, default=None, help="trials per round (default 16)")
    ap.add_argument("--ablation", action="store_true", help="run the ablation also with --quick")
    ap.add_argument("--no-ablation", action="store_true")
    ap.add_argument("--ablation-configs", default=None,
                    help=f"ablation rows to run (default all: {'; '.join(k for k in ABLATION if k != 'all (trimmed)')})")
    ap.add_argument("--watts-per-core", type=float, default=10.0, help="modeled energy only (default 10 W)")
    ap.add_argument("--json", default=None, help="write the result JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the work directories")
    ap.add_argument("--reaudit", default=None, help="time the vetoed samples of the trimmed runs kept in this "
                    "directory (from --keep) again, and exit")
    return ap.parse_args(argv)


def _med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def _ratio(a, b):
    return (a / b) if a and b else None


def _summarize_row(r: dict, remeasured: dict) -> None:
    """Medians per side, trimmed / untrimmed ratios, measured vs estimated savings, the filter audit."""
    fields = ("energy_j", "wall_s", "n_measured", "final_latency_s")
    for side, lst in r["runs"].items():
        for i, res in enumerate(lst):
            res["final_latency_s"] = remeasured.get(f"{r['key']}/{side}#{i}")
    u, t = r["runs"]["untrimmed"], r["runs"]["trimmed"]
    r["untrimmed"] = {k: _med([x[k] for x in u]) for k in fields}
    r["trimmed"] = {k: _med([x[k] for x in t]) for k in fields}
    for key, field in (("energy_ratio", "energy_j"), ("wall_ratio", "wall_s"), ("measured_ratio", "n_measured"),
                       ("latency_ratio", "final_latency_s")):
        r[key] = _ratio(r["trimmed"][field], r["untrimmed"][field])
    tr = [x.get("trimmer") or {} for x in t]
    r["preempted"] = [len(x.get("preempted_tasks") or {}) for x in tr]
    r["resumed"] = [len(x.get("resumptions") or []) for x in tr]
    r["stop_reasons"] = [x.get("stop_reason") for x in t]
    # savings: measured against this budget's untrimmed run, and what the run itself estimated
    ue, te = r["untrimmed"]["energy_j"], r["trimmed"]["energy_j"]
    r["energy_saved_measured_j"] = (ue - te) if ue is not None and te is not None else None
    est = []
    for x, tt in zip(t, tr):
        n = x["n_measured"] or 0
        est.append(tt.get("trials_saved", 0) * x["energy_j"] / n if n else None)
    r["energy_saved_estimated_j"] = _med(est)
    audits = [x.get("audit") or {} for x in t]
    r["filter"] = {"generated": _med([x.get("generated") for x in tr]), "filtered": _med([x.get("filtered") for x in tr]),
                   "vetoed": _med([x.get("vetoed") for x in tr]), "measured": _med([x.get("measured") for x in tr]),
                   "audit_timed": sum(a.get("timed", 0) for a in audits),
                   "audit_worse_than_best": sum(a.get("worse_than_best", 0) for a in audits)}


def _overall(rows: list[dict], budgets: list[str], sources: set, watts: float) -> dict:
    per = {}
    for b in budgets:
        rs = [r for r in rows if r["budget"] == b]
        per[b] = {"energy_ratio": geomean(r["energy_ratio"] for r in rs),
                  "latency_ratio": geomean(r["latency_ratio"] for r in rs),
                  "measured_ratio": geomean(r["measured_ratio"] for r in rs),
                  "wall_ratio": geomean(r["wall_ratio"] for r in rs),
                  "energy_saved_measured_j": sum(r["energy_saved_measured_j"] or 0 for r in rs),
                  "energy_saved_estimated_j": sum(r["energy_saved_estimated_j"] or 0 for r in rs)}
    main_b = "full" if "full" in per else budgets[-1]
    filt = [r["filter"] for r in rows]
    energy_source = "+".join(sorted(sources)) if sources else None
    overall = {
        **{k: per[main_b][k] for k in ("energy_ratio", "latency_ratio", "measured_ratio", "wall_ratio")},
        **{f"{k}_{b}": v for b, d in per.items() for k, v in d.items()},
        "filtered": sum(f["filtered"] or 0 for f in filt),
        "vetoed": sum(f["vetoed"] or 0 for f in filt),
        "audit_timed": sum(f["audit_timed"] for f in filt),
        "audit_worse_than_best": sum(f["audit_worse_than_best"] for f in filt),
        "energy_source": energy_source,
        "energy_note": (f"modeled: CPU-seconds of the tuning process tree x {watts:g} W per core (RAPL not "
                        "readable on this host); the ratio is a CPU-time ratio") if energy_source == "modeled" else
                       f"measured ({energy_source})",
        "goal": {"latency_ratio_max_each_budget": 1.03},
    }
    overall["audit_worse_share"] = (overall["audit_worse_than_best"] / overall["audit_timed"]
                                    if overall["audit_timed"] else None)
    lats = [per[b]["latency_ratio"] for b in budgets]
    overall["goal_met"] = bool(lats and all(x is not None and x <= 1.03 for x in lats))
    return overall


def _print_table(rows: list[dict], overall: dict, budgets: list[str]) -> None:
    print()
    print(f"{'workload':13s} {'budget':6s} {'trials':>6s} {'meas. U':>7s} {'meas. T':>7s} {'energy U J':>10s} "
          f"{'energy T J':>10s} {'energy x':>8s} {'lat U us':>9s} {'lat T us':>9s} {'lat x':>6s} "
          f"{'saved J meas/est':>17s}  pre-empted/resumed  stop")
    nan = float("nan")
    for r in rows:
        u, t = r["untrimmed"], r["trimmed"]
        print(f"{r['workload']:13s} {r['budget']:6s} {r['trials']:6d} {u['n_measured']:7.0f} {t['n_measured']:7.0f} "
              f"{u['energy_j']:10.1f} {t['energy_j']:10.1f} {(r['energy_ratio'] or nan):8.3f} "
              f"{fmt_s(u['final_latency_s'], 'us'):>9s} {fmt_s(t['final_latency_s'], 'us'):>9s} "
              f"{(r['latency_ratio'] or nan):6.3f} {(r['energy_saved_measured_j'] or 0):8.1f}/"
              f"{(r['energy_saved_estimated_j'] or 0):<8.1f}  {r['preempted']}/{r['resumed']}  "
              f"{'; '.join(str(x) for x in r['stop_reasons'])[:70]}")
    for b in budgets:
        print(f"overall {b:6s} (geomean) energy x {(overall.get(f'energy_ratio_{b}') or nan):.3f}   "
              f"final latency x {(overall.get(f'latency_ratio_{b}') or nan):.3f}   measured x "
              f"{(overall.get(f'measured_ratio_{b}') or nan):.3f}   wall x {(overall.get(f'wall_ratio_{b}') or nan):.3f}")
    for r in rows:
        f = r["filter"]
        print(f"  filter {r['workload']}/{r['budget']}: generated {f['generated']}, filtered {f['filtered']} (of which "
              f"vetoed from the search's own batch {f['vetoed']}), measured {f['measured']}; audit: "
              f"{f['audit_worse_than_best']} of {f['audit_timed']} vetoed candidates timed were slower than the "
              f"task's best")


def _run_ablation(args, names, spec) -> list[dict]:
    ablation = []
    name = names[0]
    wanted = [x.strip() for x in args.ablation_configs.split(";")] if args.ablation_configs else None
    for label, opts in ABLATION.items():
        if label == "all (trimmed)" or (wanted and label not in wanted):
            continue
        sp = spec(name, "full", "abl " + label, opts, 0)
        res = run_child(SCRIPT, sp, timeout=3600)
        res["work_dir"] = sp["work_dir"]
        ablation.append({"workload": name, "config": label, **res})
        print(f"  {name:13s} ablation {label:30s} wall {res['wall_s']:6.1f} s  energy {res['energy_j']:8.1f} J  "
              f"measured {res['n_measured']:4d}", flush=True)
    return ablation


def main(argv=None) -> int:
    args = _parse(argv)
    if args.job:
        child_main(json.loads(args.job))
        return 0
    if args.reaudit:
        return reaudit(args.reaudit, args.json)

    cores = len(os.sched_getaffinity(0))
    threads = args.threads or cores
    target = {"kind": "llvm", "num-cores": cores}
    names = args.workloads.split(",") if args.workloads else list(WORKLOADS)
    budgets = args.budgets.split(",") if args.budgets else list(BUDGETS)
    repeats = args.repeats or (1 if args.quick else 3)
    population = args.population or (128 if args.quick else None)
    genetic_iters = args.genetic_iters or (2 if args.quick else None)
    per_round = args.per_round or 16
    # Trimmer saves what a run spends after its plateau, so the budget decides the figure: the full
    # budget is one a user would choose to be sure (~128 trials per task for small_cnn, 240 for the
    # block); the small one is where early pre-emption used to cost latency
    base_trials = {"small_cnn": 256 if args.quick else 640, "resnet_block": 128 if args.quick else 480}
    do_ablation = (args.ablation or not args.quick) and not args.no_ablation
    root = Path(tempfile.mkdtemp(prefix="bench_trimmer_"))
    started = time.perf_counter()
    machine = machine_info(threads=threads, target=target)
    print(f"# trimmer_energy: {len(names)} workloads x budgets {budgets} x {repeats} repeat(s), threads={threads}, "
          f"cores={cores}, quick={args.quick}")
    print(f"# machine: {machine['cpu']}, load average at start {machine.get('loadavg')}")

    def trials_of(name: str, budget: str) -> int:
        scale = BUDGETS[budget]["quick" if args.quick else "full"] * args.trials_scale
        return max(per_round, int(round(base_trials.get(name, 160) * scale / per_round)) * per_round)

    def spec(name: str, budget: str, label: str, trimmer, rep: int) -> dict:
        tag = f"{name}__{budget}__{label}__{rep}"
        wd = root / tag.replace(" ", "_").replace("+", "p").replace("(", "").replace(")", "")
        return {"kind": "tune", "label": f"{name}/{budget}/{label}/{rep}", "workload": name, "target": target,
                "threads": threads, "trials": trials_of(name, budget), "per_round": per_round, "seed": args.seed,
                "population": population, "genetic_iters": genetic_iters, "trimmer": trimmer,
                "watts_per_core": args.watts_per_core, "work_dir": str(wd), "out": str(wd) + ".json"}

    rows = []
    step = 0
    for name in names:
        for budget in budgets:
            runs: dict[str, list[dict]] = {side: [] for side in SIDES}
            for rep in range(repeats):
                order = list(SIDES) if step % 2 == 0 else list(reversed(list(SIDES)))
                step += 1
                for side in order:
                    sp = spec(name, budget, side, SIDES[side], rep)
                    res = run_child(SCRIPT, sp, timeout=3600)
                    res["work_dir"] = sp["work_dir"]
                    runs[side].append(res)
                    print(f"  {name:13s} {budget:5s} {side:9s} #{rep}  wall {res['wall_s']:6.1f} s  energy "
                          f"{res['energy_j']:8.1f} J ({res['energy_source']})  measured {res['n_measured']:4d}  "
                          f"stop: {res.get('stop_reason') or '-'}", flush=True)
            rows.append({"workload": name, "budget": budget, "key": f"{name}/{budget}",
                         "description": WORKLOADS.get(name, name), "trials": trials_of(name, budget),
                         "trials_per_round": per_round, "runs": runs})

    ablation = _run_ablation(args, names, spec) if do_ablation and names else []

    # -- final latency: every tuned model of a workload re-measured in one process
    items: dict[str, dict[str, str]] = {}
    for r in rows:
        sides = items.setdefault(r["workload"], {})
        for side, lst in r["runs"].items():
            for i, res in enumerate(lst):
                sides[f"{r['key']}/{side}#{i}"] = res["work_dir"]
    for a in ablation:
        items[a["workload"]][f"abl:{a['config']}"] = a["work_dir"]
    rm = run_child(SCRIPT, {"kind": "remeasure", "label": "remeasure", "target": target, "threads": threads,
                            "items": items, "rounds": 5, "out": str(root / "remeasure.json")}, timeout=3600)
    flat = {k: v for m in rm.values() for k, v in m.items() if k not in ("samples", "max_abs_diff")}
    sources = {res["energy_source"] for r in rows for lst in r["runs"].values() for res in lst}
    for r in rows:
        _summarize_row(r, flat)
    for a in ablation:
        base = next(r for r in rows if r["workload"] == a["workload"] and r["budget"] == "full")
        a["final_latency_s"] = flat.get(f"abl:{a['config']}")
        a["energy_ratio"] = _ratio(a["energy_j"], base["untrimmed"]["energy_j"])
        a["measured_ratio"] = _ratio(a["n_measured"], base["untrimmed"]["n_measured"])
        a["latency_ratio"] = _ratio(a["final_latency_s"], base["untrimmed"]["final_latency_s"])
    overall = _overall(rows, budgets, sources, args.watts_per_core)
    machine["loadavg_end"] = list(os.getloadavg())
    result = {
        "benchmark": "trimmer_energy", "overall": overall, "workloads": rows, "ablation": ablation,
        "machine": machine,
        "settings": {
            "quick": args.quick, "threads": threads, "repeats": repeats, "trials_per_round": per_round,
            "budgets": {b: {n: trials_of(n, b) for n in names} for b in budgets}, "seed": args.seed,
            "search": {"population": population or 512, "genetic_iters": genetic_iters or 4},
            "evaluator_tuning": "EvaluatorConfig() defaults",
            "evaluator_final": {"number": 3, "repeat": 5, "min_repeat_ms": 100, "rounds": 5, "alternating": True},
            "trimmer": f"TrimmerConfig() defaults + audit_sample={AUDIT_SAMPLE}", "watts_per_core": args.watts_per_core,
        },
        "bench_wall_s": time.perf_counter() - started,
    }
    _print_table(rows, overall, budgets)
    if ablation:
        print("\nablation (first workload, full budget; ratios to untrimmed):")
        for a in ablation:
            print(f"  {a['workload']:13s} {a['config']:30s} energy x {(a['energy_ratio'] or float('nan')):.3f}  "
                  f"measured x {(a['measured_ratio'] or float('nan')):.3f}  latency x "
                  f"{(a['latency_ratio'] or float('nan')):.3f}")
    print(f"\ngoal final latency x <= 1.03 at every budget: {'MET' if overall['goal_met'] else 'NOT MET'}")
    print(f"energy: {overall['energy_note']}; 'saved meas' = untrimmed - trimmed energy of the same budget, "
          f"'est' = what the run itself estimates (trials it did not spend x its own J per trial)")
    print(f"threads={threads}; same search (population {population or 512}, genetic iters {genetic_iters or 4}), "
          f"seed {args.seed}, evaluator and budget on both sides; medians over {repeats} repeat(s); final latency = "
          f"median of 5 alternating rounds in one process; load average start {machine['loadavg']} end "
          f"{machine['loadavg_end']} (shared machine); bench {result['bench_wall_s']:.0f} s")
    write_result(result, json_path=args.json, work_root=root, keep=args.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
