"""ONNX -> Relax -> MetaSchedule tasks -> compiled executable (TVM 0.27).

Django-free. The pass list in :func:`prepare_for_tuning` is the one
``tvm.s_tir.meta_schedule.relax_integration.compile_relax`` runs before it
applies a tuning database (library dispatch, LegalizeOps,
AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR), preceded by the
inference graph optimizations of ``graph_passes`` (BatchNorm folding: the
selected passes, ``graph_passes.pipeline_key()`` names them) and the inference
decompositions of the ``static_shape_tuning`` pipeline. The same list
(:func:`_fuse_passes`) prepares the module for task extraction, for the tuned
compilation *and* for the untuned baseline, so the workload keys stored in the
tuning database always match the ones the compiler looks up.

TVM is imported inside the functions that use it: this module is imported by the
session, which web processes import for ``TuningConfig``, and importing TVM costs
seconds there.
"""

from __future__ import annotations

import logging
import os
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tuning.engine.compile import passes as graph_passes
from tuning.engine.workdir import open_database

logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)

__all__ = [
    "make_target",
    "target_device_type",
    "onnx_input_specs",
    "relax_input_specs",
    "onnx_to_relax",
    "prepare_for_tuning",
    "extract_tasks",
    "count_tuning_tasks",
    "task_summary",
    "compile_model",
    "run_and_time",
    "run_and_time_samples",
    "random_inputs",
]

_ONNX_DTYPES = {
    1: "float32",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    9: "bool",
    10: "float16",
    11: "float64",
    12: "uint32",
    13: "uint64",
    16: "bfloat16",
}


# --------------------------------------------------------------------------- targets
_CUDA_DEFAULTS = {
    "max_threads_per_block": 1024,
    "max_shared_memory_per_block": 49152,
    "thread_warp_size": 32,
    "registers_per_block": 65536,
}


def make_target(target: Any):
    """``tvm.target.Target`` from a dict (``{"kind": "llvm", "num-cores": 2}``),
    its JSON string, a bare kind name, or a Target. GPU targets get an LLVM host if none given.

    A dict or string is checked against the closed schema first (``targets.check_target``): no
    attribute outside it (``cl-opt``, ``mattr``, ``libs``, ...: options LLVM applies process-wide)
    reaches TVM, whoever wrote the dict; ``targets.TargetRefused`` names the refused key."""
    import tvm

    from tuning.engine.compile.target_schema import check_target

    if isinstance(target, tvm.target.Target):
        return target
    spec = check_target(target)
    if spec.get("kind") == "cuda":
        spec.setdefault("host", {"kind": "llvm"})
        # MetaSchedule's GPU rules need these; values valid for every sm_70+ GPU
        # (the "nvidia/nvidia-h100" tag has the same ones)
        for key, value in _CUDA_DEFAULTS.items():
            spec.setdefault(key, value)
    return tvm.target.Target(spec)


def target_device_type(target: Any) -> str:
    """``"cpu"`` for llvm, ``"cuda"``/``"rocm"``/... for GPU kinds."""
    kind = make_target(target).kind.name
    return "cpu" if kind in ("llvm", "c") else kind


def _device_for(target: Any, index: int = 0):
    import tvm

    dev_type = target_device_type(target)
    dev = tvm.runtime.device(dev_type, index)
    if dev_type != "cpu" and not dev.exist:
        raise RuntimeError(
            f"No {dev_type} device #{index} on this host: a {dev_type} executable can be built "
            "here but must run on a machine with that GPU (use a measure.<host>.gpu<i> worker)."
        )
    return dev


