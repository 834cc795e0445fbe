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
  MetaSchedule does (``check_replay.check_loops``: a fully unrolled loop nest builds for minutes).

What is kept is the trace only, with the index of the run's task it schedules: no workload (the
engine pairs each trace with its own task module), no target or argument info (the run's), no
``run_secs`` (the platform measures imported candidates itself before they count). Numbers are
finite (``NaN``/``Infinity`` are refused: TVM's database cannot load them back), and unroll steps are
at most :data:`MAX_UNROLL_STEP` (a step of 2**31 builds for minutes and gigabytes).
This module is pure Python (no TVM: the web process runs :func:`precheck` on an upload): :func:`precheck`
bounds the input and checks each trace's JSON as :func:`check_trace_json` does; :func:`recheck_output`
(in the parent) checks what the sandboxed TVM checker returns as if it were hostile too and returns the
lines to write. The checks that parse with TVM and replay (``check_import``) are in
:mod:`tuning.engine.records.check_replay`: they run in a sandboxed worker (``procpool``), since TVM's
JSON loaders are C++ fed with hostile input.
"""

from __future__ import annotations

import base64
import json
import math
import re
from typing import Any

from common.jsonsafe import NonFiniteNumber, loads_finite

__all__ = [
    "ALLOWED_KINDS",
    "ALLOWED_ANNOTATIONS",
    "RecordError",
    "precheck",
    "annotation_allowed",
    "trace_only",
    "recheck_output",
    "check_trace_json",
    "MAX_UNROLL_STEP",
]

ALLOWED_KINDS = frozenset(
    {
        "GetSBlock",
        "GetLoops",
        "GetChildBlocks",
        "GetProducers",
        "GetConsumers",
        "GetOutputBlocks",
        "SamplePerfectTile",
        "SamplePartitionedTile",
        "SampleCategorical",
        "SampleComputeLocation",
        "Split",
        "Fuse",
        "Reorder",
        "AddUnitLoop",
        "Parallel",
        "Vectorize",
        "Bind",
        "Unroll",
        "CacheRead",
        "CacheWrite",
        "ReindexCacheRead",
        "ReindexCacheWrite",
        "CacheInplace",
        "CacheIndex",
        "ReIndex",
        "ComputeAt",
        "ReverseComputeAt",
        "ComputeInline",
        "ReverseComputeInline",
        "DecomposeReduction",
        "DecomposePadding",
        "RFactor",
        "StorageAlign",
        "SetScope",
        "SetAxisSeparator",
        "Blockize",
        "Tensorize",
        "Annotate",
        "Unannotate",
        "TransformLayout",
        "TransformBlockLayout",
        "PadEinsum",
        "RollingBuffer",
        "EnterPostproc",
    }
)
# Annotation keys MetaSchedule's llvm and cuda schedule rules / postprocessors write besides
# meta_schedule.* (RewriteParallelVectorizeUnroll, MultiLevelTiling*, software pipelining).
ALLOWED_ANNOTATIONS = frozenset(
    {
        "pragma_auto_unroll_max_step",
        "pragma_unroll_explicit",
        "software_pipeline_stage",
        "software_pipeline_order",
        "software_pipeline_async_stages",
        "warp_execution",
        "double_buffer_scope",
    }
)
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
    out: list[tuple[int, Any]] = []
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
            raise RecordError(
                where,
                f"the module carries a {str(kind)[:40]!r} node (a task module names no target; the run's own is used)",
            )


def precheck(workloads: bytes, records: bytes, *, max_records: int) -> tuple[list, list]:
    """Shape and size of the two files, without TVM: [(line, value)] of workloads and records."""
    wl = _lines(
        workloads,
        "Workload",
        MAX_WORKLOAD_LINE,
        MAX_WORKLOADS,
        f"more than {MAX_WORKLOADS} workloads (a run has far fewer tasks)",
    )
    recs = _lines(
        records,
        "Tuning record",
        MAX_RECORD_LINE,
        max_records,
        f"more tuning records than this run's budget of {max_records} trials (each imported record "
        "is measured as one trial)",
    )
    if not wl or not recs:
        raise RecordError("Import", "both the workload file and the tuning-record file must be non-empty")
    for n, rec in recs:
        where = f"Tuning record line {n}"
        if not (isinstance(rec, list) and len(rec) == 2 and type(rec[0]) is int and 0 <= rec[0] < len(wl)):
            raise RecordError(where, "expected [workload_index, record] with a valid workload index")
        body = rec[1]
        if not (
            isinstance(body, list)
            and body
            and isinstance(body[0], list)
            and len(body[0]) == 2
            and isinstance(body[0][0], list)
        ):
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
INDEX_MAP_NODES = frozenset(
    {
        "None",
        "int",
        "ffi.String",
        "ffi.Array",
        "ir.PrimType",
        "ir.Var",
        "ir.IntImm",
        "tirx.IndexMap",
        "prim.Cast",
        "prim.Add",
        "prim.Sub",
        "prim.Mul",
        "prim.FloorDiv",
        "prim.FloorMod",
        "prim.Min",
        "prim.Max",
    }
)
INDEX_MAP_FIELDS = frozenset(
    {"span", "ty", "value", "name", "a", "b", "dtype", "initial_indices", "final_indices", "inverse_index_map"}
)
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
    if not (
        isinstance(graph, dict)
        and set(graph) <= {"root_index", "nodes", "metadata"}
        and isinstance(graph.get("nodes"), list)
        and 0 < len(graph["nodes"]) <= MAX_INDEX_MAP_NODES
    ):
        raise ValueError(f"an index map is not a JSON graph of at most {MAX_INDEX_MAP_NODES} nodes")
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
    if not (isinstance(trace, list) and len(trace) == 2 and isinstance(trace[0], list) and isinstance(trace[1], list)):
        raise ValueError("expected a trace [instructions, decisions]")
    categorical: dict[str, list] = {}  # output RV name -> its SampleCategorical's candidates
    defined: set = set()
    for i, inst in enumerate(trace[0]):
        if not (
            isinstance(inst, list)
            and len(inst) == 4
            and isinstance(inst[0], str)
            and all(isinstance(x, list) for x in inst[1:])
        ):
            raise ValueError(f"instruction {i} is not [kind, inputs, attrs, outputs]")
        kind, inputs, attrs, outputs = inst
        if kind not in ALLOWED_KINDS:
            raise ValueError(f"instruction {i} ({kind[:60]!r}) is not one of MetaSchedule's own")
        key = None
        if kind == "Annotate":  # (Unannotate only removes one: MetaSchedule's own traces unannotate schedule_rule)
            key = _unquoted(attrs[0]) if attrs and isinstance(attrs[0], str) else None
            if key is None or not annotation_allowed(key):
                raise ValueError(
                    f"instruction {i} annotates {str(key)[:60]!r}, which is not on the allow-list "
                    "(meta_schedule.*, " + ", ".join(sorted(ALLOWED_ANNOTATIONS)) + ")"
                )
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
                raise ValueError(
                    f"instruction {i} unrolls by more than {MAX_UNROLL_STEP} steps (or not by an "
                    "integer): MetaSchedule's largest step is 1024"
                )
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
        if not (
            isinstance(value, list)
            and len(value) == 2
            and type(value[0]) is int
            and 0 <= value[0] < MAX_TASKS
            and isinstance(value[1], list)
            and len(value[1]) == 4
        ):
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


def trace_only(body: list) -> list:
    """A record ``[trace, run_secs, target, args_info]`` with its trace only: TVM would build the record's own
    target from whatever attributes it carries (``cl-opt``: LLVM options), and the platform keeps none of the
    three anyway (the run's target, its own measurements)."""
    return [body[0], None, None, None]
