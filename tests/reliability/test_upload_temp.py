"""Uploads spool to FILE_UPLOAD_TEMP_DIR (under var/) and leave nothing there; leftovers of killed requests
are removed by age (issue 40). The web server's worker class fits slow uploads (config/gunicorn.py)."""
from __future__ import annotations

import os
import runpy
import time
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command

from core.services.upload_temp import remove_stale_upload_files

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def temp_dir(settings, tmp_path):
    settings.FILE_UPLOAD_TEMP_DIR = str(tmp_path / "upload-tmp")
    Path(settings.FILE_UPLOAD_TEMP_DIR).mkdir()
    settings.UPLOAD_TEMP_MAX_AGE_S = 3600.0
    return Path(settings.FILE_UPLOAD_TEMP_DIR)


def _file(directory: Path, name: str, *, age_s: float) -> Path:
    path = directory / name
    path.write_bytes(b"x" * 10)
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))
    return path


def test_the_default_temp_dir_is_under_var(settings):
    assert Path(settings.FILE_UPLOAD_TEMP_DIR).resolve().is_relative_to(Path(settings.VAR_DIR).resolve())
    assert Path(settings.FILE_UPLOAD_TEMP_DIR).is_dir()


def test_a_large_upload_streams_to_the_temp_dir_and_leaves_nothing(api_owner, team_a, temp_dir, monkeypatch):
    from core import services

    seen = {}
    real_read = services.read_upload

    def read_upload(upload):
        seen["path"] = Path(upload.temporary_file_path())
        seen["existed"] = seen["path"].exists()
        return real_read(upload)

    monkeypatch.setattr(services, "read_upload", read_upload)
    body = b"\0" * (3 * 1024 * 1024)  # over FILE_UPLOAD_MAX_MEMORY_SIZE: spooled to disk, not memory
    resp = api_owner.post("/api/models/", {"team": team_a.pk, "name": "big-junk",
                                           "file": SimpleUploadedFile("junk.onnx", body)}, format="multipart")
    assert resp.status_code == 400  # not a model; what matters is where it went and that it is gone
    assert seen["existed"] and seen["path"].parent == temp_dir
    assert list(temp_dir.iterdir()) == []


def test_stale_upload_temp_files_are_removed_and_fresh_ones_kept(temp_dir):
    stale = _file(temp_dir, "tmpab12cd34.upload.onnx", age_s=7200)
    arriving = _file(temp_dir, "tmpzz99yy88.upload.onnx", age_s=5)  # an upload still being written
    other = _file(temp_dir, "notes.txt", age_s=7200)  # not an upload temp file: never ours to delete
    assert remove_stale_upload_files() == [stale.name]
    assert not stale.exists() and arriving.exists() and other.exists()


def test_the_sweep_follows_no_symlink_and_enters_no_directory(temp_dir, tmp_path):
    victim = _file(tmp_path, "precious.upload.bin", age_s=7200)
    link = temp_dir / "tmplink.upload.onnx"
    link.symlink_to(victim)
    os.utime(link, (time.time() - 7200,) * 2, follow_symlinks=False)
    subdir = temp_dir / "tmpdir.upload"
    subdir.mkdir()
    inner = _file(subdir, "tmpinner.upload.onnx", age_s=7200)
    assert remove_stale_upload_files() == []
    assert victim.exists() and link.is_symlink() and inner.exists()


def test_the_command_and_the_beat_task_sweep(temp_dir, settings, capsys):
    from core.tasks import clean_upload_temp

    _file(temp_dir, "tmp1.upload.onnx", age_s=7200)
    call_command("clean_upload_temp")
    assert "1 stale upload temp file(s) removed" in capsys.readouterr().out
    _file(temp_dir, "tmp2.upload.csv", age_s=7200)
    assert clean_upload_temp.run() == 1 and list(temp_dir.iterdir()) == []
    assert settings.CELERY_BEAT_SCHEDULE["clean-upload-temp"]["task"] == "core.clean_upload_temp"


def test_a_missing_temp_dir_is_nothing_to_sweep(settings, tmp_path):
    settings.FILE_UPLOAD_TEMP_DIR = str(tmp_path / "gone")
    assert remove_stale_upload_files() == []


