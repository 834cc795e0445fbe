"""The client package alone: no Django, no project imports, its progress bar, its error lines, and a
server that redirects the token elsewhere."""
from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from dlopt import ApiError, Client, ConnectionFailed, UsageError
from dlopt.cli import main
from dlopt.client import _multipart, api_root
from dlopt.config import Credentials, config_path, load, save
from dlopt.progress import RunProgress

from .conftest import CLIENT_SRC

PROJECT_PACKAGES = {"django", "rest_framework", "celery", "tvm", "config", "core", "tuning", "scheduling",
                    "recordcache", "frontend", "common", "tests"}


def test_the_client_imports_nothing_of_the_platform():
    # -I: no PYTHONPATH, no current directory, no user site: only the client's source and the stdlib path
    code = (f"import sys, json; sys.path.insert(0, {str(CLIENT_SRC)!r}); import dlopt, dlopt.cli; "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True,
                          cwd=str(CLIENT_SRC.parent))
    loaded = set(json.loads(done.stdout))
    assert "dlopt" in loaded
    assert not loaded & PROJECT_PACKAGES, loaded & PROJECT_PACKAGES


def test_the_package_ships_its_type_marker():
    assert (CLIENT_SRC / "dlopt" / "py.typed").is_file()
    pyproject = (CLIENT_SRC.parent / "pyproject.toml").read_text()
    assert "dependencies = []" in pyproject and 'dlopt = "dlopt.cli:main"' in pyproject


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def run_row(**fields):
    return {"id": 7, "status": "running", "trials_done": 0, "max_trials": 64, "requested_action": "",
            "estimated_latency_s": None, **fields}


def test_tty_bar_redraws_in_place_only_when_something_changed():
    stream = Tty()
    bar = RunProgress(stream)
    assert bar.update(run_row()) is True
    writes = stream.getvalue()
    for _ in range(5):
        assert bar.update(run_row()) is False  # same poll answer: not a byte written
    assert stream.getvalue() == writes
    assert bar.update(run_row(trials_done=32, estimated_latency_s=1e-3)) is True
    assert bar.update(run_row(trials_done=32, estimated_latency_s=1e-3, requested_action="pause")) is True
    bar.close()
    text = stream.getvalue()
    assert bar.draws == 3 and text.count("\r") == 3 and text.endswith("\n") and text.count("\n") == 1
    assert "32/64 trials  50%  pause requested  est. 1.000 ms" in text


def test_plain_lines_when_not_a_tty():
    stream = io.StringIO()
    bar = RunProgress(stream)
    for done in (0, 0, 8, 8, 8, 16):
        bar.update(run_row(trials_done=done))
    bar.close()
    assert stream.getvalue().splitlines() == ["run 7: 0/64 trials (0%), running, est. -",
                                              "run 7: 8/64 trials (12%), running, est. -",
                                              "run 7: 16/64 trials (25%), running, est. -"]


def test_api_errors_read_as_one_line():
    error = ApiError(400, {"detail": "max_trials: Ensure this value is at most 100000.", "code": "invalid",
                           "errors": {"max_trials": ["Ensure this value is at most 100000."],
                                      "dop": ["'many' is not\n'auto' or an integer."]}})
    assert str(error) == ("max_trials: Ensure this value is at most 100000. dop: 'many' is not 'auto' or an "
                          "integer. (HTTP 400 invalid)")
    assert error.exit_code == 1
    assert ApiError(401, {}).exit_code == ApiError(403, {}).exit_code == 3
    assert ApiError(404, {}).exit_code == 4
    assert str(ApiError(502, "<html>bad gateway</html>", reason="HTTP 502 Bad Gateway from https://x/api/me/")) \
        == "HTTP 502 Bad Gateway from https://x/api/me/. (HTTP 502)"


def test_config_is_owner_only_even_over_an_older_readable_file(tmp_path, monkeypatch):
    path = config_path()
    path.parent.mkdir(parents=True)
    path.write_text("{}")
    os.chmod(path, 0o644)
    save(Credentials(url="https://dlopt.example", token="secret"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load() == Credentials(url="https://dlopt.example", token="secret")
    monkeypatch.setenv("DLOPT_URL", "https://other.example")
    assert load() == Credentials(url="https://other.example", token="secret")
    path.write_text("not json")
    assert main(["runs", "list"]) == 3


@pytest.mark.parametrize("url,root", [
    ("https://dlopt.example.com", "https://dlopt.example.com"),
    ("https://dlopt.example.com/api/", "https://dlopt.example.com"),
    ("http://host:8000/prefix/", "http://host:8000/prefix"),
])
def test_server_urls_are_normalized(url, root):
    assert api_root(url) == root


@pytest.mark.parametrize("url", ["dlopt.example.com", "ftp://host/", "file:///etc/passwd", "https://"])
def test_only_http_urls_are_servers(url):
    with pytest.raises(UsageError):
        api_root(url)
    assert main(["login", url, "--token", "t"]) == 2


def test_multipart_file_name_cannot_inject_headers():
    body, content_type = _multipart({"team": "1"}, "file", 'a"\r\nX-Evil: 1.onnx', b"\x00\x01")
    boundary = content_type.split("boundary=")[1]
    assert b"\r\nX-Evil" not in body and b'filename="a___X-Evil: 1.onnx"' in body
    assert body.endswith(f"\r\n--{boundary}--\r\n".encode())


class Recorder(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict]] = []
    location = ""

    def do_GET(self):
        type(self).seen.append(dict(self.headers))
        if self.location:
            self.send_response(302)
            self.send_header("Location", self.location + self.path)
        else:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
        self.end_headers()
        if not self.location:
            self.wfile.write(b'{"username": "x", "teams": []}')

    def log_message(self, *args):
        pass


def serve(handler) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_redirect_never_carries_the_token_to_another_host():
    elsewhere_handler = type("Elsewhere", (Recorder,), {"seen": [], "location": ""})
    elsewhere = serve(elsewhere_handler)
    redirecting_handler = type("Redirecting", (Recorder,), {
        "seen": [], "location": f"http://127.0.0.1:{elsewhere.server_address[1]}"})
    redirecting = serve(redirecting_handler)
    try:
        client = Client(f"http://127.0.0.1:{redirecting.server_address[1]}", "the-secret-token")
        with pytest.raises(ConnectionFailed, match="redirected"):
            client.me()
        assert redirecting_handler.seen[0]["Authorization"] == "Token the-secret-token"
        assert elsewhere_handler.seen == []  # the token went nowhere else
    finally:
        redirecting.shutdown()
        elsewhere.shutdown()
