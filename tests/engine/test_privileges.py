"""Sandboxed children (candidate builds and measurements, the engine's compile-and-compare) run as an
account that owns nothing of the platform's: started as root (or with the compose image's ambient
CAP_SETUID), they cannot write the database file or the media, and cannot switch back."""

import json
import os
import shutil
import sqlite3
import stat
import subprocess
from pathlib import Path

import pytest

from common import privileges
from tuning.engine.process import sandbox

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"  # stdlib only, readable by every account (common.privileges needs no more)
as_root = pytest.mark.skipif(os.geteuid() != 0 or not Path(SYSTEM_PYTHON).exists() or not shutil.which("setpriv"),
                             reason="needs root (and a system python3, setpriv) to start a child that drops")

# What a hostile child tries once it has dropped: write the platform's database file and a media file,
# become root or its parent's user again, gain privileges through a setuid binary.
_ATTACK = r"""
import json, os, sys
from common.privileges import drop_privileges
out = {"uid_after": drop_privileges(), "resuid": os.getresuid(), "groups": os.getgroups()}
for name in ("db", "media"):
    path = sys.argv[1 + (name == "media")]
    with open(path, "rb") as fh:
        out[name + "_readable"] = bool(fh.read(1))
    try:
        open(path, "r+b").close()
        out[name + "_writable"] = True
    except PermissionError:
        out[name + "_writable"] = False
for uid in (0, int(sys.argv[3])):
    try:
        os.setresuid(uid, uid, uid)
        out["became_%d" % uid] = True
    except PermissionError:
        out["became_%d" % uid] = False
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
out["no_new_privs"] = status["NoNewPrivs"].strip()
out["cap_eff"] = status["CapEff"].strip()
out["cap_amb"] = status["CapAmb"].strip()
print(json.dumps(out))
"""


@pytest.fixture
def shared_tmp():
    """A folder under /tmp every account may pass through (pytest's own temp folders are 0700), so a
    refusal below comes from the file or folder tested, not from the path to it."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="dlopt-privileges-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def platform_files(shared_tmp):
    """A var/db.sqlite3 and a media file as `make run` leaves them: the main user's, 0644."""
    (shared_tmp / "var" / "media" / "models").mkdir(parents=True)
    db = shared_tmp / "var" / "db.sqlite3"
    with sqlite3.connect(db) as conn:
        conn.execute("create table t (x)")
    media = shared_tmp / "var" / "media" / "models" / "model.onnx"
    media.write_bytes(b"onnx bytes")
    for path in (shared_tmp / "var", shared_tmp / "var" / "media", shared_tmp / "var" / "media" / "models"):
        path.chmod(0o755)
    db.chmod(0o644)
    media.chmod(0o644)
    return db, media


