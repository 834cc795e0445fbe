"""The dashboard in a real browser: Playwright drives Debian's headless Chromium against live_server.

Flow: log in, upload a model through the form, start a tuning run through the
form, feed it progress from a pretend worker and watch the page update without
reloading, compare two runs, open the cluster, simulation and energy pages.
A screenshot of each main page goes to $DLOPT_SCREENSHOT_DIR (default: a new
temp dir, printed).
"""
from __future__ import annotations

import datetime as dt
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from core.models import DLModel, Quota
from tuning.models import TuningRun

from .fakes import FakeWorker

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM = os.environ.get("DLOPT_CHROMIUM", "/usr/bin/chromium")
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run"]
WAIT_MS = 15_000


@pytest.fixture(scope="module")
def browser():
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        msg = f"Chromium not found at {CHROMIUM}: apt-get install -y chromium (or set DLOPT_CHROMIUM)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the ORM calls the
    # tests make in between are still plain synchronous code. Only while these
    # tests run: the flag must not leak into other tests' subprocesses.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
            yield b
            b.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture(scope="module")
def shots(request):
    path = Path(os.environ.get("DLOPT_SCREENSHOT_DIR") or tempfile.mkdtemp(prefix="dlopt-screenshots-"))
    path.mkdir(parents=True, exist_ok=True)
    request.config.dlopt_screenshot_dir = path  # printed in the summary (tests/frontend/conftest.py)
    return path


def _page(context, live_server):
    pg = context.new_page()
    pg.set_default_timeout(WAIT_MS)
    pg.problems = []
    pg.on("pageerror", lambda exc: pg.problems.append(f"page error: {exc}"))
    pg.on("console", lambda m: pg.problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)

    def outside(request):
        if not request.url.startswith(live_server.url) and not request.url.startswith("data:"):
            pg.problems.append(f"request outside the server: {request.url}")
    pg.on("request", outside)
    return pg


@pytest.fixture
def page(browser, live_server):
    # Playwright's wait_for_function evaluates its predicate with eval() in the page, which the
    # Content-Security-Policy forbids: these flows bypass it; csp_page below enforces it.
    context = browser.new_context(viewport={"width": 1366, "height": 900}, bypass_csp=True)
    yield _page(context, live_server)
    context.close()


@pytest.fixture
def csp_page(browser, live_server):
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    yield _page(context, live_server)
    context.close()


