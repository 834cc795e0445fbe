"""The compiled checkpoint: once every task has a record the engine compiles the model from the records
committed by then (in a sandboxed child), times it, reports it to the sink and keeps it in the work dir; the
estimate it calibrates is labelled as such. Taken once a run, only where it can pay, never fatal."""

from __future__ import annotations

import math

import pytest

from tuning.engine import checkpoint as cp
from tuning.engine import verdict
from tuning.engine.config import TuningConfig
from tuning.engine.events import ListSink
from tuning.engine.measuring.timer import EvaluatorConfig
from tuning.engine.session import run_tuning
from tuning.engine.testing import matmul_primfunc, tiny_cnn_onnx
from tuning.engine.workdir import CHECKPOINT_FILE, load_checkpoint


def _cfg(cpu_target, work_dir, **kw):
    base = dict(target=cpu_target, max_trials=32, trials_per_round=8, search_population=48, genetic_num_iters=1,
                evaluator=EvaluatorConfig(number=2, repeat=1, min_repeat_ms=5), seed=1, work_dir=str(work_dir))
    return TuningConfig(**{**base, **kw})


# ----------------------------------------------------------------------------------------- the rule
@pytest.mark.parametrize(
    "trials_done, budget, elapsed_s, deadline_left_s, expected",
    [
        (500, 2000, 500.0, None, True),  # 3/4 of the trials ahead, 1,500 s of them
        (1600, 2000, 1600.0, None, False),  # a fifth ahead: the final compile is near
        (40, 64, 20.0, None, False),  # 24 trials ahead, 12 s of them: a compile would cost more than it tells
        (500, 100_000, 540.0, 1260.0, True),  # a 30-minute budget, the first round robin ended at 9 minutes
        (500, 100_000, 1500.0, 300.0, False),  # ... at 25 minutes: a sixth of the time ahead
        (500, 100_000, 60.0, 100.0, False),  # a short time budget: 100 s ahead
        (0, 2000, 10.0, None, False),  # nothing measured: no rate
    ],
)
def test_a_checkpoint_is_taken_only_with_enough_search_ahead(trials_done, budget, elapsed_s, deadline_left_s,
                                                             expected):
    assert cp.worth_taking(trials_done=trials_done, budget=budget, elapsed_s=elapsed_s,
                           deadline_left_s=deadline_left_s) is expected


def test_the_checkpoint_in_words():
    # resnet18's first round on a 2-core znver3 VM
    taken = {"trials": 577, "estimate_s": 47.64e-3, "compiled_s": 66.71e-3, "compiled_iqr_s": 4.455e-3}
    assert verdict.checkpoint_note(taken) == (
        "66.71 ms (IQR 4.455 ms) compiled after 577 trials, when the per-task estimate read 47.64 ms: 40 % above it")
    failed = {"trials": 1234, "estimate_s": 1.6e-3, "error": "EngineCrashed: the TVM compiler crashed"}
    assert verdict.checkpoint_note(failed) == "not timed after 1,234 trials: EngineCrashed: the TVM compiler crashed"
    assert verdict.checkpoint_note(None) == ""
    # the estimate's gap note is the final one's, with or without a checkpoint
    assert "checkpoint" not in verdict.estimate_gap(1.69e-3, 2.31e-3)["note"]


def test_what_the_platform_keeps_of_a_reported_checkpoint():
    hostile = {"at": "first round" * 10, "trials": True, "estimate_s": 1e-3, "compiled_s": math.nan,
               "compiled_iqr_s": -1.0, "compile_s": "12", "timing_s": 1.0, "wall_s": float("inf"),
               "shell": "rm -rf /", "error": ""}
    assert cp.as_reported(hostile) is None  # no latency and no error: nothing to show
    kept = cp.as_reported({**hostile, "compiled_s": 2e-3, "trials": 7})
    assert kept == {"at": ("first round" * 10)[:40], "trials": 7, "estimate_s": 1e-3, "compiled_s": 2e-3,
                    "timing_s": 1.0}
    failed = cp.as_reported({"trials": 7, "estimate_s": 1e-3, "compiled_s": 2e-3, "error": "x" * 5000})
    assert "compiled_s" not in failed and len(failed["error"]) == 2000  # a failed one carries no latency
    assert cp.as_reported([1, 2]) is None and cp.as_reported({"compiled_s": 1e-3}) is None


