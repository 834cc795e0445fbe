"""Teams, memberships (owners invite, users accept, anyone leaves), quotas (staff write), tokens (revocable), /api/me/."""
from __future__ import annotations

import pytest

from core import services
from core.exceptions import PermissionDenied
from core.models import ApiToken, Membership, Quota, Team
from tests.helpers import client_for

pytestmark = pytest.mark.django_db


@pytest.mark.dialect  # "vision" is taken by "Vision": a case-insensitive lookup
def test_staff_create_a_team_with_its_owner_and_quota(user_staff, user_owner):
    api_staff = client_for(user_staff)
    resp = api_staff.post("/api/teams/", {"name": "Vision", "owner": user_owner.username})
    assert resp.status_code == 201, resp.content
    team_id = resp.json()["id"]
    assert Membership.objects.get(team_id=team_id, user=user_owner).role == "owner"
    assert not Membership.objects.filter(team_id=team_id, user=user_staff).exists()
    assert Quota.objects.filter(team_id=team_id).exists()
    assert api_staff.post("/api/teams/", {"name": "vision"}).status_code == 409
    resp = api_staff.post("/api/teams/", {"name": "Audio"})  # no owner given: the caller owns it
    assert resp.status_code == 201 and resp.json()["role"] == "owner"
    assert api_staff.post("/api/teams/", {"name": "Text", "owner": "nobody"}).status_code == 400


def test_non_staff_cannot_create_teams(api_owner, user_owner, team_a):
    """Each team gets a fresh default quota: self-service teams would multiply every quota (issue 11)."""
    teams_before = Team.objects.count()
    for body in ({"name": "Vision"}, {"name": "Vision 2", "owner": user_owner.username}, {}):
        resp = api_owner.post("/api/teams/", body)
        assert resp.status_code == 403, resp.content
        assert resp.json()["code"] == "permission_denied"
        assert "Only staff can create teams" in resp.json()["detail"]
    assert Team.objects.count() == teams_before and Quota.objects.count() == teams_before
    with pytest.raises(PermissionDenied):
        services.create_team(actor=user_owner, name="Direct", owner=user_owner)
    assert not Team.objects.filter(name="Direct").exists()


def test_admin_team_creation_is_staff_only_and_gives_the_team_a_quota(client, django_user_model, user_owner):
    client.force_login(user_owner)
    resp = client.post("/admin/core/team/add/", {"name": "Sneaky", "slug": "sneaky"})
    assert resp.status_code == 302 and "/admin/login/" in resp["Location"]
    assert not Team.objects.filter(name="Sneaky").exists()
    client.force_login(django_user_model.objects.create_superuser("root", "root@example.com", "pw"))
    inline = {"quota-TOTAL_FORMS": "0", "quota-INITIAL_FORMS": "0", "quota-MIN_NUM_FORMS": "0",
              "quota-MAX_NUM_FORMS": "1", "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0",
              "memberships-MIN_NUM_FORMS": "0", "memberships-MAX_NUM_FORMS": "1000"}
    resp = client.post("/admin/core/team/add/", {"name": "Vision", "slug": "vision", **inline})
    assert resp.status_code == 302, resp.content.decode()[:3000]
    assert Quota.objects.filter(team__name="Vision").exists()


def test_team_list_is_scoped(api_owner, team_a, team_b):
    names = [t["name"] for t in api_owner.get("/api/teams/").json()["results"]]
    assert names == ["Team A"]
    assert api_owner.get(f"/api/teams/{team_b.pk}/").status_code == 404


def test_only_owner_manages_members(team_a, user_owner, user_member, user_other):
    member_client, owner_client = client_for(user_member), client_for(user_owner)
    resp = member_client.post("/api/invitations/", {"team": team_a.pk, "username": "mallory", "role": "viewer"})
    assert resp.status_code == 403
    resp = owner_client.post("/api/invitations/", {"team": team_a.pk, "username": "mallory", "role": "viewer"})
    assert resp.status_code == 202, resp.content
    assert not Membership.objects.filter(team=team_a, user=user_other).exists()  # not until mallory accepts
    mallory = client_for(user_other)
    (invitation,) = mallory.get("/api/invitations/").json()["results"]
    assert (invitation["team_name"], invitation["role"], invitation["invited_by"]) == ("Team A", "viewer", "alice")
    resp = mallory.post(f"/api/invitations/{invitation['id']}/accept/")
    assert resp.status_code == 201, resp.content
    membership_id = resp.json()["id"]
    assert owner_client.patch(f"/api/memberships/{membership_id}/", {"role": "member"}).json()["role"] == "member"
    assert member_client.delete(f"/api/memberships/{membership_id}/").status_code == 403
    assert owner_client.delete(f"/api/memberships/{membership_id}/").status_code == 204
    assert not Membership.objects.filter(pk=membership_id).exists()


