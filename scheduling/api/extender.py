"""HTTP face of the Kubernetes scheduler extender: ``POST /scheduler/extender/{filter,prioritize,bind,release}``.

kube-scheduler speaks plain JSON (``k8s.io/kube-scheduler/extender/v1``), not the REST API's conventions,
so these are plain Django views: CSRF-exempt (no cookie is involved), authenticated by
``Authorization: Bearer <SCHEDULER_EXTENDER_TOKEN>``, answering kube-scheduler's own result shapes.
Malformed requests are a 400 with ``{"Error": message}``, a bind its team's GPU-hour quota has no room for
a 429; with no token configured every call is a 503.
"""
from __future__ import annotations

import json

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from core.exceptions import ServiceError
from scheduling.services import extender as service


def _error(status: int, message: str) -> JsonResponse:
    response = JsonResponse({"Error": message}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="dlopt-scheduler-extender"'
    return response


def _authorized(request: HttpRequest) -> JsonResponse | None:
    """None when the caller presented the extender's token, else the refusal to answer."""
    if not service.extender_enabled():
        return _error(503, "The scheduler extender is disabled: set SCHEDULER_EXTENDER_TOKEN.")
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not service.token_matches(presented.strip()):
        return _error(401, "A valid 'Authorization: Bearer <SCHEDULER_EXTENDER_TOKEN>' header is required.")
    return None


def _body(request: HttpRequest):
    if request.content_type != "application/json":
        raise service.ExtenderError("Send the extender arguments as application/json.")
    try:
        return json.loads(request.body or b"null")
    except RequestDataTooBig:
        raise service.ExtenderError("The request is too large: configure the extender with "
                                    "nodeCacheCapable: true so kube-scheduler sends node names only.") from None
    except (ValueError, RecursionError) as exc:  # RecursionError: arrays nested deeper than the parser goes
        raise service.ExtenderError(f"The body is not JSON: {type(exc).__name__}: {str(exc)[:200]}") from None


def _endpoint(handler):
    @csrf_exempt
    @require_POST
    def view(request: HttpRequest) -> JsonResponse:
        refused = _authorized(request)
        if refused is not None:
            return refused
        try:
            return JsonResponse(handler(_body(request)), safe=False)
        except service.ExtenderError as exc:
            return _error(400, str(exc))
        except ServiceError as exc:  # its own status: 404, 403, 429 for a team's GPU-hour quota, else 400
            return _error(exc.status, str(exc))

    view.__name__ = handler.__name__
    return view


@_endpoint
def filter_view(args):
    return service.filter_pod(args=args)


@_endpoint
def prioritize_view(args):
    return service.prioritize_pod(args=args)


@_endpoint
def bind_view(args):
    return service.bind_pod(args=args)


@_endpoint
def release_view(args):
    return service.release_requested(args=args)
