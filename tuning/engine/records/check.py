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
- it replays on the task's module, and the program it gives unrolls and vectorizes no more than
  MetaSchedule does (:func:`check_loops`: a fully unrolled loop nest builds for minutes).

What is kept is the trace only, with the index of the run's task it schedules: no workload (the
engine pairs each trace with its own task module), no target or argument info (the run's), no
``run_secs`` (the platform measures imported candidates itself before they count). Numbers are
finite (``NaN``/``Infinity`` are refused: TVM's database cannot load them back), and unroll steps are
at most :data:`MAX_UNROLL_STEP` (a step of 2**31 builds for minutes and gigabytes).
:func:`precheck` is pure Python (no TVM) and bounds the input, and checks each trace's JSON as
:func:`check_trace_json` does; :func:`check_import` parses with TVM and must run in a sandboxed worker
(``procpool``), since TVM's JSON loaders are C++ fed with hostile input; :func:`recheck_output`
(pure Python, in the parent) checks what that worker returns as if it were hostile too and returns
the lines to write. TVM is imported inside the functions that parse: the web process runs
:func:`precheck` on an upload without importing it.
"""

from __future__ import annotations

import base64
import json
import math
import re
from typing import Any

import onnx

from common.jsonsafe import NonFiniteNumber, loads_finite
from tuning.engine.compile.pipeline import make_target
from tuning.engine.compile.workloads import collect_tasks
from tuning.engine.events import record_json

__all__ = ["ALLOWED_KINDS", "ALLOWED_ANNOTATIONS", "RecordError", "precheck", "check_import", "annotation_allowed",
           "trace_only", "recheck_output", "check_trace_json", "check_and_replay", "check_loops", "MAX_UNROLL_STEP"]

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
MAX_TASKS = 10_000  # a checked record's task index is below this (a run has far fewer tasks)
MAX_DEPTH = 32  # nesting of a trace's JSON (real ones: 4-6)
# MetaSchedule's largest unroll step (its llvm rule samples 0/16/64/512, cuda's up to 1024); an unroll
# step is the budget of statements the unroller may emit, so 2**31 builds for minutes and gigabytes
MAX_UNROLL_STEP = 1024
UNROLL_KEYS = ("meta_schedule.unroll_explicit", "meta_schedule.unroll_implicit", "pragma_auto_unroll_max_step")
# The same bound for explicit Unroll instructions: the product of the extents of nested unrolled loops
# (how many copies of their body the compiler emits). A fully unrolled 32**3 matmul built for 147 s.
MAX_UNROLLED_EXTENT = MAX_UNROLL_STEP
# MetaSchedule vectorizes at most 64 lanes (llvm's max_vectorize_extent; cuda's cooperative fetch: 4);
# a 4096-lane vector built for more than 200 s.
MAX_VECTOR_LANES = 64


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
            out.append((n, loads_finite(line)))
        except json.JSONDecodeError as exc:
            raise RecordError(f"{what} line {n}", f"not JSON ({exc})") from None
        except NonFiniteNumber as exc:
            raise RecordError(f"{what} line {n}", str(exc)) from None
        except RecursionError:  # json's C scanner recurses per nesting level: [[[[...]]]] overflows
            raise RecordError(f"{what} line {n}", "JSON nested too deeply") from None
        except ValueError as exc:  # an integer past sys.get_int_max_str_digits() (not a JSONDecodeError)
            raise RecordError(f"{what} line {n}", f"not acceptable JSON ({str(exc)[:80]})") from None
    return out


def _check_workload_graph(n: int, value) -> None:
    """A workload line is ``[structural hash, base64 of TVM's JSON graph]`` (an 8-byte length, then the
    JSON). The graph of a task module names no target: a ``target.*`` node would be built by TVM from
    attributes nobody checked (``cl-opt``, ``mattr``: LLVM options), so such a line is refused before TVM
    loads it."""
    where = f"Workload line {n}"
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(x, str) for x in value)):
        raise RecordError(where, "expected [structural hash, module] as TVM writes a workload")
    try:
        raw = base64.b64decode(value[1], validate=True)
        graph = loads_finite(raw[8:].decode()) if int.from_bytes(raw[:8], "little") == len(raw) - 8 else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        graph = None
    if not (isinstance(graph, dict) and isinstance(graph.get("nodes"), list)):
        raise RecordError(where, "the module is not TVM's encoding of a JSON graph")
    for node in graph["nodes"]:
        kind = node.get("type") if isinstance(node, dict) else None
        if not isinstance(kind, str) or kind.startswith("target."):
            raise RecordError(where, f"the module carries a {str(kind)[:40]!r} node (a task module names no "
                                     "target; the run's own is used)")


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
        try:
            check_trace_json(body[0])
        except ValueError as exc:
            raise RecordError(where, str(exc)) from None
    for n, value in wl:
        _check_workload_graph(n, value)
    return wl, recs


def _unquoted(text: str) -> str:
    """A string input of a trace without the quotes TVM's trace JSON puts around it (to tell it from an
    RV name); one layer only."""
    return text[1:-1] if len(text) > 2 and text[0] == text[-1] == '"' else text


def _check_plain(value, depth: int = 0) -> None:
    """Every string a plain name (one layer of quotes allowed), every number finite, nesting bounded."""
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    if isinstance(value, str):
        text = _unquoted(value)
        if not IDENTIFIER.fullmatch(text):
            raise ValueError(f"string {text[:60]!r} is not a plain name (code and paths are refused)")
        if text.startswith("pragma_") and not annotation_allowed(text):
            raise ValueError(f"annotation {text[:60]!r} is not on the allow-list")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value} is not a finite number")
    elif isinstance(value, list):
        for item in value:
            _check_plain(item, depth + 1)
    elif not (value is None or isinstance(value, (bool, int))):
        raise ValueError(f"a {type(value).__name__} is not allowed in a trace")


def _unroll_step_ok(step) -> bool:
    return type(step) is int and 0 <= step <= MAX_UNROLL_STEP


# RewriteLayout's TransformLayout carries its IndexMap as TVM's JSON graph text: node kinds an index map
# of plain integer arithmetic is made of, and nothing else (no function, no buffer, no string of code)
INDEX_MAP_NODES = frozenset({
    "None", "int", "ffi.String", "ffi.Array", "ir.PrimType", "ir.Var", "ir.IntImm", "tirx.IndexMap",
    "prim.Cast", "prim.Add", "prim.Sub", "prim.Mul", "prim.FloorDiv", "prim.FloorMod", "prim.Min", "prim.Max",
})
INDEX_MAP_FIELDS = frozenset({"span", "ty", "value", "name", "a", "b", "dtype", "initial_indices",
                              "final_indices", "inverse_index_map"})
MAX_INDEX_MAP_NODES = 4096


def check_index_map_json(text) -> None:
    """Pure-Python check of a TransformLayout's IndexMap as TVM's JSON graph writes it: known keys, node
    kinds of integer index arithmetic only (:data:`INDEX_MAP_NODES`), node references in range, every
    string a plain name. Raises ValueError naming the first problem."""
    if not isinstance(text, str):
        raise ValueError("an index map is not JSON text")
    try:
        graph = loads_finite(text)
    except (ValueError, NonFiniteNumber, RecursionError):
        raise ValueError("an index map is not finite JSON") from None
    if not (isinstance(graph, dict) and set(graph) <= {"root_index", "nodes", "metadata"}
            and isinstance(graph.get("nodes"), list) and 0 < len(graph["nodes"]) <= MAX_INDEX_MAP_NODES):
        raise ValueError("an index map is not a JSON graph of at most "
                         f"{MAX_INDEX_MAP_NODES} nodes")
    n = len(graph["nodes"])

    def ref(value) -> None:
        if type(value) is not int or not 0 <= value < n:
            raise ValueError("an index map node refers outside the graph")

    if type(graph.get("root_index")) is not int or not 0 <= graph["root_index"] < n:
        raise ValueError("an index map's root is outside the graph")
    if graph["nodes"][graph["root_index"]].get("type") != "tirx.IndexMap":
        raise ValueError("an index map's root is not an IndexMap")
    _check_plain(list((graph.get("metadata") or {}).keys()))
    for node in graph["nodes"]:
        if not (isinstance(node, dict) and set(node) <= {"type", "data"}):
            raise ValueError("an index map node is not {type, data}")
        kind, data = node.get("type"), node.get("data")
        if kind not in INDEX_MAP_NODES:
            raise ValueError(f"an index map node of kind {str(kind)[:60]!r} is not index arithmetic")
        if kind == "int":
            if type(data) is not int:
                raise ValueError("an index map integer is not an integer")
        elif kind == "ffi.String":
            _check_plain(data)
        elif kind == "ffi.Array":
            if not isinstance(data, list):
                raise ValueError("an index map array is not a list")
            for item in data:
                ref(item)
        elif data is not None:
            if not (isinstance(data, dict) and set(data) <= INDEX_MAP_FIELDS):
                raise ValueError(f"an index map {kind} node has unknown fields")
            for key, value in data.items():
                if key == "dtype":
                    _check_plain(value)
                elif key != "span" or value != 0:
                    ref(value)


def _without_index_map(inst: list) -> list:
    """A TransformLayout instruction with its IndexMap input checked (:func:`check_index_map_json`) and
    replaced by a placeholder name, so the plain-name rule applies to the rest."""
    inputs = list(inst[1])
    if len(inputs) >= 2:
        check_index_map_json(inputs[1])
        inputs[1] = "index_map"
    return [inst[0], inputs, inst[2], inst[3]]


def check_trace_json(trace) -> None:
    """Pure-Python check of a trace as TVM's JSON writes it (``[instructions, decisions]``, an instruction
    ``[kind, inputs, attrs, outputs]``): MetaSchedule's own kinds and annotation keys, plain names and
    finite numbers only, unroll steps at most ``MAX_UNROLL_STEP`` (literal, or every candidate of the
    ``SampleCategorical`` that samples them). Raises ValueError naming the first problem."""
    if not (isinstance(trace, list) and len(trace) == 2 and isinstance(trace[0], list)
            and isinstance(trace[1], list)):
        raise ValueError("expected a trace [instructions, decisions]")
    categorical: dict[str, list] = {}  # output RV name -> its SampleCategorical's candidates
    defined: set = set()
    for i, inst in enumerate(trace[0]):
        if not (isinstance(inst, list) and len(inst) == 4 and isinstance(inst[0], str)
                and all(isinstance(x, list) for x in inst[1:])):
            raise ValueError(f"instruction {i} is not [kind, inputs, attrs, outputs]")
        kind, inputs, attrs, outputs = inst
        if kind not in ALLOWED_KINDS:
            raise ValueError(f"instruction {i} ({kind[:60]!r}) is not one of MetaSchedule's own")
        key = None
        if kind == "Annotate":  # (Unannotate only removes one: MetaSchedule's own traces unannotate schedule_rule)
            key = _unquoted(attrs[0]) if attrs and isinstance(attrs[0], str) else None
            if key is None or not annotation_allowed(key):
                raise ValueError(f"instruction {i} annotates {str(key)[:60]!r}, which is not on the allow-list "
                                 "(meta_schedule.*, " + ", ".join(sorted(ALLOWED_ANNOTATIONS)) + ")")
        try:
            _check_plain(_without_index_map(inst) if kind == "TransformLayout" else inst)
        except ValueError as exc:
            raise ValueError(f"instruction {i} ({kind}): {exc}") from None
        for name in outputs:  # TVM writes each RV once; a redefined name could launder an unroll step
            if name in defined:
                raise ValueError(f"instruction {i} redefines {str(name)[:60]!r}")
            defined.add(name)
        if kind == "SampleCategorical" and attrs and isinstance(attrs[0], list):
            for name in outputs:
                categorical[str(name)] = attrs[0]
        if kind == "Annotate" and key in UNROLL_KEYS and len(inputs) == 2:
            value = inputs[1]
            steps = categorical.get(value, [value]) if isinstance(value, str) else [value]
            if not all(_unroll_step_ok(x) for x in steps):
                raise ValueError(f"instruction {i} unrolls by more than {MAX_UNROLL_STEP} steps (or not by an "
                                 "integer): MetaSchedule's largest step is 1024")
    for d in trace[1]:
        if not (isinstance(d, list) and len(d) == 2 and type(d[0]) is int and 0 <= d[0] < len(trace[0])):
            raise ValueError("a decision does not name an instruction of the trace")
        try:
            _check_plain(d[1], 2)
        except ValueError as exc:
            raise ValueError(f"decision of instruction {d[0]}: {exc}") from None


def recheck_output(record_lines: list[str]) -> list[str]:
    """Plain-Python check, in the parent, of the records the TVM checker returned: it parsed hostile
    input in C++, so what it hands back is not trusted either. Each must be ``[task index, [trace, null,
    null, null]]`` (no latency, target or argument info kept) with a trace that passes
    :func:`check_trace_json`. Returns the lines to write, re-serialized from what was checked (so no
    parser differential separates the two). Raises RecordError."""
    if not isinstance(record_lines, list) or not record_lines:
        raise RecordError("Checked import", "the checker returned no records")
    out = []
    for n, line in enumerate(record_lines, 1):
        where = f"Checked record {n}"
        try:
            value = loads_finite(line) if isinstance(line, str) else None
        except RecursionError:
            raise RecordError(where, "the checker returned a record nested too deeply") from None
        except ValueError:
            raise RecordError(where, "the checker returned a malformed record") from None
        if not (isinstance(value, list) and len(value) == 2 and type(value[0]) is int
                and 0 <= value[0] < MAX_TASKS and isinstance(value[1], list) and len(value[1]) == 4):
            raise RecordError(where, "the checker returned a malformed record")
        index, body = value
        if body[1:] != [None, None, None]:
            raise RecordError(where, "the checker returned a record with a latency, a target or argument info")
        try:
            check_trace_json(body[0])
        except RecursionError:
            raise RecordError(where, "the checker returned a record nested too deeply") from None
        except ValueError as exc:
            raise RecordError(where, f"the checker returned a refused trace: {exc}") from None
        out.append(json.dumps([index, [body[0], None, None, None]]))
    return out


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
                raise ValueError(f"it unrolls loops {unrolled} times over (at most {MAX_UNROLLED_EXTENT}: "
                                 "such a candidate builds for minutes)")
        if stmt.kind == ForKind.VECTORIZED and (extent is None or extent > MAX_VECTOR_LANES):
            raise ValueError(f"it vectorizes a loop of {extent if extent else 'unknown'} lanes (at most "
                             f"{MAX_VECTOR_LANES}, MetaSchedule's largest)")
    for field in _STMT_CHILDREN:
        child = getattr(stmt, field, None)
        if child is None:
            continue
        for item in (child if isinstance(child, (list, tuple)) or type(child).__name__ == "Array" else [child]):
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


def trace_only(body: list) -> list:
    """A record ``[trace, run_secs, target, args_info]`` with its trace only: TVM would build the record's own
    target from whatever attributes it carries (``cl-opt``: LLVM options), and the platform keeps none of the
    three anyway (the run's target, its own measurements)."""
    return [body[0], None, None, None]


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
            errors.append(f"{where}: its workload (workload line {wl_lines[wi][0]}) is not one of this run's "
                          "tasks (no task of the run's model has the same structure)")
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

