"""Fixtures of the reliability & security tests: a populated "world" with every role and one
object of every kind, a private Redis server, and helpers to fail the Nth SQL statement."""
from __future__ import annotations

import re
import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.core.files.base import ContentFile
from django.db import connection
from django.utils import timezone

PHILLY_CSV = (
    "timestamp,duration,num_gpus,gpu_time,cluster\n"
    "2017-10-09 06:00:00,600,1,600,c1\n"
    "2017-10-09 06:01:00,1200,2,2400,c1\n"
    "2017-10-09 06:03:00,300,1,300,c1\n"
    "2017-10-09 06:04:00,900,4,3600,c1\n"
)

ROLES = ("anon", "viewer", "member", "owner", "other", "staff")


@dataclass
class World:
    """Team A (owner, member, viewer), team B (another owner), a staff user in no team, and one
    object of every kind in team A (plus a model in team B)."""

    users: dict = field(default_factory=dict)
    tokens: dict = field(default_factory=dict)  # role -> API key
    objects: dict = field(default_factory=dict)  # name -> model instance

    def __getattr__(self, name):
        try:
            return self.__dict__["objects"][name]
        except KeyError:
            raise AttributeError(name) from None


def build_world(django_user_model) -> World:
    from core import services as core_services
    from core.models import ApiToken, Membership, Quota
    from core.onnx_models import zoo
    from scheduling import services as sched_services
    from scheduling.models import GpuJob, GpuProfile, GpuTelemetry, Placement
    from tests.scheduling.conftest import register_gpu_node
    from tuning import services as tuning_services
    from tuning.models import TuningRun

    w = World()

    def mk(name, **kw):
        return django_user_model.objects.create_user(username=name, password="pw-" + name, **kw)

    w.users = {"owner": mk("rel-owner"), "member": mk("rel-member"), "viewer": mk("rel-viewer"),
               "other": mk("rel-other"), "staff": mk("rel-staff", is_staff=True)}
    team_a = core_services.create_team(name="Rel Team A", owner=w.users["owner"])
    team_b = core_services.create_team(name="Rel Team B", owner=w.users["other"])
    Membership.objects.create(team=team_a, user=w.users["member"], role=Membership.Role.MEMBER)
    Membership.objects.create(team=team_a, user=w.users["viewer"], role=Membership.Role.VIEWER)
    Quota.objects.filter(team__in=[team_a, team_b]).update(max_concurrent_runs=50, tuning_trials_per_month=10**6,
                                                           gpu_hours_per_month=10**4, energy_kwh_per_month=10**4)
    for role, user in w.users.items():
        w.tokens[role] = core_services.create_api_token(user=user, name="rel").key
    data = zoo.build_model("small_cnn").SerializeToString()
    model = core_services.register_model(team=team_a, name="rel-cnn", data=data, filename="cnn.onnx",
                                         actor=w.users["owner"])
    model_b = core_services.register_model(team=team_b, name="rel-cnn-b", data=data, filename="cnn.onnx",
                                           actor=w.users["other"])
    owner = w.users["owner"]
    run = tuning_services.start_run(actor=owner, model=model, max_trials=8, enqueue=False)
    paused_run = tuning_services.start_run(actor=owner, model=model, max_trials=8, enqueue=False)
    TuningRun.objects.filter(pk=paused_run.pk).update(status=TuningRun.Status.PAUSED)
    done_run = tuning_services.start_run(actor=owner, model=model, max_trials=8, enqueue=False)
    done_run.records_file.save("rel-records.zip", ContentFile(b"PK\x05\x06" + b"\0" * 18), save=False)
    done_run.module_file.save("rel-module.so", ContentFile(b"\x7fELF-not-really"), save=False)
    done_run.status, done_run.finished_at = TuningRun.Status.SUCCEEDED, timezone.now()
    done_run.save()

    node = register_gpu_node(name="relnode")
    gpu = node.gpus.order_by("index").first()
    telemetry = GpuTelemetry.objects.create(gpu=gpu, ts=timezone.now(), util_pct=10.0, mem_used_mb=100.0)
    predictor = sched_services.train_predictor(actor=None, k_folds=2, xgb_params={"n_estimators": 10})
    profile = GpuProfile.objects.order_by("pk").first()
    job = GpuJob.objects.create(team=team_a, model=model, batch_size=8, duration_estimate_s=60.0,
                                predicted_util_pct=30.0, predicted_mem_mb=1000.0)
    placed_job = GpuJob.objects.create(team=team_a, model=model, batch_size=8, duration_estimate_s=60.0,
                                       predicted_util_pct=30.0, predicted_mem_mb=1000.0,
                                       state=GpuJob.State.PLACED, placed_at=timezone.now())
    placement = Placement.objects.create(job=placed_job, gpu=gpu, policy="horus", queue=gpu.queue,
                                         placed_at=timezone.now())
    trace = sched_services.upload_trace(actor=owner, team=team_a, name="rel-trace", data=PHILLY_CSV.encode(),
                                        filename="philly.csv")
    simulation = sched_services.start_simulation(actor=owner, team=team_a, trace="philly",
                                                 parameters={"jobs": 50, "gpus": 8}, enqueue=False)
    membership = Membership.objects.get(team=team_a, user=w.users["member"])
    # team A's owner invited team B's owner: only "other" sees, accepts or declines it
    invitation = core_services.invite_member(actor=owner, team=team_a, username="rel-other", role="viewer")
    w.objects.update(
        team_a=team_a, team_b=team_b, model=model, model_b=model_b, run=run, paused_run=paused_run,
        done_run=done_run, node=node, gpu=gpu, telemetry=telemetry, predictor=predictor, profile=profile,
        job=job, placed_job=placed_job, placement=placement, trace=trace, simulation=simulation,
        membership=membership, invitation=invitation, quota=team_a.quota,
        token=ApiToken.objects.filter(user=w.users["member"]).first(),
    )
    return w