# --------------------------------------------------------------------------- ONNX import
def onnx_input_specs(model, default_dim: int = 1) -> dict[str, tuple[tuple[int, ...], str]]:
    """Graph inputs that are not initializers -> (shape, dtype). Symbolic or
    unknown dimensions are replaced by ``default_dim`` (batch size 1)."""
    init_names = {init.name for init in model.graph.initializer}
    specs: dict[str, tuple[tuple[int, ...], str]] = {}
    for inp in model.graph.input:
        if inp.name in init_names:
            continue
        ttype = inp.type.tensor_type
        shape = []
        for dim in ttype.shape.dim:
            if dim.HasField("dim_value") and dim.dim_value > 0:
                shape.append(int(dim.dim_value))
            else:
                shape.append(int(default_dim))
        specs[inp.name] = (tuple(shape), _ONNX_DTYPES.get(ttype.elem_type, "float32"))
    return specs


def onnx_to_relax(model, shape_dict: dict | None = None, default_dim: int = 1):
    """Import an ONNX ``ModelProto`` into a Relax ``IRModule``.

    The shape dict is taken from the graph inputs (symbolic dims -> ``default_dim``)
    unless given; weights stay in the module as constants
    (``keep_params_in_input=False``), so no separate params dict exists.
    """
    from tvm.relax.frontend.onnx import from_onnx

    specs = onnx_input_specs(model, default_dim=default_dim)
    shapes = {name: list(shape) for name, (shape, _) in specs.items()}
    if shape_dict:
        shapes.update({k: list(v) for k, v in shape_dict.items()})
    dtypes = {name: dtype for name, (_, dtype) in specs.items()}
    return from_onnx(
        model,
        shape_dict=shapes,
        dtype_dict=dtypes,
        keep_params_in_input=False,
    )


def _to_ir_module(model_or_mod):
    """ONNX ModelProto / IRModule / relax.Function -> IRModule."""
    import tvm

    if isinstance(model_or_mod, tvm.IRModule):
        return model_or_mod
    try:  # onnx is optional for callers that pass TVM modules
        import onnx

        if isinstance(model_or_mod, onnx.ModelProto):
            return onnx_to_relax(model_or_mod)
    except ImportError:  # pragma: no cover
        pass
    from tvm import relax

    if isinstance(model_or_mod, relax.Function):
        return tvm.IRModule({"main": model_or_mod})
    raise TypeError(f"expected onnx.ModelProto, IRModule or relax.Function, got {type(model_or_mod)!r}")


# --------------------------------------------------------------------------- passes
def _fuse_passes(target) -> list:
    from tvm import relax
    from tvm.relax import pipeline as relax_pipeline_mod

    try:
        dispatch = list(relax_pipeline_mod.library_dispatch_passes(target))
    except (ValueError, AttributeError):
        dispatch = []
    return [
        # before DecomposeOpsForInference, which leaves no BatchNorm to fold
        *graph_passes.inference_passes(stage=graph_passes.GRAPH, target=target),
        relax.transform.DecomposeOpsForInference(),
        relax.transform.CanonicalizeBindings(),
        *dispatch,
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        *graph_passes.inference_passes(stage=graph_passes.TASKS, target=target),
    ]


def prepare_for_tuning(mod, target):
    """Run the passes ``compile_relax`` runs before ``extract_tasks`` / database
    application, after the selected inference graph passes: (graph_passes,
    DecomposeOpsForInference, CanonicalizeBindings,) library dispatch, LegalizeOps,
    AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR."""
    import tvm

    target = make_target(target)
    mod = _to_ir_module(mod)
    with target, tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential(_fuse_passes(target))(mod)


def extract_tasks(model_or_mod, target, *, prepared: bool = False, module_equality: str = "structural"):
    """MetaSchedule tasks of an ONNX model / Relax module (after
    :func:`prepare_for_tuning`; pass ``prepared=True`` if already done)."""
    from tvm.s_tir import meta_schedule as ms

    target_obj = make_target(target)
    mod = _to_ir_module(model_or_mod)
    if not prepared:
        mod = prepare_for_tuning(mod, target_obj)
    return list(ms.relax_integration.extract_tasks(mod, target_obj, module_equality=module_equality))


