"""Small workloads for tests and benchmarks (Django-free, no files needed).

TVM is imported inside the builders that need it: a test that only wants an ONNX model does not
pay for importing TVM.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tuning.engine.compile.pipeline import make_target
from tuning.engine.compile.workloads import collect_tasks
from tuning.engine.events import ffi_to_py


def tiny_cnn_onnx(seed: int = 0, channels: int = 8, size: int = 16, classes: int = 10):
    """conv-relu-conv-relu-maxpool-flatten-gemm, 1x3xSxS float32 input.
    Five MetaSchedule tasks on llvm."""

    rng = np.random.default_rng(seed)
    c = channels
    w1 = (rng.standard_normal((c, 3, 3, 3)) * 0.2).astype(np.float32)
    b1 = (rng.standard_normal((c,)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((c, c, 3, 3)) * 0.2).astype(np.float32)
    b2 = (rng.standard_normal((c,)) * 0.1).astype(np.float32)
    half = size // 2
    wf = (rng.standard_normal((classes, c * half * half)) * 0.05).astype(np.float32)
    bf = (rng.standard_normal((classes,)) * 0.1).astype(np.float32)
    inits = [
        numpy_helper.from_array(w1, "w1"),
        numpy_helper.from_array(b1, "b1"),
        numpy_helper.from_array(w2, "w2"),
        numpy_helper.from_array(b2, "b2"),
        numpy_helper.from_array(wf, "wf"),
        numpy_helper.from_array(bf, "bf"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, classes])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def matmul_primfunc(n: int = 64, m: int | None = None, k: int | None = None, dtype: str = "float32"):
    """C = A @ B as a TIR PrimFunc (te.create_prim_func)."""
    from tvm import te

    m = m or n
    k = k or n
    a = te.placeholder((n, k), dtype=dtype, name="A")
    b = te.placeholder((k, m), dtype=dtype, name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((n, m), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return te.create_prim_func([a, b, c]).with_attr("global_symbol", "main")


def conv2d_primfunc(
    n: int = 1,
    ci: int = 64,
    h: int = 56,
    w: int = 56,
    co: int = 64,
    kh: int = 3,
    kw: int = 3,
    stride: int = 1,
    pad: int = 1,
    dtype: str = "float32",
):
    """NCHW 3x3 conv2d (ResNet-18 layer shape by default) via topi."""
    from tvm import te, topi

    data = te.placeholder((n, ci, h, w), dtype=dtype, name="data")
    kernel = te.placeholder((co, ci, kh, kw), dtype=dtype, name="kernel")
    out = topi.nn.conv2d_nchw(data, kernel, stride, pad, 1, out_dtype=dtype)
    return te.create_prim_func([data, kernel, out]).with_attr("global_symbol", "main")


def depthwise_conv2d_primfunc(
    n: int = 1,
    c: int = 128,
    h: int = 56,
    w: int = 56,
    k: int = 3,
    stride: int = 1,
    pad: int = 1,
    dtype: str = "float32",
):
    """NCHW depthwise 3x3 conv2d (MobileNet-like) via topi."""
    from tvm import te, topi

    data = te.placeholder((n, c, h, w), dtype=dtype, name="data")
    kernel = te.placeholder((c, 1, k, k), dtype=dtype, name="kernel")
    out = topi.nn.depthwise_conv2d_nchw(data, kernel, stride, pad, 1, out_dtype=dtype)
    return te.create_prim_func([data, kernel, out]).with_attr("global_symbol", "main")


UNROLL_STEPS = [0, 16, 64, 512]


def tuning_database(
    model,
    target,
    *,
    annotations=(("meta_schedule.parallel", 16),),
    on_loop=False,
    run_secs=(1e-3,),
    task_index: int = 0,
    n_records: int = 1,
) -> tuple[bytes, bytes]:
    """A TVM JSON database (workload file, record file) for one task of ``model``, made with TVM's
    own API: a trace that annotates the task's root block (or, ``on_loop``, its first loop) with
    ``annotations`` (key, value), e.g. ("pragma_import_llvm", "<IR>") for a hostile record."""
    from tvm.s_tir.schedule import Schedule

    tgt = make_target(target)
    mod = collect_tasks(model, tgt)[task_index].mod
    traces = []
    for n in range(n_records):
        sch = Schedule(mod)
        root = sch.get_sblock("root")
        where = sch.get_loops(sch.get_child_blocks(root)[0])[0] if on_loop else root
        for key, value in annotations:
            sch.annotate(where, key, value)
        # distinct candidates, unrolled the way MetaSchedule's rule writes it (its mutator reads the sample)
        step = sch.sample_categorical(
            UNROLL_STEPS, [1 / len(UNROLL_STEPS)] * len(UNROLL_STEPS), decision=n % len(UNROLL_STEPS)
        )
        sch.annotate(root, "meta_schedule.unroll_explicit", step)
        traces.append(sch.trace)
    return _database_bytes(mod, tgt, traces, run_secs)


def loop_kind_database(model, target, kind: str, *, task_index: int = 0) -> tuple[bytes, bytes]:
    """A TVM JSON database whose one trace applies MetaSchedule's own ``Unroll`` (``kind="unroll"``: every
    loop of the task's first block, so its body is copied once per iteration) or ``Vectorize``
    (``kind="vectorize"``: that block's spatial loops fused into one vector) instructions to the whole
    of one task: what a hostile record uses to make a candidate build for minutes."""
    from tvm.s_tir.schedule import Schedule

    tgt = make_target(target)
    mod = collect_tasks(model, tgt)[task_index].mod
    sch = Schedule(mod)
    block = sch.get_child_blocks(sch.get_sblock("root"))[0]
    loops = sch.get_loops(block)
    if kind == "unroll":
        for loop in loops:
            sch.unroll(loop)
    elif kind == "vectorize":
        sch.vectorize(sch.fuse(*loops))
    else:
        raise ValueError(f"unknown loop kind {kind!r}")
    return _database_bytes(mod, tgt, [sch.trace], (1e-3,))


def design_space_database(
    model, target, *, task_index: int = 0, n_records: int = 1, run_secs=(1e-3,)
) -> tuple[bytes, bytes]:
    """A TVM JSON database of what a tuning run really writes: MetaSchedule's own design-space traces
    of one task (tiles, compute locations and unroll steps sampled by its rules), at most ``n_records``."""
    from tvm.s_tir import meta_schedule as ms

    tgt = make_target(target)
    mod = collect_tasks(model, tgt)[task_index].mod
    ctx = ms.TuneContext(mod=mod, target=tgt, space_generator="post-order-apply", num_threads=1)
    spaces = ctx.space_generator.generate_design_space(mod)
    return _database_bytes(mod, tgt, [sch.trace for sch in spaces[:n_records]], run_secs)


def _database_bytes(mod, tgt, traces, run_secs) -> tuple[bytes, bytes]:
    """The workload file and record file of a TVM JSON database holding ``traces`` of one task."""
    from tvm.s_tir import meta_schedule as ms

    lines = [
        json.dumps(
            [
                0,
                ffi_to_py(
                    ms.database.TuningRecord(
                        trace,
                        ms.database.Workload(mod),
                        list(run_secs),
                        tgt,
                        ms.arg_info.ArgInfo.from_prim_func(mod["main"]),
                    ).as_json()
                ),
            ]
        )
        for trace in traces
    ]
    workload = json.dumps(ffi_to_py(ms.database.Workload(mod).as_json()))
    return (workload + "\n").encode(), ("\n".join(lines) + "\n").encode()


def database_trace_lines(work_dir) -> list[tuple[int, str]]:
    """(workload index, trace as sorted JSON) of every record line of a run's TVM database file, in file
    order: what a test compares to find duplicates or lost records."""
    from pathlib import Path

    from tuning.engine.workdir import DB_RECORDS

    lines = [json.loads(x) for x in (Path(work_dir) / DB_RECORDS).read_text().splitlines() if x.strip()]
    return [(w, json.dumps(rec[0], sort_keys=True)) for w, rec in lines]
