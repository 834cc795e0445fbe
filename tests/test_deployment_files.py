"""docker-compose.yml and production settings, checked without a Docker engine."""
from __future__ import annotations

import importlib
import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_services_and_healthchecks():
    services = compose()["services"]
    assert {"postgres", "redis", "web", "worker", "simulation-worker", "beat", "gpu-worker"} <= set(services)
    for name in ("postgres", "redis", "web"):
        assert services[name]["healthcheck"]["test"], name
    for name in ("web", "worker", "simulation-worker", "beat", "gpu-worker"):
        deps = services[name]["depends_on"]
        assert deps["postgres"]["condition"] == deps["redis"]["condition"] == "service_healthy"
        env = services[name]["environment"]
        assert env["DATABASE_URL"].startswith("postgres://") and env["REDIS_URL"].startswith("redis://")


def test_gpu_worker_profile_and_device_reservation():
    gpu = compose()["services"]["gpu-worker"]
    assert gpu["profiles"] == ["gpu"]
    device = gpu["deploy"]["resources"]["reservations"]["devices"][0]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    queues = gpu["command"][gpu["command"].index("-Q") + 1].split(",")
    assert any(q.startswith("measure.") and q.endswith(".gpu0") for q in queues)
    assert not any(q == "tuning" for q in queues)  # GPU hosts measure, CPU hosts search and build
    # the jobs Horus co-locates on a GPU run at the same time: one worker slot per job it may share
    from scheduling.horus.policies import HORUS_MAX_JOBS_PER_GPU

    command = gpu["command"]
    assert command[command.index("--pool") + 1] == "prefork"
    assert int(command[command.index("--concurrency") + 1]) >= HORUS_MAX_JOBS_PER_GPU


def _queues(command: list[str]) -> list[str]:
    return command[command.index("-Q") + 1].split(",")


def test_simulations_have_their_own_queue_and_worker():
    """A simulation can hold a worker for many seconds: it must never take a slot tuning needs."""
    from config.celery import app

    assert app.amqp.router.route({}, "scheduling.run_simulation")["queue"].name == "simulations"
    assert app.amqp.router.route({}, "tuning.execute_run")["queue"].name == "tuning"
    services = compose()["services"]
    sim = services["simulation-worker"]["command"]
    assert _queues(sim) == ["simulations"] and int(sim[sim.index("--concurrency") + 1]) == 1
    for name in ("worker", "gpu-worker"):  # tuning workers do not take simulations
        assert "simulations" not in _queues(services[name]["command"]), name
    run_sh = (ROOT / "scripts" / "run.sh").read_text()
    workers = [line for line in run_sh.splitlines() if "celery -A config worker" in line]
    sim_workers = [line for line in workers if '-Q "${SIMULATION_QUEUES:-simulations}"' in line]
    assert len(sim_workers) == 1 and len(workers) >= 2  # `make run`: its own worker beside the tuning one
    assert "simulations" not in run_sh.split("QUEUES=${WORKER_QUEUES:-", 1)[1].split("}", 1)[0]


def test_compose_commands_reference_real_modules():
    services = compose()["services"]
    for name in ("worker", "simulation-worker", "beat", "gpu-worker"):
        cmd = services[name]["command"]
        app = cmd[cmd.index("-A") + 1]
        assert hasattr(importlib.import_module(app), "celery_app"), name
    assert "config.wsgi:application" in services["web"]["command"]
    assert importlib.import_module("config.wsgi").application is not None
    assert "manage.py migrate" in services["web"]["command"]


def test_check_deploy_is_clean_under_production_settings(tmp_path):
    env = dict(os.environ, DJANGO_SECURE="1", DJANGO_SECRET_KEY="x" * 30 + "-prod-secret-key-for-check-0123456789",
               DJANGO_DEBUG="0", DLOPT_VAR_DIR=str(tmp_path), DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite3")
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)  # a test-only flag; production never sets it
    proc = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no issues" in proc.stdout


