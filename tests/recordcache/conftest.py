"""Fixtures for the record-cache tests."""
import logging
import os

import pytest

logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def cpu_target():
    return {"kind": "llvm", "num-cores": len(os.sched_getaffinity(0))}
