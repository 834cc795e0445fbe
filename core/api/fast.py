"""Cheaper reads for hot API endpoints, with the same output as plain DRF.

DRF serializes each row by walking bound field objects (`_readable_fields`, `get_attribute`, per-field
`to_representation`), and a ModelSerializer rebuilds its fields for every response. On a 50-run page
that machinery was ~half of the request's CPU. `FastRepresentationMixin` compiles a serializer's
readable fields once per class into (name, getter, converter) steps; converters of common field types
are inlined and every other field falls back to the field's own `to_representation`, so the output
is byte-for-byte what DRF would produce (tests/core/test_api_fast.py compares them).
"""
from __future__ import annotations

import datetime as dt
import hashlib
import operator
from collections.abc import Mapping

from django.conf import settings
from django.http import HttpResponseNotModified
from django.utils import timezone
from django.utils.http import http_date, parse_http_date_safe
from django_filters.rest_framework import DjangoFilterBackend
from rest_framework import fields as drf_fields
from rest_framework import relations, serializers
from rest_framework.response import Response
from rest_framework.settings import api_settings

from .filters import VisibleRowsFilterSet
from .strict import check_query_params

_MISSING = object()
# Query parameters the pagination, ordering, search and format machinery read, never a filterset.
_NON_FILTER_PARAMS = frozenset({"page", "page_size", "ordering", "search", "format", "cursor"})


def _iso_datetime(field):
    if hasattr(field, "timezone") or getattr(field, "format", api_settings.DATETIME_FORMAT) != drf_fields.ISO_8601 \
            or not settings.USE_TZ:
        return field.to_representation

    def convert(value, tz):
        if not value:
            return None
        if isinstance(value, dt.datetime) and value.tzinfo is not None:
            try:
                text = value.astimezone(tz).isoformat()
            except OverflowError:
                return field.to_representation(value)
            return text[:-6] + "Z" if text.endswith("+00:00") else text
        return field.to_representation(value)

    convert.needs_tz = True
    return convert


def _bool(field):
    fallback = field.to_representation
    return lambda value: value if value is True or value is False else fallback(value)


def _choice(field):
    mapping = dict(field.choice_strings_to_values)
    fallback = field.to_representation
    return lambda value: mapping.get(value, value) if type(value) is str and value else fallback(value)


# Exact types only: a subclass may override to_representation.
_CONVERTERS = {
    drf_fields.IntegerField: lambda f: int,
    drf_fields.FloatField: lambda f: float,
    drf_fields.CharField: lambda f: str,
    drf_fields.ReadOnlyField: lambda f: None,
    drf_fields.JSONField: lambda f: f.to_representation if f.binary else None,
    drf_fields.BooleanField: _bool,
    drf_fields.ChoiceField: _choice,
    drf_fields.DateTimeField: _iso_datetime,
}


def _plain_attribute(model, source: str) -> bool:
    """True when `getattr(instance, source)` is exactly what DRF's get_attribute returns (no call)."""
    attr = getattr(model, source, _MISSING)
    if isinstance(attr, property):
        return True
    try:
        field = model._meta.get_field(source)
    except Exception:  # noqa: BLE001 - not a model field
        return False
    return getattr(field, "attname", None) == source and not field.is_relation


def _compile(serializer: serializers.Serializer) -> list[tuple]:
    model = getattr(getattr(serializer, "Meta", None), "model", None)
    steps = []
    for field in serializer._readable_fields:
        if isinstance(field, (serializers.SerializerMethodField, serializers.BaseSerializer,
                              serializers.HyperlinkedRelatedField, drf_fields.FileField)):
            raise TypeError(f"{type(serializer).__name__}.{field.field_name}: {type(field).__name__} needs the "
                            "request context; FastRepresentationMixin does not support it")
        if type(field) is relations.PrimaryKeyRelatedField and model is not None and "." not in field.source \
                and field.pk_field is None:
            # DRF reads the FK column (PKOnlyObject) and returns it: the `<fk>_id` attribute.
            column = model._meta.get_field(field.source).attname
            steps.append((field.field_name, operator.attrgetter(column), None, None))
            continue
        simple = model is not None and "." not in field.source and field.source != "*" \
            and _plain_attribute(model, field.source)
        getter = operator.attrgetter(field.source) if simple else None
        factory = _CONVERTERS.get(type(field))
        convert = factory(field) if factory else field.to_representation
        steps.append((field.field_name, getter, convert, field))
    return steps


