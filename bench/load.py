#!/usr/bin/env python
"""API load test: gunicorn + PostgreSQL + Redis on loopback, 200 concurrent users.

Seeds a throwaway PostgreSQL database (default `dlopt_bench_load`, dropped and re-created) with one
team, 20 users with API tokens, 20 models and 100 tuning runs holding 100,000 measurements (one long
run of 50,000, the rest 500 each), starts gunicorn on a free loopback port (default 4 sync workers,
as deployed: docker-compose runs sync workers; gthread with keep-alive is an option), and drives it
with a small asyncio HTTP/1.1 client (a keep-alive connection per user where the server keeps it
open; no third-party client):

  1. paced: USERS users together send RATE requests/s (each user one request every USERS/RATE s) for
     DURATION s. Latency is measured from each request's *scheduled* time, so a slow answer that
     delays a user's next request is counted too (no coordinated omission).
  2. the same at each of --also-rates (default 100 and 150 req/s): where the knee is;
  3. saturation: the same users with no pause, for a shorter time: the throughput ceiling.

The request mix is what the dashboard's users send (issue 17): live-page polls (55 %: each user watches
one run, a running one for half of the users, sending If-None-Match with the last ETag, as
dashboard.js does; an unchanged run is a 304), run list (12 %), run detail (12 %), model list (8 %), the
curve chart JSON (8 %, also conditional) and trace uploads (5 %, a small Philly CSV, POST
/api/traces/), with a different user's token per user. While the load runs, a pretend worker bumps every
running run's version every 2 s (as the tuning sink's heartbeat does), so polls of running runs keep
missing their ETag and fetch a new payload, built once per version (figure cache). With --worker-round N
(default 32) each beat is a round: N more measurements, a DOP round and a task row's trial count, so a
changed poll has something new to show. Before the measured phases every user opens its run's live page
once (full payload); pages stay open across phases. --poll delta (default) polls as dashboard.js does
now (?stamp=&cursor=&points= of the previous answer: a changed poll is a delta), --poll full as before
(the whole payload on every change). The in-process profile also times a changed poll of the largest
run both ways (live_poll_changed_full / live_poll_changed_delta: bytes and ms).
The upload throttle (60/hour a user) is lifted for the run: the bench measures the server's cost. Before the load, each endpoint is also timed in-process (Django
test client, median of N, SQL query count) - that is where the time goes when the goal is missed.

Prints a table and, with --json PATH, writes
{"overall": {"rps", "p50_ms", "p99_ms", "errors", ...}, "phases": {...}, "endpoints": {...}, "machine": {...}}
where "overall" is the paced phase at --rate. Stops by itself (hard timeout per phase); everything on 127.0.0.1.

    .venv/bin/python bench/load.py [--quick] [--users 200] [--rate 200] [--duration 30]
                                   [--workers 4] [--worker-class sync|gthread] [--threads 4]
                                   [--also-rates 100,150] [--json bench/results/load.json]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/dlopt_bench_load"
MIX = (("live_poll", 0.55), ("run_list", 0.12), ("run_detail", 0.12), ("model_list", 0.08), ("chart_curve", 0.08),
       ("trace_upload", 0.05))
WORKER_BEAT_S = 2.0  # the tuning sink's heartbeat: a running run's version changes this often
UPLOAD_CSV = ("timestamp,duration,num_gpus,gpu_time,cluster\n" + "".join(
    f"2017-10-09 06:{m:02d}:00,{300 + 60 * m},{1 + m % 4},{(300 + 60 * m) * (1 + m % 4)},c1\n" for m in range(40)))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=200)
    ap.add_argument("--rate", type=float, default=200.0, help="requests/s of the paced phase, all users together")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of the paced phase")
    ap.add_argument("--saturation", type=float, default=15.0, help="seconds of the no-pause phase (0 = skip)")
    ap.add_argument("--also-rates", default="100,300", help="comma-separated extra paced rates (req/s), reported "
                    "beside the main one ('' = none)")
    ap.add_argument("--measurements", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--models", type=int, default=20)
    ap.add_argument("--workers", type=int, default=4, help="gunicorn worker processes")
    ap.add_argument("--threads", type=int, default=4, help="threads per gunicorn worker (gthread only)")
    ap.add_argument("--worker-class", default="sync", choices=["gthread", "sync"],
                    help="gunicorn worker class (sync: no keep-alive, a connection per request)")
    ap.add_argument("--database-url", default=os.environ.get("LOAD_DATABASE_URL", DEFAULT_DB),
                    help="PostgreSQL database to (re)create for the test; its name must contain 'bench'")
    ap.add_argument("--redis-url", default=os.environ.get("LOAD_REDIS_URL", "redis://127.0.0.1:6379/14"))
    ap.add_argument("--reuse-db", action="store_true", help="keep an already seeded database")
    ap.add_argument("--keep-db", action="store_true", help="do not drop the database at the end")
    ap.add_argument("--repeats", type=int, default=30, help="in-process timings per endpoint")
    ap.add_argument("--quick", action="store_true", help="10 s paced + 5 s saturation, 10 in-process repeats")
    ap.add_argument("--poll", default="delta", choices=["delta", "full"],
                    help="how live polls ask: delta = as dashboard.js does now (If-None-Match, ?stamp= and "
                    "?cursor= of the previous answer: a changed poll gets only what is new); full = the poller "
                    "before (If-None-Match only: every changed poll gets the whole payload)")
    ap.add_argument("--worker-round", type=int, default=32,
                    help="measurements (one round) the pretend worker appends to every running run at each "
                    "beat, as a tuning worker does (0 = heartbeat only: the version changes, nothing shown)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--seed-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker_class == "sync":
        args.threads = 1  # gunicorn would silently switch a sync worker with threads > 1 to gthread
    if args.quick:
        args.duration, args.saturation, args.repeats = min(args.duration, 10.0), min(args.saturation, 5.0), 10
    return args


# --- database and seeding (run in a child process: the load generator stays Django-free) ---------------

def _admin_dsn(url: str) -> tuple[str, str]:
    from urllib.parse import urlparse

    u = urlparse(url)
    name = u.path.lstrip("/")
    if "bench" not in name:
        raise SystemExit(f"refusing to drop/create database {name!r}: its name must contain 'bench'")
    return url.replace("postgres://", "postgresql://", 1).rsplit("/", 1)[0] + "/postgres", name


def recreate_database(url: str) -> None:
    import psycopg

    admin, name = _admin_dsn(url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(url: str) -> None:
    import psycopg

    admin, name = _admin_dsn(url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def server_env(args, workdir: Path) -> dict:
    env = dict(os.environ)
    env.update(DATABASE_URL=args.database_url, REDIS_URL=args.redis_url, DLOPT_VAR_DIR=str(workdir / "var"),
               DJANGO_MEDIA_ROOT=str(workdir / "media"), DJANGO_SETTINGS_MODULE="config.settings",
               ONNX_COUNT_TUNING_TASKS="0", DJANGO_DEBUG="0", DJANGO_LOG_LEVEL="WARNING",
               DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost,testserver", PYTHONPATH=str(ROOT),
               API_THROTTLE_UPLOADS="1000000/hour",
               # Redis as the shared Django cache, as deployed (docker-compose): the web workers share the
               # figure bodies per run version and the live cursors' states (per-process memory otherwise).
               DJANGO_CACHE_URL=args.redis_url)
    env.pop("CELERY_BROKER_URL", None)
    return env


def seed_child(spec: dict) -> dict:
    """Runs inside Django: migrate, seed, time each endpoint in-process. Returns what the driver needs."""
    import django

    django.setup()
    from django.core.management import call_command

    if not spec["reuse"]:
        call_command("migrate", verbosity=0, interactive=False)
    from django.contrib.auth import get_user_model

    from core.models import ApiToken, DLModel
    from tuning.models import Measurement, TuningRun

    User = get_user_model()
    t0 = time.perf_counter()
    if not spec["reuse"] or not TuningRun.objects.exists():
        _seed(spec)
    seed_s = time.perf_counter() - t0
    from core import services as core_services

    users = list(User.objects.filter(username__startswith="load-").order_by("username"))
    ApiToken.objects.filter(user__in=users, name="load").delete()
    tokens = [core_services.create_api_token(user=u, name="load").key for u in users]
    run_ids = list(TuningRun.objects.order_by("pk").values_list("pk", flat=True))
    running_ids = list(TuningRun.objects.filter(status="running").order_by("pk").values_list("pk", flat=True))
    big = TuningRun.objects.order_by("-trials_done").first()
    profile = _profile_endpoints(users[0], run_ids, big, spec["repeats"])
    from core.models import Team

    return {"tokens": tokens, "run_ids": run_ids, "running_ids": running_ids, "models": DLModel.objects.count(),
            "team_id": Team.objects.get(name="Load team").pk,
            "measurements": Measurement.objects.count(), "runs": len(run_ids), "seed_s": seed_s,
            "endpoints": profile}


def _seed(spec: dict) -> None:
    import random as rnd

    from django.contrib.auth import get_user_model
    from django.db import transaction
    from django.utils import timezone

    from core import services as core_services
    from core.models import Membership, Quota
    from core.onnx_models import zoo
    from tuning.models import DopRound, Measurement, TuningRun, TuningTask

    rng = rnd.Random(0)
    User = get_user_model()
    owner = User.objects.create_user("load-00", password="load-pw")
    team = core_services.create_team(name="Load team", owner=owner)
    Quota.objects.filter(team=team).update(max_concurrent_runs=10_000, tuning_trials_per_month=10**9,
                                           energy_kwh_per_month=1e9)
    for i in range(1, 20):
        u = User.objects.create_user(f"load-{i:02d}", password="load-pw")
        Membership.objects.create(team=team, user=u, role=Membership.Role.MEMBER)
    data = zoo.build_model("small_cnn").SerializeToString()
    validated = core_services.validate_model_bytes(data=data, filename="m.onnx")
    models = [core_services.register_model(team=team, name=f"model-{i:02d}", data=data, filename="m.onnx",
                                           actor=owner, validated=validated) for i in range(spec["models"])]
    n_runs, total = spec["runs"], spec["measurements"]
    big_n = total // 2
    rest = (total - big_n) // max(1, n_runs - 1)
    now = timezone.now()
    statuses = ["succeeded"] * 7 + ["running", "failed", "cancelled"]
    for k in range(n_runs):
        n = big_n if k == 0 else rest
        if k == n_runs - 1:
            n = total - big_n - rest * (n_runs - 2)
        status = "running" if k == 0 else statuses[k % len(statuses)]
        with transaction.atomic():
            run = TuningRun.objects.create(
                team=team, model=models[k % len(models)], created_by=owner,
                target={"kind": "llvm", "num-cores": 2}, target_kind="llvm", max_trials=max(n, 1),
                trials_per_round=32, status=status, trials_done=n, started_at=now, wall_seconds=n * 0.4,
                estimated_latency_s=1e-3, final_dop=2, mean_parallel_error=0.01, energy_joules=n * 12.0,
                energy_source="modeled", grid_intensity_g_per_kwh=400.0,
                summary={"tasks": [{"index": i, "name": f"fused_op_{i}", "best_s": 1e-4 * (i + 1),
                                    "trials": n // 4} for i in range(4)], "dop_history": list(range(1, 30)),
                         "note": "seeded by bench/load.py"},
                finished_at=now if status != "running" else None)
            tasks = TuningTask.objects.bulk_create([
                TuningTask(run=run, index=i, name=f"fused_op_{i}", flops=1e7 * (i + 1), weight=1.0 + i,
                           trials=n // 4, best_latency_s=1e-4 * (i + 1), status="done") for i in range(4)])
            rows = []
            for j in range(n):
                lat = rng.uniform(1e-4, 1e-3)
                rows.append(Measurement(run=run, task=tasks[j % 4], round_index=j // 32, candidate_key=f"c{j:07d}",
                                        run_secs=[lat, lat * 1.01, lat * 0.99], latency_s=lat, build_secs=0.2,
                                        run_wall_secs=0.01, worker="seed", dop=2))
                if len(rows) == 5000:
                    Measurement.objects.bulk_create(rows)
                    rows = []
            Measurement.objects.bulk_create(rows)
            DopRound.objects.bulk_create([DopRound(run=run, round_index=r, task_index=r % 4, dop=2, mean_error=0.01,
                                                   n_candidates=32) for r in range(max(1, n // 32))])
    from django.db import connection

    with connection.cursor() as c:
        c.execute("ANALYZE")


def _profile_endpoints(user, run_ids, big_run, repeats) -> dict:
    """In-process median time and SQL queries per endpoint (no network, no concurrency)."""
    from django.core.cache import cache
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from rest_framework.test import APIClient

    from core import services as core_services

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {core_services.create_api_token(user=user, name='profile').key}")
    last_page = max(1, (big_run.trials_done + 49) // 50)
    urls = {"run_list": "/api/runs/", "run_detail": f"/api/runs/{run_ids[len(run_ids) // 2]}/",
            "model_list": "/api/models/",
            "measurements_first_page": f"/api/runs/{big_run.pk}/measurements/",
            "measurements_last_page": f"/api/runs/{big_run.pk}/measurements/?page={last_page}",
            "quota_usage": "/api/quotas/",
            "live_poll_uncached": f"/api/charts/runs/{big_run.pk}/live/",
            "live_poll_200_cached": f"/api/charts/runs/{big_run.pk}/live/",
            "live_poll_304": f"/api/charts/runs/{big_run.pk}/live/",
            "chart_curve_cached": f"/api/charts/runs/{big_run.pk}/curve/"}
    out = {}
    out.update(_profile_changed_polls(client, big_run, repeats))
    for name, url in urls.items():
        first = client.get(url)  # warm (and the figure cache)
        headers = {"HTTP_IF_NONE_MATCH": first["ETag"]} if name.endswith("_304") else {}
        expect = 304 if headers else 200
        times, cpu, queries, size = [], [], 0, 0
        for _ in range(repeats):
            if name.endswith("_uncached"):
                cache.clear()  # the body is built (selectors, presenters, Plotly): the poll before issue 17
            with CaptureQueriesContext(connection) as ctx:
                t, c = time.perf_counter(), time.process_time()
                resp = client.get(url, **headers)
                times.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
            assert resp.status_code == expect, (url, resp.status_code, resp.content[:200])
            queries, size = len(ctx.captured_queries), len(resp.content)
            slowest = max(ctx.captured_queries, key=lambda q: float(q["time"]), default={"time": 0, "sql": ""})
        out[name] = {"url": url, "median_ms": statistics.median(times) * 1e3, "queries": queries, "bytes": size,
                     "cpu_ms": statistics.median(cpu) * 1e3,
                     "slowest_query_ms": float(slowest["time"]) * 1e3,
                     "slowest_query": slowest["sql"][:160]}
    return out


def append_round_orm(run, n: int = 32) -> None:
    """What a tuning worker's round does to the run (in-process twin of pretend_worker's SQL): `n` more
    measurements (copies of the last ones, latencies jittered), one more DOP round, a task row's trial
    count and the run's trials_done (the queryset update bumps the run's version)."""
    import random as rnd

    from django.db import transaction
    from django.db.models import F, Max

    from tuning.models import DopRound, Measurement, TuningRun, TuningTask

    with transaction.atomic():
        last = list(Measurement.objects.filter(run=run).order_by("-id")[:n])
        nxt = (DopRound.objects.filter(run=run).aggregate(m=Max("round_index"))["m"] or 0) + 1
        for m in last:
            m.pk = None
            m.candidate_key = f"p{nxt}-{rnd.getrandbits(40):010x}"
            m.round_index = nxt
            m.latency_s = m.latency_s * rnd.uniform(0.8, 1.2) if m.latency_s else m.latency_s
        Measurement.objects.bulk_create(last)
        DopRound.objects.create(run=run, round_index=nxt, task_index=nxt % 4, dop=2, mean_error=0.01,
                                n_candidates=n)
        TuningTask.objects.filter(run=run, index=nxt % 4).update(trials=F("trials") + n)
        TuningRun.objects.filter(pk=run.pk).update(trials_done=F("trials_done") + len(last))


def _profile_changed_polls(client, run, repeats: int) -> dict:
    """A changed poll of the largest running run, before and after the delta: the worker appends a round,
    then the page polls. full = no cursor (the poller before: the whole payload is rebuilt for the new
    version); delta = ?stamp=&cursor=&points= of the previous answer (dashboard.js now)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    url = f"/api/charts/runs/{run.pk}/live/"
    out = {}
    for name in ("live_poll_changed_full", "live_poll_changed_delta"):
        body = client.get(url).json()
        times, cpu, sizes, queries, modes = [], [], [], 0, {}
        for _ in range(repeats):
            append_round_orm(run)
            query = "" if name.endswith("_full") else (
                f"?stamp={quote(body['stamp'])}&cursor={body['cursor']}&points={_points(body, 0)}")
            with CaptureQueriesContext(connection) as ctx:
                t, c = time.perf_counter(), time.process_time()
                resp = client.get(url + query)
                times.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
            assert resp.status_code == 200, (url, resp.status_code, resp.content[:200])
            points = _points(body, 0)
            body = resp.json()
            body["_points"] = _points(body, points)
            modes[body.get("mode")] = modes.get(body.get("mode"), 0) + 1
            queries = len(ctx.captured_queries)
            sizes.append(len(resp.content))
        out[name] = {"url": url + ("" if name.endswith("_full") else "?stamp=…&cursor=…&points=…"),
                     "median_ms": statistics.median(times) * 1e3, "cpu_ms": statistics.median(cpu) * 1e3,
                     "queries": queries, "bytes": int(statistics.median(sizes)), "modes": modes,
                     "slowest_query_ms": 0.0, "slowest_query": ""}
    return out


