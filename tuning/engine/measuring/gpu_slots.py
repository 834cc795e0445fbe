"""GPU measurement slots: several measuring workers per GPU, candidates timed one at a time.

Mechanism: **a timing window per GPU**. A GPU's DOP measuring workers (processes) load candidates and
allocate and fill their arguments in parallel; the timing itself (``time_evaluator``, CUDA events)
runs under the GPU's file lock (``measure.timing_window``), one candidate at a time. Measured on an
H200 by ``bench/gpu_check.sh`` (18 candidates, each against its own serial timing, serial-vs-serial
noise 0.1 %):

* timed *concurrently*, the errors make any DOP > 1 useless: mean 39-143 % at DOP 2-8 under CUDA MPS,
  46-228 % without it (kernels that fill the GPU share its SMs or are time-sliced, and each
  candidate's events time the others' kernels too; ``gpu_check_h200_s19_compile_at_load.json``);
* in the window the mean error stays 0.2-1.1 % (max 12.7 %). Its speed-up depends on the share of a
  candidate's measurement that is not GPU timing: with the GPU evaluator of 10 x 3 samples of >= 50 ms
  it was x1.02-x1.15 at DOP 2-8 (``gpu_check_h200_s19_prebuilt_window.json``); with the present default
  (3 samples of >= 5 ms, timer.default_evaluator: the same ranking and picks) it is x1.84 / x2.23 /
  x2.51 at DOP 2 / 4 / 8 under MPS, error 0.19-0.34 % (x1.81-x2.53 and 0.56-0.89 % without MPS;
  ``gpu_check_h200_s20_window_min5.json``). What overlaps is loading, argument set-up and the
  evaluator's warm-up; one GPU still times one candidate at a time.

The other GPU levers: kernels compiled by the builder, not at load time in the measuring worker
(cuda_binaries.py: the serial measuring wall of those 18 candidates fell from 9.0 to 4.4 s), the
evaluator's budget (4.8 s -> 1.05 s serial, ``gpu_check_h200_s20_budgets.json``), and one slot group
per GPU, each with its own DOP rule, error samples and timing lock.
``MAX_DOP_PER_GPU`` is 4: with exclusive timing a worker only needs to be ready when the window
frees; DOP 8 measured x2.51 against x2.23 at DOP 4 (H200, MPS): 12 % more for twice the workers,
each holding a CUDA context (without MPS, its own). MPS is optional (the workers then share one GPU
context instead of each holding its own); ``ensure_mps`` starts it where ``nvidia-cuda-mps-control``
is on PATH. Several streams in one process were not chosen: TVM 0.27's ``time_evaluator``
synchronizes the whole device, and our measuring workers already are processes (sandboxed,
RLIMITed, killed with their process group on a timeout), so a faulting candidate takes down its own
worker only. ``exclusive_timing=False`` (concurrent timing) remains for the ablation, at DOP > 1
only under MPS.

The target ``arch`` comes from the device's compute capability. Everything that talks to the driver
goes through :class:`DeviceQuery` (``nvidia-smi`` and ``nvidia-cuda-mps-control`` subprocesses), so
tests replace that layer only. Nothing here imports TVM.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence

from tuning.engine.process.procpool import TIMING_LOCK_VAR
from tuning.engine.process.sandbox import RUNTIME_ONLY_ENV, user_runtime_dir

__all__ = [
    "NeedsGPU",
    "GpuInfo",
    "MpsStatus",
    "GpuSlotGroup",
    "DeviceQuery",
    "list_gpus",
    "ensure_mps",
    "gpu_slot_groups",
    "require_gpus",
    "MAX_DOP_PER_GPU",
    "queue_worker_env",
    "timing_lock_path",
    "mps_pipe_dir",
]

MAX_DOP_PER_GPU = 4  # module doc: with exclusive timing, DOP 8 gained 12 % over DOP 4 for twice the workers
MPS_CONTROL = "nvidia-cuda-mps-control"


class NeedsGPU(RuntimeError):
    """The operation needs an NVIDIA GPU and this host has none (or none we may use)."""


@dataclasses.dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    uuid: str
    compute_capability: str  # "8.0"
    memory_mib: int

    @property
    def arch(self) -> str:
        """TVM's CUDA target arch for this device, e.g. ``sm_80``."""
        return "sm_" + self.compute_capability.replace(".", "")


@dataclasses.dataclass(frozen=True)
class MpsStatus:
    running: bool
    started_here: bool = False
    pipe_dir: str | None = None
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class GpuSlotGroup:
    """The measurement slots of one GPU: ``max_dop`` workers (MPS clients where MPS runs)."""

    gpu: GpuInfo
    max_dop: int
    mps: bool
    env: dict[str, str]  # what each measuring worker of this group runs with

    @property
    def queue_suffix(self) -> str:
        return f"gpu{self.gpu.index}"


Runner = Callable[..., subprocess.CompletedProcess]


