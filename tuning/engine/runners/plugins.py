"""Builders and runners by name: the engine's plug points, like TVM's own
``Builder.create(kind)`` / ``Runner.create(kind)``.

:func:`make_builder` / :func:`make_runner` look ``kind`` up in a small registry of factories
``(PlugContext) -> builder | runner``; :func:`register_builder` / :func:`register_runner` add one
(``parallel=True``: a runner that measures several candidates at once, so DOPpler's final serial
re-measure applies to it). Shipped kinds:

- builders: ``"persistent"`` (:class:`~.builder.PersistentBuilder`: long-lived workers, ``.so``),
  ``"local"`` (TVM's ``LocalBuilder``: the stock baseline);
- runners: ``"pooled"`` (:class:`~.runner.PooledAsyncRunner`: core-partitioned pool, DOPpler),
  ``"distributed"`` (:class:`~.runner.DistributedRunner`: per-device measure queues),
  ``"local"`` (TVM's ``LocalRunner``: the stock baseline).

:func:`build_all` and :func:`measure_serially` drive any of them outside the search (imported
seeds, the final re-measure).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

from tvm.s_tir import meta_schedule as ms

from tuning.engine.config import TuningConfig
from tuning.engine.measuring import gpu_slots
from tuning.engine.measuring.measure import MeasureOutcome
from tuning.engine.measuring.slots import Slot
from tuning.engine.measuring.timer import EvaluatorConfig, default_evaluator
from tuning.engine.process import sandbox
from tuning.engine.process.procpool import available_cpus
from tuning.engine.runners.builder import PersistentBuilder
from tuning.engine.runners.distributed import DistributedRunner
from tuning.engine.runners.measure_jobs import MeasureJob, MeasureLedger
from tuning.engine.runners.multi_device import MultiDeviceRunner
from tuning.engine.runners.pooled import PooledAsyncRunner

__all__ = [
    "PlugContext",
    "make_builder",
    "make_runner",
    "register_builder",
    "register_runner",
    "builder_kinds",
    "runner_kinds",
    "is_parallel_runner",
    "build_all",
    "measure_serially",
]


@dataclasses.dataclass
class PlugContext:
    """What a builder or runner factory may use."""

    config: TuningConfig
    work_dir: str
    device_type: str  # "cpu", "cuda", ...
    threads: int  # deployment (= measurement) thread count
    cores: list[int]  # cores to measure on
    ledger: MeasureLedger  # per-candidate facts a runner hands to the measure callback


Factory = Callable[[PlugContext], Any]
_BUILDERS: dict[str, Factory] = {}
_RUNNERS: dict[str, Factory] = {}
_PARALLEL_RUNNERS: set[str] = set()


def register_builder(kind: str) -> Callable[[Factory], Factory]:
    def add(factory: Factory) -> Factory:
        _BUILDERS[kind] = factory
        return factory

    return add


def register_runner(kind: str, *, parallel: bool = False) -> Callable[[Factory], Factory]:
    def add(factory: Factory) -> Factory:
        _RUNNERS[kind] = factory
        (_PARALLEL_RUNNERS.add if parallel else _PARALLEL_RUNNERS.discard)(kind)
        return factory

    return add


def builder_kinds() -> list[str]:
    return sorted(_BUILDERS)


def runner_kinds() -> list[str]:
    return sorted(_RUNNERS)


def is_parallel_runner(kind: str) -> bool:
    return kind in _PARALLEL_RUNNERS


def _lookup(registry: dict[str, Factory], what: str, kind: str) -> Factory:
    try:
        return registry[kind]
    except KeyError:
        raise ValueError(f"unknown {what} {kind!r} (known: {', '.join(sorted(registry))})") from None


def make_builder(kind: str, ctx: PlugContext):
    """A MetaSchedule builder of ``kind`` for one run."""
    return _lookup(_BUILDERS, "builder", kind)(ctx)


def make_runner(kind: str, ctx: PlugContext):
    """A MetaSchedule runner of ``kind`` for one run."""
    return _lookup(_RUNNERS, "runner", kind)(ctx)


# --------------------------------------------------------------------------- shipped kinds
@register_builder("persistent")
def _persistent_builder(ctx: PlugContext) -> PersistentBuilder:
    cfg = ctx.config
    return PersistentBuilder(
        max_workers=cfg.builder_workers or len(available_cpus()),
        timeout_sec=max(cfg.timeout_sec, 60.0),
        # a fresh temporary folder, not the run's work dir: the media volume is mounted noexec (a
        # candidate .so must be loadable) and build workers write it as the sandbox account
        artifact_dir=None,
    )


@register_builder("local")
def _local_builder(ctx: PlugContext):
    # TVM's default timeout (30 s) also covers each fresh worker's ~11 s
    # `import tvm.s_tir.tensor_intrin`; on a loaded host that import alone
    # times out, so the stock baseline gets a generous build timeout.
    cfg = ctx.config
    return ms.builder.LocalBuilder(
        max_workers=cfg.builder_workers or len(available_cpus()),
        timeout_sec=max(cfg.timeout_sec, 120.0),
        initializer=sandbox.stock_worker_init,
    )


@register_runner("pooled", parallel=True)
def _pooled_runner(ctx: PlugContext):
    cfg = ctx.config
    if ctx.device_type != "cpu":
        return _gpu_runner(ctx)
    return PooledAsyncRunner(
        evaluator=cfg.evaluator,
        threads=ctx.threads,
        cpu_ids=ctx.cores,
        dop=cfg.dop,
        dop_rule=cfg.dop_rule,
        timeout_sec=cfg.timeout_sec,
        ledger=ctx.ledger,
        worker_limits=sandbox.default_limits(gpu=False),
    )


def _evaluator_for(ctx: PlugContext) -> EvaluatorConfig:
    """The run's evaluator; a run that kept the default gets its device's default (GPUs: more samples)."""
    cfg = ctx.config
    return default_evaluator(ctx.device_type) if cfg.evaluator == EvaluatorConfig() else cfg.evaluator


def gpu_worker_slots(group: gpu_slots.GpuSlotGroup, cores: Sequence[int]) -> list[Slot]:
    """A GPU group's slots: one MPS client each, its host thread on a core of its own where possible."""
    return [Slot(k, (cores[k % len(cores)],), 1) for k in range(group.max_dop)]