def _attack(db: Path, media: Path, *, prefix: list[str], parent_uid: int) -> dict:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), privileges.SANDBOX_USER_VAR: "nobody",
           privileges.REQUIRED_VAR: "1"}
    out = subprocess.run([*prefix, SYSTEM_PYTHON, "-c", _ATTACK, str(db), str(media), str(parent_uid)], env=env,
                         capture_output=True, text=True, cwd="/", timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@as_root
def test_a_child_started_as_root_runs_as_the_sandbox_account_and_cannot_write_the_database_or_media(platform_files):
    db, media = platform_files
    out = _attack(db, media, prefix=[], parent_uid=0)
    nobody = 65534
    assert out["uid_after"] == nobody and out["resuid"] == [nobody] * 3 and out["groups"] == []
    assert out["db_readable"] and out["media_readable"]  # it reached them: the refusal is the write's
    assert out["db_writable"] is False and out["media_writable"] is False
    assert out["became_0"] is False
    assert out["no_new_privs"] == "1" and int(out["cap_eff"], 16) == 0


@as_root
def test_a_child_of_a_worker_holding_ambient_setuid_drops_every_capability(platform_files):
    """The compose worker runs as its own user with CAP_SETUID/SETGID as ambient capabilities: a
    switch between two non-root ids keeps capabilities unless the hook clears them, and a child
    that kept CAP_SETUID could become the worker (or root) again."""
    db, media = platform_files
    worker = ["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups", "--inh-caps=-all,+setuid,+setgid",
              "--ambient-caps=-all,+setuid,+setgid"]
    out = _attack(db, media, prefix=worker, parent_uid=1000)
    assert out["uid_after"] == 65534 and out["resuid"] == [65534] * 3
    assert out["became_0"] is False and out["became_1000"] is False
    assert int(out["cap_eff"], 16) == 0 and int(out["cap_amb"], 16) == 0 and out["no_new_privs"] == "1"
    assert out["db_writable"] is False and out["media_writable"] is False


@as_root
def test_a_child_that_may_not_switch_users_keeps_its_user_with_no_new_privs_and_says_so():
    """A developer's laptop, CI as a normal user: nothing to drop, no error, no_new_privs, one log line."""
    code = ("import logging, os\nlogging.basicConfig(level=logging.INFO, format='%(message)s')\n"
            "from common.privileges import drop_privileges\n"
            "print(drop_privileges(), drop_privileges(), open('/proc/self/status').read().split('NoNewPrivs:')[1].split()[0])\n")
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", SYSTEM_PYTHON, "-c", code],
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                         cwd="/", timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["65534", "65534", "1"]
    assert out.stderr.count("sandbox runs as this process's user") == 1


def test_a_root_sandbox_account_is_refused(monkeypatch):
    if not privileges.can_switch_user():
        pytest.skip("this process may not switch users: no account is looked up")
    monkeypatch.setenv(privileges.SANDBOX_USER_VAR, "root")
    with pytest.raises(privileges.PrivilegeDropError, match="is root"):
        privileges.sandbox_account()


def test_a_missing_sandbox_account_is_refused_where_required(monkeypatch):
    if not privileges.can_switch_user():
        pytest.skip("this process may not switch users: no account is looked up")
    monkeypatch.setenv(privileges.SANDBOX_USER_VAR, "no-such-dlopt-account")
    monkeypatch.setenv(privileges.REQUIRED_VAR, "1")
    with pytest.raises(privileges.PrivilegeDropError, match="no-such-dlopt-account"):
        privileges.sandbox_account()
    monkeypatch.delenv(privileges.REQUIRED_VAR)
    assert privileges.sandbox_account() is None  # not required: the worker's user, logged


def test_an_unprivileged_sandbox_needs_scrub():
    from tuning.engine.process.isolate import call_isolated

    with pytest.raises(ValueError, match="needs scrub"):
        call_isolated("tuning.engine.process.sandbox:describe_process", what="probing", sandbox_user=True)


# --- the engine's sandboxes, where this host lets the sandbox account run its Python --------------------

def _account():
    try:
        return privileges.sandbox_account()
    except privileges.PrivilegeDropError:
        return None


needs_account = pytest.mark.skipif(_account() is None, reason="this process may not switch users, or the sandbox "
                                   "account cannot read this Python installation (e.g. under a 0700 /root)")


@needs_account
def test_build_and_measure_workers_run_as_the_sandbox_account_in_a_folder_of_their_own():
    from tuning.engine.process.procpool import WorkerProcess, WorkerSpec

    uid, gid = _account()
    worker = WorkerProcess(WorkerSpec(name="probe"))
    try:
        info = worker.call("tuning.engine.process.sandbox:describe_process", timeout=120)
        cwd = Path(info["cwd"])
        assert tuple(info["uids"]) == (uid,) * 3 and tuple(info["gids"]) == (gid,) * 3 and info["groups"] in ([], [gid])
        assert cwd.stat().st_uid == uid  # its private folder was handed to it
        status = Path(f"/proc/{info['pid']}/status").read_text()
        assert "NoNewPrivs:\t1" in status
    finally:
        worker.close()
    assert not cwd.exists()  # taken back and removed


@needs_account
def test_a_gpu_measuring_worker_gets_its_timing_lock_open(tmp_path):
    """The sandbox account cannot reach the worker's private runtime folder: the lock comes as an fd."""
    from tuning.engine.measuring.gpu_slots import TIMING_LOCK_VAR
    from tuning.engine.process.procpool import WorkerProcess, WorkerSpec

    lock = tmp_path / "timing-0.lock"
    worker = WorkerProcess(WorkerSpec(name="gpu-probe", env={TIMING_LOCK_VAR: str(lock)}))
    try:
        info = worker.call("tuning.engine.process.sandbox:describe_process", timeout=120)
        env = dict(item.split(b"=", 1) for item in Path(f"/proc/{info['pid']}/environ").read_bytes().split(b"\0") if item)
        fd = int(env[sandbox.TIMING_LOCK_FD_VAR.encode()])
        assert os.readlink(f"/proc/{info['pid']}/fd/{fd}") == str(lock)
    finally:
        worker.close()


@needs_account
def test_the_engine_child_that_runs_the_tuned_model_writes_only_the_folders_handed_to_it(shared_tmp):
    from tuning.engine.process.isolate import EngineError, call_isolated

    uid, _ = _account()
    work, other = shared_tmp / "work", shared_tmp / "other"
    work.mkdir()
    other.mkdir(mode=0o755)
    (work / "database_tuning_record.json").write_text("")  # written by the worker before the call
    info = call_isolated("tuning.engine.process.sandbox:describe_process", what="probing", scrub=True, sandbox_user=True,
                         writable=[work])
    assert tuple(info["uids"]) == (uid,) * 3
    call_isolated("tests.engine.test_privileges:append_to", str(work / "database_tuning_record.json"),
                  what="writing", scrub=True, sandbox_user=True, writable=[work])
    assert (work / "database_tuning_record.json").read_text() == "x"
    # taken back: the next sandbox (another run's) cannot change what this one left
    assert all(p.stat().st_uid == os.getuid() for p in [work, *work.rglob("*")])
    with pytest.raises(EngineError, match="PermissionError"):
        call_isolated("tests.engine.test_privileges:append_to", str(other / "f"), what="writing", scrub=True,
                      sandbox_user=True)


def append_to(path: str) -> None:
    with open(path, "a") as fh:
        fh.write("x")


@needs_account
def test_taking_a_folder_back_does_not_follow_a_planted_link(shared_tmp):
    uid, gid = _account()
    target = shared_tmp / "not-the-sandboxes"
    target.write_text("")
    os.chown(target, 12345, 12345)
    work = shared_tmp / "work"
    work.mkdir()
    privileges.hand_over(work)
    (work / "link").symlink_to(target)
    os.chown(work / "link", uid, gid, follow_symlinks=False)
    sub = work / "sub"
    sub.mkdir(mode=0o500)
    os.chown(sub, uid, gid)
    privileges.take_back(work)
    assert target.stat().st_uid == 12345
    assert (work / "link").lstat().st_uid == os.getuid() and stat.S_IMODE(sub.stat().st_mode) & 0o700 == 0o700


@as_root
def test_the_hook_works_as_a_subprocess_preexec_fn(platform_files):
    """Upload parsers start their child with ``preexec_fn=drop_privileges`` (common/sandbox.py): it runs
    in the forked child before exec, and the program it runs cannot write the media."""
    _, media = platform_files
    parent = ("import subprocess, sys\nfrom common.privileges import drop_privileges\n"
              "out = subprocess.run([sys.executable, '-c', 'import os, sys\\ntry:\\n    open(sys.argv[1], \"ab\")\\n"
              "    w = True\\nexcept PermissionError:\\n    w = False\\nprint(os.getuid(), w)', sys.argv[1]],\n"
              "                     preexec_fn=drop_privileges, capture_output=True, text=True)\n"
              "print(out.stdout.strip())\n")
    out = subprocess.run([SYSTEM_PYTHON, "-c", parent, str(media)], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), privileges.SANDBOX_USER_VAR: "nobody",
                              privileges.REQUIRED_VAR: "1"}, cwd="/")
    assert out.returncode == 0, out.stderr[-1000:]
    assert out.stdout.split() == ["65534", "False"]
