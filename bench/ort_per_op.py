#!/usr/bin/env python
"""Layer by layer: onnxruntime's kernels next to the tuned TVM kernels that compute the same convolution or
matmul, both timed inside a model run, so a model's gap to onnxruntime has a place (issue 41: "where a model
cannot get there, the closing note says why"). The outside reference is onnxruntime's own kernels (MLAS on
CPUs), layer for layer.

    .venv/bin/python bench/ort_per_op.py RESULT.json [--model NAME] [--runs 20] [--json OUT]

``RESULT.json`` is a ``bench/vs_onnxruntime.py`` result whose job rows carry ``profile`` (each tuned task's
kernels timed inside the compiled model, ``bench/tuned_tasks.py``). For each such row this tool rebuilds the
row's tasks (its zoo model, graph passes and target: no tuning, no compile), runs the model in onnxruntime
with its profiler (CPU provider, the row's threads, ``--runs`` inferences after as many warm-ups; each node's
median), and matches each onnxruntime Conv / Gemm / MatMul node to the tasks that compute the same layer: a
buffer with the weight's dimensions and an output with the node's, in any order (layouts order them differently:
onnxruntime's OIHW weights and NCHW(c) outputs, the CPU pipeline's OHWI and NHWC). Its blocked layout pads
channels to its block (8 or 16: mobilenet_v2's 24 channels run as 32 on AVX-512): a convolution that matches no
task as it stands is matched with its channel counts read as padded (``true_channels``);
one that still matches nothing is counted in the unmatched rest.

Per distinct layer (weight, output): onnxruntime's nodes and us, TVM's tasks and us (per inference, every
call), TVM / onnxruntime; then per side what no layer accounts for (onnxruntime's reorders, pools, adds; TVM's
other tasks, builtins and the VM between calls). onnxruntime's times are taken when this tool runs, the tuned
model's when the bench ran: run it on the bench's host and session; the onnxruntime total printed next to the
row's ``ort`` latency says whether the host moved in between.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LAYER_OPS = ("Conv", "FusedConv", "Gemm", "MatMul", "FusedMatMul", "FusedGemm")
KERNEL_EVENT = "_kernel_time"


def _dims(shape: Iterable) -> tuple[int, ...]:
    """A shape's dimensions in ascending order: the same layer's weight or output whatever its layout."""
    return tuple(sorted(int(d) for d in shape))


def _shape(entry: dict | None) -> list[int] | None:
    """One ``input_type_shape`` / ``output_type_shape`` item of onnxruntime's profiler: {"float": [dims]}."""
    if not entry:
        return None
    (dims,) = entry.values()
    return [int(d) for d in dims]


def ort_node_times(events: Sequence[dict], warmup: int) -> list[dict]:
    """onnxruntime profiler events -> one row per node (in first-run order): op, weight and output shapes
    (a layer op's second input and first output), median time per inference in us over the runs after
    ``warmup``. Events are grouped by node name: onnxruntime names every node of its optimised graph apart
    (and the zoo's models name every node)."""
    nodes: dict[str, dict] = {}
    for e in events:
        name = e.get("name", "")
        if e.get("cat") != "Node" or not name.endswith(KERNEL_EVENT):
            continue
        node = nodes.setdefault(name[: -len(KERNEL_EVENT)], {"op": None, "weight": None, "output": None, "durs": []})
        args = e.get("args") or {}
        node["op"] = node["op"] or args.get("op_name")
        inputs, outputs = args.get("input_type_shape"), args.get("output_type_shape")
        if node["weight"] is None and inputs and len(inputs) > 1:
            node["weight"] = _shape(inputs[1])
        if node["output"] is None and outputs:
            node["output"] = _shape(outputs[0])
        node["durs"].append(float(e["dur"]))
    rows = []
    for name, node in nodes.items():
        durs = node["durs"][warmup:] or node["durs"]
        rows.append({"node": name, "op": node["op"], "weight": node["weight"], "output": node["output"],
                     "us": statistics.median(durs), "runs": len(durs)})
    return rows


def profile_ort(model, *, threads: int, runs: int) -> list[dict]:
    """Run ``model`` in onnxruntime (CPU provider, ``threads`` intra-op threads, the graph optimisations a
    user gets by default) ``runs`` times after as many warm-ups, its profiler on; :func:`ort_node_times`."""
    import onnxruntime as ort

    from tuning.engine.compile.pipeline import random_inputs

    with tempfile.TemporaryDirectory(prefix="ort_per_op_") as tmp:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(tmp, "ort")
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        feeds = random_inputs(model, seed=0)  # numpy arrays, one per graph input
        for _ in range(2 * runs):
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    return ort_node_times(events, warmup=runs)


BLOCKS = (8, 16)  # onnxruntime's NCHWc block sizes (AVX2, AVX-512)


