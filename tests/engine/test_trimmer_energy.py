"""Trimmer rules on synthetic latency histories, and each energy meter."""
from __future__ import annotations

import pytest

from tuning.engine.energy import (
    CompositeMeter, EnergyAccount, ModeledMeter, NvmlMeter, RaplMeter, available_meters, carbon_grams,
)
from tuning.engine.budget import allocate_trials
from tuning.engine.trimmer.rules import ModelStopper, TaskPlateauTracker, TrimmerConfig


# --- pre-emption --------------------------------------------------------------------

def test_task_preempted_after_two_rounds_without_improvement():
    tracker = TaskPlateauTracker(TrimmerConfig(plateau_rounds=2, min_improvement=0.01))
    assert not tracker.observe(0, [5.0, 4.0])      # first batch sets the best
    assert not tracker.observe(0, [3.0, 6.0])      # improved
    assert not tracker.observe(0, [2.99, 7.0])     # < 1 % better: stale round 1
    assert tracker.observe(0, [3.5, None])         # stale round 2: pre-empted
    assert tracker.preempted == {0: 8} and tracker.best[0] == pytest.approx(2.99)
    assert tracker.observe(0, [0.1])               # stays pre-empted


def test_failed_batches_count_as_no_improvement_and_tasks_are_independent():
    tracker = TaskPlateauTracker(TrimmerConfig(plateau_rounds=2))
    tracker.observe(0, [1.0])
    tracker.observe(1, [1.0])
    assert not tracker.observe(0, [None, None])
    assert not tracker.observe(1, [0.5])
    assert tracker.observe(0, [float("nan")])
    assert not tracker.is_preempted(1)


def test_min_trials_and_disabled_prevent_preemption():
    tracker = TaskPlateauTracker(TrimmerConfig(plateau_rounds=1, min_trials_per_task=10))
    tracker.observe(0, [1.0] * 4)
    assert not tracker.observe(0, [1.0] * 4)       # 8 trials < 10
    assert tracker.observe(0, [1.0] * 4)           # 12 trials
    off = TaskPlateauTracker(TrimmerConfig(enabled=False, plateau_rounds=1))
    off.observe(0, [1.0])
    assert not any(off.observe(0, [1.0]) for _ in range(5))


# --- whole-model stop ---------------------------------------------------------------

def test_model_stops_when_windowed_estimate_plateaus():
    stopper = ModelStopper(TrimmerConfig(model_window=2, model_patience=2, model_min_improvement=0.01))
    for x in [10, 8, 6, 5, 5]:                      # windows keep improving by > 1 %
        assert not stopper.observe(x)
    assert stopper.misses == 0
    assert not stopper.observe(5.0)                 # (5, 5) vs (6, 5): still 9 % better
    assert not stopper.observe(4.99)                # (5, 4.99) vs (5, 5): 0.1 % -> miss 1
    assert stopper.misses == 1
    assert stopper.observe(4.98)                    # (4.99, 4.98) vs (5, 5): 0.3 % -> miss 2: stop
    assert "did not improve" in stopper.reason


def test_model_stops_at_target_latency():
    stopper = ModelStopper(TrimmerConfig(target_latency_s=2e-3))
    assert not stopper.observe(3e-3)
    assert stopper.observe(1.9e-3) and "target latency" in stopper.reason


def test_model_stop_ignores_missing_estimates():
    stopper = ModelStopper(TrimmerConfig(model_window=1, model_patience=1))
    assert not stopper.observe(None)
    assert not stopper.observe(1.0)
    assert stopper.observe(1.0)


# --- budget re-allocation -----------------------------------------------------------

def test_allocation_follows_share_of_end_to_end_latency_and_sums_exactly():
    tasks = {0: (1.0, 3e-3), 1: (2.0, 0.5e-3), 2: (1.0, None), 3: (1.0, 9.0)}
    alloc = allocate_trials(100, tasks, active=[0, 1, 2])  # task 3 pre-empted
    assert sum(alloc.values()) == 100 and 3 not in alloc
    # shares: 3e-3, 1e-3 and the mean (2e-3) for the unmeasured task
    assert alloc[0] == 50 and alloc[1] in (16, 17) and alloc[2] in (33, 34)
    assert allocate_trials(0, tasks, [0]) == {0: 0}
    assert allocate_trials(5, tasks, []) == {}


