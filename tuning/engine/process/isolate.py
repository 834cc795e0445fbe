"""Run one engine call (tuning, compile-and-compare, reading TVM's database) in a short-lived child process.

A user model can crash TVM itself (an out-of-bounds Gather segfaults the compiled model; a hostile graph
can crash a pass). The caller, a Celery worker serving many runs, must survive it: the call runs in a
fresh interpreter (``_isolated_child.py``, started with Popen, never forked), and a child that dies
is reported as :class:`EngineCrashed` naming the signal and what it was doing.

The engine's sink stays in the caller (it writes the platform database): the child gets a proxy whose
calls travel back over the pipe and are answered by the real sink, one at a time.
Messages are 8-byte big-endian length + pickle, as in :mod:`.procpool`.

The child lives and dies with its caller: it leads its own process group, which the caller kills when
the call ends however it ends, and it ends itself when the caller dies (:mod:`.lifeline`). An
:class:`Abort` the caller triggers (its lease was lost, its sink cannot report) kills the child at once:
the call raises :class:`EngineStopped`.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common.privileges import (
    UnreachableFolder,
    hand_over,
    sandbox_requirement,
    take_back,
)
from tuning.engine.process.entry import entry_point
from tuning.engine.process.lifeline import PARENT_ENV
from tuning.engine.process.procpool import loads_from_sandbox
from tuning.engine.process.sandbox import private_dir, remove_dir, scrub_env

__all__ = ["Abort", "EngineCrashed", "EngineError", "EngineStopped", "call_isolated"]

log = logging.getLogger(__name__)
_ROOT = str(Path(__file__).resolve().parents[3])
_CHILD = str(Path(__file__).resolve().with_name("_isolated_child.py"))
SINK_METHODS = (
    "on_tasks",
    "on_measurements",
    "on_round",
    "on_serial_remeasure",
    "on_progress",
    "on_checkpoint",
    "control",
)


class EngineCrashed(RuntimeError):
    """The child died (a signal or an exit without an answer): TVM crashed on this input."""

    def __init__(self, message: str, *, returncode: int | None = None):
        super().__init__(message)
        self.returncode = returncode


class EngineStopped(RuntimeError):
    """The caller's :class:`Abort` stopped the call (the child was killed); the message says why."""


