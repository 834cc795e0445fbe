"""An outside attacker's pass over issue 39 ("nothing a user sends reaches a compiler, parser or loader
outside a sandbox, and no deletion un-spends a quota"): the ten "Done when" checks, made as a team
member with a valid account and API token would make them (real requests through the Django test client,
the web process's memory measured around the request), and the bypasses tried against each defence."""
from __future__ import annotations

import gzip
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from core.models import DLModel, UsageCharge
from core.selectors import quota_usage
from scheduling.models import TraceUpload
from tuning import services
from tuning.models import MIN_TRIALS_PER_TASK, TuningRun

from .test_upload_sandbox import _constant_folding_bomb, _memory_growth, _nested_gzip, _stored_files

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

EVIL = "-load=/tmp/evil.so"
GUESSES = 25


@pytest.fixture
def no_broker(celery_outbox):
    return celery_outbox


def _start(api, model, target):
    return api.post("/api/runs/", {"model": model.pk, "max_trials": 16, "target": target}, format="json")


# --- checks 1-5: targets outside the closed schema -------------------------------------------------------

DONE_WHEN_TARGETS = {
    "cl-opt": {"kind": "llvm", "cl-opt": [EVIL]},
    "mattr": {"kind": "llvm", "mattr": ["+avx2", EVIL]},
    "libs": {"kind": "llvm", "libs": ["/tmp/evil.so"]},
    "tag": {"kind": "llvm", "tag": "nvidia/nvidia-h100"},
    "host": {"kind": "cuda", "host": {"kind": "llvm", "cl-opt": [EVIL]}},
}


@pytest.mark.parametrize("key", sorted(DONE_WHEN_TARGETS))
def test_done_when_targets_are_400_and_store_nothing(api_owner, model_a, key):
    resp = _start(api_owner, model_a, DONE_WHEN_TARGETS[key])
    assert resp.status_code == 400, resp.content[:300]
    assert f"'{key}'" in json.dumps(resp.json()["errors"]["target"])
    assert not TuningRun.objects.exists()


# Bypass attempts: the same keys spelled or carried differently. Each must be refused and store nothing.
BYPASS_TARGETS = {
    "json_string": json.dumps({"kind": "llvm", "cl-opt": [EVIL]}),
    "json_string_padded": "  \n" + json.dumps({"kind": "llvm", "cl-opt": [EVIL]}),
    "duplicate_keys_in_string": '{"kind": "llvm", "mcpu": "generic", "mcpu": "x", "cl-opt": ["' + EVIL + '"]}',
    "tvm_option_string": f"llvm -cl-opt={EVIL}",
    "kind_with_options": "llvm -mattr=+avx2",
    "list": [["kind", "llvm"], ["cl-opt", [EVIL]]],
    "upper_case": {"kind": "llvm", "CL-OPT": [EVIL]},
    "underscore": {"kind": "llvm", "cl_opt": [EVIL]},
    "unicode_hyphen": {"kind": "llvm", "cl\u2010opt": [EVIL]},
    "fullwidth": {"kind": "llvm", "\uff43l-opt": [EVIL]},
    "trailing_space": {"kind": "llvm", "cl-opt ": [EVIL]},
    "kind_upper": {"kind": "LLVM"},
    "kind_padded": {"kind": "llvm "},
    "mcpu_option": {"kind": "llvm", "mcpu": "generic -cl-opt=" + EVIL},
    "mcpu_newline": {"kind": "llvm", "mcpu": "generic\n"},
    "num_cores_bool": {"kind": "llvm", "num-cores": True},
    "num_cores_float": {"kind": "llvm", "num-cores": 2.0},
    "host_on_llvm": {"kind": "llvm", "host": "llvm"},
    "host_string": {"kind": "cuda", "host": f"llvm -cl-opt={EVIL}"},
    "mtriple_user": {"kind": "llvm", "mtriple": "x86_64-pc-linux-gnu"},
    "deep_json_string": "{" * 100_000,
}


