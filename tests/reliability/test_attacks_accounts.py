"""Attacks on the dashboard's account pages (API tokens, teams and members, invitations, record import)
and on the API endpoints behind them, as a hostile owner, member, viewer, another team's user or an
anonymous visitor. Each test is an attack that must fail; the ones that once succeeded say so."""
from __future__ import annotations

import logging
import re
import threading

import pytest
from django.db import OperationalError, connection
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from core import services
from core.exceptions import ServiceError
from core.models import ApiToken, Membership, TeamInvitation
from core.services import teams as team_services
from tests.factories import ApiTokenFactory, MembershipFactory, TeamFactory, TuningRunFactory, UserFactory

pytestmark = pytest.mark.django_db


def logged_in(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


def page_messages(resp) -> list[str]:
    return [str(m) for m in resp.context["messages"]] if resp.context else []


def owners_of(team) -> set[str]:
    return set(Membership.objects.filter(team=team, role=Membership.Role.OWNER)
               .values_list("user__username", flat=True))


# --- the last owner, taken away by two owners at once (was broken: write skew) -------------------------


def _two_owner_team():
    """A team owned by alice and bob: (alice, bob, team, alice's membership, bob's membership)."""
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    team = TeamFactory(name="Race", owner=alice)
    m_alice = Membership.objects.get(team=team, user=alice)
    m_bob = MembershipFactory(team=team, user=bob, role=Membership.Role.OWNER)
    return alice, bob, team, m_alice, m_bob


def _race(first, second, monkeypatch):
    """Run ``first`` and ``second`` in two transactions that overlap at the last-owner check: ``second``
    starts once ``first`` has checked that another owner remains, before ``first`` commits."""
    real_check = team_services._ensure_an_owner_remains
    in_check, second_done, calls = threading.Event(), threading.Event(), []
    outcomes: dict[str, object] = {}

    def check(*args, **kwargs):
        calls.append(1)
        real_check(*args, **kwargs)  # another owner remains, as far as this transaction can see
        if len(calls) == 1:
            in_check.set()
            second_done.wait(1.5)  # without a team lock, the second write checks and commits meanwhile
    monkeypatch.setattr(team_services, "_ensure_an_owner_remains", check)

    def run(name, write, after=None):
        try:
            if after is not None:
                after.wait(10)
            write()
            outcomes[name] = "ok"
        except ServiceError as exc:
            outcomes[name] = exc
        except OperationalError as exc:  # SQLite's in-memory test database refuses the overlapping writer
            outcomes[name] = exc
        finally:
            if name == "second":
                second_done.set()
            connection.close()
    threads = [threading.Thread(target=run, args=("first", first)),
               threading.Thread(target=run, args=("second", second, in_check))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return outcomes


@pytest.mark.django_db(transaction=True)
@pytest.mark.dialect
def test_two_owners_demoting_each_other_at_once_leave_one_owner(monkeypatch):
    alice, bob, team, m_alice, m_bob = _two_owner_team()
    outcomes = _race(lambda: services.change_member_role(actor=alice, membership=m_bob, role="viewer"),
                     lambda: services.change_member_role(actor=bob, membership=m_alice, role="viewer"), monkeypatch)
    assert len(owners_of(team)) == 1, outcomes
    assert sorted(map(str, outcomes.values())).count("ok") == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.dialect
def test_two_owners_removing_each_other_at_once_leave_one_owner(monkeypatch):
    alice, bob, team, m_alice, m_bob = _two_owner_team()
    outcomes = _race(lambda: services.remove_member(actor=alice, membership=m_bob),
                     lambda: services.remove_member(actor=bob, membership=m_alice), monkeypatch)
    assert len(owners_of(team)) == 1, outcomes


@pytest.mark.django_db(transaction=True)
@pytest.mark.dialect
def test_two_owners_leaving_at_once_leave_one_owner(monkeypatch):
    alice, bob, team, m_alice, m_bob = _two_owner_team()
    outcomes = _race(lambda: services.remove_member(actor=alice, membership=m_alice),
                     lambda: services.remove_member(actor=bob, membership=m_bob), monkeypatch)
    assert len(owners_of(team)) == 1, outcomes


# --- roles: escalation and IDOR on the dashboard (held) ----------------------------------------------------


def _member_url(team, membership, action):
    return reverse("team-member", args=[team.pk, membership.pk, action])


def test_viewer_and_member_cannot_make_themselves_owner_or_demote_an_owner(team_a, user_owner, user_member,
                                                                           user_viewer):
    owner_row = Membership.objects.get(team=team_a, user=user_owner)
    for user in (user_viewer, user_member):
        mine = Membership.objects.get(team=team_a, user=user)
        c = logged_in(user)
        c.post(_member_url(team_a, mine, "role"), {"role": "owner"})
        c.post(_member_url(team_a, owner_row, "role"), {"role": "viewer"})
        c.post(_member_url(team_a, owner_row, "remove"))
    assert owners_of(team_a) == {"alice"}
    assert dict(Membership.objects.filter(team=team_a).values_list("user__username", "role")) == {
        "alice": "owner", "bob": "member", "victor": "viewer"}


def test_an_owner_cannot_reach_another_teams_members_through_their_own_team(team_a, team_b, user_owner,
                                                                            user_other):
    """IDOR: the member id of another team under a team URL of one's own is a 404, not an edit."""
    theirs = Membership.objects.get(team=team_b, user=user_other)
    c = logged_in(user_owner)
    assert c.post(_member_url(team_a, theirs, "role"), {"role": "viewer"}).status_code == 404
    assert c.post(_member_url(team_a, theirs, "remove")).status_code == 404
    assert c.post(reverse("team-webhook", args=[team_b.pk, "rotate"])).status_code == 404
    assert c.post(reverse("team-invite", args=[team_b.pk]), {"username": "alice", "role": "owner"}).status_code == 404
    assert owners_of(team_b) == {"mallory"} and not TeamInvitation.objects.exists()


def test_no_one_accepts_an_invitation_made_for_someone_else(team_a, user_owner, user_other, user_viewer):
    invitee = UserFactory(username="ivy")
    invitation = services.invite_member(actor=user_owner, team=team_a, username="ivy", role="owner")
    for thief in (user_other, user_viewer):
        assert logged_in(thief).post(reverse("invitation-answer", args=[invitation.pk, "accept"])).status_code == 404
        assert APIClient().post(f"/api/invitations/{invitation.pk}/accept/").status_code in (401, 403)
        api = APIClient()
        api.force_authenticate(thief)
        assert api.post(f"/api/invitations/{invitation.pk}/accept/").status_code == 404
    assert not Membership.objects.filter(team=team_a, user=user_other).exists()
    assert Membership.objects.get(team=team_a, user=user_viewer).role == "viewer"
    assert TeamInvitation.objects.filter(pk=invitation.pk, user=invitee).exists()


def test_invitations_to_a_team_one_does_not_own_are_refused(team_a, team_b, user_member, user_viewer, user_other):
    UserFactory(username="ivy")
    for user, team in ((user_member, team_a), (user_viewer, team_a), (user_other, team_a), (user_member, team_b)):
        api = APIClient()
        api.force_authenticate(user)
        resp = api.post("/api/invitations/", {"team": team.pk, "username": "ivy", "role": "owner"}, format="json")
        assert resp.status_code in (400, 403, 404), (user, team, resp.status_code)
    assert not TeamInvitation.objects.exists()


def test_api_role_changes_by_viewers_members_and_other_teams_are_refused(team_a, user_owner, user_member,
                                                                        user_viewer, user_other):
    owner_row = Membership.objects.get(team=team_a, user=user_owner)
    for user, expected in ((user_viewer, 403), (user_member, 403), (user_other, 404)):
        api = APIClient()
        api.force_authenticate(user)
        assert api.patch(f"/api/memberships/{owner_row.pk}/", {"role": "viewer"}, format="json").status_code == expected
        assert api.delete(f"/api/memberships/{owner_row.pk}/").status_code == expected
    mine = Membership.objects.get(team=team_a, user=user_viewer)
    api = APIClient()
    api.force_authenticate(user_viewer)
    assert api.patch(f"/api/memberships/{mine.pk}/", {"role": "owner"}, format="json").status_code == 403
    assert owners_of(team_a) == {"alice"} and Membership.objects.get(pk=mine.pk).role == "viewer"


# --- tokens: IDOR, shown once, never logged (held) ----------------------------------------------------------


def test_another_users_token_cannot_be_revoked_or_read(user_owner, user_other):
    theirs = ApiTokenFactory(user=user_other)
    assert logged_in(user_owner).post(reverse("token-revoke", args=[theirs.pk])).status_code == 404
    api = APIClient()
    api.force_authenticate(user_owner)
    assert api.get(f"/api/tokens/{theirs.pk}/").status_code == 404
    assert api.delete(f"/api/tokens/{theirs.pk}/").status_code == 404
    theirs.refresh_from_db()
    assert theirs.is_active


def test_a_new_key_is_shown_once_and_never_logged_or_listed(user_owner, caplog):
    user_owner.set_password("s3cret-pass")
    user_owner.save()
    c = logged_in(user_owner)
    with caplog.at_level(logging.DEBUG):
        resp = c.post(reverse("settings-tokens"), {"name": "ci", "password": "s3cret-pass"})
    key = resp.context["issued"].key
    assert key in resp.content.decode() and "no-store" in resp.headers.get("Cache-Control", "")
    assert key not in caplog.text and "s3cret-pass" not in caplog.text
    assert key not in c.get(reverse("settings-tokens")).content.decode()  # the next view of the page
    api = APIClient()
    api.force_authenticate(user_owner)
    assert key not in api.get("/api/tokens/").content.decode()
    assert ApiToken.objects.get(user=user_owner).key_hash != key


def test_a_token_cannot_mint_tokens_and_the_dashboard_wants_the_password(user_owner):
    c = logged_in(user_owner)
    resp = c.post(reverse("settings-tokens"), {"name": "stolen-session", "password": "guess"})
    assert resp.status_code == 200 and resp.context["issued"] is None and not ApiToken.objects.exists()
    key = services.create_api_token(user=user_owner, name="leaked").key
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert api.post("/api/tokens/", {"name": "child"}, format="json").status_code == 403
    assert ApiToken.objects.count() == 1


def test_anonymous_visitors_are_sent_to_login_and_change_nothing(team_a, user_owner):
    token = ApiTokenFactory(user=user_owner)
    owner_row = Membership.objects.get(team=team_a, user=user_owner)
    anon = Client()
    for url in (reverse("settings-tokens"), reverse("team-list-page"), reverse("team-page", args=[team_a.pk])):
        assert anon.get(url).status_code == 302
    for url in (reverse("token-revoke", args=[token.pk]), _member_url(team_a, owner_row, "remove"),
                reverse("team-webhook", args=[team_a.pk, "set"])):
        assert anon.post(url, {"url": "https://example.org/"}).status_code in (302, 403)
    token.refresh_from_db()
    assert token.is_active and owners_of(team_a) == {"alice"}


def test_cross_site_posts_without_a_csrf_token_are_refused(team_a, user_owner, user_member):
    c = Client(enforce_csrf_checks=True)
    c.force_login(user_owner)
    member = Membership.objects.get(team=team_a, user=user_member)
    assert c.post(_member_url(team_a, member, "role"), {"role": "owner"}).status_code == 403
    assert c.post(reverse("team-leave", args=[team_a.pk])).status_code == 403
    assert Membership.objects.get(pk=member.pk).role == "member"


# --- names shown on pages: HTML stays text (held) ---------------------------------------------------------

XSS = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def test_hostile_names_are_escaped_on_the_token_and_team_pages(user_owner, user_staff):
    team = services.create_team(name=XSS, owner=user_owner, description=XSS, actor=user_staff)
    evil = UserFactory(username="ev<b>il")
    MembershipFactory(team=team, user=evil, role="member")
    services.create_api_token(user=user_owner, name=XSS)
    services.invite_member(actor=user_owner, team=team, username="mallory-x", role="member")
    c = logged_in(user_owner)
    pages = [c.get(reverse("settings-tokens")), c.get(reverse("team-list-page")),
             c.get(reverse("team-page", args=[team.pk]))]
    member = Membership.objects.get(team=team, user=evil)
    pages.append(c.post(_member_url(team, member, "remove"), follow=True))
    for resp in pages:
        html = resp.content.decode()
        assert "<script>alert" not in html and "<img src=x" not in html and "ev<b>il" not in html
    assert "&lt;script&gt;" in pages[0].content.decode()


# --- record import: hostile JSON answers a message, never a 500 -------------------------------------------


@pytest.fixture
def import_run(team_a, user_owner):
    from core.models import Quota
    from tests.factories import DLModelFactory

    Quota.objects.filter(team=team_a).update(max_concurrent_runs=10, tuning_trials_per_month=100_000)
    model = DLModelFactory(team=team_a, name="cnn-import", created_by=user_owner)
    return TuningRunFactory(model=model, created_by=user_owner, max_trials=8, trials_per_round=32)


def _upload(workloads: bytes, records: bytes) -> dict:
    from django.core.files.uploadedfile import SimpleUploadedFile

    return {"workloads": SimpleUploadedFile("database_workload.json", workloads),
            "records": SimpleUploadedFile("database_tuning_record.json", records)}


HOSTILE_RECORDS = [
    b"[0, [[[[\"Split\", [" + b"9" * 5000 + b"]]], []]]]\n",    # an integer past Python's 4300-digit limit (was a 500)
    b"[0, [[[[\"Split\", [1e999999]]], []]]]\n",               # a float that overflows to inf
    b"[" * 100_000 + b"]" * 100_000 + b"\n",                   # nested past the JSON parser's recursion limit
    b"[0, [[[[\"Annotate\", [], [\"pragma_import_llvm\", \"define void @x()\"]]], []]]]\n",  # code in a trace
    b"[7, [[[], []]]]\n",                                      # a workload index out of range
    b"\xff\xfe not utf-8\n",
]


@pytest.mark.parametrize("records", HOSTILE_RECORDS, ids=range(len(HOSTILE_RECORDS)))
def test_hostile_record_files_are_refused_with_a_message(import_run, user_owner, records):
    url = reverse("run-import-records", args=[import_run.pk])
    resp = logged_in(user_owner).post(url, _upload(b'{"not": "a workload"}\n', records), follow=True)
    assert [code for _, code in resp.redirect_chain] == [302]
    shown = page_messages(resp)
    # every refusal, the cheap pre-check's too, reads the same: what was refused and that nothing was imported
    assert shown[0] == "Records refused, nothing was imported:" and len(shown) >= 2, shown
    import_run.refresh_from_db()
    assert "imported_records" not in import_run.options


def test_a_huge_integer_in_a_record_is_refused_by_the_precheck():
    from tuning.engine.records.check import RecordError, precheck

    with pytest.raises(RecordError, match="Tuning record line 1"):
        precheck(b"{}\n", HOSTILE_RECORDS[0], max_records=8)
    with pytest.raises(RecordError, match="Workload line 1"):
        precheck(b"[" + b"1" * 5000 + b"]\n", b"[0, [[[], []]]]\n", max_records=8)


def test_a_record_file_of_millions_of_lines_is_refused_before_they_are_parsed(monkeypatch):
    """Was broken: the budget was checked after every line had been parsed, so one 200 MB upload of
    tiny records held a web worker for tens of seconds and gigabytes (the dashboard and the API)."""
    from tuning.engine.records import check as records_check

    parsed = []
    real_loads = records_check.json.loads

    class CountingJson:
        JSONDecodeError = records_check.json.JSONDecodeError

        @staticmethod
        def loads(text):
            parsed.append(1)
            return real_loads(text)
    monkeypatch.setattr(records_check, "json", CountingJson)
    with pytest.raises(records_check.RecordError, match="budget of 8"):
        records_check.precheck(b"{}\n", b"[0, [[[], []]]]\n" * 200_000, max_records=8)
    assert len(parsed) <= 1 + 9
    parsed.clear()
    with pytest.raises(records_check.RecordError, match="workload"):
        records_check.precheck(b"{}\n" * 200_000, b"[0, [[[], []]]]\n", max_records=8)
    assert len(parsed) <= records_check.MAX_WORKLOADS + 1


def test_a_model_name_cannot_inject_headers_into_its_download(team_a, user_owner):
    """The model page's new download link: the file name goes into Content-Disposition (held)."""
    from tests.factories import DLModelFactory

    model = DLModelFactory(team=team_a, name='x"\r\nSet-Cookie: a=b', created_by=user_owner)
    api = APIClient()
    api.force_authenticate(user_owner)
    resp = api.get(f"/api/models/{model.pk}/download/")
    assert resp.status_code == 200 and "Set-Cookie" not in resp.headers and "\n" not in resp["Content-Disposition"]


# --- password guessing: limits a client cannot dodge, and a lockout per account (issue 39) ------------------

GUESSES = 25


def _rates(settings, **rates):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {
        **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], **rates}}