@pytest.fixture
def world(db, django_user_model):
    return build_world(django_user_model)


# --- failing the Nth SQL statement --------------------------------------------------------------

class FailNth:
    """connection.execute_wrapper that raises a real database error on the Nth matching statement
    (counting from 1); `pattern` filters statements (a regex on the SQL, e.g. r'^\\s*INSERT')."""

    def __init__(self, n: int, pattern: str = r"^\s*INSERT"):
        self.n, self.regex, self.seen, self.failed_sql = n, re.compile(pattern, re.I), 0, None

    def __call__(self, execute, sql, params, many, context):
        if self.regex.search(sql):
            self.seen += 1
            if self.seen == self.n:
                from django.db import OperationalError

                self.failed_sql = sql
                raise OperationalError(f"injected failure of statement #{self.n}: {sql[:80]}")
        return execute(sql, params, many, context)


@contextmanager
def fail_nth(n: int, pattern: str = r"^\s*INSERT"):
    wrapper = FailNth(n, pattern)
    with connection.execute_wrapper(wrapper):
        yield wrapper


def count_statements(fn, pattern: str = r"^\s*INSERT") -> int:
    """How many statements matching `pattern` fn() runs (inside a rolled-back savepoint)."""
    from django.db import transaction

    counter = FailNth(10**9, pattern)
    with transaction.atomic():
        with connection.execute_wrapper(counter):
            fn()
        transaction.set_rollback(True)
    return counter.seen


# --- a private Redis server ------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateRedis:
    """redis-server on a free loopback port in a temp dir; kill() and start() keep the port and the dir.
    `aof=True` persists like the deployment's Redis (docker-compose.yml: --appendonly yes)."""

    def __init__(self, *, aof: bool = False):
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not Path(binary).exists():
            pytest.skip("redis-server is not installed (scripts/test.sh installs it)")
        self.binary, self.port = binary, free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="dlopt-redis-"))
        self.proc: subprocess.Popen | None = None
        self.aof = aof

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 15.0) -> None:
        log = open(self.dir / "redis.log", "ab")
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes" if self.aof else "no", "--dir", str(self.dir)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError((self.dir / "redis.log").read_text(errors="replace")[-2000:])
            time.sleep(0.1)
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def cleanup(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def _redis(**kwargs):
    server = PrivateRedis(**kwargs)
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def private_redis():
    with _redis() as server:
        yield server


@pytest.fixture
def aof_redis():
    with _redis(aof=True) as server:
        yield server