class Abort:
    """Set from any thread to stop a running :func:`call_isolated` (and refuse the next ones)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reason = ""

    def trigger(self, reason: str) -> None:
        if not self.event.is_set():
            self.reason = reason
            self.event.set()

    def is_set(self) -> bool:
        return self.event.is_set()


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group (it leads one), what it started included."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class EngineError(RuntimeError):
    """The call raised in the child; the message is its exception (type and text), the traceback is
    in ``remote_traceback``."""

    def __init__(self, message: str, remote_traceback: str = ""):
        super().__init__(message)
        self.remote_traceback = remote_traceback


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown"
        return f"signal {-code}, {name}"
    return f"exit code {code}"


def _send(stream, obj) -> None:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    data = memoryview(struct.pack(">Q", len(body)) + body)
    while data:  # an unbuffered pipe may take only part of a large message per write
        written = stream.write(data)
        data = data[written if written is not None else len(data) :]
    stream.flush()


def _read_exact(stream, n: int) -> bytes:
    """``n`` bytes, however many reads that takes (a pipe hands large messages over in pieces)."""
    chunks, left = [], n
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _recv(stream, loads=pickle.loads):
    (n,) = struct.unpack(">Q", _read_exact(stream, 8))
    return loads(_read_exact(stream, n))


def _answer_sink(sink, name: str, args: tuple, on_sink_error) -> tuple:
    try:
        return ("ok", getattr(sink, name)(*args))
    except Exception as exc:  # noqa: BLE001 - relayed to the engine, which records sink errors
        override = on_sink_error(name, exc) if on_sink_error else None
        if override is not None:
            return ("ok", override)
        return ("err", f"{type(exc).__name__}: {exc}")


def call_isolated(
    func: Callable[..., Any] | str,
    *args,
    what: str,
    sink: Any = None,
    init: Callable[..., Any] | str | None = None,
    env: dict[str, str] | None = None,
    scrub: bool = False,
    on_sink_error=None,
    sandbox_user: bool = False,
    writable: Sequence[str | os.PathLike] = (),
    abort: Abort | None = None,
    **kwargs,
):
    """Run ``func`` (a module-level function, or its "package.module:function" name) with ``args``/``kwargs`` in a fresh child process.

    ``what`` says what the call does, for the crash message ("the TVM compiler crashed (signal 11,
    SIGSEGV) while <what>"). With ``sink``, the child passes ``sink=<proxy>`` to ``func``.
    ``init`` ("module:function") runs in the child first (e.g. ``django:setup``).
    ``on_sink_error(name, exc)`` may map a sink exception to a value answered instead (e.g. "cancel").
    With ``scrub``, the child gets only the sandbox's allow-listed environment plus ``env`` (no database
    URL, secret key or broker credentials: it compiles and loads code derived from the user's model).
    With ``sandbox_user`` (needs ``scrub``), the child also drops to the sandbox account first thing
    (:func:`common.privileges.drop_privileges`), with a private HOME and TMPDIR: it may write only
    those and the folders in ``writable``, handed to it for the call and taken back afterwards.
    ``abort``: triggering it kills the child and the call raises :class:`EngineStopped`.
    """
    func = entry_point(func)
    init = entry_point(init) if init is not None else None
    if sandbox_user and not scrub:
        raise ValueError("sandbox_user needs scrub: a child with the worker's secrets keeps its user")
    if abort is not None and abort.is_set():
        raise EngineStopped(abort.reason)
    child_env = scrub_env() if scrub else dict(os.environ)
    child_env.update(env or {})
    child_env["PYTHONPATH"] = _ROOT + (os.pathsep + child_env["PYTHONPATH"] if child_env.get("PYTHONPATH") else "")
    child_env[PARENT_ENV] = str(os.getpid())
    home = private_dir() if sandbox_user else None
    given = [home, *writable] if home else []
    try:
        try:
            for path in given:
                hand_over(path)
        except UnreachableFolder as exc:  # a folder it must write is out of its reach (a 0700 parent)
            if sandbox_requirement():
                raise
            log.warning("%s: the engine child keeps this process's user while %s", exc, what)
            given, argv = given[: given.index(path)], []
        else:
            argv = ["--sandbox-user"] if sandbox_user else []
        if home:
            child_env["HOME"] = child_env["TMPDIR"] = home
        return _call(
            func,
            args,
            kwargs,
            what=what,
            sink=sink,
            init=init,
            env=child_env,
            on_sink_error=on_sink_error,
            argv=argv,
            cwd=home,
            abort=abort,
        )
    finally:
        for path in given[1:]:
            take_back(path)
        remove_dir(home)  # taken back too


def _call(
    func: str,
    args: tuple,
    kwargs: dict,
    *,
    what: str,
    sink: Any,
    init: str | None,
    env: dict[str, str],
    on_sink_error,
    argv: list[str],
    cwd: str | None,
    abort: Abort | None,
):
    proc = subprocess.Popen(
        [sys.executable, "-u", _CHILD, *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        close_fds=True,
        cwd=cwd,
        start_new_session=True,
    )
    done = threading.Event()
    if abort is not None:

        def kill_on_abort() -> None:
            while not done.is_set():
                if abort.event.wait(0.5) and not done.is_set():
                    _kill_group(proc)
                    return

        threading.Thread(target=kill_on_abort, name=f"engine-{proc.pid}-abort", daemon=True).start()
    try:
        methods = [m for m in SINK_METHODS if sink is not None and hasattr(sink, m)]
        _send(proc.stdin, (func, args, kwargs, init, methods if sink is not None else None))
        while True:
            try:  # the child runs TVM on user input and spawns the candidates' sandboxes: data only
                msg = _recv(proc.stdout, loads=loads_from_sandbox)
            except pickle.UnpicklingError as exc:
                proc.kill()
                raise EngineCrashed(f"the engine's child sent a refused answer while {what}: {exc}") from None
            except EOFError:
                code = proc.wait()
                if abort is not None and abort.is_set():
                    raise EngineStopped(abort.reason) from None
                raise EngineCrashed(
                    f"the TVM compiler crashed ({_describe_exit(code)}) while {what}", returncode=code
                ) from None
            if msg[0] == "sink":
                _send(proc.stdin, _answer_sink(sink, msg[1], msg[2], on_sink_error))
            elif msg[0] == "result":
                return msg[1]
            else:  # ("error", message, traceback)
                raise EngineError(msg[1], msg[2])
    finally:
        done.set()
        for stream in (proc.stdin, proc.stdout):
            if stream is None:  # never: both are pipes; this narrows Popen's Optional streams
                continue
            try:
                stream.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=0 if abort is not None and abort.is_set() else 30)
        except subprocess.TimeoutExpired:
            pass
        _kill_group(proc)  # the child, and whatever of its group outlived it
        proc.wait()
