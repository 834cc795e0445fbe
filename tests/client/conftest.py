"""The client package is not installed in the platform's venv: its source is put on sys.path here, as
`pip install ./client` would put it on a laptop."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

CLIENT_SRC = Path(__file__).resolve().parents[2] / "client" / "src"
if str(CLIENT_SRC) not in sys.path:
    sys.path.insert(0, str(CLIENT_SRC))


@pytest.fixture(autouse=True)
def _isolated_config(tmp_path, monkeypatch):
    """Each test logs in to its own config directory; no DLOPT_* variable leaks in from the shell."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("DLOPT_URL", raising=False)
    monkeypatch.delenv("DLOPT_TOKEN", raising=False)


@pytest.fixture
def no_broker(monkeypatch):
    """Runs the API starts are recorded (their ids) instead of sent to Celery: no worker tunes them."""
    sent: list[int] = []
    monkeypatch.setattr("tuning.services.run_queue.enqueue_run", lambda run: sent.append(run.pk))
    return sent
