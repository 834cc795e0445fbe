"""Tuning test fixtures."""
from __future__ import annotations

import pytest


@pytest.fixture
def no_broker(monkeypatch):
    """Runs the services send to Celery are recorded (their ids, in order) instead of sent."""
    sent: list[int] = []
    monkeypatch.setattr("tuning.services.run_queue.enqueue_run", lambda run: sent.append(run.pk))
    return sent
