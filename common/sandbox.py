"""Run one parser of untrusted bytes (an ONNX upload, a cluster trace) in a short-lived child process.

A hostile upload can make a parser take gigabytes of memory or minutes of CPU from a few hundred bytes
(a model whose constants TVM folds into a 3 GB tensor, gzip inside gzip). None of that may happen in a
web or Celery worker process, so :func:`run_in_child` runs the parser in a fresh interpreter
(``python -m common._sandbox_child``, started with ``subprocess``, never a fork of the caller) that

- has an environment made from an allow-list (:data:`ENV_ALLOW`, :data:`ENV_ALLOW_PREFIXES`): no
  database URL, secret key, broker or cloud credentials reach it; a private, fresh working directory
  (also its ``HOME`` and ``TMPDIR``), removed afterwards; one thread for OpenMP and TVM;
- sets its resource limits before it reads a byte of the input: address space (``RLIMIT_AS``), CPU
  seconds (``RLIMIT_CPU``), file size, no core dumps; the parent adds a wall-clock limit and kills the
  child's whole process group when it passes;
- dies with its parent (``PR_SET_PDEATHSIG``): a web worker killed by gunicorn takes its parser along;
- answers with JSON only, at most ``max_answer_bytes``, on its original stdout (anything the parser
  prints goes to stderr): the parent never unpickles what a child that parsed hostile bytes sent.

The input bytes travel over the child's stdin after a one-line JSON request, so nothing is written to
disk. ``preexec`` is where privilege dropping plugs in: a callable runs as Popen's ``preexec_fn`` (in
the forked child before ``exec``), a ``"module:function"`` string is called in the child right after
its limits are set and before the input is read.

A caller that watches the child while it runs (a GPU job: NVML samples of the child's pid, a cancel
request read from the database) passes ``on_start`` (called with the child's pid) and ``poll`` (called
about once a second; True kills the child's process group and raises ``SandboxFailure("stopped")``).

Django-free: the limits are passed in; the platform takes them from settings (``UPLOAD_SANDBOX_*``).
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import privileges
from .jsonsafe import loads_finite

__all__ = ["ENV_ALLOW", "ENV_ALLOW_PREFIXES", "SandboxFailure", "child_env", "run_in_child"]

#: Variables a parser child may see (interpreter, locale, TVM and thread knobs); everything else is dropped.
ENV_ALLOW = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH", "PYTHONHASHSEED", "VIRTUAL_ENV"})
ENV_ALLOW_PREFIXES = ("LC_", "TVM_")
#: Set in every child: one thread each (thread pools reserve address space and add to the CPU time).
CHILD_FIXED_ENV = {
    "OMP_NUM_THREADS": "1",
    "TVM_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONNOUSERSITE": "1",
}
CHILD_MODULE = "common._sandbox_child"
DEFAULT_MAX_ANSWER_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024  # RLIMIT_FSIZE: a parser writes no large files
_STDERR_TAIL = 8192
_ROOT = str(Path(__file__).resolve().parents[1])

#: Words in a child's error or stderr that mean an allocation failed under its address-space limit.
_MEMORY_WORDS = ("MemoryError", "bad_alloc", "Cannot allocate memory", "out of memory", "Unable to allocate")


class SandboxFailure(RuntimeError):
    """The child gave no answer: ``reason`` is ``"memory"`` (its address-space limit), ``"cpu_time"``,
    ``"wall_clock"``, ``"stopped"`` (the caller's ``poll`` asked), ``"crashed"`` (a signal or an exit without an answer), ``"raised"`` (the parser raised
    an exception it was not written to report: ``error_type`` names it) or ``"bad_answer"`` (not JSON, or
    too large). ``str()`` is a sentence for people; ``stderr_tail`` is for the log."""

    def __init__(
        self,
        reason: str,
        message: str,
        *,
        error_type: str = "",
        stderr_tail: str = "",
        returncode: int | None = None,
        error_message: str = "",
    ):
        super().__init__(message)
        self.reason, self.message, self.error_type = reason, message, error_type
        self.error_message = error_message  # the exception text the child reported, when it raised one
        self.stderr_tail, self.returncode = stderr_tail, returncode


def child_env(private_dir: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment: the allow-listed part of this process's, this project on PYTHONPATH,
    HOME and TMPDIR the private directory, one thread per pool."""
    env = {k: v for k, v in os.environ.items() if k in ENV_ALLOW or k.startswith(ENV_ALLOW_PREFIXES)}
    env["PYTHONPATH"] = _ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(CHILD_FIXED_ENV)
    env["HOME"] = env["TMPDIR"] = private_dir
    env.update(extra or {})
    return env


