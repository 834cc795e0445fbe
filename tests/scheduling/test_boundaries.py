"""The scheduling app's boundaries, checked without a database: only ``scheduling.adapters`` imports the
engine, services never import the task module, and every task has its time limits and delivery settings
(queues come from CELERY_TASK_ROUTES or the placement, never from a decorator)."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import scheduling
from scheduling import tasks

ROOT = Path(scheduling.__file__).parent
ENGINE = ("scheduling.horus",)
ENGINE_SIDE = {"adapters.py", "experiments.py"}  # the boundary itself, and the engine's experiment runner


def _imports(path: Path) -> set[str]:
    """Absolute names of every module the file imports (relative imports resolved), at any depth."""
    package = ".".join(("scheduling", *path.relative_to(ROOT).parent.parts)).rstrip(".")
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            out |= {module} | {f"{module}.{a.name}" for a in node.names}
    return out


def _app_modules():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("horus", "migrations") or str(rel) in ENGINE_SIDE:
            continue
        yield rel, path


@pytest.mark.parametrize("rel,path", list(_app_modules()), ids=lambda v: str(v) if isinstance(v, Path) else "")
def test_only_the_adapters_import_the_engine(rel, path):
    reached = sorted(m for m in _imports(path) if m.startswith(ENGINE))
    assert not reached, f"{rel} imports {reached}: go through scheduling.adapters"


def test_services_never_import_the_task_module():
    for path in sorted((ROOT / "services").glob("*.py")):
        assert "scheduling.tasks" not in _imports(path), f"services/{path.name} imports scheduling.tasks"


def test_every_task_has_soft_and_hard_time_limits_and_no_queue_of_its_own():
    scheduling_tasks = [t for name, t in tasks.current_app.tasks.items() if name.startswith("scheduling.")]
    assert {t.name for t in scheduling_tasks} >= {"scheduling.heartbeat", "scheduling.place_pending",
                                                  "scheduling.run_job", "scheduling.run_simulation",
                                                  "scheduling.train_predictor"}
    for t in scheduling_tasks:
        assert 0 < t.soft_time_limit < t.time_limit, t.name
        assert getattr(t, "queue", None) is None, f"{t.name}: its route belongs in CELERY_TASK_ROUTES"


def test_long_tasks_are_redelivered_when_their_worker_is_lost(settings):
    for t in (tasks.run_job, tasks.run_simulation):
        assert t.acks_late and t.reject_on_worker_lost, t.name
    assert settings.CELERY_TASK_ROUTES["scheduling.heartbeat"] == {"queue": "telemetry"}
    assert settings.CELERY_TASK_ROUTES["scheduling.run_simulation"] == {"queue": "simulations"}


def test_a_gpu_job_can_run_its_longest_declared_duration_before_the_hard_limit(settings):
    assert tasks.run_job.soft_time_limit > settings.SCHEDULING_MAX_JOB_DURATION_S


def test_a_web_process_has_the_tasks_the_services_send_by_name():
    """Services send tasks by their registered names, so a process that never imported scheduling.tasks
    (a web worker) must still have them registered once Django is set up."""
    probe = ("import django; django.setup(); from celery import current_app; "
             "from scheduling.services import messages; "
             "print(sorted(n for n in (messages.PLACE_PENDING, messages.RUN_JOB, messages.RUN_SIMULATION) "
             "if n not in current_app.tasks))")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
