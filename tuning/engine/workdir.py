"""A run's files in its ``work_dir``: TVM's JSONDatabase (the resumable state), the serially
re-measured ``final/`` database, checked imported records waiting to be measured, and the small
state files a resumed run reads back (round offset, Trimmer's pre-emptions).

TVM is imported inside the functions that open a database: the web processes import this module
(``write_imported``, ``has_imported``), and importing
MetaSchedule costs seconds there.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from common.jsonsafe import json_safe, loads_finite
from tuning.engine.latency import TVM_FAILED_RUN_SECS, is_failed_latency
from tuning.engine.process.sandbox import read_untrusted_file

log = logging.getLogger(__name__)

__all__ = [
    "DB_WORKLOAD",
    "DB_RECORDS",
    "FINAL_DIR",
    "IMPORTED_DIR",
    "IMPORTED_DONE_DIR",
    "IMPORTED_RECORDS",
    "COST_MODEL_FILE",
    "open_json_db",
    "open_database",
    "imported_records",
    "write_imported",
    "has_imported",
    "database_paths",
    "records_by_task",
    "records_in_commit_order",
    "record_latency",
    "load_trimmer_preempted",
    "save_trimmer_state",
    "next_round_offset",
    "save_round_offset",
    "FINAL_ROWS",
    "load_final_rows",
    "save_final_rows",
    "StreamJournal",
    "commit_streamed",
    "has_journal",
    "journal_size",
    "save_journal_settled",
    "journal_settled",
    "save_exhausted",
    "load_exhausted",
]

DB_WORKLOAD = "database_workload.json"
DB_RECORDS = "database_tuning_record.json"
FINAL_DIR = "final"
IMPORTED_DIR = "imported"  # checked, imported records: seeds the platform builds and measures first
IMPORTED_DONE_DIR = "imported_measured"
IMPORTED_RECORDS = "records.jsonl"  # in IMPORTED_DIR: one [task index, [trace, null, null, null]] a line
COST_MODEL_FILE = "cost_model.xgb"
TRIMMER_STATE = "trimmer_state.json"
EXHAUSTED_FILE = "exhausted_tasks.json"  # tasks whose search space ran out (with or without Trimmer)
ROUNDS_FILE = "rounds.txt"
STREAM_JOURNAL = "streamed_records.jsonl"
JOURNAL_SETTLED = "streamed_records.settled.json"  # how much of the journal TVM's database is known to hold
CHECKPOINT_FILE = "compiled_checkpoint.json"  # the model compiled and timed once mid-run (checkpoint)


def _db_paths(work_dir: str, final: bool = False) -> tuple[str, str]:
    d = os.path.join(work_dir, FINAL_DIR) if final else work_dir
    return os.path.join(d, DB_WORKLOAD), os.path.join(d, DB_RECORDS)


def _json_database(path_workload: str, path_tuning_record: str):
    from tvm.s_tir import meta_schedule as ms  # TVM: see the module doc

    return ms.database.JSONDatabase(
        path_workload=path_workload, path_tuning_record=path_tuning_record, allow_missing=True
    )


def open_json_db(work_dir: str, final: bool = False):
    """The run's record database (``final``: the serially re-measured one), created if missing."""
    pw, pr = _db_paths(work_dir, final)
    os.makedirs(os.path.dirname(pw), exist_ok=True)
    return _json_database(pw, pr)


def open_database(work_dir: str, prefer_final: bool = True):
    """The database to compile with: ``work_dir/final`` (the serially
    re-measured top candidates) when present, else the full record database."""
    _, pr = _db_paths(work_dir, final=True)
    if prefer_final and os.path.exists(pr) and os.path.getsize(pr) > 0:
        return open_json_db(work_dir, final=True)
    return open_json_db(work_dir)


def database_paths(work_dir: str) -> dict[str, str]:
    """Paths of the record database files (and the final ones, when written)."""
    pw, pr = _db_paths(work_dir)
    fpw, fpr = _db_paths(work_dir, final=True)
    paths = {"workload": pw, "tuning_record": pr}
    if os.path.exists(fpr):
        paths.update({"final_workload": fpw, "final_tuning_record": fpr})
    return paths


