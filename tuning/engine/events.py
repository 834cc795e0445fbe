"""What the engine reports while it tunes (Django-free data classes + sink protocol)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "TaskInfo",
    "MeasurementRecord",
    "RoundInfo",
    "ProgressInfo",
    "TuningSink",
    "NullSink",
    "ListSink",
    "candidate_key",
    "trace_json",
    "ffi_to_py",
    "canonical_trace_text",
]


@dataclasses.dataclass
class TaskInfo:
    index: int
    name: str
    flops: float
    weight: float


@dataclasses.dataclass
class MeasurementRecord:
    task_index: int
    task_name: str
    round_index: int
    candidate_key: str
    run_secs: list[float]
    build_secs: float | None = None
    run_wall_secs: float | None = None
    error: str | None = None
    worker: str | None = None
    dop: int | None = None
    remeasured_serially: bool = False
    serial_secs: float | None = None
    parallel_secs: float | None = None

    @property
    def latency_s(self) -> float | None:
        if self.error or not self.run_secs:
            return None
        return sum(self.run_secs) / len(self.run_secs)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class RoundInfo:
    round_index: int
    task_index: int
    dop: int
    mean_error: float | None
    n_candidates: int
    n_remeasured: int
    n_failures: int
    dop_after: int | None = None
    wall_secs: float | None = None
    parallel_wall_secs: float | None = None  # of wall_secs: measuring at the round's DOP
    serial_wall_secs: float | None = None  # of wall_secs: the serial re-measures
    # Trimmer's candidate filter: candidates the search generated for this batch, how many of them
    # the filter dropped, and how many it kept that were not sent (measured earlier in the run, or
    # past its trial budget): n_candidates = n_generated - n_filtered - n_not_sent
    n_generated: int | None = None
    n_filtered: int | None = None
    n_not_sent: int | None = None


@dataclasses.dataclass
class ProgressInfo:
    """What is in flight right now: candidates being built, and sent to the runner but not yet
    measured; ``trials_reported``: records reported so far by this call."""

    builds_in_flight: int
    measurements_in_flight: int
    trials_reported: int = 0


@runtime_checkable
class TuningSink(Protocol):
    """Receives tuning progress; called from the tuning thread, between rounds.

    ``on_serial_remeasure(updates)``: after the search, DOPpler's final stage re-measures the top
    share of each task's candidates serially and calls it once (when anything was re-measured)
    with one ``(task_index, candidate_key, serial_secs)`` tuple per candidate built and measured
    again: ``serial_secs`` is the serial latency in seconds, or ``None`` when the build or the
    measurement failed (still a trial spent on the owner's behalf). The keys are those of records
    already passed to ``on_measurements``. A sink without the method is not called (it was added
    after the others).

    ``on_measurements`` is called as candidates are measured, from the tuning thread or from the
    engine's progress thread (never two calls at once), before or after the task's join.
    ``on_progress(info)`` (optional, a :class:`ProgressInfo`): builds and measurements in flight,
    whenever they change. ``on_checkpoint(checkpoint)`` (optional, a dict: :func:`checkpoint.take`'s): the
    model compiled and timed once every task had a record, or why that failed (``error``)."""

    def on_tasks(self, tasks: list[TaskInfo]) -> None: ...

    def on_measurements(self, records: list[MeasurementRecord]) -> None: ...

    def on_round(self, info: RoundInfo) -> None: ...

    def on_serial_remeasure(self, updates: list[tuple[int, str, float | None]]) -> None: ...

    def control(self) -> str | None:
        """``"cancel"`` or ``"pause"`` to stop between rounds; ``"finish"`` to end the search there as if its
        trial budget were spent (the run succeeds and DOPpler's final serial re-measure still runs: a
        caller's wall-time budget); else ``None``."""
        ...


class NullSink:
    def on_tasks(self, tasks):
        pass

    def on_measurements(self, records):
        pass

    def on_round(self, info):
        pass

    def on_serial_remeasure(self, updates):
        pass

    def on_progress(self, info):
        pass

    def on_checkpoint(self, checkpoint):
        pass

    def control(self):
        return None


class ListSink:
    """Collects everything in lists; ``stop_after_records`` / ``command`` let
    tests trigger cancel or pause."""

    def __init__(self, *, stop_after_records: int | None = None, command: str = "cancel"):
        self.tasks: list[TaskInfo] = []
        self.records: list[MeasurementRecord] = []
        self.rounds: list[RoundInfo] = []
        self.serial_remeasures: list[tuple] = []  # (task_index, candidate_key, serial_secs | None)
        self.progress: list[ProgressInfo] = []
        self.checkpoints: list[dict] = []
        self.stop_after_records = stop_after_records
        self.command = command
        self.control_calls = 0
        self._lock = threading.Lock()

    def on_tasks(self, tasks):
        with self._lock:
            self.tasks = list(tasks)

    def on_measurements(self, records):
        with self._lock:
            self.records.extend(records)

    def on_round(self, info):
        with self._lock:
            self.rounds.append(info)

    def on_serial_remeasure(self, updates):
        with self._lock:
            self.serial_remeasures.extend(updates)

    def on_progress(self, info):
        with self._lock:
            self.progress.append(info)

    def on_checkpoint(self, checkpoint):
        with self._lock:
            self.checkpoints.append(checkpoint)

    def control(self):
        self.control_calls += 1
        if self.stop_after_records is not None and len(self.records) >= self.stop_after_records:
            return self.command
        return None


def ffi_to_py(obj: Any) -> Any:
    """TVM FFI containers / scalars -> plain JSON-able Python values."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (list, tuple)):
        return [ffi_to_py(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): ffi_to_py(v) for k, v in obj.items()}
    typename = type(obj).__name__
    if (
        typename in ("Array", "List", "Tuple")
        or hasattr(obj, "__len__")
        and hasattr(obj, "__getitem__")
        and not hasattr(obj, "keys")
    ):
        try:
            return [ffi_to_py(x) for x in obj]
        except TypeError:
            pass
    if hasattr(obj, "items"):
        return {str(k): ffi_to_py(v) for k, v in obj.items()}
    if hasattr(obj, "value"):
        return ffi_to_py(obj.value)
    if typename == "IndexMap":
        # a TransformLayout input (MetaSchedule's RewriteLayout): TVM's database writes it as its
        # JSON graph string and reads that back, so the same text keeps a trace loadable and its key stable
        import tvm

        return tvm.ir.save_json(obj)
    return str(obj)


def record_json(record) -> list:
    """A ``TuningRecord`` as the plain JSON TVM's database writes (``TuningRecord.from_json`` reads it).
    Not ``record.as_json()``: its converter refuses the IndexMap of a layout-rewritten schedule."""
    from tvm.s_tir.meta_schedule import _ffi_api

    return ffi_to_py(_ffi_api.TuningRecordAsJSON(record))


def trace_json(trace) -> str:
    """Canonical JSON text of a ``tvm.s_tir.schedule.Trace`` (with decisions)."""
    return canonical_trace_text(ffi_to_py(trace.as_json()))


def canonical_trace_text(trace_obj) -> str:
    """:func:`trace_json` of a trace already in JSON form (e.g. a stored record's first element, a journal
    line's): one text for a trace and for its round trip through TVM's database.

    A bool among an instruction's inputs is written as its integer. TVM's database file writes ``true``
    as ``1`` and its replay keeps an input as it was read, so RewriteLayout's ``Annotate(block,
    "meta_schedule.layout_rewrite_preproc", True)`` comes back from the file as ``Annotate(block, 1)``:
    without this, every layout-rewritten record re-read from disk had another key than the one the sink
    and the journal gave it. Attrs are left as they are (the replay rebuilds them: Split's ``[true,
    false]`` survives), so a trace with no bool input keeps the text it always had."""
    return json.dumps(_bool_inputs_as_ints(trace_obj), sort_keys=True, separators=(",", ":"))


def _bool_inputs_as_ints(trace_obj: Any) -> Any:
    """``[instructions, decisions]`` with every bool in an instruction's inputs (nested lists included)
    made an int; anything not shaped like a trace is returned as it is."""
    if not (isinstance(trace_obj, list) and trace_obj and isinstance(trace_obj[0], list)):
        return trace_obj
    insts = [
        [inst[0], _ints_for_bools(inst[1]), *inst[2:]]
        if isinstance(inst, list) and len(inst) >= 2 and isinstance(inst[1], list)
        else inst
        for inst in trace_obj[0]
    ]
    return [insts, *trace_obj[1:]]


def _ints_for_bools(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, list):
        return [_ints_for_bools(v) for v in value]
    return value


def candidate_key(task_name: str, trace_or_json) -> str:
    """Stable id of a candidate: sha1(task name + :func:`canonical_trace_text` of its schedule trace).
    ``trace_or_json``: a ``Trace``, or text :func:`canonical_trace_text` (or :func:`trace_json`) wrote."""
    text = trace_or_json if isinstance(trace_or_json, str) else trace_json(trace_or_json)
    return hashlib.sha1((task_name + "\n" + text).encode()).hexdigest()
