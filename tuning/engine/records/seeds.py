"""Seeding a run from the record cache, and verifying the seeds on this host.

- :func:`write_seeds`: cache hits become the run's imported seeds (``workdir.write_imported``), which
  the engine builds and measures serially on this host before the search, exactly like user imports
  (``remeasure.measure_imported``): their cached times are dropped, only this host's count. The
  manifest (``SEEDS_FILE``) keeps what verification compares with.
- :func:`verify_seeds` (after the seeds were measured): per task, the seeds' best time on this host
  against the cache's best, allowing for the host's speed now (:func:`host_factor`: a shared machine's
  load moves every seed's time, a bad record only its own; a seed that timed slow is timed once more
  first, :func:`second_look`). Failed or slower: the hit is stale. Verified within ``tolerance`` says
  only that this host runs the record as fast as the cache says, not that the record is any good: what
  a verified task becomes is decided in :mod:`tuning.engine.records.settle`.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from tuning.engine.events import trace_json
from tuning.engine.records.cache_key import trace_digest
from tuning.engine.records.check import RecordError, recheck_output
from tuning.engine.workdir import (
    imported_records,
    record_latency,
    records_by_task,
    write_imported,
)

__all__ = [
    "SEEDS_FILE",
    "VERIFY_FILE",
    "DEFAULT_TOP_K",
    "DEFAULT_TOLERANCE",
    "HOST_FACTOR_MAX",
    "write_seeds",
    "load_manifest",
    "load_verification",
    "host_factor",
    "suspect_seeds",
    "second_look",
    "verify_seeds",
]

log = logging.getLogger(__name__)

SEEDS_FILE = "record_cache_seeds.json"


VERIFY_FILE = "record_cache_verification.json"


DEFAULT_TOP_K = 2  # cached records re-timed per task


DEFAULT_TOLERANCE = 0.10  # a verified hit is at most this much slower than the cache's best


# The host's speed now against when the cache's times were taken (a shared machine's load changes between
# runs): the median measured / cached ratio of this run's seeds, from this many seeds on, counted only
# upwards (a slower host now) and at most HOST_FACTOR_MAX (a record that is that much slower than all the
# others is not load: it does not verify).
HOST_FACTOR_MIN_SEEDS = 3


HOST_FACTOR_MAX = 2.5


def write_seeds(work_dir: str, hits: dict[int, list[dict]], *, tolerance: float = DEFAULT_TOLERANCE) -> int:
    """Make cache hits the run's seeds. ``hits``: task index -> entries (``workload_json``,
    ``record_json``, ``trace_digest``, ``latency_s``, ``workload_hash``, and the cache's ``id`` /
    ``source_run`` / ``source_trials`` / ``source_converged``), at most top-k each. The records go
    through the imported-seed path (built and measured serially on this host before the search, their
    cached times not kept); the manifest (``SEEDS_FILE``) keeps what verification compares with.
    Returns the number of seeds."""
    rec_lines: list[str] = []
    manifest: dict[str, Any] = {"tolerance": float(tolerance), "tasks": {}}
    for task_index, entries in sorted(hits.items()):
        if not entries:
            continue
        for e in entries:
            # the trace only, on the run's own task: no cached time reaches the run (the platform measures
            # the seed here), no stored workload is parsed
            rec_lines.append(json.dumps([int(task_index), [json.loads(e["record_json"])[0], None, None, None]]))
        cache_best = min((float(e["latency_s"]) for e in entries if e.get("latency_s")), default=None)
        trials = [int(e["source_trials"]) for e in entries if e.get("source_trials") is not None]
        # independent runs whose records of this workload agree with the cache's best (within tolerance)
        agreeing = {
            e.get("source_run")
            for e in entries
            if e.get("source_run") is not None
            and cache_best
            and e.get("latency_s")
            and float(e["latency_s"]) <= cache_best * (1 + tolerance)
        }
        manifest["tasks"][str(task_index)] = {
            "workload_hash": entries[0]["workload_hash"],
            "cache_best_s": cache_best,
            "source_trials": max(trials) if trials else None,
            "source_converged": any(bool(e.get("source_converged")) for e in entries),
            "agreeing_runs": len(agreeing),
            "entries": {
                e["trace_digest"]: {
                    "id": e.get("id"),
                    "source_run": e.get("source_run"),
                    "latency_s": e.get("latency_s"),
                }
                for e in entries
            },
        }
    checked = []
    for line in rec_lines:  # checked at the cache's import, and again before a run uses them: one by one
        try:
            checked.extend(recheck_output([line]))
        except RecordError as exc:
            log.warning("a record-cache seed refused: %s", exc)
    if not checked:
        return 0
    write_imported(work_dir, checked)
    Path(os.path.join(work_dir, SEEDS_FILE)).write_text(json.dumps(manifest))
    return len(checked)


def _load_json(path: str) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def load_manifest(work_dir: str) -> dict | None:
    """What :func:`write_seeds` wrote for a seeded run (``SEEDS_FILE``), None when it was not seeded."""
    return _load_json(os.path.join(work_dir, SEEDS_FILE))


def load_verification(work_dir: str) -> dict | None:
    """The verification of a seeded run (``verify_seeds``'s result), None when it was not seeded."""
    return _load_json(os.path.join(work_dir, VERIFY_FILE))


def _measured_seeds(work_dir: str, tasks, database) -> dict[int, dict[str, float | None]]:
    """task index -> {trace digest: this host's serial time (None: failed)} of the measured seeds."""
    seeds = imported_records(work_dir, tasks, measured=True)
    digests = {i: {trace_json(r.trace): trace_digest(trace_json(r.trace)) for r in recs} for i, recs in seeds.items()}
    out: dict[int, dict[str, float | None]] = {i: {dg: None for dg in m.values()} for i, m in digests.items() if m}
    for i, recs in records_by_task(database, tasks).items():
        for rec in recs:
            digest = digests.get(i, {}).get(trace_json(rec.trace))
            if digest is not None:
                out[i][digest] = record_latency(rec)
    return out


def _slower(measured: float | None, cached: float | None, tolerance: float) -> bool:
    """A seed that failed here, or ran slower than its cached time allows (None: an imported entry, no
    platform time yet: only a failure makes it stale)."""
    return measured is None or (cached is not None and measured > float(cached) * (1 + tolerance))


def host_factor(manifest: dict, measured: dict[int, dict[str, float | None]]) -> float:
    """How much slower this host runs the cached records now than when the cache timed them: the median
    of the seeds' measured / cached times over every seeded task (a load change moves them all; one bad
    record moves only its own), at least ``HOST_FACTOR_MIN_SEEDS`` seeds, within [1, HOST_FACTOR_MAX]
    (1: too few seeds to tell, or the host is as fast or faster). Verification allows the cache's times
    this much more before calling a seed slower."""
    ratios = []
    for i, want in manifest.get("tasks", {}).items():
        for digest, value in measured.get(int(i), {}).items():
            cached = (want["entries"].get(digest) or {}).get("latency_s")
            if value is not None and cached:
                ratios.append(float(value) / float(cached))
    if len(ratios) < HOST_FACTOR_MIN_SEEDS:
        return 1.0
    ratios.sort()
    n = len(ratios)
    median = ratios[n // 2] if n % 2 else (ratios[n // 2 - 1] + ratios[n // 2]) / 2
    return min(HOST_FACTOR_MAX, max(1.0, median))


def _allowed(tolerance: float, factor: float) -> float:
    """The tolerance once the host factor is applied: slower than cached x (1 + tolerance) x factor."""
    return (1 + tolerance) * factor - 1


def suspect_seeds(
    manifest: dict, measured: dict[int, dict[str, float | None]], factor: float = 1.0
) -> dict[int, list[str]]:
    """task index -> digests of the seeds that ran but looked slower than their cached time allows (x the
    ``factor`` of :func:`host_factor`) on their first re-time: on a busy host one slow sample is noise as
    often as not, so these are re-timed once more before any verdict (a failure is not re-timed: it is no
    timing noise)."""
    tol = _allowed(float(manifest.get("tolerance", DEFAULT_TOLERANCE)), factor)
    out: dict[int, list[str]] = {}
    for i, want in manifest.get("tasks", {}).items():
        for digest, value in measured.get(int(i), {}).items():
            cached = (want["entries"].get(digest) or {}).get("latency_s")
            if value is not None and _slower(value, cached, tol):
                out.setdefault(int(i), []).append(digest)
    return out


def _task_verdict(
    index: int, name: str, want: dict, measured: dict[str, float | None], tolerance: float, retimed: int = 0
) -> dict:
    best = min((v for v in measured.values() if v is not None), default=None)
    cache_best = want["cache_best_s"]
    verified = best is not None and cache_best is not None and best <= float(cache_best) * (1 + tolerance)
    slow = {
        d: _slower(v, want["entries"][d]["latency_s"], tolerance) for d, v in measured.items() if d in want["entries"]
    }
    stale = [want["entries"][d]["id"] for d, bad in slow.items() if bad]
    # entries this host confirmed (ran within tolerance of their own cached time): their strikes reset
    confirmed = [
        want["entries"][d]["id"]
        for d, bad in slow.items()
        if not bad and want["entries"][d].get("latency_s") is not None
    ]
    winner = min(((v, d) for d, v in measured.items() if v is not None), default=(None, None))[1]
    if verified:
        reason = "verified"
    elif best is None:
        reason = "failed on this host"
    elif cache_best is None:
        reason = "imported records only: measured here, trusted once a run re-measures them serially"
    else:
        reason = f"slower on this host ({best * 1e6:.1f} us vs the cache's best {float(cache_best) * 1e6:.1f} us)"
    return {
        "task_index": index,
        "task_name": name,
        "workload_hash": want["workload_hash"],
        "cache_best_s": cache_best,
        "measured_best_s": best,
        "n_seeds": len(measured),
        "verified": verified,
        "stale_entry_ids": [x for x in stale if x is not None],
        "confirmed_entry_ids": [x for x in confirmed if x is not None],
        "n_retimed": int(retimed),
        "reason": reason,
        "source_run": (want["entries"].get(winner) or next(iter(want["entries"].values())))["source_run"],
    }


def second_look(manifest: dict, measured: dict[int, dict[str, float | None]], second_times) -> dict[int, int]:
    """Time the :func:`suspect_seeds` once more (``second_times(suspects)`` -> {(task index, digest):
    latency or None}) and keep, for each, the faster of its two times, in ``measured``. Returns task
    index -> seeds re-timed."""
    suspects = suspect_seeds(manifest, measured, host_factor(manifest, measured))
    if second_times is None or not suspects:
        return {}
    retimed: dict[int, int] = {}
    for (i, digest), second in second_times(suspects).items():
        if digest not in measured.get(i, {}):
            continue
        retimed[i] = retimed.get(i, 0) + 1
        first = measured[i][digest]
        if second is not None and first is not None:
            measured[i][digest] = min(first, float(second))
    return retimed


def _seed_traces(tasks, database, wanted: dict[int, list[str]]) -> list[tuple[int, str, Any]]:
    """(task index, digest, trace) of the ``wanted`` seeds, read back from the run's database."""
    out, seen = [], set()
    for i, recs in records_by_task(database, tasks).items():
        for rec in recs:
            digest = trace_digest(trace_json(rec.trace))
            if digest in wanted.get(i, ()) and (i, digest) not in seen:
                seen.add((i, digest))
                out.append((i, digest, rec.trace))
    return out


def verify_seeds(work_dir: str, tasks, database, retime=None) -> dict | None:
    """Compare each seeded task's measured seeds (this host, serial) with the cache's best; write and
    return ``{"tolerance", "tasks": [verdict, ...]}`` (``VERIFY_FILE``). None when the run was not seeded.

    ``retime(items)`` (the session's: build and time serially again; ``items`` = [(task index, trace)],
    returns one latency or None each): a seed that looked slower than its cached time is timed once more
    and keeps the faster of its two times (load on a shared host only ever adds time), so one slow
    sample neither fails a verification nor counts against the entry."""
    manifest = load_manifest(work_dir)
    if not manifest:
        return None
    tol = float(manifest.get("tolerance", DEFAULT_TOLERANCE))
    measured = _measured_seeds(work_dir, tasks, database)

    def second_times(suspects: dict[int, list[str]]) -> dict[tuple[int, str], float | None]:
        items = _seed_traces(tasks, database, suspects)
        return dict(zip(((i, d) for i, d, _ in items), retime([(i, trace) for i, _, trace in items])))

    retimed = second_look(manifest, measured, second_times if retime is not None else None)
    factor = host_factor(manifest, measured)
    allowed = _allowed(tol, factor)
    verdicts = [
        _task_verdict(int(i), tasks[int(i)].name, want, measured.get(int(i), {}), allowed, retimed.get(int(i), 0))
        for i, want in sorted(manifest["tasks"].items(), key=lambda kv: int(kv[0]))
        if int(i) < len(tasks)
    ]
    result = {"tolerance": tol, "host_factor": factor, "allowed": allowed, "tasks": verdicts}
    Path(os.path.join(work_dir, VERIFY_FILE)).write_text(json.dumps(result))
    return result
