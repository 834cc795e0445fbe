"""The platform's limits on the child process that parses an upload (``common.sandbox``), from settings.

Every parser of user bytes (ONNX validation with TVM, cluster-trace parsing) goes through
:func:`parse_in_sandbox`: web requests with the inline wall-clock limit, the Celery validation of a
large model with the longer background one.
"""
from __future__ import annotations

import logging
import math
from typing import Any

from django.conf import settings

from common.sandbox import SandboxFailure, run_in_child

__all__ = ["SandboxFailure", "parse_in_sandbox", "sandbox_limits"]

log = logging.getLogger(__name__)


def sandbox_limits(*, background: bool = False) -> dict[str, Any]:
    """``memory_mb``, ``cpu_s`` and ``wall_s`` for one parser child (``background``: a Celery task's)."""
    wall = float(settings.UPLOAD_SANDBOX_ASYNC_WALL_S if background else settings.UPLOAD_SANDBOX_WALL_S)
    return {"memory_mb": int(settings.UPLOAD_SANDBOX_MEMORY_MB),
            "cpu_s": max(1, min(int(settings.UPLOAD_SANDBOX_CPU_S), math.ceil(wall))), "wall_s": wall}


def parse_in_sandbox(target: str, *, data: bytes, kwargs: dict[str, Any], what: str,
                     background: bool = False) -> Any:
    """``target(data=data, **kwargs)`` in a limited child; its JSON answer, or :class:`SandboxFailure`
    (logged here with the child's stderr tail, which is for operators, not for the uploader)."""
    try:
        return run_in_child(target, kwargs=kwargs, data=data, what=what,
                            preexec=settings.UPLOAD_SANDBOX_PREEXEC or None, **sandbox_limits(background=background))
    except SandboxFailure as exc:
        log.warning("upload parser stopped (%s): %s; stderr tail: %s", exc.reason, exc, exc.stderr_tail[-2000:])
        raise
