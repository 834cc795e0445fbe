"""Fixtures for the tuning engine tests (plain pytest, no Django needed)."""

import logging
import os

import pytest

logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)

CPU_TARGET = {"kind": "llvm", "num-cores": len(os.sched_getaffinity(0))}


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: runs a real (small) tuning job; still run by default")


@pytest.fixture(scope="session")
def cpu_target():
    return dict(CPU_TARGET)


@pytest.fixture(scope="session")
def n_cores():
    from tuning.engine.process.procpool import available_cpus

    return len(available_cpus())


@pytest.fixture(scope="session")
def builder():
    from tuning.engine.runners.builder import PersistentBuilder

    b = PersistentBuilder(max_workers=2)
    yield b
    b.shutdown()


@pytest.fixture(scope="session")
def matmul_artifacts(builder, cpu_target):
    """Four built (unscheduled, valid) 64x64 matmul .so files + their args info."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tuning.engine.measuring.measure import _jsonable
    from tuning.engine.compile.pipeline import make_target
    from tuning.engine.testing import matmul_primfunc

    func = matmul_primfunc(64)
    mod = tvm.IRModule({"main": func})
    target = make_target(cpu_target)
    res = builder.build([ms.builder.BuilderInput(mod, target) for _ in range(4)])
    assert all(r.error_msg is None for r in res), [r.error_msg for r in res]
    args = [_jsonable(a.as_json()) for a in ms.arg_info.ArgInfo.from_prim_func(func)]
    return [str(r.artifact_path) for r in res], args