def _points(body: dict, before: int) -> int:
    """The most points one curve trace of the page holds after applying `body` (what dashboard.js sends)."""
    if "_points" in body:
        return body["_points"]
    if body.get("mode") == "delta":
        xs = (body.get("extend") or {}).get("curve", {}).get("x") or []
        return before + max((len(x) for x in xs), default=0)
    if body.get("figures"):
        return max((len(t.get("x") or []) for t in body["figures"]["curve"]["data"]), default=0)
    return before


# --- the HTTP client -----------------------------------------------------------------------------------

class Conn:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def close(self):
        if self.writer is not None:
            self.writer.close()
            try:  # bounded: a busy sync worker may not close its end for a long time (the phase timed out on it)
                await asyncio.wait_for(self.writer.wait_closed(), timeout=2.0)
            except Exception:  # noqa: BLE001
                pass
        self.reader = self.writer = None

    async def get(self, path: str, token: str) -> tuple[int, int]:
        status, length, _ = await self.request("GET", path, token)
        return status, length

    async def request(self, method: str, path: str, token: str, headers: dict | None = None,
                      body: bytes = b"", keep: bool = False) -> tuple[int, int, str | None]:
        """(status, body bytes, ETag or None); with keep, the body itself is in self.body."""
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        if body:
            extra += f"Content-Length: {len(body)}\r\n"
        req = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nAuthorization: Token {token}\r\n"
               f"Accept: application/json\r\n{extra}Connection: keep-alive\r\n\r\n").encode() + body
        for attempt in (1, 2):  # a keep-alive connection the server closed meanwhile: reconnect once
            fresh = self.writer is None
            if fresh:
                self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            try:
                self.writer.write(req)
                await self.writer.drain()
                status_line = await self.reader.readline()
                if not status_line:
                    raise ConnectionResetError("closed by server")
                status = int(status_line.split()[1])
                length, close, chunked, etag = 0, False, False, None
                while True:
                    line = await self.reader.readline()
                    if line in (b"\r\n", b"\n", b""):
                        break
                    key, _, value = line.decode("latin-1").partition(":")
                    key, value = key.strip().lower(), value.strip().lower()
                    if key == "content-length":
                        length = int(value)
                    elif key == "connection" and value == "close":
                        close = True
                    elif key == "transfer-encoding" and "chunked" in value:
                        chunked = True
                    elif key == "etag":
                        etag = line.decode("latin-1").partition(":")[2].strip()
                if chunked:
                    length, chunks = 0, []
                    while True:
                        size = int((await self.reader.readline()).strip() or b"0", 16)
                        chunks.append((await self.reader.readexactly(size + 2))[:size])
                        length += size
                        if size == 0:
                            break
                    data = b"".join(chunks)
                else:
                    data = await self.reader.readexactly(length)
                self.body = data if keep else b""
                if close:
                    await self.close()
                return status, length, etag
            except (ConnectionError, asyncio.IncompleteReadError, OSError):
                await self.close()
                if fresh or attempt == 2:
                    raise
        raise RuntimeError("unreachable")