# --------------------------------------------------------------------------- imported records
def write_imported(work_dir: str, record_lines: list[str]) -> None:
    """Store checked imported records (``records.check.recheck_output``'s lines: the index of the run's
    task and the trace) apart from the run's database: they count and seed the search only once the
    platform has built and measured them itself. No workload is stored: the engine pairs each trace with
    its own task module, so nothing an import (or its checker) wrote is parsed as a TVM graph."""
    d = os.path.join(work_dir, IMPORTED_DIR)
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, IMPORTED_RECORDS + ".tmp")
    Path(tmp).write_text("".join(line + "\n" for line in record_lines))
    os.replace(tmp, os.path.join(d, IMPORTED_RECORDS))


def has_imported(work_dir: str) -> bool:
    p = os.path.join(work_dir, IMPORTED_DIR, IMPORTED_RECORDS)
    return os.path.exists(p) and os.path.getsize(p) > 0


def imported_records(work_dir: str, tasks, *, measured: bool = False) -> dict[int, list]:
    """task index -> the imported records of that task (TVM TuningRecords on the task's own module):
    those waiting to be measured, or (``measured``) those the run measured already. A line that names no
    task of the run or does not parse on its task is skipped, with a warning."""
    import logging

    from tvm.s_tir import meta_schedule as ms  # TVM: see the module doc

    path = os.path.join(work_dir, IMPORTED_DONE_DIR if measured else IMPORTED_DIR, IMPORTED_RECORDS)
    out: dict[int, list] = {i: [] for i in range(len(tasks))}
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return out
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            index, body = loads_finite(line)
            if not (type(index) is int and 0 <= index < len(tasks)):
                raise ValueError(f"task index {index!r} is not one of the run's {len(tasks)} tasks")
            out[index].append(ms.database.TuningRecord.from_json(body, ms.database.Workload(tasks[index].mod)))
        except Exception as exc:  # noqa: BLE001 - one unusable line loses that line only
            logging.getLogger(__name__).warning("imported record line %d skipped: %s", n, str(exc)[:300])
    return out


def retire_imported(work_dir: str) -> None:
    """The imported records were measured: keep them aside, never measured again."""
    done = os.path.join(work_dir, IMPORTED_DONE_DIR)
    shutil.rmtree(done, ignore_errors=True)
    os.replace(os.path.join(work_dir, IMPORTED_DIR), done)


# --------------------------------------------------------------------------- records
def _structural_hash(mod) -> int:
    import tvm_ffi  # TVM: see the module doc

    return int(tvm_ffi.structural_hash(mod))


def records_by_task(db, tasks) -> dict[int, list]:
    """Every tuning record of ``db`` grouped by the index of its task (by workload identity)."""
    hashes = {_structural_hash(t.mod): i for i, t in enumerate(tasks)}
    out: dict[int, list] = {i: [] for i in range(len(tasks))}
    for rec in db.get_all_tuning_records():
        i = hashes.get(_structural_hash(rec.workload.mod))
        if i is not None:
            out[i].append(rec)
    return out