def _refusal_text(resp) -> str:
    match = re.search(r'<p class="error" id="login-throttled">(.*?)</p>', resp.content.decode())
    return match.group(1) if match else ""


def test_rotating_x_forwarded_for_does_not_dodge_the_dashboard_login_limit(user_owner, settings):
    """Was broken: the limit was keyed on the whole X-Forwarded-For header, so a new header was a new client."""
    _rates(settings, login="10/minute")
    settings.LOGIN_LOCKOUT_FAILURES = 1000  # the per-address limit alone
    c = Client()
    statuses = [c.post(reverse("login"), {"username": "alice", "password": f"guess-{i}"},
                       HTTP_X_FORWARDED_FOR=f"203.0.113.{i}").status_code for i in range(GUESSES)]
    assert statuses == [200] * 10 + [429] * (GUESSES - 10), statuses
    resp = c.post(reverse("login"), {"username": "alice", "password": "pw-alice"}, HTTP_X_FORWARDED_FOR="198.51.100.1")
    assert resp.status_code == 429 and int(resp["Retry-After"]) > 0 and "_auth_user_id" not in c.session
    assert _refusal_text(resp).startswith("Too many login attempts")


def test_behind_a_proxy_only_the_address_it_appended_counts(user_owner, settings):
    """NUM_PROXIES=1: the client writes what it likes left of the address our proxy appends."""
    _rates(settings, login="10/minute")
    settings.LOGIN_LOCKOUT_FAILURES = 1000
    settings.NUM_PROXIES = 1
    c = Client()
    statuses = [c.post(reverse("login"), {"username": "alice", "password": f"guess-{i}"},
                       HTTP_X_FORWARDED_FOR=f"203.0.113.{i}, 198.51.100.7").status_code for i in range(GUESSES)]
    assert statuses.index(429) == 10 and set(statuses[10:]) == {429}, statuses
    other_client = c.post(reverse("login"), {"username": "alice", "password": "pw-alice"},
                          HTTP_X_FORWARDED_FOR="198.51.100.8")
    assert other_client.status_code == 302  # a different client behind the same proxy has its own budget


