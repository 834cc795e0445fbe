"""Tests of core.onnx_models: validation codes, hand-computed graph features,
and the model zoo. Plain pytest, no Django. TVM-dependent tests share one
module-scoped import and are few (TVM's first import is the slow part)."""

from __future__ import annotations

import io
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from core.onnx_models import (
    ZOO,
    GraphFeatures,
    OnnxValidationError,
    build_model,
    compute_features,
    list_models,
    validate_onnx_bytes,
    validate_onnx_file,
    validate_onnx_model,
)
from core.onnx_models import validate as validate_mod
from core.onnx_models import zoo

MB = 1024 * 1024


# --------------------------------------------------------------------------- helpers


def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="test")
    m.ir_version = 8
    return m


def _tiny_net(batch=1) -> onnx.ModelProto:
    """Conv(3->8, k3, pad 1, bias) on Bx3x32x32 -> Relu -> Flatten -> Gemm(8192->10)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(np.zeros(8, np.float32), "b"),
        numpy_helper.from_array((rng.standard_normal((10, 8192)) * 0.01).astype(np.float32), "fw"),
        numpy_helper.from_array(np.zeros(10, np.float32), "fb"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
        inits,
    )


def _relu_model(shape) -> onnx.ModelProto:
    return _model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
    )


def _code(data: bytes, filename="model.onnx", **kw) -> str:
    kw.setdefault("max_bytes", 200 * MB)
    kw.setdefault("count_tasks", False)
    with pytest.raises(OnnxValidationError) as ei:
        validate_onnx_bytes(data, filename=filename, **kw)
    assert ei.value.message and str(ei.value) == ei.value.message
    return ei.value.code


@pytest.fixture(scope="module")
def zoo_models() -> dict[str, onnx.ModelProto]:
    return {name: build_model(name) for name in list_models()}


@pytest.fixture(scope="module")
def relax_pipeline():
    """The tuning engine's TVM bridge (imports TVM once for the module)."""
    return pytest.importorskip("tuning.engine.compile.pipeline")


# --------------------------------------------------------------------------- features


# Hand-computed numbers for _tiny_net at batch 1 (multiply-add = 2 FLOPs):
#   Conv : 8*32*32 = 8192 outputs x 27 MACs x 2 = 442,368, + 8,192 bias adds = 450,560
#   Relu : 8,192
#   Gemm : 2 x 8192 x 10 = 163,840, + 10 bias adds = 163,850
TINY_FLOPS = 450_560 + 8_192 + 163_850  # 622,602
TINY_PARAMS = 8 * 3 * 3 * 3 + 8 + 10 * 8192 + 10  # 82,154
TINY_ACT_BYTES = 4 * (8192 + 8192 + 8192 + 10)  # conv, relu, flatten, gemm outputs


def test_features_hand_computed():
    f = compute_features(_tiny_net())
    assert f.total_flops == TINY_FLOPS
    assert f.param_count == TINY_PARAMS
    assert f.activation_bytes == TINY_ACT_BYTES
    assert (f.conv_count, f.linear_count, f.activation_count, f.other_count) == (1, 1, 1, 1)
    assert f.op_histogram == {"Conv": 1, "Flatten": 1, "Gemm": 1, "Relu": 1}
    assert f.batch_size == 1


def test_features_scale_with_batch_size():
    base = compute_features(_tiny_net())
    for b in (2, 7):
        f = compute_features(_tiny_net(), batch_size=b)
        assert f.batch_size == b
        assert f.total_flops == b * TINY_FLOPS
        assert f.activation_bytes == b * TINY_ACT_BYTES
        assert f.param_count == TINY_PARAMS  # weights do not grow with the batch
        assert f.op_histogram == base.op_histogram
    # Rebatching a model that was built at another batch gives the same answer.
    assert compute_features(_tiny_net(batch=4), batch_size=1) == base


def test_features_rebatch_refuses_hard_coded_batch():
    m = _model(
        [helper.make_node("Reshape", ["x", "s"], ["f"]), helper.make_node("Gemm", ["f", "w"], ["y"], transB=1)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(np.array([1, -1], np.int64), "s"),
         numpy_helper.from_array(np.ones((10, 48), np.float32), "w")],
    )
    assert compute_features(m).total_flops == 2 * 48 * 10
    with pytest.raises(ValueError, match="hard-codes its batch"):
        compute_features(m, batch_size=4)


