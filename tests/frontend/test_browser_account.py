"""Issue 17's pages in a real browser (Playwright on Debian's Chromium, as tests/frontend/test_browser.py):
API tokens, teams and members, the team webhook, record import and model download. Each flow is done
as a user does it (clicks and typing) and its result is checked through the API."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from core.models import Membership, WebhookDelivery
from core.services import webhooks
from tests.core.test_webhooks import Receiver
from tests.factories import TuningRunFactory, UserFactory

from .test_browser import WAIT_MS, browser, login, shots  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def new_page(browser, live_server):  # noqa: F811
    context = browser.new_context(viewport={"width": 1366, "height": 900}, accept_downloads=True)
    pg = context.new_page()
    pg.set_default_timeout(WAIT_MS)
    pg.problems = []
    pg.on("pageerror", lambda exc: pg.problems.append(f"page error: {exc}"))
    pg.on("console", lambda m: pg.problems.append(f"console {m.type}: {m.text}")
          if m.type == "error" and "404" not in m.text else None)
    return pg


@pytest.fixture
def pages(browser, live_server):  # noqa: F811
    made = []

    def make():
        made.append(new_page(browser, live_server))
        return made[-1]
    yield make
    for pg in made:
        pg.context.close()


def api_get(live_server, path: str, key: str) -> tuple[int, dict]:
    request = urllib.request.Request(live_server.url + path, headers={"Authorization": f"Token {key}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def create_token(page, live_server, name: str, password: str) -> str:
    page.goto(live_server.url + "/")
    page.click("nav.mainnav >> text=API tokens")
    page.fill("#id_name", name)
    page.fill("#id_password", password)
    page.click("#token-form button[type=submit]")
    page.wait_for_selector("#new-token-key")
    return page.inner_text("#new-token-key").strip()


def test_api_tokens_page(pages, live_server, shots, user_owner, team_a):  # noqa: F811
    page = pages()
    login(page, live_server)
    page.goto(live_server.url + "/settings/tokens/")
    page.fill("#id_name", "laptop")
    page.fill("#id_password", "wrong")
    page.click("#token-form button[type=submit]")
    page.wait_for_selector("text=Wrong password")
    key = create_token(page, live_server, "laptop", "pw-alice")
    page.screenshot(path=str(shots / "20-token-created.png"), full_page=True)
    status, me = api_get(live_server, "/api/me/", key)
    assert status == 200 and me["username"] == "alice"
    status, listed = api_get(live_server, "/api/tokens/", key)
    assert [t["name"] for t in listed["results"]] == ["laptop"]

    page.goto(live_server.url + "/settings/tokens/")  # shown once: never again
    assert key not in page.content() and key[:8] in page.inner_text("#tokens-table")
    page.click("#tokens-table form[data-revoke] button")
    page.wait_for_selector("text=revoked: it no longer authenticates")
    assert api_get(live_server, "/api/me/", key)[0] == 401
    assert page.problems == []


def test_teams_members_and_invitations(pages, live_server, shots, user_owner, team_a):  # noqa: F811
    UserFactory(username="bob", email="bob@example.org")
    alice_page, bob_page = pages(), pages()
    login(alice_page, live_server)
    alice_page.click("nav.mainnav >> text=Teams")
    alice_page.wait_for_selector("#teams-table >> text=Team A")
    assert "/ 20000" in alice_page.inner_text("#teams-table")  # trials this month / quota
    alice_page.click("#teams-table >> text=Team A")
    alice_page.fill("#id_username", "bob@example.org")
    alice_page.select_option("#id_role", "member")
    alice_page.click("#invite-form button[type=submit]")
    alice_page.wait_for_selector("text=they are invited as member")

    login(bob_page, live_server, "bob", "pw-bob")
    bob_page.goto(live_server.url + "/teams/")
    bob_page.click("#invitations >> text=Accept")
    bob_page.wait_for_selector("text=You joined Team A as member")
    bob_key = create_token(bob_page, live_server, "bob-cli", "pw-bob")
    _, memberships = api_get(live_server, "/api/memberships/", bob_key)
    assert {(m["username"], m["role"]) for m in memberships["results"]} == {("alice", "owner"), ("bob", "member")}

    alice_page.reload()
    alice_page.select_option("form[data-role-form=bob] select", "viewer")
    alice_page.click("form[data-role-form=bob] button")
    alice_page.wait_for_selector("text=bob is now viewer")
    alice_page.screenshot(path=str(shots / "21-team.png"), full_page=True)
    _, me = api_get(live_server, "/api/memberships/", bob_key)
    assert {(m["username"], m["role"]) for m in me["results"]} >= {("bob", "viewer")}

    alice_page.click("#leave-form button")  # the last owner cannot leave
    alice_page.wait_for_selector("text=You are the team's last owner")
    bob_page.goto(live_server.url + f"/teams/{team_a.pk}/")
    assert bob_page.locator("#invite-form").count() == 0  # a viewer manages nothing
    bob_page.click("#leave-form button")
    bob_page.wait_for_selector("text=You left Team A")
    assert api_get(live_server, "/api/memberships/", bob_key)[1]["results"] == []
    assert alice_page.problems == [] and bob_page.problems == []


def test_team_webhook_is_called_signed_when_a_run_ends(pages, live_server, shots, user_owner, team_a, model_a,  # noqa: F811
                                                       settings, celery_outbox):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES, settings.WEBHOOK_HTTP_HOSTS = False, []
    page = pages()
    login(page, live_server)
    page.goto(f"{live_server.url}/teams/{team_a.pk}/")
    page.fill("#id_url", "http://169.254.169.254/latest/meta-data/")  # SSRF: refused, nothing stored
    page.click("#webhook-form button[type=submit]")
    page.wait_for_selector("#field-url .error")
    assert "WEBHOOK_HTTP_HOSTS" in page.inner_text("#field-url .error")

    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES, settings.WEBHOOK_HTTP_HOSTS = True, ["127.0.0.1"]  # a test receiver
    run = TuningRunFactory(model=model_a, created_by=user_owner, max_trials=8, trials_per_round=32)
    with Receiver() as rx:
        page.fill("#id_url", rx.url)
        page.click("#webhook-form button[type=submit]")
        secret = page.inner_text("#webhook-secret-value").strip()
        assert len(secret) == 64
        page.goto(f"{live_server.url}/runs/{run.pk}/")
        page.click("form[data-action=cancel] button")
        page.wait_for_selector("text=is now cancelled")
        (delivery_id,) = [args[0] for args in celery_outbox.args_of("core.deliver_webhook")]
        from core.tasks import deliver_webhook

        deliver_webhook(delivery_id)  # what the worker does with the message
    (req,) = rx.requests
    assert webhooks.verify_signature(secret, req["headers"]["X-Dlopt-Timestamp"], req["body"],
                                     req["headers"]["X-Dlopt-Signature"])
    assert json.loads(req["body"])["object"]["id"] == run.pk
    page.goto(f"{live_server.url}/teams/{team_a.pk}/")
    row = page.inner_text(f"#deliveries-table tr[data-delivery='{delivery_id}']")
    assert "tuning_run.cancelled" in row and "Delivered" in row and "200" in row
    assert secret not in page.content()
    page.screenshot(path=str(shots / "22-webhook.png"), full_page=True)
    key = create_token(page, live_server, "check", "pw-alice")
    assert api_get(live_server, f"/api/runs/{run.pk}/", key)[1]["status"] == "cancelled"
    assert WebhookDelivery.objects.get(pk=delivery_id).attempts == 1
    assert page.problems == []


def test_record_import_and_model_download(pages, live_server, shots, user_owner, team_a, model_a,  # noqa: F811
                                          roomy_quota, tmp_path):
    import onnx

    from tuning.engine.testing import tuning_database

    run = TuningRunFactory(model=model_a, created_by=user_owner, max_trials=8, trials_per_round=32)
    with model_a.file.open("rb") as f:
        onnx_bytes = f.read()
    proto = onnx.load_model_from_string(onnx_bytes)
    hostile = tuning_database(proto, run.target, annotations=(("pragma_import_llvm", "define void @x() {}"),))
    good = tuning_database(proto, run.target)
    page = pages()
    login(page, live_server)
    page.goto(f"{live_server.url}/models/{model_a.pk}/")
    with page.expect_download() as download:
        page.click("#model-download")
    assert download.value.path().read_bytes() == onnx_bytes

    page.goto(f"{live_server.url}/runs/{run.pk}/")
    for (workloads, records), expect in ((hostile, "refused"), (good, "Imported 1 tuning record")):
        page.set_input_files("#id_workloads", files=[{"name": "database_workload.json", "mimeType": "application/json",
                                                      "buffer": workloads}])
        page.set_input_files("#id_records", files=[{"name": "database_tuning_record.json",
                                                    "mimeType": "application/json", "buffer": records}])
        page.click("#record-import-form button[type=submit]")
        page.wait_for_selector(f".messages >> text={expect}", timeout=120_000)
        if expect == "refused":
            shown = page.inner_text(".messages")
            assert "pragma_import_llvm" in shown, shown
            page.screenshot(path=str(shots / "23-import-refused.png"), full_page=True)
    key = create_token(page, live_server, "check", "pw-alice")
    assert api_get(live_server, f"/api/runs/{run.pk}/", key)[1]["options"]["imported_records"] == 1
    assert Membership.objects.filter(team=team_a).count() == 1
    assert page.problems == []
