"""The engine lives and dies with whoever started it, and one engine at a time owns a work dir.

Stdlib only: the engine's children import this before anything else runs.

* :func:`die_with_parent` - a child (the isolated engine, a builder or measurement worker) ends within
  about a second when the process that started it dies: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` where the
  creating thread outlives the child, plus a watchdog thread that notices the parent pid change (a
  credential change clears the death signal; the watchdog does not depend on it). Before it exits, the
  watchdog kills the process group the child leads, so a compiler it started goes too; where the death
  signal kills the child first, a guard process in its group (``sh``, waiting on a pipe only the child
  holds) kills the group when that pipe closes.
* :func:`lock_work_dir` - an ``flock`` on ``<work_dir>/.engine.lock``, held for the engine's life. The
  kernel drops it the moment its holder dies, so a stale lock needs no breaking: a second engine waits a
  bounded time for a dying one and refuses to start next to a live one (:class:`WorkDirBusy`).
  :func:`take_lock` is the same lock for any file (config/celery.py: one celery beat at a time).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import signal
import subprocess
import threading
import time

__all__ = ["LOCK_NAME", "PARENT_ENV", "LockHeld", "WorkDirBusy", "die_with_parent", "lock_work_dir", "take_lock"]

PARENT_ENV = "DLOPT_ENGINE_PARENT_PID"  # the pid a child must outlive no longer than a second
LOCK_NAME = ".engine.lock"
PR_SET_PDEATHSIG = 1
WATCH_EVERY_S = 0.5


class WorkDirBusy(RuntimeError):
    """Another live engine holds the work dir: two engines must never write one TVM database."""


def _set_parent_death_signal() -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def _orphaned(parent: int) -> None:
    with contextlib.suppress(OSError):
        if os.getpgid(0) == os.getpid():  # it leads its group: take what it started along
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            os.killpg(0, signal.SIGKILL)
    os._exit(70)


_guard: subprocess.Popen | None = None  # kept referenced: its pipe must stay open while this process lives


def _guard_group() -> None:
    """A ``sh`` in this process group that kills the group (``kill 0``) once its stdin reaches EOF, i.e.
    when this process has ended however it ended (the death signal's SIGKILL included)."""
    global _guard
    with contextlib.suppress(OSError):
        _guard = subprocess.Popen(
            ["/bin/sh", "-c", "read _ignored; kill -KILL 0"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )


def die_with_parent(*, death_signal: bool = True, parent: int | None = None) -> int:
    """Arrange for this process to end when its parent does; returns the parent pid watched.

    ``death_signal``: also ask the kernel (``PR_SET_PDEATHSIG``), which fires when the *thread* that
    started this process ends: only for children whose creator waits for them in that thread."""
    expected = os.environ.pop(PARENT_ENV, "")  # for this process only, not for what it starts
    if parent is None:
        parent = int(expected) if expected.isdigit() else os.getppid()
    if death_signal and _set_parent_death_signal() and os.getpgid(0) == os.getpid():
        _guard_group()
    if os.getppid() != parent:  # died before the death signal was armed
        _orphaned(parent)

    def watch() -> None:
        while True:
            time.sleep(WATCH_EVERY_S)
            if os.getppid() != parent:
                _orphaned(parent)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()
    return parent


class LockHeld(RuntimeError):
    """The lock file is held by another live process."""


def take_lock(path: str, *, wait_s: float | None, poll_s: float = 0.2, on_wait=None) -> int:
    """An exclusive ``flock`` on ``path`` (created), waiting up to ``wait_s`` (None: for as long as it
    takes); returns the open descriptor that holds it (close it to release), the holder's pid written in
    the file. :class:`LockHeld` when the wait ran out. ``on_wait(holder)`` is called once if it waits."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        deadline = None if wait_s is None else time.monotonic() + max(0.0, wait_s)
        waited = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                if deadline is not None and time.monotonic() >= deadline:
                    raise LockHeld(_holder(fd)) from None
                if not waited and on_wait is not None:
                    on_wait(_holder(fd))
                waited = True
                time.sleep(poll_s)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        return fd
    except BaseException:
        os.close(fd)
        raise


@contextlib.contextmanager
def lock_work_dir(work_dir: str, *, wait_s: float = 30.0, poll_s: float = 0.2):
    """Hold ``work_dir``'s engine lock for the ``with`` block; :class:`WorkDirBusy` when another process
    still holds it after ``wait_s`` (a dying engine releases it within a second or two)."""
    os.makedirs(work_dir, exist_ok=True)
    path = os.path.join(work_dir, LOCK_NAME)
    try:
        fd = take_lock(path, wait_s=wait_s, poll_s=poll_s)
    except LockHeld as exc:
        raise WorkDirBusy(
            f"another engine is still working in this run's directory (holder: {exc}); not starting a second one"
        ) from None
    try:
        yield path
    finally:
        os.close(fd)  # releases the lock (the file stays: deleting it would race a waiting engine)


def _holder(fd: int) -> str:
    with contextlib.suppress(OSError):
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        if text:
            return f"pid {text}"
    return "unknown"