# ----------------------------------------------------------------------------------------- in a run
def test_a_run_takes_one_checkpoint_once_every_task_has_a_record_and_a_resumed_call_keeps_it(tmp_path, cpu_target):
    model = tiny_cnn_onnx()
    sink = ListSink()
    summary = run_tuning(model, _cfg(cpu_target, tmp_path, compiled_checkpoint=True), sink)
    assert summary.status == "succeeded"
    taken = summary.compiled_checkpoint
    assert "error" not in taken, taken
    assert sink.checkpoints == [taken] and load_checkpoint(str(tmp_path)) == taken
    n_tasks = len(summary.tasks)
    # after the first round robin (every task measured), before the budget was spent
    assert n_tasks <= taken["trials"] < summary.n_total_records
    assert taken["compiled_s"] > 0 and taken["compiled_iqr_s"] >= 0 and taken["compile_s"] > 0
    assert 0 < taken["estimate_s"] and taken["wall_s"] >= taken["compile_s"] + taken["timing_s"]
    assert summary.phase_secs["checkpoint"] == taken["wall_s"]

    more = ListSink()
    resumed = run_tuning(model, _cfg(cpu_target, tmp_path, compiled_checkpoint=True, max_trials=40), more)
    assert resumed.status == "succeeded" and more.records  # it tuned on
    # and took no second checkpoint: the first is reported again (its report may not have reached the caller)
    assert more.checkpoints == [taken] and resumed.compiled_checkpoint == taken


def test_no_checkpoint_when_switched_off_or_for_a_kernel(tmp_path, cpu_target):
    for i, (model, kw) in enumerate([
        (tiny_cnn_onnx(), {"compiled_checkpoint": False, "max_trials": 16}),
        (matmul_primfunc(64), {"compiled_checkpoint": True, "max_trials": 16}),  # one kernel: its record is it
    ]):
        sink = ListSink()
        summary = run_tuning(model, _cfg(cpu_target, tmp_path / str(i), **kw), sink)
        assert summary.status == "succeeded" and sink.records
        assert summary.compiled_checkpoint is None and sink.checkpoints == []
        assert not (tmp_path / str(i) / CHECKPOINT_FILE).exists()


@pytest.mark.parametrize("kw, device_type, runner", [
    ({"mode": "stock"}, "cpu", None),  # the baseline TVM offers compiles at the end only
    ({}, "cuda", None),  # a GPU's measuring workers hold its timing lock
    ({"runner": "distributed"}, "cpu", "distributed"),  # its kernels are timed on another host
])
def test_where_the_default_takes_no_checkpoint(tmp_path, cpu_target, kw, device_type, runner):
    from types import SimpleNamespace

    cfg = _cfg(cpu_target, tmp_path, **kw)
    run = SimpleNamespace(cfg=cfg, device_type=device_type, model=tiny_cnn_onnx(), work_dir=str(tmp_path))
    assert cp.hook(run, 1000) is None
    if device_type == "cpu" and runner is None:  # the same run in doppler mode gets one
        assert cp.hook(SimpleNamespace(**{**vars(run), "cfg": _cfg(cpu_target, tmp_path)}), 1000)