class DeviceQuery:
    """The driver-facing layer: ``nvidia-smi`` for the devices, ``nvidia-cuda-mps-control`` for MPS.
    ``run`` and ``which`` are injectable (tests pass fakes)."""

    def __init__(self, run: Runner = subprocess.run, which: Callable[[str], str | None] = shutil.which) -> None:
        self._run = run
        self._which = which

    def nvidia_smi(self) -> str:
        if not self._which("nvidia-smi"):
            raise NeedsGPU("needs a GPU: nvidia-smi not found (no NVIDIA driver on this host)")
        out = self._run(
            ["nvidia-smi", "--query-gpu=index,name,uuid,compute_cap,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if out.returncode != 0:
            raise NeedsGPU(f"needs a GPU: nvidia-smi failed ({(out.stderr or out.stdout).strip()[:200]})")
        return out.stdout

    def has_mps(self) -> bool:
        return bool(self._which(MPS_CONTROL))

    def mps(self, command: str | None, env: dict[str, str], *, daemon: bool = False) -> subprocess.CompletedProcess:
        args = [MPS_CONTROL] + (["-d"] if daemon else [])
        return self._run(args, input=command, capture_output=True, text=True, timeout=30, env=env)


def _parse_smi(text: str) -> list[GpuInfo]:
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            continue
        idx, name, uuid, cap, mem = parts[:5]
        gpus.append(GpuInfo(int(idx), name, uuid, cap, int(float(mem))))
    return gpus


def list_gpus(query: DeviceQuery | None = None) -> list[GpuInfo]:
    """The NVIDIA GPUs this process may use (``CUDA_VISIBLE_DEVICES`` honoured); [] when none."""
    try:
        gpus = _parse_smi((query or DeviceQuery()).nvidia_smi())
    except (NeedsGPU, OSError, subprocess.SubprocessError):
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        gpus = [g for g in gpus if str(g.index) in wanted or g.uuid in wanted]
    return gpus


def require_gpus(query: DeviceQuery | None = None) -> list[GpuInfo]:
    gpus = list_gpus(query)
    if not gpus:
        raise NeedsGPU(
            "needs a GPU: no NVIDIA device on this host; CUDA candidates can be built here "
            "but are measured by a GPU worker (queue measure.<host>.gpu<i>)"
        )
    return gpus


def mps_pipe_dir() -> str:
    """The MPS daemon's pipe directory for this user's workers: in the private runtime directory,
    not a /tmp name another local user could make first (and answer on)."""
    return user_runtime_dir("mps")


def _mps_env(pipe_dir: str) -> dict[str, str]:
    env = dict(os.environ)
    env["CUDA_MPS_PIPE_DIRECTORY"] = pipe_dir
    env["CUDA_MPS_LOG_DIRECTORY"] = os.path.join(pipe_dir, "log")
    return env


def ensure_mps(pipe_dir: str, query: DeviceQuery | None = None) -> MpsStatus:
    """Check that an MPS control daemon answers on ``pipe_dir``; start one when it does not."""
    query = query or DeviceQuery()
    if not query.has_mps():
        return MpsStatus(False, reason=f"{MPS_CONTROL} not found: GPUs measure one candidate at a time")
    env = _mps_env(pipe_dir)
    os.makedirs(env["CUDA_MPS_LOG_DIRECTORY"], exist_ok=True)
    try:
        if query.mps("get_server_list\n", env).returncode == 0:
            return MpsStatus(True, False, pipe_dir, "already running")
        started = query.mps(None, env, daemon=True)
        if started.returncode != 0:
            return MpsStatus(False, reason=f"{MPS_CONTROL} -d failed: {(started.stderr or '').strip()[:200]}")
        ok = query.mps("get_server_list\n", env).returncode == 0
    except (OSError, subprocess.SubprocessError) as exc:
        return MpsStatus(False, reason=f"{MPS_CONTROL}: {exc}")
    return MpsStatus(ok, ok, pipe_dir if ok else None, "started" if ok else "started but does not answer")


def stop_mps(status: MpsStatus, query: DeviceQuery | None = None) -> None:
    """Stop a daemon this process started (one found running is left alone)."""
    if status.started_here and status.pipe_dir:
        try:
            (query or DeviceQuery()).mps("quit\n", _mps_env(status.pipe_dir))
        except (OSError, subprocess.SubprocessError):
            pass


def timing_lock_path(gpu: GpuInfo) -> str:
    """The file whose lock a GPU's measuring workers hold while timing (measure.timing_window), in
    this user's private runtime directory (another user's file could not be opened, or held).
    Named by the GPU's UUID, so every runner and queue worker of this user measuring that GPU
    shares it, whatever CUDA_VISIBLE_DEVICES renumbered."""
    return os.path.join(user_runtime_dir("locks"), f"timing-{gpu.uuid or gpu.index}.lock")


def queue_worker_env(device_index: int, query: DeviceQuery | None = None) -> dict[str, str]:
    """The environment of a remote queue's sandboxed measuring worker for GPU ``device_index``
    (measure.measure_payload_isolated): TVM's runtime only and the GPU's timing lock (the host's
    DOP slots on that GPU time one candidate at a time). No kernel cache: these workers measure
    every team's candidates, whose payloads carry their kernels (cuda_binaries)."""
    gpu = next(
        (g for g in list_gpus(query) if g.index == int(device_index)), GpuInfo(int(device_index), "", "", "", 0)
    )  # not listed: its lock named by index
    return {**RUNTIME_ONLY_ENV, TIMING_LOCK_VAR: timing_lock_path(gpu)}


def gpu_slot_groups(
    gpus: Sequence[GpuInfo], mps: MpsStatus, max_dop_per_gpu: int = MAX_DOP_PER_GPU, exclusive_timing: bool = True
) -> list[GpuSlotGroup]:
    """One slot group per GPU; each worker sees only its GPU (as device 0) and, with MPS, the daemon.
    ``exclusive_timing``: the group's workers time one candidate at a time (module doc); False
    times them concurrently, the ablation gpu_check.sh measures."""
    groups = []
    for gpu in gpus:
        env = {"CUDA_VISIBLE_DEVICES": gpu.uuid or str(gpu.index)}
        if mps.running and mps.pipe_dir:
            env["CUDA_MPS_PIPE_DIRECTORY"] = mps.pipe_dir
        if exclusive_timing:
            env[TIMING_LOCK_VAR] = timing_lock_path(gpu)
        parallel = exclusive_timing or mps.running
        groups.append(GpuSlotGroup(gpu, max(1, int(max_dop_per_gpu)) if parallel else 1, mps.running, env))
    return groups
