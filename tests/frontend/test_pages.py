"""Dashboard pages: login, team scope, models, runs (start, detail, control, compare), energy, cluster."""
from __future__ import annotations

import json
import re

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from core.models import DLModel, Membership, Quota
from core.services import create_team
from tuning.models import TuningRun

from .fakes import make_running_run

pytestmark = pytest.mark.django_db

PAGES = ["/", "/models/", "/models/upload/", "/runs/", "/runs/new/", "/runs/compare/", "/cluster/",
         "/simulations/", "/energy/"]


def figure_from(html: str, figure_id: str) -> dict:
    m = re.search(rf'<script id="{figure_id}" type="application/json">(.*?)</script>', html, re.S)
    assert m, f"no figure {figure_id} in the page"
    return json.loads(m.group(1))


# --- login and navigation -------------------------------------------------------------------


@pytest.mark.parametrize("url", PAGES + ["/models/1/", "/runs/1/"])
def test_pages_need_login(client, url):
    resp = client.get(url)
    assert resp.status_code == 302 and resp["Location"].startswith("/login/")


def test_login_and_logout(client, user_owner, team_a):
    page = client.get("/login/")
    assert page.status_code == 200 and "csrfmiddlewaretoken" in page.content.decode()
    resp = client.post("/login/", {"username": "alice", "password": "pw-alice"})
    assert resp.status_code == 302 and resp["Location"] == "/"
    assert client.get("/").status_code == 200
    assert client.post("/logout/").status_code == 302
    assert client.get("/").status_code == 302


@pytest.mark.parametrize("url", PAGES)
def test_every_page_renders(owner_client, model_a, url):
    resp = owner_client.get(url)
    assert resp.status_code == 200, url
    html = resp.content.decode()
    assert "Team A" in html  # the switcher
    # Served locally, never from a CDN.
    assert not re.search(r'<script[^>]+src="https?://', html)
    assert "cdn." not in html.lower()


def test_chart_pages_load_local_plotly(owner_client, model_a, run_a):
    for url in (f"/models/{model_a.pk}/", f"/runs/{run_a.pk}/", "/energy/"):
        html = owner_client.get(url).content.decode()
        assert '/static/frontend/vendor/plotly.min.js' in html, url
        assert '/static/frontend/dashboard.js' in html


def test_local_plotly_js_matches_installed_plotly_package():
    from pathlib import Path

    import plotly

    from django.contrib.staticfiles import finders

    ours = Path(finders.find("frontend/vendor/plotly.min.js"))
    bundled = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    assert ours.read_bytes() == bundled.read_bytes(), \
        "frontend/static/frontend/vendor/plotly.min.js is stale: copy it again from plotly's package_data"


# --- team scope ------------------------------------------------------------------------------------


@pytest.fixture
def two_teams(user_owner, team_a, small_cnn_bytes):
    from core.services import register_model

    team_c = create_team(name="Team C", owner=user_owner)
    register_model(team=team_c, name="cnn-c", data=small_cnn_bytes, filename="c.onnx", actor=user_owner)
    return team_c


def test_team_switcher_scopes_lists(owner_client, model_a, model_b, two_teams):
    html = owner_client.get("/models/").content.decode()
    assert "cnn-a" in html and "cnn-c" in html and "cnn-b" not in html  # never another team's
    resp = owner_client.post("/team/", {"team": two_teams.pk, "next": "/models/"})
    assert resp.status_code == 302 and resp["Location"] == "/models/"
    html = owner_client.get("/models/").content.decode()
    assert "cnn-c" in html and "cnn-a" not in html
    assert "Showing: <strong>Team C</strong>" in html
    # Detail pages still open for the user's other team.
    assert owner_client.get(f"/models/{model_a.pk}/").status_code == 200
    owner_client.post("/team/", {"team": "all", "next": "/models/"})
    html = owner_client.get("/models/").content.decode()
    assert "cnn-a" in html and "cnn-c" in html


