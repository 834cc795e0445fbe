"""Publishing Celery messages from inside a transaction: after commit, and never raising a broker
outage into the request or task that committed the work (it is logged and handed to ``on_error``)."""
from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import transaction
from kombu.exceptions import OperationalError as BrokerError

log = logging.getLogger(__name__)


def send_on_commit(send: Callable[[], object], *, what: str,
                   on_error: Callable[[BaseException], None] | None = None) -> None:
    """Run ``send`` (e.g. ``lambda: task.apply_async(...)``) once the current transaction commits;
    immediately when none is open. ``what`` names the message in the log line of a failure."""

    def callback():
        try:
            send()
        except (BrokerError, OSError) as exc:
            log.error("could not send %s: %s", what, exc)
            if on_error is not None:
                on_error(exc)

    transaction.on_commit(callback)