def _target_name(target: str | Callable[..., Any]) -> str:
    if isinstance(target, str):
        if ":" not in target:
            raise ValueError(f"target {target!r} is not 'module:function'")
        return target
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:
        raise ValueError(f"{target!r} is not a module-level function a fresh interpreter can import")
    return f"{module}:{qualname}"


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


# The hook that makes the child the sandbox account (common.privileges): it is handed its private folder.
PRIVILEGE_DROP_HOOK = "common.privileges:drop_privileges"


def run_in_child(
    target: str | Callable[..., Any],
    args: tuple | list = (),
    kwargs: dict[str, Any] | None = None,
    *,
    memory_mb: int,
    cpu_s: int,
    wall_s: float,
    data: bytes | None = None,
    preexec: str | Callable[[], None] | None = None,
    what: str = "parsing the upload",
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    env: dict[str, str] | None = None,
    nofile: int | None = None,
    on_start: Callable[[int], None] | None = None,
    poll: Callable[[], bool] | None = None,
) -> Any:
    """``target(*args, **kwargs)`` (plus ``data=<bytes>`` when ``data`` is given) in a limited child;
    returns what it returned (which must be JSON-serialisable: a JSON value is all that comes back).

    ``target`` is ``"package.module:function"`` or a module-level function. ``memory_mb`` caps the
    child's address space (0: no cap), ``cpu_s`` its CPU seconds, ``wall_s`` its life. ``what`` ends the
    failure messages ("... while parsing the upload"). ``nofile`` caps its open files (``RLIMIT_NOFILE``).
    ``on_start(pid)`` and ``poll()`` (see the module's docstring) run in this process. Raises
    :class:`SandboxFailure` when no answer came.
    """
    request = (
        json.dumps(
            {
                "target": _target_name(target),
                "args": list(args),
                "kwargs": dict(kwargs or {}),
                "data": data is not None,
                "parent": os.getpid(),
                "hook": preexec if isinstance(preexec, str) else None,
            }
        ).encode()
        + b"\n"
    )
    limits = json.dumps(
        {
            "as_bytes": int(memory_mb) * 1024 * 1024 if memory_mb and memory_mb > 0 else None,
            "cpu_s": max(1, int(cpu_s)),
            "fsize": DEFAULT_MAX_FILE_BYTES,
            "nofile": int(nofile) if nofile else None,
        }
    )
    private_dir = tempfile.mkdtemp(prefix="dlopt-upload-")
    try:
        if preexec == PRIVILEGE_DROP_HOOK:
            privileges.hand_over(private_dir)  # its HOME and TMPDIR, the one folder the dropped child may write
        proc = subprocess.Popen(
            # -P: not the working directory first on sys.path (as -m puts it): it is the sandbox account's
            # to write, and a module left there would shadow the standard library in a later child
            [sys.executable, "-s", "-P", "-m", CHILD_MODULE, limits],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=private_dir,
            env=child_env(private_dir, env),
            close_fds=True,
            start_new_session=True,
            preexec_fn=preexec if callable(preexec) else None,
        )
        if on_start is not None:
            try:
                on_start(proc.pid)
            except BaseException:
                _kill_group(proc)
                proc.wait()
                raise
        answer, stderr_tail, timed_out, stopped = _exchange(
            proc, request, data, wall_s=wall_s, max_answer=max_answer_bytes, poll=poll
        )
    finally:
        shutil.rmtree(private_dir, ignore_errors=True)
    if stopped:
        raise SandboxFailure(
            "stopped", f"stopped on request while {what}", stderr_tail=stderr_tail, returncode=proc.returncode
        )
    return _verdict(
        proc.returncode,
        answer,
        stderr_tail,
        timed_out,
        memory_mb=memory_mb,
        cpu_s=cpu_s,
        wall_s=wall_s,
        what=what,
        max_answer=max_answer_bytes,
    )


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child leads its own session: take anything it started too
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except ProcessLookupError:
            pass


def _feed(stream, request: bytes, data: bytes | None) -> None:
    """Writer thread: the request line, then the input bytes; a child that died early is not an error here."""
    try:
        stream.write(request)
        if data is not None:
            view = memoryview(data)
            for start in range(0, len(view), 1 << 20):
                stream.write(view[start : start + (1 << 20)])
        stream.close()
    except (BrokenPipeError, OSError, ValueError):
        pass


POLL_EVERY_S = 1.0