def test_team_switcher_refuses_other_teams_and_unsafe_next(owner_client, team_b):
    assert owner_client.post("/team/", {"team": team_b.pk}).status_code == 404
    assert owner_client.post("/team/", {"team": "junk"}).status_code == 404
    resp = owner_client.post("/team/", {"team": "all", "next": "https://evil.example/"})
    assert resp["Location"] == "/"
    assert owner_client.get("/team/").status_code == 405


def test_scope_falls_back_when_user_leaves_team(owner_client, user_owner, two_teams):
    owner_client.post("/team/", {"team": two_teams.pk})
    Membership.objects.filter(team=two_teams, user=user_owner).delete()
    html = owner_client.get("/models/").content.decode()
    assert "Showing: <strong>All my teams</strong>" in html


# --- models ------------------------------------------------------------------------------------------


def test_upload_form_registers_model(owner_client, team_a, small_cnn_bytes):
    resp = owner_client.post("/models/upload/", {
        "team": team_a.pk, "name": "my-cnn", "description": "from the form",
        "file": SimpleUploadedFile("my.onnx", small_cnn_bytes)})
    model = DLModel.objects.get(name="my-cnn")
    assert resp.status_code == 302 and resp["Location"] == f"/models/{model.pk}/"
    html = owner_client.get(resp["Location"]).content.decode()
    assert "registered in Team A" in html and "Operator histogram" in html


@pytest.mark.parametrize("filename,data,code", [
    ("junk.onnx", b"this is not a model", "not_protobuf"),
    ("model.txt", b"whatever", "bad_extension"),
])
def test_upload_form_shows_refusal_and_stores_nothing(owner_client, team_a, filename, data, code):
    resp = owner_client.post("/models/upload/", {"team": team_a.pk, "name": "bad",
                                                 "file": SimpleUploadedFile(filename, data)})
    assert resp.status_code == 200
    html = resp.content.decode()
    assert "The model was refused, nothing was stored." in html
    assert f"<code>{code}</code>" in html
    assert not DLModel.objects.filter(name="bad").exists()


def test_upload_form_too_large(owner_client, team_a, settings):
    settings.ONNX_MAX_UPLOAD_BYTES = 10
    resp = owner_client.post("/models/upload/", {"team": team_a.pk, "name": "big",
                                                 "file": SimpleUploadedFile("big.onnx", b"x" * 100)})
    assert "<code>too_large</code>" in resp.content.decode()
    assert not DLModel.objects.exists()


@pytest.mark.dialect
def test_upload_form_duplicate_name_is_a_field_error(owner_client, team_a, model_a, small_cnn_bytes):
    resp = owner_client.post("/models/upload/", {"team": team_a.pk, "name": "cnn-a",
                                                 "file": SimpleUploadedFile("a.onnx", small_cnn_bytes)})
    html = resp.content.decode()
    assert "already has a model named" in html and 'id="field-name"' in html
    assert DLModel.objects.filter(name="cnn-a").count() == 1


def test_upload_form_refuses_other_team_and_viewers(client, user_viewer, team_a, team_b, small_cnn_bytes):
    client.force_login(user_viewer)
    html = client.get("/models/upload/").content.decode()
    assert "you have none" in html
    resp = client.post("/models/upload/", {"team": team_b.pk, "name": "x",
                                           "file": SimpleUploadedFile("x.onnx", small_cnn_bytes)})
    assert not DLModel.objects.filter(name="x").exists()
    assert resp.status_code == 200


def test_model_detail_has_features_and_histogram_chart(owner_client, model_a):
    html = owner_client.get(f"/models/{model_a.pk}/").content.decode()
    fig = figure_from(html, "fig-ops")
    bars = fig["data"][0]
    assert bars["type"] == "bar" and sum(bars["y"]) == sum(model_a.op_histogram.values())
    assert set(bars["x"]) == set(model_a.op_histogram)
    assert "Conv" in html and "Total FLOPs" in html and f"{model_a.param_count:,}" in html
    assert 'href="/runs/new/?model=' in html


def test_other_teams_model_is_404(owner_client, model_b):
    assert owner_client.get(f"/models/{model_b.pk}/").status_code == 404
    assert owner_client.get("/models/999999/").status_code == 404