def multipart(fields: dict, filename: str, content: bytes) -> tuple[str, bytes]:
    boundary = f"load{random.getrandbits(64):016x}"
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
             for k, v in fields.items()]
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
                 f"Content-Type: text/csv\r\n\r\n".encode() + content + b"\r\n")
    return f"multipart/form-data; boundary={boundary}", b"".join(parts) + f"--{boundary}--\r\n".encode()


def watched_run(u: int, plan: dict) -> int:
    """The run user u keeps open on the live page: a running one for half of the users."""
    running = plan["running_ids"] or plan["run_ids"]
    return running[u % len(running)] if u % 2 == 0 else plan["run_ids"][u % len(plan["run_ids"])]


def pick(rng: random.Random, plan: dict, u: int, n: int) -> tuple[str, str, str, bytes, dict]:
    """(endpoint, method, path, body, headers) of user u's n-th request."""
    r, acc = rng.random(), 0.0
    for name, weight in MIX:  # noqa: B007 - the name the loop stops at is the pick
        acc += weight
        if r <= acc:
            break
    if name == "run_detail":
        return name, "GET", f"/api/runs/{rng.choice(plan['run_ids'])}/", b"", {}
    if name == "live_poll":
        return name, "GET", f"/api/charts/runs/{watched_run(u, plan)}/live/", b"", {}
    if name == "chart_curve":
        return name, "GET", f"/api/charts/runs/{watched_run(u, plan)}/curve/", b"", {}
    if name == "trace_upload":
        ctype, body = multipart({"team": plan["team_id"], "name": f"load-{plan['phase_seed']}-{u}-{n}"},
                                "load.csv", UPLOAD_CSV.encode())
        return name, "POST", "/api/traces/", body, {"Content-Type": ctype}
    return name, "GET", {"run_list": "/api/runs/", "model_list": "/api/models/"}[name], b"", {}