def test_production_refuses_default_secret(tmp_path):
    env = dict(os.environ, DJANGO_SECURE="1", DLOPT_VAR_DIR=str(tmp_path))
    env.pop("DJANGO_SECRET_KEY", None)
    proc = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and "DJANGO_SECRET_KEY" in proc.stderr


# --- issue 11 s.7: no published secret, DJANGO_SECURE=1, check --deploy clean as compose runs it ----------

_INTERP = re.compile(r"\$\{(\w+)(?::([?-])([^}]*))?\}")


def _interpolate(value: str, environ: dict) -> str:
    """docker compose's ${VAR}, ${VAR:-default} and ${VAR:?error} (an unset :? refuses to start)."""
    def sub(m):
        name, op, arg = m.groups()
        if environ.get(name):
            return environ[name]
        if op == "?":
            raise ValueError(f"compose refuses to start: {arg}")
        return arg if op == "-" else ""
    return _INTERP.sub(sub, str(value))


def compose_env(service: str, environ: dict) -> dict:
    env = compose()["services"][service]["environment"]
    return {k: _interpolate(v, environ) for k, v in env.items()}


def _settings_with(env_overrides: dict, tmp_path, *args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    env.update(env_overrides, DLOPT_VAR_DIR=str(tmp_path), DJANGO_MEDIA_ROOT=str(tmp_path / "media"),
               DJANGO_STATIC_ROOT=str(tmp_path / "static"))
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    return subprocess.run([sys.executable, "manage.py", "check", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_compose_has_no_default_secret_and_is_secure_by_default():
    for service in ("web", "worker", "beat", "gpu-worker"):
        try:
            compose_env(service, {})
        except ValueError as exc:
            assert "DJANGO_SECRET_KEY" in str(exc)
        else:
            raise AssertionError(f"{service} starts without DJANGO_SECRET_KEY")
        env = compose_env(service, {"DJANGO_SECRET_KEY": "k" * 60})
        assert env["DJANGO_SECURE"] == "1", service


def test_check_deploy_is_clean_in_the_compose_configuration(tmp_path):
    env = compose_env("web", {"DJANGO_SECRET_KEY": secrets.token_urlsafe(50)})
    env["DATABASE_URL"] = f"sqlite:///{tmp_path}/db.sqlite3"  # no PostgreSQL here; check needs no database
    proc = _settings_with(env, tmp_path, "--deploy", "--fail-level", "WARNING")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no issues" in proc.stdout


def _published_keys() -> set[str]:
    """Every secret-key string written in the repository: compose's old default and the settings' dev key."""
    text = (ROOT / "config" / "settings.py").read_text()
    keys = set(re.findall(r'_DEV_SECRET = "([^"]+)"', text))
    keys |= set(re.findall(r'^\s+"([^"]{20,})",\s+# docker-compose', text, re.M))
    keys.add("change-me-in-production-please-0123456789abcdef")  # compose's default on 64ee36e
    return keys


@pytest.mark.parametrize("secure", ["0", "1"])
def test_settings_refuse_a_key_published_in_the_repository(secure, tmp_path):
    keys = _published_keys()
    assert len(keys) >= 2
    for key in keys:
        proc = _settings_with({"DJANGO_SECURE": secure, "DJANGO_SECRET_KEY": key}, tmp_path)
        assert proc.returncode != 0 and "published" in proc.stderr, (key, proc.stdout + proc.stderr[-500:])


def test_secure_mode_refuses_a_short_key_and_the_dev_mode_keeps_working(tmp_path):
    proc = _settings_with({"DJANGO_SECURE": "1", "DJANGO_SECRET_KEY": "short-but-not-published"}, tmp_path)
    assert proc.returncode != 0 and "50+" in proc.stderr
    proc = _settings_with({"DJANGO_SECURE": "0"}, tmp_path)  # `make run`: no key set, the dev key
    assert proc.returncode == 0, proc.stderr


# --- issue 16: time limits per queue -------------------------------------------------------------------

def test_every_queue_stamps_its_soft_and_hard_time_limits_on_published_messages():
    """A message published to a queue carries that queue's (hard, soft) limits in its `timelimit` header,
    which the worker enforces (settings.CELERY_QUEUE_TIME_LIMITS, first matching pattern; per-node queues
    too); a sender's own limits, and a task's own (its decorator's), are kept. Published for real, to an
    in-memory broker."""
    from celery import Celery
    from django.conf import settings

    from config.celery import app as dlopt_app  # connects the publish hook

    @dlopt_app.task(name="tests.limited_probe", soft_time_limit=5, time_limit=7)
    def limited_probe():  # a task with limits of its own
        return None

    limits = settings.CELERY_QUEUE_TIME_LIMITS
    assert all(0 < soft < hard for soft, hard in limits.values())
    assert limits["measure.*"][0] >= settings.SCHEDULING_MAX_JOB_DURATION_S  # a GPU job stops itself first
    assert limits["measure.*.cpu"][0] >= settings.TUNING_MEASURE_TIMEOUT_S
    expected = {"telemetry": "telemetry", "tuning": "tuning", "simulations": "simulations",
                "measure.n1.cpu": "measure.*.cpu", "measure.n1.gpu0": "measure.*", "default": "*"}
    app = Celery("time-limits-probe", broker="memory://")
    with app.connection_for_write() as conn:
        for queue, pattern in expected.items():
            app.send_task("dlopt.probe", queue=queue, connection=conn)
            message = conn.SimpleQueue(queue).get(timeout=5)
            soft, hard = limits[pattern]
            assert tuple(message.headers["timelimit"]) == (hard, soft), queue
            message.ack()
        app.send_task("dlopt.probe", queue="tuning", time_limit=7, soft_time_limit=5, connection=conn)
        message = conn.SimpleQueue("tuning").get(timeout=5)
        assert tuple(message.headers["timelimit"]) == (7, 5)
        message.ack()
        app.send_task("tests.limited_probe", queue="tuning", connection=conn)
        message = conn.SimpleQueue("tuning").get(timeout=5)
        assert tuple(message.headers["timelimit"]) == (None, None)  # the worker applies the task's (7, 5)
        message.ack()


def test_redis_visibility_timeout_outlasts_every_queue_time_limit(tmp_path):
    """With Redis, an unacked message comes back after the visibility timeout: it must be longer than the
    hard limit of every queue (and at least 12 h), or a live task would be delivered twice."""
    code = ("import json, django; django.setup(); from django.conf import settings as s; "
            "print(json.dumps({'vt': s.CELERY_BROKER_TRANSPORT_OPTIONS['visibility_timeout'], "
            "'hard': max(h for _, h in s.CELERY_QUEUE_TIME_LIMITS.values())}))")
    env = {k: v for k, v in os.environ.items() if k not in ("CELERY_VISIBILITY_TIMEOUT", "CELERY_BROKER_URL")}
    env.update(REDIS_URL="redis://127.0.0.1:6379/0", DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite3",
               DLOPT_VAR_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="config.settings")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    conf = json.loads(out.stdout.strip().splitlines()[-1])
    assert conf["vt"] >= 12 * 3600 and conf["vt"] > conf["hard"]


def test_routes_are_declared_once_in_settings():
    """A task's queue comes from CELERY_TASK_ROUTES only, never also from its decorator."""
    import core.tasks  # noqa: F401  (registers the tasks: the worker's autodiscovery does it there)
    import scheduling.tasks  # noqa: F401
    import tuning.tasks  # noqa: F401
    from django.conf import settings

    from config.celery import app

    for name in settings.CELERY_TASK_ROUTES:
        assert getattr(app.tasks[name], "queue", None) is None, name


def test_the_test_command_checks_the_import_contracts_before_pytest():
    """`make test` runs lint-imports first (set -e: a broken contract fails it), against contracts that hold
    the engines free of Django, Celery and the apps."""
    import tomllib

    script = (ROOT / "scripts" / "test.sh").read_text()
    assert "set -euo pipefail" in script
    assert 0 < script.index(".venv/bin/lint-imports") < script.index("-m pytest")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    engines = next(c for c in config["contracts"] if c["id"] == "engines-django-free")
    assert set(engines["source_modules"]) >= {"tuning.engine", "scheduling.horus", "core.onnx_models", "common",
                                              "scheduling.job_process", "scheduling.gpu_runtime"}
    for tool in (".venv/bin/ruff check", ".venv/bin/ruff format --check", ".venv/bin/mypy"):
        assert 0 < script.index(tool) < script.index("-m pytest"), tool
    assert {"django", "rest_framework", "celery", "kombu"} <= set(engines["forbidden_modules"])
    assert {c["type"] for c in config["contracts"]} >= {"forbidden", "layers", "acyclic_siblings"}


# --- defence in depth: an app user, a sandbox user, media that is never executed -------------------------

SANDBOXING_SERVICES = ("web", "worker", "simulation-worker", "gpu-worker")


def test_web_and_workers_become_the_app_user_and_keep_only_what_switching_to_the_sandbox_needs():
    services = compose()["services"]
    for name in SANDBOXING_SERVICES:
        svc = services[name]
        # root only for the entrypoint, which becomes dlopt; nothing but the three capabilities
        assert svc["user"] == "0:0" and svc["cap_drop"] == ["ALL"], name
        assert set(svc["cap_add"]) == {"SETUID", "SETGID", "CHOWN"}, name
        assert "no-new-privileges:true" in svc["security_opt"], name
        env = compose_env(name, {"DJANGO_SECRET_KEY": "k" * 60, "DLOPT_MEDIA_DIR": "/srv/media"})
        assert env["DLOPT_SANDBOX_USER"] == "dlopt-sandbox" and env["DLOPT_SANDBOX_REQUIRED"] == "1", name
    beat = services["beat"]  # starts no sandbox: no capabilities at all
    assert beat["user"] == "dlopt" and beat["cap_drop"] == ["ALL"] and not beat["cap_add"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"useradd [^\n]*--no-create-home[^\n]*--shell /usr/sbin/nologin dlopt-sandbox", dockerfile)
    assert "USER dlopt\n" in dockerfile
    assert 'ENTRYPOINT ["/app/scripts/entrypoint.sh"]' in dockerfile


def test_the_media_volume_is_mounted_noexec_nosuid_nodev():
    data = compose()
    for name in SANDBOXING_SERVICES + ("beat",):
        assert "media:/data/media" in data["services"][name]["volumes"], name
    media = data["volumes"]["media"]
    options = media["driver_opts"]["o"].split(",")
    assert media["driver"] == "local" and media["driver_opts"]["type"] == "none"
    assert {"bind", "noexec", "nosuid", "nodev"} <= set(options)
    assert media["driver_opts"]["device"].startswith("${DLOPT_MEDIA_DIR:?")  # no relative default: must be set
    env = compose_env("worker", {"DJANGO_SECRET_KEY": "k" * 60})
    assert env["DJANGO_MEDIA_ROOT"] == "/data/media"


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists() or not Path("/usr/bin/python3").exists(),
                    reason="needs root and setpriv to run the entrypoint as it runs in the container")
def test_the_entrypoint_becomes_the_app_user_with_only_the_switching_capabilities():
    probe = ("import os\nstatus = dict(l.split(':', 1) for l in open('/proc/self/status'))\n"
             "print(os.getresuid()[0], os.getresgid()[0], int(status['CapAmb'], 16), int(status['CapEff'], 16))\n")
    out = subprocess.run([str(ROOT / "scripts" / "entrypoint.sh"), "/usr/bin/python3", "-c", probe],
                         env={"PATH": "/usr/bin:/bin", "DLOPT_APP_USER": "daemon"}, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    uid, gid, ambient, effective = map(int, out.stdout.split())
    switching = (1 << 0) | (1 << 6) | (1 << 7)  # CAP_CHOWN, CAP_SETGID, CAP_SETUID
    assert uid == gid == 1 and ambient == effective == switching  # `daemon` here, dlopt in the image
