"""Every API operation fuzzed from the OpenAPI schema with Schemathesis: zero 5xx.

The schema is loaded from the WSGI app (/api/schema/); each operation gets data that fits the schema
(positive) and data that does not (negative), authenticated with a real API token of a team owner,
with path ids pointing at real objects of that team (so the fuzz reaches serializers and services,
not just 404s). Staff-only operations are fuzzed again as staff. Each request runs in a rolled-back
savepoint, so every example meets the same world. Bounded: WRITE_EXAMPLES per write operation,
READ_EXAMPLES per read.
"""
from __future__ import annotations

import re

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, transaction
from django.urls import resolve
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from .test_access_matrix import OBJECT_FOR

pytestmark = [pytest.mark.slow, pytest.mark.django_db]

WRITE_EXAMPLES, READ_EXAMPLES = 25, 10  # per operation, positive and negative data mixed
STAFF_OPS = re.compile(r"/(drain|undrain|activate|place)/$|^/api/quotas/\{id\}/$")


@pytest.fixture
def in_process_wsgi():
    """Serve WSGI requests in this thread without closing the test's database connection (as Django's
    test client does)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.fixture
def api_schema(in_process_wsgi, world):
    from config.wsgi import application

    # The schema needs a login (issue 11 s.7): read it with the owner's token.
    return schemathesis.openapi.from_wsgi("/api/schema/?format=json", application,
                                          headers={"Authorization": f"Token {world.tokens['owner']}"})


def _object_for(path: str, world) -> int | None:
    if "{" not in path:
        return None
    name = resolve(re.sub(r"\{[^}]+\}", "1", path)).url_name
    key = name if name in OBJECT_FOR else max((k for k in OBJECT_FOR if name.startswith(k + "-")), key=len,
                                              default=None)
    return getattr(world, OBJECT_FOR[key]).pk if key else None


def _fuzz(operation, headers, path_parameters, failures, examples, statuses):
    strategy = st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE, path_parameters=path_parameters),
        operation.as_strategy(GenerationMode.NEGATIVE, path_parameters=path_parameters),
    )

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case):
        with transaction.atomic():
            try:
                response = case.call(headers=headers)
            finally:
                transaction.set_rollback(True)
        statuses[response.status_code // 100 * 100] = statuses.get(response.status_code // 100 * 100, 0) + 1
        if response.status_code >= 500:
            failures.append(f"{response.status_code} {case.method} {case.formatted_path} query={case.query!r} "
                            f"body={str(case.body)[:300]!r}: {response.text[:300]!r}")

    run()


def test_every_operation_survives_fuzzing(api_schema, world, celery_outbox):
    failures, fuzzed, statuses = [], [], {}
    owner = {"Authorization": f"Token {world.tokens['owner']}"}
    staff = {"Authorization": f"Token {world.tokens['staff']}"}
    for result in api_schema.get_all_operations():
        operation = result.ok()
        pk = _object_for(operation.path, world)
        params = {p.name: pk for p in operation.path_parameters} if pk is not None else None
        write = operation.method.upper() != "GET"
        _fuzz(operation, owner, params, failures, WRITE_EXAMPLES if write else READ_EXAMPLES, statuses)
        if write and STAFF_OPS.search(operation.path):
            _fuzz(operation, staff, params, failures, READ_EXAMPLES, statuses)
        fuzzed.append(f"{operation.method.upper()} {operation.path}")
    print(f"fuzzed {len(fuzzed)} operations, responses by class: {dict(sorted(statuses.items()))}")
    assert len(fuzzed) >= 60, fuzzed
    assert statuses.get(200, 0) > 200 and statuses.get(400, 0) > 200  # it got through validation, and past it
    writes = [f for f in fuzzed if not f.startswith("GET")]
    assert len(writes) >= 25, writes
    assert not failures, f"{len(failures)} server errors:\n" + "\n".join(sorted(set(failures))[:40])
