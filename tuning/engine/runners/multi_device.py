"""Several GPUs of one host: one pooled runner per device (its slot group, DOP rule and error samples),
each batch dealt in proportion to the devices' current DOPs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import PyRunner, RunnerInput

from tuning.engine.measuring.measure import MeasureOutcome
from tuning.engine.runners.measure_jobs import (
    EngineFuture,
    MeasureJob,
    deal_by_capacity,
    runner_object,
)

__all__ = ["MultiDeviceRunner"]


@derived_object
class MultiDeviceRunner(PyRunner):
    """Several GPUs of one host: one :class:`PooledAsyncRunner` (slot group, DOP rule, error
    samples) per device; each batch is dealt in proportion to each device's current DOP."""

    def __init__(self, runners: Sequence[Any]) -> None:
        super().__init__()
        if not runners:
            raise ValueError("MultiDeviceRunner needs at least one device runner")
        self.runners = [runner_object(r) for r in runners]
        self.rule = self.runners[0].rule  # the session reports the first device's DOP
        self.ledger = self.runners[0].ledger

    def run(self, runner_inputs: list[RunnerInput]) -> list[EngineFuture]:
        owners = deal_by_capacity(len(runner_inputs), [r.rule.dop for r in self.runners])
        futures: list[Any] = [None] * len(runner_inputs)
        for d, runner in enumerate(self.runners):
            idx = [i for i, o in enumerate(owners) if o == d]
            if idx:
                for i, fut in zip(idx, runner.run([runner_inputs[i] for i in idx])):
                    futures[i] = fut
        return futures

    def wait_idle(self, timeout: float | None = None) -> bool:
        return all(r.wait_idle(timeout) for r in self.runners)

    def measure_serial(self, jobs: Sequence[MeasureJob]) -> list[MeasureOutcome]:
        return self.runners[0].measure_serial(jobs)

    def device_dops(self) -> dict[int, int]:
        return {r.device_index: r.rule.dop for r in self.runners}

    def shutdown(self) -> None:
        for r in self.runners:
            r.shutdown()
