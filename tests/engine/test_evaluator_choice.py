"""How a model's candidates are timed: cold (caches flushed before each sample) when its weights outgrow the
measuring host's last-level cache, warm otherwise (``timer.choose_evaluator``), read from sysfs and the ONNX
model, and kept apart in the record cache's key (a run's choice: test_run_target_and_yardstick.py)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from core.onnx_models.features import weight_bytes
from core.onnx_models.zoo import build_model
from tuning.engine.measuring import timer
from tuning.engine.measuring.timer import COLD_CPU_EVALUATOR, EvaluatorConfig, choose_evaluator, default_evaluator
from tuning.engine.records.cache_key import cache_target_key

MIB = 1 << 20


def test_weights_beyond_the_last_level_cache_are_timed_cold_and_the_rest_warm():
    cold = choose_evaluator("cpu", weight_bytes=45 * MIB, llc_bytes=32 * MIB)
    assert cold.config == COLD_CPU_EVALUATOR and cold.config.enable_cpu_cache_flush and cold.regime == "cold"
    assert "45.0 MiB" in cold.why and "32.0 MiB" in cold.why
    warm = choose_evaluator("cpu", weight_bytes=14 * MIB, llc_bytes=32 * MIB)
    assert warm.config == default_evaluator("cpu") and warm.regime == "warm"
    # the same model on a host with a larger cache (the Intel VM's 300 MiB L3) is timed warm
    assert choose_evaluator("cpu", weight_bytes=45 * MIB, llc_bytes=300 * MIB).regime == "warm"
    unknown = choose_evaluator("cpu", weight_bytes=45 * MIB, llc_bytes=None)
    assert unknown.regime == "warm" and "unknown" in unknown.why
    gpu = choose_evaluator("cuda", weight_bytes=900 * MIB, llc_bytes=32 * MIB)
    assert gpu.config == default_evaluator("cuda") and gpu.regime == "gpu"


def test_the_choice_survives_the_round_trip_through_a_stored_dict():
    stored = choose_evaluator("cpu", weight_bytes=45 * MIB, llc_bytes=32 * MIB).to_dict()
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


def test_weight_bytes_count_every_float_weight_at_its_own_width():
    w32 = numpy_helper.from_array(np.zeros((64, 3, 3, 3), np.float32), "w32")
    w16 = numpy_helper.from_array(np.zeros((10, 10), np.float16), "w16")
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")  # an integer: not a weight
    const = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.zeros(7, np.float32)))
    graph = helper.make_graph([const], "g", [], [helper.make_tensor_value_info("c", TensorProto.FLOAT, [7])],
                              initializer=[w32, w16, shape])
    assert weight_bytes(helper.make_model(graph)) == 64 * 27 * 4 + 100 * 2 + 7 * 4
    resnet = build_model("resnet18")
    assert weight_bytes(resnet) == sum(numpy_helper.to_array(t).nbytes for t in resnet.graph.initializer
                                       if t.data_type == onnx.TensorProto.FLOAT)


def test_cold_records_have_a_key_of_their_own_and_warm_keys_are_unchanged():
    assert cache_target_key("k", "p") == "k|pipeline=p"  # the keys stored before the choice existed
    assert cache_target_key("k", "p", cold_timing=True) == "k|pipeline=p|timing=cold"
    assert cache_target_key("k", "p", cold_timing=True) != cache_target_key("k", "p")
