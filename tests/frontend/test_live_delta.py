"""Live run endpoint with ?cursor=: a changed poll answers only what is new (issue 17).

The behaviour checked: a delta applied to what the client has draws the same staircases as a fresh
full payload; it lists only the new rounds and the changed task rows; it never re-reads the whole
history; hostile parameters are a 400, a cursor it cannot continue from is a full refresh; other teams'
runs stay 404 (with or without a cursor), viewers read it and cannot write.
"""
from __future__ import annotations

import bisect

import pytest

from frontend import presenters
from tests.helpers import client_for
from tuning import selectors as tuning_selectors

from .fakes import make_running_run

pytestmark = pytest.mark.django_db


def live(client, run, **params):
    query = "&".join(f"{k}={v}" for k, v in params.items())
    resp = client.get(f"/api/charts/runs/{run.pk}/live/" + (f"?{query}" if query else ""))
    assert resp.status_code == 200, resp.content[:300]
    return resp.json()


def extended(figure: dict, ext: dict) -> list[tuple[list, list]]:
    """What Plotly.extendTraces leaves in the traces of `figure` after `ext`."""
    traces = [(list(t["x"]), list(t["y"])) for t in figure["data"]]
    for trace, xs, ys in zip(ext["traces"], ext["x"], ext["y"]):
        traces[trace][0].extend(xs)
        traces[trace][1].extend(ys)
    return traces


def staircase(xs: list, ys: list, upto: int) -> list:
    """The value an "hv" line shows at every trial 1..upto (None before its first point)."""
    out = []
    for x in range(1, upto + 1):
        k = bisect.bisect_right(xs, x) - 1
        out.append(ys[k] if k >= 0 else None)
    return out


def test_delta_extends_the_curve_to_what_a_full_load_draws(api_owner, run_a):
    first = live(api_owner, run_a)
    assert first["mode"] == "full" and first["cursor"]
    for _ in range(3):
        run_a.fake_worker.step(16)
    delta = live(api_owner, run_a, cursor=first["cursor"], points=50)
    assert delta["mode"] == "delta" and "figures" not in delta
    assert delta["run"]["trials_done"] == run_a.trials_done + 48
    assert [r["round_index"] for r in delta["dop_rounds"]] == [6, 7, 8]  # only the new rounds
    assert delta["extend"]["dop"]["x"] == [[6, 7, 8], [6, 7, 8]]
    # Every new curve point is after the cursor; the staircases equal a fresh full curve's.
    n0 = first["run"]["trials_done"]
    assert all(x > n0 for xs in delta["extend"]["curve"]["x"] for x in xs)
    fresh = live(api_owner, run_a)["figures"]["curve"]
    total = run_a.trials_done + 48
    got = extended(first["figures"]["curve"], delta["extend"]["curve"])
    assert len(got) == len(fresh["data"])
    for (xs, ys), want in zip(got, fresh["data"]):
        assert xs == sorted(xs)
        assert staircase(xs, ys, total) == staircase(want["x"], want["y"], total)
    # The rounds stepped were tasks 2, 3, 0 (round robin): their rows changed, task 1's did not.
    assert sorted(r["index"] for r in delta["tasks"]) == [0, 2, 3]
    # The next delta continues from the new cursor.
    run_a.fake_worker.step(16)
    again = live(api_owner, run_a, cursor=delta["cursor"])
    assert again["mode"] == "delta" and [r["round_index"] for r in again["dop_rounds"]] == [9]
    assert all(x > total for xs in again["extend"]["curve"]["x"] for x in xs)


def test_delta_with_nothing_new_sends_only_the_changed_task_row(api_owner, run_a):
    first = live(api_owner, run_a)
    run_a.fake_worker.preempt(1)  # a task-only write: the version changes, no measurement, no round
    delta = live(api_owner, run_a, cursor=first["cursor"])
    assert delta["mode"] == "delta"
    assert [r["index"] for r in delta["tasks"]] == [1] and delta["tasks"][0]["status"] == "preempted"
    assert delta["dop_rounds"] == [] and delta["extend"]["curve"]["traces"] == []
    assert delta["extend"]["dop"]["traces"] == []


def test_a_delta_reads_only_rows_after_the_cursor(api_owner, run_a, monkeypatch):
    first = live(api_owner, run_a)
    run_a.fake_worker.step(16)
    monkeypatch.setattr(tuning_selectors, "best_so_far_curve", lambda *a, **k: pytest.fail("whole history read"))
    monkeypatch.setattr(presenters, "run_live_payload", lambda *a, **k: pytest.fail("full payload built"))
    assert live(api_owner, run_a, cursor=first["cursor"])["mode"] == "delta"


