"""Measure one built candidate: a pure function any worker can run.

Needs only TVM's runtime (works with ``TVM_USE_RUNTIME_LIB=1`` and
``libtvm_compiler.so`` absent): nothing here imports ``tvm.s_tir`` or the
compiler. A remote Celery worker calls :func:`measure_payload` with the dict a
:class:`~tuning.engine.runners.distributed.DistributedRunner` sent; the local pool calls
:func:`measure_path`.

Thread count: TVM's pool can be shrunk in-process (``runtime.config_threadpool``)
but not grown past the size it was created with, so measuring processes should
start with ``TVM_NUM_THREADS`` = the cores they own and ``TVM_BIND_THREADS=0``;
:func:`configure_process` sets the env vars if the pool is not up yet, the
affinity, and the pool size.

TVM is imported inside the functions that measure: the session (and so the web processes)
import this module, and a measuring worker pays for TVM once, when it first measures.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import os
import shutil
import socket
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tuning.engine.compile.targets import measurable_refusal
from tuning.engine.measuring import cuda_binaries
from tuning.engine.measuring.timer import (
    DeviceUnavailable,
    EvaluatorConfig,
    check_device,
    time_module,
)
from tuning.engine.process import sandbox
from tuning.engine.process.procpool import (
    TIMING_LOCK_VAR,
    WorkerError,
    WorkerProcess,
    WorkerSpec,
    WorkerTimeout,
)

__all__ = [
    "MeasureOutcome",
    "configure_process",
    "measure_artifact",
    "measure_path",
    "measure_payload",
    "measure_payload_isolated",
    "make_payload",
    "queue_name",
    "worker_id",
]

_STATE: dict[str, Any] = {"threads": None, "cpus": None, "pool_started": False}


@dataclasses.dataclass
class MeasureOutcome:
    run_secs: list[float]
    error: str | None
    worker: str
    wall_secs: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_any(cls, value: Any) -> MeasureOutcome:
        if isinstance(value, MeasureOutcome):
            return value
        if isinstance(value, Mapping):
            return cls(
                run_secs=[float(x) for x in (value.get("run_secs") or [])],
                error=value.get("error"),
                worker=str(value.get("worker") or "?"),
                wall_secs=float(value.get("wall_secs") or 0.0),
            )
        raise TypeError(f"cannot read a MeasureOutcome from {type(value)!r}")


def queue_name(host: str, device_type: str, index: int = 0) -> str:
    """Queue of one measuring device: ``measure.<host>.cpu`` or ``measure.<host>.gpu<i>``."""
    host = host.replace(".", "-")
    if device_type in ("cpu", "llvm"):
        return f"measure.{host}.cpu"
    return f"measure.{host}.gpu{int(index)}"


def worker_id(device_type: str = "cpu", index: int = 0, cpu_ids: Sequence[int] | None = None) -> str:
    where = f"{socket.gethostname()}:{os.getpid()}"
    if device_type not in ("cpu", "llvm"):
        return f"{where}:{device_type}{index}"
    if not cpu_ids:
        try:
            cpu_ids = sorted(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover
            return f"{where}:cpu"
    return f"{where}:cpu[{','.join(str(c) for c in cpu_ids)}]"


def configure_process(threads: int | None, cpu_ids: Sequence[int] | None) -> None:
    """Pin this process (calling thread, inherited by threads created later)
    to ``cpu_ids`` and size TVM's thread pool to ``threads`` (no TVM binding)."""
    os.environ.setdefault("TVM_BIND_THREADS", "0")
    if cpu_ids:
        cpus = tuple(sorted(int(c) for c in cpu_ids))
        if _STATE["cpus"] != cpus:
            try:
                os.sched_setaffinity(0, set(cpus))
            except (AttributeError, OSError):
                pass
            _STATE["cpus"] = cpus
    if threads:
        threads = int(threads)
        if not _STATE["pool_started"]:
            os.environ["TVM_NUM_THREADS"] = str(threads)
        if _STATE["threads"] != threads:
            import tvm_ffi

            cfg = tvm_ffi.get_global_func("runtime.config_threadpool", allow_missing=True)
            if cfg is not None:
                cfg(0, threads)
            _STATE["threads"] = threads