def test_features_zoo_rebatch_is_linear(zoo_models):
    for name in ("resnet18", "bert_encoder", "lstm_lm"):
        f1 = compute_features(zoo_models[name])
        f8 = compute_features(zoo_models[name], batch_size=8)
        assert f8.total_flops == 8 * f1.total_flops, name
        assert f8.activation_bytes == 8 * f1.activation_bytes, name
        assert f8.param_count == f1.param_count
        assert f8 == compute_features(ZOO[name].build(batch_size=8))  # rebatch == build at 8


def test_features_matmul_and_lstm_hand_computed():
    # Batched MatMul [2,3,4] x [4,5]: 2*3*5 outputs x 4 MACs x 2 = 240.
    m = _model(
        [helper.make_node("MatMul", ["a", "w"], ["y"])],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 5])],
        [numpy_helper.from_array(np.ones((4, 5), np.float32), "w")],
    )
    f = compute_features(m)
    assert (f.total_flops, f.param_count, f.linear_count) == (240, 20, 1)

    # LSTM: T=5 steps, B=2, input 3, hidden 4, with bias. Per step:
    #   gate matmuls 2 * B * 4H * (I + H) = 2*2*16*7 = 448; biases 2 * B * 4H = 64;
    #   cell elementwise 9 * B * H = 72  -> 584; x 5 steps = 2,920.
    t, b, i, h = 5, 2, 3, 4
    lstm = _model(
        [helper.make_node("LSTM", ["x", "W", "R", "B"], ["y"], hidden_size=h)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [t, b, i])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [t, 1, b, h])],
        [
            numpy_helper.from_array(np.ones((1, 4 * h, i), np.float32), "W"),
            numpy_helper.from_array(np.ones((1, 4 * h, h), np.float32), "R"),
            numpy_helper.from_array(np.ones((1, 8 * h), np.float32), "B"),
        ],
    )
    f = compute_features(lstm)
    assert f.total_flops == 5 * (448 + 64 + 72)
    assert f.param_count == 4 * h * i + 4 * h * h + 8 * h
    assert f.linear_count == t  # a recurrent cell counts once per time step (Horus)
    assert f.op_histogram == {"LSTM": 1}


def test_features_lstm_native_vs_unrolled_agree():
    native = compute_features(zoo.lstm_lm(recurrence="onnx"))
    unrolled = compute_features(zoo.lstm_lm())
    # embedding + 32 LSTM steps + output projection, either way
    assert native.linear_count == unrolled.linear_count == 1 + zoo.LSTM_SEQ + 1
    assert native.param_count - unrolled.param_count == 4 * zoo.LSTM_HIDDEN  # second bias
    assert abs(native.total_flops - unrolled.total_flops) / native.total_flops < 0.02


def test_features_dict_round_trip():
    f = compute_features(_tiny_net())
    d = json.loads(json.dumps(f.to_dict()))
    assert GraphFeatures.from_dict(d) == f
    assert GraphFeatures.from_dict({**d, "future_field": 1}) == f
    assert hash(GraphFeatures.from_dict(d)) == hash(f)


def test_features_scalar_constants_are_not_params():
    # Clip bounds are rank-0 hyper-parameters; BN running stats are buffers.
    m = build_model("mobilenet_v2")
    f = compute_features(m)
    assert f.param_count == 3_504_872  # torchvision's figure exactly


# --------------------------------------------------------------------------- zoo


EXPECTED_PARAMS = {
    "small_cnn": 87_018,
    "resnet18": 11_689_512,  # torchvision resnet18
    "mobilenet_v2": 3_504_872,  # torchvision mobilenet_v2
    "vgg11": 9_750_922,  # CIFAR head (ImageNet VGG-11: 132.9 M, documented)
    "bert_encoder": 7_087_872,  # one HuggingFace BertLayer (base)
    "lstm_lm": 779_240,
}
EXPECTED_GFLOPS = {  # (low, high)
    "small_cnn": (0.005, 0.02),
    "resnet18": (3.5, 3.8),  # 1.82 GMACs
    "mobilenet_v2": (0.58, 0.66),  # 0.30 GMACs
    "vgg11": (0.28, 0.33),
    "bert_encoder": (1.8, 1.95),
    "lstm_lm": (0.03, 0.06),
}


