"""What a process that builds or loads user-derived code (a tuning candidate) may see and use.

Candidates are code derived from a user's model and, through imported records, from a user's
traces: they are built and loaded only in worker subprocesses that get

- an environment made from an allow-list (:data:`ENV_ALLOW`, :data:`ENV_ALLOW_PREFIXES`): no
  database URL, secret key, broker or cloud credentials reach them;
- a private, freshly made working directory (also their ``HOME`` and ``TMPDIR``);
- resource limits set in the child before it imports anything: address space (``RLIMIT_AS``,
  not for GPU workers: the CUDA driver reserves more virtual memory than any sane cap), CPU
  seconds (``RLIMIT_CPU``) and open files (``RLIMIT_NOFILE``), soft = hard.

- where the worker may switch users (root, or the compose image's ambient ``CAP_SETUID``), the
  sandbox account (``DLOPT_SANDBOX_USER``, see :mod:`common.privileges`), set after the limits
  (so it cannot raise them again): it owns only the directories handed to it, so it cannot write
  the database file or the media; and always ``no_new_privs``.

Not isolated (see docs/security.md): one sandbox account for every run (a candidate can write
another run's build artifacts while both run), it can read what is world-readable (the project,
uploaded models under the media folder), same network, no chroot, no seccomp, no namespaces. Where
the worker may not switch users (a developer's laptop) the sandbox keeps the worker's user id.
Limits can be tuned with ``DLOPT_SANDBOX_AS_MB``, ``DLOPT_SANDBOX_CPU_S`` and ``DLOPT_SANDBOX_NOFILE``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import shutil
import stat
import tempfile

from common.privileges import drop_privileges, take_back

__all__ = [
    "ENV_ALLOW",
    "ENV_ALLOW_PREFIXES",
    "scrub_env",
    "default_limits",
    "limits_env",
    "apply_limits",
    "apply_limits_from_env",
    "private_dir",
    "runtime_root",
    "user_runtime_dir",
    "UnsafeDirectory",
    "scrubbed_environ",
    "stock_worker_init",
    "protect_secrets",
    "is_dumpable",
    "read_untrusted_file",
    "RUNTIME_ONLY_ENV",
]

# Variables a builder / measuring worker needs (compilers, libraries, locale, TVM and thread knobs).
ENV_ALLOW = frozenset(
    {
        "PATH",
        "LANG",
        "LANGUAGE",
        "TERM",
        "TZ",
        "CC",
        "CXX",
        "LD_LIBRARY_PATH",
        "PYTHONPATH",
        "PYTHONHASHSEED",
        "PYTHONDONTWRITEBYTECODE",
        "VIRTUAL_ENV",
        "ENGINE_WORKER_STDERR",
    }
)
ENV_ALLOW_PREFIXES = (
    "LC_",
    "TVM_",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "CUDA_",
    "NVIDIA_",
    "DLOPT_SANDBOX_",
    "DLOPT_CUDA_",
    "DLOPT_TIMING_",
)
LIMITS_VAR = "ENGINE_WORKER_RLIMITS"
# a worker that runs as the sandbox account gets its GPU's timing lock as an open file (this number)
TIMING_LOCK_FD_VAR = "DLOPT_TIMING_LOCK_FD"
DEFAULT_AS_MB = 8192
DEFAULT_CPU_S = 4 * 3600  # a persistent worker's lifetime CPU; each call also has a wall-clock timeout
DEFAULT_NOFILE = 512


def scrub_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The allow-listed part of ``env`` (default: this process's environment)."""
    env = dict(os.environ if env is None else env)
    return {k: v for k, v in env.items() if k in ENV_ALLOW or k.startswith(ENV_ALLOW_PREFIXES)}