@contextlib.contextmanager
def timing_window():
    """Hold the device's timing lock while a candidate is timed, when this worker's slot group has
    one (``DLOPT_TIMING_LOCK``: a GPU's, see gpu_slots.py). The group's workers load and prepare
    candidates in parallel but time them one at a time: kernels timed concurrently on one GPU read
    39-228 % slow at DOP 2-8, with or without MPS (H200, bench/results/gpu_check_h200_s19_*.json).
    The wait has no timeout of its own: the parent's per-candidate timeout kills a worker stuck
    here, and the kernel drops a dead holder's lock with its file descriptor."""
    inherited = os.environ.get(sandbox.TIMING_LOCK_FD_VAR)
    if inherited:  # a worker running as the sandbox account: its parent opened the file for it
        fd = int(inherited)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        return
    path = os.environ.get(TIMING_LOCK_VAR)
    if not path:
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _alloc_args(device, args_info_json: Sequence[Any]) -> list[Any]:
    import tvm
    import tvm_ffi

    fill = tvm_ffi.get_global_func("tvm.contrib.random.random_fill_for_measure", allow_missing=True)
    rng = np.random.default_rng(0)
    args = []
    for info in args_info_json:
        kind = info[0]
        if kind != "TENSOR":
            raise NotImplementedError(f"argument kind {kind!r}")
        _, dtype, shape = info
        shape = [int(s) for s in shape]
        arr = tvm.runtime.empty(shape, dtype=str(dtype), device=device)
        filled = False
        if fill is not None:
            try:
                fill(arr)
                filled = True
            except Exception:  # noqa: BLE001 - e.g. no random contrib for this device
                filled = False
        if not filled:
            if "float" in str(dtype):
                host = rng.standard_normal(shape).astype(str(dtype))
            else:
                host = rng.integers(0, 4, shape).astype(str(dtype))
            arr.copyfrom(host)
        args.append(arr)
    return args


def measure_path(
    artifact_path: str,
    *,
    device_type: str,
    args_info_json: Sequence[Any],
    evaluator: EvaluatorConfig | Mapping | None = None,
    threads: int | None = None,
    cpu_ids: Sequence[int] | None = None,
    device_index: int = 0,
) -> MeasureOutcome:
    """Load an exported ``.so`` from disk and time it. Never raises: an error
    is returned in ``MeasureOutcome.error``."""
    t0 = time.perf_counter()
    who = worker_id(device_type, device_index, cpu_ids)
    try:
        configure_process(threads, cpu_ids if device_type in ("cpu", "llvm") else None)
        import tvm

        dev = check_device("cpu" if device_type == "llvm" else device_type, device_index)
        with cuda_binaries.loading(artifact_path):  # kernels TVM compiles at load: binaries beside it first
            rt_mod = tvm.runtime.load_module(artifact_path)
        args = _alloc_args(dev, args_info_json)
        _STATE["pool_started"] = True
        with timing_window():
            secs = time_module(rt_mod, dev, args, evaluator)
        del args
        return MeasureOutcome(secs, None, who, time.perf_counter() - t0)
    except DeviceUnavailable as exc:
        return MeasureOutcome([], f"DeviceUnavailable: {exc}", who, time.perf_counter() - t0)
    except Exception:  # noqa: BLE001
        return MeasureOutcome([], traceback.format_exc(limit=6), who, time.perf_counter() - t0)


