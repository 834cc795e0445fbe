"""Persistent worker processes started with Popen (never fork: forking after
TVM's thread pool has run hangs the child).

Each worker is a fresh interpreter running ``_procworker.py`` with its own
environment (``TVM_NUM_THREADS``, ``TVM_BIND_THREADS=0``) and CPU affinity, so
the TVM thread pool it creates later has exactly the threads and cores it was
given. Workers stay alive between calls (no re-import of TVM per batch), are
recycled after ``max_uses`` calls, and are killed and restarted on a timeout.

Workers run candidate code, so each is sandboxed (:mod:`.sandbox`): an allow-listed
environment (no secrets), its own temporary working directory, resource limits, and, where this
process may switch users, the sandbox account (:mod:`common.privileges`).
"""

from __future__ import annotations

import atexit
import builtins
import concurrent.futures
import dataclasses
import importlib
import io
import os
import pickle
import queue
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common.privileges import hand_over, sandbox_account
from tuning.engine.process import sandbox
from tuning.engine.process.entry import entry_point

__all__ = [
    "WorkerSpec",
    "WorkerProcess",
    "ProcessPool",
    "run_isolated",
    "WorkerError",
    "WorkerTimeout",
    "available_cpus",
    "unpin_current_thread",
    "loads_from_sandbox",
]

#: the lock file measure.timing_window holds while timing (a GPU's: one candidate timed at a time per GPU)
TIMING_LOCK_VAR = "DLOPT_TIMING_LOCK"
_ROOT = str(Path(__file__).resolve().parents[3])

# What a sandboxed child's answer may be made of. Candidate code runs in the child and can write
# any bytes on its pipe, and a plain pickle.loads would run any callable it names in the parent
# (next to the credentials the sandbox keeps from it): only data types and the engine's own
# dataclasses and exceptions are built, nothing else is looked up.
_SAFE_GLOBALS = {
    "builtins": {
        "dict",
        "list",
        "tuple",
        "set",
        "frozenset",
        "bytearray",
        "complex",
        "slice",
        "range",
        "str",
        "int",
        "float",
        "bool",
        "bytes",
    },
    "collections": {"OrderedDict", "deque"},
    "datetime": {"datetime", "date", "time", "timedelta", "timezone"},
    "numpy": {"dtype", "ndarray"},
    "numpy.core.multiarray": {"scalar", "_reconstruct"},
    "numpy._core.multiarray": {"scalar", "_reconstruct"},
}


class _SandboxUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if "." not in name and name in _SAFE_GLOBALS.get(module, ()):
            return getattr(importlib.import_module(module), name)
        if module == "builtins" and "." not in name:
            obj = getattr(builtins, name, None)
            if isinstance(obj, type) and issubclass(obj, BaseException):
                return obj
        if module.startswith("tuning.engine.") and "." not in name:
            obj = getattr(importlib.import_module(module), name, None)
            if isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, BaseException)):
                return obj
        raise pickle.UnpicklingError(f"a sandboxed worker's answer may not contain {module}.{name}")


def loads_from_sandbox(data: bytes):
    """``pickle.loads`` for bytes written by a sandboxed child: data and engine dataclasses only."""
    return _SandboxUnpickler(io.BytesIO(data)).load()


_WORKER_SCRIPT = str(Path(__file__).resolve().with_name("_procworker.py"))
_LIVE: weakref.WeakSet[WorkerProcess] = weakref.WeakSet()


