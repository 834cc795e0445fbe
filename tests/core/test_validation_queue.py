"""A large upload's validation is queued after commit through core.dispatch.send_on_commit."""
from __future__ import annotations

import pytest
from kombu.exceptions import OperationalError

from core import services, tasks
from core.models import DLModel

pytestmark = pytest.mark.django_db


def test_large_upload_is_refused_at_once_when_its_validation_cannot_be_queued(
        team_a, user_owner, small_cnn_bytes, settings, monkeypatch, django_capture_on_commit_callbacks):
    """Broker down at send time: the upload does not fail (its row is committed), the model is marked invalid
    with the reason (it never waits in `validating` for a message that does not exist) and its file is gone."""
    settings.ONNX_ASYNC_VALIDATION_BYTES = 0

    def broker_down(pk):
        raise OperationalError("Error 111 connecting to redis: Connection refused")

    monkeypatch.setattr(tasks.validate_model, "delay", broker_down)
    with django_capture_on_commit_callbacks(execute=True):
        model = services.submit_model(team=team_a, name="big", data=small_cnn_bytes, filename="big.onnx",
                                      actor=user_owner)
    row = DLModel.objects.get(pk=model.pk)
    assert row.state == model.state == DLModel.State.INVALID
    assert row.error_code == model.error_code == "validation_failed" and "broker" in row.error_message
    assert row.file.name == ""


def test_large_upload_queues_its_validation_after_commit(team_a, user_owner, small_cnn_bytes, settings,
                                                          monkeypatch, django_capture_on_commit_callbacks):
    settings.ONNX_ASYNC_VALIDATION_BYTES = 0
    queued = []
    monkeypatch.setattr(tasks.validate_model, "delay", queued.append)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        model = services.submit_model(team=team_a, name="big", data=small_cnn_bytes, filename="big.onnx",
                                      actor=user_owner)
    assert queued == [] and model.state == DLModel.State.VALIDATING  # nothing is sent before the commit
    for callback in callbacks:
        callback()
    assert queued == [model.pk]
