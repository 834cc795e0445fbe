"""Functions tests/common/test_sandbox.py runs in sandbox children (a fresh interpreter imports them)."""
from __future__ import annotations

import os
import resource
import sys


def describe(data: bytes | None = None) -> dict:
    """What the child runs with: environment names, limits, working directory, the input's length."""
    return {"env": sorted(os.environ), "cwd": os.getcwd(), "pid": os.getpid(), "ppid": os.getppid(),
            "as": resource.getrlimit(resource.RLIMIT_AS)[0], "cpu": resource.getrlimit(resource.RLIMIT_CPU)[0],
            "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
            "data_len": None if data is None else len(data), "head": None if data is None else data[:4].hex()}


def chatty(n: int) -> int:
    print("noise on stdout " * 10)  # must not corrupt the answer
    return n * 2


def allocate(mb: int) -> int:
    block = bytearray(mb * 1024 * 1024)
    return len(block)


def spin() -> None:
    while True:
        pass


def sleep_forever() -> None:
    import time

    time.sleep(3600)


def crash() -> None:
    os.kill(os.getpid(), 11)


def huge_answer(n: int) -> str:
    return "x" * n


def raises() -> None:
    raise KeyError("the parser did not foresee this")


def not_json() -> object:
    return {1, 2}


def mark_hook() -> None:
    os.environ["SANDBOX_HOOK_RAN"] = "1"


def hook_seen() -> bool:
    return os.environ.get("SANDBOX_HOOK_RAN") == "1"


def exits_silently() -> None:
    sys.stdout.flush()
    os._exit(7)