def records_in_commit_order(work_dir: str, tasks, *, final: bool = False) -> list[tuple[int, Any]]:
    """(task index, TuningRecord) for every record of the run's database (``final``: the re-measured
    one) in the order TVM committed them: its record file's line order, which is the order the
    candidates were measured in within a task (TVM's joins commit a batch in candidate order). Read-only.
    :func:`records_by_task` cannot give the order: TVM's JSONDatabase hands its records back sorted by
    latency. Records of a workload that is none of ``tasks``, and lines that do not parse (a line cut
    short by a kill), are skipped."""
    from tvm.s_tir import meta_schedule as ms  # TVM: see the module doc

    path_workload, path_records = _db_paths(work_dir, final)
    hashes = {_structural_hash(t.mod): i for i, t in enumerate(tasks)}
    workloads: list[tuple[int | None, Any]] = []  # by the record file's workload index: (task index, Workload)
    with contextlib.suppress(OSError):
        for line in Path(path_workload).read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            try:
                workload = ms.database.Workload.from_json(json.loads(line))
                workloads.append((hashes.get(_structural_hash(workload.mod)), workload))
            except Exception:  # noqa: BLE001 - keeps the indexes of the workloads after it right
                workloads.append((None, None))
    out: list[tuple[int, Any]] = []
    with contextlib.suppress(OSError):
        for line in Path(path_records).read_text(encoding="utf-8").splitlines():
            try:
                index, body = json.loads(line)
                if not (type(index) is int and 0 <= index < len(workloads)):
                    continue
                task, workload = workloads[index]
                if task is not None:
                    out.append((task, ms.database.TuningRecord.from_json(body, workload)))
            except Exception:  # noqa: BLE001 - one unreadable line loses that line only
                continue
    return out


def record_latency(rec) -> float | None:
    """Mean of a record's run times; None when it has none or failed (TVM stores 1e10 s)."""
    if rec.run_secs is None or len(rec.run_secs) == 0:
        return None
    vals = [float(x) for x in rec.run_secs]
    v = sum(vals) / len(vals)
    return None if is_failed_latency(v) else v


# --------------------------------------------------------------------------- resume state
def load_trimmer_preempted(work_dir: str) -> dict[int, int]:
    """Trimmer's pre-empted tasks (index -> trials at pre-emption) of an earlier call."""
    try:
        data = json.loads(Path(os.path.join(work_dir, TRIMMER_STATE)).read_text())
        return {int(k): int(v) for k, v in (data.get("preempted_tasks") or {}).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def save_trimmer_state(work_dir: str, report: dict) -> None:
    with contextlib.suppress(OSError, TypeError, ValueError):
        Path(os.path.join(work_dir, TRIMMER_STATE)).write_text(json.dumps(json_safe(report)))


def load_exhausted(work_dir: str) -> set[int]:
    """Tasks whose search had nothing new to measure in an earlier call on ``work_dir``."""
    try:
        return {int(i) for i in json.loads(Path(os.path.join(work_dir, EXHAUSTED_FILE)).read_text())}
    except (OSError, ValueError, TypeError):
        return set()


def save_exhausted(work_dir: str, tasks: set[int]) -> None:
    """Add ``tasks`` to the run's exhausted tasks (a resumed call keeps the earlier calls')."""
    known = load_exhausted(work_dir)
    if not tasks or tasks <= known:
        return
    with contextlib.suppress(OSError):
        tmp = os.path.join(work_dir, EXHAUSTED_FILE + ".tmp")
        Path(tmp).write_text(json.dumps(sorted(known | {int(i) for i in tasks})))
        os.replace(tmp, os.path.join(work_dir, EXHAUSTED_FILE))


def next_round_offset(work_dir: str) -> int:
    """Round numbers continue across calls on the same ``work_dir`` (also after a call that was
    killed before it saved its offset: the journal holds the rounds it numbered)."""
    try:
        saved = int(Path(os.path.join(work_dir, ROUNDS_FILE)).read_text().strip() or 0)
    except (OSError, ValueError):
        saved = 0
    rounds = [line["round"] for line in _journal_lines(work_dir) if isinstance(line.get("round"), int)]
    return max([saved] + [r + 1 for r in rounds])


def save_round_offset(work_dir: str, value: int) -> None:
    with contextlib.suppress(OSError):
        Path(os.path.join(work_dir, ROUNDS_FILE)).write_text(str(int(value)))


# --------------------------------------------------------------------------- streamed results
class StreamJournal:
    """What the run reported before TVM's database had it, kept where a killed call's successor
    finds it. Results reach the sink as each measurement lands (``callbacks.ProgressStreamer``);
    TVM commits them to its database only at the task's join. A worker killed in between left the
    platform holding results the resumed TVM would not know and would spend its budget on again.
    Each line is appended (and flushed to disk) before the sink hears of it; the next call commits
    the journal's records its database lacks (:func:`commit_streamed`) before counting what is done.

    Lines: ``{"round": r}`` (a round number handed out) and ``{"round": r, "task": i, "record":
    <TuningRecord.as_json()>}`` (a reported candidate; failures carry TVM's 1e10 s)."""

    def __init__(self, work_dir: str, task_mods: list) -> None:
        self.path = os.path.join(work_dir, STREAM_JOURNAL)
        self.task_mods = task_mods
        self._workloads: dict[int, object] = {}

    def _append(self, lines: list[dict]) -> None:
        if not lines:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(line) + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())

    def note_round(self, round_index: int) -> None:
        with contextlib.suppress(OSError):
            self._append([{"round": int(round_index)}])

    def record(self, entries: list[tuple[int, int, Any, list[float]]]) -> None:
        """``entries``: (task index, round, MeasureCandidate, run seconds; empty: failed). Raises
        OSError when the journal cannot be written (the caller then leaves them to the join)."""
        from tvm.s_tir import meta_schedule as ms  # TVM: see the module doc

        from tuning.engine.events import record_json

        lines = []
        for task, rnd, cand, secs in entries:
            if task not in self._workloads:
                self._workloads[task] = ms.database.Workload(self.task_mods[task])
            rec = ms.database.TuningRecord(
                cand.sch.trace,
                self._workloads[task],
                run_secs=[float(x) for x in secs] or [TVM_FAILED_RUN_SECS],
                args_info=list(cand.args_info),
            )
            lines.append({"round": int(rnd), "task": int(task), "record": record_json(rec)})
        self._append(lines)


