"""Text stored in a CharField is cut to that field's own ``max_length``, never to a number repeated
at the call site."""
from __future__ import annotations

from django.db import models


def fit_to_field(model: type[models.Model], field_name: str, text: str | None) -> str:
    limit = model._meta.get_field(field_name).max_length
    text = "" if text is None else str(text)
    return text if limit is None else text[:limit]
