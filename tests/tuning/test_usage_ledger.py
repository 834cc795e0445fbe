"""Issue 39 item 4: what a team spent is an append-only ledger, so archiving or deleting a model or run
never lowers its usage, energy or carbon history, and a quota cannot be dodged by archiving."""
from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone

from core import services as core_services
from core.exceptions import ConflictError, PermissionDenied, QuotaExceeded
from core.models import DLModel, Quota, UsageCharge, UsageLedgerError
from core.selectors import month_start, quota_usage
from frontend import queries
from tests.helpers import client_for
from tests.scheduling.fakes import make_job, register_gpu_node
from tuning import adapters, services
from tuning.engine.energy import ModeledMeter
from tuning.engine.events import MeasurementRecord
from tuning.models import Measurement, TuningRun

# dialect-sensitive (re-run on SQLite by scripts/test.sh): the append-only trigger, constraints, monthly sums
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker"), pytest.mark.dialect]

N_TRIALS = 6
JOULES = 7200.0  # 0.002 kWh


def _records(n: int, *, prefix: str = "k") -> list[MeasurementRecord]:
    return [MeasurementRecord(task_index=0, task_name="t0", round_index=0, candidate_key=f"{prefix}{i}",
                              run_secs=[1e-3 * (i + 1)], build_secs=0.1, run_wall_secs=0.2) for i in range(n)]


def _tuned_run(actor, model, *, joules: float = JOULES, n: int = N_TRIALS) -> TuningRun:
    """A run that measured `n` candidates and `joules` of (modeled) energy through the real sink, then ended."""
    run = services.start_run(actor=actor, model=model, max_trials=max(8, n), enqueue=False)
    lease = services.claim_run(run.pk, worker="w")
    cpu = {"s": 0.0}
    sink = services.DatabaseSink(run.pk, lease, meter=ModeledMeter(cpu_watts_per_core=10.0,
                                                                   cpu_seconds=lambda: cpu["s"]))
    cpu["s"] = joules / 10.0
    sink.on_measurements(_records(n))
    sink.flush()
    services.finish_interrupted(run.pk, lease, "cancelled", reason="test")
    run.refresh_from_db()
    return run


def _team_month(team_id: int):
    (row,) = [r for r in queries.energy_by_team_month([team_id]) if r.month == month_start().date()]
    return row


def test_usage_and_carbon_survive_archiving_and_deleting_the_model(model_a, user_owner, user_member, user_staff,
                                                                   team_a, api_owner):
    run = _tuned_run(user_owner, model_a)
    assert run.trials_done == N_TRIALS and run.energy_joules == pytest.approx(JOULES)
    charges = UsageCharge.objects.filter(run=run)
    assert {c.kind for c in charges} == {"trials", "energy_joules"}
    energy_charge = charges.get(kind="energy_joules")
    assert energy_charge.source == "modeled" and energy_charge.grid_intensity_g_per_kwh == 400.0

    def snapshot():
        usage = quota_usage(team_a.pk)
        row = _team_month(team_a.pk)
        return (usage.tuning_trials_this_month, round(usage.energy_kwh_this_month, 9), row.trials,
                round(row.energy_kwh, 9), round(row.carbon_g, 6))

    before = snapshot()
    assert before == (N_TRIALS, 0.002, N_TRIALS, 0.002, 0.8)  # 0.002 kWh x 400 g/kWh

    assert client_for(user_member).delete(f"/api/models/{model_a.pk}/").status_code == 204  # archives
    assert api_owner.get("/api/quotas/").json()["results"][0]["usage"]["tuning_trials_this_month"] == N_TRIALS
    assert snapshot() == before

    with pytest.raises(PermissionDenied, match="Only staff"):
        core_services.delete_model(actor=user_owner, model=model_a)  # owners archive; only staff delete
    core_services.delete_model(actor=user_staff, model=model_a)
    assert not TuningRun.objects.filter(pk=run.pk).exists() and not Measurement.objects.exists()
    assert snapshot() == before
    kept = UsageCharge.objects.filter(team=team_a)
    assert kept.count() == 2 and all(c.run_id is None and c.model_id is None for c in kept)
    assert all("cnn-a" in c.label for c in kept)  # still readable with its referents gone

    # and a plain ORM delete of a run (no service) keeps it too
    other = DLModel.objects.create(**_model_fields(team_a))
    run2 = _tuned_run(user_owner, other, joules=3600.0, n=2)
    TuningRun.objects.filter(pk=run2.pk).delete()
    assert quota_usage(team_a.pk).tuning_trials_this_month == N_TRIALS + 2
    assert quota_usage(team_a.pk).energy_kwh_this_month == pytest.approx(0.003)


