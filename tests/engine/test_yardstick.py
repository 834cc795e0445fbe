"""onnxruntime yardstick: a latency with its timer discipline, outputs checked against TVM's."""

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from tuning.engine.compile import pipeline as rp  # noqa: E402
from tuning.engine import yardstick as ys  # noqa: E402
from tuning.engine.testing import tiny_cnn_onnx  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return tiny_cnn_onnx()


@pytest.fixture(scope="module")
def tvm_outputs(model, cpu_target):
    outs, _ = rp.run_and_time(rp.compile_model(model, cpu_target), rp.random_inputs(model), cpu_target,
                              number=1, repeat=1, threads=1)
    return outs


def test_latency_and_outputs_agree_with_tvm(model, tvm_outputs):
    res = ys.measure_onnxruntime(model, threads=1, warmup=2, repeat=3, min_repeat_ms=1, tvm_outputs=tvm_outputs)
    assert res.latency_median_ms > 0 and res.latency_iqr_ms >= 0
    assert res.provider == "CPUExecutionProvider" and res.threads == 1
    assert res.repeats == 3 and res.runs_per_repeat >= 1 and res.warmup == 2
    assert res.outputs_agree is True
    assert res.max_abs_err < 1e-4
    d = res.to_dict()
    assert "outputs" not in d and d["timer"] and d["onnxruntime_version"]
    assert res.ratio(2 * res.latency_median_ms) == pytest.approx(2.0)


def test_disagreeing_outputs_are_reported(model, tvm_outputs):
    wrong = [o + 1.0 for o in tvm_outputs]
    res = ys.measure_onnxruntime(model.SerializeToString(), rp.random_inputs(model), threads=1, warmup=1, repeat=1,
                                 min_repeat_ms=1, tvm_outputs=wrong)
    assert res.outputs_agree is False
    assert res.max_abs_err == pytest.approx(1.0, abs=1e-4)


def test_no_comparison_without_tvm_outputs(model):
    res = ys.measure_onnxruntime(model, threads=1, warmup=1, repeat=1, min_repeat_ms=1)
    assert res.outputs_agree is None and res.max_abs_err is None and len(res.outputs) == 1


def test_cuda_without_provider_says_so(model):
    if ys.cuda_provider_available():
        pytest.skip("this onnxruntime has the CUDA provider")
    with pytest.raises(ys.ProviderUnavailable, match="no CUDAExecutionProvider"):
        ys.measure_onnxruntime(model, threads=1, device="cuda")


def test_compare_outputs_and_faster_engine():
    a = [np.ones((2, 3), np.float32)]
    assert ys.compare_outputs(a, [x + 1e-6 for x in a]) == (True, pytest.approx(1e-6, rel=0.1))
    assert ys.compare_outputs(a, [np.ones((3, 2), np.float32)])[0] is False
    assert ys.compare_outputs(a, a + a)[0] is False
    assert ys.faster_engine(1.0, 2.0) == "tvm"
    assert ys.faster_engine(2.0, 1.0) == "onnxruntime" and ys.faster_engine(1.0, 1.0) == "onnxruntime"
    assert ys.faster_engine(None, 1.0) is None
