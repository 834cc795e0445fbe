"""One error format for the whole API.

Every 4xx/5xx body is `{"detail": str, "code": str, "errors": {field: [msgs]}}`;
`detail` keeps DRF's key so existing clients still read it. An outage (core.outages: a full disk, the
broker or cache unreachable) is a 503 in this shape with Retry-After.
"""
from __future__ import annotations

import re

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, HttpResponsePermanentRedirect, JsonResponse
from django.urls import Resolver404, resolve
from django.views.defaults import page_not_found as django_page_not_found
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from core import outages
from core.exceptions import QuotaExceeded, ServiceError, ServiceUnavailable, TooManyAttempts
from core.onnx_models.errors import OnnxValidationError


# get_object_or_404's message: "No TuningRun matches the given query." (the model's class name)
DJANGO_NOT_FOUND = re.compile(r"No \w+ matches the given query\.")


def _flatten(detail) -> tuple[str, dict]:
    if isinstance(detail, dict):
        errors = {k: [str(m) for m in (v if isinstance(v, list) else [v])] for k, v in detail.items()}
        first_field, msgs = next(iter(errors.items()), ("", ["Invalid input."]))
        prefix = "" if first_field in ("non_field_errors", "detail") else f"{first_field}: "
        return prefix + (msgs[0] if msgs else "Invalid input."), errors
    if isinstance(detail, list):
        msgs = [str(m) for m in detail]
        return (msgs[0] if msgs else "Invalid input."), {"non_field_errors": msgs}
    return str(detail), {}


def exception_handler(exc, context):
    outage = None if isinstance(exc, exceptions.APIException) else outages.classify(exc)
    if outage is not None:  # a full disk, the broker or the cache down: 503 with a retry hint, never a 500
        request = context.get("request")
        outages.log_outage(outage, exc, request.path if request is not None else "api")
        return Response(outage.body(), status=outage.status,
                        headers={"Retry-After": str(outage.retry_after)} if outage.retry_after else None)
    if isinstance(exc, OnnxValidationError):
        return Response(
            {"detail": exc.message, "code": exc.code, "errors": {"file": [exc.message]}},
            status=status.HTTP_400_BAD_REQUEST,
        )
    if isinstance(exc, ServiceError):
        body = {"detail": exc.message, "code": exc.code, "errors": {exc.field: [exc.message]} if exc.field else {}}
        if isinstance(exc, QuotaExceeded):
            body["quota"] = exc.quota
        response = Response(body, status=exc.status)
        if isinstance(exc, (TooManyAttempts, ServiceUnavailable)):
            response["Retry-After"] = str(exc.retry_after)
        return response
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(exc.message_dict if hasattr(exc, "error_dict") else exc.messages)
    if isinstance(exc, Http404):  # a view's own message is kept; Django's names the model class
        message = str(exc)
        exc = exceptions.NotFound(None if not message or DJANGO_NOT_FOUND.fullmatch(message) else message)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    detail = exc.detail if isinstance(exc, exceptions.APIException) else response.data
    message, errors = _flatten(detail)
    code = getattr(exc, "default_code", "error")
    if isinstance(exc, exceptions.ValidationError):
        code = "invalid"
    elif isinstance(exc, exceptions.NotFound):
        code = "not_found"
    response.data = {"detail": message, "code": code, "errors": errors}
    return response


NOT_FOUND_BODY = {"detail": "Not found.", "code": "not_found", "errors": {}}


def api_not_found(request, *args, **kwargs):
    """Any /api/ path no route serves: the API's JSON 404, not the dashboard's HTML page. A path that only
    lacks its trailing slash is redirected for a GET or HEAD (as Django's APPEND_SLASH did before this
    route caught every /api/ path) and named in the 404 otherwise (a redirect would drop a POST's body)."""
    if settings.APPEND_SLASH and not request.path_info.endswith("/") and _served(request.path_info + "/"):
        if request.method in ("GET", "HEAD"):
            query = request.META.get("QUERY_STRING", "")
            return HttpResponsePermanentRedirect(request.path + "/" + (f"?{query}" if query else ""))
        return JsonResponse({**NOT_FOUND_BODY, "detail": f"Not found. Did you mean {request.path}/ ?"}, status=404)
    return JsonResponse(NOT_FOUND_BODY, status=404)


def _served(path: str) -> bool:
    try:
        return resolve(path).func is not api_not_found
    except Resolver404:
        return False


def page_not_found(request, exception=None):
    """handler404: JSON under /api/ (a 404 raised outside DRF's views), the dashboard's page elsewhere."""
    if request.path.startswith("/api/"):
        return api_not_found(request)
    return django_page_not_found(request, exception)