async def pretend_worker(database_url: str, running_ids: list[int], until: float, per_beat: int = 0) -> int:
    """Every WORKER_BEAT_S s, what the tuning sink does to every running run: a heartbeat (the version
    changes), and with per_beat > 0 a round: `per_beat` more measurements (copies of the run's last ones,
    latencies jittered), a DOP round, a task row's trial count and trials_done (as append_round_orm)."""
    import psycopg

    loop = asyncio.get_running_loop()
    beats = 0

    def beat():
        with psycopg.connect(database_url.replace("postgres://", "postgresql://", 1), autocommit=True) as conn, \
                conn.transaction():  # a round and the version bump that shows it land together
            if per_beat > 0:
                for run_id in running_ids:
                    nxt = conn.execute("SELECT coalesce(max(round_index), 0) + 1 FROM tuning_dopround "
                                       "WHERE run_id = %s", (run_id,)).fetchone()[0]
                    added = conn.execute(
                        "INSERT INTO tuning_measurement (run_id, task_id, round_index, candidate_key, run_secs, "
                        "latency_s, build_secs, run_wall_secs, error, worker, dop, remeasured_serially, "
                        "serial_secs, created_at) SELECT run_id, task_id, %s, 'b' || %s || '-' || id, run_secs, "
                        "latency_s * (0.8 + random() * 0.4), build_secs, run_wall_secs, '', 'bench', dop, false, "
                        "NULL, now() FROM (SELECT * FROM tuning_measurement WHERE run_id = %s ORDER BY id DESC "
                        "LIMIT %s) m", (nxt, nxt, run_id, per_beat)).rowcount
                    conn.execute("INSERT INTO tuning_dopround (run_id, round_index, task_index, dop, mean_error, "
                                 "n_candidates, n_remeasured, n_failures, created_at) "
                                 "VALUES (%s, %s, %s, 2, 0.01, %s, 0, 0, now())",
                                 (run_id, nxt, nxt % 4, per_beat))
                    conn.execute("UPDATE tuning_tuningtask SET trials = trials + %s WHERE run_id = %s AND "
                                 "index = %s", (added, run_id, nxt % 4))
                    conn.execute("UPDATE tuning_tuningrun SET trials_done = trials_done + %s WHERE id = %s",
                                 (added, run_id))
            conn.execute("UPDATE tuning_tuningrun SET version = version + 1, changed_at = now(), "
                         "heartbeat_at = now() WHERE id = ANY(%s)", (running_ids,))

    while running_ids and loop.time() < until:
        await asyncio.to_thread(beat)
        beats += 1
        await asyncio.sleep(WORKER_BEAT_S)
    return beats