def task_summary(model_or_mod, target) -> dict:
    """Tuning tasks of a model through this pipeline: count, calls per inference (summed weights) and
    names, for the before/after tables of a graph-pass ablation (``graph_passes.use_passes``)."""
    from collections import Counter

    tasks = extract_tasks(model_or_mod, target)
    names = Counter(t.task_name for t in tasks)
    return {
        "n_tasks": len(tasks),
        "calls": int(sum(float(t.weight) for t in tasks)),
        "names": dict(sorted(names.items())),
    }


def count_tuning_tasks(model, target) -> list[str]:
    """Names of the tuning tasks of an ONNX model (e.g. ``fused_conv2d_add_relu``)."""
    return [t.task_name for t in extract_tasks(model, target)]


# --------------------------------------------------------------------------- compile
def compile_model(model, target, database=None):
    """Compile an ONNX model / Relax module to a ``relax.VMExecutable``.

    With ``database`` (a ``ms.Database`` or a work_dir path holding TVM's
    JSONDatabase) tuned schedules are applied; otherwise the module is compiled
    untuned (GPU targets get DLight's default schedules so they are valid).
    """
    import tvm
    from tvm import relax
    from tvm.relax import pipeline as relax_pipeline_mod
    from tvm.relax.transform import MetaScheduleApplyDatabase

    target_obj = make_target(target)
    mod = _to_ir_module(model)
    is_gpu = relax_pipeline_mod.BackendDispatcher.is_gpu_target(target_obj)

    if isinstance(database, str):
        database = open_database(database)

    try:
        lower = list(relax_pipeline_mod.dataflow_lower_passes(target_obj))
        finalize = list(relax_pipeline_mod.finalize_passes(target_obj))
    except (ValueError, AttributeError):  # pragma: no cover - unknown target kinds
        lower = [
            relax.transform.RewriteDataflowReshape(),
            relax.transform.ToNonDataflow(),
            relax.transform.RemovePurityChecking(),
            relax.transform.CallTIRRewrite(),
        ]
        finalize = [
            relax.transform.StaticPlanBlockMemory(),
            relax.transform.LowerAllocTensor(),
            relax.transform.KillAfterLastUse(),
            relax.transform.LowerRuntimeBuiltin(),
            relax.transform.ComputePrimValue(),
            relax.transform.VMShapeLower(),
            relax.transform.AttachGlobalSymbol(),
        ]

    @tvm.transform.module_pass(opt_level=3)
    def _pipeline(m, _ctx):
        m = tvm.transform.Sequential(_fuse_passes(target_obj))(m)
        if database is not None:
            m = MetaScheduleApplyDatabase(enable_warning=False)(m)
        m = tvm.transform.Sequential(graph_passes.inference_passes(stage=graph_passes.TUNED, target=target_obj))(m)
        if is_gpu:
            from tvm.s_tir import dlight as dl

            m = dl.ApplyDefaultSchedule(
                dl.gpu.Matmul(),
                dl.gpu.GEMV(),
                dl.gpu.Reduction(),
                dl.gpu.GeneralReduction(),
                dl.gpu.Fallback(),
            )(m)
        return tvm.transform.Sequential(lower + finalize)(m)

    if database is not None:
        with target_obj, database, tvm.transform.PassContext(opt_level=3):
            return relax.build(mod, target=target_obj, relax_pipeline=_pipeline)
    with target_obj, tvm.transform.PassContext(opt_level=3):
        return relax.build(mod, target=target_obj, relax_pipeline=_pipeline)


# --------------------------------------------------------------------------- run
def relax_input_specs(mod) -> dict[str, tuple[tuple[int, ...], str]]:
    """A Relax module's ``main`` parameters (what its VM is called with) -> (shape, dtype); every dimension
    must be static (``onnx_to_relax``'s modules are)."""
    specs: dict[str, tuple[tuple[int, ...], str]] = {}
    for param in mod["main"].params:
        tensor = param.ty  # a relax TensorType (TVM 0.27 names a Relax var's struct info ``ty``)
        specs[str(param.name)] = (tuple(int(d) for d in tensor.shape), str(tensor.dtype))
    return specs


