"""The ``?archived=`` list parameter shared by the model and run endpoints."""
from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework import exceptions

ARCHIVED_PARAMETER = OpenApiParameter(
    "archived", OpenApiTypes.BOOL, description="true: list archived ones only; false (default): live ones only.")

_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no", "")


def archived_param(request) -> bool:
    """``?archived=true`` lists archived objects, anything false (or no parameter) live ones; other values 400."""
    value = request.query_params.get("archived", "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise exceptions.ValidationError({"archived": ["Must be true or false."]})
