"""The search step of a run: MetaSchedule's evolutionary search over the tasks, with our task
scheduler (stop switch, Trimmer), streaming callback and XGBoost cost model (saved next to the
database, so a resumed run keeps what it learned)."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
import warnings

from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.utils import fork_seed

from tuning.engine.compile.tvm_compat import ensure_tensor_intrin
from tuning.engine.compile.workloads import Task, round_size
from tuning.engine.config import TuningConfig
from tuning.engine.records.cost_model_file import (
    CostModelFileError,
    data_only,
    load_xgb_model,
)
from tuning.engine.runners.measure_jobs import is_infrastructure_failure
from tuning.engine.search.callbacks import StreamingMeasureCallback
from tuning.engine.search.engine_state import EngineState
from tuning.engine.search.first_round import FirstRoundPacer
from tuning.engine.search.skip_known import CallBudget, SkipKnownSearch
from tuning.engine.search.task_scheduler import ControlledScheduler
from tuning.engine.trimmer.filter import make_filtered_search
from tuning.engine.workdir import COST_MODEL_FILE, save_exhausted, save_trimmer_state

log = logging.getLogger(__name__)

__all__ = ["search", "skip_infrastructure_failures", "train_when_needed", "load_cost_model"]

# the sink's control() -> the run's status; "finish" ends the search as a spent budget does
_STATUS = {"cancel": "cancelled", "pause": "paused", "finish": "succeeded"}


def _search_kwargs(cfg: TuningConfig) -> dict:
    kwargs = {}
    if cfg.search_population:
        kwargs["population_size"] = int(cfg.search_population)
        kwargs["init_min_unmeasured"] = min(50, int(cfg.search_population))
    if cfg.genetic_num_iters:
        kwargs["genetic_num_iters"] = int(cfg.genetic_num_iters)
    return kwargs


def _search_strategy(cfg: TuningConfig, task: Task, task_index: int, state: EngineState, budget: CallBudget):
    """TVM's evolutionary search (with Trimmer's filter on, wrapped in FilteredSearch), wrapped so that
    it never proposes a candidate the run has measured (a resumed call's database: SkipKnownSearch)."""
    kwargs = _search_kwargs(cfg)
    trimmer = state.trimmer
    if trimmer is not None and trimmer.config.filter_enabled and trimmer.config.filter_oversample > 1:
        inner = make_filtered_search(
            task_index=task_index, runtime=trimmer, config=trimmer.config, inner_kwargs=kwargs, seed=cfg.seed
        )
    else:
        inner = ms.search_strategy.EvolutionarySearch(**kwargs)
    return SkipKnownSearch(inner, task_index=task_index, task_name=task.name, state=state, budget=budget)


def _task_logger(index: int) -> logging.Logger:
    lg = logging.getLogger(f"tuning.engine.task.{index}")
    if lg.level == logging.NOTSET:
        lg.setLevel(logging.WARNING)
    return lg


def _tune_contexts(tasks: list[Task], target, cfg: TuningConfig, state: EngineState, budget: CallBudget) -> list:
    seeds = fork_seed(cfg.seed, n=len(tasks))
    # not TVM's get_loggers_from_work_dir: it calls logging.config.dictConfig,
    # which rewires the host's (Django's) logging and breaks on unnamed handlers
    contexts = [
        ms.TuneContext(
            mod=t.mod,
            target=target,
            space_generator="post-order-apply",
            search_strategy=_search_strategy(cfg, t, ti, state, budget),
            task_name=t.name,
            logger=_task_logger(ti),
            rand_state=rs,
            num_threads=cfg.search_threads,
        ).clone()
        for ti, (t, rs) in enumerate(zip(tasks, seeds))
    ]
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    return contexts


def skip_infrastructure_failures(cost_model):
    """Keep results that say nothing about their candidate (a lost measurement message, a dead measuring
    worker: `runner.is_infrastructure_failure`) out of the cost model, which would learn them as 1e10 s
    latencies (XGBModel.update prices every result without run_secs at 1e10)."""
    update = cost_model._inst.update

    def filtered(context, candidates, results):
        keep = [i for i, r in enumerate(results) if not is_infrastructure_failure(r.error_msg)]
        if len(keep) == len(results):
            return update(context, candidates, results)
        if keep:
            update(context, [candidates[i] for i in keep], [results[i] for i in keep])
        return None

    cost_model.update = filtered  # the derived object forwards to its Python instance, which C++ calls
    return cost_model


def train_when_needed(cost_model):
    """Defer XGBModel's training to when a booster is used. Stock XGBModel retrains after every batch,
    but predicts at random until it holds ``num_warmup_samples`` results (MetaSchedule's warm-up), so the
    trainings before then are never used (a fifth of a small run's wall time on 2 cores). Deferred: the
    last training asked for runs at the first prediction that uses the booster. Past the warm-up it
    trains as stock does. ``save`` below the warm-up writes the data without training (training there
    was 9 s of a 64-trial matmul run's 45 s on 2 cores, for a booster nothing would use): the model that
    loads it (:func:`load_cost_model`) is still in its warm-up and trains when it leaves it. Saves and
    loads in the platform's data-only format (``cost_model_file.data_only``)."""
    inst = data_only(cost_model)._inst
    train, predict, save = inst._train, inst.predict, inst.save
    pending: dict[str, tuple] = {}

    def deferred_train(xs, ys):
        if inst.data_size >= inst.num_warmup_samples:
            pending.clear()
            return train(xs=xs, ys=ys)
        pending["args"] = (xs, ys)
        return None

    def flush() -> None:
        if "args" in pending:
            xs, ys = pending.pop("args")
            train(xs=xs, ys=ys)

    def predict_when_trained(context, candidates):
        if inst.data_size >= inst.num_warmup_samples:
            flush()
        return predict(context, candidates)

    def save_warm(path):
        if inst.data_size >= inst.num_warmup_samples:
            flush()
        return save(path)

    inst._train, inst.predict, inst.save = deferred_train, predict_when_trained, save_warm
    cost_model.pending_training = lambda: "args" in pending  # tests and diagnostics
    return cost_model


def load_cost_model(cost_model, path: str) -> None:
    """Load a saved cost model into ``cost_model`` (a run's own, or the record cache's for a fresh run),
    also one saved in its warm-up with no booster (``train_when_needed``): the platform's data-only format
    (``cost_model_file``: XGBoost JSON and plain numpy arrays, never a pickle). Anything else, TVM's own
    pickled format included, raises ``CostModelFileError`` unread."""
    load_xgb_model(cost_model._inst, path)


def _cost_model(path: str, resumed: bool, deferred: bool = True):
    # XGBoost trains on the physical cores (TVM's default, num_tuning_cores=None), whatever the search's
    # own thread count: a one-thread search (reproducible from its seed) should not also train on one
    cost_model = skip_infrastructure_failures(
        data_only(ms.cost_model.XGBModel(num_tuning_cores=None, tree_method="auto"))
    )
    if deferred:
        cost_model = train_when_needed(cost_model)
    if os.path.exists(path):  # a resumed run's own, or the record cache's for a fresh run (record_cache)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                load_cost_model(cost_model, path)
        except CostModelFileError as exc:  # the run goes on with a fresh model
            log.warning("cost model %s refused, the search starts without it: %s", path, exc)
        except Exception:  # noqa: BLE001 - a model that does not load costs the run its head start only
            log.warning("cost model %s did not load, the search starts without it", path, exc_info=True)
    return cost_model


def search(
    tasks: list[Task],
    target,
    cfg: TuningConfig,
    *,
    state: EngineState,
    builder,
    runner,
    database,
    work_dir: str,
    budget: int,
    resumed: bool,
    phases: dict[str, float],
    deadline: float | None = None,
) -> str:
    """Spend up to ``budget`` trials on ``tasks``; returns the run's status ("succeeded", or
    "cancelled" / "paused" when the sink asked). ``resumed``: the database held records already
    (the saved cost model is loaded). ``deadline``: when the caller's time budget ends
    (``time.perf_counter``), to pace the first round robin. Times "setup" and "tune" into ``phases``."""
    t0 = time.perf_counter()
    trimmer = state.trimmer
    if cfg.light_intrinsics:
        ensure_tensor_intrin(target)
    contexts = _tune_contexts(tasks, target, cfg, state, CallBudget(budget))
    cm_path = os.path.join(work_dir, COST_MODEL_FILE)
    cost_model = _cost_model(cm_path, resumed, deferred=bool(cfg.deferred_cost_model))
    if trimmer is not None:
        trimmer.cost_model = cost_model  # the filter scores with the tuner's own model
    callbacks = list(ms.MeasureCallback.create("default")) + [StreamingMeasureCallback(state)]
    scheduler = ControlledScheduler(state, seed=cfg.seed, max_trials=budget)
    state.pacer = FirstRoundPacer(
        (i for i in range(len(tasks)) if not math.isfinite(state.best.get(i, math.inf))),
        deadline=deadline,
        measured=lambda: state.n_reported,
    )
    phases["setup"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    scheduler.tune(
        tasks=contexts,
        task_weights=[t.weight for t in tasks],
        max_trials_global=budget,
        max_trials_per_task=min(int(cfg.max_trials_per_task or budget), budget),
        num_trials_per_iter=round_size(cfg.trials_per_round, budget, len(tasks)),
        builder=builder,
        runner=runner,
        measure_callbacks=callbacks,
        database=database,
        cost_model=cost_model,
    )
    phases["tune"] = time.perf_counter() - t0
    save_exhausted(work_dir, state.exhausted)
    with contextlib.suppress(Exception), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cost_model.save(cm_path)
    if trimmer is not None:
        trimmer.cost_model = None
        save_trimmer_state(work_dir, trimmer.to_dict())
    return _STATUS.get(state.stop_reason or "", "succeeded")


# why a succeeded run ended before its trial budget when its sink's control() said "finish"
FINISHED_BY_SINK = "finished by the caller (sink control: finish)"


def run_stop_reason(status: str, trimmer, state) -> str | None:
    """Why a succeeded run stopped before its budget: Trimmer's reason, or the sink's "finish"; else None."""
    if status != "succeeded":
        return None
    if trimmer is not None and trimmer.stop_reason:
        return trimmer.stop_reason
    return FINISHED_BY_SINK if state is not None and state.stop_reason == "finish" else None
