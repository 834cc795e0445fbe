"""bench/ort_per_op.py: onnxruntime's layer nodes matched to the tuned tasks that compute the same layer, on
hand-made profiler events and on a real small_cnn (onnxruntime's profiler, TVM's task extraction)."""

import json

import pytest

from bench import ort_per_op as op
from core.onnx_models.zoo import build_model
from tuning.engine.compile import passes as gp
from tuning.engine.compile.pipeline import make_target
from tuning.engine.compile.workloads import collect_tasks

TARGET = {"kind": "llvm", "num-cores": 2}


def _event(name, dur, op_name, inputs=None, outputs=None):
    args = {"op_name": op_name}
    if inputs is not None:
        args["input_type_shape"] = [{"float": s} for s in inputs]
    if outputs is not None:
        args["output_type_shape"] = [{"float": s} for s in outputs]
    return {"cat": "Node", "name": f"{name}_kernel_time", "dur": dur, "args": args}


def test_node_times_are_medians_after_the_warm_ups_with_shapes_from_any_run():
    events = [
        _event("conv", 900, "Conv"),  # a warm-up: slow, and without shapes
        {"cat": "Session", "name": "model_run", "dur": 5000},
        _event("conv", 100, "Conv", [[1, 16, 8, 8], [32, 16, 3, 3], [32]], [[1, 32, 8, 8]]),
        _event("conv", 140, "Conv"),
        _event("conv", 120, "Conv"),
        _event("pool", 7, "MaxPool", [[1, 32, 8, 8]], [[1, 32, 4, 4]]),
        {"cat": "Node", "name": "conv_fence_before", "dur": 1},  # not a kernel
    ]
    rows = {r["node"]: r for r in op.ort_node_times(events, warmup=1)}
    assert set(rows) == {"conv", "pool"}
    assert rows["conv"]["us"] == 120 and rows["conv"]["runs"] == 3
    assert rows["conv"]["weight"] == [32, 16, 3, 3] and rows["conv"]["output"] == [1, 32, 8, 8]
    assert rows["pool"]["weight"] is None  # one input: no weight


def test_layers_match_by_weight_and_output_dimensions_whatever_the_layout():
    ort_rows = [  # onnxruntime's NCHW(c) shapes
        {"node": "a", "op": "Conv", "weight": [32, 16, 3, 3], "output": [1, 32, 8, 8], "us": 100.0},
        {"node": "b", "op": "Conv", "weight": [32, 16, 3, 3], "output": [1, 32, 8, 8], "us": 110.0},
        {"node": "c", "op": "Conv", "weight": [24, 16, 1, 1], "output": [1, 32, 8, 8], "us": 30.0},  # padded: no task
        {"node": "d", "op": "Gemm", "weight": [10, 2048], "output": [1, 10], "us": 5.0},
        {"node": "e", "op": "ReorderOutput", "weight": None, "output": [1, 32, 8, 8], "us": 3.0},
    ]
    tasks = {  # the tasks' NHWC / OHWI buffers, inputs then output
        "fused_conv2d_add_relu": [(1, 8, 8, 16), (32, 3, 3, 16), (32,), (1, 8, 8, 32)],
        "fused_conv2d_add_add_relu": [(1, 8, 8, 16), (32, 3, 3, 16), (32,), (1, 8, 8, 32), (1, 8, 8, 32)],
        # the same element counts as the convolutions' (4,608 and 2,048), other dimensions: not their layer
        "fused_conv2d_lookalike": [(1, 8, 8, 32), (4608,), (1, 64, 32)],
        "fused_matmul_add": [(1, 2048), (2048, 10), (10,), (1, 10)],
        "transpose": [(1, 3, 8, 8), (1, 8, 8, 3)],
    }
    shapes = {name: ([op._dims(s) for s in bufs[:-1]], op._dims(bufs[-1])) for name, bufs in tasks.items()}
    in_model = {"fused_conv2d_add_relu": 150.0, "fused_conv2d_add_add_relu": 90.0, "fused_matmul_add": 4.0,
                "fused_conv2d_lookalike": 5.0, "transpose": 2.0, "vm.builtin.alloc_storage": 1.0}
    table = op.layer_table(ort_rows, shapes, in_model)
    by_op = {x["op"]: x for x in table["layers"]}
    conv = by_op["Conv"]
    assert conv["ort_nodes"] == 2 and conv["ort_us"] == 210.0
    assert conv["tasks"] == ["fused_conv2d_add_add_relu", "fused_conv2d_add_relu"] and conv["tvm_us"] == 240.0
    assert conv["tvm_vs_ort"] == pytest.approx(240 / 210)
    assert by_op["Gemm"]["tasks"] == ["fused_matmul_add"] and by_op["Gemm"]["tvm_vs_ort"] == pytest.approx(0.8)
    assert table["rest"] == {"ort_unmatched_layer_ops_us": 30.0, "ort_other_us": 3.0, "tvm_other_us": 8.0}
    # the sides' totals are the parts' sums: nothing counted twice, nothing dropped
    assert table["ort_total_us"] == pytest.approx(table["layers_ort_us"] + 33.0) == pytest.approx(248.0)
    assert table["tvm_total_us"] == pytest.approx(table["layers_tvm_us"] + 8.0) == pytest.approx(252.0)


