"""Fixtures of the reliability & security tests: a populated "world" with every role and one object of
every kind (tests/reliability/world.py), and a private Redis server (tests/reliability/faults.py)."""
from __future__ import annotations

from contextlib import contextmanager

import pytest

from .faults import PrivateRedis
from .world import build_world


@pytest.fixture
def world(db):
    return build_world()


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