def _int_env(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def default_limits(*, gpu: bool = False) -> dict[str, int | None]:
    """RLIMIT values for a candidate worker (``as_bytes`` None: no address-space cap)."""
    as_mb = _int_env("DLOPT_SANDBOX_AS_MB", DEFAULT_AS_MB)
    return {
        "as_bytes": None if gpu or as_mb <= 0 else as_mb * 1024 * 1024,
        "cpu_s": _int_env("DLOPT_SANDBOX_CPU_S", DEFAULT_CPU_S),
        "nofile": _int_env("DLOPT_SANDBOX_NOFILE", DEFAULT_NOFILE),
    }


def limits_env(limits: dict[str, int | None]) -> str:
    return ",".join(f"{k}={'' if v is None else int(v)}" for k, v in limits.items())


def apply_limits(limits: dict[str, int | None]) -> None:
    """Set soft = hard limits on this process (children inherit them)."""
    names = {"as_bytes": resource.RLIMIT_AS, "cpu_s": resource.RLIMIT_CPU, "nofile": resource.RLIMIT_NOFILE}
    for key, value in limits.items():
        if value is None or key not in names:
            continue
        _, hard = resource.getrlimit(names[key])
        value = int(value) if hard == resource.RLIM_INFINITY else min(int(value), hard)
        resource.setrlimit(names[key], (value, value))


def apply_limits_from_env() -> None:
    text = os.environ.get(LIMITS_VAR, "")
    limits = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        limits[key] = int(value) if value else None
    if limits:
        apply_limits(limits)


def private_dir() -> str:
    return tempfile.mkdtemp(prefix="dlopt-sandbox-")


class UnsafeDirectory(RuntimeError):
    """A shared directory another local user could write to (or redirect with a link)."""


def _check_private(path: str) -> None:
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise UnsafeDirectory(
            f"{os.path.basename(path)!r} (a dlopt runtime directory) is not a directory only "
            f"this user can write (owner uid {st.st_uid}, mode {stat.filemode(st.st_mode)})"
        )


def runtime_root() -> str:
    """Where this user's processes keep what several of them share: ``DLOPT_RUNTIME_DIR``, else
    ``$XDG_RUNTIME_DIR/dlopt``, else ``~/.cache/dlopt``; never a shared ``/tmp`` name, which another
    local user could make first (or remove and remake) to plant files or block the platform."""
    explicit = os.environ.get("DLOPT_RUNTIME_DIR")
    if explicit:
        return explicit
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    return os.path.join(xdg, "dlopt") if xdg else os.path.join(os.path.expanduser("~"), ".cache", "dlopt")


def user_runtime_dir(name: str) -> str:
    """``<runtime root>/<name>`` (a GPU's timing-lock files), resolved in the parent and passed to
    workers by env (their own HOME and TMPDIR are private). The root and the folder must be real
    directories of this user that nobody else can write; otherwise :class:`UnsafeDirectory`."""
    root = runtime_root()
    os.makedirs(root, mode=0o700, exist_ok=True)
    _check_private(root)
    path = os.path.join(root, name)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    _check_private(path)
    return path


# What a measuring worker needs of TVM: its runtime library alone (measure.py needs no compiler), and no
# PyTorch DLPack extension (where PyTorch is installed, GPU hosts often, tvm_ffi's import would import
# torch and JIT-build one in each worker)
RUNTIME_ONLY_ENV = {"TVM_USE_RUNTIME_LIB": "1", "TVM_FFI_DISABLE_TORCH_C_DLPACK": "1"}


def read_untrusted_file(
    path: str | os.PathLike, *, max_bytes: int, magic: bytes, dir_fd: int | None = None
) -> bytes | None:
    """The bytes of a file a worker wrote or named, as a secret-holding parent may read them: opened
    without following links (a link to ``/proc/self/environ`` would otherwise hand over this
    process's environment), and None unless it is a regular file of at most ``max_bytes`` that
    starts with ``magic``. An ``OSError`` from opening it propagates."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return None
        data = fh.read(max_bytes + 1)
    return data if data.startswith(magic) and len(data) <= max_bytes else None


def remove_dir(path: str | None) -> None:
    """Remove a directory a sandboxed child wrote (taken back first: a parent that switches users by
    capability, not as root, could not list the sandbox's folders)."""
    if path:
        try:
            take_back(path)
        except OSError:
            pass
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def scrubbed_environ():
    """Only the allow-listed variables in ``os.environ`` while the block runs (for TVM's own
    Popen workers in stock mode, which copy this process's environment when they start)."""
    saved = dict(os.environ)
    keep = scrub_env(saved)
    try:
        for k in list(os.environ):
            if k not in keep:
                del os.environ[k]
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def stock_worker_init(gpu: bool = False) -> None:
    """Initializer of TVM's LocalBuilder / LocalRunner workers (stock mode): limits, the sandbox
    account and a private cwd made as that account (bind ``gpu`` with functools.partial for a runner
    that measures on a GPU). The stock builder's artifacts go to its own temporary folders, which the
    stock runner (the same account) reads."""
    apply_limits(default_limits(gpu=gpu))
    drop_privileges()
    d = private_dir()
    os.chdir(d)
    os.environ["TMPDIR"] = os.environ["HOME"] = d
    tempfile.tempdir = d


PR_GET_DUMPABLE, PR_SET_DUMPABLE = 3, 4


def _prctl(*args: int) -> int:
    return ctypes.CDLL(None, use_errno=True).prctl(*args, 0, 0, 0)


def protect_secrets() -> bool:
    """Make this process non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``), for every process that holds
    the platform's secrets (web, Celery workers: config/settings.py calls it). A sandbox runs as the
    same user, and a scrubbed environment is worth nothing if the sandbox can read its ancestor's
    ``/proc/<pid>/environ`` (or ``mem``, or ptrace it): for a non-dumpable process the kernel refuses
    that to other processes of the same (non-root) user. ``execve`` resets the flag, so the
    sandboxes themselves (fresh interpreters) are unaffected. Returns whether it was set."""
    try:
        return _prctl(PR_SET_DUMPABLE, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def is_dumpable() -> bool:
    try:
        return _prctl(PR_GET_DUMPABLE, 0) == 1
    except (OSError, AttributeError):
        return True


def describe_process() -> dict:
    """What this process runs with (environment names, cwd, ids, limits): a probe the tests run in workers."""
    return {
        "env": sorted(os.environ),
        "cwd": os.getcwd(),
        "pid": os.getpid(),
        "uids": os.getresuid(),
        "gids": os.getresgid(),
        "groups": os.getgroups(),
        "limits": {
            "as_bytes": resource.getrlimit(resource.RLIMIT_AS),
            "cpu_s": resource.getrlimit(resource.RLIMIT_CPU),
            "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
        },
    }
