"""Check an imported TVM tuning database before the platform builds anything from it (Django-free).

An imported record is a schedule trace, and a trace can carry code: ``Annotate(loop,
"pragma_import_llvm", <LLVM IR>)`` links that IR into the candidate, and IR with a module
constructor runs when the library is loaded. So a record is accepted only when

- its workload, parsed by TVM, is structurally equal (same structural hash) to one of the run's
  tasks, extracted from the run's model the way tuning extracts them;
- every instruction of its trace is one of MetaSchedule's own kinds (:data:`ALLOWED_KINDS`);
- every annotation key is MetaSchedule's (``meta_schedule.*`` or :data:`ALLOWED_ANNOTATIONS`: what
  its schedule rules and postprocessors emit for llvm and cuda), so never ``pragma_import_*``;
- the annotations MetaSchedule's mutators rewrite (unroll, parallel) have the form they read, since a
  record the search cannot mutate fails the whole run's search;
- every string in it is a short identifier (block, function, scope and intrinsic names), so it
  carries no code and no file path, and every expression is plain index arithmetic;
- it replays on the task's module.

What is kept is the trace only: the workload written is the platform's own task module, the
target and argument info the run's, and the imported ``run_secs`` are dropped (the platform
measures imported candidates itself before they count). :func:`precheck` is pure Python (no TVM)
and bounds the input; :func:`check_import` parses with TVM and must run in a sandboxed worker
(``procpool``), since TVM's JSON loaders are C++ fed with hostile input. TVM is imported inside the
functions that parse: the web process runs :func:`precheck` on an upload without importing it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import onnx

from .events import ffi_to_py as _plain
from .relax_pipeline import make_target
from .workloads import collect_tasks

__all__ = ["ALLOWED_KINDS", "ALLOWED_ANNOTATIONS", "RecordError", "precheck", "check_import", "annotation_allowed",
           "recheck_output"]

ALLOWED_KINDS = frozenset({
    "GetSBlock", "GetLoops", "GetChildBlocks", "GetProducers", "GetConsumers", "GetOutputBlocks",
    "SamplePerfectTile", "SamplePartitionedTile", "SampleCategorical", "SampleComputeLocation",
    "Split", "Fuse", "Reorder", "AddUnitLoop", "Parallel", "Vectorize", "Bind", "Unroll",
    "CacheRead", "CacheWrite", "ReindexCacheRead", "ReindexCacheWrite", "CacheInplace", "CacheIndex", "ReIndex",
    "ComputeAt", "ReverseComputeAt", "ComputeInline", "ReverseComputeInline",
    "DecomposeReduction", "DecomposePadding", "RFactor", "StorageAlign", "SetScope", "SetAxisSeparator",
    "Blockize", "Tensorize", "Annotate", "Unannotate", "TransformLayout", "TransformBlockLayout",
    "PadEinsum", "RollingBuffer", "EnterPostproc",
})
# Annotation keys MetaSchedule's llvm and cuda schedule rules / postprocessors write besides
# meta_schedule.* (RewriteParallelVectorizeUnroll, MultiLevelTiling*, software pipelining).
ALLOWED_ANNOTATIONS = frozenset({
    "pragma_auto_unroll_max_step", "pragma_unroll_explicit", "software_pipeline_stage",
    "software_pipeline_order", "software_pipeline_async_stages", "warp_execution", "double_buffer_scope",
})
IDENTIFIER = re.compile(r"[A-Za-z0-9_.]{1,128}")
MAX_WORKLOAD_LINE = 64 * 1024 * 1024
MAX_RECORD_LINE = 1024 * 1024
MAX_WORKLOADS = 10_000


class RecordError(ValueError):
    """One refused line: ``where`` ("Tuning record line 3") and the reason."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where, self.reason = where, reason


def annotation_allowed(key: str) -> bool:
    return key.startswith("meta_schedule.") or key in ALLOWED_ANNOTATIONS


