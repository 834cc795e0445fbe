"""Shared API filters."""
from __future__ import annotations

import datetime as dt

import django_filters
from django import forms


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
            return parsed.astimezone(dt.timezone.utc)
        except (OverflowError, ValueError):
            raise forms.ValidationError("Date out of range.", code="invalid") from None


class UtcIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UtcIsoDateTimeField
