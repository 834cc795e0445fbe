"""Candidate workers are sandboxed: no secrets in their environment, a private working directory,
resource limits; the Celery measure task loads candidates only in such a worker."""

import os
from pathlib import Path

import pytest

from tuning.engine.process import sandbox

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
    from tuning.engine.runners.builder import PersistentBuilder
    from tuning.engine.runners.pooled import PooledAsyncRunner

    runner = PooledAsyncRunner(threads=1, dop=1, worker_limits=sandbox.default_limits())
    builder = PersistentBuilder(max_workers=1)
    cwds = []
    try:
        for pool in (runner._pool(1), builder.pool):
            info = pool.submit("tuning.engine.process.sandbox:describe_process").result(timeout=120)
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
    from tuning.engine.measuring import measure
    from tuning.engine.measuring.measure import make_payload
    from tuning.tasks import measure_candidate

    payload = make_payload(b"not a shared library", device_type="cpu", args_info_json=[], evaluator=None,
                           threads=1)
    out = measure_candidate.run(payload)
    assert out["error"] and out["worker"].split(":")[1] != str(os.getpid())
    worker = measure._ISOLATED[(False, 0, 0)]  # (gpu, device, slot): the host's slot-0 worker
    assert worker.alive and worker.pid != os.getpid()
    info = worker.call("tuning.engine.process.sandbox:describe_process", timeout=60)
    _assert_sandboxed(info, worker.pid)


def test_a_queue_workers_gpu_slots_share_the_gpus_timing_lock(secrets_in_env, monkeypatch):
    """A remote queue's GPU worker (one per device and slot) runs on TVM's runtime only, with that
    GPU's timing lock, without a kernel cache and without the host's secrets."""
    from tuning.engine.measuring import gpu_slots
    from tuning.engine.measuring import measure
    from tuning.engine.measuring.measure import make_payload, measure_payload_isolated

    monkeypatch.setattr(gpu_slots, "list_gpus", lambda query=None: [])  # no GPU here: locks by index
    payload = make_payload(b"not a shared library", device_type="cuda", args_info_json=[], evaluator=None,
                           threads=None, device_index=1)
    out = measure_payload_isolated(dict(payload, slot=1))
    assert out["error"]  # nothing to measure on here, but the worker was made
    worker = measure._ISOLATED[(True, 1, 1)]
    env = dict(item.split(b"=", 1) for item in Path(f"/proc/{worker.pid}/environ").read_bytes().split(b"\0") if item)
    assert env[b"DLOPT_TIMING_LOCK"].decode() == gpu_slots.queue_worker_env(1)["DLOPT_TIMING_LOCK"]
    assert env[b"DLOPT_TIMING_LOCK"].endswith(b"timing-1.lock") and env[b"TVM_USE_RUNTIME_LIB"] == b"1"
    assert b"DLOPT_CUDA_CACHE_DIR" not in env  # a queue worker measures every team's candidates: no shared cache
    assert not set(SECRETS) & {k.decode() for k in env}


def test_stock_mode_workers_get_the_sandbox_too(secrets_in_env):
    """TVM's own Popen workers copy os.environ when they start: stock mode scrubs it meanwhile."""
    with sandbox.scrubbed_environ():
        assert not set(SECRETS) & set(os.environ)
        assert "PATH" in os.environ
    assert all(os.environ[k] == v for k, v in SECRETS.items())


# --- a scrubbed environment is worth nothing if the sandbox can read its ancestor's ----------------------

_READ_PARENT = ("import os\n"
                "try:\n    print('SECRET_X' in open(f'/proc/{os.getppid()}/environ').read())\n"
                "except OSError:\n    print('refused')\n")
_PARENT = ("import subprocess, sys\nfrom tuning.engine.process import sandbox\n"
           "if sys.argv[1] == 'protect':\n    assert sandbox.protect_secrets()\n"
           "print(subprocess.run([sys.executable, '-c', sys.argv[2]], env=sandbox.scrub_env(), text=True,\n"
           "                     capture_output=True).stdout.strip())\n")


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists()
                    or not Path("/usr/bin/python3").exists(), reason="needs root to run as another user")
@pytest.mark.parametrize("mode,expected", [("plain", "True"), ("protect", "refused")])
def test_a_sandbox_cannot_read_its_secret_holding_parents_environ(mode, expected):
    """As an unprivileged user (the compose image's), a sandboxed child read the worker's secrets from
    /proc/<ppid>/environ; a process that calls protect_secrets() (settings do) is non-dumpable: refused."""
    import subprocess

    root = str(Path(sandbox.__file__).resolve().parents[3])
    out = subprocess.run(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                          "/usr/bin/python3", "-c", _PARENT, mode, _READ_PARENT],
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": root, "SECRET_X": "hunter2"},
                         capture_output=True, text=True, cwd="/tmp", timeout=60)
    assert out.stdout.strip() == expected, (out.stdout, out.stderr[-500:])