# --- start a run ---------------------------------------------------------------------------------


def start_form(model, **overrides):
    data = {"model": model.pk, "target_kind": "llvm", "num_cores": 2, "max_trials": 16, "trials_per_round": 8,
            "measurement_mode": "doppler", "dop_mode": "auto", "dop_fixed": "", "threads": "",
            "search_population": "", "seed": ""}
    data.update(overrides)
    return data


def test_start_run_form_takes_a_time_budget_and_the_run_page_shows_it(owner_client, model_a, celery_outbox):
    resp = owner_client.post("/runs/new/", start_form(model_a, max_minutes=45))
    run = TuningRun.objects.get()
    assert resp.status_code == 302 and run.max_minutes == 45
    page = owner_client.get(resp["Location"]).content.decode()
    assert 'data-max-seconds="2700"' in page  # the live "time left" is capped by it
    bad = owner_client.post("/runs/new/", start_form(model_a, max_minutes=0)).content.decode()
    assert "greater than or equal to 1" in bad and TuningRun.objects.count() == 1


def test_start_run_form_queues_a_run(owner_client, model_a, celery_outbox, django_capture_on_commit_callbacks):
    """The form starts a run and, once the request's transaction commits, sends it to Celery."""
    page = owner_client.get(f"/runs/new/?model={model_a.pk}").content.decode()
    assert 'id="trimmer-options"' in page and 'name="plateau_rounds"' in page
    with django_capture_on_commit_callbacks(execute=True):
        resp = owner_client.post("/runs/new/", start_form(model_a, search_population=16, seed=3))
    run = TuningRun.objects.get()
    assert resp.status_code == 302 and resp["Location"] == f"/runs/{run.pk}/"
    assert celery_outbox.args_of("tuning.execute_run") == [(run.pk,)]
    assert run.target == {"kind": "llvm", "num-cores": 2} and run.max_trials == 16
    assert run.dop_fixed is None and run.options == {"search_population": 16, "seed": 3}


def test_start_run_form_with_trimmer_options(owner_client, model_a):
    owner_client.post("/runs/new/", start_form(model_a, trimmer_enabled="on", plateau_rounds=3,
                                               target_latency_ms=0.5, filter_enabled="on", filter_oversample=2))
    run = TuningRun.objects.get()
    assert run.trimmer_enabled
    assert run.trimmer_options["plateau_rounds"] == 3 and run.trimmer_options["filter_oversample"] == 2
    assert run.trimmer_options["target_latency_s"] == 0.0005 and run.trimmer_options["filter_enabled"] is True


def test_start_run_form_fixed_dop_and_cuda(owner_client, model_a, live_gpu_node):
    owner_client.post("/runs/new/", start_form(model_a, target_kind="cuda", dop_mode="fixed", dop_fixed=3,
                                               measurement_mode="stock"))
    run = TuningRun.objects.get()
    assert run.target == {"kind": "cuda"} and run.dop_fixed == 3 and run.measurement_mode == "stock"


def test_start_run_form_needs_fixed_dop_value(owner_client, model_a):
    resp = owner_client.post("/runs/new/", start_form(model_a, dop_mode="fixed"))
    assert "Give the fixed degree of parallelism" in resp.content.decode()
    assert not TuningRun.objects.exists()


def test_start_run_form_shows_quota_message(owner_client, team_a, model_a):
    Quota.objects.filter(team=team_a).update(tuning_trials_per_month=10)
    resp = owner_client.post("/runs/new/", start_form(model_a, max_trials=16))
    html = resp.content.decode()
    assert 'id="quota-error"' in html and "tuning trials per month" in html
    assert not TuningRun.objects.exists()


def test_start_run_form_refuses_other_teams_model(owner_client, model_a, model_b):
    resp = owner_client.post("/runs/new/", start_form(model_b))
    assert resp.status_code == 200 and "Select a valid choice" in resp.content.decode()
    assert not TuningRun.objects.exists()


