"""Child side of :mod:`tuning.engine.process.procpool` (run as a script, never forked).

Applies its resource limits (sandbox.py), drops to the sandbox account
(common/privileges.py: where the parent may switch users) and sets the CPU affinity
*before* anything starts a thread (so TVM's pool threads inherit it) or loads a candidate, moves fd 1 to stderr so stray prints cannot corrupt the protocol,
then serves ``(func "module:qualname", args, kwargs)`` requests read from
stdin, answering ``(ok, value-or-traceback)`` on the original stdout.
Messages are 8-byte big-endian length + pickle.
"""

import os
import sys


def _main() -> None:
    root = os.environ.get("ENGINE_WORKER_ROOT")
    if root and root not in sys.path:
        sys.path.insert(0, root)
    from common.privileges import drop_privileges  # stdlib only: nothing has run yet
    from tuning.engine.process.lifeline import die_with_parent
    from tuning.engine.process.sandbox import apply_limits_from_env

    apply_limits_from_env()
    drop_privileges()  # after the limits (as root it could still raise them), before any user code
    # a pool may be started from a thread that ends before it: the watchdog only, no death signal
    # (and after the drop: a change of user clears a parent-death signal)
    die_with_parent(death_signal=False, parent=os.getppid())
    cpus = os.environ.get("ENGINE_WORKER_CPUS")
    if cpus:
        try:
            os.sched_setaffinity(0, {int(c) for c in cpus.split(",") if c != ""})
        except (AttributeError, OSError):
            pass
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    proto_in = os.fdopen(os.dup(0), "rb", buffering=0)

    # imported only now: whatever an import prints goes to stderr, never into the protocol pipe
    import importlib
    import pickle
    import struct
    import traceback

    def read_exact(n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = proto_in.read(n - len(buf))
            if not chunk:
                raise EOFError
            buf.extend(chunk)
        return bytes(buf)

    def send(obj) -> None:
        try:
            data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # unpicklable result -> report as error
            data = pickle.dumps((False, "unpicklable result:\n" + traceback.format_exc()))
        proto_out.write(struct.pack(">Q", len(data)) + data)

    def resolve(name: str):
        mod_name, _, qual = name.partition(":")
        obj = importlib.import_module(mod_name)
        for part in qual.split("."):
            obj = getattr(obj, part)
        return obj

    init = os.environ.get("ENGINE_WORKER_INIT")
    init_error = None
    if init:
        try:
            resolve(init)()
        except Exception:
            init_error = traceback.format_exc()
    send(("ready", os.getpid(), init_error))

    while True:
        try:
            (n,) = struct.unpack(">Q", read_exact(8))
            func, args, kwargs = pickle.loads(read_exact(n))
        except EOFError:
            break
        try:
            send((True, resolve(func)(*args, **kwargs)))
        except BaseException:  # noqa: BLE001 - report everything to the parent
            send((False, traceback.format_exc()))


if __name__ == "__main__":
    _main()
