"""The checks of an imported TVM tuning database that need TVM: parse, check the trace objects, replay.

:func:`check_import` runs in a sandboxed worker (TVM's JSON loaders are C++ fed with hostile input):
after :func:`~tuning.engine.records.check.precheck` (pure Python), it matches each workload to one of
the run's tasks by structural hash and equality, parses each record's trace with TVM, checks every
instruction and value (:func:`check_trace`: MetaSchedule's own kinds, annotations and index
arithmetic; :func:`_check_mutable`: the form its mutators read), replays it on the task's module and
bounds the program it gives (:func:`check_loops`). What it returns is checked again in the parent
(:func:`~tuning.engine.records.check.recheck_output`). The rules themselves are described in
:mod:`tuning.engine.records.check`. TVM is imported inside the functions.
"""

from __future__ import annotations

import json
import math

import onnx

from tuning.engine.compile.pipeline import make_target
from tuning.engine.compile.workloads import collect_tasks
from tuning.engine.events import record_json
from tuning.engine.records.check import (
    ALLOWED_ANNOTATIONS,
    ALLOWED_KINDS,
    IDENTIFIER,
    MAX_DEPTH,
    MAX_UNROLLED_EXTENT,
    MAX_VECTOR_LANES,
    RecordError,
    annotation_allowed,
    precheck,
    trace_only,
)

__all__ = ["check_trace", "check_loops", "check_and_replay", "check_import"]


_EXPR_FIELDS = {
    "Add": ("a", "b"),
    "Sub": ("a", "b"),
    "Mul": ("a", "b"),
    "Div": ("a", "b"),
    "Mod": ("a", "b"),
    "FloorDiv": ("a", "b"),
    "FloorMod": ("a", "b"),
    "Min": ("a", "b"),
    "Max": ("a", "b"),
    "EQ": ("a", "b"),
    "NE": ("a", "b"),
    "LT": ("a", "b"),
    "LE": ("a", "b"),
    "GT": ("a", "b"),
    "GE": ("a", "b"),
    "And": ("a", "b"),
    "Or": ("a", "b"),
    "Not": ("a",),
    "Cast": ("value",),
    "Select": ("condition", "true_value", "false_value"),
    "IntImm": (),
    "FloatImm": (),
    "Var": (),
}

_EXPR_MODULES = ("tvm.ir.prim.expr", "tvm.ir.expr")  # TIR's expressions and variables (ExprRV), not Relax's


def _check_value(v, depth: int = 0) -> None:
    """Values an instruction may hold: numbers, identifiers, RVs, index arithmetic, index maps."""
    from tvm.s_tir.schedule import LoopRV, SBlockRV
    from tvm.tirx import IndexMap

    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"{v} is not a finite number")
    if v is None or isinstance(v, (bool, int, float, SBlockRV, LoopRV)):
        return
    if isinstance(v, str):
        if not IDENTIFIER.fullmatch(v):
            raise ValueError(f"string {v[:40]!r} is not a plain name (code and paths are refused)")
        return
    if isinstance(v, IndexMap):
        for e in list(v.initial_indices) + list(v.final_indices):
            _check_value(e, depth + 1)
        return
    name = type(v).__name__
    if name in _EXPR_FIELDS and type(v).__module__ in _EXPR_MODULES:
        if name == "FloatImm" and not math.isfinite(float(v.value)):
            raise ValueError(f"{v.value} is not a finite number")
        for f in _EXPR_FIELDS[name]:
            _check_value(getattr(v, f), depth + 1)
        return
    if hasattr(v, "items"):
        for k, x in v.items():
            _check_value(k, depth + 1)
            _check_value(x, depth + 1)
        return
    if isinstance(v, (list, tuple)) or name in ("Array", "List", "Tuple"):
        for x in v:
            _check_value(x, depth + 1)
        return
    raise ValueError(f"value of type {name} is not allowed")


def check_trace(trace) -> None:
    """Raise ValueError naming the first instruction a platform must not build."""
    for i, inst in enumerate(trace.insts):
        kind = inst.kind.name
        if kind not in ALLOWED_KINDS:
            raise ValueError(f"instruction {i} ({kind}) is not one of MetaSchedule's own")
        if kind == "Annotate":
            key = str(inst.attrs[0])
            if not annotation_allowed(key):
                raise ValueError(
                    f"instruction {i} annotates {key[:60]!r}, which is not on the allow-list "
                    "(meta_schedule.*, " + ", ".join(sorted(ALLOWED_ANNOTATIONS)) + ")"
                )
        try:
            _check_value(list(inst.inputs))
            _check_value(list(inst.attrs))
        except ValueError as exc:
            raise ValueError(f"instruction {i} ({kind}): {exc}") from None
    for inst, decision in trace.decisions.items():
        try:
            _check_value(decision)
        except ValueError as exc:
            raise ValueError(f"decision of {inst.kind.name}: {exc}") from None
    _check_mutable(trace)


UNROLL_ANNOTATIONS = ("meta_schedule.unroll_explicit", "meta_schedule.unroll_implicit")