def test_viewer_cannot_start_runs(client, user_viewer, model_a):
    client.force_login(user_viewer)
    html = client.get("/runs/new/").content.decode()
    assert 'id="viewer-only"' in html and "Upload a model" not in html  # a viewer cannot upload either
    client.post("/runs/new/", start_form(model_a))
    assert not TuningRun.objects.exists()


# --- run detail -------------------------------------------------------------------------------------


def test_run_detail_shows_progress_tables_and_charts(owner_client, run_a):
    html = owner_client.get(f"/runs/{run_a.pk}/").content.decode()
    assert f"{run_a.trials_done} / 200" in html and 'id="progress-fill" style="width: 48%"' in html
    assert "Pre-empted (plateau)" in html and "MFLOP" in html and "GFLOP/s" in html
    curve = figure_from(html, "fig-curve")
    names = [t["name"] for t in curve["data"]]
    assert names[0] == "end-to-end estimate" and len(names) == 5
    assert max(curve["data"][0]["x"]) == run_a.trials_done
    dop = figure_from(html, "fig-dop")
    assert [t["type"] for t in dop["data"]] == ["bar", "scatter"] and len(dop["data"][0]["x"]) == 6
    # Energy placeholder until the lead adds the fields.
    assert "not measured yet" in html
    # Downloads: API links, shown once the files exist.
    assert f"/api/runs/{run_a.pk}/records/" in html and "available when the run succeeds" in html
    # Control buttons are CSRF-protected POST forms.
    forms = re.findall(r'<form method="post" action="/runs/\d+/(\w+)/"[^>]*>(.*?)</form>', html, re.S)
    assert {a for a, _ in forms} == {"pause", "resume", "cancel"}
    assert all("csrfmiddlewaretoken" in body for _, body in forms)


def test_run_detail_before_any_measurement(owner_client, user_owner, model_a):
    from tuning.services import start_run

    run = start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    html = owner_client.get(f"/runs/{run.pk}/").content.decode()
    assert "No tasks yet" in html and "No measurements yet" in html and "Queued" in html


def test_run_detail_succeeded(owner_client, run_a):
    from django.core.files.base import ContentFile

    run_a.fake_worker.finish()
    run_a.refresh_from_db()
    run_a.records_file.save("records.zip", ContentFile(b"PK..."), save=True)
    html = owner_client.get(f"/runs/{run_a.pk}/").content.decode()
    assert "Succeeded" in html and "3.00×" in html and 'data-terminal="1"' in html
    assert 'data-action="cancel" hidden' in html and 'data-action="pause" hidden' in html
    assert f'<a href="/api/runs/{run_a.pk}/records/" data-download="records">' in html
    assert f'<a href="/api/runs/{run_a.pk}/module/" data-download="module" hidden>' in html
    assert owner_client.get(f"/api/runs/{run_a.pk}/records/").status_code == 200


def test_user_names_are_not_plotly_html(owner_client, user_owner, team_a, small_cnn_bytes):
    from core.services import register_model

    model = register_model(team=team_a, name='<a href="javascript:alert(1)">x</a>', data=small_cnn_bytes,
                           filename="x.onnx", actor=user_owner)
    html = owner_client.get(f"/models/{model.pk}/").content.decode()
    title = figure_from(html, "fig-ops")["layout"]["title"]["text"]
    assert "<" not in title and "javascript" in title


def test_other_teams_run_is_404_everywhere(owner_client, run_b):
    assert owner_client.get(f"/runs/{run_b.pk}/").status_code == 404
    for action in ("cancel", "pause", "resume"):
        assert owner_client.post(f"/runs/{run_b.pk}/{action}/").status_code == 404
    assert owner_client.get(f"/runs/compare/?runs={run_b.pk},{run_b.pk + 1000}").status_code == 404
    run_b.refresh_from_db()
    assert run_b.status == TuningRun.Status.RUNNING and run_b.requested_action == ""


