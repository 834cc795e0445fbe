"""A tuning run with Trimmer, executed in-process (the Celery task's body, no broker): the run
stores its pre-empted tasks, filter counts, stop reason and the energy it saved, with the basis."""
from __future__ import annotations

import pytest

from tuning import services
from tuning.models import DopRound, TuningRun, TuningTask

pytestmark = [pytest.mark.slow, pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

FAST = {"search_population": 48, "genetic_num_iters": 1, "seed": 1,
        "evaluator": {"number": 2, "repeat": 1, "min_repeat_ms": 5}}


def test_execute_run_with_trimmer_stores_preemptions_and_savings(model_a, user_owner, no_broker):
    # Aggressive on purpose: a task is pre-empted as soon as a batch brings less than a 90 % gain,
    # so the run ends long before its budget and the savings are certain.
    run = services.start_run(
        actor=user_owner, model=model_a, max_trials=120, trials_per_round=8,
        target={"kind": "llvm", "num-cores": 2}, options=FAST, trimmer=True,
        trimmer_options={"plateau_rounds": 1, "min_improvement": 0.9, "judge_after_trials": 0,
                         "filter_oversample": 2, "filter_keep_explore": 0.0, "min_trial_share": 0,
                         "max_resumes": 0, "filter_min_samples": 4},
        enqueue=False)
    assert no_broker == []
    assert services.execute_run(run_id=run.pk, worker="in-process") == TuningRun.Status.SUCCEEDED
    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    assert run.outputs_match is True and run.tuned_latency_s > 0

    preempted = TuningTask.objects.filter(run=run, status=TuningTask.Status.PREEMPTED)
    assert preempted.exists()
    for task in preempted:
        assert task.preempted_at_trial and 0 < task.preempted_at_trial <= task.trials + 8
    assert run.summary["trimmer"]["preempted_tasks"]

    assert run.candidates_generated > run.candidates_filtered > 0
    rounds = DopRound.objects.filter(run=run, n_generated__isnull=False)
    assert rounds.exists() and all(r.n_generated - r.n_filtered - r.n_not_sent == r.n_candidates for r in rounds)
    assert run.candidates_not_sent == sum(r.n_not_sent for r in rounds)  # the run's total, on the run

    assert run.stop_reason  # why Trimmer ended a successful run early
    assert 0 < run.trials_done < run.max_trials
    # the engine's count of trials left (duplicates TVM measured again count as spent there)
    assert 0 < run.trials_saved <= run.max_trials - run.trials_done
    assert run.energy_joules > 0 and run.energy_source
    assert run.energy_saved_joules == pytest.approx(run.trials_saved * run.energy_joules / run.trials_done)
    assert run.savings_basis.startswith("Estimated") and run.energy_source in run.savings_basis
    assert run.energy_saved_kind == "estimated"
