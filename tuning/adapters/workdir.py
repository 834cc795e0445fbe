"""A run's files on disk (TVM's JSON tuning database, the tuned module) and the text users may see of
them: error messages and summaries never show an absolute server path."""
from __future__ import annotations

import io
import os
import re
import shutil
import sys
import sysconfig
import zipfile
from pathlib import Path

from django.conf import settings


def run_files_dir(run_id: int) -> Path:
    return Path(settings.MEDIA_ROOT) / "runs" / str(run_id)


def run_work_dir(run_id: int) -> Path:
    path = run_files_dir(run_id) / "work"
    path.mkdir(parents=True, exist_ok=True)
    return path


def delete_run_files(run_id: int) -> None:
    shutil.rmtree(run_files_dir(run_id), ignore_errors=True)


def zip_database(work_dir: Path) -> bytes:
    """TVM's JSON database files of the run, zipped (the run's records download)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(work_dir.rglob("database_*.json")):
            zf.write(path, path.relative_to(work_dir).as_posix())
    return buf.getvalue()


_ABS_PATH = re.compile(r"(?<![\w.:/<>-])/(?:[\w.@+~-]+/)+([\w.@+~-]*)")


def _path_prefixes(work_dir: Path | None) -> list[tuple[str, str]]:
    """(absolute prefix, what users see instead), longest first, each with its symlink-free twin."""
    pairs = [(work_dir, ".")] if work_dir is not None else []
    pairs += [(Path(settings.MEDIA_ROOT), "<media>"), (Path(settings.VAR_DIR), "<var>"),
              (Path(settings.BASE_DIR), "<app>")]
    for key in ("purelib", "platlib", "stdlib", "platstdlib"):
        pairs.append((Path(sysconfig.get_paths()[key]), "<python>"))
    pairs += [(Path(sys.prefix), "<python>"), (Path(sys.base_prefix), "<python>")]
    out = {}
    for path, label in pairs:
        for variant in {str(path), os.path.realpath(path)}:
            if variant and variant != "/":
                out.setdefault(variant.rstrip("/"), label)
    return sorted(out.items(), key=lambda kv: -len(kv[0]))


def public_text(text: str, work_dir: Path | None = None) -> str:
    """`text` (an error, a traceback) as users may see it: no absolute server path. Paths under the run's
    work dir become relative to it (`./database_workload.json`), the media/var/project dirs and the
    Python installation become `<media>/`, `<var>/`, `<app>/`, `<python>/`, and any other absolute path
    keeps only its file name (`<path>/name`)."""
    if not text:
        return text
    for prefix, label in _path_prefixes(work_dir):
        text = text.replace(prefix + "/", label + "/").replace(prefix, label)
    return _ABS_PATH.sub(lambda m: "<path>/" + m.group(1), text)


def public_json(value, work_dir: Path | None = None):
    """`public_text` applied to every string of a JSON value (a run summary)."""
    if isinstance(value, str):
        return public_text(value, work_dir)
    if isinstance(value, list):
        return [public_json(v, work_dir) for v in value]
    if isinstance(value, dict):
        return {k: public_json(v, work_dir) for k, v in value.items()}
    return value
