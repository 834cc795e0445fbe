"""The `dlopt` CLI driven in-process against the live API (pytest-django's live_server) with real tokens."""
from __future__ import annotations

import io
import json
import stat
import threading
from dataclasses import dataclass
from typing import Any

import pytest
from django.core.files.base import ContentFile
from django.db import connection
from dlopt import Client
from dlopt.cli import main
from dlopt.config import config_path

from core.models import DLModel, Membership
from core.services import create_api_token
from tests.factories import DLModelFactory, MembershipFactory, TuningRunFactory
from tuning import services as tuning_services
from tuning.models import TuningRun

pytestmark = pytest.mark.django_db(transaction=True)


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture
def dlopt(capsys):
    def run(*argv: Any) -> Result:
        code = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)
    return run


@pytest.fixture
def logged_in(dlopt, live_server, user_owner, team_a):
    key = create_api_token(user=user_owner, name="laptop").key
    result = dlopt("login", live_server.url, "--token", key)
    assert result.code == 0, result.err
    return key


def test_login_checks_the_token_and_saves_it_owner_only(dlopt, live_server, user_owner, team_a):
    assert dlopt("login", live_server.url, "--token", "not-a-token").code == 3  # refused: nothing saved
    assert not config_path().exists()

    key = create_api_token(user=user_owner, name="laptop").key
    result = dlopt("--json", "login", live_server.url + "/api/", "--token", key)
    assert result.code == 0, result.err
    assert result.json["username"] == "alice" and result.json["teams"][0]["name"] == "Team A"
    saved = config_path()
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert stat.S_IMODE(saved.parent.stat().st_mode) == 0o700
    assert json.loads(saved.read_text()) == {"url": live_server.url, "token": key}
    assert dlopt("runs", "list").code == 0


def test_login_reads_a_piped_token(dlopt, live_server, user_owner, team_a, monkeypatch):
    # `echo $TOKEN | dlopt login URL` keeps the token out of the process list and the shell history
    key = create_api_token(user=user_owner, name="ci").key
    monkeypatch.setattr("sys.stdin", io.StringIO(key + "\n"))
    assert dlopt("login", live_server.url).code == 0
    assert json.loads(config_path().read_text())["token"] == key


