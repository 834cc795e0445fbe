"""Chart data API (/api/charts/...): Plotly-ready figures, team scoping, schema, query counts."""
from __future__ import annotations

import pytest
import yaml
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import resolve

from tuning.models import TuningRun

from .fakes import make_running_run

pytestmark = pytest.mark.django_db


def is_figure(body) -> bool:
    return isinstance(body, dict) and isinstance(body.get("data"), list) and isinstance(body.get("layout"), dict)


def test_chart_paths_are_not_shadowed_by_the_api_router():
    from frontend import api

    assert resolve("/api/charts/runs/1/curve/").func.view_class is api.RunCurveChartView
    assert resolve("/api/charts/runs/compare/").func.view_class is api.RunCompareChartView
    assert resolve("/api/charts/models/1/ops/").func.view_class is api.ModelOpsChartView


def test_chart_endpoints_return_figures(api_owner, model_a, run_a):
    for url in (f"/api/charts/models/{model_a.pk}/ops/", f"/api/charts/runs/{run_a.pk}/curve/",
                f"/api/charts/runs/{run_a.pk}/dop/", "/api/charts/energy/"):
        resp = api_owner.get(url)
        assert resp.status_code == 200, url
        assert is_figure(resp.json()), url
    curve = api_owner.get(f"/api/charts/runs/{run_a.pk}/curve/").json()
    assert curve["data"][0]["name"] == "end-to-end estimate" and curve["layout"]["yaxis"]["type"] == "log"


def test_chart_endpoints_need_auth(api_anon, run_a):
    assert api_anon.get(f"/api/charts/runs/{run_a.pk}/curve/").status_code in (401, 403)


def test_other_teams_objects_are_404(api_owner, model_b, run_b, team_b):
    for url in (f"/api/charts/models/{model_b.pk}/ops/", f"/api/charts/runs/{run_b.pk}/curve/",
                f"/api/charts/runs/{run_b.pk}/dop/", f"/api/charts/runs/{run_b.pk}/live/",
                f"/api/charts/energy/?team={team_b.pk}"):
        resp = api_owner.get(url)
        assert resp.status_code == 404, url
        assert resp.json()["code"] == "not_found"


def test_curve_is_downsampled(api_owner, user_owner, model_a, roomy_quota):
    run, _ = make_running_run(actor=user_owner, model=model_a, max_trials=2000, n_tasks=2, rounds=40, per_round=32)
    fig = api_owner.get(f"/api/charts/runs/{run.pk}/curve/?max_points=50").json()
    assert all(len(trace["x"]) <= 51 for trace in fig["data"])
    assert fig["data"][0]["x"][-1] == 40 * 32  # the last point is kept
    assert api_owner.get(f"/api/charts/runs/{run.pk}/curve/?max_points=5").status_code == 400
    assert api_owner.get(f"/api/charts/runs/{run.pk}/curve/?max_points=abc").status_code == 400


def test_rounds_show_where_their_measuring_time_went(api_owner, owner_client, user_owner, model_a, roomy_quota):
    """The live JSON and the run page say how long each round measured, at its DOP and serially."""
    from tests.factories import DopRoundFactory

    run, _ = make_running_run(actor=user_owner, model=model_a, max_trials=64, n_tasks=1, rounds=0, per_round=16)
    DopRoundFactory(run=run, round_index=0, dop=2, wall_secs=3.0, parallel_wall_secs=2.0, serial_wall_secs=1.0)
    DopRoundFactory(run=run, round_index=1, dop=1)  # a round recorded before the split existed
    rows = api_owner.get(f"/api/charts/runs/{run.pk}/live/").json()["dop_rounds"]
    assert [r["display"]["measuring"] for r in rows] == ["3.00 s (2.00 at DOP + 1.00 serial)", "—"]
    page = owner_client.get(f"/runs/{run.pk}/")
    assert page.status_code == 200 and "3.00 s (2.00 at DOP + 1.00 serial)" in page.content.decode()


def test_live_endpoint_and_stamp(api_owner, run_a):
    body = api_owner.get(f"/api/charts/runs/{run_a.pk}/live/").json()
    assert set(body) >= {"run", "tasks", "dop_rounds", "figures", "stamp"}
    assert body["run"]["trials_done"] == run_a.trials_done and body["run"]["status"] == "running"
    assert body["run"]["display"]["energy"] == "not measured yet"
    assert is_figure(body["figures"]["curve"]) and is_figure(body["figures"]["dop"])
    assert len(body["tasks"]) == 4 and body["tasks"][3]["status"] == "preempted"
    same = api_owner.get(f"/api/charts/runs/{run_a.pk}/live/?stamp={body['stamp']}").json()
    assert same["unchanged"] is True and "figures" not in same and same["run"]["trials_done"] == run_a.trials_done
    run_a.fake_worker.step(16)
    changed = api_owner.get(f"/api/charts/runs/{run_a.pk}/live/?stamp={body['stamp']}").json()
    assert "unchanged" not in changed and changed["run"]["trials_done"] == run_a.trials_done + 16
    assert changed["stamp"] != body["stamp"]