async def open_pages(port: int, plan: dict, *, users: int, parallel: int = 4) -> int:
    """Each user opens its run's live page once (the full payload), as a browser tab does before polling:
    the measured phases then see the polls of open pages. Returns how many pages were opened."""
    gate = asyncio.Semaphore(parallel)

    async def one(u: int) -> None:
        async with gate:
            conn = Conn("127.0.0.1", port)
            path = f"/api/charts/runs/{watched_run(u, plan)}/live/"
            try:
                status, _, etag = await asyncio.wait_for(
                    conn.request("GET", path, plan["tokens"][u % len(plan["tokens"])], keep=True), timeout=60)
            finally:
                await conn.close()
            if status == 200:
                answer = json.loads(conn.body)
                page = plan["pages"].setdefault(u, {"etags": {}, "live": {}})
                page["etags"][path] = etag
                if plan["poll"] == "delta":
                    page["live"].update(stamp=answer["stamp"], cursor=answer.get("cursor"),
                                        points=_points(answer, 0))

    await asyncio.gather(*(one(u) for u in range(users)))
    return sum(1 for page in plan["pages"].values() if page["etags"])


async def phase(port: int, plan: dict, *, users: int, duration: float, rate: float | None, seed: int,
                database_url: str | None = None, per_beat: int = 0) -> dict:
    """rate=None: no pause (saturation). Returns latencies (s) per endpoint, errors, 304s, wall time."""
    results: list[tuple[str, float, bool]] = []
    errors: dict[str, int] = {}
    not_modified = {"live_poll": 0, "chart_curve": 0}
    modes: dict[str, int] = {}  # live answers by mode (poll=delta)
    plan = {**plan, "phase_seed": f"{seed}-{random.getrandbits(24):06x}"}
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.5
    end = start + duration
    interval = users / rate if rate else 0.0

    async def user(u: int):
        rng = random.Random(seed * 100_000 + u)
        conn = Conn("127.0.0.1", port)
        token = plan["tokens"][u % len(plan["tokens"])]
        scheduled = start + (u / rate if rate else 0.0)
        # What the user's open page remembers, kept across phases (a dashboard tab stays open): the ETag per
        # path, and the stamp, cursor and curve points of the last live answer (poll=delta).
        etags: dict[str, str] = plan["pages"].setdefault(u, {"etags": {}, "live": {}})["etags"]
        live: dict = plan["pages"][u]["live"]
        n = 0
        try:
            while True:
                if rate:
                    delay = scheduled - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                if scheduled >= end or loop.time() >= end:
                    return
                name, method, path, body, headers = pick(rng, plan, u, n)
                n += 1
                key = path  # one ETag per page, whatever the query (as dashboard.js keeps it)
                if path in etags:
                    headers = {**headers, "If-None-Match": etags[path]}
                delta = name == "live_poll" and plan["poll"] == "delta"
                if delta and live.get("stamp"):
                    path += f"?stamp={quote(live['stamp'])}"
                    if live.get("cursor"):
                        path += f"&cursor={live['cursor']}&points={live['points']}"
                sent = loop.time()
                t0 = scheduled if rate else sent
                try:
                    status, _, etag = await asyncio.wait_for(
                        conn.request(method, path, token, headers, body, keep=delta), timeout=10.0)
                    ok = status in (200, 201) or (status == 304 and "If-None-Match" in headers)
                    if status == 304 and ok:
                        not_modified[name] += 1
                    if etag and status == 200:
                        etags[key] = etag
                    if delta and status == 200:
                        answer = json.loads(conn.body)
                        modes[answer.get("mode", "?")] = modes.get(answer.get("mode", "?"), 0) + 1
                        live.update(stamp=answer["stamp"],
                                    cursor=answer.get("cursor", live.get("cursor")),  # none when unchanged
                                    points=_points(answer, live.get("points", 0)))
                    if not ok:
                        errors[f"HTTP {status}"] = errors.get(f"HTTP {status}", 0) + 1
                except Exception as exc:  # noqa: BLE001 - every failure is an error of the run
                    ok = False
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    await conn.close()
                results.append((name, loop.time() - t0, ok))
                scheduled += interval if rate else 0.0
                if not rate:
                    scheduled = loop.time()
        finally:
            await conn.close()

    t0 = loop.time()
    jobs = [user(u) for u in range(users)]
    if database_url:
        jobs.append(pretend_worker(database_url, plan["running_ids"], end, per_beat))
    done = await asyncio.wait_for(asyncio.gather(*jobs), timeout=duration + 60)
    wall = max(loop.time() - t0 - 0.5, 1e-9)
    return {"results": results, "errors": errors, "wall": wall, "not_modified": not_modified,
            "worker_beats": done[-1] if database_url else 0, "live_modes": modes}


