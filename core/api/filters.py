"""Shared API filters."""
from __future__ import annotations

import datetime as dt

import django_filters
from django import forms
from django.db import models


class UtcIsoDateTimeField(forms.DateTimeField):
    """An ISO-8601 datetime converted to UTC while parsing.

    PostgreSQL accepts UTC offsets only up to +-15:59, and an offset can push a
    date past year 1 or 9999: either must be a 400, never a database error.
    """

    def to_python(self, value):
        parsed = django_filters.fields.IsoDateTimeField().to_python(value)
        if parsed is None or parsed.tzinfo is None:
            return parsed
        try:
            return parsed.astimezone(dt.UTC)
        except (OverflowError, ValueError):
            raise forms.ValidationError("Date out of range.", code="invalid") from None


class UtcIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UtcIsoDateTimeField


class IdField(forms.IntegerField):
    """A row id: an integer in the database's bigint range (a larger one is a 400, not a database error)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("min_value", -(2**63))
        kwargs.setdefault("max_value", 2**63 - 1)
        super().__init__(*args, **kwargs)


class IdFilter(django_filters.Filter):
    field_class = IdField


class TeamRefFilter(django_filters.CharFilter):
    """`?team=` by the team's id or its slug (like every team field of the API)."""

    def filter(self, qs, value):
        if value in (None, ""):
            return qs
        value = value.strip()
        if value.isdigit():
            if int(value) > 2**63 - 1:
                return qs.none()
            return qs.filter(**{f"{self.field_name}_id": int(value)})
        return qs.filter(**{f"{self.field_name}__slug": value})


class VisibleRowsFilterSet(django_filters.FilterSet):
    """The base of every API filter set: a foreign key is filtered by its id as a plain number.

    django-filter's default (a ModelChoiceFilter over *all* rows of the target model) answers a 400 "Select
    a valid choice" for an id that does not exist and a 200 with no results for another team's row: the
    difference tells an outsider which ids exist. The viewsets' querysets already hold only what the caller
    may see, so filtering by an id the caller cannot see, or one that does not exist, is the same 200 with
    no results.
    """

    FILTER_DEFAULTS = {
        **django_filters.FilterSet.FILTER_DEFAULTS,
        models.ForeignKey: {"filter_class": IdFilter},
        models.OneToOneField: {"filter_class": IdFilter},
    }

    @classmethod
    def filter_for_field(cls, field, field_name, lookup_expr=None):
        if field_name == "team" and field.is_relation and field.related_model._meta.label == "core.Team":
            return TeamRefFilter(field_name=field_name, help_text="A team's id or slug.")
        return super().filter_for_field(field, field_name, lookup_expr)
