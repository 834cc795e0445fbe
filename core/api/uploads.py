"""Refuse an oversized upload from its Content-Length, before its body is read.

DRF parses a request body lazily (on first access to ``request.data``), so a view
that checks the declared length first never reads, nor spools to a temp file, a
body it is going to refuse anyway. (Session-authenticated POSTs are parsed earlier,
by the CSRF check; they still stream to a temp file with bounded memory.)
"""
from __future__ import annotations

MULTIPART_SLACK = 1024 * 1024  # form fields and part headers around the file(s)


def declared_length(request) -> int:
    try:
        return max(0, int(request.META.get("CONTENT_LENGTH") or 0))
    except (TypeError, ValueError):
        return 0


def body_over(request, max_bytes: int) -> bool:
    """True when the request says it carries more than `max_bytes` of file data (plus form overhead)."""
    return declared_length(request) > max_bytes + MULTIPART_SLACK