def _exchange(
    proc: subprocess.Popen,
    request: bytes,
    data: bytes | None,
    *,
    wall_s: float,
    max_answer: int,
    poll: Callable[[], bool] | None = None,
) -> tuple[bytes | None, str, bool, bool]:
    """Feed stdin, collect stdout (bounded: None when over ``max_answer``) and stderr's tail until the child
    exits, ``wall_s`` passes or ``poll`` says stop (then its process group is killed). Returns (answer,
    stderr tail, timed out, stopped)."""
    if proc.stdin is None or proc.stdout is None or proc.stderr is None:
        raise ValueError("the child needs stdin, stdout and stderr as pipes")
    deadline = time.monotonic() + wall_s
    stopped, polled = False, time.monotonic()
    writer = threading.Thread(target=_feed, args=(proc.stdin, request, data), daemon=True)
    writer.start()
    answer, tail, too_big, timed_out = bytearray(), bytearray(), False, False
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    sel.register(proc.stderr, selectors.EVENT_READ, "err")
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if poll is not None and time.monotonic() - polled >= POLL_EVERY_S:
                polled = time.monotonic()
                if poll():
                    stopped = True
                    break
            for key, _ in sel.select(timeout=min(left, 1.0)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                elif key.data == "out":
                    if len(answer) + len(chunk) > max_answer:
                        too_big = True
                        _kill_group(proc)
                    else:
                        answer += chunk
                else:
                    tail = (tail + chunk)[-_STDERR_TAIL:]
        if not timed_out and not stopped:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        sel.close()
        if timed_out or stopped or proc.poll() is None:
            _kill_group(proc)
        proc.wait()
        writer.join(timeout=5)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            try:
                if stream is not None:
                    stream.close()
            except (OSError, ValueError):
                pass
    return (None if too_big else bytes(answer)), tail.decode("utf-8", "replace"), timed_out, stopped


def _verdict(
    code: int | None,
    answer: bytes | None,
    stderr_tail: str,
    timed_out: bool,
    *,
    memory_mb: int,
    cpu_s: int,
    wall_s: float,
    what: str,
    max_answer: int,
) -> Any:
    def fail(reason: str, message: str, error_type: str = "", error_message: str = "") -> SandboxFailure:
        return SandboxFailure(
            reason,
            message,
            error_type=error_type,
            stderr_tail=stderr_tail,
            returncode=code,
            error_message=error_message,
        )

    memory = f"{memory_mb} MB of memory" if memory_mb and memory_mb > 0 else "more memory than the machine has"
    if timed_out:
        raise fail("wall_clock", f"stopped after {wall_s:g} s (the wall-clock limit) while {what}")
    if answer is None:
        raise fail("bad_answer", f"the parser's answer was larger than {max_answer:,} bytes while {what}")
    parsed = None
    if answer:
        try:
            # the child writes its answer with allow_nan=False: a NaN or Infinity here was not its runtime's
            # and would fail every JSONField (PostgreSQL's jsonb refuses them) the answer is stored in
            parsed = loads_finite(answer)
        except (ValueError, RecursionError):
            raise fail("bad_answer", f"the parser sent an answer that is not JSON while {what}") from None
    if isinstance(parsed, dict) and "error" in parsed and isinstance(parsed["error"], dict):
        err = parsed["error"]
        error_type, text = str(err.get("type", "")), str(err.get("message", ""))[:600]
        if error_type.endswith("MemoryError") or any(w in text for w in _MEMORY_WORDS):
            raise fail("memory", f"ran out of memory (the limit is {memory}) while {what}", error_type, text)
        raise fail("raised", f"{error_type}: {text} (while {what})", error_type, text)
    if isinstance(parsed, dict) and "result" in parsed and code == 0:
        return parsed["result"]
    if code == -signal.SIGXCPU:
        raise fail("cpu_time", f"used up its {cpu_s} s of CPU time (the limit) while {what}")
    if code == -signal.SIGKILL:  # past the hard CPU limit (a child that ignored SIGXCPU), or the kernel's OOM killer
        raise fail(
            "crashed",
            f"was killed (SIGKILL: its {cpu_s} s CPU-time limit, or the machine ran out of memory) while {what}",
        )
    if any(w in stderr_tail for w in _MEMORY_WORDS):
        raise fail("memory", f"ran out of memory (the limit is {memory}) while {what}")
    if code is not None and code < 0:
        hint = f"; possibly at its limit of {memory}" if memory_mb and memory_mb > 0 else ""
        raise fail("crashed", f"crashed ({_signal_name(code)}{hint}) while {what}")
    raise fail("crashed", f"exited (code {code}) without an answer while {what}")
