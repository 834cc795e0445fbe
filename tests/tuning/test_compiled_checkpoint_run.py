"""A run's compiled checkpoint reaches the platform: the engine's child reports it through the sink while the
run tunes, the run keeps it (cleaned), and the page, the API and both CLIs show it and the estimate it
was taken beside (`dlopt runs show`: tests/client/test_result_numbers.py); a sink that lost its lease
writes nothing."""
from __future__ import annotations

import html as htmllib
import io

import pytest

from tuning import adapters, services
from tuning.adapters.sink import LeaseLost
from tuning.management.commands.tune import Command as TuneCommand
from tuning.models import TuningRun

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

FAST = {"search_population": 48, "genetic_num_iters": 1, "seed": 1,
        "evaluator": {"number": 2, "repeat": 1, "min_repeat_ms": 5}}


def test_a_run_reports_its_checkpoint_and_every_view_shows_it(model_a, user_owner, api_owner, client, monkeypatch):
    """A real run (engine child, sandboxed checkpoint child, sink over the pipe); only the rule that a tiny
    run is too short to pay for a checkpoint is switched off."""
    real = adapters.build_engine_config

    def with_checkpoint(run, work_dir):
        config = real(run, work_dir)
        config.compiled_checkpoint = True
        return config

    monkeypatch.setattr(adapters, "build_engine_config", with_checkpoint)
    run = services.start_run(actor=user_owner, model=model_a, max_trials=32, trials_per_round=8, threads=1,
                             options=FAST, enqueue=False)
    assert services.execute_run(run_id=run.pk, worker="in-process") == TuningRun.Status.SUCCEEDED
    run.refresh_from_db()
    taken = run.compiled_checkpoint
    assert taken and "error" not in taken, run.summary.get("compiled_checkpoint")
    assert 0 < taken["trials"] < run.trials_done and taken["compiled_s"] > 0 and taken["estimate_s"] > 0

    api = api_owner.get(f"/api/runs/{run.pk}/").json()
    assert api["compiled_checkpoint"] == taken
    note = api["checkpoint_note"]
    assert note == run.checkpoint_note and f"compiled after {taken['trials']:,} trials" in note
    assert "when the per-task estimate read" in note

    client.force_login(user_owner)
    page = htmllib.unescape(client.get(f"/runs/{run.pk}/").content.decode())
    assert "Compiled checkpoint (the whole model timed once every task had a record)" in page and note in page

    out = io.StringIO()
    TuneCommand(stdout=out)._print(TuneCommand._summary(run, 1.0))  # manage.py tune
    assert f"Compiled checkpoint: {note}" in out.getvalue()


def test_the_sink_keeps_a_cleaned_checkpoint_while_the_run_tunes(model_a, user_owner, api_owner, tmp_path):
    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    lease = services.claim_run(run.pk, worker="w")
    TuningRun.objects.filter(pk=run.pk).update(summary={"kept": 1}, estimated_latency_s=1.5e-3)
    sink = adapters.DatabaseSink(run.pk, lease)
    leaked = f"{sink.work_dir}/database_workload.json: /etc/passwd"
    sink.on_checkpoint({"at": "first round", "trials": 40, "estimate_s": 1.0e-3, "error": f"Boom: {leaked}",
                        "compiled_s": 9.0, "secret": "x", "wall_s": float("nan")})
    run.refresh_from_db()
    stored = run.summary["compiled_checkpoint"]
    assert run.summary["kept"] == 1  # the rest of the summary stays
    assert set(stored) == {"at", "trials", "estimate_s", "error"}  # a failed checkpoint carries no latency
    assert str(sink.work_dir) not in stored["error"] and "<path>/passwd" in stored["error"]
    assert api_owner.get(f"/api/runs/{run.pk}/").json()["checkpoint_note"].startswith("not timed after 40 trials")

    sink.on_checkpoint({"trials": 40, "estimate_s": 1.0e-3, "compiled_s": 2.0e-3, "compiled_iqr_s": 1e-4})
    run.refresh_from_db()
    assert run.checkpoint_note == ("2 ms (IQR 0.1 ms) compiled after 40 trials, when the per-task estimate read "
                                   "1 ms: 100 % above it")
    sink.on_checkpoint("not a checkpoint")  # nothing to keep
    run.refresh_from_db()
    assert run.compiled_checkpoint["compiled_s"] == 2.0e-3

    TuningRun.objects.filter(pk=run.pk).update(lease="another-executor")
    with pytest.raises(LeaseLost):
        sink.on_checkpoint({"trials": 50, "estimate_s": 1.0e-3, "compiled_s": 3.0e-3})
    run.refresh_from_db()
    assert run.compiled_checkpoint["compiled_s"] == 2.0e-3