def test_the_web_server_uses_threads_and_gives_the_largest_upload_time_to_finish(monkeypatch):
    monkeypatch.setenv("ONNX_MAX_UPLOAD_BYTES", str(200 * 1024 * 1024))
    conf = runpy.run_path(str(ROOT / "config" / "gunicorn.py"))
    assert conf["worker_class"] == "gthread" and conf["threads"] > 1 and conf["client_idle_timeout"] > 0
    # a restart lets the cap arrive at the slow-but-usable rate before the worker is stopped
    assert conf["graceful_timeout"] * conf["min_upload_bytes_per_s"] >= 200 * 1024 * 1024
    for launcher in ("docker-compose.yml", "scripts/run.sh", "Dockerfile", "Makefile"):
        assert "-c config/gunicorn.py" in (ROOT / launcher).read_text().replace('", "', " "), launcher


# --- the real web server: slow uploads do not pin it, nor get killed --------------------------------------


def _gunicorn(tmp_path: Path, **env_extra):
    """gunicorn with config/gunicorn.py on a free loopback port (embedded defaults: no database server)."""
    import subprocess
    import sys

    from .faults import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_CACHE_URL")}
    env.update(DLOPT_VAR_DIR=str(tmp_path / "var"), WEB_BIND=f"127.0.0.1:{port}", PYTHONPATH=str(ROOT), **env_extra)
    log = open(tmp_path / "gunicorn.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", "config/gunicorn.py", "config.wsgi:application"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, port


def _status_of(port: int, request: bytes) -> int:
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request)
        return int(s.recv(64).split(b" ")[1])


@pytest.mark.integration
def test_slow_uploads_neither_pin_the_web_server_nor_get_killed(tmp_path):
    """Two uploads trickling in for longer than the worker timeout, on ONE worker process: a page is served
    meanwhile, and both uploads get their answer (the sync worker killed them and served nothing else)."""
    import signal
    import socket

    from tests.workers import wait_for

    proc, port = _gunicorn(tmp_path, WEB_WORKERS="1", WEB_THREADS="4", WEB_WORKER_TIMEOUT="2")
    get = b"GET /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"

    def up():
        try:
            return _status_of(port, get) == 200
        except OSError:
            return False
    try:
        wait_for(up, 60, "gunicorn to serve", lambda: (tmp_path / "gunicorn.log").read_text(errors="replace"))
        # A form body Django reads in full (the CSRF check reads request.POST), then refuses: no token in it.
        body = b"a=" + b"x" * 7998
        uploads = []
        for _ in range(2):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                      b"Content-Type: application/x-www-form-urlencoded\r\nCookie: csrftoken=" + b"A" * 32 +
                      b"\r\nContent-Length: %d\r\n\r\n" % len(body))
            uploads.append(s)
        for i in range(8):  # ~4 s of trickle: twice the worker timeout
            for s in uploads:
                s.sendall(body[i * 1000:(i + 1) * 1000])
            if i == 4:
                assert _status_of(port, get) == 200  # served while both uploads are still arriving
            time.sleep(0.5)
        for s in uploads:
            status = int(s.recv(64).split(b" ")[1])  # answered once the body was in, not killed
            s.close()
            assert status == 403
        assert "WORKER TIMEOUT" not in (tmp_path / "gunicorn.log").read_text(errors="replace")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.integration
def test_a_client_that_stops_sending_frees_its_thread(tmp_path):
    """One worker with ONE thread: a body that stalls half-way is cut after the idle timeout, and the
    thread serves the next request (without the timeout it waited on the stalled client for good)."""
    import signal
    import socket

    from tests.workers import wait_for

    proc, port = _gunicorn(tmp_path, WEB_WORKERS="1", WEB_THREADS="1", WEB_CLIENT_IDLE_TIMEOUT="1")
    get = b"GET /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"

    def up():
        try:
            return _status_of(port, get) == 200
        except OSError:
            return False
    try:
        wait_for(up, 60, "gunicorn to serve", lambda: (tmp_path / "gunicorn.log").read_text(errors="replace"))
        stalled = socket.create_connection(("127.0.0.1", port), timeout=30)
        stalled.sendall(b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                        b"Content-Type: application/x-www-form-urlencoded\r\nCookie: csrftoken=" + b"A" * 32 +
                        b"\r\nContent-Length: 10000\r\n\r\na=" + b"x" * 1000)  # ... and nothing more
        assert int(stalled.recv(64).split(b" ")[1]) < 500  # cut, answered
        assert _status_of(port, get) == 200  # the only thread is free again
        stalled.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
