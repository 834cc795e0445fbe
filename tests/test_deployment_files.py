"""docker-compose.yml and production settings, checked without a Docker engine."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

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