def test_a_checkpoint_that_fails_is_recorded_and_the_run_goes_on(tmp_path, cpu_target, monkeypatch):
    """The compiler crashing at the checkpoint (its child killed) costs the checkpoint, not the run."""
    from tuning.engine.process import isolate

    def crash(*args, **kwargs):
        raise isolate.EngineCrashed("the TVM compiler crashed (signal 11, SIGSEGV) while compiling and timing")

    monkeypatch.setattr(isolate, "call_isolated", crash)
    sink = ListSink()
    summary = run_tuning(tiny_cnn_onnx(), _cfg(cpu_target, tmp_path, compiled_checkpoint=True), sink)
    assert summary.status == "succeeded" and summary.n_total_records > failed_at(summary)
    failed = summary.compiled_checkpoint
    assert failed["error"].startswith("EngineCrashed: the TVM compiler crashed") and "compiled_s" not in failed
    assert sink.checkpoints == [failed]
    assert verdict.checkpoint_note(failed).startswith("not timed after ")


def failed_at(summary) -> int:
    return summary.compiled_checkpoint["trials"]


def test_a_relax_module_is_compiled_and_timed_as_an_onnx_model_is(tmp_path, cpu_target):
    """The bench (and any caller of the engine) may hand it a Relax module: its inputs come from ``main``."""
    from tuning.engine.compile.pipeline import onnx_to_relax, relax_input_specs

    model = tiny_cnn_onnx()
    mod = onnx_to_relax(model)
    assert cp.runs_end_to_end(mod) and cp.runs_end_to_end(model) and not cp.runs_end_to_end(matmul_primfunc(64))
    assert relax_input_specs(mod) == {"x": ((1, 3, 16, 16), "float32")}
    timed = cp.compile_and_time(mod, b"", b"", cpu_target, 1)  # no records: TVM's default schedules
    assert timed["compiled_s"] > 0 and timed["compiled_iqr_s"] >= 0 and timed["compile_s"] > 0


def _empty_database(work_dir) -> None:
    from tuning.engine.workdir import DB_RECORDS, DB_WORKLOAD

    for name in (DB_WORKLOAD, DB_RECORDS):
        (work_dir / name).write_bytes(b"")


@pytest.mark.parametrize("should_stop, limit_s, why", [
    (lambda: "cancel", 300.0, "EngineStopped: the run was asked to cancel during the checkpoint"),
    (lambda: None, 0.5, "EngineStopped: the checkpoint took more than 0 s"),
])
def test_a_checkpoint_stops_when_the_run_is_asked_to_or_past_its_limit(tmp_path, cpu_target, should_stop, limit_s,
                                                                     why):
    """The search waits for the checkpoint: a cancel, pause or spent time budget must not wait for a compile."""
    _empty_database(tmp_path)
    stopped = cp.take(tiny_cnn_onnx(), work_dir=str(tmp_path), target=cpu_target, threads=1, estimate_s=1e-3,
                      trials=8, limit_s=limit_s, should_stop=should_stop)
    assert stopped["error"] == why and "compiled_s" not in stopped
    assert load_checkpoint(str(tmp_path)) == stopped  # kept: the run takes no other


def test_a_linked_database_or_checkpoint_file_is_not_read(tmp_path, cpu_target):
    """Sandboxed children may write the work dir: a link planted there must not hand the sandbox a file the
    worker can read, nor put a file of its choosing into the run's summary."""
    from tuning.engine.workdir import DB_WORKLOAD

    _empty_database(tmp_path)
    secret = tmp_path / "worker-secret"
    secret.write_text("SECRET_KEY=...")
    (tmp_path / DB_WORKLOAD).unlink()
    (tmp_path / DB_WORKLOAD).symlink_to(secret)
    refused = cp.take(tiny_cnn_onnx(), work_dir=str(tmp_path), target=cpu_target, threads=1, estimate_s=1e-3,
                      trials=8)
    assert refused["error"].startswith("OSError") and "symbolic links" in refused["error"]  # O_NOFOLLOW
    assert "compiled_s" not in refused

    (tmp_path / CHECKPOINT_FILE).unlink()
    planted = tmp_path / "planted.json"
    planted.write_text('{"estimate_s": 1e-3, "compiled_s": 1e-3, "note": "<script>"}')
    (tmp_path / CHECKPOINT_FILE).symlink_to(planted)
    assert load_checkpoint(str(tmp_path)) is None