def test_run_controls(owner_client, user_owner, model_a, roomy_quota):
    from tuning.services import start_run

    run = start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    resp = owner_client.post(f"/runs/{run.pk}/pause/", follow=True)
    run.refresh_from_db()
    assert run.status == "paused" and "is now paused" in resp.content.decode()
    owner_client.post(f"/runs/{run.pk}/resume/")
    run.refresh_from_db()
    assert run.status == "queued"
    owner_client.post(f"/runs/{run.pk}/cancel/")
    run.refresh_from_db()
    assert run.status == "cancelled"
    resp = owner_client.post(f"/runs/{run.pk}/resume/", follow=True)
    assert f"Run {run.pk} is already cancelled." in resp.content.decode()
    assert owner_client.get(f"/runs/{run.pk}/cancel/").status_code == 405
    assert owner_client.post(f"/runs/{run.pk}/explode/").status_code == 404


def test_pause_of_running_run_is_requested(owner_client, run_a):
    resp = owner_client.post(f"/runs/{run_a.pk}/pause/", follow=True)
    run_a.refresh_from_db()
    assert run_a.requested_action == "pause" and "stops after its current round" in resp.content.decode()
    assert "(pause requested)" in resp.content.decode()


def test_viewer_sees_run_without_controls(client, user_viewer, run_a):
    client.force_login(user_viewer)
    html = client.get(f"/runs/{run_a.pk}/").content.decode()
    assert "data-action=" not in html
    resp = client.post(f"/runs/{run_a.pk}/cancel/", follow=True)
    assert "Viewers cannot" in resp.content.decode()


# --- CSRF ----------------------------------------------------------------------------------------------


def test_every_form_is_csrf_protected(user_owner, team_a, model_a, small_cnn_bytes, roomy_quota):
    from tuning.services import start_run

    run = start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user_owner)
    posts = {
        "/models/upload/": {"team": team_a.pk, "name": "z", "file": SimpleUploadedFile("z.onnx", small_cnn_bytes)},
        "/runs/new/": start_form(model_a),
        f"/runs/{run.pk}/cancel/": {}, f"/runs/{run.pk}/pause/": {}, "/team/": {"team": "all"},
        "/logout/": {}, "/login/": {"username": "alice", "password": "pw-alice"},
    }
    for url, data in posts.items():
        assert strict.post(url, data).status_code == 403, url
    run.refresh_from_db()
    assert run.status == "queued" and not DLModel.objects.filter(name="z").exists()
    # and each page that has a form renders the token
    for url in ("/models/upload/", "/runs/new/", f"/runs/{run.pk}/", "/"):
        assert "csrfmiddlewaretoken" in strict.get(url).content.decode(), url


# --- runs list ------------------------------------------------------------------------------------------


@pytest.fixture
def many_runs(user_owner, model_a, team_a, small_cnn_bytes, roomy_quota):
    from core.services import register_model
    from tuning.services import start_run

    other = register_model(team=team_a, name="cnn-a2", data=small_cnn_bytes, filename="a2.onnx", actor=user_owner)
    r1 = start_run(actor=user_owner, model=model_a, max_trials=10, enqueue=False)
    r2 = start_run(actor=user_owner, model=other, max_trials=20, target={"kind": "cuda"}, enqueue=False)
    r3 = start_run(actor=user_owner, model=model_a, max_trials=30, enqueue=False)
    TuningRun.objects.filter(pk=r3.pk).update(status="succeeded", trials_done=30, estimated_latency_s=1e-3)
    TuningRun.objects.filter(pk=r2.pk).update(trials_done=5)
    TuningRun.objects.filter(pk=r1.pk).update(created_at="2024-01-15T10:00:00Z")
    return r1, r2, r3


def run_ids_in(html: str) -> list[int]:
    return [int(x) for x in re.findall(r'<a href="/runs/(\d+)/">#', html)]