def test_client_address_trusts_x_forwarded_for_only_as_far_as_num_proxies(settings, rf):
    from core.client_address import client_address

    request = rf.get("/", HTTP_X_FORWARDED_FOR="6.6.6.6, 10.0.0.1, 10.0.0.2", REMOTE_ADDR="10.0.0.3")
    expected = {0: "10.0.0.3", 1: "10.0.0.2", 2: "10.0.0.1", 3: "6.6.6.6", 5: "6.6.6.6"}
    for num_proxies, address in expected.items():
        settings.NUM_PROXIES = num_proxies
        assert client_address(request) == address, num_proxies
    settings.NUM_PROXIES = 1
    assert client_address(rf.get("/", REMOTE_ADDR="10.0.0.3")) == "10.0.0.3"  # no header: the connection


def test_the_api_and_drf_read_the_same_client_address(settings, rf):
    """DRF's own NUM_PROXIES (used by any stock DRF throttle) is our setting, not its default None (which
    keys on the whole header)."""
    from rest_framework.settings import api_settings

    from core.api.throttles import UserThrottle

    assert api_settings.NUM_PROXIES == settings.NUM_PROXIES == 0
    assert "core.api.throttles.UserThrottle" in settings.REST_FRAMEWORK["DEFAULT_THROTTLE_CLASSES"]
    request = rf.get("/", HTTP_X_FORWARDED_FOR="6.6.6.6", REMOTE_ADDR="10.0.0.3")
    assert UserThrottle().get_ident(request) == "10.0.0.3"