def _check_mutable(trace) -> None:
    """The annotations MetaSchedule's mutators rewrite must have the form they read: the search mutates
    imported records, and one that breaks a mutator's assumption fails the whole run's search
    (``parallel_for_dynamic error``), not just its own candidate. ``MutateUnroll`` reads an unroll
    annotation's value as a variable sampled by a ``SampleCategorical`` of the trace; ``MutateParallel``
    reads ``meta_schedule.parallel`` as an integer constant (what the schedule rules emit)."""
    from tvm.tirx import IntImm

    sampled = []
    for i, inst in enumerate(trace.insts):
        if inst.kind.name == "SampleCategorical":
            sampled.extend(inst.outputs)
        if inst.kind.name != "Annotate" or len(inst.inputs) != 2:
            continue
        key, value = str(inst.attrs[0]), inst.inputs[1]
        if key in UNROLL_ANNOTATIONS and not any(_same(value, v) for v in sampled):
            raise ValueError(
                f"instruction {i} annotates {key} with a value that is not a SampleCategorical "
                "variable of the trace (MetaSchedule's unroll mutator needs one)"
            )
        if key == "meta_schedule.parallel" and (isinstance(value, bool) or not isinstance(value, (int, IntImm))):
            raise ValueError(
                f"instruction {i} annotates {key} with a value that is not an integer constant "
                "(MetaSchedule's parallel mutator needs one)"
            )


_STMT_CHILDREN = ("body", "seq", "then_case", "else_case", "block", "init")


def check_loops(stmt, unrolled: int = 1) -> None:
    """The scheduled program a replayed trace gives must build in bounded time: nested explicitly unrolled
    loops copy their body at most MAX_UNROLLED_EXTENT times, a vectorized loop has at most
    MAX_VECTOR_LANES lanes (MetaSchedule's own kinds, but on long loops they build for minutes)."""
    from tvm.tirx import For, ForKind, IntImm

    if isinstance(stmt, For):
        extent = int(stmt.extent.value) if isinstance(stmt.extent, IntImm) else None
        if stmt.kind == ForKind.UNROLLED and extent:
            unrolled *= extent
            if unrolled > MAX_UNROLLED_EXTENT:
                raise ValueError(
                    f"it unrolls loops {unrolled} times over (at most {MAX_UNROLLED_EXTENT}: "
                    "such a candidate builds for minutes)"
                )
        if stmt.kind == ForKind.VECTORIZED and (extent is None or extent > MAX_VECTOR_LANES):
            raise ValueError(
                f"it vectorizes a loop of {extent if extent else 'unknown'} lanes (at most "
                f"{MAX_VECTOR_LANES}, MetaSchedule's largest)"
            )
    for field in _STMT_CHILDREN:
        child = getattr(stmt, field, None)
        if child is None:
            continue
        for item in child if isinstance(child, (list, tuple)) or type(child).__name__ == "Array" else [child]:
            check_loops(item, unrolled)


def check_and_replay(trace, mod):
    """``check_trace``, then replay on ``mod`` and ``check_loops`` on the program it gives; the schedule.
    Raises (ValueError, or TVM's error when the trace does not replay)."""
    from tvm.s_tir.schedule import Schedule

    check_trace(trace)
    sch = Schedule(mod)
    trace.apply_to_schedule(sch, remove_postproc=False)
    for _, func in sch.mod.functions.items():
        check_loops(func.body)
    return sch


def _same(a, b) -> bool:
    same = getattr(a, "same_as", None)
    return bool(same and same(b))


def _task_modules(model_bytes: bytes, target) -> list:
    return [t.mod for t in collect_tasks(onnx.load_model_from_string(model_bytes), make_target(target))]


def _match_workloads(wl_lines, task_mods) -> dict[int, int]:
    """workload line index -> task index, for the workloads that are one of the run's tasks."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    hashes: dict[int, int] = {}
    for ti, mod in enumerate(task_mods):
        hashes.setdefault(int(tvm_ffi.structural_hash(mod)), ti)
    out = {}
    for wi, (_, value) in enumerate(wl_lines):
        try:
            mod = ms.database.Workload.from_json(value).mod
        except Exception:  # noqa: BLE001 - refused when a record uses it
            continue
        match = hashes.get(int(tvm_ffi.structural_hash(mod)))
        if match is not None and tvm_ffi.structural_equal(mod, task_mods[match]):
            out[wi] = match
    return out


def check_import(model_bytes: bytes, target, workloads: bytes, records: bytes, max_records: int) -> dict:
    """Run in a sandboxed worker. Returns {"errors": [message, ...]} or {"records": [line, ...]}: each
    ``[index of the run's task, [trace, null, null, null]]``, the checked trace as TVM writes it."""
    from tvm.s_tir import meta_schedule as ms

    try:
        wl_lines, rec_lines = precheck(workloads, records, max_records=max_records)
    except RecordError as exc:
        return {"errors": [str(exc)]}
    task_mods = _task_modules(model_bytes, target)
    matched = _match_workloads(wl_lines, task_mods)
    errors, out_records = [], []
    for n, (wi, body) in rec_lines:
        where = f"Tuning record line {n}"
        ti = matched.get(wi)
        if ti is None:
            errors.append(
                f"{where}: its workload (workload line {wl_lines[wi][0]}) is not one of this run's "
                "tasks (no task of the run's model has the same structure)"
            )
            continue
        mod = task_mods[ti]
        try:
            rec = ms.database.TuningRecord.from_json(trace_only(body), ms.database.Workload(mod))
            check_and_replay(rec.trace, mod)
        except Exception as exc:  # noqa: BLE001 - any parse/replay failure refuses the line
            text = str(exc).strip()
            errors.append(f"{where}: {text.splitlines()[-1][:300] if text else type(exc).__name__}")
            continue
        out_records.append(json.dumps([ti, [record_json(rec)[0], None, None, None]]))  # the trace only
    if errors:
        return {"errors": errors}
    return {"records": out_records}
