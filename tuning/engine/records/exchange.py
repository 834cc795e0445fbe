"""Moving records in and out of the record cache as standard TVM JSON databases, engine side.

- :func:`export_lines`: entries as a TVM JSON database, with the platform's serial run times;
- :func:`check_cache_import`: a staff import, checked as a run's import is (``records.check`` and
  ``records.check_replay``) against the records' own workloads, in a sandboxed worker;
  :func:`recheck_cache_entries` checks what that worker returns, in the parent, as hostile input.

TVM is imported inside the functions that need it.
"""

from __future__ import annotations

import json
import re

from common.jsonsafe import loads_finite
from tuning.engine.compile.target_schema import target_kind
from tuning.engine.events import ffi_to_py, record_json, trace_json
from tuning.engine.measuring.timer import choose_evaluator
from tuning.engine.records.cache_key import cache_target_key, structural_hash, trace_digest
from tuning.engine.records.check import (
    MAX_RECORD_LINE,
    MAX_WORKLOAD_LINE,
    RecordError,
    check_trace_json,
    precheck,
    trace_only,
)

__all__ = ["export_lines", "recheck_cache_entries", "check_cache_import"]


def export_lines(entries: list[dict]) -> tuple[list[str], list[str]]:
    """Entries as a standard TVM JSON database (workload file lines, tuning-record file lines), with the
    platform's serial run times."""
    wl_index: dict[str, int] = {}
    wl_lines: list[str] = []
    rec_lines: list[str] = []
    for e in entries:
        if e["workload_hash"] not in wl_index:
            wl_index[e["workload_hash"]] = len(wl_lines)
            wl_lines.append(e["workload_json"])
        body = json.loads(e["record_json"])
        body[1] = [float(x) for x in e["run_secs"]]
        rec_lines.append(json.dumps([wl_index[e["workload_hash"]], body]))
    return wl_lines, rec_lines


def recheck_cache_entries(entries: list[dict]) -> None:
    """Plain-Python check, in the parent, of the entries :func:`check_cache_import`'s sandboxed worker
    returned (it parsed hostile input in C++: trust nothing it hands back): each record's trace passes
    ``records.check.check_trace_json``, it holds no run times, its workload is strict JSON, and the keys the
    cache indexes by are what the platform writes. Raises RecordError."""
    for n, e in enumerate(entries, 1):
        where = f"Checked cache entry {n}"
        try:
            if not isinstance(e, dict):
                raise ValueError("not an entry")
            rec, wl = e.get("record_json"), e.get("workload_json")
            if not (
                isinstance(rec, str)
                and len(rec) <= MAX_RECORD_LINE
                and isinstance(wl, str)
                and len(wl) <= MAX_WORKLOAD_LINE
            ):
                raise ValueError("record or workload missing or too long")
            body = loads_finite(rec)
            if not (isinstance(body, list) and len(body) == 4 and body[1] is None):
                raise ValueError("not a record without run times")
            check_trace_json(body[0])
            workload = loads_finite(wl)  # TVM's Workload JSON: [structural hash, base64 of the module]
            if not (isinstance(workload, list) and len(workload) == 2 and all(isinstance(x, str) for x in workload)):
                raise ValueError("the workload is not TVM's [hash, module] pair")
            if not (isinstance(e.get("workload_hash"), str) and re.fullmatch(r"-?[0-9]{1,24}", e["workload_hash"])):
                raise ValueError("workload_hash is not a structural hash")
            if not (isinstance(e.get("trace_digest"), str) and re.fullmatch(r"[0-9a-f]{40}", e["trace_digest"])):
                raise ValueError("trace_digest is not a sha1 digest")
            if e.get("run_secs") or e.get("latency_s") is not None or not isinstance(e.get("task_name"), str):
                raise ValueError("an imported entry carries times, or no task name")
        except RecursionError:
            raise RecordError(where, "the checker returned an entry nested too deeply") from None
        except ValueError as exc:
            raise RecordError(where, f"the checker returned a refused entry: {exc}") from None


def check_cache_import(workloads: bytes, records: bytes, target, max_records: int) -> dict:
    """A staff import into the cache, checked as a run's import is (``records.check``: bounds, MetaSchedule's
    own instructions and annotations, plain names, replay) against the records' own workloads (a cache
    has no model). Run in a sandboxed worker. Returns ``{"errors": [...]}`` or ``{"entries": [...],
    "target_key": ...}``: entries without run times, ``latency_s`` None: untrusted until a run measures them,
    under the key runs of ``target`` look them up with (this engine's pipeline for it, and the timing
    ``timer.choose_evaluator`` gives its kind: cold on CPUs; a run re-times its seeds anyway)."""
    from tvm.s_tir import meta_schedule as ms

    from tuning.engine.compile.pipeline import make_target
    from tuning.engine.records.check_replay import check_and_replay

    try:
        wl_lines, rec_lines = precheck(workloads, records, max_records=max_records)
    except RecordError as exc:
        return {"errors": [str(exc)]}
    tgt, errors, out = make_target(target), [], []
    for n, (wi, body) in rec_lines:
        try:
            mod = ms.database.Workload.from_json(wl_lines[wi][1]).mod
            rec = ms.database.TuningRecord.from_json(trace_only(body), ms.database.Workload(mod))
            check_and_replay(rec.trace, mod)
        except Exception as exc:  # noqa: BLE001 - any parse/check/replay failure refuses the line
            text = str(exc).strip()
            errors.append(f"Tuning record line {n}: {text.splitlines()[-1][:300] if text else type(exc).__name__}")
            continue
        clean = ms.database.TuningRecord(
            rec.trace, ms.database.Workload(mod), None, tgt, ms.arg_info.ArgInfo.from_prim_func(mod["main"])
        )
        text = trace_json(rec.trace)
        out.append(
            {
                "task_name": str(mod["main"].attrs.get("global_symbol", "main")) if mod["main"].attrs else "main",
                "workload_hash": structural_hash(mod),
                "workload_json": json.dumps(ffi_to_py(ms.database.Workload(mod).as_json())),
                "record_json": json.dumps(record_json(clean)),
                "trace_digest": trace_digest(text),
                "args_info": ffi_to_py([a.as_json() for a in clean.args_info]),
                "run_secs": [],
                "latency_s": None,
            }
        )
    from tuning.engine.compile.passes import pipeline_key
    from tuning.engine.compile.targets import canonical_key

    if errors:
        return {"errors": errors}
    cold = choose_evaluator(target_kind(target)).config.enable_cpu_cache_flush
    return {
        "entries": out,
        "target_key": cache_target_key(canonical_key(tgt), pipeline_key(target=target), cold_timing=cold),
    }