@pytest.mark.parametrize("case", sorted(BYPASS_TARGETS))
def test_target_bypasses_are_400_and_store_nothing(api_owner, model_a, case):
    resp = _start(api_owner, model_a, BYPASS_TARGETS[case])
    assert resp.status_code == 400, (case, resp.content[:300])
    assert "target" in resp.json()["errors"], resp.json()
    assert not TuningRun.objects.exists()


def test_an_empty_target_gets_the_default_not_a_users(api_owner, model_a):
    for target in ({}, "", None):
        resp = _start(api_owner, model_a, target)
        assert resp.status_code in (201, 400), resp.content[:300]
    assert api_owner.post("/api/runs/", {"model": model_a.pk, "max_trials": 16}, format="json").status_code == 201
    assert all(set(r.target) <= {"kind", "num-cores"} for r in TuningRun.objects.all())


# --- check 6: nested gzip trace -----------------------------------------------------------------------


def _trace_post(api, team, data: bytes, filename="t.csv.gz", name="t"):
    return api.post("/api/traces/", {"team": team.pk, "name": name, "file": SimpleUploadedFile(filename, data)},
                    format="multipart")


def test_done_when_nested_gzip_trace_is_4xx_and_the_web_process_stays_small(api_owner, team_a, settings, capsys):
    bomb = _nested_gzip(400)
    _trace_post(api_owner, team_a, b"timestamp\n", filename="t.csv", name="warm")
    with _memory_growth() as grown:
        resp = _trace_post(api_owner, team_a, bomb)
    with capsys.disabled():
        print(f"\n[check 6] nested gzip ({len(bomb)} bytes -> 400 MB twice inflated): status {resp.status_code}, "
              f"web process grew {grown['mb']:.1f} MB")
    assert 400 <= resp.status_code < 500 and grown["mb"] < 100
    assert not TraceUpload.objects.exists() and not _stored_files(settings)


# --- check 7: constant-expansion ONNX -------------------------------------------------------------------


def test_done_when_constant_expansion_model_costs_the_web_process_little(api_owner, team_a, settings, capsys):
    settings.ONNX_COUNT_TUNING_TASKS = True  # TVM imports the model, as in production
    settings.UPLOAD_SANDBOX_MEMORY_MB = 1536

    def post(data, name):
        return api_owner.post("/api/models/", {"team": team_a.pk, "name": name,
                                               "file": SimpleUploadedFile("m.onnx", data)}, format="multipart")

    post(b"warm up", "warm")
    bomb = _constant_folding_bomb()
    with _memory_growth() as grown:
        resp = post(bomb, "bomb")
    with capsys.disabled():
        print(f"\n[check 7] constant-expansion ONNX ({len(bomb)} bytes): status {resp.status_code}, "
              f"web process grew {grown['mb']:.1f} MB")
    assert resp.status_code == 400 and grown["mb"] < 300
    assert not DLModel.objects.filter(name="bomb").exists()


# --- check 8: deleting a model after a real tuning run ---------------------------------------------------

FAST = {"search_population": 16, "genetic_num_iters": 1, "seed": 1}


@pytest.mark.slow
def test_done_when_deleting_a_model_after_a_real_run_leaves_the_months_usage(api_owner, model_a, user_owner, capsys):
    trials = max(8, MIN_TRIALS_PER_TASK * (model_a.num_tuning_tasks or 1))
    run = services.start_run(actor=user_owner, model=model_a, max_trials=trials, trials_per_round=trials,
                             threads=1, target={"kind": "llvm", "num-cores": 1}, options=FAST, enqueue=False)
    status = services.execute_run(run_id=run.pk, worker="attacker")
    run.refresh_from_db()
    before = quota_usage(model_a.team_id)
    assert before.tuning_trials_this_month > 0, (status, run.error)
    resp = api_owner.delete(f"/api/models/{model_a.pk}/")
    after = quota_usage(model_a.team_id)
    with capsys.disabled():
        print(f"\n[check 8] real run {status} ({run.trials_done} trials, {run.energy_joules:.1f} J); "
              f"DELETE model: {resp.status_code}; trials {before.tuning_trials_this_month} -> "
              f"{after.tuning_trials_this_month}, kWh {before.energy_kwh_this_month:.6f} -> "
              f"{after.energy_kwh_this_month:.6f}")
    assert resp.status_code in (204, 200, 409), resp.content[:300]
    assert after.tuning_trials_this_month == before.tuning_trials_this_month
    assert after.energy_kwh_this_month == pytest.approx(before.energy_kwh_this_month)
    assert UsageCharge.objects.filter(team_id=model_a.team_id).exists()


