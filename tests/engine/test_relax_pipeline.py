"""ONNX -> Relax -> tasks -> compiled executable."""

import numpy as np
import pytest

from tuning.engine.compile import passes as graph_passes
from tuning.engine.compile import pipeline as rp
from tuning.engine.testing import tiny_cnn_onnx


@pytest.fixture(scope="module")
def model():
    return tiny_cnn_onnx()


def test_onnx_to_relax_and_tasks(model, cpu_target):
    mod = rp.onnx_to_relax(model)
    assert "main" in [gv.name_hint for gv in mod.get_global_vars()]
    with graph_passes.use_passes(graph_passes.SHIPPED_V1):
        assert len(rp.count_tuning_tasks(model, cpu_target)) == 5
    # the CPU default converts convs to NHWC: one more task, the input's NCHW -> NHWC transpose (the one
    # back to NCHW fuses into the flatten before the matmul)
    names = rp.count_tuning_tasks(model, cpu_target)
    assert len(names) == 6 and "transpose" in "".join(names)
    assert any("conv2d" in n for n in names) and any("matmul" in n for n in names)
    prepared = rp.prepare_for_tuning(mod, cpu_target)
    assert len(rp.extract_tasks(prepared, cpu_target, prepared=True)) == 6


def test_input_specs_symbolic_batch():
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    assert rp.onnx_input_specs(m) == {"x": ((1, 4), "float32")}
    onnx.checker.check_model(m)


def test_compile_untuned_matches_onnxruntime(model, cpu_target):
    ort = pytest.importorskip("onnxruntime")
    ex = rp.compile_model(model, cpu_target)
    inputs = rp.random_inputs(model)
    outs, lat = rp.run_and_time(ex, inputs, cpu_target, number=5, repeat=3, threads=1)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)
    assert lat > 0
    np.testing.assert_allclose(outs[0], ref[0], rtol=1e-4, atol=1e-5)


def test_cuda_target_builds_without_gpu(model):
    ex = rp.compile_model(model, {"kind": "cuda", "arch": "sm_90"})
    assert ex is not None
    assert rp.target_device_type({"kind": "cuda", "arch": "sm_90"}) == "cuda"
    import tvm

    if not tvm.cuda(0).exist:
        with pytest.raises(RuntimeError, match="No cuda device"):
            rp.run_and_time(ex, rp.random_inputs(model), {"kind": "cuda"}, number=1, repeat=1)


def test_make_target_forms():
    t = rp.make_target({"kind": "cuda", "arch": "sm_90"})
    assert t.kind.name == "cuda" and t.host is not None
    assert rp.make_target("llvm").kind.name == "llvm"
    assert rp.make_target('{"kind": "llvm", "num-cores": 2}').attrs["num-cores"] == 2
