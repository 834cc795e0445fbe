"""ONNX Clip (ReLU6) under the layout pipeline: TVM's importer emits it as TIR, which ConvertLayout cannot see
through; the convert_layout pass lifts it back to Relax ops so it follows the NHWC conv instead of sitting in a
transpose pair (mobilenet_v2 had 13 such tasks, 39 % of its tuned estimate)."""

import numpy as np
import pytest

from tuning.engine.compile import lift_clip
from tuning.engine.compile import passes as gp
from tuning.engine.compile import pipeline as rp


def conv_relu6_onnx(opset: int, channels: int = 8, size: int = 12, seed: int = 0):
    """conv -> Clip(0, 6) -> conv -> Clip(0, 6); opset >= 11 gives the bounds as inputs, earlier as attributes."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    c = channels
    inits = [numpy_helper.from_array((rng.standard_normal((c, 3, 3, 3)) * 2).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) * 0.5).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1])]

    def relu6(inp, out):
        if opset >= 11:
            nodes.append(helper.make_node("Clip", [inp, "lo", "hi"], [out]))
        else:
            nodes.append(helper.make_node("Clip", [inp], [out], min=0.0, max=6.0))

    if opset >= 11:
        inits += [numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
                  numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
    relu6("c1", "r1")
    nodes.append(helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]))
    relu6("c2", "y")
    graph = helper.make_graph(nodes, "conv_relu6",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, size, size])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _graph_after(model, passes):
    import tvm

    mod = rp.onnx_to_relax(model)
    return tvm.transform.Sequential(gp.inference_passes(passes, stage=gp.GRAPH))(mod)


@pytest.mark.parametrize("opset", [13, 6])
def test_relu6_follows_the_nhwc_conv(opset):
    """After the layout passes only the graph's two edge transposes are left (input to NHWC, output back);
    without the lift each Clip sat between its own pair (6 transposes here)."""
    main = _graph_after(conv_relu6_onnx(opset), gp.LAYOUT)["main"].script()
    assert main.count("R.permute_dims(") == 2, main
    assert "R.call_tir" not in main
    assert main.count("R.maximum(") == 2 and main.count("R.minimum(") == 2


@pytest.mark.parametrize("opset", [13, 6])
def test_layout_pipeline_with_relu6_computes_the_same(opset, cpu_target):
    model = conv_relu6_onnx(opset)
    inputs = rp.random_inputs(model)
    with gp.use_passes(gp.NONE):
        ref, _ = rp.run_and_time(rp.compile_model(model, cpu_target), inputs, cpu_target, number=1, repeat=1,
                                 threads=1)
    with gp.use_passes(gp.LAYOUT):
        out, _ = rp.run_and_time(rp.compile_model(model, cpu_target), inputs, cpu_target, number=1, repeat=1,
                                 threads=1)
    assert 0.0 < ref[0].max() <= 6.0 and ref[0].min() >= 0.0 and (ref[0] == 6.0).any()  # the clip is exercised
    np.testing.assert_allclose(out[0], ref[0], rtol=1e-4, atol=1e-5)


def test_no_transpose_task_is_left_in_mobilenet_v2():
    """The zoo's mobilenet_v2 (17 ReLU6 blocks, Clip from opset 13): 70 transposes before the lift, 2 after."""
    from core.onnx_models import zoo

    assert _graph_after(zoo.mobilenet_v2(), gp.LAYOUT)["main"].script().count("R.permute_dims(") == 2


def test_other_tir_calls_are_left_alone():
    """Only an elementwise max/min of a tensor with a scalar is lifted: a max of two tensors, an add of a scalar
    and a max reading a transposed index stay the importer's call_tir."""
    from tvm import relax, te, topi

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 6, 6), "float32"))
    y = relax.Var("y", relax.TensorType((1, 4, 6, 6), "float32"))
    s = relax.Var("s", relax.TensorType((), "float32"))
    with bb.function("main", [x, y, s]):
        with bb.dataflow():
            a = bb.emit_te(topi.maximum, x, y)
            b = bb.emit_te(topi.add, a, s)
            c = bb.emit_te(lambda t, k: te.compute(t.shape, lambda n, ch, h, w: te.max(t[n, ch, w, h], k())), b, s)
            out = bb.emit_output(c)
        bb.emit_func_output(out)
    mod = bb.get()
    lifted = lift_clip.lift_clip_to_relax_ops()(mod)
    assert lifted["main"].script().count("R.call_tir") == 3
    assert "R.maximum(" not in lifted["main"].script()


def test_the_lift_is_part_of_the_pipeline_identity():
    """Records tuned before the lift (transposed ReLU6 tasks) are not taken for the new pipeline's."""
    assert gp.PIPELINE_VERSION >= 2
    assert gp.pipeline_key(gp.LAYOUT).startswith(f"{gp.PIPELINE_NAME}/{gp.PIPELINE_VERSION}:")
