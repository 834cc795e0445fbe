"""Every upload is parsed in a sandboxed child, never in the web or Celery worker process (issue 39, items 2
and 3): a tiny model that TVM folds into gigabytes of constants, and gzip inside gzip, cost the process that
serves the request (here: the test process) next to nothing; a child stopped at its memory limit is a clear
400 (inline) or a final ``invalid`` verdict (the Celery task), with nothing stored; normal uploads still work."""
from __future__ import annotations

import bz2
import gzip
import lzma
import resource
import threading
import zipfile
import zlib
from contextlib import contextmanager
from io import BytesIO
from pathlib import Path

import numpy as np
import psutil
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from onnx import TensorProto, helper, numpy_helper
from rest_framework.test import APIClient

from core import services as core_services
from core import tasks
from core.models import DLModel
from scheduling.models import TraceUpload

pytestmark = pytest.mark.django_db

MB = 1024 * 1024
PHILLY_HEAD = "timestamp,duration,num_gpus,gpu_time,cluster\n"
GOOD_ROW = "2017-10-09 06:00:00,600,1,600,c1\n"


def _constant_folding_bomb(n: int = 16384) -> bytes:
    """~200 bytes: two ConstantOfShape nodes of an [n, n] float tensor (1 GiB each at n=16384) added. Every cap
    on the graph passes (2**28 elements per tensor, 8 GiB of activations), but TVM's importer folds the
    constants: importing it takes over 3 GB."""
    shape = helper.make_node("Constant", [], ["s"], value=numpy_helper.from_array(np.array([n, n], dtype=np.int64)))

    def fill(out: str, value: float):
        return helper.make_node("ConstantOfShape", ["s"], [out],
                                value=helper.make_tensor("v", TensorProto.FLOAT, [1], [value]))

    graph = helper.make_graph([shape, fill("a", 1.0), fill("b", 2.0), helper.make_node("Add", ["a", "b"], ["y"])],
                              "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


@contextmanager
def _memory_growth():
    """How much this process's memory grew while the block ran, in MB (``grown["mb"]``): the larger of the
    growth of its peak RSS (which an earlier, higher peak can hide) and of its RSS sampled every 5 ms."""
    proc, grown, done = psutil.Process(), {"mb": 0.0}, threading.Event()
    start_rss, start_peak, top = proc.memory_info().rss, _peak_rss_mb(), [0]

    def sample():
        while not done.wait(0.005):
            top[0] = max(top[0], proc.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield grown
    finally:
        done.set()
        sampler.join()
        grown["mb"] = max(_peak_rss_mb() - start_peak, (top[0] - start_rss) / MB)


def _stored_files(settings) -> list[Path]:
    root = Path(settings.MEDIA_ROOT)
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


@pytest.fixture
def uploader(django_user_model):
    user = django_user_model.objects.create_user(username="uploader", password="pw")
    team = core_services.create_team(name="Upload Team", owner=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {core_services.create_api_token(user=user, name='t').key}")
    return client, team, user


@pytest.fixture
def counting(settings):
    """Tuning tasks counted (TVM imports the model), as in production; a child memory cap that a real model
    fits in and the bomb does not."""
    settings.ONNX_COUNT_TUNING_TASKS = True
    settings.UPLOAD_SANDBOX_MEMORY_MB = 1536
    return settings


def _model_post(client, team, data: bytes, name="m"):
    return client.post("/api/models/", {"team": team.pk, "name": name, "file": SimpleUploadedFile("m.onnx", data)},
                       format="multipart")


def _trace_post(client, team, data: bytes, filename="t.csv", name="t"):
    return client.post("/api/traces/", {"team": team.pk, "name": name, "file": SimpleUploadedFile(filename, data)},
                       format="multipart")


# --- ONNX -------------------------------------------------------------------------------------------------


def test_constant_folding_bomb_costs_the_web_process_nothing_and_is_a_clear_400(uploader, counting):
    client, team, _ = uploader
    bomb = _constant_folding_bomb()
    assert len(bomb) < 400
    _model_post(client, team, b"warm up the request path", name="warm")  # imports the view's lazy modules
    with _memory_growth() as grown:
        resp = _model_post(client, team, bomb, name="bomb")
    assert grown["mb"] < 300, f"the web process's memory grew by {grown['mb']:.0f} MB"
    assert resp.status_code == 400, resp.content[:400]
    body = resp.json()
    assert body["code"] == "validation_aborted", body
    assert "memory" in body["detail"] and "UPLOAD_SANDBOX_MEMORY_MB" in body["detail"] and "Traceback" not in body["detail"]
    assert not DLModel.objects.exists() and not _stored_files(counting)


def test_dashboard_upload_of_the_bomb_shows_the_refusal_and_stores_nothing(uploader, counting):
    _, team, user = uploader
    dash = Client()
    dash.force_login(user)
    resp = dash.post("/models/upload/", {"team": team.pk, "name": "bomb", "description": "",
                                         "file": SimpleUploadedFile("m.onnx", _constant_folding_bomb())})
    html = resp.content.decode()
    assert resp.status_code == 200 and "validation_aborted" in html and "UPLOAD_SANDBOX_MEMORY_MB" in html
    assert not DLModel.objects.exists() and not _stored_files(counting)


def test_a_validator_past_its_wall_clock_limit_is_a_clear_400(uploader, small_cnn_bytes, settings):
    client, team, _ = uploader
    settings.UPLOAD_SANDBOX_WALL_S = 0.05  # not even the interpreter starts in time
    resp = _model_post(client, team, small_cnn_bytes)
    assert resp.status_code == 400 and resp.json()["code"] == "validation_aborted", resp.content[:300]
    assert "UPLOAD_SANDBOX_WALL_S" in resp.json()["detail"]
    assert not DLModel.objects.exists() and not _stored_files(settings)


def test_async_validation_marks_a_model_killed_by_its_limit_invalid_once(uploader, counting, monkeypatch,
                                                                          django_capture_on_commit_callbacks):
    """The Celery task: the child's death is a final verdict, the task itself succeeds (no redelivery loop)."""
    client, team, _ = uploader
    counting.ONNX_ASYNC_VALIDATION_BYTES = 0
    queued = []
    monkeypatch.setattr(tasks.validate_model, "delay", queued.append)
    with django_capture_on_commit_callbacks(execute=True):
        resp = _model_post(client, team, _constant_folding_bomb(), name="bomb")
    assert resp.status_code == 202 and queued == [resp.json()["id"]]
    with _memory_growth() as grown, django_capture_on_commit_callbacks(execute=True):
        result = tasks.validate_model.apply(args=[queued[0]])  # the task as the worker runs it
    assert result.successful() and result.get() == "invalid", result.traceback
    assert grown["mb"] < 300, f"the worker process's memory grew by {grown['mb']:.0f} MB"
    row = DLModel.objects.get(pk=queued[0])
    assert row.state == "invalid" and row.error_code == "validation_aborted" and "memory" in row.error_message
    assert row.file.name == "" and not _stored_files(counting)
    redelivered = tasks.validate_model.apply(args=[queued[0]])
    assert redelivered.successful() and redelivered.get() is None  # a second delivery changes nothing
    assert DLModel.objects.get(pk=queued[0]).error_code == "validation_aborted"


def test_async_validation_of_a_normal_model_ends_ready_with_its_features(uploader, small_cnn_bytes, settings,
                                                                          monkeypatch,
                                                                          django_capture_on_commit_callbacks):
    client, team, _ = uploader
    settings.ONNX_ASYNC_VALIDATION_BYTES = 0
    queued = []
    monkeypatch.setattr(tasks.validate_model, "delay", queued.append)
    with django_capture_on_commit_callbacks(execute=True):
        resp = _model_post(client, team, small_cnn_bytes, name="good")
    assert resp.status_code == 202 and queued == [resp.json()["id"]]
    result = tasks.validate_model.apply(args=[queued[0]])
    assert result.successful() and result.get() == "ready"
    row = DLModel.objects.get(pk=queued[0])
    assert row.total_flops > 0 and row.param_count > 0 and row.inputs and row.op_histogram.get("Conv")


def test_a_normal_model_uploads_inline_with_its_features_and_tuning_tasks(uploader, small_cnn_bytes, counting):
    client, team, _ = uploader
    resp = _model_post(client, team, small_cnn_bytes, name="good")
    assert resp.status_code == 201, resp.content[:400]
    body = resp.json()
    assert body["state"] == "ready" and body["total_flops"] > 0 and body["inputs"]
    assert body["num_tuning_tasks"] and body["num_tuning_tasks"] > 0
    assert len(_stored_files(counting)) == 1


# --- traces -----------------------------------------------------------------------------------------------


def _nested_gzip(csv_mb: int = 400) -> bytes:
    """gzip of gzip of a large repetitive CSV: a few KB that inflate twice to ``csv_mb`` MB. Built as a
    stream, so making it does not raise this process's peak memory (which the tests measure)."""
    inner, outer = zlib.compressobj(9, zlib.DEFLATED, 31), zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [outer.compress(inner.compress(PHILLY_HEAD.encode()))]
    block = GOOD_ROW.encode() * (MB // len(GOOD_ROW))
    for _ in range(csv_mb):
        parts.append(outer.compress(inner.compress(block)))
    parts += [outer.compress(inner.flush()), outer.flush()]
    return b"".join(parts)


@pytest.fixture(scope="module")
def nested_gzip() -> bytes:
    return _nested_gzip()


def test_nested_gzip_trace_is_a_400_and_the_web_process_stays_small(uploader, settings, nested_gzip):
    client, team, _ = uploader
    assert len(nested_gzip) < 4096
    _trace_post(client, team, b"timestamp\n", name="warm")  # imports the view's lazy modules
    with _memory_growth() as grown:
        resp = _trace_post(client, team, nested_gzip, filename="t.csv.gz")
    assert grown["mb"] < 100, f"the web process's memory grew by {grown['mb']:.0f} MB"
    assert resp.status_code == 400, resp.content[:300]
    assert resp.json()["code"] == "trace_malformed" and "gzip-compressed content" in resp.json()["detail"]
    assert not TraceUpload.objects.exists() and not _stored_files(settings)


def _zip(text: bytes) -> bytes:
    buf = BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("t.csv", text)
    return buf.getvalue()


CSV = (PHILLY_HEAD + GOOD_ROW * 3).encode()
COMPRESSED = {
    "zip_inside_gzip": (gzip.compress(_zip(CSV)), "zip-compressed content"),
    "bzip2_inside_gzip": (gzip.compress(bz2.compress(CSV)), "bzip2-compressed content"),
    "xz_inside_gzip": (gzip.compress(lzma.compress(CSV)), "xz-compressed content"),
    "zstd_inside_gzip": (gzip.compress(b"\x28\xb5\x2f\xfd" + b"\x00" * 32), "zstd-compressed content"),
    "zip": (_zip(CSV), "zip-compressed; only gzip"),
    "bzip2": (bz2.compress(CSV), "bzip2-compressed; only gzip"),
    "xz": (lzma.compress(CSV), "xz-compressed; only gzip"),
    "binary_inside_gzip": (gzip.compress(CSV + b"\x00\x01\x02"), "binary content"),
    "latin1_inside_gzip": (gzip.compress(CSV + "caf\xe9\n".encode("latin-1")), "not UTF-8"),
}


@pytest.mark.parametrize("case", sorted(COMPRESSED))
def test_compression_is_undone_once_and_anything_else_is_refused_by_name(case, uploader, settings):
    client, team, _ = uploader
    data, reason = COMPRESSED[case]
    resp = _trace_post(client, team, data, filename="t.csv.gz")
    assert resp.status_code == 400, (case, resp.content[:300])
    assert resp.json()["code"] == "trace_malformed" and reason in resp.json()["detail"], resp.json()
    assert not TraceUpload.objects.exists() and not _stored_files(settings)


def test_a_trace_parser_past_its_limit_is_a_clear_400(uploader, settings):
    client, team, _ = uploader
    settings.UPLOAD_SANDBOX_WALL_S = 0.05
    resp = _trace_post(client, team, CSV)
    assert resp.status_code == 400 and resp.json()["code"] == "trace_malformed", resp.content[:300]
    assert "was stopped" in resp.json()["detail"] and "wall-clock" in resp.json()["detail"]
    assert not TraceUpload.objects.exists() and not _stored_files(settings)


def test_normal_traces_still_upload_with_their_summary(uploader, settings):
    client, team, _ = uploader
    for name, data, filename in (("plain", CSV, "t.csv"), ("gz", gzip.compress(CSV), "t.csv.gz")):
        resp = _trace_post(client, team, data, filename=filename, name=name)
        assert resp.status_code == 201, resp.content[:300]
        assert resp.json()["n_jobs"] == 3 and resp.json()["kind"] == "philly"
        assert TraceUpload.objects.get(name=name).summary["jobs"] == 3
    dash = Client()
    dash.force_login(team.memberships.get().user)
    resp = dash.post("/simulations/new/?upload=1", {"team": team.pk, "name": "dash",
                                                    "file": SimpleUploadedFile("d.csv.gz", gzip.compress(CSV))},
                     follow=True)
    assert resp.status_code == 200 and TraceUpload.objects.filter(name="dash", n_jobs=3).exists()
