"""Model registry over the API: upload, validation errors, scoping, roles, delete."""
from __future__ import annotations

import io
import os

import pytest
from onnx import TensorProto, helper

from core.models import DLModel

pytestmark = pytest.mark.django_db


def upload(client, team_id, data: bytes, *, name="m1", filename="m.onnx"):
    return client.post(
        "/api/models/",
        {"team": team_id, "name": name, "file": _named(data, filename)},
        format="multipart",
    )


def _named(data: bytes, filename: str):
    f = io.BytesIO(data)
    f.name = filename
    return f


def test_upload_good_model_stores_features(api_owner, team_a, small_cnn_bytes):
    resp = upload(api_owner, team_a.pk, small_cnn_bytes)
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert body["team"] == team_a.pk and body["name"] == "m1"
    assert body["total_flops"] > 0 and body["param_count"] > 0
    assert body["conv_count"] >= 2 and body["linear_count"] >= 1
    assert body["inputs"][0]["shape"][0] == body["batch_size"]
    stored = DLModel.objects.get(pk=body["id"])
    assert stored.file.read() == small_cnn_bytes


def _bad_files(small_cnn_bytes):
    unsupported = helper.make_model(
        helper.make_graph(
            [helper.make_node("Celu", ["x"], ["y"])], "g",  # valid ONNX, no converter in TVM Relax
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 3])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 3])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    dynamic = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "C"])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "C"])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    return {
        "not_protobuf": (b"this is plain text, not a protobuf" * 10, "m.onnx"),
        "truncated": (small_cnn_bytes[: len(small_cnn_bytes) // 2], "m.onnx"),
        "bad_extension": (small_cnn_bytes, "m.pt"),
        "unsupported_op": (unsupported.SerializeToString(), "m.onnx"),
        "missing_input_shape": (dynamic.SerializeToString(), "m.onnx"),
    }


@pytest.mark.parametrize("kind", ["not_protobuf", "truncated", "bad_extension", "unsupported_op", "missing_input_shape"])
def test_bad_uploads_get_400_and_store_nothing(api_owner, team_a, small_cnn_bytes, kind, settings):
    data, filename = _bad_files(small_cnn_bytes)[kind]
    resp = upload(api_owner, team_a.pk, data, filename=filename)
    assert resp.status_code == 400, resp.content
    body = resp.json()
    assert body["code"] == kind
    assert len(body["detail"]) > 10
    assert DLModel.objects.count() == 0
    assert not list(settings.MEDIA_ROOT.rglob("*.onnx"))


def test_too_large_upload_refused_before_reading(api_owner, team_a, small_cnn_bytes, settings):
    settings.ONNX_MAX_UPLOAD_BYTES = len(small_cnn_bytes) - 1
    resp = upload(api_owner, team_a.pk, small_cnn_bytes)
    assert resp.status_code == 400
    assert resp.json()["code"] == "too_large"
    assert DLModel.objects.count() == 0


def test_missing_file_and_name_are_field_errors(api_owner, team_a):
    resp = api_owner.post("/api/models/", {"team": team_a.pk}, format="multipart")
    assert resp.status_code == 400
    assert {"name", "file"} <= set(resp.json()["errors"])


@pytest.mark.dialect
def test_duplicate_name_is_409(api_owner, team_a, small_cnn_bytes):
    assert upload(api_owner, team_a.pk, small_cnn_bytes).status_code == 201
    resp = upload(api_owner, team_a.pk, small_cnn_bytes)
    assert resp.status_code == 409
    assert DLModel.objects.count() == 1


def test_other_teams_model_is_404(api_other, model_a):
    assert api_other.get(f"/api/models/{model_a.pk}/").status_code == 404
    assert api_other.delete(f"/api/models/{model_a.pk}/").status_code == 404
    assert api_other.get(f"/api/models/{model_a.pk}/download/").status_code == 404
    assert api_other.get("/api/models/").json()["count"] == 0


def test_upload_into_other_team_is_refused(api_other, team_a, small_cnn_bytes):
    resp = upload(api_other, team_a.pk, small_cnn_bytes)
    assert resp.status_code == 400
    assert "team" in resp.json()["errors"]
    assert DLModel.objects.count() == 0


def test_viewer_reads_but_cannot_write(user_viewer, model_a, team_a, small_cnn_bytes):
    from tests.helpers import client_for

    client = client_for(user_viewer)
    assert client.get(f"/api/models/{model_a.pk}/").status_code == 200
    assert client.delete(f"/api/models/{model_a.pk}/").status_code == 403
    assert upload(client, team_a.pk, small_cnn_bytes, name="v").status_code == 400  # not a writable team
    assert DLModel.objects.filter(pk=model_a.pk).exists()


def test_member_delete_archives_the_model_and_keeps_its_file(user_member, model_a,
                                                           django_capture_on_commit_callbacks):
    """DELETE archives (issue 39): the model leaves the lists, its row and file stay, and it can be restored."""
    from tests.helpers import client_for

    client = client_for(user_member)
    path = model_a.file.path
    with django_capture_on_commit_callbacks(execute=True):
        resp = client.delete(f"/api/models/{model_a.pk}/")
    assert resp.status_code == 204
    model_a.refresh_from_db()
    assert model_a.archived_at is not None and os.path.exists(path)
    assert client.get("/api/models/").json()["count"] == 0
    assert [m["id"] for m in client.get("/api/models/?archived=true").json()["results"]] == [model_a.pk]
    assert client.get(f"/api/models/{model_a.pk}/").json()["archived_at"]
    resp = client.post(f"/api/models/{model_a.pk}/restore/")
    assert resp.status_code == 200 and resp.json()["archived_at"] is None
    assert client.get("/api/models/").json()["count"] == 1


def test_list_filters_and_pagination(api_owner, team_a, small_cnn_bytes):
    for i in range(3):
        assert upload(api_owner, team_a.pk, small_cnn_bytes, name=f"net-{i}").status_code == 201
    page = api_owner.get("/api/models/?page_size=2&ordering=name").json()
    assert page["count"] == 3 and len(page["results"]) == 2 and page["next"]
    assert [m["name"] for m in page["results"]] == ["net-0", "net-1"]
    assert api_owner.get("/api/models/?name=net-2").json()["count"] == 1
    assert api_owner.get(f"/api/models/?team={team_a.pk}&source=zoo").json()["count"] == 0


def test_anonymous_is_401(api_anon, model_a):
    assert api_anon.get("/api/models/").status_code == 401
    assert api_anon.get(f"/api/models/{model_a.pk}/").status_code == 401


def test_download_returns_the_file(api_owner, model_a, small_cnn_bytes):
    resp = api_owner.get(f"/api/models/{model_a.pk}/download/")
    assert resp.status_code == 200
    assert b"".join(resp.streaming_content) == small_cnn_bytes


def test_upload_counts_tuning_tasks_through_tvm(api_owner, team_a, small_cnn_bytes, settings):
    settings.ONNX_COUNT_TUNING_TASKS = True
    resp = upload(api_owner, team_a.pk, small_cnn_bytes)
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert body["num_tuning_tasks"] >= 3
    assert len(body["tuning_task_names"]) == body["num_tuning_tasks"]


def test_task_counting_follows_the_settings(settings):
    """core.services.task_counter: the dotted path in ONNX_TASK_COUNTER (the tuning engine's by default, so
    core imports no tuning code), None when counting is off or no counter is named."""
    from core import services
    from tuning.engine.compile.pipeline import count_tuning_tasks

    settings.ONNX_COUNT_TUNING_TASKS = True
    assert services.task_counter() is count_tuning_tasks
    settings.ONNX_TASK_COUNTER = ""
    assert services.task_counter() is None
    settings.ONNX_TASK_COUNTER, settings.ONNX_COUNT_TUNING_TASKS = "tuning.engine.compile.pipeline.count_tuning_tasks", False
    assert services.task_counter() is None
