"""The API tokens page, the teams pages (members, invitations, webhook) and record import from the run
page, through Django's test client: each flow, and each attack on it (other user, other team, viewer,
missing CSRF token, hostile input)."""
from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from core.models import ApiToken, Membership, TeamInvitation, TeamWebhook, WebhookDelivery
from tests.factories import ApiTokenFactory, TuningRunFactory, UserFactory

pytestmark = pytest.mark.django_db


def logged_in(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


def page_messages(resp) -> list[str]:
    return [str(m) for m in resp.context["messages"]] if resp.context else []


# --- API tokens ----------------------------------------------------------------------------------------


def test_a_token_is_created_with_the_password_and_shown_once(user_owner):
    c = logged_in(user_owner)
    wrong = c.post("/settings/tokens/", {"name": "ci", "password": "not-it"})
    assert wrong.status_code == 200 and b"Wrong password" in wrong.content  # the form again, with the error
    assert not ApiToken.objects.filter(user=user_owner).exists()

    resp = c.post("/settings/tokens/", {"name": "ci", "password": "pw-alice"})
    assert resp.status_code == 200 and "no-store" in resp["Cache-Control"]
    key = resp.context["issued"].key
    token = ApiToken.objects.get(user=user_owner)
    assert key.encode() in resp.content and token.key_hash == ApiToken.hash_key(key) and key not in token.key_hash
    assert token.prefix == key[:ApiToken.PREFIX_LEN]
    # the key works, and is never shown again: the list shows its prefix only
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert api.get("/api/me/").json()["username"] == "alice"
    again = c.get("/settings/tokens/")
    assert key.encode() not in again.content and token.prefix.encode() in again.content
    assert b"never" not in again.content  # last used: just now, through the API


def test_revoking_a_token_stops_it_and_another_users_token_is_404(user_owner, user_other):
    mine, theirs = ApiTokenFactory(user=user_owner, name="mine"), ApiTokenFactory(user=user_other, name="theirs")
    c = logged_in(user_owner)
    assert c.post(reverse("token-revoke", args=[theirs.pk])).status_code == 404
    assert c.post(reverse("token-revoke", args=[10**9])).status_code == 404
    theirs.refresh_from_db()
    assert theirs.is_active
    resp = c.post(reverse("token-revoke", args=[mine.pk]), follow=True)
    assert "Token 'mine'" in " ".join(page_messages(resp))
    mine.refresh_from_db()
    assert not mine.is_active
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {mine.key}")
    assert api.get("/api/me/").status_code == 401
    assert c.get(reverse("token-revoke", args=[mine.pk])).status_code == 405


def test_token_forms_need_csrf_and_creation_is_throttled(user_owner, settings):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user_owner)
    token = ApiTokenFactory(user=user_owner)
    assert strict.post("/settings/tokens/", {"name": "x", "password": "pw-alice"}).status_code == 403
    assert strict.post(reverse("token-revoke", args=[token.pk])).status_code == 403
    assert ApiToken.objects.filter(user=user_owner).count() == 1 and ApiToken.objects.get().is_active
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {
        **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "tokens": "2/hour"}}
    c = logged_in(user_owner)
    statuses = [c.post("/settings/tokens/", {"name": "g", "password": "guess"}).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]  # password guessing is bounded too
    assert c.post("/settings/tokens/", {"name": "g", "password": "pw-alice"}).status_code == 429


# --- teams and members -----------------------------------------------------------------------------------


def test_teams_page_lists_my_teams_with_quota_and_usage(user_owner, team_a, team_b, user_member):
    resp = logged_in(user_owner).get("/teams/")
    assert resp.status_code == 200
    (row,) = resp.context["rows"]
    assert row["team"] == team_a and row["role"] == "owner" and row["members"] == 2
    assert row["quota"].max_concurrent_runs == team_a.quota.max_concurrent_runs
    assert row["usage"].concurrent_runs == 0 and b"Team B" not in resp.content


def test_owner_invites_by_email_and_the_user_accepts(user_owner, team_a, db):
    newcomer = UserFactory(username="nina", email="Nina@Example.org")
    owner = logged_in(user_owner)
    resp = owner.post(reverse("team-invite", args=[team_a.pk]), {"username": "nina@example.org", "role": "viewer"},
                      follow=True)
    assert "they are invited as viewer" in " ".join(page_messages(resp))
    invitation = TeamInvitation.objects.get(team=team_a, user=newcomer)
    # unknown names get the same answer and make nothing
    unknown = owner.post(reverse("team-invite", args=[team_a.pk]), {"username": "ghost@example.org", "role": "member"},
                         follow=True)
    assert page_messages(unknown)[0].replace("ghost@example.org", "X") == \
        page_messages(resp)[0].replace("nina@example.org", "X").replace("viewer", "member")
    nina = logged_in(newcomer)
    assert str(invitation.pk).encode() in nina.get("/teams/").content
    assert logged_in(user_owner).post(reverse("invitation-answer", args=[invitation.pk, "accept"])).status_code == 404
    resp = nina.post(reverse("invitation-answer", args=[invitation.pk, "accept"]), follow=True)
    assert "You joined Team A as viewer" in " ".join(page_messages(resp))
    assert Membership.objects.get(team=team_a, user=newcomer).role == "viewer"


