"""Runtimes the job child imports by name in tests (``SCHEDULING_JOB_RUNTIMES``): this machine has no CUDA,
so onnxruntime's CPU provider stands in for the CUDA one, in the real child, through the real runtime
code around it (rebatching, inputs, the stop check). Each takes what scheduling.gpu_runtime.RUNTIMES'
entries take."""
from __future__ import annotations

import os
import resource
import time

from scheduling import gpu_runtime

#: Long enough that the worker polls the running child at least once (it does about every second).
RUNS_AT_LEAST_S = 2.5


def _limit(which: int) -> list[int]:
    return [-1 if v == resource.RLIM_INFINITY else v for v in resource.getrlimit(which)]


def what_the_child_saw(device_index: int, options: dict) -> dict:
    return {"pid": os.getpid(), "uid": os.getuid(), "device_index": device_index, "options": options,
            "env": {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "DATABASE", "REDIS", "SECRET",
                                                                          "DJANGO", "DLOPT"))},
            "limits": {"as": _limit(resource.RLIMIT_AS), "cpu": _limit(resource.RLIMIT_CPU),
                       "nofile": _limit(resource.RLIMIT_NOFILE), "core": _limit(resource.RLIMIT_CORE)}}


def onnxruntime_on_cpu(model, inputs, iterations, device_index, sampler_factory, check, **options):
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    started = time.monotonic()
    lat = gpu_runtime.timed_iterations(lambda: sess.run(None, inputs), iterations, check)
    time.sleep(max(0.0, RUNS_AT_LEAST_S - (time.monotonic() - started)))
    return {"runtime": "onnxruntime", "provider": "CPUExecutionProvider", "latencies_s": lat,
            "child": what_the_child_saw(device_index, options)}


def never_returns(model, inputs, iterations, device_index, sampler_factory, check, **options):
    """A compile or an inference that never comes back (it never reaches the stop check)."""
    while True:
        time.sleep(1)


def out_of_gpu_memory(model, inputs, iterations, device_index, sampler_factory, check, **options):
    """Fills its GPU memory share (what the test's NVML reports of this process) long enough for the worker
    to sample it, then fails as onnxruntime does when an allocation fails."""
    time.sleep(RUNS_AT_LEAST_S)
    raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : CUDA failure 2: out of memory")


def crashes(model, inputs, iterations, device_index, sampler_factory, check, **options):
    import signal

    os.kill(os.getpid(), signal.SIGSEGV)


def leaves_a_grandchild(model, inputs, iterations, device_index, sampler_factory, check, **options):
    """A model run that starts a process of its own, then hangs."""
    import subprocess

    subprocess.Popen(["sleep", "600"])
    never_returns(model, inputs, iterations, device_index, sampler_factory, check)


def train_on_cpu(model, inputs, iterations, device_index, sampler_factory, check, *, optimizer="adam",
                 learning_rate=None):
    """The training runtime of a ``train`` job with TVM's llvm target standing in for cuda: the same
    scheduling.train_step program (Relax training: loss, gradient, optimizer), built and stepped here."""
    import tvm

    from scheduling.train_step import build_training_program, run_training_steps

    program = build_training_program(model, inputs, target={"kind": "llvm"}, device=tvm.cpu(), optimizer=optimizer,
                                     lr=learning_rate)
    out = run_training_steps(program, iterations, check)
    return {"runtime": "tvm", "provider": "llvm", **out, "child": what_the_child_saw(device_index, {})}
