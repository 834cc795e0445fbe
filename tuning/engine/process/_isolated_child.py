"""Child side of :mod:`tuning.engine.process.isolate` (run as a script, never forked).

Reads one ``(func, args, kwargs, init, sink_methods)`` request from stdin, runs it (with a sink proxy
when ``sink_methods`` is a list), answers ``("result", value)`` or ``("error", message, traceback)``.
While it runs, sink calls go out as ``("sink", name, args)`` and wait for ``("ok"|"err", value)``.
fd 1 is moved to stderr first so stray prints cannot corrupt the protocol. With ``--sandbox-user``
it first drops to the sandbox account (common/privileges.py).
"""

import os
import sys


def _main() -> None:
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    proto_in = os.fdopen(os.dup(0), "rb", buffering=0)

    # imported only now: whatever an import prints goes to stderr, never into the protocol pipe
    import importlib
    import pickle
    import struct
    import threading
    import traceback

    from tuning.engine.process.isolate import _read_exact, _recv, _send

    lock = threading.Lock()

    class SinkProxy:
        def __init__(self, methods):
            for name in methods:
                setattr(self, name, self._method(name))

        @staticmethod
        def _method(name):
            def call(*args):
                with lock:  # one request and its answer at a time
                    _send(proto_out, ("sink", name, args))
                    status, value = _recv(proto_in)
                if status != "ok":
                    raise RuntimeError(value)
                return value

            return call

    def resolve(name: str):
        mod_name, _, qual = name.partition(":")
        obj = importlib.import_module(mod_name)
        for part in qual.split("."):
            obj = getattr(obj, part)
        return obj

    try:
        (size,) = struct.unpack(">Q", _read_exact(proto_in, 8))
        request = _read_exact(proto_in, size)  # (a parent that dies meanwhile ends this read)
        if "--sandbox-user" in sys.argv[1:]:  # before the request (the user's model) is parsed
            from common.privileges import drop_privileges

            drop_privileges()
        from tuning.engine.process.lifeline import die_with_parent

        # after the drop: a change of user clears a parent-death signal set before it
        die_with_parent()  # its caller waits for it in the thread that started it
        func, args, kwargs, init, methods = pickle.loads(request)
        if init:
            resolve(init)()
        if methods is not None:
            kwargs["sink"] = SinkProxy(methods)
        value = resolve(func)(*args, **kwargs)
        with lock:
            _send(proto_out, ("result", value))
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        with lock:
            _send(proto_out, ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc()))


if __name__ == "__main__":
    _main()
