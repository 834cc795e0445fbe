"""Reading and extracting tar archives that may be hostile (a file another team's run could have written).

:func:`read_tar_members` returns the members' bytes in memory: nothing is extracted to disk, so no member
name, link or device can reach the file system. Every member is checked first (a regular file, a relative
name without ``..``, from an allow-list, each and all together under a size bound): one bad member refuses
the whole archive. (Should the platform ever need members on disk, extract with
``tar.extractall(dest, members=checked, filter="data")`` after the same check.)

Refusals raise :class:`ArchiveError` (a ``ValueError``) naming the member and why.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterable

__all__ = ["ArchiveError", "check_member", "read_tar_members"]


class ArchiveError(ValueError):
    """An archive refused: not a tar, a member that is not a plain relative file, too large, unexpected."""


def check_member(member: tarfile.TarInfo, *, max_member_bytes: int) -> None:
    """A member the platform accepts: a regular file whose name is relative, without ``..``, and no larger
    than ``max_member_bytes``. Links (symbolic or hard), devices, FIFOs and directories are refused."""
    name = member.name
    if not member.isreg():
        raise ArchiveError(
            f"archive member {name!r} is not a regular file (links, devices and directories are refused)"
        )
    if not name or name.startswith(("/", "\\")) or os.path.isabs(name) or (len(name) > 1 and name[1] == ":"):
        raise ArchiveError(f"archive member {name!r} has an absolute path")
    if ".." in name.replace("\\", "/").split("/"):
        raise ArchiveError(f"archive member {name!r} climbs out of the archive ('..')")
    if "\0" in name:
        raise ArchiveError(f"archive member {name!r} has a NUL in its name")
    if member.size < 0 or member.size > max_member_bytes:
        raise ArchiveError(f"archive member {name!r} is {member.size} bytes, more than {max_member_bytes}")


def _open(path: str | os.PathLike, max_archive_bytes: int) -> tarfile.TarFile:
    size = os.path.getsize(path)
    if size > max_archive_bytes:
        raise ArchiveError(f"the archive is {size} bytes, more than {max_archive_bytes}")
    try:
        # "r:" only: no decompression, so the bytes read are bounded by the file's size
        return tarfile.open(path, "r:")
    except tarfile.TarError as exc:
        raise ArchiveError(f"not an uncompressed tar archive ({exc})") from None


def _checked_members(
    tf: tarfile.TarFile, allowed: Iterable[str] | None, max_member_bytes: int, max_total_bytes: int
) -> list[tarfile.TarInfo]:
    allowed = set(allowed) if allowed is not None else None
    seen: set[str] = set()
    total = 0
    try:
        members = tf.getmembers()
    except tarfile.TarError as exc:
        raise ArchiveError(f"a damaged tar archive ({exc})") from None
    for m in members:
        check_member(m, max_member_bytes=max_member_bytes)
        if allowed is not None and m.name not in allowed:
            raise ArchiveError(f"unexpected archive member {m.name!r} (expected: {', '.join(sorted(allowed))})")
        if m.name in seen:
            raise ArchiveError(f"archive member {m.name!r} appears twice")
        seen.add(m.name)
        total += m.size
        if total > max_total_bytes:
            raise ArchiveError(f"the archive's members add up to more than {max_total_bytes} bytes")
    return members


def read_tar_members(
    path: str | os.PathLike,
    *,
    allowed: Iterable[str] | None,
    max_member_bytes: int,
    max_total_bytes: int,
    max_archive_bytes: int | None = None,
) -> dict[str, bytes]:
    """The members of the uncompressed tar at ``path`` as ``{name: bytes}``, read in memory (nothing is
    written to disk). Every member is checked first (:func:`check_member`, names in ``allowed`` when given,
    no duplicates, the sum under ``max_total_bytes``): one bad member refuses the whole archive."""
    with _open(path, max_archive_bytes or max_total_bytes + 1024 * 1024) as tf:
        members = _checked_members(tf, allowed, max_member_bytes, max_total_bytes)
        out = {}
        for m in members:
            stream = tf.extractfile(m)
            data = stream.read(m.size + 1) if stream is not None else b""
            if len(data) != m.size:
                raise ArchiveError(f"archive member {m.name!r} is truncated")
            out[m.name] = data
        return out
