"""What a run tunes: the MetaSchedule tasks of a model (one scheduled-TIR workload each).

TVM is imported inside :func:`collect_tasks`: the web processes import this module through
``session`` (for ``TuningConfig``), and importing MetaSchedule costs seconds there.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tuning.engine.compile.pipeline import extract_tasks

__all__ = ["Task", "collect_tasks", "round_size"]


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
    if isinstance(model, tvm.IRModule) and not any(isinstance(f, relax.Function) for _, f in model.functions_items()):
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


def round_size(trials_per_round: int, budget: int, n_tasks: int) -> int:
    """The batch size a run measures: ``trials_per_round``, lowered so the budget reaches every task.
    MetaSchedule gives each task one round before any task a second; rounds larger than budget / tasks
    spend the budget before the last tasks' turn (640 trials at 32 a round reached 20 of mobilenet_v2's
    33 tasks, the other 13 kept TVM's default schedules). The platform refuses budgets under 8 a task."""
    size = max(1, min(int(trials_per_round), int(budget) or 1))
    if n_tasks and size * n_tasks > budget:
        size = max(1, int(budget) // int(n_tasks))
    return size