def test_zoo_registry():
    assert list_models() == ["small_cnn", "resnet18", "mobilenet_v2", "vgg11", "bert_encoder", "lstm_lm"]
    for name, entry in ZOO.items():
        assert entry.name == name and len(entry.description) > 40
    with pytest.raises(KeyError, match="resnet18"):
        build_model("resnet1000")
    m = build_model("small_cnn", batch_size=3, seed=1)
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 3
    # Seeded: same seed, same bytes; another seed, other weights.
    assert build_model("small_cnn").SerializeToString() == build_model("small_cnn").SerializeToString()
    assert build_model("small_cnn", seed=1).SerializeToString() != build_model("small_cnn").SerializeToString()


@pytest.mark.parametrize("name", list(EXPECTED_PARAMS))
def test_zoo_model_checks_runs_and_counts(name, zoo_models):
    import onnxruntime as ort

    m = zoo_models[name]
    onnx.checker.check_model(m, full_check=True)
    assert m.producer_name == "dlopt-zoo"
    assert [o.version for o in m.opset_import if o.domain == ""] == [17]
    f = compute_features(m)
    assert f.param_count == EXPECTED_PARAMS[name]
    lo, hi = EXPECTED_GFLOPS[name]
    assert lo <= f.total_flops / 1e9 <= hi
    assert m.ByteSize() < 60 * MB

    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {}
    for inp in sess.get_inputs():
        if inp.type == "tensor(int64)":
            feeds[inp.name] = rng.integers(0, zoo.LSTM_VOCAB, inp.shape).astype(np.int64)
        else:
            feeds[inp.name] = rng.standard_normal(inp.shape).astype(np.float32)
    (out,) = sess.run(None, feeds)
    expected = [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim]
    assert list(out.shape) == expected
    assert np.isfinite(out).all()


def test_zoo_lstm_unrolled_matches_onnx_lstm():
    import onnxruntime as ort

    ids = np.random.default_rng(1).integers(0, zoo.LSTM_VOCAB, (2, zoo.LSTM_SEQ)).astype(np.int64)
    outs = [
        ort.InferenceSession(zoo.lstm_lm(batch_size=2, recurrence=r).SerializeToString()).run(
            None, {"input_ids": ids}
        )[0]
        for r in ("unrolled", "onnx")
    ]
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_zoo_models_import_into_tvm_relax(zoo_models, relax_pipeline):
    import tvm

    for name, m in zoo_models.items():
        mod = relax_pipeline.onnx_to_relax(m)
        assert isinstance(mod, tvm.IRModule) and "main" in [gv.name_hint for gv in mod.get_global_vars()], name


# --------------------------------------------------------------------------- validation: good


def test_validate_good_model_counts_tasks(relax_pipeline):
    """The tuning engine's counter, passed in (core.onnx_models imports no other engine)."""
    data = build_model("small_cnn").SerializeToString()
    v = validate_onnx_bytes(data, filename="Small.ONNX", max_bytes=MB, task_counter=relax_pipeline.count_tuning_tasks)
    assert (v.opset, v.ir_version, v.batch_size) == (17, 8, 1)
    assert v.producer.startswith("dlopt-zoo")
    assert v.inputs == [{"name": "input", "shape": [1, 3, 32, 32], "dtype": "float32"}]
    assert v.outputs == [{"name": "logits", "shape": [1, 10], "dtype": "float32"}]
    assert v.features == compute_features(build_model("small_cnn"))
    assert v.num_tuning_tasks == len(v.task_names) and 3 <= v.num_tuning_tasks <= 8
    assert any("conv2d" in t for t in v.task_names)
    json.dumps(v.to_dict())