class FastRepresentationMixin:
    # Mix into a (Model)Serializer whose output fields need no request context; writes and input
    # validation are untouched. (A comment, not a docstring: drf-spectacular would publish it as the
    # description of every serializer that has none of its own.)

    _fast_steps: dict[type, list] = {}

    @classmethod
    def _steps(cls) -> list[tuple]:
        steps = FastRepresentationMixin._fast_steps.get(cls)
        if steps is None:
            steps = FastRepresentationMixin._fast_steps[cls] = _compile(cls())
        return steps

    def to_representation(self, instance):
        if isinstance(instance, Mapping):  # DRF's dict lookups: rare here, keep its semantics
            return super().to_representation(instance)
        tz = timezone.get_current_timezone() if settings.USE_TZ else None
        out = {}
        for name, getter, convert, field in self._steps():
            if getter is not None:
                value = getter(instance)
            else:  # DRF's own lookup: dotted sources, callables, defaults, SkipField
                try:
                    value = field.get_attribute(instance)
                except drf_fields.SkipField:
                    continue
            if value is None or (type(value) is relations.PKOnlyObject and value.pk is None):
                out[name] = None
            elif convert is None:
                out[name] = value
            elif getattr(convert, "needs_tz", False):
                out[name] = convert(value, tz)
            else:
                out[name] = convert(value)
        return out


def read_columns(model, names) -> list[str]:
    """The attnames (`team_id`, not `team`) of `model`'s concrete fields among `names`."""
    return [f.attname for f in model._meta.concrete_fields if f.name in names or f.attname in names]


def light_instances(model, rows, *, db: str = "default", related: dict | None = None) -> list:
    """Model instances from `.values(*attnames, "<fk>__<field>", ...)` rows, without Model.__init__.

    `QuerySet.only()` makes Django build each instance through a per-field membership test (quadratic
    in the column count: ~0.8 ms for a 50-run page) and __init__ (~1 ms more). The rows here already
    hold converted values, so the instances get them directly. They behave like `only()` instances: a
    column not loaded is fetched on access (a query: the views' query-count tests catch it), and no
    pre_init/post_init signal is sent (the project connects none). `related` maps a forward FK name to
    its model: `{"model": DLModel}` turns the `model__name` keys into a cached related instance.
    """
    from django.db.models.base import ModelState

    related = related or {}
    prefixes = {name: (rel_model, name + "__", model._meta.get_field(name).attname)
                for name, rel_model in related.items()}
    out = []
    for row in rows:
        obj = model.__new__(model)
        state = obj._state = ModelState()
        state.adding, state.db = False, db
        if prefixes:
            own = {}
            rel_values = {name: {} for name in prefixes}
            for key, value in row.items():
                head, sep, tail = key.partition("__")
                if sep and head in rel_values:
                    rel_values[head][tail] = value
                else:
                    own[key] = value
            obj.__dict__.update(own)
            for name, (rel_model, _, attname) in prefixes.items():
                values = rel_values[name]
                if own.get(attname) is None:
                    state.fields_cache[name] = None
                    continue
                values.setdefault(rel_model._meta.pk.attname, own[attname])
                state.fields_cache[name] = light_instances(rel_model, [values], db=db)[0]
        else:
            obj.__dict__.update(row)
        out.append(obj)
    return out


