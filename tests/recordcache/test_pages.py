"""The run page shows each task's cache use; the energy page counts the cache's savings apart, estimated."""
from __future__ import annotations

import pytest
from django.test import Client

from recordcache.models import CacheLookup
from tests.factories import TuningRunFactory

pytestmark = pytest.mark.django_db


def _client(user):
    c = Client()
    c.force_login(user)
    return c


def test_run_page_shows_hit_source_verification_and_trials_saved(user_owner, team_a, user_other, team_b):
    src = TuningRunFactory(model__team=team_a)
    run = TuningRunFactory(model__team=team_a, energy_joules=50.0, trials_done=10)
    CacheLookup.objects.create(run=run, task_index=0, task_name="fused_conv", workload_hash="1", hit=True, n_seeds=2,
                               source_run=src, verification="verified", reason="verified", trials_saved=30)
    CacheLookup.objects.create(run=run, task_index=1, task_name="fused_dense", workload_hash="2", hit=False)
    html = _client(user_owner).get(f"/runs/{run.pk}/").content.decode()
    assert "Record cache" in html and f"#{src.pk}" in html and "verified" in html and "miss" in html
    assert "30 trials" in html and "150 J" in html and "estimated" in html
    assert _client(user_other).get(f"/runs/{run.pk}/").status_code == 404


def test_energy_page_counts_cache_savings_apart(user_owner, team_a):
    run = TuningRunFactory(model__team=team_a, energy_joules=20.0, trials_done=10)
    CacheLookup.objects.create(run=run, task_index=0, task_name="c", workload_hash="1", hit=True,
                               verification="verified", trials_saved=5)
    html = _client(user_owner).get("/energy/").content.decode()
    assert "Saved by the record cache" in html and "5 trials, 10 J" in html and "estimated" in html