def test_owner_changes_roles_and_removes_members(user_owner, team_a, user_member, user_viewer):
    owner = logged_in(user_owner)
    m = Membership.objects.get(team=team_a, user=user_member)
    owner.post(reverse("team-member", args=[team_a.pk, m.pk, "role"]), {"role": "owner"})
    assert Membership.objects.get(pk=m.pk).role == "owner"
    bad = owner.post(reverse("team-member", args=[team_a.pk, m.pk, "role"]), {"role": "god"}, follow=True)
    assert "Choose one of the roles" in " ".join(page_messages(bad)) and Membership.objects.get(pk=m.pk).role == "owner"
    v = Membership.objects.get(team=team_a, user=user_viewer)
    owner.post(reverse("team-member", args=[team_a.pk, v.pk, "remove"]))
    assert not Membership.objects.filter(pk=v.pk).exists()


def test_members_cannot_manage_and_viewers_cannot_invite(user_owner, team_a, user_member, user_viewer):
    o = Membership.objects.get(team=team_a, user=user_owner)
    for user in (user_member, user_viewer):
        c = logged_in(user)
        page = c.get(reverse("team-page", args=[team_a.pk]))
        assert page.status_code == 200 and b"invite-form" not in page.content and b"data-role-form" not in page.content
        resp = c.post(reverse("team-member", args=[team_a.pk, o.pk, "role"]), {"role": "viewer"}, follow=True)
        assert "Only the team's owners" in " ".join(page_messages(resp))
        c.post(reverse("team-member", args=[team_a.pk, o.pk, "remove"]))
        c.post(reverse("team-invite", args=[team_a.pk]), {"username": "mallory", "role": "owner"})
    assert Membership.objects.get(pk=o.pk).role == "owner" and not TeamInvitation.objects.exists()


def test_members_leave_but_the_last_owner_cannot_leave_or_demote_themself(user_owner, team_a, user_member):
    owner = logged_in(user_owner)
    resp = owner.post(reverse("team-leave", args=[team_a.pk]), follow=True)
    assert "You are the team's last owner" in " ".join(page_messages(resp))
    mine = Membership.objects.get(team=team_a, user=user_owner)
    resp = owner.post(reverse("team-member", args=[team_a.pk, mine.pk, "role"]), {"role": "member"}, follow=True)
    assert "You are the team's last owner" in " ".join(page_messages(resp))
    assert Membership.objects.get(pk=mine.pk).role == "owner"
    member = logged_in(user_member)
    resp = member.post(reverse("team-leave", args=[team_a.pk]))
    assert resp.status_code == 302 and resp["Location"] == reverse("team-list-page")
    assert not Membership.objects.filter(team=team_a, user=user_member).exists()
    assert member.get(reverse("team-page", args=[team_a.pk])).status_code == 404


def test_another_teams_pages_and_members_are_404(user_owner, team_a, team_b, user_other, user_staff):
    theirs = Membership.objects.get(team=team_b, user=user_other)
    c = logged_in(user_owner)
    for url in (reverse("team-page", args=[team_b.pk]), reverse("team-page", args=[10**9])):
        assert c.get(url).status_code == 404
    posts = [(reverse("team-invite", args=[team_b.pk]), {"username": "alice", "role": "owner"}),
             (reverse("team-leave", args=[team_b.pk]), {}),
             (reverse("team-member", args=[team_b.pk, theirs.pk, "remove"]), {}),
             (reverse("team-member", args=[team_a.pk, theirs.pk, "remove"]), {}),  # their membership via my team
             (reverse("team-webhook", args=[team_b.pk, "set"]), {"url": "https://example.org/"})]
    for url, body in posts:
        assert c.post(url, body).status_code == 404, url
    assert logged_in(user_staff).get(reverse("team-page", args=[team_a.pk])).status_code == 404
    assert Membership.objects.filter(pk=theirs.pk).exists() and not TeamInvitation.objects.exists()


# --- the team's webhook ------------------------------------------------------------------------------------