def test_validate_symbolic_batch_is_set_to_one(tmp_path):
    m = _tiny_net()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    m.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "N"
    path = tmp_path / "dyn.onnx"
    path.write_bytes(m.SerializeToString())
    v = validate_onnx_file(path, max_bytes=MB, count_tasks=False)
    assert v.inputs[0]["shape"] == [1, 3, 32, 32] and v.outputs[0]["shape"] == [1, 10]
    assert v.model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1
    assert v.features.total_flops == TINY_FLOPS
    # A file object (e.g. a Django UploadedFile) works too.
    v2 = validate_onnx_file(io.BytesIO(path.read_bytes()), filename="dyn.onnx", max_bytes=MB, count_tasks=False)
    assert v2.features == v.features


def test_validate_onnx_model_does_not_mutate_input():
    m = _tiny_net()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    v = validate_onnx_model(m, count_tasks=False)
    assert v.batch_size == 1
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"


# --------------------------------------------------------------------------- validation: bad


def test_bad_extension():
    assert _code(b"whatever", filename="model.pt") == "bad_extension"
    assert _code(b"whatever", filename="") == "bad_extension"


def test_too_large_and_empty(tmp_path):
    data = _tiny_net().SerializeToString()
    assert _code(data, max_bytes=1000) == "too_large"
    assert _code(b"") == "empty"
    path = tmp_path / "big.onnx"
    path.write_bytes(data)
    with pytest.raises(OnnxValidationError) as ei:  # refused from stat(), before reading
        validate_onnx_file(path, max_bytes=1000, count_tasks=False)
    assert ei.value.code == "too_large"

    class Stream(io.RawIOBase):  # size unknown up front: the bounded read stops it
        def __init__(self):
            self.left = 50 * MB

        def readable(self):
            return True

        def read(self, n=-1):
            n = min(self.left, n if n and n > 0 else self.left)
            self.left -= n
            return b"\0" * n

    with pytest.raises(OnnxValidationError) as ei:
        validate_onnx_file(Stream(), filename="s.onnx", max_bytes=MB, count_tasks=False)
    assert ei.value.code == "too_large"


def test_not_protobuf():
    assert _code(b"this is definitely not an onnx model\n" * 10) == "not_protobuf"
    assert _code(bytes(range(256)) * 4) == "not_protobuf"
    with pytest.raises(OnnxValidationError, match="PyTorch") as ei:
        validate_onnx_bytes(b"PK\x03\x04" + b"\x00" * 200, filename="m.onnx", max_bytes=MB, count_tasks=False)
    assert ei.value.code == "not_protobuf"
    # Valid protobuf of another message type decodes but has no graph.
    assert _code(helper.make_tensor("t", TensorProto.FLOAT, [2], [1.0, 2.0]).SerializeToString()) == "not_protobuf"


