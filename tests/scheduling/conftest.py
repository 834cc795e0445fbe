"""Fixtures for the scheduling app: a fake pynvml, registered GPU nodes, a small predictor. The test doubles
and builders themselves are in fakes.py (tests import them from there); the names stay importable here for
the reliability tests that import them from this module."""
from __future__ import annotations

import pytest

from .fakes import FakeNvml, FakeNVMLError, fake_gpu, make_job, register_gpu_node  # noqa: F401 - re-exported


@pytest.fixture(autouse=True)
def job_in_this_process(monkeypatch):
    """The seam at the job child's boundary: these tests swap the runtime or NVML in this process (stand-ins
    that read the database while the job runs), so the job runs here, through the code the child runs.
    test_gpu_job_process.py overrides this fixture and runs the real child."""
    from scheduling import job_process

    from .fakes import run_job_in_this_process

    monkeypatch.setattr(job_process, "run_job_in_child", run_job_in_this_process)


@pytest.fixture
def fake_nvml():
    return FakeNvml([fake_gpu(), fake_gpu(util=60, used_mb=9000, energy_mj=None)])


@pytest.fixture
def no_nvml():
    return FakeNvml(init_error="NVML Shared Library Not Found")


@pytest.fixture
def use_nvml(monkeypatch):
    """use_nvml(fake) makes every `pynvml` lookup in the scheduling app return `fake`."""
    from scheduling import telemetry

    def install(fake):
        monkeypatch.setattr(telemetry, "load_nvml", lambda: (fake, ""))
        return fake

    return install


@pytest.fixture
def gpu_node(db):
    return register_gpu_node()


@pytest.fixture
def predictor(db, settings):
    """A small active predictor (few trees, 2 folds) trained on the seed profiles: fast."""
    from scheduling import services

    return services.train_predictor(actor=None, k_folds=2, xgb_params={"n_estimators": 20})