def _model_fields(team) -> dict:
    return dict(team=team, name="second", file_size=1, sha256="0" * 64, opset=17, ir_version=8, inputs=[],
                batch_size=1, total_flops=1, param_count=1, activation_bytes=1, conv_count=0, linear_count=0,
                activation_count=0, other_count=0)


def test_a_retried_charge_is_not_counted_twice(model_a, user_owner, team_a):
    run = _tuned_run(user_owner, model_a)
    before = list(UsageCharge.objects.filter(run=run).values_list("kind", "amount"))
    adapters.charge_run_usage(run.pk)  # a retried task charging again
    adapters.charge_run_usage(run.pk)
    # a resumed executor storing the same candidates again (its journal) with the energy unchanged
    TuningRun.objects.filter(pk=run.pk).update(status="running", lease="again")
    sink = services.DatabaseSink(run.pk, "again")
    sink.on_measurements(_records(N_TRIALS))
    sink.flush()
    assert list(UsageCharge.objects.filter(run=run).values_list("kind", "amount")) == before
    assert core_services.charge_usage(team_id=team_a.pk, kind="trials", amount=3, label="x",
                                      idempotency_key=f"tuning_run:{run.pk}:trials:{N_TRIALS}") is None
    assert quota_usage(team_a.pk).tuning_trials_this_month == N_TRIALS
    # new trials are charged as a new event: only the difference
    sink.on_measurements(_records(2, prefix="new"))
    assert quota_usage(team_a.pk).tuning_trials_this_month == N_TRIALS + 2
    assert UsageCharge.objects.filter(run=run, kind="trials").count() == 2


def test_ledger_rows_cannot_be_updated_or_deleted(model_a, user_owner, user_staff, team_a):
    run = _tuned_run(user_owner, model_a)
    charge = UsageCharge.objects.filter(run=run, kind="trials").get()
    charge.amount = 0
    with pytest.raises(UsageLedgerError):
        charge.save()
    with pytest.raises(UsageLedgerError):
        charge.delete()
    with pytest.raises(UsageLedgerError):
        UsageCharge.objects.filter(team=team_a).update(amount=0)
    with pytest.raises(UsageLedgerError):
        UsageCharge.objects.filter(team=team_a).delete()
    with pytest.raises(ValueError):
        core_services.charge_usage(team_id=team_a.pk, kind="free_lunch", amount=1, label="x", idempotency_key="x")
    assert UsageCharge.objects.get(pk=charge.pk).amount == N_TRIALS

    # the admin shows the ledger read-only, even to a superuser
    user_staff.is_superuser = True
    user_staff.save()
    web = Client()
    web.force_login(user_staff)
    assert web.get("/admin/core/usagecharge/").status_code == 200
    assert web.get(f"/admin/core/usagecharge/{charge.pk}/delete/").status_code == 403
    assert web.post(f"/admin/core/usagecharge/{charge.pk}/change/", {"amount": 0}).status_code == 403
    assert web.get("/admin/core/usagecharge/add/").status_code == 403
    assert UsageCharge.objects.get(pk=charge.pk).amount == N_TRIALS


