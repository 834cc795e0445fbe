"""Helpers the tests import (conftest files hold fixtures only and are never imported)."""
from __future__ import annotations

import os

import pytest

# A valid Philly jobs trace of 4 jobs (the trace upload and simulation tests).
PHILLY_CSV = (
    "timestamp,duration,num_gpus,gpu_time,cluster\n"
    "2017-10-09 06:00:00,600,1,600,c1\n"
    "2017-10-09 06:01:00,1200,2,2400,c1\n"
    "2017-10-09 06:03:00,300,1,300,c1\n"
    "2017-10-09 06:04:00,900,4,3600,c1\n"
)


def client_for(user):
    """An API client authenticated with a fresh token of ``user`` (anonymous for None)."""
    from rest_framework.test import APIClient

    from .factories import ApiTokenFactory

    client = APIClient()
    if user is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Token {ApiTokenFactory(user=user).key}")
    return client


def require_env(name: str) -> str:
    """Integration tests need real servers; scripts/test.sh provides them. Fail in CI, skip elsewhere."""
    value = os.environ.get(name)
    if not value:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not set: run the suite with `make test`")
        pytest.skip(f"{name} not set (run `make test`, which starts the servers)")
    return value
