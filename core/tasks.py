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


@shared_task(name="core.deliver_webhook", bind=True, acks_late=True, max_retries=None)
def deliver_webhook(self, delivery_id: int) -> None:
    """One attempt at a webhook delivery (default queue); a failed attempt that may be retried comes back
    after the service's exponential backoff, up to WEBHOOK_MAX_ATTEMPTS attempts in all."""
    from core.services import webhooks

    retry_in = webhooks.deliver(delivery_id=delivery_id)
    if retry_in is not None:
        raise self.retry(countdown=retry_in)


@shared_task(name="core.resend_lost_webhooks")
def resend_lost_webhooks() -> list[int]:
    """Beat: pending webhook deliveries whose message was lost are sent again."""
    from core.services import webhooks

    return webhooks.resend_lost_deliveries()


@shared_task(name="core.clean_upload_temp", ignore_result=True)
def clean_upload_temp() -> int:
    """Beat: remove the upload temp files that killed web requests left behind."""
    from core.services.upload_temp import remove_stale_upload_files

    return len(remove_stale_upload_files())
