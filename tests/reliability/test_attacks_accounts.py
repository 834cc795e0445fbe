"""Attacks on the dashboard's account pages (API tokens, teams and members, invitations, record import)
and on the API endpoints behind them, as a hostile owner, member, viewer, another team's user or an
anonymous visitor. Each test is an attack that must fail; the ones that once succeeded say so."""
from __future__ import annotations

import logging
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
def test_two_owners_demoting_each_other_at_once_leave_one_owner(monkeypatch):
    alice, bob, team, m_alice, m_bob = _two_owner_team()
    outcomes = _race(lambda: services.change_member_role(actor=alice, membership=m_bob, role="viewer"),
                     lambda: services.change_member_role(actor=bob, membership=m_alice, role="viewer"), monkeypatch)
    assert len(owners_of(team)) == 1, outcomes
    assert sorted(map(str, outcomes.values())).count("ok") == 1


@pytest.mark.django_db(transaction=True)
def test_two_owners_removing_each_other_at_once_leave_one_owner(monkeypatch):
    alice, bob, team, m_alice, m_bob = _two_owner_team()
    outcomes = _race(lambda: services.remove_member(actor=alice, membership=m_bob),
                     lambda: services.remove_member(actor=bob, membership=m_alice), monkeypatch)
    assert len(owners_of(team)) == 1, outcomes


@pytest.mark.django_db(transaction=True)
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
    from tuning.engine.record_check import RecordError, precheck

    with pytest.raises(RecordError, match="Tuning record line 1"):
        precheck(b"{}\n", HOSTILE_RECORDS[0], max_records=8)
    with pytest.raises(RecordError, match="Workload line 1"):
        precheck(b"[" + b"1" * 5000 + b"]\n", b"[0, [[[], []]]]\n", max_records=8)


def test_a_record_file_of_millions_of_lines_is_refused_before_they_are_parsed(monkeypatch):
    """Was broken: the budget was checked after every line had been parsed, so one 200 MB upload of
    tiny records held a web worker for tens of seconds and gigabytes (the dashboard and the API)."""
    from tuning.engine import record_check

    parsed = []
    real_loads = record_check.json.loads

    class CountingJson:
        JSONDecodeError = record_check.json.JSONDecodeError

        @staticmethod
        def loads(text):
            parsed.append(1)
            return real_loads(text)
    monkeypatch.setattr(record_check, "json", CountingJson)
    with pytest.raises(record_check.RecordError, match="budget of 8"):
        record_check.precheck(b"{}\n", b"[0, [[[], []]]]\n" * 200_000, max_records=8)
    assert len(parsed) <= 1 + 9
    parsed.clear()
    with pytest.raises(record_check.RecordError, match="workload"):
        record_check.precheck(b"{}\n" * 200_000, b"[0, [[[], []]]]\n", max_records=8)
    assert len(parsed) <= record_check.MAX_WORKLOADS + 1


def test_a_model_name_cannot_inject_headers_into_its_download(team_a, user_owner):
    """The model page's new download link: the file name goes into Content-Disposition (held)."""
    from tests.factories import DLModelFactory

    model = DLModelFactory(team=team_a, name='x"\r\nSet-Cookie: a=b', created_by=user_owner)
    api = APIClient()
    api.force_authenticate(user_owner)
    resp = api.get(f"/api/models/{model.pk}/download/")
    assert resp.status_code == 200 and "Set-Cookie" not in resp.headers and "\n" not in resp["Content-Disposition"]
