"""The energy side of a run: the watts model it started with and the meter this host offers for it."""
from __future__ import annotations

from core.selectors import energy_model
from tuning.engine.energy import available_meters
from tuning.models import TuningRun

WATTS_KEYS = ("cpu_watts_per_core", "gpu_board_watts")


def run_energy_model(run: TuningRun) -> dict[str, float]:
    """The watts model the run started with; the current platform model for runs from before snapshots."""
    snapshot = run.energy_model or {}
    if all(k in snapshot for k in WATTS_KEYS):
        return {k: float(snapshot[k]) for k in WATTS_KEYS}
    current = energy_model()
    return {k: float(snapshot.get(k, getattr(current, k))) for k in WATTS_KEYS}


def energy_model_snapshot(current=None) -> dict[str, float]:
    """The platform's watts model (`current`, else read now), stored on a run when it starts."""
    current = current if current is not None else energy_model()
    return {k: getattr(current, k) for k in WATTS_KEYS}


def make_energy_meter(run: TuningRun):
    """The best meter of this host for the run: RAPL or a CPU model, plus NVML for CUDA targets."""
    watts = run_energy_model(run)
    return available_meters(cpu_watts_per_core=watts["cpu_watts_per_core"], gpu_board_watts=watts["gpu_board_watts"],
                            want_gpu=run.target.get("kind") == "cuda")