def _gpu_runner(ctx: PlugContext):
    """One pooled runner per GPU (slot group: MPS clients of that device, its own DOP rule and
    error samples); several GPUs are fed by a MultiDeviceRunner. Raises NeedsGPU without a GPU."""
    cfg = ctx.config
    gpus = gpu_slots.require_gpus()
    mps = gpu_slots.ensure_mps(gpu_slots.mps_pipe_dir())
    runners = [
        PooledAsyncRunner(
            evaluator=_evaluator_for(ctx),
            threads=1,
            cpu_ids=ctx.cores,
            dop=cfg.dop if group.max_dop > 1 else 1,
            dop_rule=cfg.dop_rule,
            timeout_sec=cfg.timeout_sec,
            ledger=ctx.ledger,
            slots=gpu_worker_slots(group, ctx.cores),
            worker_env=group.env,
            worker_limits=sandbox.default_limits(gpu=True),
            device_index=0,
        )
        for group in gpu_slots.gpu_slot_groups(gpus, mps)
    ]
    return runners[0] if len(runners) == 1 else MultiDeviceRunner(runners)


@register_runner("distributed", parallel=True)
def _distributed_runner(ctx: PlugContext) -> DistributedRunner:
    cfg = ctx.config
    if cfg.distributed_submit is None or not cfg.device_queue:
        raise ValueError("distributed runner needs distributed_submit and device_queue")
    return DistributedRunner(
        cfg.distributed_submit,
        cfg.device_queue,
        evaluator=_evaluator_for(ctx),
        threads=cfg.threads,
        ledger=ctx.ledger,
        dop=cfg.dop,
        dop_rule=cfg.dop_rule,
        target_device_type=ctx.device_type,
    )


@register_runner("local")
def _local_runner(ctx: PlugContext):
    cfg = ctx.config
    return ms.runner.LocalRunner(
        evaluator_config=tvm_evaluator_config(cfg.evaluator),
        timeout_sec=cfg.timeout_sec,
        initializer=functools.partial(sandbox.stock_worker_init, gpu=ctx.device_type != "cpu"),
    )


# --------------------------------------------------------------------------- outside the search
def build_all(builder, mods: Sequence, target) -> list[str | None]:
    """Artifact path of each module (None where its build failed)."""
    if hasattr(builder, "build_many"):
        return builder.build_many(list(mods), target)  # all at once on the pool
    paths = []
    for m in mods:
        res = builder.build([ms.builder.BuilderInput(m, target)])[0]
        paths.append(None if res.error_msg else str(res.artifact_path))
    return paths


def measure_serially(runner, jobs: Sequence[MeasureJob]) -> list[MeasureOutcome]:
    """MeasureOutcome of each job, one at a time, with whichever runner the run uses."""
    if hasattr(runner, "measure_serial"):  # ours: the pooled runner's serial worker, one queue
        return runner.measure_serial(jobs)
    out = []
    for job in jobs:  # TVM's LocalRunner (stock mode)
        args = [ms.arg_info.ArgInfo.from_json(a) for a in job.args_info]
        res = runner.run([ms.runner.RunnerInput(job.path, job.device_type, args)])[0].result()
        secs = [float(x) for x in res.run_secs] if res.run_secs is not None else []
        out.append(MeasureOutcome(secs, str(res.error_msg) if res.error_msg else None, "local"))
    return out


def tvm_evaluator_config(evaluator: EvaluatorConfig) -> ms.runner.EvaluatorConfig:
    """The equivalent ``ms.runner.EvaluatorConfig``, for TVM's own runners (here, on the compiler side:
    a runtime-only measuring worker never imports MetaSchedule)."""
    return ms.runner.EvaluatorConfig(
        number=evaluator.number,
        repeat=evaluator.repeat,
        min_repeat_ms=evaluator.min_repeat_ms,
        enable_cpu_cache_flush=evaluator.enable_cpu_cache_flush,
    )
