"""Energy saved by co-locating GPU jobs, from real placements, on the energy page and API."""
from __future__ import annotations

import datetime as dt

import pytest
from django.test import Client

from core.selectors import month_start
from core import services as core_services
from scheduling.models import GPU, Placement
from scheduling.selectors import colocation_savings_by_team_month

from .fakes import make_job

# dialect-sensitive (re-run on SQLite by scripts/test.sh): energy sums over time windows
pytestmark = [pytest.mark.django_db, pytest.mark.dialect]

H = dt.timedelta(hours=1)


def _place(job, gpu, start, end):
    return Placement.objects.create(job=job, gpu=gpu, policy="horus", queue=gpu.queue, placed_at=start,
                                    released_at=end)


def test_overlap_on_one_gpu_is_saved_once_and_split_between_the_sharers(model_a, model_b, gpu_node, team_a,
                                                                         team_b, settings):
    settings.ENERGY_GPU_BOARD_WATTS = 250.0
    t0 = month_start() + dt.timedelta(days=1)
    g0, g1 = gpu_node.gpus.get(index=0), gpu_node.gpus.get(index=1)
    GPU.objects.filter(pk=g0.pk).update(power_limit_w=700.0)
    GPU.objects.filter(pk=g1.pk).update(power_limit_w=None)
    # g0: A from 0-2 h, B from 1-3 h: one hour shared, half of it to each team
    _place(make_job(model_a, state="finished"), g0, t0, t0 + 2 * H)
    _place(make_job(model_b, state="finished"), g0, t0 + H, t0 + 3 * H)
    # g1: three of team A's jobs together for one hour: 2 GPU-hours saved, all team A's
    for _ in range(3):
        _place(make_job(model_a, state="finished"), g1, t0, t0 + H)
    # a job alone saves nothing; a job that starts as another ends does not overlap it
    _place(make_job(model_a, state="finished"), g1, t0 + H, t0 + 2 * H)

    month = t0.date().replace(day=1)
    both = colocation_savings_by_team_month([team_a.pk, team_b.pk], now=t0 + 10 * H)
    a, b = both[(team_a.pk, month)], both[(team_b.pk, month)]
    assert a.gpu_seconds == pytest.approx(1800 + 7200)
    assert a.joules == pytest.approx(1800 * 700 + 7200 * 250)
    assert b.gpu_seconds == pytest.approx(1800) and b.joules == pytest.approx(1800 * 700)
    # scoped: a team sees only its own rows (sharing with another team still counts for it)
    assert set(colocation_savings_by_team_month([team_b.pk], now=t0 + 10 * H)) == {(team_b.pk, month)}


def test_a_running_placement_counts_until_now(model_a, gpu_node, team_a):
    t0 = month_start() + dt.timedelta(days=1)
    g0 = gpu_node.gpus.get(index=0)
    _place(make_job(model_a, state="running"), g0, t0, None)
    _place(make_job(model_a, state="running"), g0, t0, None)
    saving = colocation_savings_by_team_month([team_a.pk], now=t0 + H)[(team_a.pk, t0.date().replace(day=1))]
    assert saving.gpu_seconds == pytest.approx(3600)  # 2 jobs x 1 h x (2-1)/2


def test_no_shared_gpu_no_saving(model_a, gpu_node, team_a):
    t0 = month_start() + dt.timedelta(days=1)
    _place(make_job(model_a, state="finished"), gpu_node.gpus.get(index=0), t0, t0 + H)
    _place(make_job(model_a, state="finished"), gpu_node.gpus.get(index=1), t0, t0 + H)
    assert colocation_savings_by_team_month([team_a.pk]) == {}


def test_energy_page_and_api_show_the_saving_with_its_basis(model_a, gpu_node, team_a, user_owner, user_staff,
                                                            api_owner, api_other, settings):
    settings.ENERGY_GPU_BOARD_WATTS = 300.0
    t0 = month_start() + dt.timedelta(days=1)
    g0 = gpu_node.gpus.get(index=0)
    GPU.objects.filter(pk=g0.pk).update(power_limit_w=None)
    for _ in range(2):
        _place(make_job(model_a, state="finished"), g0, t0, t0 + 2 * H)
    core_services.update_energy_settings(actor=user_staff, gpu_board_watts=360.0)
    expected_kwh = 2 * 3600 * 360.0 / 3.6e6  # 2 jobs x 2 h x 1/2 shared, at the admin's board watts

    data = api_owner.get(f"/api/energy/?team={team_a.pk}").json()
    row = next(m for m in data["months"] if m["team_id"] == team_a.pk)
    assert row["colocation_saved_kwh"] == pytest.approx(expected_kwh)
    assert row["runs"] == 0 and row["energy_kwh"] is None  # a month with GPU jobs and no tuning still shows
    assert data["colocation_basis"].startswith("modeled")
    assert data["energy_model"]["gpu_board_watts"] == 360.0 and data["energy_model"]["origin"] == "admin"
    assert api_other.get(f"/api/energy/?team={team_a.pk}").status_code == 404
    assert all(m["team_id"] != team_a.pk for m in api_other.get("/api/energy/").json()["months"])

    client = Client()
    client.force_login(user_owner)
    page = client.get("/energy/").content.decode()
    assert f"{expected_kwh:.4f} kWh" in page and "modeled, 2.00 GPU-h shared" in page
    assert "360 W per busy GPU" in page and "set by staff" in page