def test_password_guesses_at_the_api_token_endpoint_meet_the_lockout(user_owner):
    """Was broken: a session could mint a token without the password; now it is typed again, and a stolen
    session guessing it is stopped by the account's lockout whatever X-Forwarded-For says."""
    api = APIClient()
    api.force_login(user_owner)
    statuses = [api.post("/api/tokens/", {"name": "t", "password": f"guess-{i}"}, format="json",
                         HTTP_X_FORWARDED_FOR=f"203.0.113.{i}").status_code for i in range(GUESSES)]
    assert statuses == [403] * 10 + [429] * (GUESSES - 10), statuses
    resp = api.post("/api/tokens/", {"name": "t", "password": "pw-alice"}, format="json")
    assert resp.status_code == 429 and int(resp["Retry-After"]) > 0 and resp.json()["code"] == "throttled"
    assert not ApiToken.objects.exists()


def test_minting_a_token_over_the_api_needs_the_current_password(user_owner):
    api = APIClient()
    api.force_login(user_owner)
    missing = api.post("/api/tokens/", {"name": "ci"}, format="json")
    assert missing.status_code == 400 and "password" in missing.json()["errors"]
    wrong = api.post("/api/tokens/", {"name": "ci", "password": "not-it"}, format="json")
    assert wrong.status_code == 403 and "password" in wrong.json()["errors"]
    assert not ApiToken.objects.exists()
    right = api.post("/api/tokens/", {"name": "ci", "password": "pw-alice"}, format="json")
    assert right.status_code == 201 and right.json()["key"] and "password" not in right.json()


