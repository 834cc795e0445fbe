"""Inference graph optimizations run on an imported Relax module before task extraction.

Django-free. :func:`optimize_for_inference` runs named, switchable Relax passes on
the module ``relax_pipeline.onnx_to_relax`` returns (weights inline as constants),
*before* ``relax_pipeline.prepare_for_tuning``: that function decomposes
``batch_norm`` into elementwise ops (DecomposeOpsForInference) and legalizes
everything, after which no BatchNorm is left to fold. The same optimized module
must feed task extraction, compilation and the untuned baseline, or the tuning
records will not match the compiled model: :func:`pipeline_key` names the pass
list so it can be stored next to the records.

Passes (ablation: name any subset, in :data:`PASS_ORDER`'s order):

- ``fold_batchnorm``: ``FoldBatchnormToConv2D`` + ``FoldConstant``. Scales the
  conv weights and turns ``conv2d -> batch_norm`` into ``conv2d -> add(bias)``,
  so each fused conv task carries one add instead of BatchNorm's
  subtract/divide/multiply/add epilogue. Matches only a conv2d *without bias*
  whose weight is a constant (PyTorch's conv-before-BN layout; the zoo's CNNs).
- ``eliminate_common_subexpr``: ``EliminateCommonSubexpr`` + ``DeadCodeElimination``
  (identical shape computations and unused tuple outputs of batch_norm).

Measured on the zoo (``{"kind": "llvm", "num-cores": 2}``, tasks after
``prepare_for_tuning``): ``fold_batchnorm`` leaves the task count as it is
(resnet18 19 tasks, mobilenet_v2 33, small_cnn 5, bert_encoder 11: the
decomposed BN already fuses into the conv task) but removes BatchNorm's
subtract/divide/multiply epilogue and three constant inputs from every conv
task, so it is in :data:`DEFAULT`. ``eliminate_common_subexpr`` changed no task
on any zoo model; it stays a switch for ablations. ``CombineParallelMatmul`` did
not fire on bert_encoder's Q/K/V projections (their weights are constants), so
it is not offered.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence

__all__ = [
    "PASS_ORDER",
    "DEFAULT",
    "NONE",
    "optimize_for_inference",
    "inference_passes",
    "pipeline_key",
    "normalize_passes",
    "task_summary",
]


def _fold_batchnorm() -> list:
    from tvm import relax

    # FoldConstant computes the scaled weights and the new bias now, so the
    # folded conv reads one constant weight tensor (a tuning workload like any other)
    return [relax.transform.FoldBatchnormToConv2D(), relax.transform.FoldConstant()]


def _eliminate_common_subexpr() -> list:
    from tvm import relax

    return [relax.transform.EliminateCommonSubexpr(), relax.transform.DeadCodeElimination()]


# name -> factory of the TVM passes; the order here is the order they run in
_PASSES: dict[str, Callable[[], list]] = {
    "fold_batchnorm": _fold_batchnorm,
    "eliminate_common_subexpr": _eliminate_common_subexpr,
}
PASS_ORDER: tuple[str, ...] = tuple(_PASSES)
DEFAULT: tuple[str, ...] = ("fold_batchnorm",)
NONE: tuple[str, ...] = ()


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


def pipeline_key(passes: Iterable[str] | str | None = None) -> str:
    """Stable name of a pass selection ("none" when empty), to store with tuning records."""
    chosen = normalize_passes(passes)
    return "+".join(chosen) if chosen else "none"


def inference_passes(passes: Sequence[str] | str | None = DEFAULT) -> list:
    """The TVM passes of a selection, in order: to put at the head of a pass list that
    continues with DecomposeOpsForInference / LegalizeOps (``relax_pipeline._fuse_passes``)."""
    return [p for name in normalize_passes(passes) for p in _PASSES[name]()]


def optimize_for_inference(mod, passes: Sequence[str] | str | None = DEFAULT):
    """Run the selected inference passes on a Relax ``IRModule`` (as imported, not yet
    prepared for tuning) and return the new module; the input is not modified."""
    import tvm

    seq = inference_passes(passes)
    if not seq:
        return mod
    with tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential(seq)(mod)


def task_summary(mod, target) -> dict:
    """Tuning tasks of a Relax module after ``prepare_for_tuning``: count, names and the
    summed weight (calls per inference), for the before/after tables of an ablation."""
    from .relax_pipeline import extract_tasks

    tasks = extract_tasks(mod, target)
    names = Counter(t.task_name for t in tasks)
    return {
        "n_tasks": len(tasks),
        "calls": int(sum(float(t.weight) for t in tasks)),
        "names": dict(sorted(names.items())),
    }
