"""Celery tasks of the core app."""
from __future__ import annotations

import os
import socket

from celery import shared_task


@shared_task(name="core.ping")
def ping(payload: str = "ping") -> dict:
    """Round trip check: proves a real worker process picked the message up."""
    return {"reply": payload, "worker_pid": os.getpid(), "host": socket.gethostname()}


@shared_task(name="core.validate_model", acks_late=True)
def validate_model(model_id: int) -> str | None:
    """Validate a large upload off the request path (default queue): the model ends ready or invalid."""
    from core import services

    model = services.finish_model_validation(model_id=model_id)
    return model.state if model is not None else None
