#!/usr/bin/env python
"""Dashboard render time with a big tuning run (10,000 measurements by default).

Creates the run in a throwaway SQLite database (through tuning's DatabaseSink,
as a worker would), then times with Django's test client, interleaved,
median of N:

  - the run detail page (/runs/<id>/),
  - its live JSON endpoint (/api/charts/runs/<id>/live/), full and "unchanged" (?stamp=),
  - the curve figure endpoint (/api/charts/runs/<id>/curve/),
  - the runs list (/runs/).

Baseline for the headline ratios: the same best-so-far figure at full
resolution (every measurement a point, no server-side reduction), built and
JSON-encoded in the same process; "ours" is the figure the page and the
endpoints send: the staircase reduced to its change points (lossless for the
step-shaped lines drawn) and capped at 400 points a series. Query counts per request are reported too (they
must not grow with the run's size).

    .venv/bin/python bench/dashboard_render.py [--measurements 10000] [--tasks 20] [--repeats 15]
                                               [--quick] [--json bench/results/dashboard_render.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measurements", type=int, default=10_000)
    ap.add_argument("--tasks", type=int, default=20, help="tuning tasks of the run (ResNet-18 has ~20-30)")
    ap.add_argument("--per-round", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="5 repeats (the run keeps its 10,000 measurements)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--keep-db", action="store_true", help="keep the throwaway database (path printed)")
    return ap.parse_args(argv)


def setup_django(workdir: Path) -> None:
    # A throwaway database and media dir; nothing touches the project's own.
    os.environ["DATABASE_URL"] = f"sqlite:///{workdir / 'bench.sqlite3'}"
    os.environ["DLOPT_VAR_DIR"] = str(workdir / "var")
    os.environ["DJANGO_MEDIA_ROOT"] = str(workdir / "media")
    os.environ["ONNX_COUNT_TUNING_TASKS"] = "0"  # no TVM import for the model registration
    os.environ.pop("REDIS_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def build_run(n_measurements: int, n_tasks: int, per_round: int):
    from django.contrib.auth import get_user_model

    from core import services as core_services
    from core.models import Quota
    from core.onnx_models import zoo
    from bench._support import FakeWorker
    from tuning import services as tuning_services

    user = get_user_model().objects.create_user("bench", password="bench-pw")
    team = core_services.create_team(name="Bench", owner=user)
    Quota.objects.filter(team=team).update(max_concurrent_runs=100, tuning_trials_per_month=10_000_000,
                                           energy_kwh_per_month=1e9)
    data = zoo.build_model("small_cnn").SerializeToString()
    model = core_services.register_model(team=team, name="bench-cnn", data=data, filename="cnn.onnx", actor=user)
    run = tuning_services.start_run(actor=user, model=model, max_trials=n_measurements,
                                    trials_per_round=per_round, enqueue=False)
    worker = FakeWorker(run, n_tasks=n_tasks, seed=0)
    t0 = time.perf_counter()
    done = 0
    while done < n_measurements:
        n = min(per_round, n_measurements - done)
        worker.step(n, dop=2 + (worker.round_index // 50) % 3, failures=1 if worker.round_index % 17 == 0 else 0)
        done += n
    worker.preempt(n_tasks - 1)
    build_s = time.perf_counter() - t0
    # a few more runs so the list page has rows to render
    for _ in range(30):
        tuning_services.start_run(actor=user, model=model, max_trials=64, enqueue=False)
    run.refresh_from_db()
    return user, run, build_s


def machine(**extra) -> dict:
    try:
        from bench.common import machine_info

        return machine_info(**extra)
    except Exception:  # noqa: BLE001 - the shared helper is optional here
        return {"python": platform.python_version(), "platform": platform.platform(),
                "cores": os.cpu_count(), **extra}


def timed_get(client, url: str):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        t0 = time.perf_counter()
        resp = client.get(url)
        elapsed = time.perf_counter() - t0
    assert resp.status_code == 200, (url, resp.status_code)
    return elapsed, len(resp.content), len(ctx.captured_queries), resp


def main(argv=None) -> dict:
    args = parse_args(argv)
    repeats = 5 if args.quick else args.repeats
    workdir = Path(tempfile.mkdtemp(prefix="dlopt-bench-dashboard-"))
    setup_django(workdir)

    from django.test import Client

    from frontend import presenters
    from tuning.models import Measurement

    user, run, build_s = build_run(args.measurements, args.tasks, args.per_round)
    n_meas = Measurement.objects.filter(run=run).count()
    client = Client()
    client.force_login(user)
    stamp = client.get(f"/api/charts/runs/{run.pk}/live/").json()["stamp"]

    endpoints = {
        "run_page": f"/runs/{run.pk}/",
        "live_json": f"/api/charts/runs/{run.pk}/live/",
        "live_json_unchanged": f"/api/charts/runs/{run.pk}/live/?stamp={stamp}",
        "curve_json": f"/api/charts/runs/{run.pk}/curve/",
        "runs_list": "/runs/",
    }
    samples: dict[str, list[float]] = {k: [] for k in endpoints}
    sizes: dict[str, int] = {}
    queries: dict[str, int] = {}
    baseline_s: list[float] = []
    ours_s: list[float] = []
    baseline_bytes = ours_bytes = 0
    baseline_points = ours_points = 0

    for url in endpoints.values():  # warm-up (imports, template compilation)
        timed_get(client, url)
    for _ in range(repeats):  # interleaved
        for name, url in endpoints.items():
            elapsed, size, nq, _ = timed_get(client, url)
            samples[name].append(elapsed)
            sizes[name], queries[name] = size, nq
        t0 = time.perf_counter()
        full = json.dumps(presenters.run_curve_figure(run, full_resolution=True))
        baseline_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        thin = json.dumps(presenters.run_curve_figure(run, n_tasks=args.tasks))
        ours_s.append(time.perf_counter() - t0)
        baseline_bytes, ours_bytes = len(full), len(thin)
        baseline_points = sum(len(t["x"]) for t in json.loads(full)["data"])
        ours_points = sum(len(t["x"]) for t in json.loads(thin)["data"])

    med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    overall = {
        "run_page_ms": round(med["run_page"], 1),
        "live_json_ms": round(med["live_json"], 1),
        "live_json_unchanged_ms": round(med["live_json_unchanged"], 1),
        "curve_json_ms": round(med["curve_json"], 1),
        "runs_list_ms": round(med["runs_list"], 1),
        "curve_build_ratio": round(statistics.median(ours_s) / statistics.median(baseline_s), 3),
        "curve_bytes_ratio": round(ours_bytes / baseline_bytes, 4),
        "curve_points_ratio": round(ours_points / baseline_points, 4),
        "max_queries_per_request": max(queries.values()),
    }
    result = {
        "overall": overall,
        "workloads": [{
            "measurements": n_meas, "tasks": args.tasks, "per_round": args.per_round,
            "rounds": n_meas // args.per_round + (1 if n_meas % args.per_round else 0), "repeats": repeats,
            "build_run_s": round(build_s, 2),
            "median_ms": {k: round(v, 2) for k, v in med.items()},
            "bytes": sizes, "queries": queries,
            "curve": {"baseline_full_resolution": {"median_ms": round(statistics.median(baseline_s) * 1e3, 2),
                                                   "bytes": baseline_bytes, "points": baseline_points},
                      "ours_change_points": {"median_ms": round(statistics.median(ours_s) * 1e3, 2),
                                           "bytes": ours_bytes, "points": ours_points}},
        }],
        "machine": machine(database="sqlite (throwaway file)", threads=1,
                           server="Django test client, in process (no network, no browser)"),
    }

    print(f"Dashboard render, run of {n_meas:,} measurements / {args.tasks} tasks "
          f"(built in {build_s:.1f} s), median of {repeats}, SQLite, 1 thread")
    print(f"{'endpoint':<24}{'median ms':>11}{'KB':>9}{'queries':>9}")
    for name in endpoints:
        print(f"{name:<24}{med[name]:>11.1f}{sizes[name] / 1024:>9.1f}{queries[name]:>9}")
    print(f"curve figure, full resolution (baseline): {statistics.median(baseline_s) * 1e3:7.1f} ms "
          f"{baseline_bytes / 1024:8.1f} KB {baseline_points:7,} points")
    print(f"curve figure, change points (ours):       {statistics.median(ours_s) * 1e3:7.1f} ms "
          f"{ours_bytes / 1024:8.1f} KB {ours_points:7,} points")
    print("overall:", json.dumps(overall))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")
    if args.keep_db:
        print(f"database kept: {workdir / 'bench.sqlite3'}")
    else:
        import shutil

        from django.db import connections

        connections.close_all()
        shutil.rmtree(workdir, ignore_errors=True)
    return result


if __name__ == "__main__":
    main()