def available_cpus() -> list[int]:
    """CPUs this process may use: the union of its threads' affinity masks.

    Not just ``sched_getaffinity(0)``: TVM's thread pool pins the calling
    thread (with one thread, or TVM_BIND_THREADS unset) to a single core, and
    that mask would otherwise be mistaken for the machine and inherited by
    every child process."""
    cpus: set[int] = set()
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                cpus |= os.sched_getaffinity(int(tid))
            except OSError:
                pass
    except (OSError, AttributeError):
        pass
    if not cpus:
        try:
            cpus = set(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover
            cpus = set(range(os.cpu_count() or 1))
    return sorted(cpus)


def unpin_current_thread() -> None:
    """Give the calling thread every CPU of the process again."""
    try:
        os.sched_setaffinity(0, set(available_cpus()))
    except (AttributeError, OSError):
        pass


class WorkerError(RuntimeError):
    """The function raised in the worker (message holds the remote traceback)."""


class WorkerTimeout(TimeoutError):
    """The call did not finish in time; the worker was killed."""


@dataclasses.dataclass
class WorkerSpec:
    name: str = "worker"
    cpu_ids: Sequence[int] | None = None
    threads: int | None = None
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    # RLIMITs set in the child before it imports anything (see sandbox.py); None: sandbox defaults
    limits: dict[str, int | None] | None = None


class WorkerProcess:
    """One persistent child process."""

    def __init__(
        self,
        spec: WorkerSpec,
        *,
        initializer: Callable[..., Any] | str | None = None,
        max_uses: int | None = None,
        start_timeout: float = 120.0,
        stderr: Any = None,
    ) -> None:
        self.spec = spec
        self.initializer = entry_point(initializer) if initializer is not None else None
        self.max_uses = max_uses
        self.start_timeout = start_timeout
        self._stderr = stderr
        self._proc: subprocess.Popen | None = None
        self._cwd: str | None = None
        self._ready = False
        self.uses = 0
        self.starts = 0
        self.lock = threading.Lock()
        self.init_error: str | None = None
        _LIVE.add(self)

    # ------------------------------------------------------------------ lifecycle
    def _env(self) -> dict[str, str]:
        """The child's environment: the sandbox allow-list of ours (no secrets), the spec's own
        variables, a private HOME / TMPDIR, and the resource limits it sets on itself."""
        env = sandbox.scrub_env()
        env.update(self.spec.env)
        env["HOME"] = env["TMPDIR"] = self._cwd or tempfile.gettempdir()
        limits = self.spec.limits if self.spec.limits is not None else sandbox.default_limits()
        env[sandbox.LIMITS_VAR] = sandbox.limits_env(limits)
        env["ENGINE_WORKER_ROOT"] = _ROOT
        env["PYTHONPATH"] = _ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        if self.spec.cpu_ids:
            env["ENGINE_WORKER_CPUS"] = ",".join(str(c) for c in self.spec.cpu_ids)
        else:
            env.pop("ENGINE_WORKER_CPUS", None)
        if self.spec.threads:
            env["TVM_NUM_THREADS"] = str(int(self.spec.threads))
            env["OMP_NUM_THREADS"] = str(int(self.spec.threads))
            env["TVM_BIND_THREADS"] = "0"
        if self.initializer:
            env["ENGINE_WORKER_INIT"] = self.initializer
        else:
            env.pop("ENGINE_WORKER_INIT", None)
        return env

    def start(self) -> None:
        """Spawn the child (non-blocking: it imports while the parent works)."""
        if self._proc is not None and self._proc.poll() is None:
            return
        stderr = self._stderr
        if stderr is None:
            stderr = None if os.environ.get("ENGINE_WORKER_STDERR") == "inherit" else subprocess.DEVNULL
        sandbox.remove_dir(self._cwd)
        self._cwd = sandbox.private_dir()
        hand_over(self._cwd)  # the child writes here as the sandbox account (it drops to it first thing)
        env = self._env()
        lock_fd = None
        if env.get(TIMING_LOCK_VAR) and sandbox_account() is not None:
            # the sandbox account cannot reach this user's runtime folder: the worker gets the GPU's
            # timing lock file open, an open of its own (flock still excludes the other workers)
            lock_fd = os.open(env[TIMING_LOCK_VAR], os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            env[sandbox.TIMING_LOCK_FD_VAR] = str(lock_fd)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-u", _WORKER_SCRIPT],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=env,
                cwd=self._cwd,
                close_fds=True,
                pass_fds=() if lock_fd is None else (lock_fd,),
                # its own process group: a kill takes the compilers/children it started along (killpg)
                start_new_session=True,
            )
        finally:
            if lock_fd is not None:
                os.close(lock_fd)
        self._ready = False
        self.uses = 0
        self.starts += 1

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def close(self, timeout: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        self._ready = False
        if proc is None:
            return
        try:
            if proc.stdin:
                proc.stdin.close()
            proc.wait(timeout=timeout)
        except Exception:  # noqa: BLE001
            self._kill(proc)
        finally:
            if proc.stdout:
                proc.stdout.close()
            sandbox.remove_dir(self._cwd)
            self._cwd = None

    def kill(self) -> None:
        proc, self._proc = self._proc, None
        self._ready = False
        sandbox.remove_dir(self._cwd)
        self._cwd = None
        if proc is not None:
            self._kill(proc)
            if proc.stdout:
                proc.stdout.close()
            if proc.stdin:
                try:
                    proc.stdin.close()
                except Exception:  # noqa: BLE001
                    pass

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        """SIGKILL the worker's whole process group (it leads one: start_new_session), so nvcc, g++
        or anything else a candidate started goes too, then reap the worker."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            pass
        try:
            proc.kill()
            proc.wait(timeout=5)
        except Exception:  # noqa: BLE001
            pass

    # ------------------------------------------------------------------ protocol
    def _read_exact(self, n: int, deadline: float | None) -> bytes:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        buf = bytearray()
        while len(buf) < n:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise WorkerTimeout("timeout")
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                raise WorkerTimeout("timeout")
            chunk = os.read(fd, n - len(buf))
            if not chunk:
                code = self._proc.poll()
                raise WorkerError(f"worker {self.spec.name} died (exit code {code})")
            buf.extend(chunk)
        return bytes(buf)

    def _recv(self, deadline: float | None):
        (n,) = struct.unpack(">Q", self._read_exact(8, deadline))
        try:
            return loads_from_sandbox(self._read_exact(n, deadline))
        except (pickle.UnpicklingError, AttributeError, ImportError, TypeError, ValueError, EOFError) as exc:
            raise WorkerError(f"worker {self.spec.name} sent a refused answer: {exc}") from None

    def wait_ready(self) -> None:
        if self._ready:
            return
        self.start()
        msg = self._recv(time.monotonic() + self.start_timeout)
        if not (isinstance(msg, tuple) and msg and msg[0] == "ready"):
            raise WorkerError(f"unexpected hello from worker: {msg!r}")
        self.init_error = msg[2]
        self._ready = True

    def call(self, func: Callable[..., Any] | str, *args, timeout: float | None = None, **kwargs):
        """Run ``func`` (a module-level function, or its "package.module:function" name) in the child;
        blocks."""
        func = entry_point(func)
        with self.lock:
            if self.max_uses and self.uses >= self.max_uses:
                self.close()
            if not self.alive:
                self.start()
            try:
                self.wait_ready()
                data = pickle.dumps((func, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
                assert self._proc is not None and self._proc.stdin is not None
                self._proc.stdin.write(struct.pack(">Q", len(data)) + data)
                self._proc.stdin.flush()
                deadline = None if timeout is None else time.monotonic() + timeout
                ok, value = self._recv(deadline)
            except WorkerTimeout:
                self.kill()
                raise WorkerTimeout(f"{func} killed after {timeout} s in worker {self.spec.name}") from None
            except (WorkerError, BrokenPipeError, OSError, EOFError) as exc:
                self.kill()
                raise WorkerError(f"worker {self.spec.name} failed: {exc}") from None
            self.uses += 1
            if not ok:
                raise WorkerError(value)
            return value


# A queued call: its future, the function's importable name, args, kwargs and timeout (None ends a loop).
_Job = tuple[concurrent.futures.Future, str, tuple, dict, float | None]


class ProcessPool:
    """A fixed set of :class:`WorkerProcess` fed from one job queue.

    ``shared``: workers another pool owns that this one also feeds (its calls and theirs take turns on
    each worker's lock); :meth:`shutdown` leaves them running, :meth:`kill` (a hung call) ends them too
    (a dead worker restarts on its next call)."""

    def __init__(
        self,
        specs: Sequence[WorkerSpec],
        *,
        initializer: Callable[..., Any] | str | None = None,
        max_uses: int | None = None,
        eager: bool = True,
        stderr: Any = None,
        shared: Sequence[WorkerProcess] = (),
    ) -> None:
        own = [WorkerProcess(s, initializer=initializer, max_uses=max_uses, stderr=stderr) for s in specs]
        self.workers = list(shared) + own
        self._owned = {id(w) for w in own}
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._closed = False
        for w in self.workers:
            if eager and id(w) in self._owned:
                w.start()
            t = threading.Thread(target=self._loop, args=(w,), daemon=True, name=f"pool-{w.spec.name}")
            t.start()
            self._threads.append(t)

    def __len__(self) -> int:
        return len(self.workers)

    def _loop(self, worker: WorkerProcess) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fut, func, args, kwargs, timeout = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                t0 = time.perf_counter()
                value = worker.call(func, *args, timeout=timeout, **kwargs)
                fut.wall_secs = time.perf_counter() - t0  # type: ignore[attr-defined]
                fut.worker_name = worker.spec.name  # type: ignore[attr-defined]
                fut.set_result(value)
            except BaseException as exc:  # noqa: BLE001
                fut.worker_name = worker.spec.name  # type: ignore[attr-defined]
                fut.set_exception(exc)

    def submit(
        self, func: Callable[..., Any] | str, *args, timeout: float | None = None, **kwargs
    ) -> concurrent.futures.Future:
        if self._closed:
            raise RuntimeError("pool is shut down")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((fut, entry_point(func), args, kwargs, timeout))
        return fut

    def pids(self) -> list[int | None]:
        return [w.pid for w in self.workers]

    def wait_ready(self) -> None:
        for w in self.workers:
            with w.lock:
                w.wait_ready()

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._jobs.put(None)
        for w in self.workers:
            if id(w) in self._owned:
                with w.lock:
                    w.close()

    def kill(self) -> None:
        """End the pool now, without waiting for calls in flight (a hung worker): every worker's
        process group is killed and its pending call ends with a WorkerError."""
        self._closed = True
        while True:  # calls never started end as cancelled
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[0].cancel()
        for _ in self._threads:
            self._jobs.put(None)
        for w in self.workers:
            w.kill()

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001
            pass


def run_isolated(
    func: Callable[..., Any] | str, *args, timeout: float | None = None, limits: dict | None = None, **kwargs
):
    """Run ``func`` once in a fresh sandboxed worker (its own environment, directory and limits),
    then end the worker. Raises :class:`WorkerError` / :class:`WorkerTimeout` like ``call``."""
    worker = WorkerProcess(WorkerSpec(name="isolated", limits=limits))
    try:
        return worker.call(func, *args, timeout=timeout, **kwargs)
    finally:
        worker.kill()


@atexit.register
def _kill_all() -> None:  # pragma: no cover
    for w in list(_LIVE):
        try:
            w.kill()
        except Exception:  # noqa: BLE001
            pass