@pytest.mark.dialect
def test_run_list_filters_and_sorting(owner_client, many_runs, run_b, model_a):
    r1, r2, r3 = many_runs
    get = lambda q="": run_ids_in(owner_client.get("/runs/" + q).content.decode())  # noqa: E731
    assert get() == [r3.pk, r2.pk, r1.pk]  # newest first; never team B's run
    assert run_b.pk not in get(f"?team={run_b.team_id}")
    assert get(f"?model={model_a.pk}") == [r3.pk, r1.pk]
    assert get("?target_kind=cuda") == [r2.pk]
    assert get("?status=succeeded") == [r3.pk]
    assert get("?created_before=2024-02-01") == [r1.pk]
    assert get("?created_after=2024-02-01") == [r3.pk, r2.pk]
    assert get("?sort=trials") == [r1.pk, r2.pk, r3.pk]
    assert get("?sort=-trials") == [r3.pk, r2.pk, r1.pk]
    assert get("?status=nonsense") == [r3.pk, r2.pk, r1.pk]  # bad filter values never widen the scope


def test_run_list_paginates(owner_client, many_runs, monkeypatch):
    monkeypatch.setattr("frontend.views.RUNS_PER_PAGE", 2)
    html = owner_client.get("/runs/?target_kind=&sort=created").content.decode()
    assert "page 1 of 2" in html and len(run_ids_in(html)) == 2
    assert "?target_kind=&amp;sort=created&amp;page=2" in html  # filters kept across pages
    html2 = owner_client.get("/runs/?sort=created&page=2").content.decode()
    assert len(run_ids_in(html2)) == 1


# --- compare ----------------------------------------------------------------------------------------------


def test_compare_two_runs(owner_client, user_owner, model_a, roomy_quota):
    a, _ = make_running_run(actor=user_owner, model=model_a, max_trials=64, n_tasks=2, rounds=4, per_round=8)
    b, _ = make_running_run(actor=user_owner, model=model_a, max_trials=64, n_tasks=2, rounds=6, per_round=8,
                            seed=1, measurement_mode="stock", dop_fixed=1)
    html = owner_client.get(f"/runs/compare/?runs={a.pk}&runs={b.pk}").content.decode()
    fig = figure_from(html, "fig-compare")
    assert len(fig["data"]) == 2 and "stock" in fig["data"][1]["name"]
    assert 'id="compare-table"' in html and f"Run #{a.pk}" in html and f"Run #{b.pk}" in html
    # comma form and picker page
    assert owner_client.get(f"/runs/compare/?runs={a.pk},{b.pk}").status_code == 200
    html = owner_client.get("/runs/compare/").content.decode()
    assert "Pick runs to compare" in html and f'value="{a.pk}"' in html
    html = owner_client.get(f"/runs/compare/?runs={a.pk}", follow=True).content.decode()
    assert "at least two runs" in html
    html = owner_client.get("/runs/compare/?runs=abc").content.decode()
    assert "Cannot compare" in html


# --- energy, cluster, simulations ------------------------------------------------------------------------


def test_energy_page_placeholder_and_activity(owner_client, run_a):
    html = owner_client.get("/energy/").content.decode()
    assert 'id="energy-placeholder"' in html and "not measured yet" in html
    assert "Team A" in html and str(run_a.trials_done) in html
    fig = figure_from(html, "fig-energy")
    assert fig["data"][0]["type"] == "bar" and fig["data"][0]["name"] == "Team A"
    assert 'id="quota-table"' in html


def test_energy_page_never_shows_other_teams(owner_client, run_a, run_b):
    html = owner_client.get("/energy/").content.decode()
    assert "Team B" not in html


def test_cluster_and_simulation_pages_without_data(owner_client):
    for url in ("/cluster/", "/simulations/"):
        html = owner_client.get(url).content.decode()
        assert "No data yet" in html, url


def test_run_energy_says_the_watts_of_a_modeled_figure(owner_client, run_a):
    from tuning.models import TuningRun

    TuningRun.objects.filter(pk=run_a.pk).update(energy_joules=5400.0, energy_source="modeled",
                                                 energy_model={"cpu_watts_per_core": 12.5, "gpu_board_watts": 300})
    assert "(modeled at 12.5 W/core)" in owner_client.get(f"/runs/{run_a.pk}/").content.decode()
    TuningRun.objects.filter(pk=run_a.pk).update(energy_source="rapl")  # measured: no watts model involved
    html = owner_client.get(f"/runs/{run_a.pk}/").content.decode()
    assert "(rapl)" in html and "W/core" not in html