def test_password_guesses_at_the_admin_login_are_refused(user_staff):
    """Was broken: /admin/login/ had no limit at all."""
    c = Client()
    url = reverse("admin:login")
    statuses = [c.post(url, {"username": "stan", "password": f"guess-{i}", "next": "/admin/"},
                       HTTP_X_FORWARDED_FOR=f"203.0.113.{i}").status_code for i in range(GUESSES)]
    assert 429 in statuses and set(statuses[statuses.index(429):]) == {429}, statuses
    resp = c.post(url, {"username": "stan", "password": "pw-stan", "next": "/admin/"})
    assert resp.status_code == 429 and int(resp["Retry-After"]) > 0 and "_auth_user_id" not in c.session
    assert "Too many login attempts" in resp.content.decode()


def test_the_admin_login_locks_a_name_guessed_from_many_addresses(user_staff, settings):
    _rates(settings, login="10000/minute")  # the lockout alone
    c = Client()
    url = reverse("admin:login")
    statuses = [c.post(url, {"username": "stan", "password": f"guess-{i}"}, REMOTE_ADDR=f"192.0.2.{i}").status_code
                for i in range(10)]
    assert statuses == [200] * 10
    resp = c.post(url, {"username": "stan", "password": "pw-stan"}, REMOTE_ADDR="192.0.2.200")
    assert resp.status_code == 429 and "_auth_user_id" not in c.session


