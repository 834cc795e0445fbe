"""Temp files of uploads in progress (Django's FILE_UPLOAD_TEMP_DIR, under var/): removing the ones a
killed request left behind.

Django removes an upload's temp file when the request ends (TemporaryUploadedFile is deleted on close);
a web worker killed mid-request (a timeout, OOM, a restart) never gets there, and each such file stays.
A file counts as stale when it has not been written for UPLOAD_TEMP_MAX_AGE_S: an upload still arriving
keeps touching its file, so it is never taken for a leftover. Run at web start (``manage.py
clean_upload_temp`` in docker-compose.yml and scripts/run.sh) and by celery beat (``core.clean_upload_temp``).
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from django.conf import settings

log = logging.getLogger(__name__)

# What Django names them: tempfile.NamedTemporaryFile(suffix=".upload" + ext) -> "tmpXXXXXXXX.upload.onnx".
_PREFIX, _MARK = "tmp", ".upload"


def upload_temp_dir() -> Path:
    return Path(settings.FILE_UPLOAD_TEMP_DIR)


def remove_stale_upload_files(*, max_age_s: float | None = None, now: float | None = None) -> list[str]:
    """Delete the upload temp files not written for ``max_age_s`` (default UPLOAD_TEMP_MAX_AGE_S); return
    their names. Only regular files named like Django's upload temp files are touched (never a directory,
    never through a symlink), and only directly in the temp directory."""
    max_age_s = settings.UPLOAD_TEMP_MAX_AGE_S if max_age_s is None else max_age_s
    now = time.time() if now is None else now
    directory = upload_temp_dir()
    removed: list[str] = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return removed
    for entry in entries:
        if not (entry.name.startswith(_PREFIX) and _MARK in entry.name) or not entry.is_file(follow_symlinks=False):
            continue
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime < max_age_s:
                continue
            os.unlink(entry.path)
        except FileNotFoundError:  # its request finished meanwhile and removed it
            continue
        except OSError as exc:
            log.warning("could not remove stale upload temp file %s: %s", entry.path, exc)
            continue
        removed.append(entry.name)
    if removed:
        log.info("removed %d stale upload temp file(s) from %s", len(removed), directory)
    return removed