# --- checks 9-10: password guessing -------------------------------------------------------------------


def test_done_when_rotating_x_forwarded_for_meets_a_refusal(user_owner, capsys):
    c = Client()
    statuses = [c.post(reverse("login"), {"username": "alice", "password": f"guess-{i}"},
                       HTTP_X_FORWARDED_FOR=f"203.0.113.{i}").status_code for i in range(GUESSES)]
    with capsys.disabled():
        print(f"\n[check 9] dashboard login, rotating X-Forwarded-For: {statuses}")
    assert {429, 403} & set(statuses)


def test_done_when_admin_login_meets_a_refusal(user_staff, capsys):
    c = Client()
    statuses = [c.post(reverse("admin:login"), {"username": "stan", "password": f"guess-{i}", "next": "/admin/"},
                       HTTP_X_FORWARDED_FOR=f"203.0.113.{i}").status_code for i in range(GUESSES)]
    with capsys.disabled():
        print(f"\n[check 10] admin login: {statuses}")
    assert {429, 403} & set(statuses)


@pytest.mark.parametrize("header", ["HTTP_X_REAL_IP", "HTTP_FORWARDED", "HTTP_CLIENT_IP", "HTTP_TRUE_CLIENT_IP",
                                    "HTTP_CF_CONNECTING_IP", "HTTP_X_CLUSTER_CLIENT_IP"])
def test_other_address_headers_do_not_make_a_new_client(user_owner, settings, header):
    settings.LOGIN_LOCKOUT_FAILURES = 1000  # the per-address limit alone
    c = Client()
    statuses = []
    for i in range(GUESSES):
        value = f"for=203.0.113.{i}" if header == "HTTP_FORWARDED" else f"203.0.113.{i}"
        statuses.append(c.post(reverse("login"), {"username": f"user{i}", "password": "x"},
                               **{header: value}).status_code)
    assert 429 in statuses, statuses


@pytest.mark.parametrize("spelling", ["Alice", "alice ", " ALICE", "\uff41lice"])
def test_lockout_counts_every_spelling_of_a_name(user_owner, settings, spelling):
    """Ten failures under any spelling lock the account's real name from every address."""
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {
        **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "login": "10000/minute"}}
    c = Client()
    for i in range(settings.LOGIN_LOCKOUT_FAILURES):
        c.post(reverse("login"), {"username": spelling, "password": f"guess-{i}"}, REMOTE_ADDR=f"192.0.2.{i}")
    resp = c.post(reverse("login"), {"username": "alice", "password": "pw-alice"}, REMOTE_ADDR="192.0.2.250")
    assert resp.status_code == 429, (spelling, resp.status_code)


def test_trace_with_trailing_and_multi_member_gzip_is_undone_once(api_owner, team_a, settings):
    from .test_upload_sandbox import CSV

    inner = gzip.compress(CSV)
    cases = {
        "gzip_member_holding_gzip": gzip.compress(CSV) + gzip.compress(inner),
        "trailing_garbage": gzip.compress(CSV) + b"garbage",
        "bom_crlf": gzip.compress(b"\xef\xbb\xbf" + CSV.replace(b"\n", b"\r\n")),
    }
    for i, (case, data) in enumerate(cases.items()):
        resp = _trace_post(api_owner, team_a, data, name=f"t{i}")
        if case == "bom_crlf":
            assert resp.status_code in (201, 400), (case, resp.content[:300])
        else:
            assert resp.status_code == 400, (case, resp.content[:300])
    assert TraceUpload.objects.count() <= 1


# --- ledger: deleting what is still running -------------------------------------------------------------