def test_a_name_is_locked_across_addresses_and_the_lock_tells_no_one_it_exists(user_owner, settings):
    _rates(settings, login="10000/minute")  # the lockout alone
    answers = {}
    for username, right_password in (("alice", "pw-alice"), ("no-such-user", "anything")):
        c = Client()
        statuses = [c.post(reverse("login"), {"username": username, "password": f"guess-{i}"},
                           REMOTE_ADDR=f"192.0.2.{i}").status_code for i in range(10)]
        assert statuses == [200] * 10
        resp = c.post(reverse("login"), {"username": username, "password": right_password},
                      REMOTE_ADDR="198.51.100.99")
        answers[username] = (resp.status_code, _refusal_text(resp))
        assert "_auth_user_id" not in c.session
    assert answers["alice"] == answers["no-such-user"]
    assert answers["alice"][0] == 429 and answers["alice"][1].startswith("Too many login attempts")
    # the same name is locked at the admin login and for minting tokens (one lock, in the backend)
    admin = Client().post(reverse("admin:login"), {"username": "alice", "password": "pw-alice"})
    assert admin.status_code == 429
    api = APIClient()
    api.force_login(user_owner)
    assert api.post("/api/tokens/", {"name": "t", "password": "pw-alice"}, format="json").status_code == 429
    page = logged_in(user_owner).post(reverse("settings-tokens"), {"name": "t", "password": "pw-alice"})
    assert page.status_code == 429 and page.context["issued"] is None and not ApiToken.objects.exists()
    # another account is untouched
    UserFactory(username="carol")
    assert Client().post(reverse("login"), {"username": "carol", "password": "pw-carol"}).status_code == 302


