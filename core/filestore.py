"""A row and the file it owns are saved together and deleted together: on any failure neither is left
behind, and a file goes only once the deletion of its row has committed."""
from __future__ import annotations

import logging
from collections.abc import Callable

from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import IntegrityError, models, transaction

from .exceptions import ConflictError

log = logging.getLogger(__name__)


def save_with_file(instance: models.Model, field: str, filename: str, data: bytes, *, conflict: str,
                   still_used: Callable[[str], bool] = lambda name: False) -> models.Model:
    """Store ``data`` in ``instance.<field>`` under ``filename`` and save the row, atomically. A unique
    constraint hit is a ConflictError(``conflict``) on the ``name`` field. ``still_used(name)`` says whether
    another row shares the stored file (content-addressed names), so a failure must keep it."""
    stored = None
    try:
        with transaction.atomic():
            getattr(instance, field).save(filename, ContentFile(data), save=False)
            stored = getattr(instance, field).name
            instance.save()
    except IntegrityError:
        delete_stored(stored, still_used=still_used)
        raise ConflictError(conflict, field="name") from None
    except BaseException:
        delete_stored(stored, still_used=still_used)
        raise
    return instance


def delete_stored(name: str | None, *, still_used: Callable[[str], bool] = lambda name: False) -> None:
    """Best-effort removal of a stored file (a leftover is logged, never raised)."""
    if not name or still_used(name):
        return
    try:
        default_storage.delete(name)
    except OSError:  # pragma: no cover - best effort cleanup
        log.warning("could not delete stored file %s", name)


def delete_stored_on_commit(name: str | None, *, still_used: Callable[[str], bool] = lambda name: False) -> None:
    transaction.on_commit(lambda: delete_stored(name, still_used=still_used))
