"""common.nvml, the one NVML wrapper (scheduling's telemetry and the tuning engine's energy meter use it)."""
from __future__ import annotations

import pytest

from common import nvml


class FakeNvml:
    def __init__(self, *, init_error: Exception | None = None, energy_error: Exception | None = None):
        self.init_error, self.energy_error, self.closed = init_error, energy_error, False

    def nvmlInit(self):
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self):
        self.closed = True
        raise RuntimeError("shutdown is best effort")

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if self.energy_error is not None:
            raise self.energy_error
        return 123_456


def test_open_returns_the_module_and_close_never_raises():
    fake = FakeNvml()
    assert nvml.open_nvml(fake) is fake
    nvml.close_nvml(fake)
    assert fake.closed


def test_a_host_without_the_driver_is_a_reason_not_a_crash():
    with pytest.raises(nvml.NvmlUnavailable, match="^NVML Shared Library Not Found$") as exc:
        nvml.open_nvml(FakeNvml(init_error=RuntimeError("NVML Shared Library Not Found")))
    assert isinstance(exc.value, OSError)  # callers that fall back on OSError keep working
    with pytest.raises(nvml.NvmlUnavailable, match="^KeyError$"):  # an empty message names the error
        nvml.open_nvml(FakeNvml(init_error=KeyError()))


def test_unsupported_queries_read_as_none():
    assert nvml.total_energy_mj(FakeNvml(), handle=0) == 123_456.0
    assert nvml.total_energy_mj(FakeNvml(energy_error=RuntimeError("NotSupported")), handle=0) is None
    assert nvml.text(b"Tesla V100") == "Tesla V100" and nvml.text("H200") == "H200"
