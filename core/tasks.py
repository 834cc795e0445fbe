"""Celery tasks of the core app."""
from __future__ import annotations

import os
import socket

from celery import shared_task


@shared_task(name="core.ping")
def ping(payload: str = "ping") -> dict:
    """Round trip check: proves a real worker process picked the message up."""
    return {"reply": payload, "worker_pid": os.getpid(), "host": socket.gethostname()}
