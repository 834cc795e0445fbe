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


# --- the team's cache setting on the team page -------------------------------------------------------------


def _setting(team):
    from recordcache.selectors import team_settings

    s = team_settings(team.pk)
    return s.publish, s.read


def test_owner_turns_publish_and_read_off_and_on_from_the_team_page(user_owner, team_a, user_member):
    owner = _client(user_owner)
    page = owner.get(f"/teams/{team_a.pk}/").content.decode()
    assert 'id="record-cache-form"' in page and 'name="publish"' in page and "checked" in page
    resp = owner.post(f"/teams/{team_a.pk}/record-cache/", {"read": "on"}, follow=True)  # publish unchecked
    assert resp.status_code == 200 and _setting(team_a) == (False, True)
    assert any("do not publish" in str(m) for m in resp.context["messages"])
    owner.post(f"/teams/{team_a.pk}/record-cache/", {})
    assert _setting(team_a) == (False, False)
    seen = _client(user_member).get(f"/teams/{team_a.pk}/").content.decode()  # members see it, no form
    assert 'id="record-cache-form"' not in seen and "do not publish" in seen and "do not read" in seen
    owner.post(f"/teams/{team_a.pk}/record-cache/", {"publish": "on", "read": "on"})
    assert _setting(team_a) == (True, True)


def test_cache_setting_refused_to_members_viewers_other_teams_and_without_csrf(user_owner, team_a, user_member,
                                                                               user_viewer, user_other, team_b):
    for user in (user_member, user_viewer):
        resp = _client(user).post(f"/teams/{team_a.pk}/record-cache/", {}, follow=True)
        assert resp.status_code == 200 and _setting(team_a) == (False, True)
        assert any("Only the team's owners" in str(m) for m in resp.context["messages"])
    # another team's owner: the team does not exist for them
    assert _client(user_other).post(f"/teams/{team_a.pk}/record-cache/", {}).status_code == 404
    assert _client(user_owner).post(f"/teams/{team_b.pk}/record-cache/", {}).status_code == 404
    assert _setting(team_a) == (False, True) and _setting(team_b) == (False, True)
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user_owner)
    assert strict.post(f"/teams/{team_a.pk}/record-cache/", {}).status_code == 403
    assert _client(user_owner).get(f"/teams/{team_a.pk}/record-cache/").status_code == 405
    assert _setting(team_a) == (False, True)
