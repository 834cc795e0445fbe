"""common.sandbox: a parser of untrusted bytes runs in a limited, scrubbed, short-lived child and only
JSON comes back. Plain pytest, no Django."""
from __future__ import annotations

import os
import resource

import pytest

from common.sandbox import SandboxFailure, run_in_child

from . import sandbox_targets as t

LIMITS = dict(memory_mb=1024, cpu_s=20, wall_s=30)


def test_result_and_input_bytes_come_back_as_plain_data(monkeypatch):
    monkeypatch.setenv("SECRET_KEY", "not-for-children")
    monkeypatch.setenv("DATABASE_URL", "postgres://user:pw@db/x")
    out = run_in_child(t.describe, data=b"\x1f\x8bABCDEF" * 1000, **LIMITS)
    assert out["data_len"] == 8000 and out["head"] == "1f8b4142"
    assert "SECRET_KEY" not in out["env"] and "DATABASE_URL" not in out["env"]
    assert out["as"] == 1024 * 1024 * 1024 and out["cpu"] == 20
    assert out["ppid"] == os.getpid() and out["pid"] != os.getpid()
    assert os.path.basename(out["cwd"]).startswith("dlopt-upload-") and not os.path.exists(out["cwd"])  # removed


def test_prints_do_not_corrupt_the_answer():
    assert run_in_child("tests.common.sandbox_targets:chatty", [21], **LIMITS) == 42


def test_memory_limit_is_a_memory_failure_and_the_parent_stays_small():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(SandboxFailure) as err:
        run_in_child(t.allocate, [2048], memory_mb=512, cpu_s=20, wall_s=30)
    assert err.value.reason == "memory" and "512 MB" in str(err.value)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 * 1024  # KiB
    assert run_in_child(t.allocate, [64], memory_mb=512, cpu_s=20, wall_s=30) == 64 * 1024 * 1024


def test_cpu_limit_stops_a_spinning_parser():
    with pytest.raises(SandboxFailure) as err:
        run_in_child(t.spin, memory_mb=512, cpu_s=1, wall_s=60)
    assert err.value.reason == "cpu_time" and "1 s of CPU time" in str(err.value)


def test_wall_clock_limit_kills_a_sleeping_parser():
    with pytest.raises(SandboxFailure) as err:
        run_in_child(t.sleep_forever, memory_mb=512, cpu_s=20, wall_s=1.5, what="reading a trace")
    assert err.value.reason == "wall_clock" and "reading a trace" in str(err.value)


def test_a_crash_is_a_failure_not_a_crash_of_the_caller():
    with pytest.raises(SandboxFailure) as err:
        run_in_child(t.crash, **LIMITS)
    assert err.value.reason == "crashed" and "SIGSEGV" in str(err.value)
    with pytest.raises(SandboxFailure) as err:
        run_in_child(t.exits_silently, **LIMITS)
    assert err.value.reason == "crashed" and "code 7" in str(err.value)


def test_an_unforeseen_exception_is_reported_by_name():
    with pytest.raises(SandboxFailure) as err:
        run_in_child(t.raises, **LIMITS)
    assert err.value.reason == "raised" and err.value.error_type == "KeyError"
    with pytest.raises(SandboxFailure) as err:  # a result JSON cannot carry is refused in the child
        run_in_child(t.not_json, **LIMITS)
    assert err.value.reason == "raised"


def test_an_oversized_answer_is_refused():
    with pytest.raises(SandboxFailure) as err:
        run_in_child(t.huge_answer, [200_000], max_answer_bytes=100_000, **LIMITS)
    assert err.value.reason == "bad_answer"


def test_hook_runs_in_the_child_before_the_target():
    assert run_in_child(t.hook_seen, preexec="tests.common.sandbox_targets:mark_hook", **LIMITS) is True
    assert run_in_child(t.hook_seen, **LIMITS) is False


def test_only_importable_functions_are_accepted():
    with pytest.raises(ValueError):
        run_in_child(lambda: 1, **LIMITS)


def test_a_watched_child_is_handed_to_its_caller_and_killed_when_poll_says_stop():
    import psutil

    started, polls = [], []

    def poll() -> bool:
        assert psutil.pid_exists(started[0])  # the child runs while it is polled
        polls.append(1)
        return len(polls) == 2

    with pytest.raises(SandboxFailure) as err:
        run_in_child(t.sleep_forever, memory_mb=0, cpu_s=20, wall_s=60, what="running a job",
                     on_start=started.append, poll=poll)
    assert err.value.reason == "stopped" and "running a job" in str(err.value) and len(polls) == 2
    assert started[0] != os.getpid() and not psutil.pid_exists(started[0])  # killed and reaped


def test_open_files_are_capped_when_asked():
    out = run_in_child(t.describe, **LIMITS, nofile=256)
    assert out["nofile"] == 256