def test_the_usage_api_lists_a_teams_charges_and_writes_none(api_owner, api_other, model_a, user_owner,
                                                             user_staff):
    run = _tuned_run(user_owner, model_a)
    core_services.delete_model(actor=user_staff, model=model_a)
    body = api_owner.get("/api/usage-charges/?kind=trials").json()
    assert body["count"] == 1
    (row,) = body["results"]
    assert row["amount"] == N_TRIALS and row["run"] is None and f"tuning run {run.pk}" in row["label"]
    assert api_other.get("/api/usage-charges/").json()["count"] == 0
    pk = row["id"]
    assert api_owner.post("/api/usage-charges/", {"team": row["team"], "kind": "trials", "amount": 0},
                          format="json").status_code == 405
    for method in ("put", "patch", "delete"):
        assert getattr(api_owner, method)(f"/api/usage-charges/{pk}/", {"amount": 0}, format="json").status_code \
            == 404  # no detail route at all: nothing to change or delete
    assert UsageCharge.objects.get(pk=pk).amount == N_TRIALS


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the database guard is a PostgreSQL trigger")
def test_the_database_refuses_to_change_or_delete_a_charge(model_a, user_owner, team_a):
    run = _tuned_run(user_owner, model_a)
    pk = UsageCharge.objects.filter(run=run).first().pk
    for sql in ("UPDATE core_usagecharge SET amount = 0 WHERE id = %s",
                "UPDATE core_usagecharge SET run_id = run_id WHERE id = %s AND false",  # no row: allowed
                "DELETE FROM core_usagecharge WHERE id = %s"):
        with transaction.atomic(), connection.cursor() as cur:
            if "false" in sql:
                cur.execute(sql, [pk])
                continue
            with pytest.raises(Exception, match="append-only"):
                with transaction.atomic():
                    cur.execute(sql, [pk])
    with connection.cursor() as cur:  # unlinking (what on_delete=SET_NULL does) is allowed
        cur.execute("UPDATE core_usagecharge SET run_id = NULL WHERE id = %s", [pk])
        with pytest.raises(Exception, match="append-only"):
            with transaction.atomic():
                cur.execute("UPDATE core_usagecharge SET run_id = %s WHERE id = %s", [run.pk, pk])


def test_archiving_does_not_dodge_the_trial_quota(api_owner, model_a, user_owner, team_a):
    Quota.objects.filter(team=team_a).update(tuning_trials_per_month=N_TRIALS + 8, max_concurrent_runs=10)
    run = _tuned_run(user_owner, model_a)
    assert api_owner.post(f"/api/runs/{run.pk}/archive/").status_code == 200
    assert api_owner.delete(f"/api/models/{model_a.pk}/").status_code == 204
    assert api_owner.post(f"/api/models/{model_a.pk}/restore/").status_code == 200
    resp = api_owner.post("/api/runs/", {"model": model_a.pk, "max_trials": 9}, format="json")
    assert resp.status_code == 429 and resp.json()["quota"] == "tuning_trials_per_month"
    assert "8 left" in resp.json()["detail"]


def test_archiving_does_not_dodge_the_energy_quota(model_a, user_owner, user_staff, team_a, settings):
    settings.ENERGY_JOULES_PER_TRIAL_ESTIMATE = 1.0
    Quota.objects.filter(team=team_a).update(energy_kwh_per_month=0.002, max_concurrent_runs=10)
    _tuned_run(user_owner, model_a, joules=JOULES)  # the whole budget
    core_services.archive_model(actor=user_owner, model=model_a)
    core_services.restore_model(actor=user_owner, model=model_a)
    with pytest.raises(QuotaExceeded) as exc:
        services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    assert exc.value.quota == "energy_kwh_per_month"
    core_services.delete_model(actor=user_staff, model=model_a)
    assert quota_usage(team_a.pk).energy_kwh_this_month == pytest.approx(0.002)