def test_truncated():
    data = build_model("small_cnn").SerializeToString()
    for cut in (len(data) // 2, len(data) - 5, 200):
        assert _code(data[:cut]) == "truncated", cut


def test_missing_input_shape():
    m = _relu_model(["N", 3, "H", "W"])
    with pytest.raises(OnnxValidationError) as ei:
        validate_onnx_bytes(m.SerializeToString(), filename="m.onnx", max_bytes=MB, count_tasks=False)
    assert ei.value.code == "missing_input_shape"
    assert "'x'" in ei.value.message and "H" in ei.value.message and "W" in ei.value.message
    no_shape = _model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    assert _code(no_shape.SerializeToString()) == "missing_input_shape"


def test_absurd_dimensions():
    assert _code(_relu_model([1, 3, 2_000_000]).SerializeToString()) == "absurd_dimension"
    assert _code(_relu_model([1, 0, 8]).SerializeToString()) == "absurd_dimension"
    assert _code(_relu_model([1, 3, 5000]).SerializeToString(), max_dim=4096) == "absurd_dimension"
    # An intermediate blown up by Expand is caught after shape inference.
    m = _model(
        [helper.make_node("Expand", ["x", "s"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 50_000_000])],
        [numpy_helper.from_array(np.array([1, 50_000_000], np.int64), "s")],
    )
    assert _code(m.SerializeToString()) == "absurd_dimension"


def test_unsupported_op():
    m = zoo.lstm_lm(recurrence="onnx")  # a real LSTM: valid ONNX, no TVM Relax converter
    with pytest.raises(OnnxValidationError) as ei:
        validate_onnx_bytes(m.SerializeToString(), filename="lm.onnx", max_bytes=20 * MB, count_tasks=False)
    assert ei.value.code == "unsupported_op"
    assert "LSTM" in ei.value.message
    assert validate_mod.unsupported_ops(m) == ["LSTM"]


def test_external_data():
    from onnx.external_data_helper import set_external_data

    m = _tiny_net()
    # A hostile reference: validation must refuse it without ever opening the path.
    w = m.graph.initializer[0]
    set_external_data(w, location="../../etc/passwd", offset=0, length=864)
    w.data_location = TensorProto.EXTERNAL
    w.ClearField("raw_data")
    with pytest.raises(OnnxValidationError) as ei:
        validate_onnx_bytes(m.SerializeToString(), filename="m.onnx", max_bytes=MB, count_tasks=False)
    assert ei.value.code == "external_data" and "(w)" in ei.value.message


def test_checker_and_shape_inference_failures():
    dangling = _model(
        [helper.make_node("Relu", ["nowhere"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    assert _code(dangling.SerializeToString()) == "checker_failed"
    mismatched = _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        [numpy_helper.from_array(np.ones((4, 5), np.float32), "w")],
    )
    assert _code(mismatched.SerializeToString()) == "shape_inference_failed"


def test_too_many_flops():
    data = _tiny_net().SerializeToString()
    assert _code(data, max_gflops=0.0005) == "too_many_flops"
    assert validate_onnx_bytes(data, filename="m.onnx", max_bytes=MB, max_gflops=0.001, count_tasks=False)


def test_tvm_import_failure_is_reported(monkeypatch, relax_pipeline):
    """A task counter that fails: validation tells a model TVM cannot import from one whose task
    extraction failed later, by importing it into Relax itself."""
    import tvm.relax.frontend.onnx as tvm_onnx

    def boom(*a, **k):
        raise RuntimeError("converter exploded")

    data = _tiny_net().SerializeToString()
    with pytest.raises(OnnxValidationError) as ei:
        validate_onnx_bytes(data, filename="m.onnx", max_bytes=MB, task_counter=boom)
    assert ei.value.code == "tvm_import_failed" and "could not extract its tuning tasks" in ei.value.message
    assert "converter exploded" in ei.value.message
    monkeypatch.setattr(tvm_onnx, "from_onnx", boom)
    with pytest.raises(OnnxValidationError) as ei:
        validate_onnx_bytes(data, filename="m.onnx", max_bytes=MB, task_counter=boom)
    assert ei.value.code == "tvm_import_failed" and "TVM could not import the model: converter exploded" in \
        ei.value.message


def test_without_a_task_counter_still_imports_into_tvm(monkeypatch, relax_pipeline):
    """No ``task_counter``: tasks are not counted (None), TVM still checks the import, and the tuning engine
    is never imported (it is made unimportable here)."""
    import sys

    monkeypatch.setitem(sys.modules, "tuning.engine.compile.pipeline", None)  # import fails
    v = validate_onnx_bytes(_tiny_net().SerializeToString(), filename="m.onnx", max_bytes=MB)
    assert v.num_tuning_tasks is None and v.task_names == []


def test_without_tvm_the_op_snapshot_is_used(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tvm.relax.frontend.onnx", None)
    assert validate_mod.supported_ops() >= {"Conv", "Gemm", "Constant", "If"}
    assert validate_mod.unsupported_ops(zoo.lstm_lm(recurrence="onnx")) == ["LSTM"]


def test_op_snapshot_matches_installed_tvm(relax_pipeline):
    from tvm.relax.frontend.onnx import onnx_frontend

    assert frozenset(onnx_frontend._get_convert_map()) == validate_mod._TVM_SUPPORTED_OPS_SNAPSHOT


def test_error_object():
    err = OnnxValidationError("too_large", "Too big.")
    assert isinstance(err, ValueError) and str(err) == "Too big." and err.code == "too_large"
    assert err.to_dict() == {"code": "too_large", "message": "Too big."}
