"""Pages for any role and any run state, through Django's test client: the start form shows only the
options that apply and an estimate, a running run its wall time and ETA, energy parts that add up and the
ledger's charge, the compare page's settings diff, readable simulation units, the webhook test button
(with its attacks: other roles, other teams, too often, a private address), the styled 404/403 and the
invitee's and viewer's notes."""
from __future__ import annotations

import datetime as dt
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.test import Client, RequestFactory
from django.urls import reverse
from django.utils import timezone

from core.models import TeamInvitation, TeamWebhook, UsageCharge, WebhookDelivery
from core.services.webhooks import deliver, verify_signature
from scheduling.models import Node, SimulationRun
from tests.factories import TuningRunFactory, UserFactory
from tuning.models import TuningRun

from .test_pages import start_form

pytestmark = pytest.mark.django_db


def logged_in(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


# --- the start form: only the options that apply ------------------------------------------------------


def test_cuda_is_offered_only_with_a_live_gpu_node(owner_client, model_a):
    page = owner_client.get("/runs/new/").content.decode()
    assert 'value="llvm"' in page and 'value="cuda"' not in page and "CPU targets only" in page
    resp = owner_client.post("/runs/new/", start_form(model_a, target_kind="cuda"))
    assert resp.status_code == 200 and "Select a valid choice" in resp.content.decode()
    assert not TuningRun.objects.exists()


def test_cuda_is_offered_with_a_live_gpu_node_but_not_a_stale_one(owner_client, model_a, live_gpu_node):
    assert 'value="cuda"' in owner_client.get("/runs/new/").content.decode()
    Node.objects.filter(pk=live_gpu_node.pk).update(last_seen=timezone.now() - dt.timedelta(days=1))
    assert 'value="cuda"' not in owner_client.get("/runs/new/").content.decode()


def test_trimmer_options_show_only_when_trimmer_is_on(owner_client, model_a):
    page = owner_client.get("/runs/new/").content.decode()
    assert '<div id="trimmer-details" hidden>' in page and 'name="plateau_rounds"' in page  # kept for JS to show
    resp = owner_client.post("/runs/new/", start_form(model_a, trimmer_enabled="on", plateau_rounds=999))
    page = resp.content.decode()
    assert '<div id="trimmer-details">' in page and "less than or equal to 50" in page
    assert not TuningRun.objects.exists()


def test_hidden_options_do_not_block_or_change_the_run(owner_client, model_a):
    """A bad value left in a hidden option (Trimmer off, DOP automatic) is not used, so it does not block."""
    owner_client.post("/runs/new/", start_form(model_a, plateau_rounds=999, dop_fixed=99999))
    run = TuningRun.objects.get()
    assert run.trimmer_enabled is False and run.dop_fixed is None


def test_fixed_dop_shows_only_when_dop_is_fixed(owner_client, model_a):
    page = owner_client.get("/runs/new/").content.decode()
    assert '<div id="fixed-dop" hidden>' in page
    page = owner_client.post("/runs/new/", start_form(model_a, dop_mode="fixed")).content.decode()
    assert '<div id="fixed-dop">' in page and "Give the fixed degree of parallelism" in page


@pytest.mark.parametrize(("num_cores", "threads", "note"), [
    ("", "", True),      # every core of the node per measurement
    ("16", "", True),    # the target's 16 cores of 16
    ("16", "12", True),  # 12 of 16: no room for a second
    ("16", "4", False),  # 4 slots of 4
    ("8", "", False),    # 2 slots of 8
])
def test_a_note_says_when_dop_must_stay_one(owner_client, model_a, live_gpu_node, num_cores, threads, note):
    """live_gpu_node reports 16 cores; the engine plans cores // threads measurement slots."""
    page = owner_client.post("/runs/new/", start_form(model_a, num_cores=num_cores, threads=threads,
                                                      max_trials=0)).content.decode()
    assert ('<p class="notice" id="dop-note">' in page) is note
    assert ('<p class="notice" id="dop-note" hidden>' in page) is not note
    if note:
        assert "DOP stays 1" in page


def test_start_form_estimates_time_and_energy_from_recent_runs(owner_client, user_owner, model_a):
    page = owner_client.get(f"/runs/new/?model={model_a.pk}").content.decode()
    assert "no finished run to learn from yet" in page and "Estimate for" in page
    TuningRunFactory(model=model_a, created_by=user_owner, succeeded=True, trials_done=50, wall_seconds=100.0,
                     energy_joules=500.0, energy_source="modeled")
    page = owner_client.get(f"/runs/new/?model={model_a.pk}").content.decode()
    trials = int(page.split('name="max_trials" value="')[1].split('"')[0])
    assert f"Estimate for {trials:,} trials" in page
    from frontend.presenters import fmt_duration, fmt_energy

    assert f"about {fmt_duration(2.0 * trials)}, about {fmt_energy(10.0 * trials)}" in page
    assert "this model&#x27;s last 1 finished run(s)" in page
    data = json.loads(page.split('<script id="run-estimates" type="application/json">')[1].split("</script>")[0])
    assert data[str(model_a.pk)]["wall_s_per_trial"] == 2.0 and data[str(model_a.pk)]["joules_per_trial"] == 10.0


def test_a_viewer_is_told_they_cannot_start_runs_not_to_upload(client, user_viewer, model_a):
    client.force_login(user_viewer)
    page = client.get("/runs/new/").content.decode()
    assert 'id="viewer-only"' in page and "Upload a model</a> first" not in page


def test_a_viewer_is_not_offered_uploads_or_submissions(client, user_viewer, model_a):
    client.force_login(user_viewer)
    home = client.get("/").content.decode()
    assert 'href="/models/upload/"' not in home and 'href="/runs/new/"' not in home
    job = client.get("/cluster/jobs/new/").content.decode()
    assert "Your role in" in job and "is viewer" in job and "Upload a model</a> first" not in job


def test_an_invitee_is_pointed_to_the_pending_invitation(client, team_a, user_owner):
    invitee = UserFactory(username="ivy")
    TeamInvitation.objects.create(team=team_a, user=invitee, role="member", invited_by=user_owner)
    client.force_login(invitee)
    page = client.get("/").content.decode()
    assert "you are invited to Team A" in page and 'id="answer-invitations"' in page
    assert "not in any team yet" not in page


# --- a running run: wall time and ETA; energy parts and charges ------------------------------------------


def test_running_run_shows_live_wall_time_and_eta(owner_client, user_owner, model_a, roomy_quota):
    started = timezone.now() - dt.timedelta(seconds=100)
    run = TuningRunFactory(model=model_a, created_by=user_owner, running=True, max_trials=200)
    TuningRun.objects.filter(pk=run.pk).update(started_at=started, trials_done=50, wall_seconds=0.0)
    page = owner_client.get(f"/runs/{run.pk}/").content.decode()
    wall = page.split('id="run-wall"')[1].split("</dd>")[0]
    assert "so far" in wall and ">0 s<" not in wall and f'data-running-since="{started.isoformat()}"' in wall
    eta = page.split('id="run-eta"')[1].split("</dd>")[0]
    assert "about 5 min" in eta and "estimate" in eta  # 150 trials left at 2 s each


def test_energy_parts_add_up_and_name_the_remainder(owner_client, user_owner, model_a):
    run = TuningRunFactory(model=model_a, created_by=user_owner, succeeded=True, trials_done=64,
                           energy_joules=3000.0, energy_build_joules=774.0, energy_measure_joules=730.0,
                           energy_source="modeled")
    split = owner_client.get(f"/runs/{run.pk}/").content.decode().split('data-field="energy_split">')[1]
    assert split.startswith("build 774.0 J · measure 730.0 J · other (idle, search) 1.50 kJ = 3.00 kJ</dd>")


def test_a_failed_run_the_ledger_did_not_charge_shows_no_charge(owner_client, user_owner, model_a):
    run = TuningRunFactory(model=model_a, created_by=user_owner, status=TuningRun.Status.FAILED, trials_done=0,
                           energy_joules=0.0)
    page = owner_client.get(f"/runs/{run.pk}/").content.decode()
    assert 'data-field="energy_charged">not charged (failed before any trial)<' in page


def test_the_charge_shown_is_the_ledgers(owner_client, user_owner, team_a, model_a):
    from core.services import charge_usage

    run = TuningRunFactory(model=model_a, created_by=user_owner, status=TuningRun.Status.FAILED, trials_done=0,
                           energy_joules=55.0, energy_source="modeled")
    charge_usage(kind=UsageCharge.Kind.ENERGY_JOULES, amount=55.0, label="test", meter="modeled",
                 idempotency_key=f"tuning_run:{run.pk}:energy_joules:55", team_id=team_a.pk, run_id=run.pk)
    page = owner_client.get(f"/runs/{run.pk}/").content.decode()
    assert "55.0 J (usage ledger): failed before any trial" in page


def test_zero_energy_saved_says_why_beside_the_filtered_count(owner_client, user_owner, model_a):
    run = TuningRunFactory(model=model_a, created_by=user_owner, succeeded=True, trials_done=64,
                           energy_joules=640.0, energy_source="modeled", trimmer_enabled=True,
                           candidates_generated=64, candidates_filtered=48, energy_saved_joules=0.0, trials_saved=0)
    page = owner_client.get(f"/runs/{run.pk}/").content.decode()
    assert "48 of 64 scored candidates dropped before building" in page
    saved = page.split('data-field="energy_saved">')[1].split("</dd>")[0]
    assert saved.startswith("0 J: Trimmer did not stop the run") and "does not measure fewer" in saved
    assert "not measured" not in page.split('data-field="filtered">')[1].split("</dd>")[0]


def test_the_filtered_count_says_how_many_kept_candidates_were_not_measured(owner_client, user_owner, model_a):
    """generated = filtered + not sent + measured: the page names the third part when there is one."""
    run = TuningRunFactory(model=model_a, created_by=user_owner, succeeded=True, trials_done=40,
                           trimmer_enabled=True, candidates_generated=64, candidates_filtered=16,
                           candidates_not_sent=8)
    filtered = owner_client.get(f"/runs/{run.pk}/").content.decode().split('data-field="filtered">')[1]
    assert filtered.split("</dd>")[0] == ("16 of 64 scored candidates dropped before building (replaced by "
                                          "better-scored ones); 8 kept but not measured (measured earlier in "
                                          "the run, or past its trial budget)")


# --- compare: a row per setting that differs, onnxruntime's line ---------------------------------------


def test_compare_lists_each_setting_that_differs(owner_client, user_owner, model_a):
    a = TuningRunFactory(model=model_a, created_by=user_owner, succeeded=True, trimmer_enabled=False,
                         ort_latency_s=0.002)
    b = TuningRunFactory(model=model_a, created_by=user_owner, succeeded=True, trimmer_enabled=True,
                         trimmer_options={"plateau_rounds": 3}, dop_fixed=2)
    resp = owner_client.get(f"/runs/compare/?runs={a.pk},{b.pk}")
    diff = {row["label"]: row["values"] for row in resp.context["settings_diff"]}
    assert diff["Trimmer"] == ["off", "on"] and diff["DOP"] == ["automatic", "fixed 2"]
    assert diff["Trimmer: plateau rounds"] == ["—", "3"]
    assert "Model" not in diff and "Trial budget" not in diff  # the same in both
    assert '<tr class="differs"><th scope="row">Trimmer</th><td>off</td><td>on</td></tr>' in resp.content.decode()


def test_compare_of_identical_settings_says_so(owner_client, user_owner, model_a):
    a, b = (TuningRunFactory(model=model_a, created_by=user_owner, succeeded=True) for _ in range(2))
    page = owner_client.get(f"/runs/compare/?runs={a.pk},{b.pk}").content.decode()
    assert 'id="settings-same"' in page


def test_compare_figure_draws_the_onnxruntime_line_on_a_readable_log_axis(user_owner, model_a):
    from frontend import charts

    a = TuningRunFactory(model=model_a, created_by=user_owner, succeeded=True, ort_latency_s=0.0025)
    b = TuningRunFactory(model=model_a, created_by=user_owner, succeeded=True)
    curves = {r.pk: {"end_to_end": {"trials": [1, 8, 16], "estimate_s": [0.01, 0.004, 0.003]}} for r in (a, b)}
    fig = charts.compare_figure([a, b], curves)
    ort = [t for t in fig["data"] if t["name"].startswith("onnxruntime")]
    assert len(ort) == 1 and ort[0]["name"] == f"onnxruntime (run {a.pk})" and list(ort[0]["y"]) == [2.5, 2.5]
    assert list(ort[0]["x"]) == [0, 16]
    assert fig["layout"]["yaxis"]["type"] == "log" and fig["layout"]["yaxis"]["tickformat"] == "~g"


# --- simulations: days and hours, assumptions as a table ---------------------------------------------------


def test_simulation_results_read_in_days_and_hours_with_an_assumptions_table(owner_client, team_a):
    results = {"method": "replay", "seed": 0,
               "table": [{"policy": "horus", "makespan_h": 10612.7, "mean_wait_s": 17087659.4, "p95_wait_s": 90.0,
                          "util_mean_pct": 51.77, "shared_frac": 0.25, "oom": 0}],
               "assumptions": {"predicted_utilization": "oracle (= truth)", "predictor_error_sigma": 0.0,
                               "interference": {"model": "fitted", "params": {"k80": {"capacity": 1.0,
                                                                                      "interference": 0.75}}}}}
    sim = SimulationRun.objects.create(team=team_a, trace="philly", policies=["horus"], status="succeeded",
                                       results=results, parameters={"jobs": 10})
    page = owner_client.get(f"/simulations/{sim.pk}/").content.decode()
    table = page.split('id="simulation-table"')[1].split("</table>")[0]
    assert "Mean wait" in table and "197.8 days" in table and "442.2 days" in table and "90.0 s" in table
    assert "51.8 %" in table and "25.0 %" in table and "17087659" not in table
    assumptions = page.split('id="assumptions-table"')[1].split("</table>")[0]
    assert "interference › params › k80 › interference" in assumptions and "0.75" in assumptions
    assert "{" not in assumptions  # no printed Python dict
    fig = json.loads(page.split('<script id="fig-mean_wait_s" type="application/json">')[1].split("</script>")[0])
    assert fig["layout"]["title"]["text"] == "mean wait (days)"


# --- the webhook's test button ----------------------------------------------------------------------------------


class Receiver(BaseHTTPRequestHandler):
    seen: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Receiver.seen.append((dict(self.headers), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver(settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES, settings.WEBHOOK_HTTP_HOSTS = True, ["127.0.0.1"]
    Receiver.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/in"
    server.shutdown()
    server.server_close()


def set_webhook(owner, team, url):
    resp = owner.post(reverse("team-webhook", args=[team.pk, "set"]), {"url": url})
    assert resp.status_code == 200, resp.content[:300]
    return TeamWebhook.objects.get(team=team)


def test_owner_sends_a_signed_test_through_the_delivery_service(user_owner, team_a, receiver, celery_outbox,
                                                                 django_capture_on_commit_callbacks):
    owner = logged_in(user_owner)
    hook = set_webhook(owner, team_a, receiver)
    page = owner.get(reverse("team-page", args=[team_a.pk])).content.decode()
    assert 'id="webhook-test"' in page and "https://hooks.example.com/dlopt" in page
    with django_capture_on_commit_callbacks(execute=True):
        resp = owner.post(reverse("team-webhook", args=[team_a.pk, "test"]), follow=True)
    assert "Test notification queued" in resp.content.decode()
    delivery = WebhookDelivery.objects.get(team=team_a, event="webhook.test")
    assert celery_outbox.args_of("core.deliver_webhook") == [(delivery.pk,)]
    assert deliver(delivery_id=delivery.pk) is None  # what the Celery task runs
    delivery.refresh_from_db()
    assert delivery.state == WebhookDelivery.State.DELIVERED and delivery.last_status_code == 204
    (headers, body), = Receiver.seen
    assert json.loads(body)["event"] == "webhook.test"
    assert verify_signature(hook.secret, headers["X-Dlopt-Timestamp"], body, headers["X-Dlopt-Signature"])


def test_a_second_test_within_the_interval_is_refused_429(user_owner, team_a, receiver):
    owner = logged_in(user_owner)
    set_webhook(owner, team_a, receiver)
    assert owner.post(reverse("team-webhook", args=[team_a.pk, "test"])).status_code == 302
    resp = owner.post(reverse("team-webhook", args=[team_a.pk, "test"]))
    assert resp.status_code == 429 and "less than 60 s ago" in resp.content.decode()
    assert WebhookDelivery.objects.filter(event="webhook.test").count() == 1


@pytest.mark.parametrize("role_user", ["user_member", "user_viewer"])
def test_only_owners_may_send_a_test(request, user_owner, team_a, receiver, role_user):
    set_webhook(logged_in(user_owner), team_a, receiver)
    other = logged_in(request.getfixturevalue(role_user))
    page = other.get(reverse("team-page", args=[team_a.pk])).content.decode()
    assert 'id="webhook-test"' not in page
    resp = other.post(reverse("team-webhook", args=[team_a.pk, "test"]))
    assert resp.status_code == 403 and "Only the team&#x27;s owners can send a test notification" in \
        resp.content.decode()
    assert not WebhookDelivery.objects.exists()


def test_another_teams_owner_gets_a_404(user_owner, team_a, user_other, team_b, receiver):
    set_webhook(logged_in(user_owner), team_a, receiver)
    resp = logged_in(user_other).post(reverse("team-webhook", args=[team_a.pk, "test"]))
    assert resp.status_code == 404 and not WebhookDelivery.objects.exists()


def test_a_test_needs_a_webhook_and_csrf(user_owner, team_a):
    owner = logged_in(user_owner)
    resp = owner.post(reverse("team-webhook", args=[team_a.pk, "test"]))
    assert resp.status_code == 400 and "Set a webhook URL first" in resp.content.decode()
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user_owner)
    assert strict.post(reverse("team-webhook", args=[team_a.pk, "test"])).status_code == 403
    assert not WebhookDelivery.objects.exists()


def test_a_test_to_a_private_address_is_still_refused_at_send_time(user_owner, team_a, settings):
    """The URL is checked again when the test is sent: a hook that points at this machine now (a row written
    around the service, or DNS that changed) is never contacted."""
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES, settings.WEBHOOK_HTTP_HOSTS = False, []
    TeamWebhook.objects.create(team=team_a, url="https://127.0.0.1/", secret="s" * 64)
    owner = logged_in(user_owner)
    assert owner.post(reverse("team-webhook", args=[team_a.pk, "test"])).status_code == 302
    delivery = WebhookDelivery.objects.get(event="webhook.test")
    deliver(delivery_id=delivery.pk)
    delivery.refresh_from_db()
    assert delivery.state != WebhookDelivery.State.DELIVERED and delivery.last_status_code is None
    assert "public" in delivery.last_error or "address" in delivery.last_error


# --- styled 404 and 403 with the navigation (the API keeps its own answers) ---------------------------------


def test_a_missing_page_is_the_styled_404_with_navigation(owner_client):
    resp = owner_client.get("/no-such-page/")
    page = resp.content.decode()
    assert resp.status_code == 404 and "Page not found" in page and 'id="mainnav"' in page
    assert "/static/frontend/site.css" in page or "site." in page


def test_another_teams_run_is_the_styled_404(owner_client, run_b):
    resp = owner_client.get(f"/runs/{run_b.pk}/")
    assert resp.status_code == 404 and "Page not found" in resp.content.decode()


def test_the_404_for_a_visitor_offers_the_login(client):
    resp = client.get("/no-such-page/")
    page = resp.content.decode()
    assert resp.status_code == 404 and 'href="/login/"' in page and 'id="mainnav"' not in page


def test_the_403_page_is_styled_with_navigation(user_owner):
    from django.core.exceptions import PermissionDenied
    from django.views.defaults import permission_denied

    request = RequestFactory().get("/somewhere/")
    request.user = user_owner
    request.session = {}
    resp = permission_denied(request, PermissionDenied())
    page = resp.content.decode()
    assert resp.status_code == 403 and "Not allowed" in page and 'id="mainnav"' in page


def test_an_api_object_404_is_still_json(api_owner, run_b):
    resp = api_owner.get(f"/api/runs/{run_b.pk}/")
    assert resp.status_code == 404 and resp["Content-Type"].startswith("application/json")
