"""The GPU-job and simulation forms in a real browser (Playwright on Debian's Chromium), end to end as a
user does them, each result checked through the API; and the admin page without a console error."""
from __future__ import annotations

import pytest

from core.models import Quota
from scheduling.models import GpuJob, SimulationRun
from tests.helpers import PHILLY_CSV

from .test_browser import browser, login, page, shots, wait_for_chart  # noqa: F401 - fixtures and helpers

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def api_json(page, live_server, path: str) -> dict:  # noqa: F811
    """GET an API path with the page's own session (what the user could open in a tab)."""
    resp = page.request.get(live_server.url + path)
    assert resp.ok, (path, resp.status)
    return resp.json()


def test_submit_a_gpu_job_with_its_prediction_previewed(page, live_server, shots, user_owner, team_a, model_a):  # noqa: F811
    from scheduling import services

    services.ensure_active_predictor()  # trained from the seed profiles (the preview never trains one)
    login(page, live_server)
    page.goto(live_server.url + "/cluster/")
    page.click("#submit-job-link")
    page.wait_for_selector("#job-form[data-previewed='1']")  # predicted before anything is submitted
    first = page.inner_text("[data-preview=mem_mb]")
    assert page.inner_text("[data-preview=policy]") == services.default_policy()
    assert page.inner_text("[data-preview=util_pct]").endswith("%") and first.endswith("MB")
    page.fill("#id_batch_size", "256")
    page.wait_for_function(f"document.querySelector('[data-preview=mem_mb]').textContent !== {first!r}")
    page.fill("#id_batch_size", "9999")  # over the bound: said at once, not at submit
    page.wait_for_selector("#preview-error:not([hidden])")
    page.fill("#id_batch_size", "16")
    page.wait_for_selector("#preview-error", state="hidden")
    page.fill("#id_iterations", "20")
    page.fill("#id_duration_estimate_s", "90")
    page.screenshot(path=str(shots / "20-job-new.png"), full_page=True)
    page.click("#job-form button[type=submit]")
    page.wait_for_selector("#placements-table")
    job = GpuJob.objects.get()
    api = api_json(page, live_server, f"/api/gpu-jobs/{job.pk}/")
    assert api["batch_size"] == 16 and api["iterations"] == 20 and api["duration_estimate_s"] == 90
    assert f"{api['predicted_util_pct']:.1f} %" in page.inner_text("#job-numbers")
    page.screenshot(path=str(shots / "21-job-detail.png"), full_page=True)
    page.click("#job-cancel button")
    page.wait_for_selector("text=cancelled")
    assert api_json(page, live_server, f"/api/gpu-jobs/{job.pk}/")["state"] == "cancelled"
    assert page.problems == []


def test_upload_a_trace_and_follow_its_simulation(page, live_server, shots, user_owner, team_a):  # noqa: F811
    from scheduling import services

    Quota.objects.filter(team=team_a).update(max_concurrent_simulations=5)
    login(page, live_server)
    page.goto(live_server.url + "/simulations/")
    page.click("#start-simulation")
    page.set_input_files("#trace-upload-form #id_file", files=[
        {"name": "junk.csv", "mimeType": "text/csv", "buffer": b"timestamp,duration,num_gpus\nx,abc,1\n"}])
    page.click("#trace-upload-form button[type=submit]")
    page.wait_for_selector("#field-file.has-error")  # readable refusal, nothing stored
    assert "line" in page.inner_text("#trace-upload-form #field-file")
    assert api_json(page, live_server, "/api/traces/")["count"] == 0
    page.set_input_files("#trace-upload-form #id_file", files=[
        {"name": "mine.csv", "mimeType": "text/csv", "buffer": PHILLY_CSV.encode()}])
    page.click("#trace-upload-form button[type=submit]")
    page.wait_for_selector("text=Trace 'mine' uploaded")
    trace = api_json(page, live_server, "/api/traces/")["results"][0]
    page.select_option("#simulation-form #id_trace", str(trace["id"]))
    page.select_option("#id_method", "replay")
    for policy in ("horus", "fifo_exclusive"):
        page.check(f"#simulation-form input[name=policies][value={policy}]")
    page.fill("#id_gpus", "4")
    page.fill("#id_seeds", "7")
    page.fill("#id_predictor_error", "0.3")
    page.screenshot(path=str(shots / "22-simulation-new.png"), full_page=True)
    page.click("#simulation-form button[type=submit]")
    page.wait_for_selector("#sim-progress")
    sim = SimulationRun.objects.get()
    services.execute_simulation(run_id=sim.pk)  # the worker's part; the page reloads itself when done
    assert wait_for_chart(page, "fig-curve") == 2
    page.wait_for_selector("[data-figure=fig-util_mean_pct].js-plotly-plot")
    api = api_json(page, live_server, f"/api/simulations/{sim.pk}/")
    assert api["status"] == "succeeded" and api["seed"] == 7 and api["trace_upload"] == trace["id"]
    assert api["parameters"]["predictor_error"] == 0.3 and api["parameters"]["gpus"] == 4
    assert {row["policy"] for row in api["table"]} == {"horus", "fifo_exclusive"}
    assert all(0 <= row["util_mean_pct"] <= 100 for row in api["table"])
    page.screenshot(path=str(shots / "23-simulation-result.png"), full_page=True)
    assert page.problems == []


def test_admin_page_loads_without_a_console_error(page, live_server, user_staff):  # noqa: F811
    user_staff.set_password("pw-stan")
    user_staff.save()
    failed = []
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    login(page, live_server, "stan", "pw-stan")
    page.goto(live_server.url + "/admin/")
    page.wait_for_load_state("networkidle")
    assert failed == [] and page.problems == [], failed + page.problems


def test_live_page_polls_conditionally_and_still_follows_progress(page, live_server, user_owner, team_a, model_a):  # noqa: F811
    """An unchanged run answers the page's poll with 304 (If-None-Match); a write makes it fetch again."""
    from .fakes import make_running_run

    Quota.objects.filter(team=team_a).update(max_concurrent_runs=5)
    run, worker = make_running_run(actor=user_owner, model=model_a, max_trials=64, n_tasks=2, rounds=1, per_round=8)
    statuses = []
    page.on("response", lambda r: statuses.append(r.status) if "/live/" in r.url else None)
    login(page, live_server)
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    page.wait_for_function("Number(document.getElementById('run-live').getAttribute('data-not-modified')) >= 1",
                           timeout=20_000)
    assert 304 in statuses and page.inner_text("[data-field=trials]").startswith("8 /")
    worker.step(8)
    page.wait_for_function("document.querySelector('[data-field=trials]').textContent.startsWith('16 /')",
                           timeout=20_000)
    assert page.problems == []
