"""Shared fixtures: users, teams with roles, API clients, small ONNX models, a Celery outbox.

Rows come from tests/factories.py; helpers the tests import live in tests/helpers.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from rest_framework.test import APIClient

from core.models import Membership

from .factories import DLModelFactory, MembershipFactory, TeamFactory, UserFactory, zoo_model
from .helpers import client_for

DB_FIXTURES = {"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback"}


def pytest_collection_modifyitems(config, items):
    # Mark every test that touches the database (`-m db` / `-m "not db"` select them); the SQLite
    # pass of scripts/test.sh re-runs only those also marked `dialect`.
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if item.get_closest_marker("django_db") or fixtures & DB_FIXTURES or "client" in fixtures \
                or any(f.startswith(("api_", "team_", "user_")) for f in fixtures):
            item.add_marker(pytest.mark.db)


@pytest.fixture(autouse=True)
def _media_in_tmp(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    # Counting tuning tasks imports the model into TVM (~10 s the first time per
    # process); tests that check it switch it back on.
    settings.ONNX_COUNT_TUNING_TASKS = False
    # Django's default hasher spends ~0.3 s of CPU per password on purpose; tests make many users.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _fresh_throttle_counts():
    """API throttles count in the (per-process, local-memory) cache: start every test from zero."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture
def user_owner(db):
    return UserFactory(username="alice")


@pytest.fixture
def team_a(user_owner):
    return TeamFactory(name="Team A", owner=user_owner)


@pytest.fixture
def user_member(team_a):
    return MembershipFactory(team=team_a, user__username="bob", role=Membership.Role.MEMBER).user


@pytest.fixture
def user_viewer(team_a):
    return MembershipFactory(team=team_a, user__username="victor", role=Membership.Role.VIEWER).user


@pytest.fixture
def user_other(db):
    return UserFactory(username="mallory")


@pytest.fixture
def team_b(user_other):
    return TeamFactory(name="Team B", owner=user_other)


@pytest.fixture
def user_staff(db):
    return UserFactory(username="stan", is_staff=True)


@pytest.fixture
def api_owner(user_owner):
    return client_for(user_owner)


@pytest.fixture
def api_other(user_other, team_b):
    return client_for(user_other)


@pytest.fixture
def api_anon():
    return APIClient()


@dataclass(frozen=True)
class SentMessage:
    task: str
    args: tuple
    kwargs: dict
    options: dict


class CeleryOutbox(list):
    """The Celery messages a test published, in order (SentMessage rows)."""

    def args_of(self, task: str) -> list[tuple]:
        return [m.args for m in self if m.task == task]


@pytest.fixture
def celery_outbox(monkeypatch) -> CeleryOutbox:
    """Every Celery message the code under test publishes (``delay``/``apply_async`` of any task) is
    recorded here instead of reaching a broker; no worker runs it. Messages sent "on commit" arrive
    when the transaction commits: in a plain ``db`` test wrap the call in
    ``django_capture_on_commit_callbacks(execute=True)``."""
    from celery.app.task import Task

    outbox = CeleryOutbox()

    def apply_async(task, args=None, kwargs=None, **options):
        outbox.append(SentMessage(task.name, tuple(args or ()), dict(kwargs or {}), options))
        return SimpleNamespace(id=f"outbox-{len(outbox)}")

    monkeypatch.setattr(Task, "apply_async", apply_async)
    return outbox


@pytest.fixture(scope="session")
def small_cnn_bytes() -> bytes:
    """The zoo's small_cnn as an ONNX file (for the tests that upload it)."""
    return zoo_model("small_cnn").data


@pytest.fixture
def model_a(team_a, user_owner):
    return DLModelFactory(team=team_a, name="cnn-a", created_by=user_owner)


@pytest.fixture
def model_b(team_b, user_other):
    return DLModelFactory(team=team_b, name="cnn-b", created_by=user_other)