def measure_artifact(
    artifact_bytes: bytes,
    *,
    device_type: str,
    args_info_json: list,
    evaluator: EvaluatorConfig | Mapping | None = None,
    threads: int | None = None,
    cpu_ids: list[int] | None = None,
    device_index: int = 0,
    kernel_binaries: Mapping[str, bytes] | None = None,
) -> MeasureOutcome:
    """Time a candidate given as the bytes of its exported ``.so`` (and, for CUDA, its kernels'
    binaries, written beside it where the load looks first: cuda_binaries)."""
    folder = tempfile.mkdtemp(prefix="ms_cand_")
    path = os.path.join(folder, "candidate.so")
    try:
        with open(path, "wb") as fh:
            fh.write(artifact_bytes)
        if kernel_binaries:
            cuda_binaries.write_beside(path, dict(kernel_binaries))
        return measure_path(
            path,
            device_type=device_type,
            args_info_json=args_info_json,
            evaluator=evaluator,
            threads=threads,
            cpu_ids=cpu_ids,
            device_index=device_index,
        )
    except ValueError as exc:  # a refused kernel binary
        return MeasureOutcome([], f"refused payload: {exc}", worker_id(device_type, device_index, cpu_ids), 0.0)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def make_payload(
    artifact_bytes: bytes,
    *,
    device_type: str,
    args_info_json: list,
    evaluator: EvaluatorConfig | Mapping | None,
    threads: int | None,
    cpu_ids: list[int] | None = None,
    device_index: int = 0,
    queue: str | None = None,
    candidate: str | None = None,
    kernel_binaries: Mapping[str, bytes] | None = None,
) -> dict[str, Any]:
    """The JSON-able message a distributed runner sends for one candidate."""
    return {
        "artifact_b64": base64.b64encode(artifact_bytes).decode("ascii"),
        "artifact_format": "so",
        "kernel_binaries_b64": {
            name: base64.b64encode(data).decode("ascii") for name, data in (kernel_binaries or {}).items()
        },
        "device_type": device_type,
        "device_index": int(device_index),
        "args_info": [list(_jsonable(a)) for a in args_info_json],
        "evaluator": EvaluatorConfig.from_any(evaluator).to_dict(),
        "threads": int(threads) if threads else None,
        "cpu_ids": list(cpu_ids) if cpu_ids else None,
        "queue": queue,
        "candidate": candidate,
    }


def _jsonable(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (int, float, str, bool)) or x is None:
        return x
    try:
        return [_jsonable(v) for v in x]
    except TypeError:
        pass
    if hasattr(x, "value"):
        return x.value
    return str(x) if not str(x).lstrip("-").isdigit() else int(str(x))


def describe_host(threads: int | None, device_type: str = "cpu") -> dict[str, Any]:
    """What a measuring host reports to a DistributedRunner: its measurement slots for a deployment of
    ``threads`` threads (CPU: slots.py; GPU: the MPS clients of one device, 1 without MPS)."""
    from tuning.engine.measuring import gpu_slots, slots

    if device_type in ("cpu", "llvm"):
        cpu = slots.cpu_slots(int(threads or len(slots.read_topology().cpus)))
        return {
            "kind": "describe",
            "slots": len(cpu),
            "threads": cpu[0].threads,
            "cpus": [list(s.cpus) for s in cpu],
            "worker": worker_id(),
        }
    gpus = gpu_slots.list_gpus()
    mps = gpu_slots.ensure_mps(gpu_slots.mps_pipe_dir()) if gpus else gpu_slots.MpsStatus(False)
    groups = gpu_slots.gpu_slot_groups(gpus, mps)
    return {
        "kind": "describe",
        "slots": groups[0].max_dop if groups else 0,
        "mps": mps.running,
        "gpus": [{"index": g.gpu.index, "arch": g.gpu.arch, "max_dop": g.max_dop} for g in groups],
        "worker": worker_id(device_type),
    }