def _journal_lines(work_dir: str) -> list[dict]:
    """The journal's readable lines (a line cut short by a kill is skipped)."""
    try:
        text = Path(os.path.join(work_dir, STREAM_JOURNAL)).read_text(encoding="utf-8")
    except OSError:
        return []
    out = []
    for raw in text.splitlines():
        with contextlib.suppress(ValueError):
            line = json.loads(raw)
            if isinstance(line, dict):
                out.append(line)
    return out


def has_journal(work_dir: str) -> bool:
    """Whether the run's engine streamed results (the journal exists and is not empty); no TVM."""
    p = os.path.join(work_dir, STREAM_JOURNAL)
    return os.path.exists(p) and os.path.getsize(p) > 0


def journal_size(work_dir: str) -> int:
    """The journal's length in bytes (0: none). It only grows (appends), so an unchanged size is an
    unchanged journal."""
    try:
        return os.path.getsize(os.path.join(work_dir, STREAM_JOURNAL))
    except OSError:
        return 0


def save_journal_settled(work_dir: str, size: int, stored: int | None) -> None:
    """Note that TVM's database holds the first ``size`` bytes of the journal: all of its records
    (``stored`` None) or those among the caller's stored results, ``stored`` of them (the rest were never
    stored and stay out). Lets a sweep over ended runs skip this one without opening TVM. Written whole
    (a rename); a marker that cannot be written only costs the next sweep a TVM open."""
    path = os.path.join(work_dir, JOURNAL_SETTLED)
    with contextlib.suppress(OSError):
        Path(path + ".tmp").write_text(json.dumps({"journal_bytes": int(size), "stored": stored}))
        os.replace(path + ".tmp", path)


def journal_settled(work_dir: str, stored: int) -> bool:
    """Whether TVM's database holds every journal record among the run's ``stored`` results (a count;
    results are only ever added): no journal, or the marker covers the journal as it is now and at
    least that many stored results. No TVM: a file's size and a small JSON file."""
    size = journal_size(work_dir)
    if size == 0:
        return True
    try:
        saved = json.loads(Path(os.path.join(work_dir, JOURNAL_SETTLED)).read_text())
        covered, covered_stored = int(saved["journal_bytes"]), saved.get("stored")
    except (OSError, ValueError, TypeError, KeyError):
        return False
    return covered == size and (covered_stored is None or int(covered_stored) >= stored)


