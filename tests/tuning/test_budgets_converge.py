"""Budgets that converge (issue 12): a budget below tasks x MIN_TRIALS_PER_TASK is refused at start by
every entry point, saying the minimum for this model; a task no candidate of which was measured
successfully is never marked done."""
from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
from django.core.management import CommandError, call_command

from core.exceptions import ServiceError
from core.models import DLModel
from tuning import adapters, services
from tuning.models import MIN_TRIALS_PER_TASK, TuningRun, TuningTask

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

N_TASKS = 5
MINIMUM = N_TASKS * MIN_TRIALS_PER_TASK
TOO_FEW = MINIMUM - 1


@pytest.fixture
def counted_model(model_a):
    DLModel.objects.filter(pk=model_a.pk).update(num_tuning_tasks=N_TASKS)
    model_a.refresh_from_db()
    return model_a


def _says_the_minimum(text: str) -> bool:
    return f"{N_TASKS} tuning tasks" in text and f"at least {MINIMUM} trials" in text


def test_service_refuses_a_budget_below_the_minimum(counted_model, user_owner):
    with pytest.raises(ServiceError) as err:
        services.start_run(actor=user_owner, model=counted_model, max_trials=TOO_FEW, enqueue=False)
    assert err.value.field == "max_trials" and _says_the_minimum(str(err.value))
    assert services.start_run(actor=user_owner, model=counted_model, max_trials=MINIMUM, enqueue=False)
    assert TuningRun.objects.count() == 1


def test_a_round_too_large_for_every_task_to_get_one_is_lowered(counted_model, user_owner):
    """The run's trials per round (what the engine gets) leaves every task its first round in the budget;
    a model with no task count, or a round that already fits, keeps what was asked."""
    run = services.start_run(actor=user_owner, model=counted_model, max_trials=MINIMUM, trials_per_round=32,
                             enqueue=False)
    assert run.trials_per_round == MIN_TRIALS_PER_TASK and run.trials_per_round * N_TASKS <= run.max_trials
    roomy = services.start_run(actor=user_owner, model=counted_model, max_trials=N_TASKS * 64, trials_per_round=32,
                               enqueue=False)
    assert roomy.trials_per_round == 32


def test_api_answers_400_with_the_minimum(api_owner, counted_model):
    resp = api_owner.post("/api/runs/", {"model": counted_model.pk, "max_trials": TOO_FEW}, format="json")
    assert resp.status_code == 400 and _says_the_minimum(resp.content.decode()), resp.content
    assert not TuningRun.objects.exists()


def test_start_form_shows_the_minimum(client, user_owner, counted_model):
    client.force_login(user_owner)
    resp = client.post("/runs/new/", {"model": counted_model.pk, "target_kind": "llvm", "num_cores": 2,
                                      "max_trials": TOO_FEW, "trials_per_round": 8, "measurement_mode": "doppler",
                                      "dop_mode": "auto", "dop_fixed": "", "threads": "", "search_population": "",
                                      "seed": ""})
    assert resp.status_code == 200 and _says_the_minimum(resp.content.decode())
    assert not TuningRun.objects.exists()


def test_tune_command_refuses_with_the_minimum(counted_model):
    with pytest.raises(CommandError) as err:
        call_command("tune", str(counted_model.pk), "--trials", str(TOO_FEW), "--no-progress",
                     stdout=io.StringIO(), stderr=io.StringIO())
    assert _says_the_minimum(str(err.value))
    assert not TuningRun.objects.exists()


def _record(task_index, key, latency, error=""):
    return SimpleNamespace(task_index=task_index, task_name=f"task{task_index}", round_index=0, candidate_key=key,
                           run_secs=[latency] * 3 if latency else [], latency_s=latency, build_secs=0.1,
                           run_wall_secs=0.01, error=error, worker="w", dop=2, remeasured_serially=False,
                           serial_secs=None)


def test_a_task_without_a_valid_measurement_is_never_done(model_a, user_owner, monkeypatch):
    """The finish (real services.finish_succeeded; only TVM's compile-and-compare replaced) marks the task
    whose every candidate failed, and the one never measured, as not tuned, though the engine listed them."""
    run = services.start_run(actor=user_owner, model=model_a, max_trials=64, enqueue=False)
    lease = services.claim_run(run.pk, worker="t")
    sink = services.DatabaseSink(run.pk, lease)
    sink.on_tasks([SimpleNamespace(index=i, name=f"task{i}", flops=1e6, weight=1.0) for i in range(3)])
    sink.on_measurements([_record(0, "a0", 2e-3), _record(1, "b0", None, error="build failed")])
    work = adapters.run_work_dir(run.pk)
    (work / "database_tuning_record.json").write_text("[]")
    (work / "database_workload.json").write_text("[]")
    monkeypatch.setattr("tuning.adapters.compile_and_compare", lambda model_proto, work_dir, run: {
        "tuned_latency_s": 1e-3, "untuned_latency_s": 2e-3, "outputs_match": True, "max_abs_diff": 0.0})
    summary = SimpleNamespace(status="succeeded", tasks=[{"index": i} for i in range(3)], final_dop=2,
                              mean_parallel_error=0.01, trimmer=None)
    services.finish_succeeded(run.pk, lease, None, summary, work)
    states = dict(TuningTask.objects.filter(run=run).values_list("index", "status"))
    assert states == {0: "done", 1: "untuned", 2: "untuned"}


def test_start_form_suggests_a_budget_from_the_task_count(client, user_owner, counted_model):
    from tuning.models import suggested_trials_for

    client.force_login(user_owner)
    html = client.get(f"/runs/new/?model={counted_model.pk}").content.decode()
    assert f"has {N_TASKS} tuning tasks: at least {MINIMUM} trials" in html
    assert f'value="{suggested_trials_for(N_TASKS)}"' in html


def test_the_estimate_names_the_tasks_it_lacks(model_a, user_owner, client):
    run = services.start_run(actor=user_owner, model=model_a, max_trials=64, enqueue=False)
    sink = services.DatabaseSink(run.pk, services.claim_run(run.pk, worker="t"))
    sink.on_tasks([SimpleNamespace(index=i, name=f"task{i}", flops=1e6, weight=1.0) for i in range(2)])
    sink.on_measurements([_record(0, "a0", 2e-3), _record(1, "b0", None, error="build failed")])
    sink.flush()
    TuningRun.objects.filter(pk=run.pk).update(estimated_latency_s=2e-3)
    client.force_login(user_owner)
    html = client.get(f"/runs/{run.pk}/").content.decode()
    assert "2.000 ms (without 1 unmeasured task(s): task1)" in html