def _lines(data: bytes, what: str, limit: int, max_count: int, too_many: str) -> list[Any]:
    """The JSON value of each non-blank line; refused at line ``max_count + 1`` (``too_many`` says why),
    before that line is parsed: a file of millions of tiny lines costs no more than its first few."""
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise RecordError(f"{what} file", f"not UTF-8 text ({exc})") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if len(out) >= max_count:
            raise RecordError("Import", too_many)
        if len(line) > limit:
            raise RecordError(f"{what} line {n}", f"longer than {limit} characters")
        try:
            out.append((n, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise RecordError(f"{what} line {n}", f"not JSON ({exc})") from None
        except RecursionError:  # json's C scanner recurses per nesting level: [[[[...]]]] overflows
            raise RecordError(f"{what} line {n}", "JSON nested too deeply") from None
        except ValueError as exc:  # an integer past sys.get_int_max_str_digits() (not a JSONDecodeError)
            raise RecordError(f"{what} line {n}", f"not acceptable JSON ({str(exc)[:80]})") from None
    return out


def precheck(workloads: bytes, records: bytes, *, max_records: int) -> tuple[list, list]:
    """Shape and size of the two files, without TVM: [(line, value)] of workloads and records."""
    wl = _lines(workloads, "Workload", MAX_WORKLOAD_LINE, MAX_WORKLOADS,
                f"more than {MAX_WORKLOADS} workloads (a run has far fewer tasks)")
    recs = _lines(records, "Tuning record", MAX_RECORD_LINE, max_records,
                  f"more tuning records than this run's budget of {max_records} trials (each imported record "
                  "is measured as one trial)")
    if not wl or not recs:
        raise RecordError("Import", "both the workload file and the tuning-record file must be non-empty")
    for n, rec in recs:
        where = f"Tuning record line {n}"
        if not (isinstance(rec, list) and len(rec) == 2 and type(rec[0]) is int and 0 <= rec[0] < len(wl)):
            raise RecordError(where, "expected [workload_index, record] with a valid workload index")
        body = rec[1]
        if not (isinstance(body, list) and body and isinstance(body[0], list) and len(body[0]) == 2
                and isinstance(body[0][0], list)):
            raise RecordError(where, "expected a MetaSchedule record [[instructions, decisions], ...]")
        for inst in body[0][0]:
            kind = inst[0] if isinstance(inst, list) and inst and isinstance(inst[0], str) else None
            if kind not in ALLOWED_KINDS:
                raise RecordError(where, f"instruction {str(kind)[:60]!r} is not one of MetaSchedule's own")
    return wl, recs


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)


def recheck_output(record_lines: list[str]) -> None:
    """Plain-Python check, in the parent, of the records the TVM checker returned: it parsed hostile
    input in C++, so what it hands back is not trusted either. Every string of every trace must be a
    plain name, no annotation key outside the allow-list, no latency kept. Raises RecordError."""
    for n, line in enumerate(record_lines, 1):
        where = f"Checked record {n}"
        try:
            index, body = json.loads(line)
            trace = body[0]
        except (ValueError, TypeError, IndexError, KeyError):
            raise RecordError(where, "the checker returned a malformed record") from None
        if len(body) > 1 and body[1] is not None:
            raise RecordError(where, "the checker returned a record with a latency")
        for text in _strings(trace):
            if len(text) > 2 and text[0] == text[-1] == '"':
                text = text[1:-1]  # a string input: TVM's trace JSON quotes it to tell it from an RV name
            if not IDENTIFIER.fullmatch(text):
                raise RecordError(where, f"the checker returned a string that is not a plain name: {text[:60]!r}")
            if text.startswith("pragma_") and not annotation_allowed(text):
                raise RecordError(where, f"the checker returned the annotation {text!r}")


# --------------------------------------------------------------------------- with TVM
_EXPR_FIELDS = {"Add": ("a", "b"), "Sub": ("a", "b"), "Mul": ("a", "b"), "Div": ("a", "b"), "Mod": ("a", "b"),
                "FloorDiv": ("a", "b"), "FloorMod": ("a", "b"), "Min": ("a", "b"), "Max": ("a", "b"),
                "EQ": ("a", "b"), "NE": ("a", "b"), "LT": ("a", "b"), "LE": ("a", "b"), "GT": ("a", "b"),
                "GE": ("a", "b"), "And": ("a", "b"), "Or": ("a", "b"), "Not": ("a",), "Cast": ("value",),
                "Select": ("condition", "true_value", "false_value"), "IntImm": (), "FloatImm": (), "Var": ()}

_EXPR_MODULES = ("tvm.ir.prim.expr", "tvm.ir.expr")  # TIR's expressions and variables (ExprRV), not Relax's


def _check_value(v, depth: int = 0) -> None:
    """Values an instruction may hold: numbers, identifiers, RVs, index arithmetic, index maps."""
    from tvm.s_tir.schedule import LoopRV, SBlockRV
    from tvm.tirx import IndexMap

    if depth > 32:
        raise ValueError("value nested too deeply")
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
                raise ValueError(f"instruction {i} annotates {key[:60]!r}, which is not on the allow-list "
                                 "(meta_schedule.*, " + ", ".join(sorted(ALLOWED_ANNOTATIONS)) + ")")
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
            raise ValueError(f"instruction {i} annotates {key} with a value that is not a SampleCategorical "
                             "variable of the trace (MetaSchedule's unroll mutator needs one)")
        if key == "meta_schedule.parallel" and (isinstance(value, bool) or not isinstance(value, (int, IntImm))):
            raise ValueError(f"instruction {i} annotates {key} with a value that is not an integer constant "
                             "(MetaSchedule's parallel mutator needs one)")


def _same(a, b) -> bool:
    same = getattr(a, "same_as", None)
    return bool(same and same(b))


def _task_modules(model_bytes: bytes, target) -> list:
    return [t.mod for t in collect_tasks(onnx.load_model_from_string(model_bytes), make_target(target))]


def _match_workloads(wl_lines, task_mods) -> dict[int, int]:
    """workload line index -> task index, for the workloads that are one of the run's tasks."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    hashes = {}
    for ti, mod in enumerate(task_mods):
        hashes.setdefault(int(tvm_ffi.structural_hash(mod)), ti)
    out = {}
    for wi, (_, value) in enumerate(wl_lines):
        try:
            mod = ms.database.Workload.from_json(value).mod
        except Exception:  # noqa: BLE001 - refused when a record uses it
            continue
        ti = hashes.get(int(tvm_ffi.structural_hash(mod)))
        if ti is not None and tvm_ffi.structural_equal(mod, task_mods[ti]):
            out[wi] = ti
    return out


def check_import(model_bytes: bytes, target, workloads: bytes, records: bytes, max_records: int) -> dict:
    """Run in a sandboxed worker. Returns {"errors": [message, ...]} or the database to write:
    {"workloads": [line, ...], "records": [line, ...]} (platform workloads, checked traces only)."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.schedule import Schedule

    try:
        wl_lines, rec_lines = precheck(workloads, records, max_records=max_records)
    except RecordError as exc:
        return {"errors": [str(exc)]}
    task_mods = _task_modules(model_bytes, target)
    matched = _match_workloads(wl_lines, task_mods)
    tgt = make_target(target)
    errors, out_records, used_tasks = [], [], {}
    for n, (wi, body) in rec_lines:
        where = f"Tuning record line {n}"
        ti = matched.get(wi)
        if ti is None:
            errors.append(f"{where}: its workload (workload line {wl_lines[wi][0]}) is not one of this run's "
                          "tasks (no task of the run's model has the same structure)")
            continue
        mod = task_mods[ti]
        try:
            rec = ms.database.TuningRecord.from_json(body, ms.database.Workload(mod))
            check_trace(rec.trace)
            rec.trace.apply_to_schedule(Schedule(mod), remove_postproc=False)
        except Exception as exc:  # noqa: BLE001 - any parse/replay failure refuses the line
            text = str(exc).strip()
            errors.append(f"{where}: {text.splitlines()[-1][:300] if text else type(exc).__name__}")
            continue
        index = used_tasks.setdefault(ti, len(used_tasks))
        clean = ms.database.TuningRecord(rec.trace, ms.database.Workload(mod), None, tgt,
                                         ms.arg_info.ArgInfo.from_prim_func(mod["main"]))
        out_records.append(json.dumps([index, _plain(clean.as_json())]))
    if errors:
        return {"errors": errors}
    workloads_out = [json.dumps(_plain(ms.database.Workload(task_mods[ti]).as_json()))
                     for ti, _ in sorted(used_tasks.items(), key=lambda kv: kv[1])]
    return {"workloads": workloads_out, "records": out_records}

