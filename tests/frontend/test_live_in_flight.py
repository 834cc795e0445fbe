"""What is in flight reaches the run row (DatabaseSink.on_progress) and the live page; Trimmer's saving
is labelled estimated in the API."""
import pytest

from tests.frontend.fakes import make_running_run
from tuning.engine.events import ProgressInfo
from tuning.models import TuningRun

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]


def test_in_flight_counts_reach_the_live_json_and_the_run_page(api_owner, owner_client, user_owner, model_a,
                                                               roomy_quota):
    run, worker = make_running_run(actor=user_owner, model=model_a, max_trials=64, n_tasks=2, rounds=1, per_round=8)
    worker.sink.on_progress(ProgressInfo(builds_in_flight=8, measurements_in_flight=16, trials_reported=8))
    body = api_owner.get(f"/api/charts/runs/{run.pk}/live/").json()
    assert (body["run"]["builds_in_flight"], body["run"]["measurements_in_flight"]) == (8, 16)
    assert body["run"]["display"]["in_flight"] == "8 building · 16 measuring"
    page = owner_client.get(f"/runs/{run.pk}/").content.decode()
    assert 'data-field="in_flight">8 building · 16 measuring<' in page
    # a change moves the stamp (the browser re-renders); the end of an attempt clears the counts
    worker.sink.on_progress(ProgressInfo(builds_in_flight=0, measurements_in_flight=8))
    after = api_owner.get(f"/api/charts/runs/{run.pk}/live/?stamp={body['stamp']}").json()
    assert "unchanged" not in after and after["run"]["builds_in_flight"] == 0
    worker.sink.flush()
    run.refresh_from_db()
    assert (run.builds_in_flight, run.measurements_in_flight) == (0, 0)


def test_progress_from_a_lost_lease_writes_nothing(user_owner, model_a, roomy_quota):
    run, worker = make_running_run(actor=user_owner, model=model_a, max_trials=64, n_tasks=2)
    TuningRun.objects.filter(pk=run.pk).update(lease="someone-else")
    worker.sink.on_progress(ProgressInfo(builds_in_flight=5, measurements_in_flight=5))
    run.refresh_from_db()
    assert (run.builds_in_flight, run.measurements_in_flight) == (0, 0)


def test_in_flight_is_not_shown_to_other_teams(api_other, user_owner, model_a, roomy_quota):
    run, worker = make_running_run(actor=user_owner, model=model_a, max_trials=64, n_tasks=2)
    worker.sink.on_progress(ProgressInfo(builds_in_flight=3, measurements_in_flight=1))
    assert api_other.get(f"/api/charts/runs/{run.pk}/live/").status_code == 404
    assert api_other.get(f"/api/runs/{run.pk}/").status_code == 404


def test_api_labels_trimmer_savings_estimated(api_owner, user_owner, model_a, roomy_quota):
    run, _ = make_running_run(actor=user_owner, model=model_a, max_trials=64, n_tasks=2)
    assert api_owner.get(f"/api/runs/{run.pk}/").json()["energy_saved_kind"] is None
    TuningRun.objects.filter(pk=run.pk).update(energy_saved_joules=12.0, trials_saved=8)
    body = api_owner.get(f"/api/runs/{run.pk}/").json()
    assert body["energy_saved_kind"] == "estimated" and body["energy_saved_joules"] == 12.0
