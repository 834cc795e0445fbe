"""Outages of what the web tier stands on (a full disk, the task broker, the cache, the database's
connection) answered as 503 with a message and a Retry-After, never as a bare 500.

``classify(exc)`` says whether an exception is such an outage. The API's exception handler
(core.api.errors) answers it in the API's error shape; ``ServiceUnavailableMiddleware`` does the same for
the dashboard's views; ``server_error`` (settings' handler500) catches what is raised outside any view
(a middleware reading an upload onto a full disk). Anything else stays a 500: a bug must not pass for an
outage.
"""
from __future__ import annotations

import errno
import logging
import sys
from dataclasses import dataclass

from django.db import DatabaseError
from django.http import HttpResponse, JsonResponse, UnreadablePostError
from django.views.defaults import server_error as django_server_error
from kombu.exceptions import OperationalError as BrokerError

from core.cache import is_cache_outage
from core.exceptions import ServiceError

log = logging.getLogger(__name__)

_DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_DISK_FULL_SQLSTATE = "53100"  # PostgreSQL disk_full
# Database messages of a full disk where the driver gives no code (SQLite: SQLITE_FULL).
_DISK_FULL_WORDS = ("database or disk is full", "no space left on device", "disk full", "could not extend file")
_DB_UNREACHABLE_WORDS = ("could not connect", "connection refused", "server closed the connection",
                         "connection already closed", "terminating connection", "the database system is")


@dataclass(frozen=True)
class Unavailable:
    code: str
    message: str
    retry_after: int  # seconds; 0: no Retry-After
    status: int = 503

    def body(self) -> dict:
        """The API's error shape (core.api.errors)."""
        return {"detail": self.message, "code": self.code, "errors": {}}


DISK_FULL = Unavailable("disk_full", "The server's storage is full, so nothing was saved; reading still works. "
                        "Try again later (the operators have been told by the log).", 300)
BROKER_DOWN = Unavailable("broker_unavailable", "The task queue is unreachable, so the work was not started. "
                          "Try again in a minute.", 30)
CACHE_DOWN = Unavailable("cache_unavailable", "A backing service (the cache) is unreachable. Try again in a "
                         "minute.", 30)
DATABASE_DOWN = Unavailable("database_unavailable", "The database is unreachable. Try again in a minute.", 30)
# Not an outage but the client's: its body stopped arriving (config/gunicorn.py's idle timeout, a dropped
# connection). Answered 400, which the client, if it is still there, can act on.
BODY_INCOMPLETE = Unavailable("request_incomplete", "The request body stopped arriving before it was complete; "
                              "nothing was stored. Send it again.", 0, status=400)


def _chain(exc: BaseException):
    """``exc`` and what caused it (``raise ... from None`` ends the chain: that error speaks for itself)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)


def is_disk_full(exc: BaseException) -> bool:
    """An OSError ENOSPC/EDQUOT, or a database error that says its disk is full, anywhere in the chain."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in _DISK_FULL_ERRNOS:
            return True
        if getattr(e, "sqlstate", None) == _DISK_FULL_SQLSTATE or getattr(e, "pgcode", None) == _DISK_FULL_SQLSTATE:
            return True
        if isinstance(e, DatabaseError) or type(e).__module__.startswith(("sqlite3", "psycopg")):
            text = str(e).lower()
            if any(w in text for w in _DISK_FULL_WORDS):
                return True
    return False


def classify(exc: BaseException) -> Unavailable | None:
    """The outage ``exc`` reports, or None when it is not one. A service's own refusal (ServiceError) keeps
    its status, whatever happened before it."""
    if isinstance(exc, ServiceError):
        return None
    if isinstance(exc, UnreadablePostError):
        return BODY_INCOMPLETE
    if is_disk_full(exc):
        return DISK_FULL
    for e in _chain(exc):
        if isinstance(e, BrokerError):
            return BROKER_DOWN
        if is_cache_outage(e) and type(e).__module__.startswith("redis"):
            return CACHE_DOWN
        if isinstance(e, DatabaseError) and any(w in str(e).lower() for w in _DB_UNREACHABLE_WORDS):
            return DATABASE_DOWN
    return None


def log_outage(outage: Unavailable, exc: BaseException, where: str) -> None:
    log.log(logging.ERROR if outage.status >= 500 else logging.INFO, "%s at %s: %s: %s", outage.code, where,
            type(exc).__name__, exc)


def unavailable_response(request, outage: Unavailable) -> HttpResponse:
    """The answer for a non-DRF view: JSON in the API's shape under /api/, plain text elsewhere."""
    if request.path_info.startswith("/api/"):
        response = JsonResponse(outage.body(), status=outage.status)
    else:
        response = HttpResponse(outage.message, status=outage.status, content_type="text/plain; charset=utf-8")
    if outage.retry_after:
        response["Retry-After"] = str(outage.retry_after)
    return response


class ServiceUnavailableMiddleware:
    """A view's outage exception -> 503 with Retry-After (DRF views answer it in their exception handler)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        outage = classify(exception)
        if outage is None:
            return None
        log_outage(outage, exception, request.path_info)
        return unavailable_response(request, outage)


def server_error(request, *args, **kwargs):
    """handler500: called inside Django's except block, so the exception is at hand; an outage raised
    outside a view (a middleware) is a 503 too."""
    exc = sys.exc_info()[1]
    outage = classify(exc) if exc is not None else None
    if outage is not None:
        return unavailable_response(request, outage)
    return django_server_error(request, *args, **kwargs)