def summarize(res: dict, duration: float) -> dict:
    lat = sorted(t for _, t, ok in res["results"] if ok)
    n = len(res["results"])
    out = {"requests": n, "errors": n - len(lat), "error_kinds": res["errors"], "rps": len(lat) / duration,
           "not_modified": res.get("not_modified", {}), "worker_beats": res.get("worker_beats", 0),
           "live_modes": res.get("live_modes", {}), **_pcts(lat)}
    per = {}
    for name, _ in MIX:
        sub = sorted(t for k, t, ok in res["results"] if k == name and ok)
        per[name] = {"requests": sum(1 for k, _, _ in res["results"] if k == name), **_pcts(sub)}
    out["endpoints"] = per
    return out


def _pcts(lat: list[float]) -> dict:
    if not lat:
        return {"p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None}
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3  # noqa: E731
    return {"p50_ms": q(0.50), "p90_ms": q(0.90), "p99_ms": q(0.99), "max_ms": lat[-1] * 1e3}


# --- the server ------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_gunicorn(args, env: dict, workdir: Path, token: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    log = open(workdir / "gunicorn.log", "wb")
    cmd = [sys.executable, "-m", "gunicorn", "config.wsgi:application", "--bind", f"127.0.0.1:{port}",
           "--workers", str(args.workers), "--worker-class", args.worker_class, "--threads", str(args.threads),
           "--keep-alive", "30", "--backlog", "2048", "--timeout", "60", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((workdir / "gunicorn.log").read_text(errors="replace")[-3000:])
        try:
            status, _ = asyncio.run(Conn("127.0.0.1", port).get("/api/me/", token))
            if status == 200:
                return proc, port
        except OSError:
            pass
        time.sleep(0.3)
    stop(proc)
    raise RuntimeError("gunicorn did not answer in 60 s")


def drain(port: int, token: str, *, limit_s: float = 90.0) -> float:
    """Wait until the server answers a light request within 0.5 s again: requests the load generator gave up
    on (timeouts) stay queued in gunicorn's backlog, and would otherwise count against the next phase."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        t = time.monotonic()
        try:
            status, _ = asyncio.run(asyncio.wait_for(Conn("127.0.0.1", port).get("/api/me/", token), timeout=5))
            if status == 200 and time.monotonic() - t < 0.5:
                break
        except (TimeoutError, OSError):
            pass
        time.sleep(0.5)
    return time.monotonic() - t0


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


class CpuMeter:
    """CPU used during a phase (in cores) by the server (gunicorn tree), PostgreSQL (all its processes:
    other databases' work included), this load generator, and everything else on the machine (other jobs
    sharing the cores distort the figures: reported)."""

    def __init__(self, proc: subprocess.Popen):
        import psutil

        self.proc, self.psutil = proc, psutil

    def _busy(self) -> float:
        t = self.psutil.cpu_times()
        return sum(t) - t.idle - getattr(t, "iowait", 0.0)

    def _postgres(self) -> dict[int, float]:
        out = {}
        for p in self.psutil.process_iter(["name", "cpu_times"]):
            if p.info["name"] in ("postgres", "postmaster") and p.info["cpu_times"] is not None:
                out[p.pid] = p.info["cpu_times"].user + p.info["cpu_times"].system
        return out

    def __enter__(self):
        self.t0, self.s0, self.c0, self.b0 = time.monotonic(), server_cpu_seconds(self.proc), time.process_time(), \
            self._busy()
        self.pg0 = self._postgres()
        return self

    def __exit__(self, *exc):
        wall = time.monotonic() - self.t0
        server = server_cpu_seconds(self.proc) - self.s0
        client = time.process_time() - self.c0
        pg1 = self._postgres()
        database = sum(v - self.pg0.get(pid, 0.0) for pid, v in pg1.items())
        busy = self._busy() - self.b0
        self.cores = {"server": server / wall, "database": database / wall, "load_generator": client / wall,
                      "other": max(0.0, busy - server - client - database) / wall}


def server_cpu_seconds(proc: subprocess.Popen) -> float:
    import psutil

    try:
        p = psutil.Process(proc.pid)
        procs = [p, *p.children(recursive=True)]
        return sum(x.cpu_times().user + x.cpu_times().system for x in procs)
    except psutil.Error:
        return float("nan")


# --- main ---------------------------------------------------------------------------------------------------

def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.seed_child:
        spec = json.loads(Path(args.seed_child).read_text())
        Path(spec["out"]).write_text(json.dumps(seed_child(spec)))
        return {}
    workdir = Path(tempfile.mkdtemp(prefix="dlopt-bench-load-"))
    env = server_env(args, workdir)
    if not args.reuse_db:
        recreate_database(args.database_url)
    try:
        return _run(args, env, workdir)
    finally:
        if not args.keep_db:
            drop_database(args.database_url)


def _run(args, env: dict, workdir: Path) -> dict:
    spec_path = workdir / "seed.json"
    spec_path.write_text(json.dumps({"out": str(workdir / "seeded.json"), "reuse": args.reuse_db,
                                     "runs": args.runs, "models": args.models, "measurements": args.measurements,
                                     "repeats": args.repeats}))
    print(f"seeding {args.measurements:,} measurements in {args.runs} runs, {args.models} models "
          f"({args.database_url}) ...", flush=True)
    subprocess.run([sys.executable, __file__, "--seed-child", str(spec_path)], cwd=ROOT, env=env, check=True,
                   timeout=1800)
    plan = json.loads((workdir / "seeded.json").read_text())
    plan["poll"] = args.poll
    plan["pages"] = {}  # per user: what its open page remembers (etags, live cursor)
    print(f"seeded in {plan['seed_s']:.1f} s: {plan['measurements']:,} measurements, {plan['runs']} runs, "
          f"{plan['models']} models\n")
    print("in-process, one request at a time (Django test client, median):")
    print(f"  {'endpoint':26s} {'median ms':>9s} {'CPU ms':>7s} {'queries':>7s} {'bytes':>8s}  slowest query")
    for name, e in plan["endpoints"].items():
        print(f"  {name:26s} {e['median_ms']:9.2f} {e['cpu_ms']:7.2f} {e['queries']:7d} {e['bytes']:8,d}  "
              f"{e['slowest_query_ms']:.2f} ms: {e['slowest_query'][:70]}")
    proc, port = start_gunicorn(args, env, workdir, plan["tokens"][0])
    phases = {}
    try:
        asyncio.run(phase(port, plan, users=min(args.users, 50), duration=3.0, rate=50.0, seed=99))  # warm-up
        t_open = time.monotonic()
        opened = asyncio.run(open_pages(port, plan, users=args.users))
        print(f"{opened} users opened their run's live page in {time.monotonic() - t_open:.1f} s "
              f"(polls: {args.poll})", flush=True)
        runs = [("paced", args.rate, args.duration)]
        runs += [(f"paced_{r:g}", r, max(5.0, args.duration / 2)) for r in
                 (float(x) for x in args.also_rates.split(",") if x.strip()) if r != args.rate]
        runs += [("saturation", None, args.saturation)] if args.saturation > 0 else []
        for seed, (pname, rate, duration) in enumerate(runs, 1):
            drained_s = drain(port, plan["tokens"][0])
            with CpuMeter(proc) as cpu:
                res = asyncio.run(phase(port, plan, users=args.users, duration=duration, rate=rate, seed=seed,
                                        database_url=args.database_url, per_beat=args.worker_round))
            phases[pname] = summarize(res, duration) | {
                "users": args.users, "offered_rps": rate, "duration_s": duration, "cpu_cores": cpu.cores,
                "loadavg_after": list(os.getloadavg()), "drained_before_s": drained_s}
    finally:
        stop(proc)

    print(f"\ngunicorn: {args.workers} workers x {args.threads} threads ({args.worker_class}), PostgreSQL, "
          f"{args.users} users, loopback; {os.cpu_count()} cores shared with the load generator\n")
    print(f"{'phase':12s} {'endpoint':12s} {'req':>7s} {'rps':>7s} {'p50 ms':>8s} {'p90 ms':>8s} {'p99 ms':>8s} "
          f"{'max ms':>8s} {'errors':>6s}")
    for pname, ph in phases.items():
        cpu = ph["cpu_cores"]
        print(f"{pname:12s} {'all':12s} {ph['requests']:7d} {ph['rps']:7.1f} {_f(ph['p50_ms'])} {_f(ph['p90_ms'])} "
              f"{_f(ph['p99_ms'])} {_f(ph['max_ms'])} {ph['errors']:6d}   CPU cores: server {cpu['server']:.2f}, "
              f"PostgreSQL {cpu['database']:.2f}, load generator {cpu['load_generator']:.2f}, "
              f"other jobs {cpu['other']:.2f}; load average after {ph['loadavg_after'][0]:.2f}")
        for ename, e in ph["endpoints"].items():
            print(f"{'':12s} {ename:12s} {e['requests']:7d} {'':7s} {_f(e['p50_ms'])} {_f(e['p90_ms'])} "
                  f"{_f(e['p99_ms'])} {_f(e['max_ms'])}")
        if ph["error_kinds"]:
            print(f"{'':12s} errors: {ph['error_kinds']}")
        polls = ph["endpoints"]["live_poll"]["requests"]
        print(f"{'':12s} 304s: {ph['not_modified']} of {polls} polls; pretend-worker beats {ph['worker_beats']}"
              + (f"; live answers by mode {ph['live_modes']}" if ph["live_modes"] else ""))
    paced = phases["paced"]
    other = max(ph["cpu_cores"]["other"] for ph in phases.values())
    if other > 0.2:
        print(f"\nnote: other jobs used up to {other:.2f} of the {os.cpu_count()} cores during the run; "
              "the figures are pessimistic")
    goal = paced["p99_ms"] is not None and paced["p99_ms"] < 100 and paced["errors"] == 0 \
        and paced["rps"] >= 0.95 * args.rate
    print(f"\ngoal (p99 < 100 ms at {args.rate:g} req/s, 0 errors): {'MET' if goal else 'NOT MET'}")
    from bench.common import machine_info

    result = {
        "overall": {"rps": paced["rps"], "p50_ms": paced["p50_ms"], "p99_ms": paced["p99_ms"],
                    "errors": paced["errors"], "offered_rps": args.rate, "users": args.users,
                    "saturation_rps": phases.get("saturation", {}).get("rps"), "goal_met": goal,
                    "other_jobs_cpu_cores": other,
                    "by_offered_rps": {f"{ph['offered_rps']:g}": {k: ph[k] for k in ("rps", "p50_ms", "p99_ms", "errors")}
                                       for ph in phases.values() if ph["offered_rps"]},
                    "loadavg_1m_during": [ph["loadavg_after"][0] for ph in phases.values()],
                    # one poll's server CPU (this process; PostgreSQL's share aside), the largest run's page
                    "live_poll_cpu_ms": {k: plan["endpoints"][f"live_poll_{k}"]["cpu_ms"]
                                         for k in ("uncached", "200_cached", "304")},
                    "live_poll_304_vs_uncached_cpu": plan["endpoints"]["live_poll_304"]["cpu_ms"]
                    / max(1e-9, plan["endpoints"]["live_poll_uncached"]["cpu_ms"])},
        "phases": phases, "endpoints_in_process": plan["endpoints"],
        "data": {k: plan[k] for k in ("measurements", "runs", "models")},
        "server": {"workers": args.workers, "threads": args.threads, "worker_class": args.worker_class},
        "machine": machine_info(),
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, default=str))
        print(f"wrote {args.json}")
    return result


def _f(v) -> str:
    return f"{v:8.1f}" if v is not None else f"{'-':>8s}"


if __name__ == "__main__":
    main()