def random_inputs(model, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic random inputs for every graph input of an ONNX model (or parameter of a Relax
    module's ``main``)."""
    rng = np.random.default_rng(seed)
    out = {}
    specs = onnx_input_specs(model) if hasattr(model, "graph") else relax_input_specs(model)
    for name, (shape, dtype) in specs.items():
        if dtype.startswith("float"):
            out[name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == "bool":
            out[name] = rng.integers(0, 2, shape).astype(bool)
        else:
            out[name] = rng.integers(0, 10, shape).astype(dtype)
    return out


def set_runtime_threads(threads: int | None) -> None:
    """Set the TVM runtime thread-pool size of *this* process (and the env var
    for children). ``runtime.config_threadpool(0, n)`` can shrink the pool
    below the size it was created with, not grow it: set TVM_NUM_THREADS
    before the first parallel kernel runs in a process."""
    import tvm_ffi

    if not threads:
        return
    os.environ["TVM_NUM_THREADS"] = str(int(threads))
    cfg = tvm_ffi.get_global_func("runtime.config_threadpool", allow_missing=True)
    if cfg is not None:
        cfg(0, int(threads))


def _flatten_outputs(out) -> list[np.ndarray]:
    import tvm

    if isinstance(out, tvm.runtime.Tensor):
        return [out.numpy()]
    if hasattr(out, "numpy"):
        return [out.numpy()]
    if isinstance(out, (list, tuple)) or type(out).__name__ in ("Array", "ADT", "Tuple"):
        res: list[np.ndarray] = []
        for item in out:
            res.extend(_flatten_outputs(item))
        return res
    return [np.asarray(out)]


def run_and_time(
    executable,
    inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray],
    target,
    *,
    number: int = 10,
    repeat: int = 5,
    threads: int | None = None,
    device_index: int = 0,
    min_repeat_ms: int = 0,
) -> tuple[list[np.ndarray], float]:
    """Run a compiled Relax executable once for outputs, then time ``main`` with
    ``time_evaluator`` (``repeat`` x mean over ``number`` runs; on GPUs the
    evaluator synchronises and times on the device). Returns
    (list of output arrays, median seconds)."""
    outputs, samples = run_and_time_samples(
        executable,
        inputs,
        target,
        number=number,
        repeat=repeat,
        threads=threads,
        device_index=device_index,
        min_repeat_ms=min_repeat_ms,
    )
    return outputs, float(statistics.median(samples))


def run_and_time_samples(
    executable,
    inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray],
    target,
    *,
    number: int = 10,
    repeat: int = 5,
    threads: int | None = None,
    device_index: int = 0,
    min_repeat_ms: int = 0,
) -> tuple[list[np.ndarray], list[float]]:
    """:func:`run_and_time` keeping every repeat's mean seconds (for a median and its spread)."""
    try:
        mask = os.sched_getaffinity(0)
    except AttributeError:  # pragma: no cover
        mask = None
    try:
        return _run_and_time(executable, inputs, target, number, repeat, threads, device_index, min_repeat_ms)
    finally:
        if mask is not None:  # TVM's pool may pin this thread to one core: undo it
            try:
                os.sched_setaffinity(0, mask)
            except OSError:
                pass


def _run_and_time(executable, inputs, target, number, repeat, threads, device_index, min_repeat_ms):
    import tvm
    from tvm import relax

    set_runtime_threads(threads)
    dev = _device_for(target, device_index)
    vm = relax.VirtualMachine(executable, dev)
    if isinstance(inputs, Mapping):
        arrays = list(inputs.values())
    else:
        arrays = list(inputs)
    args = [tvm.runtime.tensor(np.ascontiguousarray(a), device=dev) for a in arrays]
    outputs = _flatten_outputs(vm["main"](*args))
    timer = vm.time_evaluator("main", dev, number=number, repeat=repeat, min_repeat_ms=min_repeat_ms)
    res = timer(*args)
    return outputs, [float(x) for x in res.results]
