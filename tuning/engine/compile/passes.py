"""Inference graph optimizations of the platform's one Relax pipeline.

Django-free. ``relax_pipeline._fuse_passes`` (task extraction, the tuned build and the
untuned baseline alike) runs the passes selected for its target (:func:`selected_passes`: the
target's :func:`default_passes`, :data:`DEFAULT` on CPUs; :func:`use_passes` changes it for a block) in
three stages
(:data:`STAGES`): ``graph`` on the imported module, before DecomposeOpsForInference
(which decomposes ``batch_norm`` into elementwise ops, after which no BatchNorm is left
to fold); ``tasks`` after FuseTIR, on the module tasks are extracted from; ``tuned``
after the tuning database is applied (``relax_pipeline.compile_model``). Records match
the compiled model because both come from the same list; :func:`pipeline_key` names
and versions it, to store next to the records (``targets.result_identity``).

Passes (ablation: name any subset, in :data:`PASS_ORDER`'s order):

- ``fold_batchnorm``: ``FoldBatchnormToConv2D`` + ``FoldConstant``. Scales the
  conv weights and turns ``conv2d -> batch_norm`` into ``conv2d -> add(bias)``,
  so each fused conv task carries one add instead of BatchNorm's
  subtract/divide/multiply/add epilogue. Matches only a conv2d *without bias*
  whose weight is a constant (PyTorch's conv-before-BN layout; the zoo's CNNs).
- ``eliminate_common_subexpr``: ``EliminateCommonSubexpr`` + ``DeadCodeElimination``
  (identical shape computations and unused tuple outputs of batch_norm).
- ``convert_layout``: ``ConvertLayout`` (:data:`CONV_LAYOUTS`: conv2d to NHWC activations and
  OHWI weights; elementwise ops and pools follow) + ``FoldConstant``, on the graph after ``fold_batchnorm``,
  so the conv tasks MetaSchedule extracts and tunes are NHWC ones; transposes remain only
  at the graph's edges (the executable still takes and returns NCHW). ONNX Clip (ReLU6), which
  TVM's importer emits as TIR that ConvertLayout cannot see through, is lifted back to
  ``R.maximum``/``R.minimum`` first (``lift_clip``). Graphs without convs
  or pools (transformers) are left as they are.
- ``layout_rewrite``: TVM's CPU weight prepack (``static_shape_tuning``'s
  ``cpu_weight_prepack``): ``AttachAttrLayoutFreeBuffers`` before extraction, so
  MetaSchedule's RewriteLayout may choose the layout a schedule reads a weight in;
  ``SplitLayoutRewritePreproc`` + ``FoldConstant`` after the database, folding the
  layout change into the constant weights (the executable's interface is unchanged).

Measured on the zoo (``resolve_cpu_target(2)``, this host znver4, tasks through the
pipeline; untuned latency under a load average of about 19 on 2 cores, so only the
counts are firm): ``fold_batchnorm`` leaves the task count as it is (resnet18 19 tasks
both ways, 24 calls; small_cnn 5, whose convs have biases and no BN; earlier
measurements: mobilenet_v2 33, bert_encoder 11) because the decomposed BN already
fuses into its conv task, but it removes BatchNorm's subtract/divide/multiply epilogue
and three constant inputs from every conv task of resnet18 (untuned resnet18 1,880 vs
1,892 ms: the same), so it is in :data:`DEFAULT`. ``eliminate_common_subexpr`` changed
no task on any zoo model. ``layout_rewrite`` marks every conv task's weights
layout-free. ``convert_layout`` + ``layout_rewrite`` (:data:`LAYOUT`): on an Intel host
(resnet18 at ~920-990 trials, tuned/onnxruntime) the v1 pipeline (``fold_batchnorm``) gave 2.43,
+ layout_rewrite 2.15, + NHWC conversion and the rewrite 1.20; a small depthwise-separable
CNN at ~180-190 trials 2.49 -> 0.93, the same budgets: the CNN gap was data layout. At 30 minutes of
tuning on a quiet 2-core AMD znver4 host resnet18 and mobilenet_v2 reach onnxruntime with them and stay
far behind without (docs/research/tuning-vs-onnxruntime.md, "The layout passes become the CPU default"),
so :data:`LAYOUT` is the CPU default. ``convert_layout`` changes only graphs with convs;
``layout_rewrite`` also lets MetaSchedule repack a transformer's matmul weights, as TVM's own
``static_shape_tuning`` pipeline does for every model. CUDA targets keep :data:`GPU_DEFAULT` (v1) until the
layout passes are measured on a GPU: :func:`default_passes` picks by the target's kind, and the pipeline
key a run stores says which it got.
``CombineParallelMatmul`` did not fire on bert_encoder's Q/K/V projections (their
weights are constants), so it is not offered.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tuning.engine.compile.target_schema import target_kind

__all__ = [
    "PASS_ORDER",
    "DEFAULT",
    "SHIPPED_V1",
    "LAYOUT",
    "GPU_DEFAULT",
    "default_passes",
    "describe_pipeline",
    "CONV_LAYOUTS",
    "NONE",
    "PIPELINE_NAME",
    "PIPELINE_VERSION",
    "STAGES",
    "optimize_for_inference",
    "inference_passes",
    "pipeline_key",
    "normalize_passes",
    "selected_passes",
    "use_passes",
]


def _fold_batchnorm() -> dict[str, list]:
    from tvm import relax

    # FoldConstant computes the scaled weights and the new bias now, so the
    # folded conv reads one constant weight tensor (a tuning workload like any other)
    return {GRAPH: [relax.transform.FoldBatchnormToConv2D(), relax.transform.FoldConstant()]}


def _eliminate_common_subexpr() -> dict[str, list]:
    from tvm import relax

    return {GRAPH: [relax.transform.EliminateCommonSubexpr(), relax.transform.DeadCodeElimination()]}


# NHWC activations, OHWI weights: the layout MetaSchedule's x86 rules vectorize a conv's output channels in
# (innermost, contiguous). Pools take no desired layout (TVM refuses one): they follow their input's, so
# no transpose sits between a conv and its pool
CONV_LAYOUTS: dict[str, list[str]] = {"relax.nn.conv2d": ["NHWC", "OHWI"]}


def _convert_layout() -> dict[str, list]:
    from tvm import relax

    from tuning.engine.compile.lift_clip import lift_clip_to_relax_ops

    # after fold_batchnorm (FoldBatchnormToConv2D matches NCHW convs only); the transposes it leaves at the
    # graph's edges and the weights' OHWI transposes are constants or cheap tasks, FoldConstant folds the latter.
    # The importer's TIR for ONNX Clip (ReLU6) is lifted to Relax ops first: ConvertLayout cannot see through a
    # call_tir and wrapped every ReLU6 in a transpose pair (mobilenet_v2: 70 transposes -> 2)
    return {
        GRAPH: [
            lift_clip_to_relax_ops(),
            relax.transform.ConvertLayout(CONV_LAYOUTS),
            relax.transform.FoldConstant(),
        ]
    }


def _layout_rewrite() -> dict[str, list]:
    from tvm import relax

    # TVM's cpu_weight_prepack (static_shape_tuning): the weights are marked layout-free before extraction,
    # so MetaSchedule's RewriteLayout postproc may choose the layout a schedule reads them in; after the
    # database is applied the layout change is split out and, the weights being constants, folded at
    # compile time: the executable's interface does not change
    return {
        TASKS: [relax.transform.AttachAttrLayoutFreeBuffers()],
        TUNED: [relax.transform.SplitLayoutRewritePreproc(), relax.transform.FoldConstant()],
    }


# Where in relax_pipeline a pass runs: on the imported graph (before DecomposeOpsForInference), on the fused
# module tasks are extracted from (after FuseTIR), on the module with the tuned schedules applied
GRAPH, TASKS, TUNED = "graph", "tasks", "tuned"
STAGES = (GRAPH, TASKS, TUNED)

# name -> factory of the TVM passes per stage; the order here is the order they run in
_PASSES: dict[str, Callable[[], dict[str, list]]] = {
    "fold_batchnorm": _fold_batchnorm,
    "eliminate_common_subexpr": _eliminate_common_subexpr,
    "convert_layout": _convert_layout,
    "layout_rewrite": _layout_rewrite,
}
PASS_ORDER: tuple[str, ...] = tuple(_PASSES)
# What each pass does to the model, in words (the run page names a run's pipeline with them)
PASS_WORDS: dict[str, str] = {
    "fold_batchnorm": "BatchNorm folded into the convs",
    "eliminate_common_subexpr": "common subexpressions removed",
    "convert_layout": "convs in NHWC",
    "layout_rewrite": "weights pre-packed for their schedules",
}
SHIPPED_V1: tuple[str, ...] = ("fold_batchnorm",)
# NHWC convs and MetaSchedule's weight repacking: the CPU default. At the same budget it took resnet18 from
# 2.43x to 1.20x onnxruntime on an Intel host, and at 30 minutes of tuning on a quiet AMD znver4 host
# resnet18 and mobilenet_v2 reach onnxruntime with it where the v1 pipeline stays far behind
# (docs/research/tuning-vs-onnxruntime.md, "The layout passes become the CPU default")
LAYOUT: tuple[str, ...] = ("fold_batchnorm", "convert_layout", "layout_rewrite")
# CUDA keeps v1 until the layout passes are measured on a GPU (RewriteLayout is a CPU postproc)
GPU_DEFAULT: tuple[str, ...] = SHIPPED_V1
DEFAULT: tuple[str, ...] = LAYOUT  # the CPU default (a target-less call means the host's CPU)
NONE: tuple[str, ...] = ()
# The pipeline's name and version are part of :func:`pipeline_key`: bump the version whenever the
# passes after these (``relax_pipeline._fuse_passes``) change what a task's workload is, so records
# tuned under the old pipeline are never taken for this one's.
PIPELINE_NAME = "dlopt-relax"
# 2: convert_layout lifts ONNX Clip to Relax ops before converting (ReLU6 follows the NHWC conv)
PIPELINE_VERSION = 2

# The selection every extraction and compilation of this process uses (``relax_pipeline``): None = the
# target's default (:func:`default_passes`); changed only through :func:`use_passes` (ablations: one selection
# per process, as bench/vs_onnxruntime.py runs it).
_selected: tuple[str, ...] | None = None


def default_passes(target: Any = None) -> tuple[str, ...]:
    """The selection a target gets when none was chosen: :data:`LAYOUT` on CPUs, :data:`GPU_DEFAULT` on CUDA."""
    return GPU_DEFAULT if target_kind(target) == "cuda" else DEFAULT


def normalize_passes(passes: Iterable[str] | str | None) -> tuple[str, ...]:
    """A pass selection in canonical order, unknown names refused. ``None`` -> DEFAULT;
    a string is a comma-separated list ("" or "none" -> no pass)."""
    if passes is None:
        return DEFAULT
    if isinstance(passes, str):
        passes = [] if passes.strip().lower() in ("", "none") else [p.strip() for p in passes.split(",")]
    chosen = set(passes)
    unknown = sorted(chosen - set(_PASSES))
    if unknown:
        raise ValueError(f"unknown graph pass(es) {unknown}; choose from {list(PASS_ORDER)}")
    return tuple(name for name in PASS_ORDER if name in chosen)


def selected_passes(target: Any = None) -> tuple[str, ...]:
    """The pass selection this process extracts tasks and compiles with for ``target``."""
    return _selected if _selected is not None else default_passes(target)


@contextlib.contextmanager
def use_passes(passes: Iterable[str] | str | None):
    """Extract, tune and compile with another selection inside the block (an ablation); ``None``: the
    target's default."""
    global _selected
    previous, _selected = _selected, None if passes is None else normalize_passes(passes)
    try:
        yield selected_passes()
    finally:
        _selected = previous


