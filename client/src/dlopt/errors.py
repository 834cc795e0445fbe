"""The client's exceptions; each carries the CLI exit code it maps to."""
from __future__ import annotations

from typing import Any

EXIT_OK = 0
EXIT_REFUSED = 1  # the server refused the request, could not be reached, or the run failed
EXIT_USAGE = 2  # bad command line (argparse uses 2 as well)
EXIT_AUTH = 3  # not logged in, bad or revoked token, or not allowed
EXIT_NOT_FOUND = 4  # no such model, run or team (among yours)
EXIT_STOPPED = 5  # a run followed with --wait was paused or cancelled


class DloptError(Exception):
    """Any error the client reports; `str()` is one readable line."""

    exit_code = EXIT_REFUSED

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))  # one line whatever the server sent
        self.message = str(self.args[0])


class UsageError(DloptError):
    exit_code = EXIT_USAGE


class NotLoggedIn(DloptError):
    exit_code = EXIT_AUTH


class NotFound(DloptError):
    """Something named on the command line does not exist among the caller's teams."""

    exit_code = EXIT_NOT_FOUND


class ConnectionFailed(DloptError):
    pass


class ApiError(DloptError):
    """A 4xx/5xx answer. The platform's body is `{"detail", "code", "errors": {field: [msgs]}}`."""

    def __init__(self, status: int, body: Any, *, reason: str = "") -> None:
        self.status = status
        self.body = body if isinstance(body, dict) else {}
        self.code = str(self.body.get("code") or "")
        self.detail = str(self.body.get("detail") or reason or f"HTTP {status}")
        errors = self.body.get("errors")
        self.errors: dict[str, list[str]] = errors if isinstance(errors, dict) else {}
        super().__init__(self._line())

    def _line(self) -> str:
        # `detail` already names the first field; the other fields' messages follow it
        parts = [self.detail]
        for field, messages in list(self.errors.items())[1:]:
            text = "; ".join(str(m) for m in (messages if isinstance(messages, list) else [messages]))
            parts.append(f"{field}: {text}")
        tag = f"HTTP {self.status}" + (f" {self.code}" if self.code else "")
        return f"{' '.join(p.rstrip('.') + '.' for p in parts)} ({tag})"

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        if self.status in (401, 403):
            return EXIT_AUTH
        if self.status == 404:
            return EXIT_NOT_FOUND
        return EXIT_REFUSED

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "code": self.code, "detail": self.detail, "errors": self.errors}
