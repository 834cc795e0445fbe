"""The API refuses what it does not know instead of ignoring it.

A misspelt body field (`max_trail`) or query parameter (`?stauts=failed`) used to be dropped silently:
the request then ran with a default (a full budget, an unfiltered list). `RejectUnknownFieldsMixin` makes
an input serializer answer 400 naming every field it does not have; `StrictQueryParamsFilterBackend` (the
first of the project's filter backends) and `StrictQueryParamsMixin` (for views without a queryset) do the
same for query parameters.
"""
from __future__ import annotations

from collections.abc import Mapping

from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.settings import api_settings

UNKNOWN_FIELD = "Unknown field; this request accepts: {accepted}."
UNKNOWN_PARAMETER = "Unknown query parameter; this endpoint accepts: {accepted}."

# Read by DRF's own machinery on any endpoint (format suffix, pagination).
ALWAYS_ALLOWED_PARAMS = frozenset({"format", "page", "page_size"})


class RejectUnknownFieldsMixin:
    # Mix into an input Serializer (before serializers.Serializer): a body field it does not have is a 400
    # naming it. Read-only fields are known, and ignored as DRF ignores them. (A comment, not a docstring:
    # drf-spectacular would publish a docstring as the description of every serializer using it.)

    def to_internal_value(self, data):
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                accepted = ", ".join(name for name, f in self.fields.items() if not f.read_only) or "no fields"
                raise ValidationError({name: [UNKNOWN_FIELD.format(accepted=accepted)] for name in unknown})
        return super().to_internal_value(data)


def allowed_query_params(view) -> set[str]:
    """What an endpoint reads from the query string: its filter set's filters, search and ordering when it
    has them, pagination, format, and what the view declares in `query_params` ({action or method: names})."""
    allowed = set(ALWAYS_ALLOWED_PARAMS)
    filterset_class = getattr(view, "filterset_class", None)
    if filterset_class is not None:
        allowed |= set(filterset_class.base_filters)
    allowed |= set(getattr(view, "filterset_fields", None) or ())
    if getattr(view, "search_fields", None):
        allowed.add(api_settings.SEARCH_PARAM)
    if getattr(view, "ordering_fields", None) or getattr(view, "ordering", None):
        allowed.add(api_settings.ORDERING_PARAM)
    declared = getattr(view, "query_params", None) or {}
    request = getattr(view, "request", None)
    key = getattr(view, "action", None) or (request.method.lower() if request is not None else None)
    allowed |= set(declared.get(key, ())) | set(declared.get("*", ()))
    return allowed


def check_query_params(request, view) -> None:
    unknown = sorted(set(request.query_params) - allowed_query_params(view))
    if unknown:
        accepted = ", ".join(sorted(allowed_query_params(view)))
        raise ValidationError({name: [UNKNOWN_PARAMETER.format(accepted=accepted)] for name in unknown})


class StrictQueryParamsMixin:
    """For an APIView: unknown query parameters are a 400 before the handler runs."""

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        check_query_params(request, self)


class StrictInputSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    pass