def _running_job_placed_30_minutes_ago(model):
    import datetime as dt

    from django.utils import timezone

    from scheduling.models import Placement
    from tests.scheduling.fakes import make_job, register_gpu_node

    gpu = register_gpu_node().gpus.get(index=0)
    job = make_job(model, state="running", estimate=3600, started_at=timezone.now() - dt.timedelta(minutes=30))
    placement = Placement.objects.create(job=job, gpu=gpu, policy="horus", queue=gpu.queue,
                                         placed_at=timezone.now() - dt.timedelta(minutes=30))
    return job, placement


@pytest.mark.parametrize("what", ["model", "job", "placement"])
def test_deleting_what_a_running_gpu_job_holds_keeps_its_gpu_hours(model_a, user_staff, team_a, what):
    """Was broken: a running job's GPU time is charged when its placement is released, and a model, job or
    placement deleted by staff (the admin) while the job ran took the unreleased placement with it: the
    30 minutes of GPU time it had used vanished from the month's usage."""
    from core import services as core_services

    job, placement = _running_job_placed_30_minutes_ago(model_a)
    before = quota_usage(team_a.pk).gpu_hours_this_month
    assert before == pytest.approx(0.5, abs=0.01)
    if what == "model":
        core_services.delete_model(actor=user_staff, model=model_a)
    else:
        (job if what == "job" else placement).delete()
    assert quota_usage(team_a.pk).gpu_hours_this_month == pytest.approx(before, abs=0.01)
    (charge,) = UsageCharge.objects.filter(kind="gpu_seconds")
    assert charge.amount == pytest.approx(1800, abs=30) and "deleted while placed" in charge.label


def test_deleting_a_running_runs_model_keeps_the_energy_its_heartbeats_recorded(model_a, user_owner, user_staff,
                                                                               team_a):
    """Was broken: a heartbeat writes a running run's energy to its row and the sink charges it later; usage
    counts that gap from the row, so a model deleted (staff) mid-run took the uncharged energy with it."""
    from core import services as core_services

    run = services.start_run(actor=user_owner, model=model_a, max_trials=16, enqueue=False)
    TuningRun.objects.filter(pk=run.pk).update(status=TuningRun.Status.RUNNING, energy_joules=7200.0)
    before = quota_usage(team_a.pk).energy_kwh_this_month
    assert before == pytest.approx(0.002)
    core_services.delete_model(actor=user_staff, model=model_a)
    assert quota_usage(team_a.pk).energy_kwh_this_month == pytest.approx(before)


# --- GPU jobs: a team's model reaches the runtime in the GPU worker itself ---------------------------------


def test_a_gpu_jobs_model_is_not_parsed_or_run_in_the_worker_process(model_a, team_a):
    """Was open: the model was parsed, rebatched, given inputs and compiled or loaded inside the Celery GPU
    worker. It now runs in a limited child (scheduling.job_process) that answers JSON."""
    import datetime as dt

    from django.utils import timezone

    from scheduling.models import GpuJob, Placement
    from scheduling.services.execution import execute_job
    from tests.scheduling.fakes import FakeNvml, fake_gpu, make_job, register_gpu_node

    gpu = register_gpu_node().gpus.get(index=0)
    job = make_job(model_a, state="placed", estimate=600, batch_size=4096)  # the largest batch a job may ask
    placement = Placement.objects.create(job=job, gpu=gpu, policy="horus", queue=gpu.queue,
                                         placed_at=timezone.now() - dt.timedelta(seconds=1))
    with _memory_growth() as grown:
        execute_job(job_id=job.pk, placement_id=placement.pk, worker="gpu-worker",
                    nvml=FakeNvml([fake_gpu(), fake_gpu()]))
    job.refresh_from_db()
    assert job.state == GpuJob.State.FAILED and "runtime" in job.error, job.error  # no CUDA runtime here
    # small_cnn's inputs at batch 4096 are ~150 MB of numpy arrays: made in this process, not in a child
    assert grown["mb"] < 50, f"the worker process grew by {grown['mb']:.0f} MB running a team's model"


