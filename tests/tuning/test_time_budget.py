"""A run's time budget (max_minutes): every entry point takes and bounds it alike, and once it is spent
(earlier attempts included) the sink finishes tuning, so the run succeeds with what it found and says why."""
from __future__ import annotations

import io
import itertools
import json

import pytest
from django.core.management import CommandError, call_command

from core.exceptions import ServiceError
from tuning import adapters, services
from tuning.models import RUN_LIMITS, TuningRun

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

TOO_LONG = RUN_LIMITS["max_minutes"][1] + 1


@pytest.mark.parametrize("bad", [0, -5, TOO_LONG, True, "30", 2.5])
def test_the_service_refuses_a_time_budget_outside_the_table(model_a, user_owner, bad):
    with pytest.raises(ServiceError) as err:
        services.start_run(actor=user_owner, model=model_a, max_trials=8, max_minutes=bad, enqueue=False)
    assert err.value.field == "max_minutes" and "max_minutes" in err.value.message
    assert TuningRun.objects.count() == 0


def test_the_api_stores_and_shows_the_time_budget(api_owner, model_a):
    resp = api_owner.post("/api/runs/", {"model": model_a.pk, "max_trials": 16, "max_minutes": 30}, format="json")
    assert resp.status_code == 201, resp.content
    assert resp.json()["max_minutes"] == 30 and TuningRun.objects.get().max_minutes == 30
    plain = api_owner.post("/api/runs/", {"model": model_a.pk, "max_trials": 16}, format="json")
    assert plain.status_code == 201 and plain.json()["max_minutes"] is None


@pytest.mark.parametrize("bad", [0, TOO_LONG, "soon", [30], {"minutes": 30}])
def test_the_api_refuses_a_bad_time_budget_with_a_message(api_owner, model_a, bad):
    resp = api_owner.post("/api/runs/", {"model": model_a.pk, "max_trials": 16, "max_minutes": bad}, format="json")
    assert resp.status_code == 400 and "max_minutes" in resp.json()["errors"]
    assert TuningRun.objects.count() == 0


def test_the_command_takes_minutes_and_refuses_a_bad_budget(model_a):
    with pytest.raises(CommandError, match="max_minutes"):
        call_command("tune", str(model_a.pk), "--minutes", "0", "--no-progress", stdout=io.StringIO(),
                     stderr=io.StringIO())
    assert TuningRun.objects.count() == 0


def _sink_at(run, lease, seconds: list[float]):
    sink = adapters.DatabaseSink(run.pk, lease)
    times = iter(seconds)
    sink.clock = lambda: next(times)
    sink._started = sink.clock()
    return sink


def test_the_sink_finishes_tuning_once_the_budget_is_spent_counting_earlier_attempts(model_a, user_owner):
    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, max_minutes=2, enqueue=False)
    TuningRun.objects.filter(pk=run.pk).update(wall_seconds=90.0)  # an earlier attempt tuned for 1.5 min
    lease = services.claim_run(run.pk, worker="w")
    sink = _sink_at(run, lease, [1000.0, 1029.0, 1030.0])
    assert sink.control() is None and sink.stop_reason == ""  # 90 + 29 s of 120
    assert sink.control() == "finish"  # 90 + 30 s
    assert "time budget (2 min" in sink.stop_reason


def test_a_run_without_a_time_budget_is_never_finished_by_the_sink(model_a, user_owner):
    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    lease = services.claim_run(run.pk, worker="w")
    sink = _sink_at(run, lease, [0.0, 10 ** 7])
    assert sink.control() is None


def test_the_engine_is_given_what_is_left_of_the_time_budget(model_a, user_owner, monkeypatch):
    """The sink finishes the search at the budget; the engine gets the same seconds (earlier attempts'
    time taken off) to pace its first round robin so that every task gets a turn before then."""
    seen = []

    def engine_stops_at_once(sink, model_proto, config):
        seen.append(config.time_budget_s)
        raise RuntimeError("stop here")

    monkeypatch.setattr("tuning.adapters.run_engine", engine_stops_at_once)
    timed = services.start_run(actor=user_owner, model=model_a, max_trials=8, max_minutes=2, enqueue=False)
    TuningRun.objects.filter(pk=timed.pk).update(wall_seconds=30.0)  # an earlier attempt tuned for 30 s
    services.execute_run(run_id=timed.pk, worker="t")
    untimed = services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    services.execute_run(run_id=untimed.pk, worker="t")
    assert seen == [90.0, None]


@pytest.mark.slow
def test_a_run_at_its_time_budget_succeeds_with_what_it_measured(model_a, user_owner, monkeypatch):
    """The real engine, in its child process: the sink's clock moves 25 s a poll, so the one-minute budget
    is spent at the third round; the run succeeds, compiled and compared, and says why it ended."""
    clock = itertools.count(0.0, 25.0)
    monkeypatch.setattr(adapters.DatabaseSink, "clock", staticmethod(lambda: next(clock)))
    run = services.start_run(
        actor=user_owner, model=model_a, max_trials=400, max_minutes=1, trials_per_round=8,
        target={"kind": "llvm", "num-cores": 2}, enqueue=False,
        options={"search_population": 32, "genetic_num_iters": 1, "seed": 1,
                 "evaluator": {"number": 2, "repeat": 1, "min_repeat_ms": 5}})
    assert services.execute_run(run_id=run.pk, worker="in-process") == TuningRun.Status.SUCCEEDED
    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    assert 0 < run.trials_done < run.max_trials and run.tuned_latency_s > 0 and run.outputs_match is True
    assert run.stop_reason.startswith("Finished at the run's time budget (1 min")
    summary = json.loads(json.dumps(run.summary))
    assert summary.get("stop_reason")  # the engine's own record: the caller finished it
    # the budget ended at the third poll, two tasks into the round robin: the others got one short round
    # each past it rather than TVM's default schedule, and the reason says so
    assert not run.tasks.filter(measurements__isnull=True).exists()
    assert summary["late_first_rounds"] and "got one short round past the budget" in run.stop_reason


def test_the_command_prints_why_tuning_ended():
    from tuning.management.commands.tune import Command

    out = io.StringIO()
    summary = {"run": 1, "status": "succeeded", "wall_seconds": 61.0, "measurements": 40, "final_dop": 1,
               "resolved_target": None, "tasks": [], "tuned_latency_ms": None, "onnxruntime_latency_ms": None,
               "onnxruntime_error": "", "stop_reason": "Finished at the run's time budget (1 min of tuning); ..."}
    Command(stdout=out)._print(summary)
    assert "Finished at the run's time budget (1 min" in out.getvalue()