def test_last_owner_cannot_be_removed_or_demoted(team_a, user_owner):
    owner_membership = Membership.objects.get(team=team_a, user=user_owner)
    client = client_for(user_owner)
    assert client.patch(f"/api/memberships/{owner_membership.pk}/", {"role": "viewer"}).status_code == 409
    assert client.delete(f"/api/memberships/{owner_membership.pk}/").status_code == 409


def test_memberships_of_other_teams_invisible(api_other, team_a, user_member):
    assert api_other.get(f"/api/memberships/?team={team_a.pk}").json()["count"] == 0
    resp = api_other.post("/api/invitations/", {"team": team_a.pk, "username": "mallory", "role": "owner"})
    assert resp.status_code == 400 and "team" in resp.json()["errors"]


def test_quota_read_for_members_write_for_staff(team_a, user_owner, user_staff):
    quota = team_a.quota
    owner = client_for(user_owner)
    body = owner.get(f"/api/quotas/{quota.pk}/").json()
    assert body["max_concurrent_runs"] == quota.max_concurrent_runs
    assert set(body["usage"]) >= {"concurrent_runs", "tuning_trials_this_month", "gpu_hours_this_month",
                                  "energy_kwh_this_month"}
    assert owner.patch(f"/api/quotas/{quota.pk}/", {"max_concurrent_runs": 99}).status_code == 403
    staff = client_for(user_staff)
    resp = staff.patch(f"/api/quotas/{quota.pk}/", {"max_concurrent_runs": 7, "energy_kwh_per_month": 1.5})
    assert resp.status_code == 200, resp.content
    quota.refresh_from_db()
    assert (quota.max_concurrent_runs, quota.energy_kwh_per_month) == (7, 1.5)
    assert staff.patch(f"/api/quotas/{quota.pk}/", {"gpu_hours_per_month": -1}).status_code == 400


def test_tokens_are_hashed_and_revocable(user_owner):
    from rest_framework.test import APIClient

    session = APIClient()
    session.force_authenticate(user_owner)
    resp = session.post("/api/tokens/", {"name": "ci", "password": "pw-alice"})
    assert resp.status_code == 201
    key, token_id = resp.json()["key"], resp.json()["id"]
    assert not ApiToken.objects.filter(key_hash=key).exists()  # only the hash is stored
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get("/api/me/").json()["username"] == "alice"
    assert "key" not in session.get("/api/tokens/").json()["results"][0]
    assert session.delete(f"/api/tokens/{token_id}/").json()["revoked_at"]
    resp = client.get("/api/me/")
    assert resp.status_code == 401 and "revoked" in resp.json()["detail"]


def test_cannot_revoke_someone_elses_token(user_owner, user_other):
    from core import services

    issued = services.create_api_token(user=user_other, name="x")
    assert client_for(user_owner).delete(f"/api/tokens/{issued.token.pk}/").status_code == 404


def test_error_format_is_uniform(api_owner):
    body = api_owner.get("/api/models/999999/").json()
    assert set(body) >= {"detail", "code", "errors"} and body["code"] == "not_found"


def test_me_lists_roles(team_a, user_viewer):
    body = client_for(user_viewer).get("/api/me/").json()
    assert body["teams"] == [{"id": team_a.pk, "slug": team_a.slug, "name": "Team A", "role": "viewer"}]


def test_a_token_key_never_starts_with_a_dash(monkeypatch):
    """A leading '-' makes `dlopt login --token KEY` (and shells) read the key as an option."""
    import secrets

    from core.models import ApiToken

    drawn = iter(["-leading-dash", "fine-key"])
    monkeypatch.setattr(secrets, "token_urlsafe", lambda n: next(drawn))
    assert ApiToken.generate_key() == "fine-key"