def test_environment_overrides_the_saved_login(dlopt, logged_in, live_server, monkeypatch):
    monkeypatch.setenv("DLOPT_TOKEN", "revoked-or-wrong")
    result = dlopt("runs", "list")
    assert result.code == 3
    assert result.err.strip() == "dlopt: Invalid or revoked API token. (HTTP 401 authentication_failed)"
    monkeypatch.setenv("DLOPT_TOKEN", logged_in)
    monkeypatch.setenv("DLOPT_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    assert dlopt("runs", "list").code == 1


def test_not_logged_in_is_an_auth_error(dlopt):
    result = dlopt("models", "list")
    assert result.code == 3 and "dlopt login" in result.err


def test_upload_list_show_tune_and_control_a_run(dlopt, logged_in, team_a, small_cnn_bytes, tmp_path, no_broker):
    onnx = tmp_path / "tiny-cnn.onnx"
    onnx.write_bytes(small_cnn_bytes)
    uploaded = dlopt("models", "upload", onnx, "--team", team_a.slug, "--json")
    assert uploaded.code == 0, uploaded.err
    model = DLModel.objects.get(pk=uploaded.json["id"])
    assert (model.name, model.team, model.state) == ("tiny-cnn", team_a, DLModel.State.READY)

    listed = dlopt("models", "list", "--json")
    assert [m["name"] for m in listed.json] == ["tiny-cnn"]
    assert "tiny-cnn" in dlopt("models", "list").out
    assert dlopt("models", "show", "tiny-cnn", "--json").json["id"] == model.pk
    assert dlopt("models", "show", model.pk, "--team", "Team A").code == 0

    started = dlopt("tune", "tiny-cnn", "--trials", 16, "--team", team_a.slug, "--dop", "2", "--json")
    assert started.code == 0, started.err
    run = TuningRun.objects.get(pk=started.json["id"])
    assert (run.model, run.max_trials, run.dop_fixed, run.status) == (model, 16, 2, TuningRun.Status.QUEUED)
    assert no_broker == [run.pk]
    timed = dlopt("tune", "tiny-cnn", "--trials", 16, "--minutes", 20, "--team", team_a.slug)
    assert timed.code == 0 and "16 trials or 20 min" in timed.err
    timed_run = TuningRun.objects.latest("pk")
    assert timed_run.max_minutes == 20
    assert dlopt("tune", "tiny-cnn", "--trials", 16, "--minutes", 0).code == 2  # refused before any request
    TuningRun.objects.filter(pk=timed_run.pk).delete()
    no_broker.remove(timed_run.pk)

    assert [r["id"] for r in dlopt("runs", "list", "--model", "tiny-cnn", "--json").json] == [run.pk]
    assert dlopt("runs", "list", "--status", "succeeded", "--json").json == []
    assert dlopt("runs", "show", run.pk, "--json").json["status"] == "queued"
    assert "tiny-cnn" in dlopt("runs", "show", run.pk).out

    assert dlopt("runs", "pause", run.pk, "--json").json["status"] == "paused"
    assert dlopt("runs", "resume", run.pk, "--json").json["status"] == "queued"
    assert no_broker == [run.pk, run.pk]
    assert dlopt("runs", "cancel", run.pk, "--json").json["status"] == "cancelled"
    again = dlopt("runs", "cancel", run.pk)
    assert again.code == 1
    assert again.err.strip() == f"dlopt: Run {run.pk} is already cancelled. (HTTP 409 conflict)"

    second = TuningRunFactory(model=model, succeeded=True, tuned_latency_s=1e-3, untuned_latency_s=3e-3)
    compared = dlopt("runs", "compare", run.pk, second.pk)
    assert compared.code == 0
    assert f"run {run.pk}" in compared.out and "3.00" in compared.out  # second's speedup
    assert [r["id"] for r in dlopt("runs", "compare", run.pk, second.pk, "--json").json] == [run.pk, second.pk]


def test_tune_an_onnx_file_uploads_it_first(dlopt, logged_in, team_a, small_cnn_bytes, tmp_path, no_broker):
    onnx = tmp_path / "fresh.onnx"
    onnx.write_bytes(small_cnn_bytes)
    assert dlopt("tune", onnx, "--trials", 16).code == 2  # which team? a usage error
    started = dlopt("tune", onnx, "--trials", 16, "--team", "Team A", "--json")
    assert started.code == 0, started.err
    assert TuningRun.objects.get(pk=started.json["id"]).model.name == "fresh"


class PollGate:
    """Counts the client's polls of a run, so a test thread can change the run only after the CLI has
    seen its current state several times (no sleeps, no timing)."""

    def __init__(self, monkeypatch):
        self.polls = 0
        self.changed = threading.Condition()
        original = Client.run

        def counted(client, run_id):
            answer = original(client, run_id)
            with self.changed:
                self.polls += 1
                self.changed.notify_all()
            return answer

        monkeypatch.setattr(Client, "run", counted)

    def after_more_polls(self, count: int) -> None:
        with self.changed:
            start = self.polls
            assert self.changed.wait_for(lambda: self.polls >= start + count, timeout=60)


def in_thread(work) -> threading.Thread:
    def target():
        try:
            work()
        finally:
            connection.close()
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_wait_draws_progress_only_when_the_run_changed(dlopt, logged_in, model_a, monkeypatch):
    run = TuningRunFactory(model=model_a, max_trials=64)
    gate = PollGate(monkeypatch)

    def worker_moves_the_run():
        for fields in ({"status": "running", "trials_done": 16, "estimated_latency_s": 2e-3},
                       {"trials_done": 32, "estimated_latency_s": 1.5e-3},
                       {"status": "succeeded", "trials_done": 64, "tuned_latency_s": 1e-3,
                        "untuned_latency_s": 2e-3}):
            gate.after_more_polls(3)  # the CLI polls the unchanged run three times: no redraw
            TuningRun.objects.filter(pk=run.pk).update(**fields)

    thread = in_thread(worker_moves_the_run)
    result = dlopt("runs", "show", run.pk, "--wait", "--interval", "0.01")
    thread.join()
    assert result.code == 0, result.err
    assert gate.polls >= 10
    assert result.err.splitlines() == [  # stderr is not a TTY here: one plain line per change, none per poll
        f"run {run.pk}: 0/64 trials (0%), queued, est. -",
        f"run {run.pk}: 16/64 trials (25%), running, est. 2.000 ms",
        f"run {run.pk}: 32/64 trials (50%), running, est. 1.500 ms",
        f"run {run.pk}: 64/64 trials (100%), succeeded, est. 1.500 ms",
    ]
    assert f"dlopt download {run.pk}" in result.out and "2.00x" in result.out


def test_wait_says_who_paused_the_run_and_how_to_resume(dlopt, logged_in, team_a, model_a, monkeypatch,
                                                         no_broker):
    colleague = MembershipFactory(team=team_a, role=Membership.Role.MEMBER).user
    gate = PollGate(monkeypatch)

    def colleague_pauses_from_the_dashboard():
        gate.after_more_polls(2)
        run = TuningRun.objects.get(model=model_a)
        tuning_services.pause_run(actor=colleague, run=run)

    thread = in_thread(colleague_pauses_from_the_dashboard)
    result = dlopt("tune", model_a.pk, "--trials", 16, "--wait", "--interval", "0.01")
    thread.join()
    run = TuningRun.objects.get(model=model_a)
    assert result.code == 5
    assert (f"Run {run.pk} was paused at 0/16 trials: someone paused it (the dashboard or `dlopt runs pause`). "
            f"Resume it with: dlopt runs resume {run.pk} --wait") in result.err

    resumed = dlopt("runs", "resume", run.pk, "--json")
    assert resumed.code == 0 and resumed.json["status"] == "queued"


def test_wait_on_a_cancelled_or_failed_run(dlopt, logged_in, model_a):
    cancelled = TuningRunFactory(model=model_a, status=TuningRun.Status.CANCELLED)
    result = dlopt("runs", "show", cancelled.pk, "--wait", "--json")
    assert result.code == 5 and result.json["status"] == "cancelled"
    assert f"Run {cancelled.pk} was cancelled at 0/64 trials." in result.err
    failed = TuningRunFactory(model=model_a, status=TuningRun.Status.FAILED, error="Worker lost three times.")
    result = dlopt("runs", "show", failed.pk, "--wait")
    assert result.code == 1 and f"Run {failed.pk} failed: Worker lost three times." in result.err


def test_show_says_where_a_waiting_run_is_in_its_teams_queue(dlopt, logged_in, model_a):
    from django.utils import timezone

    first = TuningRunFactory(model=model_a, waiting_since=timezone.now())
    second = TuningRunFactory(model=model_a, waiting_since=timezone.now())
    result = dlopt("runs", "show", second.pk)
    assert result.code == 0
    assert f"Run {second.pk}: cnn-a (model {model_a.pk}) queued, number 2 waiting for a run slot" in result.out
    assert "DOP auto" in result.out and first.pk != second.pk


def test_wait_names_the_reason_when_the_server_paused_the_run(dlopt, logged_in, model_a):
    run = TuningRunFactory(model=model_a, paused=True, error="Could not be queued: the task broker is unreachable.")
    result = dlopt("runs", "show", run.pk, "--wait")
    assert result.code == 5
    assert (f"Run {run.pk} was paused at 0/64 trials: Could not be queued: the task broker is unreachable. "
            f"Resume it with: dlopt runs resume {run.pk} --wait") in result.err


def test_download_the_tuned_module(dlopt, logged_in, model_a, model_b, tmp_path):
    run = TuningRunFactory(model=model_a, succeeded=True, faster_engine="tvm", ratio_to_ort=0.5,
                           module_file=ContentFile(b"\x7fELF tuned module", name="m.so"))
    target = tmp_path / "out" / "tuned.so"
    target.parent.mkdir()
    result = dlopt("download", run.pk, "--module-only", "-o", target, "--json")
    assert result.code == 0, result.err
    assert target.read_bytes() == b"\x7fELF tuned module"
    assert result.json == {"run": run.pk, "path": str(target), "bytes": 17, 
                           "deploy_verdict": run.deploy_verdict.replace("×", "x")}  # an HTTP header is latin-1
    assert dlopt("download", run.pk, "--module-only", "-o", target).code == 2  # an existing file is kept...
    assert dlopt("download", run.pk, "--module-only", "-o", target, "--force").code == 0  # ...unless asked
    assert dlopt("download", run.pk, "--module-only", "-o", target.parent).code == 0
    assert (target.parent / f"run{run.pk}-tuned.so").read_bytes() == b"\x7fELF tuned module"
    assert sorted(p.name for p in target.parent.iterdir()) == [f"run{run.pk}-tuned.so", "tuned.so"]  # no .part

    assert dlopt("download", run.pk, "--module-only", "-o", tmp_path / "no-such-dir" / "m.so").code == 2

    unfinished = TuningRunFactory(model=model_a)
    result = dlopt("download", unfinished.pk, "--module-only", "-o", tmp_path / "x.so")
    assert result.code == 4 and "Not available yet" in result.err and not (tmp_path / "x.so").exists()
    other_teams = TuningRunFactory(model=model_b, succeeded=True, module_file=ContentFile(b"secret", name="s.so"))
    assert dlopt("download", other_teams.pk, "--module-only", "-o", tmp_path / "s.so").code == 4
    assert not (tmp_path / "s.so").exists()


def test_download_fetches_the_deployment_package_by_default(dlopt, logged_in, model_a, model_b, tmp_path):
    import zipfile

    from tuning.engine.deploy.package import MEMBERS

    run = TuningRunFactory(model=model_a, succeeded=True, faster_engine="tvm", ratio_to_ort=0.5,
                           module_file=ContentFile(b"\x7fELF tuned module", name="m.so"))
    result = dlopt("download", run.pk, "-o", tmp_path)
    assert result.code == 0, result.err
    package = tmp_path / f"run{run.pk}-package.zip"
    with zipfile.ZipFile(package) as zf:
        assert sorted(zf.namelist()) == sorted(MEMBERS) and zf.read("module.so") == b"\x7fELF tuned module"
    assert f"unzip {package} -d run{run.pk}-package" in result.out and "pip install apache-tvm numpy" in result.out
    assert f"python run{run.pk}-package/run.py" in result.out
    other_teams = TuningRunFactory(model=model_b, succeeded=True, module_file=ContentFile(b"secret", name="s.so"))
    assert dlopt("download", other_teams.pk, "-o", tmp_path / "s.zip").code == 4
    assert not (tmp_path / "s.zip").exists()


def test_exit_codes_and_one_line_errors(dlopt, logged_in, team_a, model_a, model_b, no_broker):
    missing = dlopt("runs", "show", 999999, "--json")
    assert missing.code == 4
    assert missing.err.strip() == "dlopt: Not found. (HTTP 404 not_found)"  # names no model class
    assert missing.json["exit_code"] == 4
    assert missing.json["error"]["code"] == "not_found" and missing.json["error"]["status"] == 404
    assert dlopt("models", "show", "no-such-model").code == 4
    assert dlopt("models", "show", model_b.name).code == 4  # another team's model is not among yours
    assert dlopt("models", "list", "--team", "team-b").code == 4

    refused = dlopt("tune", model_a.pk, "--trials", 16, "--dop", "many")
    assert refused.code == 1
    assert refused.err.startswith("dlopt: dop: ") and refused.err.count("\n") == 1
    refused = dlopt("tune", model_a.pk, "--trials", 16, "--target", '{"kind": "opencl"}')
    assert refused.code == 1 and "target" in refused.err and "(HTTP 400 invalid)" in refused.err

    assert dlopt("tune", model_a.pk, "--trials", 0).code == 2  # usage errors never reach the server
    assert dlopt("runs", "show", "latest").code == 2
    assert dlopt("runs").code == 2
    assert TuningRun.objects.count() == 0


def test_a_viewer_may_look_but_not_control(dlopt, live_server, team_a, model_a, user_viewer):
    run = TuningRunFactory(model=model_a)
    assert dlopt("login", live_server.url, "--token", create_api_token(user=user_viewer, name="v").key).code == 0
    assert dlopt("runs", "show", run.pk).code == 0
    denied = dlopt("runs", "pause", run.pk)
    assert denied.code == 3 and "(HTTP 403" in denied.err
    assert TuningRun.objects.get(pk=run.pk).status == TuningRun.Status.QUEUED


def test_python_api_same_verbs(live_server, user_owner, team_a, model_a, small_cnn_bytes, tmp_path, no_broker):
    client = Client(live_server.url, create_api_token(user=user_owner, name="py").key)
    assert client.me()["username"] == "alice"
    assert client.team_id(team_a.slug) == client.team_id("Team A") == client.team_id(team_a.pk) == team_a.pk
    (tmp_path / "m.onnx").write_bytes(small_cnn_bytes)
    uploaded = client.upload_model(tmp_path / "m.onnx", team=team_a.slug, name="py-model")
    assert uploaded["state"] == "ready"
    run = client.tune("py-model", trials=16)
    assert client.run(run["id"])["model_name"] == "py-model"
    assert client.pause(run["id"])["status"] == "paused"
    assert client.wait(run["id"])["status"] == "paused"
    assert client.cancel(run["id"])["status"] == "cancelled"
    assert [r["id"] for r in client.runs(model="py-model")] == [run["id"]]
    assert {m["name"] for m in client.models()} == {"py-model", model_a.name}
    DLModelFactory(team=team_a, name="py-model-2")
    assert len(client.models(limit=1)) == 1
