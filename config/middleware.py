"""The platform's own middleware: request body limits for dashboard forms, and a Content-Security-Policy.

Refuse a dashboard POST whose declared body is over its form's limit, before anything reads the body.

Django's CSRF check reads ``request.POST``, which streams a multipart body to temp files in full before the
view runs: a view that refuses an oversized upload has already let it fill the disk. This middleware runs
before the CSRF check and answers 413 from Content-Length alone. The API is left to its views: DRF parses
lazily and each API upload view checks the declared length itself (core.api.uploads).
"""
from __future__ import annotations

from django.conf import settings
from django.http import HttpResponse
from django.urls import Resolver404, resolve

from core.api.uploads import MULTIPART_SLACK, declared_length

MB = 1024 * 1024


def _record_import_limit() -> int:
    from tuning.api.views import IMPORT_RECORDS_MAX_BYTES, IMPORT_WORKLOADS_MAX_BYTES  # the API's own caps

    return IMPORT_WORKLOADS_MAX_BYTES + IMPORT_RECORDS_MAX_BYTES


# Dashboard forms that take files, by URL name -> the most their file fields may carry.
UPLOAD_FORM_LIMITS = {
    "model-upload": lambda: settings.ONNX_MAX_UPLOAD_BYTES,
    "run-import-records": _record_import_limit,
    "simulation-new": lambda: settings.SCHEDULING_MAX_TRACE_BYTES,
}


def body_limit(path: str) -> int:
    """The largest body a POST to `path` may declare: its file limit plus form overhead, or, for a form
    without files, the form-field limit Django itself applies (DATA_UPLOAD_MAX_MEMORY_SIZE)."""
    try:
        name = resolve(path).url_name
    except Resolver404:
        name = None
    if name in UPLOAD_FORM_LIMITS:
        return UPLOAD_FORM_LIMITS[name]() + MULTIPART_SLACK
    return int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 2.5 * MB) + MULTIPART_SLACK


class RequestBodyLimitMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.method in ("POST", "PUT", "PATCH") and not request.path_info.startswith("/api/"):
            limit, declared = body_limit(request.path_info), declared_length(request)
            if declared > limit:
                return HttpResponse(
                    f"This upload is {declared / MB:.1f} MB, over the {limit / MB:.0f} MB limit of this form. "
                    "Nothing was stored.", status=413, content_type="text/plain; charset=utf-8")
        return self.get_response(request)


class ContentSecurityPolicyMiddleware:
    """Set ``settings.CONTENT_SECURITY_POLICY`` on every response that has none of its own (Django 5.2
    has no CSP support). Placed above WhiteNoise, so static files carry it too. The dashboard runs no
    inline script (plotly.js and dashboard.js are static files; the API docs load their init script
    from a URL), so scripts come from this origin only: an injected ``<script>`` or event handler
    attribute does not run."""

    def __init__(self, get_response):
        self.get_response = get_response
        self.policy = settings.CONTENT_SECURITY_POLICY

    def __call__(self, request):
        response = self.get_response(request)
        if self.policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = self.policy
        return response
