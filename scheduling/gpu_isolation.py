"""What keeps co-located GPU jobs apart, from a placement's numbers (no Django).

* :func:`isolation_env` - the environment of a job's process: ``CUDA_VISIBLE_DEVICES`` of its GPUs
  only (NVML/PCI order), and where an MPS control daemon runs, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``
  (the job's predicted share of the SMs) and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (its memory cap per
  visible device). Without MPS there is no SM partition and no driver-enforced memory cap: the
  fallback is the runtime's own cap (:func:`ort_cuda_options`' ``gpu_mem_limit``) and the slot limit.
* :func:`job_memory_limit_mb` - the cap: the predicted memory with headroom, within the GPU.
* :class:`GpuSlots` - at most ``slots`` jobs per GPU on a node, enforced by the worker with
  ``flock`` on one file per slot (released by the kernel when a process dies, so a crash never leaks).
"""
from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_SLOTS_PER_GPU", "GpuSlots", "NoFreeSlot", "isolation_env", "job_memory_limit_mb",
           "mps_pipe_directory", "ort_cuda_options"]

#: Horus's limit of co-located jobs per GPU (``horus.policies.HORUS_MAX_JOBS_PER_GPU``)
DEFAULT_SLOTS_PER_GPU = 3
MEM_HEADROOM_RATIO = 1.25
MEM_HEADROOM_MIN_MB = 512.0
DEFAULT_MPS_PIPE_DIR = "/tmp/nvidia-mps"


def mps_pipe_directory(environ: dict[str, str] | None = None) -> str | None:
    """The MPS control daemon's pipe directory when one runs (its ``control`` pipe exists), else None."""
    env = os.environ if environ is None else environ
    pipe_dir = env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_MPS_PIPE_DIR
    return pipe_dir if (Path(pipe_dir) / "control").exists() else None


def job_memory_limit_mb(predicted_mem_mb: float | None, gpu_memory_mb: float) -> float | None:
    """The job's memory cap: its prediction plus headroom (25 %, at least 512 MB), at most the GPU's
    memory; None (no cap) when nothing was predicted."""
    if predicted_mem_mb is None or predicted_mem_mb <= 0:
        return None
    return float(min(gpu_memory_mb, max(predicted_mem_mb * MEM_HEADROOM_RATIO, predicted_mem_mb + MEM_HEADROOM_MIN_MB)))


def isolation_env(gpu_indices: Sequence[int], *, predicted_util_pct: float | None, mem_limit_mb: float | None,
                  mps_pipe_dir: str | None) -> dict[str, str]:
    """Environment variables for a job process on ``gpu_indices`` (NVML indices of one node)."""
    if not gpu_indices or any(int(i) < 0 for i in gpu_indices):
        raise ValueError("a job needs at least one GPU index, none negative")
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # CUDA's ordinals then follow NVML's indices
           "CUDA_VISIBLE_DEVICES": ",".join(str(int(i)) for i in gpu_indices)}
    if mps_pipe_dir is not None:
        env["CUDA_MPS_PIPE_DIRECTORY"] = mps_pipe_dir
        if predicted_util_pct is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(int(min(100, max(1, round(predicted_util_pct)))))
        if mem_limit_mb is not None:  # ordinals of the visible devices, as MPS counts them
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
                f"{k}={int(mem_limit_mb)}M" for k in range(len(gpu_indices)))
    return env


def ort_cuda_options(device_id: int, mem_limit_mb: float | None) -> dict[str, Any]:
    """onnxruntime's CUDA execution provider options: the device and, with a cap, ``gpu_mem_limit``
    (bytes) with an arena that grows only by what is asked, so the cap is what the job may hold."""
    options: dict[str, Any] = {"device_id": int(device_id)}
    if mem_limit_mb is not None:
        options["gpu_mem_limit"] = int(mem_limit_mb * 1024 * 1024)
        options["arena_extend_strategy"] = "kSameAsRequested"
    return options


class NoFreeSlot(RuntimeError):
    """Every slot of the GPU is held by a running job."""


class GpuSlots:
    """``with GpuSlots(root, gpu_index).hold(): ...`` - one of ``slots`` per-GPU slots held while a job
    runs; :class:`NoFreeSlot` when all are taken. Slots are files ``<root>/gpu<index>/slot<k>`` locked
    with ``flock``: exclusive across processes (and across separately opened files in one process)."""

    def __init__(self, root: str | os.PathLike[str], gpu_index: int, slots: int = DEFAULT_SLOTS_PER_GPU):
        if slots < 1:
            raise ValueError("a GPU needs at least one slot")
        self.dir = Path(root) / f"gpu{int(gpu_index)}"
        self.slots = int(slots)
        self._fd: int | None = None
        self.slot: int | None = None

    def acquire(self) -> int:
        self.dir.mkdir(parents=True, exist_ok=True)
        for k in range(self.slots):
            fd = os.open(self.dir / f"slot{k}", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    continue
                raise
            self._fd, self.slot = fd, k
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return k
        raise NoFreeSlot(f"all {self.slots} job slots of GPU {self.dir.name[3:]} are in use")

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = self.slot = None

    def __enter__(self) -> GpuSlots:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
