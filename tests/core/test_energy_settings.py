"""The platform energy model: environment defaults, staff edits (admin, API, service), runs' snapshots."""
from __future__ import annotations

import pytest
from django.test import Client

from core import selectors, services
from core.exceptions import PermissionDenied, ServiceError
from core.models import EnergySettings
from tests.helpers import client_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def env_energy(settings):
    settings.ENERGY_CPU_WATTS_PER_CORE = 7.0
    settings.ENERGY_GPU_BOARD_WATTS = 250.0
    settings.ENERGY_GRID_INTENSITY_G_PER_KWH = 300.0
    settings.ENERGY_JOULES_PER_TRIAL_ESTIMATE = 11.0
    return settings


def test_without_a_saved_row_the_environment_settings_apply(env_energy):
    model = selectors.energy_model()
    assert model.origin == "environment"
    assert model.as_dict() == {"cpu_watts_per_core": 7.0, "gpu_board_watts": 250.0,
                               "grid_intensity_g_per_kwh": 300.0, "joules_per_trial_estimate": 11.0}


def test_staff_change_wins_over_the_environment_and_records_who(env_energy, user_staff):
    services.update_energy_settings(actor=user_staff, cpu_watts_per_core=12.5, grid_intensity_g_per_kwh=50)
    model = selectors.energy_model()
    assert model.origin == "admin"
    # changed values from the service, the rest seeded from the environment
    assert (model.cpu_watts_per_core, model.grid_intensity_g_per_kwh, model.gpu_board_watts) == (12.5, 50.0, 250.0)
    assert EnergySettings.objects.get().updated_by == user_staff


@pytest.mark.parametrize("values", [{"cpu_watts_per_core": 0}, {"gpu_board_watts": -3}, {"cpu_watts_per_core": "x"},
                                    {"grid_intensity_g_per_kwh": float("nan")}, {"watts": 3},
                                    {"joules_per_trial_estimate": float("inf")}, {"cpu_watts_per_core": 1e6}])
def test_invalid_values_are_refused_and_nothing_is_saved(env_energy, user_staff, values):
    with pytest.raises(ServiceError):
        services.update_energy_settings(actor=user_staff, **values)
    assert selectors.energy_model().cpu_watts_per_core == 7.0
    assert not EnergySettings.objects.exclude(cpu_watts_per_core=7.0).exists()


def test_only_staff_change_the_energy_model(user_owner):
    with pytest.raises(PermissionDenied):
        services.update_energy_settings(actor=user_owner, cpu_watts_per_core=20)
    assert not EnergySettings.objects.exists()


def test_the_row_is_a_singleton(env_energy, user_staff):
    services.ensure_energy_settings()
    other = EnergySettings(cpu_watts_per_core=1, gpu_board_watts=1, grid_intensity_g_per_kwh=1,
                           joules_per_trial_estimate=1)
    other.save()  # save() pins the primary key: it overwrites, never adds a second row
    assert EnergySettings.objects.count() == 1


# --- runs use the model in force when they start --------------------------------------------------------

def test_runs_snapshot_the_model_they_start_with(env_energy, user_staff, user_owner, model_a):
    from tuning import services as tuning_services
    from tuning.services import DatabaseSink, make_energy_meter, run_energy_model

    services.update_energy_settings(actor=user_staff, cpu_watts_per_core=20.0, gpu_board_watts=400.0,
                                    grid_intensity_g_per_kwh=90.0)
    first = tuning_services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    services.update_energy_settings(actor=user_staff, cpu_watts_per_core=3.0, grid_intensity_g_per_kwh=10.0)
    second = tuning_services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)

    assert (first.grid_intensity_g_per_kwh, second.grid_intensity_g_per_kwh) == (90.0, 10.0)
    assert run_energy_model(first) == {"cpu_watts_per_core": 20.0, "gpu_board_watts": 400.0}
    assert run_energy_model(second)["cpu_watts_per_core"] == 3.0
    assert DatabaseSink(first.pk, lease="").cpu_watts_per_core == 20.0  # splits build/measure energy with it
    meter = make_energy_meter(first)
    if meter.source == "modeled":  # no readable RAPL on this host: the model carries the run's watts
        assert meter.cpu_watts_per_core == 20.0


