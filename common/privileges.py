"""Run untrusted work (a tuning candidate's build or measurement, an upload parser) as a user that owns
nothing of the platform's.

:func:`drop_privileges` is the child-side hook, called with no arguments in the child before it loads
or parses anything a user supplied (``_procworker.py``, ``_isolated_child.py``, TVM's stock workers,
a ``subprocess`` ``preexec_fn``). In a process that may change its user id (root, or a worker that
holds ``CAP_SETUID``/``CAP_SETGID`` as ambient capabilities: the compose image's), it switches to the
sandbox account (``DLOPT_SANDBOX_USER``, default ``dlopt-sandbox``, else ``nobody``), drops the
supplementary groups and every capability, and sets ``PR_SET_NO_NEW_PRIVS``: the child then cannot
write the database file, the media files or anything else the platform's user owns, and cannot
become that user (or root) again. In a process that may not (a developer's laptop, CI as a normal
user) it only sets no_new_privs and says once in the log that the sandbox keeps this user's id.

The parent hands the few directories a child must write (its private working directory, the build
artifacts) to the sandbox account with :func:`hand_over`, and takes a work directory back with
:func:`take_back` when the child is done.
"""

from __future__ import annotations

import ctypes
import logging
import os
import pwd
import stat
import sysconfig

__all__ = [
    "SANDBOX_USER_VAR",
    "DEFAULT_SANDBOX_USER",
    "FALLBACK_SANDBOX_USER",
    "REQUIRED_VAR",
    "PrivilegeDropError",
    "UnreachableFolder",
    "can_switch_user",
    "sandbox_account",
    "sandbox_requirement",
    "drop_privileges",
    "hand_over",
    "take_back",
    "no_new_privs",
]

log = logging.getLogger("dlopt.sandbox")

SANDBOX_USER_VAR = "DLOPT_SANDBOX_USER"
DEFAULT_SANDBOX_USER = "dlopt-sandbox"
FALLBACK_SANDBOX_USER = "nobody"  # when the dedicated account was not created (scripts/run.sh, Dockerfile do)
REQUIRED_VAR = "DLOPT_SANDBOX_REQUIRED"  # 1: refuse to run a sandbox that would keep the worker's user

CAP_SETGID, CAP_SETUID = 6, 7
PR_SET_NO_NEW_PRIVS, PR_GET_NO_NEW_PRIVS = 38, 39
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

_announced: set[str] = set()  # what this process has said already (once each)


class PrivilegeDropError(RuntimeError):
    """The child may change its user id but could not become the sandbox account: it must not go on
    to load user code with the platform's privileges."""


class UnreachableFolder(PrivilegeDropError):
    """A folder to hand to the sandbox account lies below one it may not pass through."""


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, arg2: int = 0) -> int:
    return _libc().prctl(option, ctypes.c_ulong(arg2), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))


def _effective_caps() -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def can_switch_user() -> bool:
    """Whether this process may change its user and group ids (root, or CAP_SETUID + CAP_SETGID)."""
    if os.geteuid() == 0:
        return True
    caps = _effective_caps()
    return bool(caps >> CAP_SETUID & 1 and caps >> CAP_SETGID & 1)


def _lookup(name: str) -> pwd.struct_passwd:
    return pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)


def _blocked(paths, uid: int, gid: int) -> str | None:
    """The first folder on the way to ``paths`` (or one of them) that the account could not pass
    through, or read and search where it is one of ``paths``; None when it reaches them all."""
    for path in sorted({os.path.realpath(p) for p in paths}):
        parts = path.split(os.sep)
        for depth in range(1, len(parts) + 1):
            folder = os.sep + os.path.join(*parts[1:depth]) if depth > 1 else os.sep
            try:
                st = os.stat(folder)
            except OSError:
                break
            needed = 0o5 if folder == path else 0o1
            if st.st_uid == uid:
                bits = st.st_mode >> 6
            elif st.st_gid == gid:
                bits = st.st_mode >> 3
            else:
                bits = st.st_mode
            if bits & needed != needed:
                return folder
    return None


def _unreachable(uid: int, gid: int) -> str | None:
    """Where the account is stopped on the way to the Python installation or the project: the sandbox
    could not even import the standard library."""
    paths = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the project
    return _blocked(paths, uid, gid)


def sandbox_requirement() -> bool:
    """Whether a sandbox that would keep the worker's user must be refused (``DLOPT_SANDBOX_REQUIRED``)."""
    return os.environ.get(REQUIRED_VAR, "").strip().lower() in ("1", "true", "yes")


def _cannot(reason: str) -> None:
    """No sandbox account usable: fail (``DLOPT_SANDBOX_REQUIRED=1``, the compose file's setting) or
    go on as this process's user, saying so once."""
    if sandbox_requirement():
        raise PrivilegeDropError(f"sandboxes cannot drop privileges: {reason} ({REQUIRED_VAR}=1)")
    _announce(
        "cannot",
        f"sandboxes run as this process's user (uid {os.getuid()}), not a sandbox account: "
        f"{reason}; set {REQUIRED_VAR}=1 to refuse instead",
        level=logging.WARNING,
    )