def test_compare_endpoint(api_owner, user_owner, model_a, run_a, run_b, roomy_quota):
    other, _ = make_running_run(actor=user_owner, model=model_a, max_trials=64, n_tasks=2, rounds=3, per_round=8)
    body = api_owner.get(f"/api/charts/runs/compare/?runs={run_a.pk},{other.pk}").json()
    assert is_figure(body["figure"]) and len(body["figure"]["data"]) == 2
    assert [r["id"] for r in body["runs"]] == [run_a.pk, other.pk]
    assert api_owner.get(f"/api/charts/runs/compare/?runs={run_a.pk}").status_code == 400
    assert api_owner.get("/api/charts/runs/compare/?runs=1,x").status_code == 400
    assert api_owner.get(f"/api/charts/runs/compare/?runs={run_a.pk},{run_b.pk}").status_code == 404


@pytest.mark.dialect  # months by TruncMonth and sums over them
def test_energy_figure_uses_recorded_energy(api_owner, owner_client, run_a):
    TuningRun.objects.filter(pk=run_a.pk).update(energy_joules=7200.0, energy_source="rapl",
                                                 energy_build_joules=2000.0, energy_measure_joules=5000.0,
                                                 energy_saved_joules=1800.0, trials_saved=40)
    fig = api_owner.get("/api/charts/energy/").json()
    assert fig["layout"]["yaxis"]["title"]["text"] == "kWh"
    assert fig["data"][0]["y"] == [pytest.approx(0.002)]
    html = owner_client.get("/energy/").content.decode()
    assert 'id="energy-placeholder"' not in html and "0.0020 kWh" in html and "rapl" in html
    html = owner_client.get(f"/runs/{run_a.pk}/").content.decode()
    assert "7.20 kJ (rapl)" in html and "build 2.00 kJ · measure 5.00 kJ" in html
    assert "1.80 kJ (40 trials)" in html and "at 400 g/kWh" in html
    assert 'id="energy-not-measured" hidden' in html


def test_schema_documents_chart_endpoints(client, django_user_model):
    # the schema needs a login (issue 11: API_DOCS_PUBLIC=0 by default)
    client.force_login(django_user_model.objects.create_user(username="schema-reader", password="pw"))
    schema = yaml.safe_load(client.get("/api/schema/").content)
    for path in ("/api/charts/runs/{id}/curve/", "/api/charts/runs/{id}/live/", "/api/charts/models/{id}/ops/",
                 "/api/charts/runs/compare/", "/api/charts/energy/", "/api/charts/cluster/"):
        assert path in schema["paths"], path
        assert schema["paths"][path]["get"]["tags"] == ["charts"]
    assert "PlotlyFigure" in schema["components"]["schemas"]


# --- no N+1: query counts do not grow with tasks, rounds or measurements -------------------------


def count_queries(client, url) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


def test_run_page_and_live_queries_do_not_grow(owner_client, user_owner, model_a, roomy_quota):
    small, _ = make_running_run(actor=user_owner, model=model_a, max_trials=5000, n_tasks=2, rounds=2, per_round=4)
    big, _ = make_running_run(actor=user_owner, model=model_a, max_trials=5000, n_tasks=25, rounds=50,
                              per_round=16, seed=2)
    for url in ("/runs/{}/", "/api/charts/runs/{}/live/", "/api/charts/runs/{}/curve/"):
        n_small = count_queries(owner_client, url.format(small.pk))
        n_big = count_queries(owner_client, url.format(big.pk))
        assert n_small == n_big, (url, n_small, n_big)
        assert n_big <= 20, (url, n_big)
    lists = [count_queries(owner_client, u) for u in ("/runs/", "/", "/energy/", "/models/")]
    # /energy/ is the largest: its quota panel reads the team's placements and extender pod bindings
    assert max(lists) <= 22, lists


def test_compress_steps_is_lossless_for_step_lines():
    import random

    from frontend.presenters import compress_steps

    rng = random.Random(0)
    xs = list(range(1, 2001))
    best, ys = None, []
    for k in xs:
        v = rng.uniform(1, 10) if k > 5 else None  # no valid result for the first trials
        if v is not None and (best is None or v < best):
            best = v
        ys.append(best)
    cx, cy = compress_steps(xs, ys, 10_000)
    assert cx[0] == 6 and cx[-1] == 2000 and len(cx) < 30

    def value_at(x):  # the "hv" step line through the compressed points
        i = max(k for k, px in enumerate(cx) if px <= x)
        return cy[i]

    assert all(value_at(x) == y for x, y in zip(xs, ys) if y is not None)
    tx, ty = compress_steps(list(range(100)), [float(-k) for k in range(100)], 10)
    assert len(tx) <= 11 and tx[-1] == 99