def test_the_lock_ends_and_a_successful_login_clears_the_failures(user_owner, settings):
    import time

    _rates(settings, login="10000/minute")
    settings.LOGIN_LOCKOUT_SECONDS = 1

    def attempt(password):
        return Client().post(reverse("login"), {"username": "alice", "password": password}).status_code
    assert [attempt(f"guess-{i}") for i in range(10)] == [200] * 10
    assert attempt("pw-alice") == 429
    time.sleep(1.2)  # the lock's end (no clock is read in an assertion)
    assert attempt("pw-alice") == 302
    # the count starts again from zero: nine more failures lock nothing
    assert [attempt(f"again-{i}") for i in range(9)] == [200] * 9
    assert attempt("pw-alice") == 302


# --- uploads from the dashboard count against the API's upload limit (issue 39) -----------------------------


def test_dashboard_model_uploads_share_the_api_upload_limit(team_a, user_owner, settings):
    """Was broken: the dashboard's model upload had no limit; now it spends the same per-user budget."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    from core.models import DLModel
    from core.onnx_models import zoo

    _rates(settings, uploads="2/hour")
    api = APIClient()
    api.force_authenticate(user_owner)
    first = api.post("/api/models/", {"team": team_a.pk, "name": "junk", "file": SimpleUploadedFile("j.onnx", b"junk")},
                     format="multipart")
    assert first.status_code == 400
    c = logged_in(user_owner)
    junk = c.post(reverse("model-upload"), {"team": team_a.pk, "name": "junk2",
                                            "file": SimpleUploadedFile("j.onnx", b"junk")})
    assert junk.status_code == 200  # refused by validation, counted all the same
    valid = SimpleUploadedFile("cnn.onnx", zoo.build_model("small_cnn").SerializeToString())
    resp = c.post(reverse("model-upload"), {"team": team_a.pk, "name": "over-the-limit", "file": valid})
    assert resp.status_code == 429 and "Too many uploads" in resp.content.decode()
    assert not DLModel.objects.filter(name="over-the-limit").exists()
    # and the API sees the budget the dashboard spent
    assert api.post("/api/models/", {"team": team_a.pk, "name": "x", "file": SimpleUploadedFile(
        "j.onnx", b"junk")}, format="multipart").status_code == 429


def test_dashboard_trace_uploads_share_the_api_upload_limit(team_a, user_owner, settings):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from scheduling.models import TraceUpload
    from tests.helpers import PHILLY_CSV

    _rates(settings, uploads="2/hour")
    c = logged_in(user_owner)
    url = reverse("simulation-new") + "?upload=1"
    statuses = [c.post(url, {"team": team_a.pk, "name": f"trace-{i}", "file": SimpleUploadedFile(
        "p.csv", PHILLY_CSV.encode())}).status_code for i in range(3)]
    assert statuses == [302, 302, 429], statuses
    assert set(TraceUpload.objects.values_list("name", flat=True)) == {"trace-0", "trace-1"}
    api = APIClient()
    api.force_authenticate(user_owner)
    assert api.post("/api/traces/", {"team": team_a.pk, "name": "t", "file": SimpleUploadedFile(
        "p.csv", PHILLY_CSV.encode())}, format="multipart").status_code == 429


def _hammer(fn, threads: int, per_thread: int) -> list:
    results, start = [], threading.Barrier(threads)
    lock = threading.Lock()

    def run():
        start.wait(10)
        mine = [fn() for _ in range(per_thread)]
        with lock:
            results.extend(mine)
    workers = [threading.Thread(target=run) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(60)
    return results


@pytest.mark.parametrize("backend", ["locmem", "redis"])
def test_concurrent_hits_are_each_counted_once(backend, settings, request):
    """cache.add + incr: no two concurrent requests read the same count (get-then-set lets them)."""
    from core import ratelimit

    if backend == "redis":
        server = request.getfixturevalue("private_redis")
        settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                       "LOCATION": server.url}}
    counts = _hammer(lambda: ratelimit.hit("throttle_test_concurrent", 3600), threads=8, per_thread=25)
    assert sorted(counts) == list(range(1, 8 * 25 + 1))
    assert ratelimit.count("throttle_test_concurrent") == 200


def test_concurrent_uploads_cannot_slip_past_the_limit(user_owner, settings, rf):
    from core.api.throttles import UploadThrottle

    _rates(settings, uploads="5/hour")

    def upload_allowed():
        request = rf.post("/models/upload/")
        request.user = user_owner
        return UploadThrottle().allow_request(request, None)
    allowed = _hammer(upload_allowed, threads=8, per_thread=4)
    assert allowed.count(True) == 5 and len(allowed) == 32


# --- list filters tell nothing about other teams' rows (issue 39) -------------------------------------------


def test_filtering_by_another_teams_id_answers_like_an_id_that_does_not_exist(world):
    """Was broken: another team's id was a 200 with no results, an unknown id a 400 "Select a valid choice"."""
    from tests.factories import GpuJobFactory, SimulationRunFactory, TraceUploadFactory

    b = world.team_b
    TraceUploadFactory(team=b, name="trace-b", created_by=world.users["other"])
    SimulationRunFactory(team=b, created_by=world.users["other"])
    job_b = GpuJobFactory(model=world.model_b, predicted_mem_mb=1000.0, placed=True)
    theirs = {"team": b.pk, "model": world.model_b.pk, "job": job_b.pk}
    filters = [("/api/memberships/", "team"), ("/api/invitations/", "team"), ("/api/quotas/", "team"),
               ("/api/models/", "team"), ("/api/runs/", "team"), ("/api/runs/", "model"),
               ("/api/gpu-jobs/", "team"), ("/api/gpu-jobs/", "model"), ("/api/traces/", "team"),
               ("/api/simulations/", "team"), ("/api/placements/", "job")]
    api = APIClient()
    api.force_authenticate(world.users["member"])
    for url, name in filters:
        other = api.get(url, {name: theirs[name]})
        unknown = api.get(url, {name: 987654321})
        assert (other.status_code, other.json()) == (unknown.status_code, unknown.json()), (url, name)
        assert other.status_code == 200 and other.json()["count"] == 0, (url, name)
    mine = api.get("/api/runs/", {"model": world.model.pk})
    assert mine.status_code == 200 and mine.json()["count"] > 0  # the filter still filters
    # a path id: another team's and an unknown one are the same 404
    other = api.get(f"/api/teams/{b.pk}/record-cache/")
    unknown = api.get("/api/teams/987654321/record-cache/")
    assert (other.status_code, other.json()) == (unknown.status_code, unknown.json()) and other.status_code == 404