def test_processes_with_the_platforms_settings_are_not_dumpable(settings):
    """Loading the settings (web, Celery workers, this test process) made the process non-dumpable."""
    assert not sandbox.is_dumpable()


# --- a sandboxed child's answer is data, never code run in the parent ----------------------------------------

class _RunsInTheUnpickler:
    """What candidate code in a worker can put on its pipe: a pickle that calls os.system when loaded."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def hostile_answer(marker: str):
    return _RunsInTheUnpickler(marker)


def test_a_workers_answer_cannot_run_code_in_the_parent(tmp_path):
    """The parent (a tuning child, a Celery measure worker, the web's import check) unpickled whatever
    the sandboxed worker wrote: a candidate ran os.system in the parent, outside the sandbox."""
    from tuning.engine.process.procpool import WorkerError, WorkerProcess, WorkerSpec

    marker = tmp_path / "ran-in-parent"
    worker = WorkerProcess(WorkerSpec(name="hostile"))
    try:
        with pytest.raises(WorkerError, match="refused answer"):
            worker.call("tests.engine.test_sandbox:hostile_answer", str(marker), timeout=120)
    finally:
        worker.close()
    assert not marker.exists()
    # the engine's own results still come back
    worker = WorkerProcess(WorkerSpec(name="probe"))
    try:
        assert "cwd" in worker.call("tuning.engine.process.sandbox:describe_process", timeout=120)
    finally:
        worker.close()


def test_the_engine_childs_answer_cannot_run_code_in_the_celery_worker(tmp_path):
    from tuning.engine.process.isolate import EngineCrashed, call_isolated

    marker = tmp_path / "ran-in-worker"
    with pytest.raises(EngineCrashed, match="refused answer"):
        call_isolated("tests.engine.test_sandbox:hostile_answer", str(marker), what="probing", scrub=True)
    assert not marker.exists()


def test_the_shared_runtime_directory_is_private_and_a_planted_one_is_refused(tmp_path, monkeypatch):
    """A GPU's timing lock lives in this user's runtime directory (not a guessable /tmp name):
    made 0700, and refused when it, or the folder in it, is a link or writable by others."""
    import stat

    monkeypatch.delenv("DLOPT_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    root = tmp_path / "dlopt"
    assert sandbox.runtime_root() == str(root)
    path = sandbox.user_runtime_dir("locks")
    assert Path(path) == root / "locks" and stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE((root / "locks").stat().st_mode) == 0o700

    (root / "locks").chmod(0o777)  # the folder, world-writable
    with pytest.raises(sandbox.UnsafeDirectory, match="only this user can write"):
        sandbox.user_runtime_dir("locks")
    (root / "locks").rmdir()
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (root / "locks").symlink_to(tmp_path / "elsewhere")  # a link to a directory of someone's choice
    with pytest.raises(sandbox.UnsafeDirectory):
        sandbox.user_runtime_dir("locks")
    root.chmod(0o777)
    with pytest.raises(sandbox.UnsafeDirectory):
        sandbox.user_runtime_dir("other")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert sandbox.runtime_root() == os.path.join(os.path.expanduser("~"), ".cache", "dlopt")


def test_workers_get_the_kernel_cache_and_timing_lock_but_no_other_dlopt_settings(monkeypatch):
    monkeypatch.setenv("DLOPT_CUDA_CACHE_DIR", "/x/cuda")
    monkeypatch.setenv("DLOPT_TIMING_LOCK", "/x/lock")
    monkeypatch.setenv("DLOPT_WEBHOOK_SECRET", "s3cret")
    kept = sandbox.scrub_env()
    assert kept["DLOPT_CUDA_CACHE_DIR"] == "/x/cuda" and kept["DLOPT_TIMING_LOCK"] == "/x/lock"
    assert "DLOPT_WEBHOOK_SECRET" not in kept


def test_a_payload_cannot_make_a_queue_host_start_workers_without_bound():
    from tuning.engine.measuring.measure import make_payload, measure_payload_isolated

    payload = make_payload(b"x", device_type="cuda", args_info_json=[], evaluator=None, threads=None)
    for bad in ({"slot": 10**6}, {"device_index": 10**6}, {"slot": -1}, {"slot": "many"}):
        assert measure_payload_isolated(dict(payload, **bad))["error"].startswith("refused payload")


def test_the_tuning_process_ships_only_a_built_shared_object(tmp_path):
    """A build worker names the artifact the secret-holding tuning process reads and ships: a link,
    or a path to /proc/self/environ, is refused as the candidate's error, not sent."""
    from tuning.engine.runners.distributed import read_artifact

    real = tmp_path / "cand.so"
    real.write_bytes(b"\x7fELF" + b"\0" * 60)
    assert read_artifact(str(real)).startswith(b"\x7fELF")
    (tmp_path / "link.so").symlink_to(real)
    for hostile in (str(tmp_path / "link.so"), "/proc/self/environ", str(tmp_path)):
        with pytest.raises((OSError, ValueError)):
            read_artifact(hostile)