def test_config_validation():
    assert TrimmerConfig.from_dict({"plateau_rounds": 3}).plateau_rounds == 3
    for bad in ({"plateau_rounds": 0}, {"min_improvement": 1.5}, {"nope": 1}, {"target_latency_s": -1}):
        with pytest.raises(ValueError):
            TrimmerConfig.from_dict(bad)


# --- energy meters ------------------------------------------------------------------

def _fake_rapl(tmp_path, energy_uj, max_range=1000):
    domain = tmp_path / "intel-rapl:0"
    domain.mkdir(exist_ok=True)
    (domain / "energy_uj").write_text(str(energy_uj))
    (domain / "max_energy_range_uj").write_text(str(max_range))
    (domain / "name").write_text("package-0")
    sub = tmp_path / "intel-rapl:0:0"  # a core sub-domain must not be double counted
    sub.mkdir(exist_ok=True)
    (sub / "energy_uj").write_text("5")
    (sub / "max_energy_range_uj").write_text("1000")
    return domain


def test_rapl_meter_reads_package_counter_and_handles_wraparound(tmp_path):
    domain = _fake_rapl(tmp_path, 900)
    meter = RaplMeter(tmp_path)
    (domain / "energy_uj").write_text("950")
    assert meter.read().joules == pytest.approx(50e-6)
    (domain / "energy_uj").write_text("40")        # wrapped: 950 -> 1000 -> 40 = 91 uJ
    sample = meter.read()
    assert sample.joules == pytest.approx(141e-6) and sample.source == "rapl"


def test_rapl_meter_refuses_when_unreadable(tmp_path):
    with pytest.raises(OSError, match="no readable RAPL"):
        RaplMeter(tmp_path)


class FakeNvml:
    def __init__(self, counters_mj):
        self.counters = counters_mj

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.counters)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return self.counters[handle]


def test_nvml_meter_sums_gpu_energy_counters():
    nvml = FakeNvml([1000, 5000])
    meter = NvmlMeter(nvml)
    nvml.counters = [3000, 5500]
    sample = meter.read()
    assert sample.joules == pytest.approx(2.5) and sample.source == "nvml"


def test_nvml_meter_reports_missing_driver():
    class Broken(FakeNvml):
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")

    with pytest.raises(OSError, match="NVML unavailable"):
        NvmlMeter(Broken([]))


def test_modeled_meter_is_cpu_seconds_times_watts_for_real():
    meter = ModeledMeter(cpu_watts_per_core=10.0)
    deadline = __import__("time").process_time() + 0.3
    while __import__("time").process_time() < deadline:  # burn ~0.3 CPU-seconds in this process
        pass
    sample = meter.read()
    assert sample.source == "modeled"
    assert 2.5 <= sample.joules <= 6.0  # 0.3 s x 10 W, plus interpreter noise


def test_modeled_meter_never_goes_backwards():
    values = iter([0.0, 5.0, 1.0])  # a child was reaped between reads
    meter = ModeledMeter(cpu_watts_per_core=2.0, cpu_seconds=lambda: next(values))
    assert meter.read().joules == 10.0 and meter.read().joules == 10.0


def test_available_meters_falls_back_to_model_and_labels_composite(tmp_path):
    meter = available_meters(cpu_watts_per_core=10, gpu_board_watts=300, rapl_root=str(tmp_path))
    assert meter.source == "modeled"
    _fake_rapl(tmp_path, 0)
    combo = available_meters(cpu_watts_per_core=10, gpu_board_watts=300, want_gpu=True, nvml=FakeNvml([0]),
                             rapl_root=str(tmp_path))
    assert isinstance(combo, CompositeMeter) and combo.source == "rapl+nvml"


def test_energy_account_attributes_phases_and_carbon():
    cpu = {"s": 0.0}
    meter = ModeledMeter(cpu_watts_per_core=1.0, cpu_seconds=lambda: cpu["s"])
    account = EnergyAccount(meter)
    with account.phase("build"):
        cpu["s"] += 2.0
    cpu["s"] += 0.5  # between phases: counted in the total, not in a phase
    with account.phase("measure"):
        cpu["s"] += 3.0
    d = account.to_dict()
    assert d["by_phase_joules"] == {"build": 2.0, "measure": 3.0} and d["source"] == "modeled"
    assert d["total_joules"] == 5.5
    assert carbon_grams(3.6e6, 400.0) == pytest.approx(400.0)