# --- conditional GET (ETag / Last-Modified from the run's version) ---------------------------------------


def test_run_version_bumps_on_save_update_and_sink_writes(run_a):
    start = TuningRun.objects.get(pk=run_a.pk).version
    run_a.fake_worker.step(4)  # measurements (sink: queryset update of the run)
    after_step = TuningRun.objects.get(pk=run_a.pk).version
    assert after_step > start
    run = TuningRun.objects.get(pk=run_a.pk)
    run.error = "x"
    run.save(update_fields=["error"])
    assert run.version == after_step + 1  # read back, not the F() expression
    run_a.fake_worker.sink.on_round(type("Info", (), {"round_index": 99, "task_index": 0, "dop": 2,
                                                      "mean_error": 0.01, "n_candidates": 4, "n_remeasured": 1,
                                                      "n_failures": 0})())
    assert TuningRun.objects.get(pk=run_a.pk).version == after_step + 2  # a round-only write bumps it too


@pytest.mark.parametrize("kind", ["live", "curve", "dop"])
def test_unchanged_poll_is_304_and_a_write_changes_the_etag(api_owner, run_a, kind):
    url = f"/api/charts/runs/{run_a.pk}/{kind}/"
    first = api_owner.get(url)
    etag = first["ETag"]
    assert first.status_code == 200 and etag and first["Last-Modified"] and "no-cache" in first["Cache-Control"]
    again = api_owner.get(url, HTTP_IF_NONE_MATCH=etag)
    assert again.status_code == 304 and again.content == b"" and again["ETag"] == etag
    assert api_owner.get(url, HTTP_IF_NONE_MATCH=f"W/{etag}").status_code == 304  # weakened by a proxy
    assert api_owner.get(url, HTTP_IF_MODIFIED_SINCE=first["Last-Modified"]).status_code == 304
    run_a.fake_worker.step(8)
    changed = api_owner.get(url, HTTP_IF_NONE_MATCH=etag)
    assert changed.status_code == 200 and changed["ETag"] != etag
    if kind == "live":
        assert changed.json()["run"]["trials_done"] == run_a.trials_done + 8


def test_304_costs_one_query_after_auth_and_no_figure_work(api_owner, run_a, monkeypatch):
    from frontend import presenters

    url = f"/api/charts/runs/{run_a.pk}/live/"
    etag = api_owner.get(url)["ETag"]
    monkeypatch.setattr(presenters, "run_live_payload", lambda *a, **k: pytest.fail("built a payload"))
    with CaptureQueriesContext(connection) as queries:
        assert api_owner.get(url, HTTP_IF_NONE_MATCH=etag).status_code == 304
    assert len(queries) <= 3, [q["sql"] for q in queries]  # session, user, the run's version


def test_etag_is_per_query_string_and_never_leaks_another_team(api_owner, run_a, api_other):
    url = f"/api/charts/runs/{run_a.pk}/curve/"
    etag = api_owner.get(url)["ETag"]
    assert api_owner.get(url + "?max_points=50", HTTP_IF_NONE_MATCH=etag).status_code == 200
    assert api_other.get(url, HTTP_IF_NONE_MATCH=etag).status_code == 404  # not 304 for another team
    assert api_other.get(url, HTTP_IF_NONE_MATCH="*").status_code == 404


def test_figures_are_cached_per_run_version(api_owner, run_a, monkeypatch):
    from frontend import presenters

    url = f"/api/charts/runs/{run_a.pk}/dop/"
    body = api_owner.get(url).json()
    monkeypatch.setattr(presenters, "run_dop_figure", lambda *a, **k: pytest.fail("figure rebuilt"))
    assert api_owner.get(url).json() == body  # same version: from the cache, no ETag sent


def test_dop_axis_is_whole_rounds(api_owner, run_a):
    xaxis = api_owner.get(f"/api/charts/runs/{run_a.pk}/dop/").json()["layout"]["xaxis"]
    assert xaxis["tickformat"] == "d" and xaxis["tick0"] == 0 and int(xaxis["dtick"]) == xaxis["dtick"] >= 1


def test_unstarted_estimate_names_the_unmeasured_tasks(api_owner, user_owner, model_a, roomy_quota):
    run, worker = make_running_run(actor=user_owner, model=model_a, max_trials=64, n_tasks=3)
    worker.step(8, task_index=0)  # tasks 1 and 2 have no measurement yet
    fig = api_owner.get(f"/api/charts/runs/{run.pk}/curve/").json()
    note = fig["layout"]["annotations"][0]["text"]
    names = [t.name for t in worker.tasks[1:]]
    assert "2 task(s) have no valid measurement" in note and all(n in note for n in names)