@pytest.mark.parametrize("value", ["abc", "1.5", str(2**63), "-" + str(2**64)])
def test_a_malformed_id_filter_is_a_400_not_a_database_error(world, value):
    api = APIClient()
    api.force_authenticate(world.users["member"])
    resp = api.get("/api/runs/", {"model": value})
    assert resp.status_code == 400 and "model" in resp.json()["errors"]


def test_every_api_filter_set_filters_foreign_keys_by_plain_id():
    """A new viewset cannot bring back the leak: no API filter is a ModelChoiceFilter over all rows."""
    import django_filters

    from core.api.fast import QuickFilterBackend
    from core.api.filters import VisibleRowsFilterSet
    from core.api.router import router

    backend = QuickFilterBackend()
    for prefix, viewset, _ in router.registry:
        view = viewset()
        view.action, view.request, view.format_kwarg, view.kwargs = "list", None, None, {}
        queryset = viewset.queryset if viewset.queryset is not None else None
        filterset_class = getattr(viewset, "filterset_class", None)
        if filterset_class is None and getattr(viewset, "filterset_fields", None):
            model = (queryset.model if queryset is not None else viewset.serializer_class.Meta.model)
            filterset_class = backend.get_filterset_class(view, model._default_manager.all())
        if filterset_class is None:
            continue
        assert issubclass(filterset_class, VisibleRowsFilterSet), prefix
        for name, f in filterset_class.base_filters.items():
            assert not isinstance(f, (django_filters.ModelChoiceFilter, django_filters.ModelMultipleChoiceFilter)), \
                (prefix, name)