def commit_streamed(work_dir: str, db, tasks, target, only: set[tuple[int, str]] | None = None) -> int:
    """Commit to ``db`` the journal's records it lacks (an earlier call was killed between reporting
    them and TVM's join); returns how many. Records are keyed like the sink's (task, trace).
    ``only``: commit just these (task index, candidate key) pairs (e.g. what the platform stored)."""
    from tvm.s_tir import meta_schedule as ms  # TVM: see the module doc

    from tuning.engine.events import candidate_key, canonical_trace_text

    lines = [line for line in _journal_lines(work_dir) if "record" in line and isinstance(line.get("task"), int)]
    if not lines:
        return 0
    have = {(i, candidate_key(tasks[i].name, r.trace)) for i, recs in records_by_task(db, tasks).items() for r in recs}
    n = 0
    for line in lines:
        i = line["task"]
        if not 0 <= i < len(tasks):
            continue
        try:  # the key from the trace's JSON (as trace_json writes it): no replay for what the db has
            key = (i, candidate_key(tasks[i].name, canonical_trace_text(line["record"][0])))
        except (TypeError, IndexError, KeyError, ValueError):
            continue
        if key in have or (only is not None and key not in only):
            continue
        try:
            workload = db.commit_workload(tasks[i].mod)
            rec = ms.database.TuningRecord.from_json(line["record"], workload)
        except Exception:  # noqa: BLE001 - a record TVM cannot read back is one the join never committed either
            continue
        have.add(key)
        db.commit_tuning_record(
            ms.database.TuningRecord(rec.trace, workload, run_secs=rec.run_secs, target=target, args_info=rec.args_info)
        )
        n += 1
    return n


# --------------------------------------------------------------------------- final re-measure
FINAL_ROWS = "final_remeasure.json"  # the final serial re-measure's rows, and whether they were charged


def load_final_rows(work_dir: str) -> dict | None:
    """The final re-measure an earlier call of this run did (``{"rows", "charged", "n_records"}``: the
    rows, whether the sink took their charge, the database's record count they were chosen from), or None."""
    try:
        with open(os.path.join(work_dir, FINAL_ROWS)) as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or not isinstance(saved.get("rows"), list):
        return None
    return {"rows": saved["rows"], "charged": bool(saved.get("charged")), "n_records": saved.get("n_records")}


def save_final_rows(work_dir: str, saved: dict) -> None:
    """Written whole or not at all (a rename): a killed call leaves the previous state; a full disk: the next
    call re-measures (and charges) again."""
    _write_whole(os.path.join(work_dir, FINAL_ROWS), saved, "the final re-measure")


def load_checkpoint(work_dir: str) -> dict | None:
    """The compiled checkpoint an earlier call of this run took (``checkpoint.take``), or None. Sandboxed
    children may write the work dir (the final compile): the file is read only if it is a regular file, not a
    link, of at most 64 KiB; the caller keeps only the fields it knows (``checkpoint.as_reported``)."""
    try:
        data = read_untrusted_file(os.path.join(work_dir, CHECKPOINT_FILE), max_bytes=64 * 1024, magic=b"{")
        saved = json.loads(data) if data is not None else None
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) else None


def save_checkpoint(work_dir: str, checkpoint: dict) -> None:
    """Written whole or not at all (a rename); a call that cannot write it takes no other (logged)."""
    _write_whole(os.path.join(work_dir, CHECKPOINT_FILE), json_safe(checkpoint), "the compiled checkpoint")


def _write_whole(path: str, value: Any, what: str) -> bool:
    """``value`` as JSON at ``path``, written whole or not at all (a rename); False (logged) when it could not be."""
    try:
        with open(path + ".tmp", "w") as f:
            json.dump(value, f)
        os.replace(path + ".tmp", path)
        return True
    except (OSError, TypeError, ValueError):
        log.exception("could not save %s", what)
        return False