def sandbox_account() -> tuple[int, int] | None:
    """``(uid, gid)`` a sandboxed child of this process runs as, or None where it keeps this process's
    user: this process may not switch, already is the sandbox account, or (logged; an error with
    ``DLOPT_SANDBOX_REQUIRED=1``) no account exists that could run the sandbox here."""
    if not can_switch_user():
        return None
    explicit = os.environ.get(SANDBOX_USER_VAR, "").strip()
    names = [explicit] if explicit else [DEFAULT_SANDBOX_USER, FALLBACK_SANDBOX_USER]
    for name in names:
        try:
            entry = _lookup(name)
        except (KeyError, ValueError):
            continue
        if entry.pw_uid == 0 or entry.pw_gid == 0:
            raise PrivilegeDropError(
                f"{SANDBOX_USER_VAR}={name!r} is root (uid or gid 0): sandboxes must run "
                "as an account that owns nothing"
            )
        if entry.pw_uid == os.getuid():
            return None
        blocked = _unreachable(entry.pw_uid, entry.pw_gid)
        if blocked is not None:
            _cannot(
                f"account {name!r} (uid {entry.pw_uid}) cannot read {blocked}, on the way to the Python "
                "installation or the project: make them readable to it"
            )
            return None
        if name == FALLBACK_SANDBOX_USER and not explicit:
            _announce(
                "fallback",
                f"no {DEFAULT_SANDBOX_USER!r} account on this host: sandboxes run as "
                f"{FALLBACK_SANDBOX_USER!r} (uid {entry.pw_uid}); create {DEFAULT_SANDBOX_USER!r} or set "
                f"{SANDBOX_USER_VAR}",
                level=logging.WARNING,
            )
        return entry.pw_uid, entry.pw_gid
    _cannot(
        f"no account {' or '.join(repr(n) for n in names)} on this host (create it, e.g. `useradd --system "
        f"--no-create-home --shell /usr/sbin/nologin {DEFAULT_SANDBOX_USER}`, or set {SANDBOX_USER_VAR})"
    )
    return None


def no_new_privs() -> bool:
    """Set ``PR_SET_NO_NEW_PRIVS``: no execve of a setuid binary or one with file capabilities gives
    this process (or its children) more privileges. Returns whether it is set."""
    try:
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        return _prctl(PR_GET_NO_NEW_PRIVS) == 1
    except (OSError, AttributeError):  # not Linux
        return False


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _clear_capabilities() -> None:
    """Empty the ambient, effective, permitted and inheritable sets. A switch from root clears them
    itself; a switch between two non-root ids (a worker holding ambient CAP_SETUID) does not, and a
    child that kept CAP_SETUID could become any user again."""
    libc = _libc()
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        err = ctypes.get_errno()
        raise PrivilegeDropError(f"capset failed: {os.strerror(err)}")


def _announce(key: str, message: str, level: int = logging.INFO) -> None:
    if key not in _announced:
        _announced.add(key)
        log.log(level, message)


def drop_privileges() -> int:
    """The child-side hook (no arguments; call it before anything user-supplied is loaded): become the
    sandbox account where this process may, with no supplementary groups, no capabilities and
    no_new_privs; elsewhere only no_new_privs. Returns the user id the child now runs as. Raises
    :class:`PrivilegeDropError` rather than go on with privileges it should have dropped."""
    account = sandbox_account()
    if account is None:
        no_new_privs()
        _announce(
            "kept",
            f"sandbox runs as this process's user (uid {os.getuid()}): it may not switch users, "
            "so only no_new_privs is set",
        )
        return os.getuid()
    uid, gid = account
    try:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        _clear_capabilities()
    except OSError as exc:
        raise PrivilegeDropError(f"could not switch to the sandbox account (uid {uid}): {exc}") from exc
    if not no_new_privs():
        raise PrivilegeDropError("could not set no_new_privs")
    try:  # the switch must be one way: a child that can take its old ids back has dropped nothing
        os.setresuid(0, 0, 0)
    except PermissionError:
        pass
    else:
        raise PrivilegeDropError("the sandbox could become root again after dropping its privileges")
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups() not in ([], [gid]):
        raise PrivilegeDropError("the sandbox still holds some of its parent's ids")
    _announce("switched", f"sandbox switched to uid {uid} gid {gid}, no groups, no capabilities, no_new_privs")
    return uid


def _chown_tree(path: str | os.PathLike[str], uid: int, gid: int) -> None:
    """``path`` and everything under it to ``uid``:``gid``, top down, links not followed (a link the
    sandbox planted changes owner itself, never its target); folders get their owner's rwx back."""
    os.chown(path, uid, gid, follow_symlinks=False)
    for top, dirs, files in os.walk(path):
        for name in dirs + files:
            entry = os.path.join(top, name)
            try:
                os.chown(entry, uid, gid, follow_symlinks=False)
                mode = os.lstat(entry).st_mode
                if stat.S_ISDIR(mode) and mode & 0o700 != 0o700:
                    os.chmod(entry, stat.S_IMODE(mode) | 0o700)
            except FileNotFoundError:
                pass


def hand_over(path: str | os.PathLike) -> None:
    """Give ``path`` (a folder a sandboxed child must write, and what is in it) to the sandbox
    account; nothing where children keep this process's user."""
    account = sandbox_account()
    if account is not None:
        blocked = _blocked([os.path.dirname(os.path.realpath(path))], *account)
        if blocked is not None:
            raise UnreachableFolder(
                f"the sandbox account (uid {account[0]}) cannot reach {path}: {blocked} does not let it through"
            )
        _chown_tree(path, *account)


def take_back(path: str | os.PathLike) -> None:
    """Make ``path`` and everything under it this process's user's again (a folder a sandboxed child
    wrote), so no later sandbox can change what it left; nothing where children keep this user."""
    if sandbox_account() is not None:
        _chown_tree(path, os.getuid(), os.getgid())
