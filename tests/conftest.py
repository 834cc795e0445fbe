"""Shared fixtures: users, teams with roles, API clients, small ONNX models."""
from __future__ import annotations

import os

import pytest
from rest_framework.test import APIClient

from core import services
from core.models import Membership

DB_FIXTURES = {"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback"}


def pytest_collection_modifyitems(config, items):
    # Mark every test that touches the database, so scripts/test.sh can re-run
    # exactly those against SQLite after the PostgreSQL pass.
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


@pytest.fixture(autouse=True)
def _fresh_throttle_counts():
    """API throttles count in the (per-process, local-memory) cache: start every test from zero."""
    from django.core.cache import cache

    cache.clear()


def make_user(django_user_model, username, **extra):
    return django_user_model.objects.create_user(username=username, password="pw-" + username, **extra)


@pytest.fixture
def user_owner(django_user_model):
    return make_user(django_user_model, "alice")


@pytest.fixture
def team_a(user_owner):
    return services.create_team(name="Team A", owner=user_owner)


@pytest.fixture
def user_member(django_user_model, team_a):
    user = make_user(django_user_model, "bob")
    Membership.objects.create(team=team_a, user=user, role=Membership.Role.MEMBER)
    return user


@pytest.fixture
def user_viewer(django_user_model, team_a):
    user = make_user(django_user_model, "victor")
    Membership.objects.create(team=team_a, user=user, role=Membership.Role.VIEWER)
    return user


@pytest.fixture
def user_other(django_user_model):
    return make_user(django_user_model, "mallory")


@pytest.fixture
def team_b(user_other):
    return services.create_team(name="Team B", owner=user_other)


@pytest.fixture
def user_staff(django_user_model):
    return make_user(django_user_model, "stan", is_staff=True)


def client_for(user) -> APIClient:
    client = APIClient()
    if user is not None:
        issued = services.create_api_token(user=user, name="test")
        client.credentials(HTTP_AUTHORIZATION=f"Token {issued.key}")
    return client


@pytest.fixture
def api_owner(user_owner):
    return client_for(user_owner)


@pytest.fixture
def api_other(user_other, team_b):
    return client_for(user_other)


@pytest.fixture
def api_anon():
    return APIClient()


@pytest.fixture(scope="session")
def small_cnn_bytes() -> bytes:
    from core.onnx_models import zoo

    return zoo.build_model("small_cnn").SerializeToString()


@pytest.fixture
def model_a(team_a, user_owner, small_cnn_bytes):
    return services.register_model(team=team_a, name="cnn-a", data=small_cnn_bytes, filename="cnn.onnx",
                                   actor=user_owner)


@pytest.fixture
def model_b(team_b, user_other, small_cnn_bytes):
    return services.register_model(team=team_b, name="cnn-b", data=small_cnn_bytes, filename="cnn.onnx",
                                   actor=user_other)


def require_env(name: str) -> str:
    """Integration tests need real servers; scripts/test.sh provides them. Fail in CI, skip elsewhere."""
    value = os.environ.get(name)
    if not value:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not set: run the suite with `make test`")
        pytest.skip(f"{name} not set (run `make test`, which starts the servers)")
    return value
