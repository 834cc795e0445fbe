"""Domain errors raised by services; the API and dashboard turn them into 4xx/messages."""
from __future__ import annotations


class ServiceError(Exception):
    """A request that cannot be carried out as asked. `status` is the HTTP status it maps to."""

    status = 400
    code = "invalid"

    def __init__(self, message: str, *, code: str | None = None, field: str | None = None):
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        self.field = field


class ConflictError(ServiceError):
    status = 409
    code = "conflict"


class QuotaExceeded(ServiceError):
    """Starting the work would exceed a team quota. `quota` names the limit."""

    status = 429
    code = "quota_exceeded"

    def __init__(self, message: str, *, quota: str):
        super().__init__(message, code="quota_exceeded")
        self.quota = quota


class TooManyAttempts(ServiceError):
    """A password check refused because the account is locked after failed passwords (core.login_guard)."""

    status = 429
    code = "throttled"

    def __init__(self, message: str, *, retry_after: int, field: str | None = None):
        super().__init__(message, field=field)
        self.retry_after = retry_after


class PermissionDenied(ServiceError):
    status = 403
    code = "permission_denied"


class NotFound(ServiceError):
    status = 404
    code = "not_found"


class ServiceUnavailable(ServiceError):
    """The request is sound but a service it needs is down (the task broker, a full disk): try again later.
    The API answers 503 with Retry-After."""

    status = 503
    code = "unavailable"

    def __init__(self, message: str, *, retry_after: int = 30, code: str | None = None):
        super().__init__(message, code=code)
        self.retry_after = retry_after
