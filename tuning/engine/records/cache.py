"""The platform-wide tuning-record cache, engine side (Django-free).

A cache entry is one tuning record the platform measured *serially* itself (the final re-measure in
``work_dir/final``), keyed by

- the workload's structural hash under MetaSchedule's module equality (``"structural"``, what
  ``JSONDatabase`` matches records with: ``tvm_ffi.structural_hash`` of the task's IRModule),
- the run's canonical target key (``targets.canonical_key``: ``mcpu``/``arch`` included) and, when the
  run has one, the graph-pass pipeline key (:func:`cache_target_key` joins them),
- a hardware fingerprint (:func:`hardware_fingerprint`: CPU model and core layout, or GPU name, memory
  and driver),
- the TVM version (:func:`tvm_version`).

What this module does with entries:

- :func:`entries_from_run`: the trusted entries of a finished run, read from its ``final`` database only
  (never from the parallel-measured records, never from imports);
- :func:`write_seeds`: hits become the run's imported seeds (``database.write_imported``), which the
  engine builds and measures serially on this host before the search, exactly like user imports
  (``remeasure.measure_imported``): their cached times are dropped, only this host's count;
- :func:`verify_seeds` (called by the session after the seeds were measured): per task, the seeds' best
  time on this host against the cache's best, allowing for the host's speed now (:func:`host_factor`: a
  shared machine's load moves every seed's time, a bad record only its own; a seed that timed slow is
  timed once more first). Failed or slower: the hit is stale. Verified within ``tolerance`` says only
  that this host runs the record as fast as the cache says, not that the record is any good: a source run
  that spent a few trials on the task leaves a poor record that verifies all the same. So a verified task
  is *settled* (no further tuning, its trials go to the other tasks through Trimmer's share allocation,
  :func:`skip_verified_tasks`) only when its record is a converged result (:func:`convergence`: the
  source's search had plateaued or run out, or two source runs agree); otherwise the task is searched
  on from its seeds, judged by Trimmer's plateau rule from the seed's time once it has had its share of
  this run's budget (:func:`fair_shares`) here;
- :func:`train_cost_model`: one XGBoost cost model (TVM's ``XGBModel``, MetaSchedule's program
  features) trained on entries, saved where ``search`` loads a run's cost model, in the platform's
  data-only format (``cost_model_file``: XGBoost JSON and plain numpy arrays; another team's runs load
  it, so never TVM's pickled one). :func:`place_cost_model` hands a run only a file in that format.

TVM is imported inside the functions that need it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from common.jsonsafe import loads_finite
from tuning.engine.compile.workloads import round_size
from tuning.engine.events import ffi_to_py, record_json, trace_json
from tuning.engine.records.check import (
    MAX_RECORD_LINE,
    MAX_WORKLOAD_LINE,
    RecordError,
    check_trace_json,
    recheck_output,
)
from tuning.engine.records.cost_model_file import (
    CostModelFileError,
    check_cost_model_file,
    data_only,
)
from tuning.engine.trimmer.rules import allocate_trials
from tuning.engine.workdir import (
    COST_MODEL_FILE,
    DB_RECORDS,
    TRIMMER_STATE,
    imported_records,
    load_exhausted,
    open_json_db,
    record_latency,
    records_by_task,
    write_imported,
)

__all__ = ["SEEDS_FILE", "VERIFY_FILE", "DEFAULT_TOP_K", "DEFAULT_TOLERANCE", "tvm_version", "hardware_fingerprint",
           "cache_target_key", "trace_digest", "task_workloads", "entries_from_run", "publish_from_run",
           "write_seeds", "verify_seeds", "host_factor", "source_effort", "convergence", "fair_shares",
           "settle_decisions", "suspect_seeds", "second_look",
           "load_verification", "skip_verified_tasks", "apply_seed_verification", "train_cost_model",
           "place_cost_model", "export_lines", "check_cache_import", "recheck_cache_entries"]

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


# --------------------------------------------------------------------------- the key
def tvm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"apache-tvm {version('apache-tvm')}, tvm-ffi {version('apache-tvm-ffi')}"
    except PackageNotFoundError:
        return "unknown"


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def cpu_fingerprint(cpuinfo: str | None = None, online: str | None = None) -> str:
    """CPU model and core layout: ``"<model> | <sockets>s x <cores>c x <threads/core>t | cpus <online>"``
    from /proc/cpuinfo and /sys (the machine, not this process's affinity)."""
    text = _read("/proc/cpuinfo") if cpuinfo is None else cpuinfo
    model, sockets, cores, siblings = "", set(), 0, 0
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key in ("model name", "Model", "CPU part") and not model:
            model = value
        elif key == "physical id":
            sockets.add(value)
        elif key == "cpu cores":
            cores = int(value or 0)
        elif key == "siblings":
            siblings = int(value or 0)
    online = (_read("/sys/devices/system/cpu/online") if online is None else online).strip()
    tpc = siblings // cores if cores and siblings else 1
    return f"{model or 'unknown cpu'} | {max(1, len(sockets))}s x {cores or '?'}c x {tpc}t | cpus {online or '?'}"


def gpu_fingerprint(device_index: int = 0, nvml: Any = None) -> str:
    """GPU name, memory and driver through NVML (``common.nvml``); ``"unknown gpu"`` without one."""
    from common.nvml import NvmlUnavailable, close_nvml, open_nvml, optional, text

    try:
        nv = open_nvml(nvml)
    except NvmlUnavailable as exc:
        return f"unknown gpu ({exc})"
    try:
        handle = nv.nvmlDeviceGetHandleByIndex(device_index)
        name = text(optional(nv.nvmlDeviceGetName, handle) or "gpu")
        mem = optional(nv.nvmlDeviceGetMemoryInfo, handle)
        driver = text(optional(nv.nvmlSystemGetDriverVersion) or "?")
        mib = int(mem.total) // (1 << 20) if mem is not None else 0
        return f"{name} | {mib} MiB | driver {driver}"
    finally:
        close_nvml(nv)


def hardware_fingerprint(target: dict | str) -> str:
    """The machine a target's measurements describe: this host's CPU for llvm, its GPU otherwise."""
    kind = target.get("kind") if isinstance(target, dict) else str(target).split()[0]
    return cpu_fingerprint() if kind == "llvm" else gpu_fingerprint()


def cache_target_key(target_key: str, pipeline_key: str | None = None) -> str:
    """The target part of the cache key: the run's canonical target key and, when the run has one, the
    graph-pass pipeline that made its tasks (records of another pipeline schedule other workloads)."""
    return f"{target_key}|pipeline={pipeline_key}" if pipeline_key else target_key


def trace_digest(trace_text: str) -> str:
    """sha1 of a trace's canonical JSON (``events.trace_json``): one entry per (key, schedule)."""
    return hashlib.sha1(trace_text.encode()).hexdigest()


def _structural_hash(mod) -> str:
    import tvm_ffi  # TVM: see the module doc

    return str(int(tvm_ffi.structural_hash(mod)))


# --------------------------------------------------------------------------- reading a run
def task_workloads(model, target) -> list[dict]:
    """The run's tasks as the cache looks them up: index, name, weight, workload hash (collect_tasks:
    the same extraction the run uses). Run in a sandboxed child (TVM on a team's model)."""
    from tuning.engine.compile.pipeline import make_target
    from tuning.engine.compile.workloads import collect_tasks

    tasks = collect_tasks(model, make_target(target))
    return [{"index": i, "name": t.name, "weight": t.weight, "workload_hash": _structural_hash(t.mod)}
            for i, t in enumerate(tasks)]


def source_effort(work_dir: str, tasks) -> dict[int, tuple[int, bool]]:
    """task index -> (trials the run spent on it, whether its search had converged), what a published entry
    says of how far its record was tuned. Trials: the task's records in the run's database, plus, for a
    task the run was seeded on, the trials behind its seeds (a re-published seed keeps its history).
    Converged: Trimmer's plateau rule pre-empted it, its search space ran out (Trimmer on or off), or the record cache
    settled it as converged (saved Trimmer state and verification of the run)."""
    trials = {i: len(recs) for i, recs in records_by_task(open_json_db(work_dir), tasks).items()}
    converged: set[int] = set()
    state = _load_json(os.path.join(work_dir, TRIMMER_STATE)) or {}
    for key in ("preempted_tasks", "cache_parked_tasks"):
        converged |= {int(k) for k in (state.get(key) or {})}
    converged |= {int(k) for k in state.get("exhausted_tasks") or []} | load_exhausted(work_dir)
    manifest = _load_json(os.path.join(work_dir, SEEDS_FILE)) or {}
    for i, want in (manifest.get("tasks") or {}).items():
        if int(i) in trials:
            trials[int(i)] += int(want.get("source_trials") or 0)
    for v in (load_verification(work_dir) or {}).get("tasks") or []:
        if v.get("settled"):
            converged.add(int(v["task_index"]))
    return {i: (n, i in converged) for i, n in trials.items()}


def _entry(task, index: int, rec) -> dict | None:
    from tvm.s_tir import meta_schedule as ms

    secs = [float(x) for x in (rec.run_secs or [])]
    latency = record_latency(rec)
    if latency is None:
        return None
    text = trace_json(rec.trace)
    seed = ms.database.TuningRecord(rec.trace, ms.database.Workload(task.mod), None, rec.target, rec.args_info)
    return {"task_index": index, "task_name": task.name, "workload_hash": _structural_hash(task.mod),
            "workload_json": json.dumps(ffi_to_py(ms.database.Workload(task.mod).as_json())),
            "record_json": json.dumps(record_json(seed)), "trace_digest": trace_digest(text),
            "args_info": ffi_to_py([a.as_json() for a in rec.args_info or []]),
            "run_secs": secs, "latency_s": latency}


def entries_from_run(work_dir: str, model, target) -> list[dict]:
    """The run's trusted cache entries: every record of its ``final`` database (serial re-measures by
    this platform, DOPpler's last stage), with the workload, the record without its times (what a seed
    is made of), its args info, the serial run times, and how far the source tuned the task
    (``source_trials``, ``source_converged``: :func:`source_effort`). Empty when the run had no final
    re-measure."""
    from tuning.engine.compile.pipeline import make_target
    from tuning.engine.compile.workloads import collect_tasks

    final = os.path.join(work_dir, "final", DB_RECORDS)
    if not (os.path.exists(final) and os.path.getsize(final)):
        return []
    tasks = collect_tasks(model, make_target(target))
    effort = source_effort(work_dir, tasks)
    out = []
    for i, recs in records_by_task(open_json_db(work_dir, final=True), tasks).items():
        for rec in recs:
            e = _entry(tasks[i], i, rec)
            if e is not None:
                n, converged = effort.get(i, (0, False))
                out.append(e | {"source_trials": n, "source_converged": converged})
    return out


def publish_from_run(work_dir: str, model, target, cached: list[dict], cost_model_path: str,
                     num_cores: int = 1) -> dict:
    """One child's work after a successful run: its trusted entries (:func:`entries_from_run`) and the
    key's cost model retrained on them plus the ``cached`` trusted entries of the same key (the new ones
    win on a shared trace). Returns ``{"entries": [...], "cost_model_records": n}``."""
    entries = entries_from_run(work_dir, model, target)
    fresh = {e["trace_digest"] for e in entries}
    pool = entries + [e for e in cached if e["trace_digest"] not in fresh]
    n = train_cost_model(pool, target, cost_model_path, num_cores=num_cores) if entries else 0
    return {"entries": entries, "cost_model_records": n}


# --------------------------------------------------------------------------- seeding a run
def write_seeds(work_dir: str, hits: dict[int, list[dict]], *, tolerance: float = DEFAULT_TOLERANCE) -> int:
    """Make cache hits the run's seeds. ``hits``: task index -> entries (``workload_json``,
    ``record_json``, ``trace_digest``, ``latency_s``, ``workload_hash``, and the cache's ``id`` /
    ``source_run`` / ``source_trials`` / ``source_converged``), at most top-k each. The records go through the imported-seed path (built and
    measured serially on this host before the search, their cached times not kept); the manifest
    (``SEEDS_FILE``) keeps what verification compares with. Returns the number of seeds."""
    rec_lines, manifest = [], {"tolerance": float(tolerance), "tasks": {}}
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
        agreeing = {e.get("source_run") for e in entries if e.get("source_run") is not None and cache_best
                    and e.get("latency_s") and float(e["latency_s"]) <= cache_best * (1 + tolerance)}
        manifest["tasks"][str(task_index)] = {
            "workload_hash": entries[0]["workload_hash"], "cache_best_s": cache_best,
            "source_trials": max(trials) if trials else None,
            "source_converged": any(bool(e.get("source_converged")) for e in entries),
            "agreeing_runs": len(agreeing),
            "entries": {e["trace_digest"]: {"id": e.get("id"), "source_run": e.get("source_run"),
                                            "latency_s": e.get("latency_s")} for e in entries}}
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


def suspect_seeds(manifest: dict, measured: dict[int, dict[str, float | None]],
                  factor: float = 1.0) -> dict[int, list[str]]:
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


def _task_verdict(index: int, name: str, want: dict, measured: dict[str, float | None], tolerance: float,
                  retimed: int = 0) -> dict:
    best = min((v for v in measured.values() if v is not None), default=None)
    cache_best = want["cache_best_s"]
    verified = best is not None and cache_best is not None and best <= float(cache_best) * (1 + tolerance)
    slow = {d: _slower(v, want["entries"][d]["latency_s"], tolerance) for d, v in measured.items()
            if d in want["entries"]}
    stale = [want["entries"][d]["id"] for d, bad in slow.items() if bad]
    # entries this host confirmed (ran within tolerance of their own cached time): their strikes reset
    confirmed = [want["entries"][d]["id"] for d, bad in slow.items()
                 if not bad and want["entries"][d].get("latency_s") is not None]
    winner = min(((v, d) for d, v in measured.items() if v is not None), default=(None, None))[1]
    if verified:
        reason = "verified"
    elif best is None:
        reason = "failed on this host"
    elif cache_best is None:
        reason = "imported records only: measured here, trusted once a run re-measures them serially"
    else:
        reason = f"slower on this host ({best * 1e6:.1f} us vs the cache's best {float(cache_best) * 1e6:.1f} us)"
    return {"task_index": index, "task_name": name, "workload_hash": want["workload_hash"],
            "cache_best_s": cache_best, "measured_best_s": best, "n_seeds": len(measured),
            "verified": verified, "stale_entry_ids": [x for x in stale if x is not None],
            "confirmed_entry_ids": [x for x in confirmed if x is not None], "n_retimed": int(retimed), "reason": reason,
            "source_run": (want["entries"].get(winner) or next(iter(want["entries"].values())))["source_run"]}


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
    manifest = _load_json(os.path.join(work_dir, SEEDS_FILE))
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
    verdicts = [_task_verdict(int(i), tasks[int(i)].name, want, measured.get(int(i), {}), allowed,
                              retimed.get(int(i), 0))
                for i, want in sorted(manifest["tasks"].items(), key=lambda kv: int(kv[0])) if int(i) < len(tasks)]
    result = {"tolerance": tol, "host_factor": factor, "allowed": allowed, "tasks": verdicts}
    Path(os.path.join(work_dir, VERIFY_FILE)).write_text(json.dumps(result))
    return result


def fair_shares(infos, seeded_best: dict[int, float | None], max_trials: int) -> dict[int, int]:
    """The trials this run would give each task out of its whole budget by Trimmer's share allocation
    (weight x latency; the seeds' times here for the seeded tasks, the mean share for the others)."""
    shares = {t.index: (float(t.weight or 1.0), seeded_best.get(t.index)) for t in infos}
    return allocate_trials(int(max_trials), shares, list(shares))


def convergence(want: dict, share: int) -> tuple[bool, str]:
    """Whether a task's cached record is a converged result, one this run could not expect to beat by
    searching, and why. A verified time says nothing of that: a source run that spent a few trials
    leaves a poor record that verifies all the same. Converged: the source's search had plateaued
    (Trimmer's rule, or the plateau rule of a cache-seeded search) or ran out of candidates, or two
    independent runs agree on the best. The trials the source spent are no proof: measured
    (bench/record_cache.py --quick), records from a source that spent 16 trials on a task, more than this
    run's latency share of it (``share``, :func:`fair_shares`) and what a cold run gives it, settled the
    task at a coin flip against a cold run's own 16 trials, and three such tasks left the warm model 4 %
    slower than cold. Entries that do not say how far they were tuned (published before that was
    recorded) are not converged."""
    trials = want.get("source_trials")
    spent = "an unknown number of" if trials is None else str(int(trials))
    if want.get("source_converged"):
        return True, f"converged: the source run's search had plateaued or run out (after {spent} trials)"
    if int(want.get("agreeing_runs") or 0) >= 2:
        return True, f"converged: {want['agreeing_runs']} source runs agree on the best"
    return False, (f"not converged (the source spent {spent} trials and had not plateaued; this run's share "
                   f"is {int(share)}): searched on from its seeds")


def settle_decisions(result: dict, manifest: dict, infos, max_trials: int) -> dict:
    """Add to each verdict of ``result`` whether its task is settled (verified and converged: no further
    trials) and its ``share_trials``, ``converged`` and ``convergence`` reason (:func:`convergence`)."""
    shares = fair_shares(infos, {int(v["task_index"]): v["measured_best_s"] for v in result["tasks"]}, max_trials)
    for v in result["tasks"]:
        want = manifest.get("tasks", {}).get(str(v["task_index"])) or {}
        share = shares.get(int(v["task_index"]), 0)
        converged, why = convergence(want, share)
        v.update(share_trials=share, source_trials=want.get("source_trials"), converged=converged,
                 convergence=why, settled=bool(v["verified"] and converged))
        if v["verified"]:
            v["reason"] = f"verified; {why}"
    return result


def skip_verified_tasks(state, infos, verified: dict[int, int], *, max_trials: int, per_round: int,
                        seed: int | None, seeded: dict[int, tuple[float | None, int]] | None = None,
                        searched: dict[int, int] | None = None) -> None:
    """Tasks whose cache hit verified get no further trials: Trimmer's runtime (a passive one, every
    rule off, when the run has no Trimmer) treats them as settled from the start (terminated before the
    first round, never resumed: when every task is settled the run ends, its budget saved), and its share
    allocation gives their trials to the others. Not reported as Trimmer's pre-emptions: the cache's
    savings are counted apart.

    ``seeded``: task index -> (its best seed time on this host, seeds measured), every seeded task,
    verified or not. The allocator learns them as it learns a batch (best latency, trials spent), so the
    freed trials are shared by the tasks' real latency shares from the first round, not by a guess, and
    a Trimmer judges a seeded task's search against the seed it started from.

    ``searched``: task index -> trials: verified tasks whose record was not converged (``verified`` holds
    the settled ones only). They are searched on from their seeds, and judged by Trimmer's plateau rule
    from the seed's time (even when Trimmer is off) once they have had that many trials: a search that no
    longer beats the seed stops there, its trials to the others."""
    from tuning.engine.trimmer.hooks import TrimmerRuntime
    from tuning.engine.trimmer.rules import TrimmerConfig

    if not verified and not searched and state.trimmer is None:
        return
    if state.trimmer is None:
        passive = TrimmerConfig(enabled=False, filter_enabled=False)
        state.trimmer = TrimmerRuntime(passive, infos, max_trials=max_trials, seed=seed)
        state.trimmer.per_round = max(1, per_round)
    tr = state.trimmer
    with tr.lock:
        for i, (best, n) in (seeded or {}).items():
            i = int(i)
            if i not in tr.weights:
                continue
            if best is not None and best < tr.best.get(i, float("inf")):
                tr.best[i] = float(best)
                tr.tracker.best[i] = min(float(best), tr.tracker.best.get(i, float("inf")))
            tr.tracker.trials[i] = tr.tracker.trials.get(i, 0) + int(n)
        for i, n in verified.items():
            tr.tracker.preempted[int(i)] = int(n)
            tr.settled.add(int(i))
            tr.pending.add(int(i))
        for i, floor in (searched or {}).items():
            if int(i) in tr.weights and int(i) not in tr.settled:
                tr.tracker.judged[int(i)] = max(1, int(floor))


def apply_seed_verification(run, retime=None) -> None:
    """The session's hook, after the imported seeds were measured: verify the cache's seeds (once; a
    resumed run reads the verdicts back; ``retime``: see :func:`verify_seeds`), take the verified tasks
    whose record converged out of the search (:func:`settle_decisions`) and search the other verified
    ones on from their seeds, judged by the plateau rule after their share of the budget."""
    result = load_verification(run.work_dir) or verify_seeds(run.work_dir, run.tasks, run.database, retime)
    if not result or run.state is None:
        return
    if any("settled" not in v for v in result["tasks"]):
        manifest = _load_json(os.path.join(run.work_dir, SEEDS_FILE)) or {}
        result = settle_decisions(result, manifest, run.infos, int(run.cfg.max_trials))
        Path(os.path.join(run.work_dir, VERIFY_FILE)).write_text(json.dumps(result))
    verified = {v["task_index"]: v["n_seeds"] for v in result["tasks"] if v["settled"]}
    searched = {v["task_index"]: v["share_trials"] for v in result["tasks"] if v["verified"] and not v["settled"]}
    fresh = not getattr(run, "n_existing", 0)  # a resumed run's allocator counted the seeds from its database
    seeded = {v["task_index"]: (v["measured_best_s"], int(v["n_seeds"]) + int(v.get("n_retimed", 0)) if fresh else 0)
              for v in result["tasks"]}
    skip_verified_tasks(run.state, run.infos, verified, max_trials=int(run.cfg.max_trials),
                        per_round=round_size(run.cfg.trials_per_round, run.remaining, len(run.tasks)), seed=run.cfg.seed,
                        seeded=seeded, searched=searched)


# --------------------------------------------------------------------------- cost model
def train_cost_model(entries: list[dict], target, path: str, *, num_cores: int = 1) -> int:
    """One XGBoost cost model trained on ``entries`` (their serial times), saved at ``path`` in the
    format ``search`` loads; returns the number of records it learned from (0: nothing saved)."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.schedule import Schedule

    from tuning.engine.compile.pipeline import make_target
    from tuning.engine.compile.tvm_compat import ensure_tensor_intrin

    tgt = make_target(target)
    ensure_tensor_intrin(tgt)  # what the target needs, not all of tensor_intrin (TuneContext imports it: seconds)
    by_workload: dict[str, list[dict]] = {}
    for e in entries:
        by_workload.setdefault(e["workload_hash"], []).append(e)
    model = data_only(ms.cost_model.XGBModel(num_tuning_cores=num_cores, tree_method="auto"))
    n = 0
    for group in by_workload.values():
        mod = ms.database.Workload.from_json(json.loads(group[0]["workload_json"])).mod
        ctx = ms.TuneContext(mod=mod, target=tgt, space_generator="post-order-apply", num_threads=num_cores)
        cands, results = [], []
        for e in group:
            rec = ms.database.TuningRecord.from_json(json.loads(e["record_json"]), ms.database.Workload(mod))
            sch = Schedule(mod)
            rec.trace.apply_to_schedule(sch, remove_postproc=False)
            cands.append(ms.MeasureCandidate(sch, rec.args_info))
            results.append(ms.runner.RunnerResult([float(x) for x in e["run_secs"]], None))
        model.update(ctx, cands, results)
        n += len(cands)
    if n:
        model.save(path)
    return n


def place_cost_model(work_dir: str, cost_model_path: str | None) -> bool:
    """Put the cache's cost model where a run loads its own (``COST_MODEL_FILE``), for a fresh run. Only a
    file in the platform's data-only format (``cost_model_file.check_cost_model_file``): another format,
    TVM's pickled one included, is skipped unread, with a warning, and the run tunes without it."""
    dest = os.path.join(work_dir, COST_MODEL_FILE)
    if not cost_model_path or not os.path.exists(cost_model_path) or os.path.exists(dest):
        return False
    os.makedirs(work_dir, exist_ok=True)
    tmp = dest + ".checking"  # the bytes checked are the bytes placed: copied first, checked, then renamed
    shutil.copyfile(cost_model_path, tmp)
    try:
        check_cost_model_file(tmp)
    except CostModelFileError as exc:
        os.unlink(tmp)
        log.warning("record cache: cost model %s skipped: %s", os.path.basename(cost_model_path), exc)
        return False
    os.replace(tmp, dest)
    return True


# --------------------------------------------------------------------------- portability
def export_lines(entries: list[dict]) -> tuple[list[str], list[str]]:
    """Entries as a standard TVM JSON database (workload file lines, tuning-record file lines), with the
    platform's serial run times."""
    wl_index: dict[str, int] = {}
    wl_lines, rec_lines = [], []
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
            if not (isinstance(rec, str) and len(rec) <= MAX_RECORD_LINE and isinstance(wl, str)
                    and len(wl) <= MAX_WORKLOAD_LINE):
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
    """A staff import into the cache, checked as a run's import is (``record_check``: bounds, MetaSchedule's
    own instructions and annotations, plain names, replay) against the records' own workloads (a cache
    has no model). Run in a sandboxed worker. Returns ``{"errors": [...]}`` or ``{"entries": [...]}``:
    entries without run times, ``latency_s`` None: untrusted until a run measures them."""
    from tvm.s_tir import meta_schedule as ms

    from tuning.engine.compile.pipeline import make_target
    from tuning.engine.records.check import precheck, trace_only
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
        clean = ms.database.TuningRecord(rec.trace, ms.database.Workload(mod), None, tgt,
                                         ms.arg_info.ArgInfo.from_prim_func(mod["main"]))
        text = trace_json(rec.trace)
        out.append({"task_name": str(mod["main"].attrs.get("global_symbol", "main")) if mod["main"].attrs else "main",
                    "workload_hash": _structural_hash(mod),
                    "workload_json": json.dumps(ffi_to_py(ms.database.Workload(mod).as_json())),
                    "record_json": json.dumps(record_json(clean)), "trace_digest": trace_digest(text),
                    "args_info": ffi_to_py([a.as_json() for a in clean.args_info]), "run_secs": [],
                    "latency_s": None})
    from tuning.engine.compile.targets import canonical_key

    return {"errors": errors} if errors else {"entries": out, "target_key": canonical_key(tgt)}