# --- throttles: an IPv6 client picks a new address for every guess -------------------------------------------


def test_password_spraying_from_one_ipv6_64_meets_the_login_limit(user_owner):
    """Was broken: the per-address limit counted single addresses, and an IPv6 host owns a whole /64, so a
    new address per guess (a different user name each time, so no account's lockout is reached) was never
    limited."""
    c = Client()
    statuses = [c.post(reverse("login"), {"username": f"user{i}", "password": "Spring2026!"},
                       REMOTE_ADDR=f"2001:db8:1:2::{i + 1:x}").status_code for i in range(GUESSES)]
    assert statuses == [200] * 10 + [429] * (GUESSES - 10), statuses
    other_network = c.post(reverse("login"), {"username": "alice", "password": "pw-alice"},
                           REMOTE_ADDR="2001:db8:1:3::1")
    assert other_network.status_code == 302  # another /64 is another client


def test_rate_limits_count_ipv6_by_its_64_and_ipv4_mapped_as_ipv4(settings, rf):
    from core.api.throttles import UserThrottle
    from core.client_address import client_network

    cases = {"2001:db8:1:2:aaaa:bbbb:cccc:dddd": "2001:db8:1:2::/64", "::ffff:198.51.100.7": "198.51.100.7",
             "198.51.100.7": "198.51.100.7"}
    for address, counted in cases.items():
        request = rf.get("/", REMOTE_ADDR=address)
        assert client_network(request) == counted == UserThrottle().get_ident(request), address
    settings.NUM_PROXIES = 1
    assert client_network(rf.get("/", HTTP_X_FORWARDED_FOR="not-an-address", REMOTE_ADDR="10.0.0.1")) \
        == "not-an-address"


# --- ONNX tricks ---------------------------------------------------------------------------------------------


