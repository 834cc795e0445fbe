"""Dashboard test fixtures: no broker (sent tasks are recorded), a logged-in client, fake runs."""
from __future__ import annotations

import pytest

from core.models import Quota

from .fakes import make_running_run


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    path = getattr(config, "dlopt_screenshot_dir", None)
    if path is not None:
        terminalreporter.write_line(f"dashboard screenshots: {path}")


@pytest.fixture(autouse=True)
def no_broker(celery_outbox):
    """Runs started from the dashboard land in the Celery outbox instead of a broker (no worker here)."""
    return celery_outbox


@pytest.fixture
def owner_client(client, user_owner, team_a):
    client.force_login(user_owner)
    return client


@pytest.fixture
def roomy_quota(team_a):
    Quota.objects.filter(team=team_a).update(max_concurrent_runs=20, tuning_trials_per_month=1_000_000)


@pytest.fixture
def run_a(user_owner, model_a, roomy_quota):
    """A running run of team A with 4 tasks and 6 rounds of 16 measurements (one task pre-empted)."""
    run, worker = make_running_run(actor=user_owner, model=model_a, max_trials=200, n_tasks=4, rounds=6,
                                   per_round=16)
    worker.preempt(3)
    run.refresh_from_db()
    run.fake_worker = worker
    return run


@pytest.fixture
def run_b(user_other, model_b):
    """A run of team B (another team: a 404 everywhere for team A's users)."""
    run, _ = make_running_run(actor=user_other, model=model_b, max_trials=64, n_tasks=2, rounds=2, per_round=8)
    return run


@pytest.fixture
def live_gpu_node(db):
    """A registered, live node with one GPU whose queue a worker serves: cuda targets are offered."""
    from django.utils import timezone

    from scheduling.models import GPU, Node

    node = Node.objects.create(name="gpu-node-1", hostname="gpu-node-1", cpu_cores=16, memory_mb=65536,
                               nvml_available=True, last_seen=timezone.now(), queues=["measure.gpu-node-1.gpu0"])
    GPU.objects.create(node=node, index=0, name="NVIDIA H100", gpu_model="H100", memory_total_mb=81559,
                       queue="measure.gpu-node-1.gpu0")
    return node