def test_cursor_it_cannot_continue_from_is_a_full_refresh(api_owner, user_owner, model_a, run_a, monkeypatch):
    first = live(api_owner, run_a)
    n, last_id, next_round, digest = first["cursor"].split("-")
    beyond = f"{int(n) + 1000}-{int(last_id) + 1000}-{next_round}-{digest}"
    for cursor, reason in ((beyond, "past the stored measurements"),
                           (f"{n}-{last_id}-{next_round}-00000000", "unknown or expired cursor")):
        body = live(api_owner, run_a, cursor=cursor)
        assert body["mode"] == "full" and reason in body["refresh"] and body["figures"]["curve"]["data"]
    # Another run's cursor (same team) does not continue this run: its state is keyed by run.
    other, _ = make_running_run(actor=user_owner, model=model_a, max_trials=64, n_tasks=2, rounds=2, per_round=8)
    assert live(api_owner, other, cursor=first["cursor"])["mode"] == "full"
    # Too far behind, or a page holding more points than a delta may grow it to.
    monkeypatch.setattr(presenters, "LIVE_DELTA_MAX_ROWS", 10)
    run_a.fake_worker.step(16)
    assert live(api_owner, run_a, cursor=first["cursor"])["refresh"] == "too far behind"
    assert "thinned" in live(api_owner, run_a, cursor=first["cursor"], points=10**6)["refresh"]


def test_a_finished_run_gets_the_full_payload(api_owner, run_a):
    first = live(api_owner, run_a)
    run_a.fake_worker.step(16)
    run_a.fake_worker.finish()
    body = live(api_owner, run_a, cursor=first["cursor"])
    assert body["mode"] == "full" and body["run"]["status"] == "succeeded" and "finished" in body["refresh"]


@pytest.mark.parametrize("params", [
    "cursor=abc", "cursor=-1-2-3-abcdef12", "cursor=1-2-3", "cursor=1-2-3-ABCDEF12", "cursor=1.5-2-3-abcdef12",
    "cursor=9999999999999-1-1-abcdef12", "cursor=1-2-3-abcdef12-9", "cursor=%00", "cursor=1-2-3-abcdef12&points=-5",
    "cursor=1-2-3-abcdef12&points=x", "cursor=1-2-3-abcdef12&points=1e9", "points=99999999999", "points=%20",
])
def test_bad_delta_parameters_are_400_with_a_message(api_owner, run_a, params):
    resp = api_owner.get(f"/api/charts/runs/{run_a.pk}/live/?{params}")
    assert resp.status_code == 400, resp.content[:200]
    errors = resp.json()["errors"]
    assert set(errors) <= {"cursor", "points"} and all(msg for msgs in errors.values() for msg in msgs)


def test_other_teams_run_is_404_with_or_without_a_cursor(api_owner, api_other, run_a, run_b):
    cursor = live(api_owner, run_a)["cursor"]
    for client, run in ((api_other, run_a), (api_owner, run_b)):
        for query in ("", f"?cursor={cursor}", "?cursor=abc", f"?cursor={cursor}&points=x"):
            resp = client.get(f"/api/charts/runs/{run.pk}/live/{query}")
            assert resp.status_code == 404, (run.pk, query)  # scoping first: no 400 tells a run exists
            assert resp.json()["code"] == "not_found"


def test_viewer_reads_deltas_and_cannot_write(user_viewer, run_a):
    viewer = client_for(user_viewer)
    first = live(viewer, run_a)
    run_a.fake_worker.step(16)
    assert live(viewer, run_a, cursor=first["cursor"])["mode"] == "delta"
    url = f"/api/charts/runs/{run_a.pk}/live/?cursor={first['cursor']}"
    for method in (viewer.post, viewer.put, viewer.patch, viewer.delete):
        assert method(url, {}, format="json").status_code == 405


def test_delta_polls_keep_etag_and_304(api_owner, run_a):
    cursor = live(api_owner, run_a)["cursor"]
    url = f"/api/charts/runs/{run_a.pk}/live/?cursor={cursor}&points=40"
    first = api_owner.get(url)
    assert first.status_code == 200 and first["ETag"]
    assert api_owner.get(url, HTTP_IF_NONE_MATCH=first["ETag"]).status_code == 304
    run_a.fake_worker.step(16)
    changed = api_owner.get(url, HTTP_IF_NONE_MATCH=first["ETag"])
    assert changed.status_code == 200 and changed["ETag"] != first["ETag"] and changed.json()["mode"] == "delta"


def test_any_cursor_or_points_text_is_a_200_or_a_400_never_a_500(api_owner, run_a):
    from urllib.parse import urlencode

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    cursor = live(api_owner, run_a)["cursor"]
    n, last_id, next_round, digest = cursor.split("-")
    near = st.sampled_from([cursor, f"{n}-{last_id}-{next_round}-", f"{2**62}-{last_id}-{next_round}-{digest}",
                            f"0-0-0-{digest}", f"{n}-{last_id}-{2**31}-{digest}", "", " ", "null", "[]"])

    @settings(max_examples=60, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(cursor=st.one_of(near, st.text(max_size=40)), points=st.one_of(st.integers(-10, 10**12).map(str),
                                                                          st.text(max_size=12)))
    def poll(cursor, points):
        resp = api_owner.get(f"/api/charts/runs/{run_a.pk}/live/?" + urlencode({"cursor": cursor,
                                                                                 "points": points}))
        assert resp.status_code in (200, 400), (cursor, points, resp.status_code, resp.content[:200])
        if resp.status_code == 200:
            assert resp.json()["mode"] in ("full", "delta")

    poll()