def pipeline_key(passes: Iterable[str] | str | None = None, target: Any = None) -> str:
    """Stable name + version of the pipeline a selection gives (default: the one selected for ``target``),
    e.g. ``dlopt-relax/2:fold_batchnorm+convert_layout+layout_rewrite`` (``...:none`` when empty): stored on
    every run and part of what identifies a tuning result (``targets.result_identity``)."""
    chosen = selected_passes(target) if passes is None else normalize_passes(passes)
    return f"{PIPELINE_NAME}/{PIPELINE_VERSION}:{'+'.join(chosen) if chosen else 'none'}"


def describe_pipeline(key: str) -> str:
    """A stored :func:`pipeline_key` in words, e.g. ``BatchNorm folded into the convs; convs in NHWC;
    weights pre-packed for their schedules (dlopt-relax/2)``; a pass this version does not know (a key
    stored by another version) is named as it is."""
    identity, _, chosen = key.partition(":")
    names = [name for name in chosen.split("+") if name and name != "none"]
    words = "; ".join(PASS_WORDS.get(name, name) for name in names) or "no graph passes"
    return f"{words} ({identity})"


def inference_passes(passes: Sequence[str] | str | None = None, stage: str = GRAPH, target: Any = None) -> list:
    """The TVM passes of a selection (default: the one selected for ``target``) for one stage, in order.
    ``graph``: the head of ``relax_pipeline._fuse_passes``, before DecomposeOpsForInference / LegalizeOps;
    ``tasks``: its tail, after FuseTIR; ``tuned``: after MetaScheduleApplyDatabase in ``compile_model``."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    chosen = selected_passes(target) if passes is None else normalize_passes(passes)
    return [p for name in chosen for p in _PASSES[name]().get(stage, [])]


def optimize_for_inference(mod, passes: Sequence[str] | str | None = None):
    """Run inference passes (default: the selected ones) on a Relax ``IRModule`` (as imported,
    not yet prepared for tuning) and return the new module; the input is not modified.
    ``relax_pipeline`` already runs the selected passes at the head of its pipeline: this is for
    looking at a module's graph, not a step to add before extraction or compilation."""
    import tvm

    seq = inference_passes(passes, GRAPH)
    if not seq:
        return mod
    with tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential(seq)(mod)