class QuickFilterBackend(DjangoFilterBackend):
    """django-filter, skipped when the request carries no filter parameter; first, any query parameter the
    endpoint does not read is refused (core.api.strict.check_query_params).

    Building and validating a bound FilterSet form costs ~0.5 ms a request; with none of its
    parameters present it filters nothing, so the queryset is returned as is. Views with
    `filterset_fields` get a filter set built on VisibleRowsFilterSet (ids of rows one cannot see filter
    to nothing, like ids that do not exist).
    """

    filterset_base = VisibleRowsFilterSet

    def filter_queryset(self, request, queryset, view):
        params = request.query_params
        check_query_params(request, view)  # an unknown parameter is a 400 (core/api/strict.py), never ignored
        if not params or all(name in _NON_FILTER_PARAMS and not self._is_filter(view, name) for name in params):
            return queryset
        return super().filter_queryset(request, queryset, view)

    @staticmethod
    def _is_filter(view, name: str) -> bool:
        filterset_class = getattr(view, "filterset_class", None)
        if filterset_class is not None:
            return name in filterset_class.base_filters
        return name in (getattr(view, "filterset_fields", None) or ())



class RowListMixin:
    """ListModelMixin.list with the page read as `.values()` rows into light instances (see
    light_instances): a third to a half less CPU than building `only()` instances. Set `list_model`,
    `list_values` (attnames plus "<fk>__<field>" keys) and `list_related` ({fk name: model})."""

    list_model = None
    list_values: list[str] = []
    list_related: dict = {}

    def list(self, request, *args, **kwargs):
        queryset = self.filter_queryset(self.get_queryset())
        rows = queryset.values(*self.list_values)
        page = self.paginate_queryset(rows)
        objs = light_instances(self.list_model, rows if page is None else page, db=queryset.db,
                               related=self.list_related)
        data = self.get_serializer(objs, many=True).data
        return self.get_paginated_response(data) if page is not None else Response(data)


# --- conditional GET ---------------------------------------------------------------------------------------
# A poll of an unchanged object is answered 304 from one indexed read of its version, before any serializer,
# selector or Plotly work. Bump RENDER_REVISION when the JSON a version renders to changes shape (a deploy),
# so browsers holding an old ETag are not told "unchanged".
RENDER_REVISION = "1"


def version_etag(kind: str, pk: int, version, query: str = "") -> str:
    """A strong ETag of one object's `version` for one endpoint and query string."""
    digest = hashlib.blake2b(f"{RENDER_REVISION}|{kind}|{pk}|{version}|{query}".encode(), digest_size=12)
    return f'"{digest.hexdigest()}"'


def _etags(header: str) -> list[str]:
    # GZip middleware weakens ETags (W/"..."): compare the opaque part.
    return [t.strip().removeprefix("W/") for t in header.split(",") if t.strip()]


def not_modified(request, etag: str, last_modified: dt.datetime | None):
    """An HttpResponseNotModified when the client's If-None-Match (else If-Modified-Since) still holds."""
    meta = getattr(request, "META", {})
    inm = meta.get("HTTP_IF_NONE_MATCH")
    if inm is not None:
        fresh = "*" in _etags(inm) or etag in _etags(inm)
    else:
        since = parse_http_date_safe(meta.get("HTTP_IF_MODIFIED_SINCE") or "")
        fresh = since is not None and last_modified is not None and int(last_modified.timestamp()) <= since
    if not fresh:
        return None
    return with_validators(HttpResponseNotModified(), etag, last_modified)


def with_validators(response, etag: str, last_modified: dt.datetime | None):
    """ETag, Last-Modified and `private, no-cache` (revalidate every time; never in a shared cache)."""
    response["ETag"] = etag
    if last_modified is not None:
        response["Last-Modified"] = http_date(last_modified.timestamp())
    response["Cache-Control"] = "private, no-cache"
    return response
