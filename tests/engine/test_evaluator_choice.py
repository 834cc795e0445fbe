"""How a target's candidates are timed: cold (caches flushed, one call a sample) on every CPU whatever the
model's size, the device's default on GPUs (``timer.choose_evaluator``); the host's cache read from sysfs
(the node registry shows it), cold records kept apart in the record cache's key
(a run's choice: test_run_target_and_yardstick.py)."""

from __future__ import annotations

from tuning.engine.measuring import timer
from tuning.engine.measuring.timer import COLD_CPU_EVALUATOR, EvaluatorConfig, choose_evaluator, default_evaluator
from tuning.engine.records.cache_key import cache_target_key

MIB = 1 << 20


def test_every_cpu_target_is_timed_cold_and_gpus_by_their_default():
    for kind in ("cpu", "llvm"):
        cold = choose_evaluator(kind)
        assert cold.config == COLD_CPU_EVALUATOR and cold.regime == "cold" and "flushes" in cold.why
        assert cold.config.enable_cpu_cache_flush and cold.config.number == 1 and cold.config.min_repeat_ms == 0
        assert cold.config != default_evaluator(kind)  # not TVM's back-to-back default
    gpu = choose_evaluator("cuda")
    assert gpu.config == default_evaluator("cuda") and gpu.regime == "gpu"


def test_the_choice_survives_the_round_trip_through_a_stored_dict():
    stored = choose_evaluator("llvm").to_dict()
    assert stored["regime"] == "cold" and stored["why"]
    assert EvaluatorConfig.from_any(stored) == COLD_CPU_EVALUATOR  # the words are not evaluator fields


def _cache_level(root, name, level, kind, size):
    d = root / name
    d.mkdir()
    (d / "level").write_text(f"{level}\n")
    (d / "type").write_text(f"{kind}\n")
    (d / "size").write_text(f"{size}\n")


def test_the_last_level_cache_is_read_from_sysfs(tmp_path):
    _cache_level(tmp_path, "index0", 1, "Data", "32K")
    _cache_level(tmp_path, "index1", 1, "Instruction", "32K")
    _cache_level(tmp_path, "index2", 2, "Unified", "512K")
    _cache_level(tmp_path, "index3", 3, "Unified", "32768K")
    assert timer.cpu_caches(str(tmp_path)) == {"L1d": "32K", "L2": "512K", "L3": "32768K"}
    assert timer.host_llc_bytes(str(tmp_path)) == 32 * MIB
    assert timer.host_llc_bytes(str(tmp_path / "absent")) is None


def test_cold_records_have_a_key_of_their_own_and_warm_keys_are_unchanged():
    assert cache_target_key("k", "p") == "k|pipeline=p"  # the keys stored before the choice existed
    assert cache_target_key("k", "p", cold_timing=True) == "k|pipeline=p|timing=cold"
    assert cache_target_key("k", "p", cold_timing=True) != cache_target_key("k", "p")