def test_owner_sets_the_webhook_and_sees_the_secret_once(user_owner, team_a, user_member, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES, settings.WEBHOOK_HTTP_HOSTS = True, ["127.0.0.1"]
    owner = logged_in(user_owner)
    resp = owner.post(reverse("team-webhook", args=[team_a.pk, "set"]), {"url": "http://127.0.0.1:9/in"})
    hook = TeamWebhook.objects.get(team=team_a)
    assert resp.status_code == 200 and hook.secret.encode() in resp.content and "no-store" in resp["Cache-Control"]
    page = owner.get(reverse("team-page", args=[team_a.pk]))
    assert hook.secret.encode() not in page.content and b"http://127.0.0.1:9/in" in page.content
    rotated = owner.post(reverse("team-webhook", args=[team_a.pk, "rotate"]))
    hook_after = TeamWebhook.objects.get(team=team_a)
    assert hook_after.secret != hook.secret and hook_after.secret.encode() in rotated.content
    # members see the deliveries, not the URL (it may hold a key) nor the forms
    WebhookDelivery.objects.create(team=team_a, event="gpu_job.failed", event_key="gpu_job:1", attempts=2,
                                   last_status_code=503, payload={"object": {"type": "gpu_job", "id": 1}})
    seen = logged_in(user_member).get(reverse("team-page", args=[team_a.pk])).content
    assert b"gpu_job.failed" in seen and b"503" in seen and b"127.0.0.1:9" not in seen and b"webhook-form" not in seen
    resp = logged_in(user_member).post(reverse("team-webhook", args=[team_a.pk, "remove"]), follow=True)
    assert "Only the team's owners" in " ".join(page_messages(resp))
    assert TeamWebhook.objects.filter(team=team_a).exists()


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/", "https://169.254.169.254/latest/meta-data/",
                                 "file:///etc/passwd", "https://[::1]/", "https://10.0.0.1/", "not a url"])
def test_the_webhook_form_refuses_ssrf_urls(user_owner, team_a, url, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES, settings.WEBHOOK_HTTP_HOSTS = False, []
    resp = logged_in(user_owner).post(reverse("team-webhook", args=[team_a.pk, "set"]), {"url": url})
    assert resp.status_code == 200 and resp.context["webhook_form"].errors["url"]
    assert not TeamWebhook.objects.exists()


# --- record import and downloads from the run and model pages ---------------------------------------------


@pytest.fixture
def queued_run(model_a, user_owner, roomy_quota):
    return TuningRunFactory(model=model_a, created_by=user_owner, max_trials=8, trials_per_round=32)


def _files(workloads=b'{"not": "a workload"}\n', records=b"[1, 2]\n"):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return {"workloads": SimpleUploadedFile("database_workload.json", workloads),
            "records": SimpleUploadedFile("database_tuning_record.json", records)}


def test_run_and_model_pages_link_imports_and_downloads(user_owner, queued_run, user_viewer):
    page = logged_in(user_owner).get(reverse("run-detail", args=[queued_run.pk])).content.decode()
    assert reverse("run-import-records", args=[queued_run.pk]) in page and "/records/" in page
    assert reverse("run-import-records", args=[queued_run.pk]).encode() not in \
        logged_in(user_viewer).get(reverse("run-detail", args=[queued_run.pk])).content
    model_page = logged_in(user_viewer).get(reverse("model-detail", args=[queued_run.model_id])).content.decode()
    assert f"/api/models/{queued_run.model_id}/download/" in model_page
    assert logged_in(user_viewer).get(f"/api/models/{queued_run.model_id}/download/").status_code == 200


def test_a_refused_import_shows_its_reasons_and_imports_nothing(user_owner, queued_run):
    resp = logged_in(user_owner).post(reverse("run-import-records", args=[queued_run.pk]), _files(), follow=True)
    shown = page_messages(resp)
    assert resp.status_code == 200 and shown and all("Imported" not in m for m in shown), shown
    assert b"alert" in resp.content or b"msg-error" in resp.content
    queued_run.refresh_from_db()
    assert "imported_records" not in queued_run.options


def test_import_is_refused_to_viewers_and_other_teams(user_viewer, user_other, team_b, queued_run):
    resp = logged_in(user_viewer).post(reverse("run-import-records", args=[queued_run.pk]), _files(), follow=True)
    assert any("Viewers cannot" in m for m in page_messages(resp))
    assert logged_in(user_other).post(reverse("run-import-records", args=[queued_run.pk]), _files()).status_code == 404
    assert logged_in(user_viewer).get(reverse("run-import-records", args=[queued_run.pk])).status_code == 405