def test_a_running_run_stops_at_the_energy_quota_counting_deleted_runs(model_a, user_owner, user_staff, team_a):
    """The sink's in-run check reads the ledger too: a deleted run's energy still fills the budget."""
    Quota.objects.filter(team=team_a).update(energy_kwh_per_month=0.003, max_concurrent_runs=10)
    old = _tuned_run(user_owner, model_a, joules=JOULES)
    TuningRun.objects.filter(pk=old.pk).delete()
    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    lease = services.claim_run(run.pk, worker="w")
    cpu = {"s": 0.0}
    sink = services.DatabaseSink(run.pk, lease, meter=ModeledMeter(cpu_watts_per_core=10.0,
                                                                   cpu_seconds=lambda: cpu["s"]))
    cpu["s"] = 300.0  # 3000 J: 7200 + 3000 < 10800
    assert sink.control() is None
    cpu["s"] = 400.0  # 7200 + 4000 >= 10800
    assert sink.control() == "cancel" and "energy quota" in sink.stop_reason


def test_runs_archive_and_restore(api_owner, api_other, model_a, user_owner, team_a):
    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    services.claim_run(run.pk, worker="w")
    resp = api_owner.post(f"/api/runs/{run.pk}/archive/")
    assert resp.status_code == 409 and "cancel it before archiving" in resp.json()["detail"]
    assert api_owner.delete(f"/api/runs/{run.pk}/").status_code == 409
    TuningRun.objects.filter(pk=run.pk).update(status="cancelled", lease="")
    assert api_other.post(f"/api/runs/{run.pk}/archive/").status_code == 404
    resp = api_owner.delete(f"/api/runs/{run.pk}/")
    assert resp.status_code == 200 and resp.json()["archived_at"]
    assert api_owner.get("/api/runs/").json()["count"] == 0
    assert [r["id"] for r in api_owner.get("/api/runs/?archived=true").json()["results"]] == [run.pk]
    assert api_owner.get("/api/runs/?archived=maybe").status_code == 400
    assert api_other.post(f"/api/runs/{run.pk}/restore/").status_code == 404
    resp = api_owner.post(f"/api/runs/{run.pk}/restore/")
    assert resp.status_code == 200 and resp.json()["archived_at"] is None
    assert api_owner.post(f"/api/runs/{run.pk}/restore/").status_code == 409  # not archived
    assert TuningRun.objects.filter(pk=run.pk).exists()


def test_another_team_cannot_archive_or_restore_a_model(api_other, api_owner, model_a, user_viewer):
    assert api_other.delete(f"/api/models/{model_a.pk}/").status_code == 404
    assert api_owner.delete(f"/api/models/{model_a.pk}/").status_code == 204
    assert api_other.post(f"/api/models/{model_a.pk}/restore/").status_code == 404
    assert api_other.get("/api/models/?archived=true").json()["count"] == 0
    assert client_for(user_viewer).post(f"/api/models/{model_a.pk}/restore/").status_code == 403
    model_a.refresh_from_db()
    assert model_a.archived_at is not None
    assert api_owner.post(f"/api/models/{model_a.pk}/restore/").status_code == 200
    assert api_owner.post(f"/api/models/{model_a.pk}/restore/").status_code == 409


def test_an_archived_models_name_stays_taken_and_the_refusal_says_why(api_owner, model_a, team_a,
                                                                       small_cnn_bytes):
    from django.core.files.uploadedfile import SimpleUploadedFile

    assert api_owner.delete(f"/api/models/{model_a.pk}/").status_code == 204
    resp = api_owner.post("/api/models/", {"team": team_a.pk, "name": model_a.name, "file": SimpleUploadedFile(
        "m.onnx", small_cnn_bytes)}, format="multipart")
    assert resp.status_code == 409 and "archived model named 'cnn-a': restore it" in resp.json()["detail"]


def test_an_archived_model_cannot_be_tuned(api_owner, model_a):
    assert api_owner.delete(f"/api/models/{model_a.pk}/").status_code == 204
    resp = api_owner.post("/api/runs/", {"model": model_a.pk, "max_trials": 8}, format="json")
    assert resp.status_code == 400 and "model" in resp.json()["errors"]