def test_a_convolution_whose_channels_the_blocked_layout_padded_finds_its_layer():
    # mobilenet_v2's 1x1 conv 96 -> 24 channels at 56x56, as onnxruntime's NCHWc (block 16) runs it: 24 -> 32
    ort_rows = [{"node": "bn5_nchwc", "op": "Conv", "weight": [32, 96, 1, 1], "output": [1, 32, 56, 56], "us": 181.0}]
    shapes = {"fused_conv2d5_add4": ([op._dims((1, 56, 56, 96)), op._dims((24, 1, 1, 96))],
                                     op._dims((1, 56, 56, 24)))}
    table = op.layer_table(ort_rows, shapes, {"fused_conv2d5_add4": 129.0})
    (layer,) = table["layers"]
    assert layer["tasks"] == ["fused_conv2d5_add4"] and layer["true_channels"] == (24, 96)
    assert table["rest"]["ort_unmatched_layer_ops_us"] == 0
    assert (24, 96) in [true for true, _, _ in op.unpadded([32, 96, 1, 1], [1, 32, 56, 56])]
    assert all(true != (32, 96) for true, _, _ in op.unpadded([32, 96, 1, 1], [1, 32, 56, 56]))
    # a depthwise convolution (one input channel a group) keeps its 1; 33 is no block multiple: nothing to undo
    assert op.unpadded([33, 1, 3, 3], [1, 33, 7, 7]) == []
    assert [true for true, _, _ in op.unpadded([32, 1, 3, 3], [1, 32, 7, 7])] == [(c, 1) for c in range(17, 32)]
    # one block size for both counts: 32 <- 20 needs blocks of 16, 24 <- 20 blocks of 8; no host runs both
    assert (20, 20) not in [true for true, _, _ in op.unpadded([32, 24, 1, 1], [1, 32, 7, 7])]
    assert (20, 24) in [true for true, _, _ in op.unpadded([32, 24, 1, 1], [1, 32, 7, 7])]


def test_a_node_two_readings_of_the_padding_fit_or_whose_tasks_another_layer_took_stays_unmatched():
    shapes = {  # 32 output channels may be 24 or 28 (blocks of 8 or 16 / 16): a task for each reading
        "conv_24": ([op._dims((1, 7, 7, 16)), op._dims((24, 1, 1, 16))], op._dims((1, 7, 7, 24))),
        "conv_28": ([op._dims((1, 7, 7, 16)), op._dims((28, 1, 1, 16))], op._dims((1, 7, 7, 28))),
        # one task whose buffers hold two onnxruntime layers' weights: it counts in the first layer only
        "conv_two": ([op._dims((1, 5, 5, 8)), op._dims((8, 3, 3, 8)), op._dims((8, 5, 5, 8))],
                     op._dims((1, 5, 5, 8))),
    }
    ort_rows = [
        {"node": "p", "op": "Conv", "weight": [32, 16, 1, 1], "output": [1, 32, 7, 7], "us": 11.0},
        {"node": "a", "op": "Conv", "weight": [8, 8, 3, 3], "output": [1, 8, 5, 5], "us": 5.0},
        {"node": "b", "op": "Conv", "weight": [8, 8, 5, 5], "output": [1, 8, 5, 5], "us": 7.0},
    ]
    table = op.layer_table(ort_rows, shapes, {"conv_24": 1.0, "conv_28": 1.0, "conv_two": 4.0})
    (layer,) = table["layers"]
    assert layer["ort_us"] == 5.0 and layer["tasks"] == ["conv_two"] and layer["tvm_us"] == 4.0
    assert table["rest"]["ort_unmatched_layer_ops_us"] == 11.0 + 7.0
    assert table["ort_total_us"] == pytest.approx(table["layers_ort_us"] + 18.0)
    assert table["tasks_not_profiled"] == []
    # a matched task the bench's profile has no row of is named, not silently 0 us
    assert op.layer_table(ort_rows[1:2], shapes, {})["tasks_not_profiled"] == ["conv_two"]


def test_every_layer_of_small_cnn_matches_its_tuning_task():
    model = build_model("small_cnn")
    with gp.use_passes(None):  # the CPU default pipeline (NHWC convolutions, weights prepacked)
        tasks = collect_tasks(model, make_target(TARGET))
    ort_rows = op.profile_ort(model, threads=1, runs=2)
    layer_ops = [r for r in ort_rows if r["op"] in op.LAYER_OPS]
    assert layer_ops and all(r["runs"] == 2 and r["us"] > 0 for r in ort_rows)
    in_model = {t.name: 1.0 for t in tasks}
    table = op.layer_table(ort_rows, op.task_shapes(tasks), in_model)
    assert table["rest"]["ort_unmatched_layer_ops_us"] == 0  # every Conv and Gemm found its task
    assert sum(x["ort_nodes"] for x in table["layers"]) == len(layer_ops)
    # each of small_cnn's convolution and matmul tasks is one matched layer's, and nothing else is
    layer_tasks = sorted(t.name for t in tasks if "conv2d" in t.name or "matmul" in t.name)
    assert layer_tasks and sorted(t for x in table["layers"] for t in x["tasks"]) == layer_tasks
    assert table["tasks_not_profiled"] == []


def test_the_cli_refuses_a_result_without_profiles(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"models": [{"model": "small_cnn", "jobs": {"mcpu": {"target": TARGET}}}]}))
    with pytest.raises(SystemExit):
        op.main([str(path)])
    assert "no job row with a profile" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        op.main([str(tmp_path / "missing.json")])
    assert "cannot read" in capsys.readouterr().err
