"""Candidate workers are sandboxed: no secrets in their environment, a private working directory,
resource limits; the Celery measure task loads candidates only in such a worker."""

import os
from pathlib import Path

import pytest

from tuning.engine import sandbox

SECRETS = {"DATABASE_URL": "postgres://u:pw@db/x", "DJANGO_SECRET_KEY": "s3cret", "REDIS_URL": "redis://:pw@r/0",
           "CELERY_BROKER_URL": "redis://:pw@r/1", "AWS_SECRET_ACCESS_KEY": "k", "TEST_DATABASE_URL": "postgres://t"}


@pytest.fixture
def secrets_in_env(monkeypatch):
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)


def _proc_environ(pid: int) -> set[str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return {item.split(b"=", 1)[0].decode() for item in raw.split(b"\0") if item}


def _proc_limits(pid: int) -> dict[str, str]:
    rows = Path(f"/proc/{pid}/limits").read_text().splitlines()[1:]
    return {r[:26].strip(): r[26:47].strip() for r in rows}


def _assert_sandboxed(info: dict, pid: int, *, address_space: bool = True) -> None:
    assert not set(SECRETS) & set(info["env"]), info["env"]
    assert not set(SECRETS) & _proc_environ(pid)  # the initial environment block too
    assert Path(info["cwd"]).name.startswith("dlopt-sandbox-") and info["cwd"] != os.getcwd()
    limits = _proc_limits(pid)
    if address_space:
        assert limits["Max address space"] == str(sandbox.default_limits()["as_bytes"])
    assert limits["Max cpu time"] == str(sandbox.DEFAULT_CPU_S)
    assert limits["Max open files"] == str(sandbox.DEFAULT_NOFILE)
    assert info["limits"]["nofile"] == (sandbox.DEFAULT_NOFILE, sandbox.DEFAULT_NOFILE)  # soft = hard


def test_measuring_and_building_workers_are_sandboxed(secrets_in_env):
    from tuning.engine.builder import PersistentBuilder
    from tuning.engine.runner import PooledAsyncRunner

    runner = PooledAsyncRunner(threads=1, dop=1, worker_limits=sandbox.default_limits())
    builder = PersistentBuilder(max_workers=1)
    cwds = []
    try:
        for pool in (runner._pool(1), builder.pool):
            info = pool.submit("tuning.engine.sandbox:describe_process").result(timeout=120)
            _assert_sandboxed(info, info["pid"])
            cwds.append(info["cwd"])
        assert len(set(cwds)) == 2  # one private directory per worker
    finally:
        runner.shutdown()
        builder.shutdown()
    assert not any(Path(c).exists() for c in cwds)  # the private directory goes with the worker


def test_gpu_measuring_workers_have_no_address_space_cap_but_the_rest():
    assert sandbox.default_limits(gpu=True)["as_bytes"] is None
    assert sandbox.default_limits(gpu=True)["nofile"] == sandbox.DEFAULT_NOFILE


def test_celery_measure_task_measures_in_a_sandboxed_subprocess(secrets_in_env):
    """The distributed measure task never loads a shipped .so in the Celery worker process."""
    from tuning.engine import measure
    from tuning.engine.measure import make_payload
    from tuning.tasks import measure_candidate

    payload = make_payload(b"not a shared library", device_type="cpu", args_info_json=[], evaluator=None,
                           threads=1)
    out = measure_candidate.run(payload)
    assert out["error"] and out["worker"].split(":")[1] != str(os.getpid())
    worker = measure._ISOLATED[False]
    assert worker.alive and worker.pid != os.getpid()
    info = worker.call("tuning.engine.sandbox:describe_process", timeout=60)
    _assert_sandboxed(info, worker.pid)


def test_stock_mode_workers_get_the_sandbox_too(secrets_in_env):
    """TVM's own Popen workers copy os.environ when they start: stock mode scrubs it meanwhile."""
    with sandbox.scrubbed_environ():
        assert not set(SECRETS) & set(os.environ)
        assert "PATH" in os.environ
    assert all(os.environ[k] == v for k, v in SECRETS.items())