def test_gpu_time_is_charged_at_release_and_survives_deleting_the_job(model_a, user_staff, team_a):
    from scheduling import services as scheduling_services
    from scheduling.models import GpuJob, Placement

    node = register_gpu_node()
    gpu = node.gpus.get(index=0)
    job = make_job(model_a, state="running", estimate=3600)
    Placement.objects.create(job=job, gpu=gpu, policy="horus", queue=gpu.queue,
                             placed_at=timezone.now() - dt.timedelta(minutes=30))
    scheduling_services.finish_job(job_id=job.pk, result={})
    scheduling_services.finish_job(job_id=job.pk, result={})  # a retried finish charges nothing more
    (charge,) = UsageCharge.objects.filter(kind="gpu_seconds")
    assert charge.amount == pytest.approx(1800, abs=5) and charge.job_id == job.pk
    assert quota_usage(team_a.pk).gpu_hours_this_month == pytest.approx(0.5, abs=0.01)
    GpuJob.objects.filter(pk=job.pk).delete()
    assert quota_usage(team_a.pk).gpu_hours_this_month == pytest.approx(0.5, abs=0.01)


def test_a_simulation_is_charged_once_when_it_runs(team_a, user_owner):
    from scheduling.models import SimulationRun
    from scheduling.services.usage import charge_simulation

    sim = SimulationRun.objects.create(team=team_a, trace="philly", policies=["horus", "fifo"], seed=0,
                                       cost_units=1234)
    charge_simulation(sim)
    charge_simulation(sim)
    (charge,) = UsageCharge.objects.filter(kind="simulation_units")
    assert charge.amount == 1234 and charge.simulation_id == sim.pk and "philly" in charge.label
    SimulationRun.objects.filter(pk=sim.pk).delete()
    assert UsageCharge.objects.get(pk=charge.pk).simulation_id is None


def test_dashboard_archives_and_restores_a_model(model_a, user_owner, user_viewer):
    web = Client()
    web.force_login(user_owner)
    html = web.get(f"/models/{model_a.pk}/").content.decode()
    assert 'id="model-archive"' in html and ">Archive</button>" in html
    resp = web.post(f"/models/{model_a.pk}/archive/")
    assert resp.status_code == 302
    assert f'href="/models/{model_a.pk}/"' not in web.get("/models/").content.decode()
    html = web.get("/models/?archived=1").content.decode()
    assert f'href="/models/{model_a.pk}/"' in html and f"/models/{model_a.pk}/restore/" in html
    assert 'id="model-archived"' in web.get(f"/models/{model_a.pk}/").content.decode()
    assert web.post(f"/models/{model_a.pk}/restore/").status_code == 302
    model_a.refresh_from_db()
    assert model_a.archived_at is None

    viewer = Client()
    viewer.force_login(user_viewer)
    assert 'id="model-archive"' not in viewer.get(f"/models/{model_a.pk}/").content.decode()
    viewer.post(f"/models/{model_a.pk}/archive/")
    model_a.refresh_from_db()
    assert model_a.archived_at is None


def test_an_invalid_model_is_deleted_not_archived(api_owner, model_a):
    DLModel.objects.filter(pk=model_a.pk).update(state=DLModel.State.INVALID)
    assert api_owner.delete(f"/api/models/{model_a.pk}/").status_code == 204
    assert not DLModel.objects.filter(pk=model_a.pk).exists()


def test_a_run_archived_then_cancelled_is_refused_only_while_active(model_a, user_owner):
    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    services.pause_run(actor=user_owner, run=run)
    with pytest.raises(ConflictError, match="paused: cancel it"):
        services.archive_run(actor=user_owner, run=run)
    services.cancel_run(actor=user_owner, run=run)
    assert services.archive_run(actor=user_owner, run=run).archived_at is not None