def login(page, live_server, username="alice", password="pw-alice"):
    page.goto(live_server.url + "/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("#login-form button[type=submit]")
    page.wait_for_url(live_server.url + "/")


def wait_for_chart(page, figure_id: str) -> int:
    """Wait until plotly.js has drawn the figure; returns its trace count."""
    sel = f"[data-figure={figure_id}].js-plotly-plot"
    page.wait_for_selector(sel)
    page.wait_for_selector(f"{sel} svg.main-svg")
    return page.evaluate(f"document.querySelector('{sel}').data.length")


def test_dashboard_end_to_end(page, live_server, shots, user_owner, team_a, small_cnn_bytes, celery_outbox):
    """The whole dashboard flow in one browser session, step by step (each step below asserts what it
    shows): log in, upload, start a run, watch it live, pause/resume a second run, compare, then the
    energy, cluster and simulation pages; no page error and no request outside the server."""
    Quota.objects.filter(team=team_a).update(max_concurrent_runs=10)
    login(page, live_server)
    page.screenshot(path=str(shots / "01-overview.png"), full_page=True)
    model = upload_models(page, live_server, shots, small_cnn_bytes)
    run = start_run_through_form(page, live_server, shots, model, celery_outbox)
    watch_run_progress_live(page, shots, run)
    second = pause_resume_second_run(page, live_server, model, run)
    compare_runs(page, live_server, shots, run, second)
    energy_cluster_simulation_pages(page, live_server, shots, team_a, model, run)
    assert page.problems == []


def upload_models(page, live_server, shots, small_cnn_bytes) -> DLModel:
    """A refused file first (readable message, nothing stored), then a real model."""
    page.goto(live_server.url + "/models/upload/")
    page.fill("#id_name", "junk")
    page.set_input_files("#id_file", files=[{"name": "junk.onnx", "mimeType": "application/octet-stream",
                                             "buffer": b"definitely not onnx"}])
    page.click("#upload-form button[type=submit]")
    page.wait_for_selector("#upload-refusal")
    assert "not_protobuf" in page.inner_text("#upload-refusal")
    page.screenshot(path=str(shots / "02-upload-refused.png"), full_page=True)
    assert not DLModel.objects.filter(name="junk").exists()

    page.fill("#id_name", "cnn-browser")
    page.set_input_files("#id_file", files=[{"name": "cnn.onnx", "mimeType": "application/octet-stream",
                                             "buffer": small_cnn_bytes}])
    page.click("#upload-form button[type=submit]")
    page.wait_for_selector("text=registered in Team A")
    model = DLModel.objects.get(name="cnn-browser")
    assert page.url == f"{live_server.url}/models/{model.pk}/"
    assert wait_for_chart(page, "fig-ops") == 1
    page.screenshot(path=str(shots / "03-model-detail.png"), full_page=True)

    page.goto(live_server.url + "/models/")
    page.wait_for_selector("#models-table >> text=cnn-browser")
    page.screenshot(path=str(shots / "04-models.png"), full_page=True)
    return model


def start_run_through_form(page, live_server, shots, model, celery_outbox) -> TuningRun:
    page.goto(f"{live_server.url}/runs/new/?model={model.pk}")
    page.wait_for_selector("#trimmer-options")
    page.fill("#id_max_trials", "48")
    page.fill("#id_trials_per_round", "8")
    page.screenshot(path=str(shots / "05-start-run.png"), full_page=True)
    page.click("#start-run-form button[type=submit]")
    page.wait_for_selector("text=queued")
    run = TuningRun.objects.get(model=model)
    assert celery_outbox.args_of("tuning.execute_run") == [(run.pk,)]
    assert page.url == f"{live_server.url}/runs/{run.pk}/"
    assert page.inner_text("#run-status") == "Queued"
    wait_for_chart(page, "fig-curve")
    return run


def watch_run_progress_live(page, shots, run) -> None:
    """A pretend worker makes progress; the page follows WITHOUT reloading."""
    page.evaluate("window.__sameDocument = 'yes'")
    worker = FakeWorker(run, n_tasks=3, seed=1)
    for _ in range(3):
        worker.step(8, dop=2)
    page.wait_for_function("document.querySelector('[data-field=trials]').textContent.startsWith('24 /')")
    page.wait_for_function("document.getElementById('run-status').textContent === 'Running'")
    page.wait_for_function("document.querySelectorAll('#tasks-body tr').length === 3")
    page.wait_for_function("document.querySelector('[data-figure=fig-curve]').data.length === 4")
    assert page.evaluate("document.querySelector('[data-figure=fig-dop]').data[0].x.length") == 3
    assert page.evaluate("document.getElementById('progress-fill').style.width") == "50%"
    assert page.evaluate("window.__sameDocument") == "yes"  # no reload happened

    for _ in range(3):
        worker.step(8, dop=4)
    worker.preempt(2)
    worker.finish()
    page.wait_for_function("document.getElementById('run-status').textContent === 'Succeeded'")
    page.wait_for_function("document.getElementById('live-indicator').textContent.startsWith('finished')")
    assert page.inner_text("[data-field=trials]") == "48 / 48"
    assert "Pre-empted (plateau)" in page.inner_text("#tasks-body")
    assert page.inner_text("[data-field=speedup]") == "3.00×"
    assert page.is_hidden("form[data-action=cancel]")
    assert page.evaluate("window.__sameDocument") == "yes"
    page.wait_for_timeout(800)  # the progress bar's CSS transition
    page.screenshot(path=str(shots / "06-run-detail.png"), full_page=True)


def pause_resume_second_run(page, live_server, model, run) -> TuningRun:
    """A second run: pause it with its CSRF-protected button, resume it, then give it progress."""
    page.goto(f"{live_server.url}/runs/new/?model={model.pk}")
    page.fill("#id_max_trials", "64")
    page.check("#id_dop_mode_1")  # fixed DOP
    page.fill("#id_dop_fixed", "2")
    page.select_option("#id_measurement_mode", "stock")
    page.click("#start-run-form button[type=submit]")
    page.wait_for_selector("#run-status")
    second = TuningRun.objects.exclude(pk=run.pk).get()
    page.click("form[data-action=pause] button")
    page.wait_for_selector("text=is now paused")
    second.refresh_from_db()
    assert second.status == "paused" and second.dop_fixed == 2
    page.click("form[data-action=resume] button")
    page.wait_for_selector("text=is now queued")
    w2 = FakeWorker(second, n_tasks=3, seed=5)
    for _ in range(5):
        w2.step(8, dop=2)
    return second


def compare_runs(page, live_server, shots, run, second) -> None:
    """Compare the two runs from the runs list."""
    page.goto(live_server.url + "/runs/")
    page.wait_for_selector("#runs-table")
    page.screenshot(path=str(shots / "07-runs.png"), full_page=True)
    page.check(f"input[name=runs][value='{run.pk}']")
    page.check(f"input[name=runs][value='{second.pk}']")
    page.click("#compare-form button[type=submit]")
    page.wait_for_selector("#compare-table")
    assert wait_for_chart(page, "fig-compare") == 2
    page.screenshot(path=str(shots / "08-compare.png"), full_page=True)


def energy_cluster_simulation_pages(page, live_server, shots, team, model, run) -> None:
    TuningRun.objects.filter(pk=run.pk).update(energy_joules=5400.0, energy_source="modeled",
                                               energy_build_joules=1500.0, energy_measure_joules=3900.0)
    page.goto(live_server.url + "/energy/")
    wait_for_chart(page, "fig-energy")
    assert "0.0015 kWh" in page.inner_text("#energy-table")
    page.screenshot(path=str(shots / "09-energy.png"), full_page=True)

    make_cluster_data(team, model)
    page.goto(live_server.url + "/cluster/")
    assert wait_for_chart(page, "fig-telemetry") == 2
    wait_for_chart(page, "fig-utilization")
    page.screenshot(path=str(shots / "10-cluster.png"), full_page=True)

    sim = make_simulation(team)
    page.goto(live_server.url + "/simulations/")
    page.wait_for_selector("#simulations-table")
    page.screenshot(path=str(shots / "11-simulations.png"), full_page=True)
    page.click(f"a[href='/simulations/{sim.pk}/']")
    assert wait_for_chart(page, "fig-curve") == 2
    page.screenshot(path=str(shots / "12-simulation-detail.png"), full_page=True)


def test_team_switcher_and_other_teams(page, live_server, user_owner, team_a, team_b, model_b):
    from core.services import create_team

    team_c = create_team(name="Team C", owner=user_owner)
    login(page, live_server)
    page.select_option("#team-switch", str(team_c.pk))  # submits on change
    page.wait_for_selector("text=Showing: Team C")
    page.goto(live_server.url + "/models/")
    assert "Showing: Team C" in page.inner_text(".scope-note")
    resp = page.goto(f"{live_server.url}/models/{model_b.pk}/")
    assert resp.status == 404
    assert page.problems == [] or all("404" in p for p in page.problems)


def test_pages_readable_without_javascript(browser, live_server, user_owner, team_a, model_a):
    context = browser.new_context(java_script_enabled=False)
    pg = context.new_page()
    login(pg, live_server)
    pg.goto(f"{live_server.url}/models/{model_a.pk}/")
    assert "Conv" in pg.inner_text("#ops-table")
    assert pg.locator(".js-plotly-plot").count() == 0  # no chart without JS, the table carries the data
    context.close()


# --- scheduling data for the cluster and simulation pages --------------------------------------


def make_cluster_data(team, model):
    from django.utils import timezone

    from scheduling.models import GPU, GpuJob, GpuTelemetry, Node, Placement

    now = timezone.now()
    node = Node.objects.create(name="gpu-node-1", hostname="gpu-node-1", cpu_cores=16, memory_mb=131072,
                               nvml_available=True, driver_version="550.54", last_seen=now,
                               queues=["measure.gpu-node-1.gpu0", "measure.gpu-node-1.gpu1"])
    gpus = [GPU.objects.create(node=node, index=i, name="NVIDIA H200", gpu_model="H200", memory_total_mb=143771,
                               queue=f"measure.gpu-node-1.gpu{i}") for i in range(2)]
    GpuTelemetry.objects.bulk_create([
        GpuTelemetry(gpu=g, ts=now - dt.timedelta(seconds=30 * (60 - k)), util_pct=(35 + 25 * g.index + (k % 7) * 4),
                     mem_used_mb=20000 + 300 * k + 9000 * g.index)
        for k in range(60) for g in gpus])
    job = GpuJob.objects.create(team=team, model=model, batch_size=16, duration_estimate_s=120,
                                predicted_util_pct=42, predicted_mem_mb=1800, state=GpuJob.State.RUNNING,
                                policy="horus")
    Placement.objects.create(job=job, gpu=gpus[0], policy="horus", queue=gpus[0].queue, placed_at=now)


def make_simulation(team):
    from scheduling.horus.experiments import run_experiment
    from scheduling.horus.profiles import load_profiles
    from scheduling.models import SimulationRun

    results = run_experiment(trace="philly", policies=["fifo_exclusive", "horus"], seed=0,
                             params={"jobs": 150, "gpus": 16, "predictions": "oracle"}, profiles=load_profiles())
    return SimulationRun.objects.create(team=team, trace="philly", policies=["fifo_exclusive", "horus"],
                                        status="succeeded", results=results, parameters={"jobs": 150, "gpus": 16})


def test_live_page_appends_deltas_then_refreshes_when_finished(page, live_server, user_owner, model_a, roomy_quota):
    """A changed poll gets a delta the page appends (Plotly.extendTraces, new round rows, changed task rows)
    without reloading; the staircases it ends up drawing are a fresh full curve's. Finishing re-plots fully."""
    from .fakes import make_running_run
    from .test_live_delta import staircase

    run, worker = make_running_run(actor=user_owner, model=model_a, max_trials=400, n_tasks=3, rounds=3, per_round=8)
    login(page, live_server)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    wait_for_chart(page, "fig-curve")
    wait_for_chart(page, "fig-dop")
    page.evaluate("window.__sameDocument = 'yes'")
    deltas = "Number(document.getElementById('run-live').getAttribute('data-deltas') || 0)"
    for rounds, trials in ((4, 32), (5, 40)):
        worker.step(8, dop=4)
        page.wait_for_function(f"document.querySelector('[data-field=trials]').textContent.startsWith('{trials} /')")
        page.wait_for_function(f"document.querySelector('[data-figure=fig-dop]').data[0].x.length === {rounds}")
    assert page.evaluate(deltas) >= 1
    assert page.evaluate("document.querySelectorAll('#rounds-body tr').length") == 5
    assert page.evaluate("document.querySelectorAll('#tasks-body tr[data-task]').length") == 3
    assert page.evaluate("document.getElementById('run-live').getAttribute('data-full-updates')") is None
    drawn = page.evaluate("document.querySelector('[data-figure=fig-curve]').data.map(t => [t.x, t.y])")
    fresh = page.evaluate(f"fetch('/api/charts/runs/{run.pk}/curve/').then(r => r.json())")
    assert len(drawn) == len(fresh["data"]) == 4
    for (xs, ys), want in zip(drawn, fresh["data"]):
        assert staircase(xs, ys, 40) == staircase(want["x"], want["y"], 40)
    worker.finish()
    page.wait_for_function("document.getElementById('run-status').textContent === 'Succeeded'")
    page.wait_for_function("document.getElementById('live-indicator').textContent.startsWith('finished')")
    assert page.evaluate("document.getElementById('run-live').getAttribute('data-full-updates')") == "1"
    assert page.evaluate("window.__sameDocument") == "yes"
    assert not page.problems, page.problems


def test_charts_and_api_docs_run_under_the_content_security_policy(csp_page, live_server, user_owner, team_a,
                                                                 model_a, run_a):
    """Every response carries the CSP (scripts from this origin only): plotly.js, dashboard.js and
    Swagger UI still run, and the browser reports no blocked script, style or request."""
    page = csp_page
    login(page, live_server)
    resp = page.goto(f"{live_server.url}/models/{model_a.pk}/")
    assert "script-src 'self'" in resp.headers["content-security-policy"]
    assert wait_for_chart(page, "fig-ops") == 1
    page.goto(f"{live_server.url}/runs/{run_a.pk}/")
    wait_for_chart(page, "fig-curve")
    page.goto(f"{live_server.url}/api/docs/")
    page.wait_for_selector("#swagger-ui .information-container")  # drawn by Swagger UI's init script
    # an injected inline script is refused: the policy is enforced, not only sent
    page.evaluate("() => { const s = document.createElement('script'); s.textContent = 'window.injected = 1';"
                  " document.body.appendChild(s); }")
    assert page.evaluate("() => window.injected") is None
    blocked = [p for p in page.problems if "Content Security Policy" in p]
    assert len(blocked) == 1 and "inline script" in blocked[0], page.problems  # only the injected one
    assert [p for p in page.problems if p not in blocked] == []