def measure_payload(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Entry point for a remote (Celery) measuring worker: payload -> outcome dict."""
    if payload.get("kind") == "describe":
        return describe_host(payload.get("threads"), str(payload.get("device_type") or "cpu"))
    refusal = measurable_refusal(payload.get("target"), device_index=int(payload.get("device_index") or 0))
    if refusal:  # built for another CPU/GPU: its timing would describe neither machine
        return MeasureOutcome([], refusal, socket.gethostname(), 0.0).to_dict()
    encoded = dict(payload.get("kernel_binaries_b64") or {})
    if len(encoded) > cuda_binaries.MAX_BINARIES or any(
        len(str(v)) > cuda_binaries.MAX_BINARY_BYTES * 4 // 3 + 4 for v in encoded.values()
    ):
        return MeasureOutcome(
            [], "refused payload: too many or too large kernel binaries", socket.gethostname(), 0.0
        ).to_dict()
    try:
        kernels = {str(name): base64.b64decode(data, validate=True) for name, data in encoded.items()}
    except (ValueError, TypeError) as exc:
        return MeasureOutcome(
            [], f"refused payload: kernel binaries are not base64 ({exc})", socket.gethostname(), 0.0
        ).to_dict()
    outcome = measure_artifact(
        base64.b64decode(payload["artifact_b64"]),
        device_type=payload["device_type"],
        args_info_json=payload["args_info"],
        evaluator=payload.get("evaluator"),
        threads=payload.get("threads"),
        cpu_ids=payload.get("cpu_ids"),
        device_index=int(payload.get("device_index") or 0),
        kernel_binaries=kernels,
    )
    return outcome.to_dict()


MAX_QUEUE_SLOTS = 64  # per device: a queue host's sandboxed workers are kept, one per (device, slot)
_ISOLATED: dict[tuple[bool, int, int], Any] = {}  # (gpu, device index, slot)
_ISOLATED_LOCK = threading.Lock()


def _isolated_worker(payload: Mapping[str, Any], device: int, slot: int) -> WorkerProcess:
    """The sandboxed worker of the payload's slot (one per slot, so DOP candidates measure side by
    side, each pinned to its slot's cores; slot 0 is the host's serial reference). ``device`` and
    ``slot``: the payload's, parsed and range-checked by the caller."""
    gpu = str(payload.get("device_type") or "cpu") not in ("cpu", "llvm")
    device = device if gpu else 0
    key = (gpu, device, slot)
    with _ISOLATED_LOCK:
        worker = _ISOLATED.get(key)
        if worker is None:
            cpus, threads, env = None, None, {}
            if gpu:
                from tuning.engine.measuring.gpu_slots import queue_worker_env

                env = queue_worker_env(device)  # one GPU's slots time one candidate at a time
            else:
                from tuning.engine.measuring.slots import cpu_slots

                host_slots = cpu_slots(int(payload.get("threads") or 0) or len(os.sched_getaffinity(0)))
                cpus, threads = host_slots[slot % len(host_slots)].as_layout()
            worker = _ISOLATED[key] = WorkerProcess(
                WorkerSpec(
                    name=f"measure-isolated-{f'gpu{device}' if gpu else 'cpu'}-s{slot}",
                    cpu_ids=cpus,
                    threads=threads,
                    limits=sandbox.default_limits(gpu=gpu),
                    env=env,
                ),
                initializer=warmup,
                max_uses=500,
            )
        return worker


def measure_payload_isolated(payload: Mapping[str, Any], *, timeout: float = 300.0) -> dict[str, Any]:
    """:func:`measure_payload` in a sandboxed worker subprocess (see ``sandbox.py``), never in the
    calling process: a Celery worker that measures shipped candidates must not load them next to
    its own credentials. The worker stays alive between calls; a crash or timeout is an error
    outcome, and the next call starts a fresh worker."""
    if payload.get("kind") == "describe":  # no candidate code: answered here
        return describe_host(payload.get("threads"), str(payload.get("device_type") or "cpu"))
    try:
        device, slot = int(payload.get("device_index") or 0), int(payload.get("slot") or 0)
    except (TypeError, ValueError):
        device, slot = -1, -1
    if not (0 <= device < MAX_QUEUE_SLOTS and 0 <= slot < MAX_QUEUE_SLOTS):  # each pair starts a worker
        return MeasureOutcome(
            [], f"refused payload: device_index and slot must be 0-{MAX_QUEUE_SLOTS - 1}", socket.gethostname(), 0.0
        ).to_dict()
    worker = _isolated_worker(payload, device, slot)
    t0 = time.perf_counter()
    try:
        return worker.call(measure_payload, dict(payload), timeout=timeout)
    except (WorkerError, WorkerTimeout) as exc:
        who = f"{socket.gethostname()}:isolated"
        return MeasureOutcome(
            [], f"measuring worker failed: {str(exc)[-2000:]}", who, time.perf_counter() - t0
        ).to_dict()


def warmup() -> None:
    """Worker initializer: import the TVM runtime before the first job."""
    import tvm  # noqa: F401
