"""Child side of :mod:`common.sandbox` (``python -m common._sandbox_child LIMITS_JSON``; never forked).

Order matters: resource limits first (before the request or the input is read), then death with the
parent, then the privilege hook, then the request line (JSON) and the input bytes from stdin, then the
target. The answer is one JSON object on the original stdout, ``{"result": value}`` or
``{"error": {"type", "message"}}``; fd 1 is pointed at stderr first so that nothing a library prints
can corrupt it.
"""

import os
import resource
import sys

_MAX_REQUEST_LINE = 1024 * 1024
PR_SET_PDEATHSIG = 1


def _apply_limits(limits: dict) -> None:
    def cap(which: int, value: int, hard_extra: int = 0) -> None:
        _, hard = resource.getrlimit(which)
        soft = value if hard == resource.RLIM_INFINITY else min(value, hard)
        new_hard = soft + hard_extra if hard == resource.RLIM_INFINITY else min(soft + hard_extra, hard)
        resource.setrlimit(which, (soft, new_hard))

    if limits.get("as_bytes"):
        cap(resource.RLIMIT_AS, int(limits["as_bytes"]))
    if limits.get("cpu_s"):
        cap(resource.RLIMIT_CPU, int(limits["cpu_s"]), hard_extra=2)  # SIGXCPU at the limit, SIGKILL 2 s later
    if limits.get("fsize"):
        cap(resource.RLIMIT_FSIZE, int(limits["fsize"]))
    if limits.get("nofile"):
        cap(resource.RLIMIT_NOFILE, int(limits["nofile"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _die_with_parent(parent: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the wall-clock kill still applies
        pass
    if os.getppid() != parent:  # the parent died before the line above: nobody waits for an answer
        os._exit(3)


def _resolve(name: str):
    import importlib

    module, _, qualname = name.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _read_line(stream) -> bytes:
    line = stream.readline(_MAX_REQUEST_LINE + 1)
    if not line.endswith(b"\n"):
        raise ValueError("the request line is missing or too long")
    return line


def main() -> None:
    import json

    _apply_limits(json.loads(sys.argv[1]))
    answer_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    stdin = sys.stdin.buffer
    try:
        request = json.loads(_read_line(stdin))
        _die_with_parent(int(request["parent"]))
        if request.get("hook"):
            _resolve(request["hook"])()
        kwargs = dict(request.get("kwargs") or {})
        if request.get("data"):
            kwargs["data"] = stdin.read()
        result = {"result": _resolve(request["target"])(*request.get("args", []), **kwargs)}
        body = json.dumps(result, allow_nan=False).encode()
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent as data
        body = json.dumps({"error": {"type": type(exc).__name__, "message": str(exc)[:2000]}}).encode()
    answer_out.write(body)
    answer_out.flush()


if __name__ == "__main__":
    main()
