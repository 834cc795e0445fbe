"""Hostile uploads at the API: every bad ONNX file and every malformed trace gets a 4xx with a clear
message and a machine code, nothing is stored (no row, no file), local files named by a model are
never read, and a gigantic body streams through with bounded memory."""
from __future__ import annotations

import gzip
import re
import sys
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data
from rest_framework.test import APIClient

from core import services as core_services
from core.models import DLModel
from scheduling.models import TraceUpload

pytestmark = pytest.mark.django_db

V = helper.make_tensor_value_info
MB = 1024 * 1024


def _model(nodes, inputs, outputs, initializers=(), opsets=(("", 17),)) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets]).SerializeToString()


def _relu(shape) -> bytes:
    return _model([helper.make_node("Relu", ["x"], ["y"])], [V("x", TensorProto.FLOAT, shape)],
                  [V("y", TensorProto.FLOAT, shape)])


def _external(location: str) -> bytes:
    w = numpy_helper.from_array(np.ones(4, dtype="float32"), "w")
    set_external_data(w, location=location, offset=0, length=16)
    return _model([helper.make_node("Add", ["x", "w"], ["y"])], [V("x", TensorProto.FLOAT, [4])],
                  [V("y", TensorProto.FLOAT, [4])], [w])


def _ld(field: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    def varint(n):
        out = bytearray()
        while True:
            b, n = n & 0x7F, n >> 7
            out.append(b | (0x80 if n else 0))
            if not n:
                return bytes(out)
    return varint((field << 3) | 2) + varint(len(payload)) + payload


def _nesting_bomb(depth: int = 400) -> bytes:
    """Graph -> node -> attribute -> graph ... `depth` levels deep (past protobuf's recursion limit)."""
    g = b""
    for _ in range(depth):
        g = _ld(1, _ld(5, _ld(6, g)))  # GraphProto.node / NodeProto.attribute / AttributeProto.g
    return b"\x08\x08" + _ld(7, g)     # ir_version 8, ModelProto.graph


def _huge_declared_initializer() -> bytes:
    w = TensorProto()
    w.name, w.data_type = "w", TensorProto.FLOAT
    w.dims.extend([100_000, 100_000])  # 40 GB declared, no data
    return _model([helper.make_node("Add", ["x", "w"], ["y"])], [V("x", TensorProto.FLOAT, [100_000, 100_000])],
                  [V("y", TensorProto.FLOAT, [100_000, 100_000])], [w])


def _transpose(shape, perm) -> bytes:
    out = [shape[i] for i in perm]
    return _model([helper.make_node("Transpose", ["x"], ["y"], perm=perm)], [V("x", TensorProto.FLOAT, shape)],
                  [V("y", TensorProto.FLOAT, out)])


def _copy_chain(shape, n: int) -> bytes:
    """`n` Transposes back and forth: 0 FLOPs, but every one copies the whole tensor."""
    nodes = [helper.make_node("Transpose", [f"t{i}"], [f"t{i + 1}"], perm=[0, 2, 1]) for i in range(n)]
    nodes[0].input[0], nodes[-1].output[0] = "x", "y"
    out = shape if n % 2 == 0 else [shape[0], shape[2], shape[1]]
    return _model(nodes, [V("x", TensorProto.FLOAT, shape)], [V("y", TensorProto.FLOAT, out)])


def _bad_onnx(small_cnn: bytes) -> dict[str, tuple[bytes, str, set[str]]]:
    """name -> (bytes, filename, acceptable error codes)."""
    matmul_tflops = _model([helper.make_node("MatMul", ["x", "y"], ["z"])],
                           [V("x", TensorProto.FLOAT, [4096, 100_000]), V("y", TensorProto.FLOAT, [100_000, 4096])],
                           [V("z", TensorProto.FLOAT, [4096, 4096])])
    conv_tflops = _model([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
                         [V("x", TensorProto.FLOAT, [1, 512, 2048, 2048]), V("w", TensorProto.FLOAT, [512, 512, 3, 3])],
                         [V("y", TensorProto.FLOAT, [1, 512, 2048, 2048])])
    custom_op = _model([helper.make_node("Backdoor", ["x"], ["y"], domain="com.evil")],
                       [V("x", TensorProto.FLOAT, [4])], [V("y", TensorProto.FLOAT, [4])],
                       opsets=(("", 17), ("com.evil", 1)))
    celu = _model([helper.make_node("Celu", ["x"], ["y"])], [V("x", TensorProto.FLOAT, [1, 3, 3])],
                  [V("y", TensorProto.FLOAT, [1, 3, 3])])
    return {
        "truncated": (small_cnn[: len(small_cnn) * 2 // 3], "m.onnx", {"truncated"}),
        "truncated_tiny": (small_cnn[:40], "m.onnx", {"truncated", "not_protobuf"}),
        "not_protobuf_text": (b"<html><script>alert(1)</script></html>" * 20, "m.onnx", {"not_protobuf"}),
        "not_protobuf_random": (np.random.default_rng(0).bytes(100_000), "m.onnx", {"not_protobuf", "truncated"}),
        "pytorch_zip": (b"PK\x03\x04" + b"\0" * 200, "model.onnx", {"not_protobuf"}),
        "pickle": (b"\x80\x04\x95" + b"\0" * 64, "model.onnx", {"not_protobuf"}),
        "empty": (b"", "m.onnx", {"empty", "invalid"}),  # DRF refuses an empty file first
        "bad_extension": (small_cnn, "model.pt", {"bad_extension"}),
        "absurd_dimension_huge": (_relu([1, 3, 2_000_000_000]), "m.onnx", {"absurd_dimension"}),
        "absurd_dimension_negative": (_relu([1, -3, 8]), "m.onnx", {"absurd_dimension"}),
        "absurd_dimension_zero": (_relu([1, 0, 8]), "m.onnx", {"absurd_dimension"}),
        "billions_of_flops_matmul": (matmul_tflops, "m.onnx", {"too_many_flops", "tensor_too_large"}),
        "billions_of_flops_conv": (conv_tflops, "m.onnx", {"too_many_flops", "tensor_too_large"}),
        # issue 11 s.6: 4 TB of activations at 0 FLOPs, and 400 GB through one Relu
        "transpose_4tb": (_transpose([1, 1_000_000, 1_000_000], [0, 2, 1]), "m.onnx", {"tensor_too_large"}),
        "relu_400gb": (_relu([1, 1_000_000, 100_000]), "m.onnx", {"tensor_too_large"}),
        "external_data_absolute": (_external("/etc/passwd"), "m.onnx", {"external_data"}),
        "external_data_traversal": (_external("../../../../../../etc/passwd"), "m.onnx", {"external_data"}),
        "unsupported_op_custom_domain": (custom_op, "m.onnx", {"unsupported_op", "checker_failed"}),
        "unsupported_op_celu": (celu, "m.onnx", {"unsupported_op"}),
        "huge_declared_initializer": (_huge_declared_initializer(), "m.onnx",
                                      {"checker_failed", "absurd_dimension", "too_many_flops",
                                       "tensor_too_large"}),
        "nesting_bomb": (_nesting_bomb(), "m.onnx", {"not_protobuf", "truncated", "checker_failed"}),
    }


CASES = ["truncated", "truncated_tiny", "not_protobuf_text", "not_protobuf_random", "pytorch_zip", "pickle", "empty",
         "bad_extension", "absurd_dimension_huge", "absurd_dimension_negative", "absurd_dimension_zero",
         "billions_of_flops_matmul", "billions_of_flops_conv", "transpose_4tb", "relu_400gb",
         "external_data_absolute", "external_data_traversal",
         "unsupported_op_custom_domain", "unsupported_op_celu", "huge_declared_initializer", "nesting_bomb"]


# Opens of any ".../passwd" while an upload is handled (the external-data cases name /etc/passwd).
_opened: list[str] = []
_watching = [False]


def _audit(event, args):
    if _watching[0] and event == "open" and args and isinstance(args[0], (str, bytes)):
        path = args[0].decode(errors="replace") if isinstance(args[0], bytes) else args[0]
        if path.endswith("passwd"):
            _opened.append(path)


sys.addaudithook(_audit)


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


@pytest.fixture(scope="module")
def bad_onnx(small_cnn_bytes):
    return _bad_onnx(small_cnn_bytes)


@pytest.mark.parametrize("case", CASES)
def test_hostile_onnx_upload_is_a_clear_400_and_stores_nothing(case, bad_onnx, uploader, settings):
    client, team, _ = uploader
    data, filename, codes = bad_onnx[case]
    _opened.clear()
    _watching[0] = True
    try:
        resp = client.post("/api/models/", {"team": team.pk, "name": case, "file": SimpleUploadedFile(filename, data)},
                           format="multipart")
    finally:
        _watching[0] = False
    assert resp.status_code == 400, (case, resp.status_code, resp.content[:300])
    body = resp.json()
    assert body["code"] in codes, (case, body)
    assert len(body["detail"]) >= 30 and body["errors"]["file"]
    assert "Traceback" not in body["detail"]
    assert not DLModel.objects.exists() and not _stored_files(settings)
    assert not _opened, f"{case}: the server opened {_opened}"


def test_tensor_cap_names_the_tensor_and_the_limit(uploader, settings):
    client, team, _ = uploader
    resp = client.post("/api/models/", {"team": team.pk, "name": "t", "file": SimpleUploadedFile(
        "m.onnx", _transpose([1, 1_000_000, 1_000_000], [0, 2, 1]))}, format="multipart")
    assert resp.status_code == 400
    detail = resp.json()["detail"]
    assert "'x'" in detail and f"{settings.ONNX_MAX_TENSOR_ELEMENTS:,}" in detail, detail
    settings.ONNX_MAX_TENSOR_ELEMENTS = 10**13  # the cap is the platform setting
    settings.ONNX_MAX_ACTIVATION_BYTES = 1024**3
    resp = client.post("/api/models/", {"team": team.pk, "name": "t", "file": SimpleUploadedFile(
        "m.onnx", _relu([1, 1000, 1_000_000]))}, format="multipart")  # 4 GB out of the Relu
    assert resp.status_code == 400 and resp.json()["code"] == "too_much_activation_memory", resp.content
    assert "1.00 GiB" in resp.json()["detail"]
    assert not DLModel.objects.exists() and not _stored_files(settings)


def test_data_movement_counts_in_the_cost_estimate(uploader, settings):
    """100 Transposes of a 4 MB tensor: 0 FLOPs, but 800 MB copied; refused under a 0.5 G-op cap."""
    client, team, _ = uploader
    settings.ONNX_MAX_GFLOPS = 0.5
    resp = client.post("/api/models/", {"team": team.pk, "name": "copies", "file": SimpleUploadedFile(
        "m.onnx", _copy_chain([1, 1000, 1000], 100))}, format="multipart")
    assert resp.status_code == 400 and resp.json()["code"] == "too_many_flops", resp.content
    assert "copies" in resp.json()["detail"] and "Transpose" in resp.json()["detail"]
    assert not DLModel.objects.exists()
    settings.ONNX_MAX_GFLOPS = 1.0  # the same model fits a larger budget
    resp = client.post("/api/models/", {"team": team.pk, "name": "copies", "file": SimpleUploadedFile(
        "m.onnx", _copy_chain([1, 1000, 1000], 100))}, format="multipart")
    assert resp.status_code == 201, resp.content
    assert DLModel.objects.get().features["bytes_moved"] == 100 * 2 * 4_000_000


def test_audit_hook_would_see_a_read_of_passwd():
    """The external-data test relies on the audit hook: prove it fires."""
    _opened.clear()
    _watching[0] = True
    try:
        open("/etc/passwd", "rb").close()
    finally:
        _watching[0] = False
    assert _opened == ["/etc/passwd"]


def test_external_data_model_is_refused_even_when_the_file_exists_next_to_it(uploader, settings, tmp_path):
    """A model naming a sibling data file (the normal external-data layout) is refused, never resolved
    against the upload dir or MEDIA_ROOT."""
    client, team, _ = uploader
    secret = Path(settings.MEDIA_ROOT) / "models" / str(team.pk) / "weights.bin"
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_bytes(np.ones(4, dtype="float32").tobytes())
    resp = client.post("/api/models/", {"team": team.pk, "name": "ext", "file": SimpleUploadedFile(
        "m.onnx", _external("weights.bin"))}, format="multipart")
    assert resp.status_code == 400 and resp.json()["code"] == "external_data"
    assert not DLModel.objects.exists()


def test_hostile_names_and_filenames(uploader, small_cnn_bytes, settings):
    client, team, _ = uploader
    post = lambda name, filename="m.onnx": client.post(  # noqa: E731
        "/api/models/", {"team": team.pk, "name": name, "file": SimpleUploadedFile(filename, small_cnn_bytes)},
        format="multipart")
    for name in ("x" * 101, "nul\x00byte", "   "):
        resp = post(name)
        assert resp.status_code == 400 and "name" in resp.json()["errors"], (name, resp.content[:200])
    # a path in the file name never escapes the media dir: files are stored by content hash
    resp = post("traversal", filename="../../../../tmp/evil.onnx")
    assert resp.status_code == 201, resp.content
    stored = DLModel.objects.get(name="traversal").file.path
    assert Path(stored).resolve().is_relative_to(Path(settings.MEDIA_ROOT).resolve())
    assert Path(stored).name.endswith(".onnx") and "evil" not in stored
    # HTML in a name is data, not markup, on the dashboard
    resp = post("<script>alert(1)</script>")
    assert resp.status_code == 201
    dash = Client()
    dash.force_login(team.memberships.get().user)
    html = dash.get("/models/").content.decode()
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_dashboard_upload_of_hostile_files_shows_the_refusal_and_stores_nothing(uploader, bad_onnx, settings):
    _, team, user = uploader
    dash = Client()
    dash.force_login(user)
    for case in ("nesting_bomb", "external_data_absolute", "billions_of_flops_conv", "pytorch_zip"):
        data, filename, codes = bad_onnx[case]
        resp = dash.post("/models/upload/", {"team": team.pk, "name": case, "description": "",
                                             "file": SimpleUploadedFile(filename, data)})
        assert resp.status_code == 200, case
        assert any(code in resp.content.decode() for code in codes), case
    assert not DLModel.objects.exists() and not _stored_files(settings)


# --- a gigantic body -------------------------------------------------------------------------------------

class StreamingMultipart:
    """A multipart/form-data body generated on the fly (never held in memory), counting what the server
    reads of it."""

    def __init__(self, fields: dict[str, str], filename: str, file_size: int, boundary: str = "RelBoundary7MA4YWx"):
        self.boundary = boundary
        head = b"".join(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
            for k, v in fields.items())
        head += (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
                 "Content-Type: application/octet-stream\r\n\r\n").encode()
        self.head, self.tail, self.file_size = head, f"\r\n--{boundary}--\r\n".encode(), file_size
        self.length = len(head) + file_size + len(self.tail)
        self.pos = 0
        self.pattern = (b"\x08\x08\x12\xfe\xff\x03" + bytes(range(256)) * 256)[: 64 * 1024]

    @property
    def content_type(self) -> str:
        return f"multipart/form-data; boundary={self.boundary}"

    def _byte_range(self, start: int, end: int) -> bytes:
        out = bytearray()
        h, f = len(self.head), len(self.head) + self.file_size
        while start < end:
            if start < h:
                piece = self.head[start:min(end, h)]
            elif start < f:
                off = (start - h) % len(self.pattern)
                piece = self.pattern[off: off + min(end, f) - start]
            else:
                piece = self.tail[start - f: end - f]
            out += piece
            start += len(piece)
        return bytes(out)

    def read(self, size: int = -1) -> bytes:
        end = self.length if size is None or size < 0 else min(self.length, self.pos + size)
        data = self._byte_range(self.pos, end)
        self.pos = end
        return data

    def readline(self, size: int = -1) -> bytes:
        limit = self.length if size is None or size < 0 else min(self.length, self.pos + size)
        out = bytearray()
        while self.pos < limit:
            chunk = self._byte_range(self.pos, min(limit, self.pos + 8192))
            cut = chunk.find(b"\n")
            if cut >= 0:
                chunk = chunk[: cut + 1]
            out += chunk
            self.pos += len(chunk)
            if cut >= 0:
                break
        return bytes(out)


def body_filename(endpoint: str) -> str:
    return "huge.onnx" if "models" in endpoint else "huge.csv"


def _stream_upload(client, path: str, body: StreamingMultipart, **extra):
    return client.request(REQUEST_METHOD="POST", PATH_INFO=path, CONTENT_TYPE=body.content_type,
                          CONTENT_LENGTH=str(body.length), **{"wsgi.input": body}, **extra)


@pytest.mark.parametrize("endpoint", ["/api/models/", "/api/traces/", "/models/upload/"])
def test_gigantic_upload_is_refused_with_bounded_memory(endpoint, uploader, settings, monkeypatch):
    """A 50 MB body against a 1 MB cap (models) / the trace cap: refused with a 4xx, memory stays bounded
    (the body streams to a temp file or is never read), nothing is stored."""
    client, team, user = uploader
    settings.ONNX_MAX_UPLOAD_BYTES = 1 * MB
    if endpoint == "/api/traces/":
        settings.SCHEDULING_MAX_TRACE_BYTES = 1 * MB
    body = StreamingMultipart({"team": str(team.pk), "name": "huge"}, body_filename(endpoint), 50 * MB)
    if endpoint.startswith("/api/"):
        token = client._credentials["HTTP_AUTHORIZATION"]
        http = Client()
        extra = {"HTTP_AUTHORIZATION": token}
    else:
        http = Client()
        http.force_login(user)
        extra = {}
    # A first, small oversize request imports what the view imports lazily, so the traced peak below is
    # the request's own memory rather than module loading (the test failed alone, passed after others).
    warm_up = StreamingMultipart({"team": str(team.pk), "name": "warm"}, body_filename(endpoint), 2 * MB)
    assert _stream_upload(http, endpoint, warm_up, **extra).status_code in (200, 400, 413)
    tracemalloc.start()
    try:
        resp = _stream_upload(http, endpoint, body, **extra)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"{endpoint}: {resp.status_code}, read {body.pos / MB:.1f} of {body.length / MB:.1f} MB, "
          f"peak traced memory {peak / MB:.1f} MB")
    if endpoint == "/models/upload/":  # refused from Content-Length before the CSRF check reads the body
        assert resp.status_code == 413 and "over the 2 MB limit of this form" in resp.content.decode()
    else:
        assert resp.status_code in (400, 413), resp.content[:300]
        assert resp.json()["code"] == "too_large" and "MB" in resp.json()["detail"]
    assert peak < 12 * MB, f"peak traced memory {peak / MB:.1f} MB while a 50 MB body streamed"
    assert not DLModel.objects.exists() and not TraceUpload.objects.exists() and not _stored_files(settings)
    # API uploads (by their views) and dashboard forms (by config.middleware) are refused from
    # Content-Length, before the body is read
    assert body.pos <= 2 * MB, f"the server read {body.pos / MB:.1f} MB of a body it was going to refuse"


@pytest.mark.parametrize("form", ["model-upload", "simulation-new", "team-invite", "login"])
def test_dashboard_post_over_its_form_limit_is_refused_unread(form, uploader, settings):
    """A dashboard POST declaring more than its form can take gets a 413 with a message before any
    middleware reads the body (Django's CSRF check would spool it to disk in full); nothing is stored.
    Forms without files get Django's own form-field limit."""
    from django.urls import reverse

    client, team, user = uploader
    settings.ONNX_MAX_UPLOAD_BYTES = settings.SCHEDULING_MAX_TRACE_BYTES = 1 * MB
    http = Client()
    http.force_login(user)
    url = reverse(form, kwargs={"pk": team.pk}) if form == "team-invite" else reverse(form)
    body = StreamingMultipart({"team": str(team.pk), "name": "huge"}, "huge.bin", 40 * MB)
    resp = _stream_upload(http, url, body)
    assert resp.status_code == 413 and "Nothing was stored" in resp.content.decode()
    assert body.pos == 0, f"{body.pos} bytes were read of a body refused from its declared length"
    assert not DLModel.objects.exists() and not TraceUpload.objects.exists() and not _stored_files(settings)


def test_dashboard_upload_within_its_limit_reaches_the_form(uploader, settings):
    """The limit is per form: a body over the form-field limit but within the model cap still reaches the
    upload view, which takes it (a large file is validated later, on the validation queue)."""
    client, team, user = uploader
    http = Client()
    http.force_login(user)
    body = StreamingMultipart({"team": str(team.pk), "name": "m"}, "m.onnx", 12 * MB)
    resp = _stream_upload(http, "/models/upload/", body)
    assert resp.status_code == 302 and body.pos == body.length
    assert DLModel.objects.filter(team=team, name="m").exists()


# --- traces ----------------------------------------------------------------------------------------------

PHILLY_HEAD = "timestamp,duration,num_gpus,gpu_time,cluster\n"
GOOD_ROW = "2017-10-09 06:00:00,600,1,600,c1\n"


def _gz_bomb(decompressed_mb: int) -> bytes:
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip container
    zeros = b"0" * MB
    out = [comp.compress((PHILLY_HEAD + GOOD_ROW).encode())]
    out += [comp.compress(zeros) for _ in range(decompressed_mb)]
    out.append(comp.flush())
    return b"".join(out)


TRACE_CASES = {
    "bad_number": (PHILLY_HEAD + GOOD_ROW + "2017-10-09 06:03:00,abc,1,0,c1\n", 3, "duration"),
    "negative_duration": (PHILLY_HEAD + GOOD_ROW + "2017-10-09 06:03:00,-5,1,0,c1\n", 3, "duration"),
    "nan_duration": (PHILLY_HEAD + GOOD_ROW + "2017-10-09 06:03:00,nan,1,0,c1\n", 3, "duration"),
    "inf_gpus": (PHILLY_HEAD + GOOD_ROW + "2017-10-09 06:03:00,5,inf,0,c1\n", 3, "num_gpus"),
    "too_many_gpus": (PHILLY_HEAD + GOOD_ROW + "2017-10-09 06:03:00,5,100000000,0,c1\n", 3, "num_gpus"),
    "fractional_gpus": (PHILLY_HEAD + GOOD_ROW + "2017-10-09 06:03:00,5,1.5,0,c1\n", 3, "num_gpus"),
    "bad_timestamp": (PHILLY_HEAD + "yesterday,5,1,0,c1\n", 2, "timestamp"),
    "timestamp_out_of_range": (PHILLY_HEAD + "0001-01-01 00:00:00+01:00,5,1,0,c1\n", None, None),
    "timestamp_far_future_tz": (PHILLY_HEAD + "9999-12-31 23:59:59-14:00,5,1,0,c1\n", None, None),
    "short_row": (PHILLY_HEAD + GOOD_ROW + "2017-10-09 06:03:00,5\n", 3, None),
    "missing_column": ("timestamp,duration\n2017-10-09 06:00:00,5\n", 1, None),
    "header_only": (PHILLY_HEAD, None, None),
    "empty": ("", None, None),
    "nul_bytes": (PHILLY_HEAD + "2017-10-09 06:00:00,6\x0000,1,600,c1\n", None, None),
    "huge_field": (PHILLY_HEAD + "2017-10-09 06:00:00," + "9" * 200_000 + ",1,600,c1\n", None, None),
    "pod_list_multi_gpu_fraction": ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,1024,2,500\n", 2,
                                    "gpu_milli"),
    "node_list_not_jobs": ("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,2,P100\n", None, None),
}


def _trace_post(client, team, data: bytes, filename="t.csv", name="t"):
    return client.post("/api/traces/", {"team": team.pk, "name": name, "file": SimpleUploadedFile(filename, data)},
                       format="multipart")


@pytest.mark.parametrize("case", sorted(TRACE_CASES))
def test_malformed_trace_is_a_clear_400_and_stores_nothing(case, uploader, settings):
    client, team, _ = uploader
    text, line, column = TRACE_CASES[case]
    resp = _trace_post(client, team, text.encode())
    assert resp.status_code == 400, (case, resp.status_code, resp.content[:300])
    body = resp.json()
    assert body["code"] in ("trace_malformed", "invalid"), body
    assert len(body["detail"]) >= 10 and "Traceback" not in body["detail"]
    if line is not None:
        assert body["line"] == line, body
    if column is not None:
        assert body["column"] == column and f"'{column}'" in body["detail"], body
    assert not TraceUpload.objects.exists() and not _stored_files(settings)


@pytest.mark.parametrize("case", ["binary_junk", "not_utf8", "corrupt_gzip", "truncated_gzip", "gzip_bomb"])
def test_hostile_trace_files_are_refused_with_bounded_memory(case, uploader, settings):
    client, team, _ = uploader
    data = {
        "binary_junk": np.random.default_rng(1).bytes(50_000),
        "not_utf8": (PHILLY_HEAD + GOOD_ROW).encode() + b"\xff\xfe\xfd,1,1\n",
        "corrupt_gzip": b"\x1f\x8b" + b"not really gzip" * 10,
        "truncated_gzip": gzip.compress((PHILLY_HEAD + GOOD_ROW * 1000).encode())[:-8],  # no CRC/size trailer
        "gzip_bomb": _gz_bomb(300),  # ~300 KB that inflates to 300 MB
    }[case]
    tracemalloc.start()
    try:
        resp = _trace_post(client, team, data, filename="t.csv.gz" if "gzip" in case else "t.csv")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert resp.status_code == 400, (case, resp.status_code, resp.content[:300])
    assert resp.json()["code"] in ("trace_malformed", "too_large") and len(resp.json()["detail"]) >= 15
    assert peak < 100 * MB, f"{case}: peak traced memory {peak / MB:.0f} MB"
    assert not TraceUpload.objects.exists() and not _stored_files(settings)


def test_a_good_gzipped_trace_still_uploads(uploader):
    client, team, _ = uploader
    resp = _trace_post(client, team, gzip.compress((PHILLY_HEAD + GOOD_ROW * 3).encode()), filename="t.csv.gz")
    assert resp.status_code == 201, resp.content
    assert resp.json()["n_jobs"] == 3


def test_import_records_refuses_garbage_with_4xx(uploader, small_cnn_bytes):
    from tuning import services as tuning_services

    client, team, user = uploader
    model = core_services.register_model(team=team, name="m", data=small_cnn_bytes, filename="m.onnx", actor=user)
    run = tuning_services.start_run(actor=user, model=model, max_trials=8, enqueue=False)
    cases = {
        "binary": (np.random.default_rng(2).bytes(5000), b'[0, {}]\n'),
        "not_json": (b"hello\n", b"world\n"),
        "bad_index": (b'["w"]\n', b'[7, {}]\n'),
        "negative_index": (b'["w"]\n', b'[-1, {}]\n'),
        "empty": (b"", b""),
        "not_list": (b'["w"]\n', b'{"a": 1}\n'),
        "bool_index": (b'["w"]\n', b'[true, {}]\n'),
    }
    for name, (wl, rec) in cases.items():
        resp = client.post(f"/api/runs/{run.pk}/import-records/", {
            "workloads": SimpleUploadedFile("database_workload.json", wl),
            "records": SimpleUploadedFile("database_tuning_record.json", rec)}, format="multipart")
        assert 400 <= resp.status_code < 500, (name, resp.status_code, resp.content[:200])
        assert not (tuning_services.run_work_dir(run.pk) / "database_tuning_record.json").exists(), name


# --- hostile query strings and form values ----------------------------------------------------------------

BIG = "9" * 30  # past every integer column


def test_hostile_query_strings_and_form_values_never_5xx(world, client):
    """Ids past bigint, non-numbers, negative pages, huge page sizes, bad dates, unknown orderings, long id
    lists, on the dashboard and the API; and open-redirect attempts on the team switcher."""
    client.force_login(world.users["owner"])
    urls = [
        "/runs/?page=abc", "/runs/?page=-1", "/runs/?page=99999999", "/runs/?status=zzz", "/runs/?team=abc",
        f"/runs/?team={BIG}", f"/runs/?model={BIG}", "/runs/?created_after=notadate", "/runs/?ordering=evil",
        "/runs/compare/?runs=1,abc", f"/runs/compare/?runs={BIG},1", "/runs/compare/?runs=" + ",".join(["1"] * 500),
        f"/models/{BIG}/", f"/runs/{BIG}/", f"/simulations/{BIG}/", "/runs/new/?model=abc", f"/runs/new/?model={BIG}",
        f"/api/charts/runs/{BIG}/curve/", f"/api/charts/runs/1/curve/?max_points={BIG}",
        f"/api/charts/energy/?team={BIG}",
        f"/api/charts/runs/compare/?runs={BIG},1", f"/api/runs/{BIG}/", f"/api/models/{BIG}/", f"/api/runs/?team={BIG}",
        f"/api/runs/?model={BIG}", f"/api/models/?min_gflops={BIG}", "/api/models/?min_gflops=-1e300",
        "/api/models/?min_gflops=0.5", f"/api/runs/{world.run.pk}/measurements/?task_index={BIG}",
        f"/api/runs/?page_size={BIG}", f"/api/runs/?page={BIG}", f"/api/gpu-telemetry/?gpu={BIG}",
        "/api/gpu-telemetry/?since=2020-13-45", f"/api/runs/?created_after={BIG}", "/api/runs/?ordering=-evil",
        "/api/models/?search=%00", "/api/runs/?status=%00",
    ]
    for url in urls:
        assert client.get(url).status_code < 500, url
    for data in ({"team": BIG}, {"team": "abc"}, {"team": "all", "next": "javascript:alert(1)"},
                 {"team": "all", "next": "//evil.example/"}, {"team": "all", "next": "https://evil.example/"}):
        resp = client.post("/team/", data)
        assert resp.status_code in (302, 404), data
        if resp.status_code == 302:
            assert resp["Location"] == "/", (data, resp["Location"])  # never off-site
    resp = client.post("/runs/new/", {"model": BIG, "max_trials": BIG, "target_kind": "llvm", "num_cores": BIG,
                                      "trials_per_round": BIG, "measurement_mode": "doppler", "dop_mode": "fixed",
                                      "dop_fixed": BIG, "threads": BIG, "search_population": BIG, "seed": BIG})
    assert resp.status_code == 200  # the form, with its errors
    assert client.post(f"/runs/{world.run.pk}/{'x' * 500}/").status_code == 404


# --- quota-dodging requests (issue 11 section 2) ------------------------------------------------------------

def test_quota_dodging_requests_are_4xx_and_write_nothing(world):
    """Self-service teams, GPU jobs with absurd declared durations, oversized simulations: refused with a
    4xx naming the problem, and no row is written."""
    from core.models import Quota, Team
    from scheduling.models import GpuJob, SimulationRun

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {world.tokens['owner']}")
    before = (Team.objects.count(), Quota.objects.count(), GpuJob.objects.count(), SimulationRun.objects.count())
    resp = client.post("/api/teams/", {"name": "Quota Twin"}, format="json")
    assert resp.status_code == 403 and "Only staff can create teams" in resp.json()["detail"]
    job = {"model": world.model.pk, "batch_size": 8, "iterations": 10_000_000}
    for duration in (1e308, 10**9, 86401, -1, 0, 0.5, "nan", "inf", "abc", None):
        resp = client.post("/api/gpu-jobs/", {**job, "duration_estimate_s": duration}, format="json")
        assert 400 <= resp.status_code < 500, (duration, resp.status_code)
        assert resp.json()["detail"], duration
    for parameters in ({"jobs": 100_000, "gpus": 20_000}, {"jobs": 10**12, "gpus": 4}, {"jobs": 1, "gpus": 10**12},
                       {"jobs": "many"}, {"gpus": -1}):
        resp = client.post("/api/simulations/", {"team": world.team_a.pk, "trace": "philly", "policies": ["horus"],
                                                 "parameters": parameters}, format="json")
        assert 400 <= resp.status_code < 500, (parameters, resp.status_code)
        assert resp.json()["detail"], parameters
    assert (Team.objects.count(), Quota.objects.count(), GpuJob.objects.count(),
            SimulationRun.objects.count()) == before


# --- issue 11 s.6: large uploads are validated off the request path -------------------------------------------

def _upload(client, team, name, data):
    return client.post("/api/models/", {"team": team.pk, "name": name, "file": SimpleUploadedFile("m.onnx", data)},
                       format="multipart")


def test_large_upload_answers_202_validating_then_ends_ready_or_invalid(uploader, small_cnn_bytes, settings,
                                                                       django_capture_on_commit_callbacks,
                                                                       monkeypatch):
    from core import tasks

    client, team, _ = uploader
    settings.ONNX_ASYNC_VALIDATION_BYTES = 0  # every upload counts as large here
    queued = []
    monkeypatch.setattr(tasks.validate_model, "delay", lambda pk: queued.append(pk))
    with django_capture_on_commit_callbacks(execute=True):
        good = _upload(client, team, "good", small_cnn_bytes)
        bad = _upload(client, team, "hostile", _transpose([1, 1_000_000, 1_000_000], [0, 2, 1]))
    assert good.status_code == bad.status_code == 202, (good.content, bad.content)
    assert good.json()["state"] == bad.json()["state"] == "validating"
    assert queued == [good.json()["id"], bad.json()["id"]]
    # the model cannot be tuned or downloaded while it is validating
    resp = client.post("/api/runs/", {"model": good.json()["id"], "max_trials": 8}, format="json")
    assert resp.status_code == 409 and resp.json()["code"] == "model_not_ready", resp.content
    assert client.get(f"/api/models/{good.json()['id']}/download/").status_code == 409
    with django_capture_on_commit_callbacks(execute=True):
        for pk in queued:
            tasks.validate_model(pk)  # what the worker runs
    ok = client.get(f"/api/models/{good.json()['id']}/").json()
    assert ok["state"] == "ready" and ok["total_flops"] > 0 and ok["inputs"], ok
    refused = client.get(f"/api/models/{bad.json()['id']}/").json()
    assert refused["state"] == "invalid" and refused["error_code"] == "tensor_too_large"
    assert "'x'" in refused["error_message"]
    # the refused file is gone; the row keeps the error; it cannot be tuned
    assert DLModel.objects.get(pk=refused["id"]).file.name == ""
    assert len(_stored_files(settings)) == 1
    resp = client.post("/api/runs/", {"model": refused["id"], "max_trials": 8}, format="json")
    assert resp.status_code == 400 and resp.json()["code"] == "model_invalid"
    # running the task again changes nothing (redelivery)
    assert tasks.validate_model(refused["id"]) is None
    # the dashboard shows the state and the error
    dash = Client()
    dash.force_login(team.memberships.get().user)
    html = dash.get(f"/models/{refused['id']}/").content.decode()
    assert 'data-state="invalid"' in html and "tensor_too_large" in html
    assert "Invalid" in dash.get("/models/").content.decode()


def test_small_uploads_still_validate_inline(uploader, small_cnn_bytes, settings):
    client, team, _ = uploader
    assert len(small_cnn_bytes) <= settings.ONNX_ASYNC_VALIDATION_BYTES
    resp = _upload(client, team, "inline", small_cnn_bytes)
    assert resp.status_code == 201 and resp.json()["state"] == "ready"
    resp = _upload(client, team, "inline-bad", _relu([1, 1_000_000, 100_000]))
    assert resp.status_code == 400 and not DLModel.objects.filter(name="inline-bad").exists()


def test_dashboard_large_upload_redirects_to_a_validating_model(uploader, small_cnn_bytes, settings, monkeypatch):
    from core import tasks

    _, team, user = uploader
    settings.ONNX_ASYNC_VALIDATION_BYTES = 0
    monkeypatch.setattr(tasks.validate_model, "delay", lambda pk: None)
    dash = Client()
    dash.force_login(user)
    resp = dash.post("/models/upload/", {"team": team.pk, "name": "big", "description": "",
                                         "file": SimpleUploadedFile("m.onnx", small_cnn_bytes)}, follow=True)
    assert resp.status_code == 200 and 'data-state="validating"' in resp.content.decode()
    assert DLModel.objects.get(name="big").state == "validating"


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_large_uploads_are_validated_by_a_real_worker(small_cnn_bytes, settings, tmp_path, django_user_model):
    """Through the API and a real Celery worker on Redis (default queue): 202, then ready / invalid."""
    from config.celery import app
    from tests.helpers import require_env
    from tests.workers import running_worker, wait_for

    redis_url = require_env("TEST_REDIS_URL")
    app.conf.broker_url = redis_url
    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge("default")
    user = django_user_model.objects.create_user(username="big-uploader", password="pw")
    team = core_services.create_team(name="Big Uploads", owner=user)
    client = APIClient()
    client.force_authenticate(user)
    settings.ONNX_ASYNC_VALIDATION_BYTES = 0
    with running_worker(broker_url=redis_url, queues="default", log_dir=tmp_path,
                        env_extra={"ONNX_COUNT_TUNING_TASKS": "0"}) as worker:
        good = _upload(client, team, "good", small_cnn_bytes)
        bad = _upload(client, team, "bad", _relu([1, 1_000_000, 100_000]))
        assert good.status_code == bad.status_code == 202
        done = lambda: DLModel.objects.filter(state__in=["ready", "invalid"]).count() == 2  # noqa: E731
        wait_for(done, 120, "both models validated", worker.log)
    assert DLModel.objects.get(name="good").state == "ready"
    bad_model = DLModel.objects.get(name="bad")
    assert bad_model.state == "invalid" and bad_model.error_code == "tensor_too_large"
    assert not bad_model.file.name


# --- imported tuning records (issue 11 §1) ---------------------------------------------------------------

PRAGMA_IR = 'define void @evil() { ret void }\n@llvm.global_ctors = appending global [1 x { i32, ptr, ptr }] []'


@pytest.fixture
def import_run(uploader, small_cnn_bytes):
    from tuning import services as tuning_services

    client, team, user = uploader
    model = core_services.register_model(team=team, name="m", data=small_cnn_bytes, filename="m.onnx", actor=user)
    run = tuning_services.start_run(actor=user, model=model, max_trials=4, enqueue=False)
    return client, run, small_cnn_bytes


def _post_import(client, run, wl: bytes, rec: bytes):
    return client.post(f"/api/runs/{run.pk}/import-records/", {
        "workloads": SimpleUploadedFile("database_workload.json", wl),
        "records": SimpleUploadedFile("database_tuning_record.json", rec)}, format="multipart")


def _nothing_written(run) -> bool:
    from tuning import services as tuning_services
    from tuning.models import TuningRun

    work = tuning_services.run_work_dir(run.pk)
    return not any(work.rglob("database_*.json")) and not any(work.rglob("*.jsonl")) and (
        "imported_records" not in TuningRun.objects.get(pk=run.pk).options)


def _stored_imports(run) -> list:
    """The run's checked imported records: [task index, [trace, null, null, null]] lines (no workload file)."""
    import json

    from tuning import services as tuning_services

    work = tuning_services.run_work_dir(run.pk) / "imported"
    assert not (work / "database_workload.json").exists()  # nothing the checker returns is parsed as a TVM graph
    return [json.loads(x) for x in (work / "records.jsonl").read_text().splitlines()]


def _onnx(data: bytes):
    import onnx

    return onnx.load_model_from_string(data)


@pytest.mark.parametrize("key", ["pragma_import_llvm", "pragma_import_c"])
def test_import_refuses_a_trace_that_imports_code(import_run, key):
    """A real TVM trace of the run's own task with Annotate(loop, pragma_import_*, <code>): 400, nothing written."""
    from tuning.engine.testing import tuning_database

    client, run, data = import_run
    wl, rec = tuning_database(_onnx(data), run.target, annotations=((key, PRAGMA_IR),), on_loop=True)
    resp = _post_import(client, run, wl, rec)
    assert resp.status_code == 400, resp.content[:300]
    detail = resp.json()["detail"]
    assert "Tuning record line 1" in detail and key in detail and "allow-list" in detail
    assert _nothing_written(run)


def test_import_refuses_code_or_paths_in_allowed_annotation_values(import_run):
    from tuning.engine.testing import tuning_database

    client, run, data = import_run
    wl, rec = tuning_database(_onnx(data), run.target,
                              annotations=(("meta_schedule.auto_tensorize", "/tmp/evil.so; rm -rf /"),))
    resp = _post_import(client, run, wl, rec)
    assert resp.status_code == 400 and "Tuning record line 1" in resp.json()["detail"]
    assert "not a plain name" in resp.json()["detail"] and _nothing_written(run)


@pytest.mark.parametrize("key,value,reason", [
    ("meta_schedule.unroll_explicit", 16, "SampleCategorical"),
    ("meta_schedule.unroll_implicit", 16, "SampleCategorical"),
    ("meta_schedule.parallel", "x", "integer constant")])
def test_import_refuses_a_record_the_search_could_not_mutate(import_run, key, value, reason):
    """A literal unroll step (MetaSchedule samples it) or a non-integer parallel extent replays fine but
    makes the search's mutator throw, which fails the whole run's search: refused at import."""
    from tuning.engine.testing import tuning_database

    client, run, data = import_run
    wl, rec = tuning_database(_onnx(data), run.target, annotations=((key, value),))
    resp = _post_import(client, run, wl, rec)
    assert resp.status_code == 400, resp.content[:300]
    assert "Tuning record line 1" in resp.json()["detail"] and reason in resp.json()["detail"]
    assert _nothing_written(run)


def test_records_the_checker_accepts_are_ones_metaschedule_can_mutate():
    """The checker's rule against TVM itself: after a JSON round trip (how seeds and imports reach the
    search), MutateUnroll and MutateParallel apply to an accepted record and throw on the refused ones."""
    import json

    from tvm.s_tir import meta_schedule as ms

    from tuning.engine.records.check_replay import check_trace
    from tuning.engine.compile.pipeline import make_target
    from tuning.engine.testing import matmul_primfunc, tuning_database

    target = {"kind": "llvm", "num-cores": 1}
    tgt = make_target(target)

    def traces(annotations):
        wl, rec = tuning_database(matmul_primfunc(32), target, annotations=annotations)
        mod = ms.database.Workload.from_json(json.loads(wl.decode())).mod
        body = json.loads(rec.decode())[1]
        return mod, ms.database.TuningRecord.from_json(body, ms.database.Workload(mod)).trace

    def mutate(mod, trace):
        ctx = ms.TuneContext(mod=mod, target=tgt, space_generator="post-order-apply", num_threads=1)
        for m in (ms.mutator.MutateUnroll(), ms.mutator.MutateParallel(max_jobs_per_core=16)):
            m._initialize_with_tune_context(ctx)
            for _ in range(40):  # each apply picks one annotation at random: all of them get picked
                m.apply(trace)

    mod, good = traces((("meta_schedule.parallel", 16),))
    check_trace(good)
    mutate(mod, good)
    for bad_annotations in ((("meta_schedule.unroll_explicit", 16),), (("meta_schedule.parallel", "x"),)):
        mod, bad = traces(bad_annotations)
        with pytest.raises(ValueError):
            check_trace(bad)
        with pytest.raises(Exception):  # noqa: B017 - TVM's own error, whatever its class
            mutate(mod, bad)


def test_import_accepts_the_records_metaschedule_writes(import_run):
    """What a user really brings: a tuning run's records (MetaSchedule's sampled traces), not only the
    hand-made traces of the refusal tests."""
    from tuning.engine.compile.pipeline import make_target
    from tuning.engine.testing import design_space_database
    from tuning.engine.compile.workloads import collect_tasks

    client, run, data = import_run
    tasks = collect_tasks(_onnx(data), make_target(run.target))
    conv = next(i for i, t in enumerate(tasks) if "conv" in t.name)  # tiled: sampled tiles and unroll steps
    wl, rec = design_space_database(_onnx(data), run.target, task_index=conv, n_records=2)
    resp = _post_import(client, run, wl, rec)
    assert resp.status_code == 200, resp.content[:300]
    stored = _stored_imports(run)
    assert len(stored) == 2 and all(r[0] == conv and r[1][1:] == [None, None, None] for r in stored)


def test_import_refuses_a_workload_that_is_not_one_of_the_runs_tasks(import_run):
    from tuning.engine.testing import matmul_primfunc, tuning_database

    client, run, _ = import_run
    wl, rec = tuning_database(matmul_primfunc(16), run.target)  # valid TVM, foreign workload
    resp = _post_import(client, run, wl, rec)
    assert resp.status_code == 400 and "Tuning record line 1" in resp.json()["detail"]
    assert "not one of this run's tasks" in resp.json()["detail"] and _nothing_written(run)


def test_import_is_capped_at_the_runs_trial_budget(import_run):
    from tuning.engine.testing import tuning_database

    client, run, data = import_run
    wl, rec = tuning_database(_onnx(data), run.target, n_records=run.max_trials + 1)
    resp = _post_import(client, run, wl, rec)
    assert resp.status_code == 400 and "budget of 4 trials" in resp.json()["detail"]
    assert _nothing_written(run)


def test_import_keeps_only_checked_traces_as_seeds_without_their_latencies(import_run):
    """An allowed record (imported 1e-9 s) is stored apart from the run's database, without run_secs:
    nothing of it counts before the platform measures it."""
    import json

    from tuning import services as tuning_services
    from tuning.engine.testing import tuning_database

    client, run, data = import_run
    wl, rec = tuning_database(_onnx(data), run.target, run_secs=(1e-9,), n_records=2)
    resp = _post_import(client, run, wl, rec)
    assert resp.status_code == 200, resp.content[:300]
    work = tuning_services.run_work_dir(run.pk)
    assert not (work / "database_tuning_record.json").exists()
    stored = _stored_imports(run)
    assert len(stored) == 2 and all(r[1][1:] == [None, None, None] for r in stored)  # run_secs, target dropped
    assert [r[1][0] for r in stored] == [json.loads(x)[1][0] for x in rec.decode().splitlines()]  # the traces
    assert resp.json()["trials_done"] == 0 and resp.json().get("estimated_latency_s") is None
    # a second import into the same run is a conflict
    assert _post_import(client, run, wl, rec).status_code == 409


def test_import_of_deeply_nested_json_is_a_clear_400_not_a_crash(import_run):
    """json's C scanner recurses per nesting level: a 1 MB line of '[' raised RecursionError (a 500)."""
    client, run, _ = import_run
    deep = b"[" * 200_000 + b"]" * 200_000 + b"\n"
    for wl, rec in ((b"[1]\n", deep), (deep, b"[0, [[[], []]]]\n")):
        resp = _post_import(client, run, wl, rec)
        assert resp.status_code == 400, resp.content[:300]
        assert "nested too deeply" in resp.json()["detail"] and _nothing_written(run)


def test_import_trusts_nothing_the_checker_returns(import_run, monkeypatch):
    """The checker parses hostile bytes with TVM's C++ loaders; if it were subverted, what it returns
    must still be refused by the parent's plain-Python check, and nothing written."""
    import json

    from tuning.engine.process import procpool
    from tuning.engine.testing import tuning_database

    client, run, data = import_run
    wl, rec = tuning_database(_onnx(data), run.target)
    trace = json.loads(rec.decode().splitlines()[0])[1][0]
    good = [0, [trace, None, None, None]]
    hostile = json.loads(json.dumps(good).replace("meta_schedule.unroll_explicit", "pragma_import_llvm"))
    with_path = json.loads(json.dumps(good).replace('"root"', '"/tmp/x.ll"'))
    quoted_path = json.loads(json.dumps(good).replace('"root"', '"\\"/tmp/x.ll\\""'))
    assert with_path != good and quoted_path != good
    with_latency = [0, [trace, [1e-9], None, None]]
    with_target = [0, [trace, None, {"kind": "llvm", "libs": "/tmp/evil.so"}, None]]
    unknown_kind = [0, [[trace[0] + [["PrintHello", [], [], []]], trace[1]], None, None, None]]
    deep = "[0, [[" + "[" * 100_000 + "]" * 100_000 + ", []], null, null, null]]"
    cases = [(json.dumps(hostile), "pragma_import_llvm"), (json.dumps(with_path), "not a plain name"),
             (json.dumps(quoted_path), "not a plain name"), (json.dumps(with_latency), "latency"),
             (json.dumps(with_target), "a target"), (json.dumps(unknown_kind), "PrintHello"),
             (json.dumps([12345, good[1]]), "malformed"), (json.dumps([-1, good[1]]), "malformed"),
             (json.dumps(good).replace("16", "NaN", 1), "malformed"), (deep, "nested too deeply")]
    for bad, reason in cases:
        # a workload line (a TVM graph) beside it is never written: the engine pairs traces with its own tasks
        monkeypatch.setattr(procpool, "run_isolated",
                            lambda *a, bad=bad, **k: {"workloads": ['{"type_key": "attacker"}'], "records": [bad]})
        resp = _post_import(client, run, wl, rec)
        assert resp.status_code == 400 and reason in resp.json()["detail"], (reason, resp.content[:300])
        assert _nothing_written(run)
    monkeypatch.setattr(procpool, "run_isolated", lambda *a, **k: ["not", "a", "dict"])
    resp = _post_import(client, run, wl, rec)
    assert resp.status_code == 400 and _nothing_written(run)
    monkeypatch.setattr(procpool, "run_isolated",
                        lambda *a, **k: {"workloads": ['{"type_key": "attacker"}'], "records": [json.dumps(good)]})
    assert _post_import(client, run, wl, rec).status_code == 200
    assert _stored_imports(run) == [good]  # what was checked, and only that


def _record_with_instruction(data, run, inst, *, annotations=(("meta_schedule.parallel", 16),)):
    """A real record of the run's task (tuning_database) with one more instruction appended to its trace."""
    import json

    from tuning.engine.testing import tuning_database

    wl, rec = tuning_database(_onnx(data), run.target, annotations=annotations)
    line = json.loads(rec.decode().splitlines()[0])
    line[1][0][0].append(inst)
    return wl, (json.dumps(line) + "\n").encode()


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e400"])
def test_import_refuses_numbers_tvm_cannot_load_back(import_run, number):
    """Python's json accepts NaN and Infinity (and 1e400 parses to inf); TVM's database cannot load them
    back, so a run that imported one failed after the user had been told it was imported: a 400 now."""
    client, run, data = import_run
    wl, rec = _record_with_instruction(data, run, ["Annotate", ["b0", 7], ["meta_schedule.vectorize"], []])
    rec = rec.replace(b'"b0", 7]', b'"b0", ' + number + b"]")
    resp = _post_import(client, run, wl, rec)
    assert resp.status_code == 400, resp.content[:300]
    detail = resp.json()["detail"]
    assert "Tuning record line 1" in detail and ("finite" in detail or "not a number" in detail), detail
    assert _nothing_written(run)


def test_import_refuses_unroll_steps_past_metaschedules_largest(import_run):
    """An unroll step of 2**31 built for minutes and gigabytes (one builder worker per candidate, and the
    search's mutations keep the categorical): steps above 1024, sampled or literal, are refused."""
    import json

    client, run, data = import_run
    for inst in (["SampleCategorical", [], [[0, 2147483647], [0.5, 0.5]], ["v90"]],
                 ["Annotate", ["b0", 1 << 20], ["pragma_auto_unroll_max_step"], []],
                 # a name sampled as [16], then redefined by a tile of 4096: TVM reads the latest definition
                 ["SampleCategorical", [], [[16], [1.0]], ["b0"]]):
        wl, rec = _record_with_instruction(data, run, inst)
        if inst[0] == "SampleCategorical":  # the unroll annotation reads the sampled variable
            line = json.loads(rec)
            line[1][0][0].append(["Annotate", ["b0", "v90"], ["meta_schedule.unroll_explicit"], []])
            rec = (json.dumps(line) + "\n").encode()
        resp = _post_import(client, run, wl, rec)
        reason = "redefines" if inst[3] == ["b0"] else "unrolls by more than 1024"
        assert resp.status_code == 400 and reason in resp.json()["detail"], resp.content[:300]
        assert _nothing_written(run)


@pytest.mark.parametrize("kind,reason", [("unroll", r"unrolls loops \d{4,} times over"),
                                         ("vectorize", r"vectorizes a loop of \d{3,} lanes")])
def test_import_refuses_traces_that_unroll_or_vectorize_past_metaschedules_bounds(import_run, kind, reason):
    """Unroll and Vectorize are MetaSchedule's own instructions, but a trace that fully unrolls a task's
    loop nest built for 147 s and 366 MB, and a 4096-lane vector for more than 200 s: every seed of them
    would time out a builder. The checker replays the trace and refuses what unrolls more than 1024 copies
    or vectorizes more than 64 lanes (real records: llvm's largest vector is 64 lanes)."""
    from tuning.engine.testing import loop_kind_database

    client, run, data = import_run
    from tvm.s_tir.schedule import ScheduleError

    # small_cnn's first task whose first block takes it (thousands of iterations; under pipeline v2's NHWC
    # a conv's padding block refuses a whole-nest vector, so a later task carries it)
    for index in range(6):
        try:
            wl, rec = loop_kind_database(_onnx(data), run.target, kind, task_index=index)
            break
        except ScheduleError:
            continue
    else:
        pytest.fail(f"no task of small_cnn takes a whole-nest {kind}")
    resp = _post_import(client, run, wl, rec)
    assert resp.status_code == 400 and re.search(reason, resp.json()["detail"]), resp.content[:300]
    assert _nothing_written(run)