def _onnx_tricks() -> dict[str, bytes]:
    import io
    import zipfile

    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from tests.factories import zoo_model

    good = zoo_model("small_cnn").data
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])

    def model(nodes, inits=(), opsets=(("", 17),)):
        graph = helper.make_graph(nodes, "g", [x], [y], initializer=list(inits))
        return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])

    external = numpy_helper.from_array(np.zeros((1, 4), np.float32), "w")
    external.ClearField("raw_data")
    external.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "../../../../etc/passwd"), ("offset", "0"), ("length", "16")):
        external.external_data.add(key=k, value=v)
    in_subgraph = model([helper.make_node("If", ["c"], ["y"], then_branch=helper.make_graph(
        [helper.make_node("Identity", ["w"], ["t"])], "then", [], [helper.make_tensor_value_info("t", 1, [1, 4])],
        initializer=[external]), else_branch=helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"])], "else", [], [helper.make_tensor_value_info("e", 1, [1, 4])]))],
        inits=[numpy_helper.from_array(np.array(True), "c")])
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("model.onnx", good)
    bomb_in_loop = _constant_folding_bomb()
    return {
        "gzip_of_a_model": gzip.compress(good),
        "zip_of_a_model": buf.getvalue(),
        "gzip_magic_then_model": b"\x1f\x8b" + good,
        "external_data_outside": model([helper.make_node("Add", ["x", "w"], ["y"])], inits=[external])
        .SerializeToString(),
        "external_data_in_if_branch": in_subgraph.SerializeToString(),
        "custom_domain_op": model([helper.make_node("Evil", ["x"], ["y"], domain="com.evil")],
                                  opsets=(("", 17), ("com.evil", 1))).SerializeToString(),
        "python_op": model([helper.make_node("PyOp", ["x"], ["y"], domain="ai.onnx.contrib")],
                           opsets=(("", 17), ("ai.onnx.contrib", 1))).SerializeToString(),
        "constant_expansion": bomb_in_loop,
    }


ONNX_TRICKS = _onnx_tricks()


@pytest.mark.parametrize("case", sorted(ONNX_TRICKS))
def test_onnx_tricks_are_400_and_store_nothing(api_owner, team_a, settings, case):
    settings.ONNX_COUNT_TUNING_TASKS = True
    settings.UPLOAD_SANDBOX_MEMORY_MB = 1536
    resp = api_owner.post("/api/models/", {"team": team_a.pk, "name": case,
                                           "file": SimpleUploadedFile("m.onnx", ONNX_TRICKS[case])},
                          format="multipart")
    assert resp.status_code == 400, (case, resp.content[:300])
    assert "root:" not in resp.content.decode(errors="replace")
    assert not DLModel.objects.exists() and not _stored_files(settings)


# --- the parser child's import path ---------------------------------------------------------------------------


def test_the_parser_childs_writable_folder_is_not_on_its_import_path(tmp_path):
    """Was broken: ``python -m`` puts the working directory first on sys.path, and the child's working
    directory is the one folder the sandbox account may write (as may every other sandboxed child of that
    account, another team's included): a ``json.py`` or ``csv.py`` left there would run as the next parser's
    standard library."""
    from common.sandbox import run_in_child

    cwd = run_in_child("os:getcwd", memory_mb=0, cpu_s=10, wall_s=30)
    path = run_in_child("sys:path.copy", memory_mb=0, cpu_s=10, wall_s=30)
    assert cwd.startswith(tempfile_dir()) and "dlopt-upload-" in cwd
    assert not any(entry in ("", ".") or "dlopt-upload-" in entry for entry in path), path


def tempfile_dir() -> str:
    import tempfile

    return tempfile.gettempdir()


# --- a stored model's features at another batch size ----------------------------------------------------------


def test_features_at_another_batch_are_computed_in_the_sandbox(model_a, settings, capsys):
    """Was broken: a GPU job's prediction (its submission, and the dashboard's preview on every batch size
    typed) parsed the team's stored ONNX file and ran shape inference in the web process: up to
    ONNX_MAX_UPLOAD_BYTES of protobuf per request, outside the sandbox's limits. It now runs in the upload
    sandbox, under its limits: one past them falls back to the linearly scaled features."""
    from scheduling import adapters

    exact = adapters._model_features(model_a, 4)
    assert exact["batch_size"] == 4 and not exact.get("batch_scaled"), exact
    assert exact["total_flops"] == pytest.approx(model_a.total_flops * 4, rel=0.05)
    settings.UPLOAD_SANDBOX_WALL_S = 0.01  # the parser child is stopped before it answers
    stopped = adapters._model_features(model_a, 8)
    assert stopped["batch_scaled"] is True and stopped["batch_size"] == 8


# --- the admin's password change: a password oracle for a stolen staff session -----------------------------------


def test_guessing_the_password_on_the_admins_password_change_meets_the_lockout(user_staff, settings):
    """Was broken: /admin/password_change/ checks the current password with no limit (no sign-in signal),
    so a stolen staff session could guess the password there, then mint API tokens with it."""
    c = Client()
    c.force_login(user_staff)
    url = reverse("admin:password_change")
    new = {"new_password1": "A-new-long-passphrase-42", "new_password2": "A-new-long-passphrase-42"}
    statuses = [c.post(url, {"old_password": f"guess-{i}", **new}).status_code for i in range(GUESSES)]
    assert 429 in statuses and set(statuses[statuses.index(429):]) == {429}, statuses
    resp = c.post(url, {"old_password": "pw-stan", **new})
    assert resp.status_code == 429 and int(resp["Retry-After"]) > 0
    user_staff.refresh_from_db()
    assert user_staff.check_password("pw-stan")  # unchanged
    login = Client().post(reverse("admin:login"), {"username": "stan", "password": "pw-stan", "next": "/admin/"})
    assert login.status_code == 429  # the name is locked for sign-in too


def test_the_admins_password_change_still_changes_a_password(user_staff):
    c = Client()
    c.force_login(user_staff)
    resp = c.post(reverse("admin:password_change"), {"old_password": "pw-stan", "new_password1": "A-new-long-pass-42",
                                                     "new_password2": "A-new-long-pass-42"})
    assert resp.status_code == 302
    user_staff.refresh_from_db()
    assert user_staff.check_password("A-new-long-pass-42")