def unpadded(weight: Sequence[int], output: Sequence[int]) -> list[tuple[tuple[int, int], tuple, tuple]]:
    """The layers an NCHWc convolution with these (possibly padded) shapes may compute: ((out channels, in
    channels per group), weight dims, output dims) for each pair of true channel counts one block size (a host
    runs one) would pad to the given ones, each count possibly unpadded, the given pair itself excluded."""
    if len(weight) != 4 or len(output) != 4:
        return []
    o_pad, i_pad, kh, kw = (int(d) for d in weight)
    n, _, h, w = (int(d) for d in output)

    def trues(padded: int, block: int) -> list[int]:
        return [c for c in range(max(1, padded - block + 1), padded + 1) if c == padded or -(-c // block) * block == padded]

    pairs = sorted({(o, i) for b in BLOCKS for o in trues(o_pad, b) for i in trues(i_pad, b)} - {(o_pad, i_pad)})
    return [((o, i), _dims((o, i, kh, kw)), _dims((n, o, h, w))) for o, i in pairs]


def task_shapes(tasks: Sequence) -> dict[str, tuple[list[tuple[int, ...]], tuple[int, ...]]]:
    """Task name -> (its inputs' dimensions, its output's: the PrimFunc's last buffer), each in ascending
    order (:func:`_dims`)."""
    out = {}
    for t in tasks:
        # TVM 0.27's PrimFunc params are buffer-typed vars (no buffer_map)
        shapes = [_dims(shape) for p in t.mod["main"].params if (shape := getattr(p.ty, "shape", None)) is not None]
        if shapes:
            out[t.name] = (shapes[:-1], shapes[-1])
    return out


def layer_table(ort_rows: Sequence[dict], shapes: dict[str, tuple[list[tuple[int, ...]], tuple[int, ...]]],
                in_model_us: dict[str, float]) -> dict:
    """Match onnxruntime's layer nodes to the tasks computing the same layer (a buffer with the weight's
    dimensions, an output with the node's; :func:`task_shapes`) and sum each side per layer. ``in_model_us``:
    task name -> its kernels' time per inference in the tuned model. Returns ``layers`` (one per matched layer,
    largest onnxruntime time first; ``true_channels`` where the node's channels were read as padded), ``rest``
    (each side's time no layer accounts for, the unmatched layer ops apart), ``tasks_not_profiled`` (matched
    tasks the profile has no row of: the tuned model was built under another pipeline) and the totals."""

    def computing(weight: tuple, output: tuple) -> list[str]:
        return sorted(name for name, (ins, out) in shapes.items() if out == output and weight in ins)

    layers: dict[tuple, dict] = {}
    unmatched_ort = 0.0
    for r in ort_rows:
        if r["op"] not in LAYER_OPS or not r["weight"] or not r["output"]:
            continue
        key, true_channels = (_dims(r["weight"]), _dims(r["output"])), None
        tasks = computing(*key)
        if not tasks and r["op"] in ("Conv", "FusedConv"):
            found = [(true, w, o) for true, w, o in unpadded(r["weight"], r["output"]) if computing(w, o)]
            if len(found) == 1:  # one reading of the padding fits a task: that layer (two: say nothing)
                true_channels, key = found[0][0], found[0][1:]
                tasks = computing(*key)
        if not tasks:
            unmatched_ort += r["us"]
            continue
        layer = layers.setdefault(key, {"op": r["op"], "weight": r["weight"], "output": r["output"], "ort_nodes": 0,
                                        "ort_us": 0.0, "tasks": tasks, "true_channels": true_channels})
        layer["ort_nodes"] += 1
        layer["ort_us"] += r["us"]
    claimed: set[str] = set()
    for key, layer in list(layers.items()):
        layer["tasks"] = [t for t in layer["tasks"] if t not in claimed]  # a task counts in one layer
        if not layer["tasks"]:  # every task it matched counts in another layer: its nodes stay unmatched
            unmatched_ort += layers.pop(key)["ort_us"]
            continue
        claimed.update(layer["tasks"])
        layer["tvm_us"] = sum(in_model_us.get(t, 0.0) for t in layer["tasks"])
        layer["tvm_vs_ort"] = layer["tvm_us"] / layer["ort_us"] if layer["ort_us"] > 0 else None
    ort_total = sum(r["us"] for r in ort_rows)
    tvm_total = sum(in_model_us.values())
    ort_layers = sum(x["ort_us"] for x in layers.values())
    tvm_layers = sum(x["tvm_us"] for x in layers.values())
    return {
        "layers": sorted(layers.values(), key=lambda x: -x["ort_us"]),
        "rest": {"ort_unmatched_layer_ops_us": unmatched_ort, "ort_other_us": ort_total - ort_layers - unmatched_ort,
                 "tvm_other_us": tvm_total - tvm_layers},
        "ort_total_us": ort_total, "tvm_total_us": tvm_total,
        "layers_ort_us": ort_layers, "layers_tvm_us": tvm_layers,
        "layers_tvm_vs_ort": tvm_layers / ort_layers if ort_layers > 0 else None,
        "tasks_not_profiled": sorted(t for t in claimed if t not in in_model_us),
    }


def in_model_by_task(profile: dict) -> dict[str, float]:
    """A bench row's profile -> task name -> its kernels' time per inference inside the tuned model, and every
    other row (builtins, kernels no task names, the VM between calls) under its own name."""
    return {x["row"]: float(x["in_model_us"]) for x in profile["rows"]}


def analyse_row(model_name: str, job: dict, *, runs: int) -> dict:
    """One bench row: its tasks rebuilt under its passes and target, onnxruntime profiled, the layers matched."""
    from core.onnx_models.zoo import build_model
    from tuning.engine.compile.passes import pipeline_key, use_passes
    from tuning.engine.compile.pipeline import make_target
    from tuning.engine.compile.workloads import collect_tasks

    model = build_model(model_name)
    with use_passes(job.get("passes")):
        tasks = collect_tasks(model, make_target(job["target"]))
        pipeline = pipeline_key()
    threads = int(job["target"].get("num-cores") or 1)
    table = layer_table(profile_ort(model, threads=threads, runs=runs), task_shapes(tasks),
                        in_model_by_task(job["profile"]))
    ort = job.get("ort") or {}
    return {"model": model_name, "row": job.get("row"), "threads": threads, "runs": runs,
            "bench_ort_ms": ort.get("latency_median_ms"), "bench_tuned_ms": job.get("tuned_ms"),
            "bench_pipeline_key": job.get("pipeline_key"), "pipeline_key": pipeline, **table}


def print_row(result: dict, file=None) -> None:
    out = file or sys.stdout
    print(f"# {result['model']} ({result['row']}): onnxruntime's nodes now {result['ort_total_us'] / 1e3:,.3f} ms "
          f"(the bench's onnxruntime {result['bench_ort_ms'] or 0:,.3f} ms); the tuned model instrumented "
          f"{result['tvm_total_us'] / 1e3:,.3f} ms (the bench's profile; compiled {result['bench_tuned_ms'] or 0:,.3f} ms)",
          file=out)
    if result.get("bench_pipeline_key") and result["bench_pipeline_key"] != result.get("pipeline_key"):
        print(f"! the tasks were rebuilt under pipeline {result['pipeline_key']}, the row was tuned under "
              f"{result['bench_pipeline_key']}: tasks may not match the profile's", file=out)
    if result.get("tasks_not_profiled"):
        print(f"! matched tasks without a profile row (counted 0 us): {', '.join(result['tasks_not_profiled'])}",
              file=out)
    print(f"{'layer (weight -> output)':44s} {'ORT nodes':>9s} {'ORT us':>9s} {'TVM us':>9s} {'TVM/ORT':>7s}  tasks",
          file=out)
    for x in result["layers"]:
        label = f"{x['op']} {'x'.join(map(str, x['weight']))} -> {'x'.join(map(str, x['output']))}"
        if x.get("true_channels"):
            label += f" (from {x['true_channels'][0]}x{x['true_channels'][1]})"
        ratio = f"{x['tvm_vs_ort']:.2f}" if x["tvm_vs_ort"] is not None else "-"
        print(f"{label[:44]:44s} {x['ort_nodes']:9d} {x['ort_us']:9,.1f} {x['tvm_us']:9,.1f} {ratio:>7s}  "
              f"{', '.join(x['tasks'])}", file=out)
    rest = result["rest"]
    ratio = result["layers_tvm_vs_ort"]
    print(f"{'all matched layers':44s} {'':9s} {result['layers_ort_us']:9,.1f} {result['layers_tvm_us']:9,.1f} "
          f"{(f'{ratio:.2f}' if ratio is not None else '-'):>7s}", file=out)
    print(f"rest: onnxruntime {rest['ort_other_us']:,.1f} us (reorders, pools, adds, ...) + "
          f"{rest['ort_unmatched_layer_ops_us']:,.1f} us of layer ops no task matched; "
          f"TVM {rest['tvm_other_us']:,.1f} us (other tasks, builtins, the VM between calls)", file=out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("result", help="a bench/vs_onnxruntime.py result JSON whose rows carry a profile")
    ap.add_argument("--model", help="only this model's rows")
    ap.add_argument("--runs", type=int, default=20, help="profiled onnxruntime inferences (after as many warm-ups)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be positive")
    try:
        data = json.loads(Path(args.result).read_text())
    except (OSError, ValueError) as exc:
        ap.error(f"cannot read {args.result}: {exc}")
    jobs = [(m["model"], job) for m in data.get("models") or [] for job in (m.get("jobs") or {}).values()
            if job.get("profile") and (args.model is None or m["model"] == args.model)]
    if not jobs:
        ap.error(f"{args.result} has no job row with a profile" + (f" for {args.model}" if args.model else ""))
    threads = max(int(job["target"].get("num-cores") or 1) for _, job in jobs)
    os.environ.setdefault("TVM_NUM_THREADS", str(threads))
    rows = []
    for model_name, job in jobs:
        rows.append(analyse_row(model_name, job, runs=args.runs))
        print_row(rows[-1])
        print()
    if args.json:
        from bench.common import machine_info, write_json

        write_json({"benchmark": "ort_per_op", "source": args.result, "rows": rows,
                    "machine": machine_info(threads=threads)}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