def test_team_intensity_still_wins_over_the_platform(env_energy, user_staff, user_owner, model_a, team_a):
    from tuning import services as tuning_services

    team_a.grid_intensity_g_per_kwh = 42.0
    team_a.save()
    services.update_energy_settings(actor=user_staff, grid_intensity_g_per_kwh=90.0)
    run = tuning_services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    assert run.grid_intensity_g_per_kwh == 42.0


def test_per_trial_estimate_for_the_quota_comes_from_the_model(env_energy, user_staff, team_a):
    from tuning.services import joules_per_trial_estimate

    assert joules_per_trial_estimate(team_a.pk)[0] == 11.0
    services.update_energy_settings(actor=user_staff, joules_per_trial_estimate=99.0)
    assert joules_per_trial_estimate(team_a.pk)[0] == 99.0


# --- admin console ---------------------------------------------------------------------------------------

def test_admin_opens_the_single_row_and_saves_through_the_service(env_energy, django_user_model):
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(root)
    listing = client.get("/admin/core/energysettings/")
    assert listing.status_code == 302 and listing.url.endswith("/admin/core/energysettings/1/change/")
    page = client.get(listing.url)
    assert page.status_code == 200 and b"7.0" in page.content  # seeded from the environment
    assert client.get("/admin/core/energysettings/add/").status_code == 403
    assert client.get("/admin/core/energysettings/1/delete/").status_code == 403

    saved = client.post(listing.url, {"cpu_watts_per_core": "15", "gpu_board_watts": "700",
                                      "grid_intensity_g_per_kwh": "120", "joules_per_trial_estimate": "11"})
    assert saved.status_code == 302
    row = EnergySettings.objects.get()
    assert (row.cpu_watts_per_core, row.gpu_board_watts, row.updated_by) == (15.0, 700.0, root)

    bad = client.post(listing.url, {"cpu_watts_per_core": "0", "gpu_board_watts": "700",
                                    "grid_intensity_g_per_kwh": "-1", "joules_per_trial_estimate": "11"})
    assert bad.status_code == 200 and b"errornote" in bad.content
    assert EnergySettings.objects.get().cpu_watts_per_core == 15.0


def test_admin_is_staff_only(user_owner):
    client = Client()
    client.force_login(user_owner)
    response = client.get("/admin/core/energysettings/")
    assert response.status_code == 302 and "/login/" in response.url
    assert not EnergySettings.objects.exists()


# --- API ------------------------------------------------------------------------------------------------

def test_api_reads_for_everyone_signed_in_and_writes_for_staff(env_energy, user_owner, user_staff, api_anon):
    assert api_anon.get("/api/energy-settings/").status_code == 401
    read = client_for(user_owner).get("/api/energy-settings/")
    assert read.status_code == 200
    assert read.json()["cpu_watts_per_core"] == 7.0 and read.json()["origin"] == "environment"

    refused = client_for(user_owner).patch("/api/energy-settings/", {"cpu_watts_per_core": 30}, format="json")
    assert refused.status_code == 403 and not EnergySettings.objects.exists()

    staff = client_for(user_staff)
    changed = staff.patch("/api/energy-settings/", {"cpu_watts_per_core": 30}, format="json")
    assert changed.status_code == 200
    assert changed.json()["cpu_watts_per_core"] == 30.0 and changed.json()["origin"] == "admin"

    invalid = staff.patch("/api/energy-settings/", {"gpu_board_watts": 0, "grid_intensity_g_per_kwh": "lots"},
                          format="json")
    assert invalid.status_code == 400
    assert set(invalid.json()["errors"]) == {"gpu_board_watts", "grid_intensity_g_per_kwh"}
    assert selectors.energy_model().gpu_board_watts == 250.0
