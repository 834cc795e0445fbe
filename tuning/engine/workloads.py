"""What a run tunes: the MetaSchedule tasks of a model (one scheduled-TIR workload each).

TVM is imported inside :func:`collect_tasks`: the web processes import this module through
``session`` (for ``TuningConfig``), and importing MetaSchedule costs seconds there.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .relax_pipeline import extract_tasks

__all__ = ["Task", "collect_tasks"]


@dataclasses.dataclass
class Task:
    name: str
    mod: Any  # IRModule with one PrimFunc "main" (normalized)
    weight: float
    flops: float


def _flops(mod) -> float:
    try:
        from tvm.s_tir.analysis import estimate_tir_flops  # TVM: see the module doc

        return float(estimate_tir_flops(mod))
    except Exception:  # noqa: BLE001 - an unknown FLOP count is 0, not a failed run
        return 0.0


def collect_tasks(model, target) -> list[Task]:
    """Tuning tasks of an ONNX model, a Relax IRModule, a TIR PrimFunc or an
    IRModule of PrimFuncs (sorted by name, like ``tune_tir``)."""
    import tvm  # TVM: see the module doc
    from tvm import relax, tirx
    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

    if isinstance(model, tirx.PrimFunc):
        mod = _normalize_mod(model)
        return [Task("main", mod, 1.0, _flops(mod))]
    if isinstance(model, tvm.IRModule) and not any(
        isinstance(f, relax.Function) for _, f in model.functions_items()
    ):
        out = []
        for gv, func in sorted(model.functions_items(), key=lambda kv: kv[0].name_hint):
            if isinstance(func, tirx.PrimFunc):
                mod = _normalize_mod(func)
                out.append(Task(gv.name_hint, mod, 1.0, _flops(mod)))
        return out
    out = []
    for t in extract_tasks(model, target):
        mod = t.dispatched[0]
        if mod.attrs is not None and mod.attrs.get("tirx.is_scheduled", False):
            continue
        out.append(Task(t.task_name, mod, float(t.weight), _flops(mod)))
    return out
