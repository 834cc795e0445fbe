"""Inference graph passes: BatchNorm folding on a tiny conv+bn net, pass selection by name, and the one
pipeline (extraction, tuned and untuned compilation) running the selected passes."""

import numpy as np
import pytest

from tuning.engine.compile import passes as gp
from tuning.engine.compile import pipeline as rp


def conv_bn_onnx(channels: int = 8, size: int = 16, seed: int = 0):
    """conv(no bias)-bn-relu-conv(no bias)-bn-relu, PyTorch's conv-before-BN layout."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    c = channels
    inits = [numpy_helper.from_array((rng.standard_normal((c, 3, 3, 3)) * 0.2).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) * 0.2).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1])]

    def bn(inp, out, k):
        stats = {"g": 1 + 0.1 * rng.standard_normal(c), "b": 0.1 * rng.standard_normal(c),
                 "m": 0.1 * rng.standard_normal(c), "v": 1 + 0.1 * np.abs(rng.standard_normal(c))}
        inits.extend(numpy_helper.from_array(v.astype(np.float32), f"{n}{k}") for n, v in stats.items())
        nodes.append(helper.make_node("BatchNormalization", [inp] + [f"{n}{k}" for n in stats], [out], epsilon=1e-5))

    bn("c1", "n1", 1)
    nodes.append(helper.make_node("Relu", ["n1"], ["r1"]))
    nodes.append(helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]))
    bn("c2", "n2", 2)
    nodes.append(helper.make_node("Relu", ["n2"], ["y"]))
    graph = helper.make_graph(nodes, "conv_bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, size, size])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def model():
    return conv_bn_onnx()


def _ops(mod) -> set[str]:
    from tvm import relax

    names = set()
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(
                func, lambda e: names.add(e.op.name) if isinstance(e, relax.Call) and hasattr(e.op, "name") else None)
    return names


def test_fold_batchnorm_removes_bn_and_its_epilogue(model, cpu_target):
    mod = rp.onnx_to_relax(model)
    folded = gp.optimize_for_inference(mod, ["fold_batchnorm"])
    assert "relax.nn.batch_norm" in _ops(mod)
    assert "relax.nn.batch_norm" not in _ops(folded)
    with gp.use_passes(gp.NONE):  # the pipeline would fold them itself
        before = rp.task_summary(mod, cpu_target)
        after = rp.task_summary(folded, cpu_target)
    # prepare_for_tuning decomposes an unfolded BN into subtract/divide/multiply/add and fuses
    # them into the conv task; folded, each conv task carries one bias add
    assert any("divide" in n for n in before["names"])
    assert not any("divide" in n or "subtract" in n for n in after["names"])
    assert after["n_tasks"] <= before["n_tasks"]
    assert all("conv2d" in n and n.endswith("add_relu") or "conv2d" not in n for n in after["names"])


def test_folded_model_computes_the_same(model, cpu_target):
    inputs = rp.random_inputs(model)
    mod = rp.onnx_to_relax(model)
    with gp.use_passes(gp.NONE):
        ref, _ = rp.run_and_time(rp.compile_model(mod, cpu_target), inputs, cpu_target, number=1, repeat=1, threads=1)
    for passes in (gp.DEFAULT, gp.PASS_ORDER):
        with gp.use_passes(passes):
            out, _ = rp.run_and_time(rp.compile_model(mod, cpu_target), inputs, cpu_target, number=1, repeat=1,
                                     threads=1)
        np.testing.assert_allclose(out[0], ref[0], rtol=1e-4, atol=1e-5)


def test_the_pipeline_runs_the_selected_passes_for_extraction(model, cpu_target):
    """The pipeline folds BatchNorm itself: tasks extracted from the raw import carry no BN epilogue,
    exactly as the tasks of the module the compiler builds (same workloads, so records apply)."""
    assert gp.selected_passes() == gp.DEFAULT
    names = rp.task_summary(model, cpu_target)["names"]
    assert not any("divide" in n or "subtract" in n for n in names)
    with gp.use_passes(gp.NONE):
        assert any("divide" in n for n in rp.task_summary(model, cpu_target)["names"])
    assert gp.selected_passes() == gp.DEFAULT  # restored after the block


def test_layout_rewrite_marks_weights_layout_free(model, cpu_target):
    with gp.use_passes(["fold_batchnorm", "layout_rewrite"]):
        tasks = rp.extract_tasks(model, cpu_target)
    convs = [t for t in tasks if "conv2d" in t.task_name]
    assert convs and all(t.dispatched[0]["main"].attrs.get("layout_free_buffers") is not None for t in convs)


def test_pass_selection_by_name():
    assert gp.normalize_passes(None) == gp.DEFAULT
    assert gp.normalize_passes("none") == () and gp.normalize_passes([]) == ()
    # canonical order whatever the order asked
    assert gp.normalize_passes("eliminate_common_subexpr,fold_batchnorm") == ("fold_batchnorm", "eliminate_common_subexpr")
    version = f"{gp.PIPELINE_NAME}/{gp.PIPELINE_VERSION}"
    assert gp.pipeline_key([]) == f"{version}:none"
    assert gp.pipeline_key(["eliminate_common_subexpr", "fold_batchnorm"]) == \
        f"{version}:fold_batchnorm+eliminate_common_subexpr"
    assert gp.pipeline_key() == gp.pipeline_key(gp.DEFAULT)
    with gp.use_passes("none"):
        assert gp.pipeline_key() == f"{version}:none"
    with pytest.raises(ValueError, match="unknown graph pass"):
        gp.normalize_passes(["fold_everything"])
    with pytest.raises(ValueError, match="stage must be"):
        gp.inference_passes(stage="later")


@pytest.mark.parametrize("target", [None, {"kind": "llvm", "mcpu": "znver4"}, '{"kind": "llvm"}', "llvm -mcpu=x"])
def test_cpu_targets_get_the_layout_passes(target):
    assert gp.default_passes(target) == gp.selected_passes(target) == gp.LAYOUT
    assert gp.pipeline_key(target=target).endswith(":fold_batchnorm+convert_layout+layout_rewrite")


@pytest.mark.parametrize("target", [{"kind": "cuda", "arch": "sm_90"}, '{"kind": "cuda"}', "cuda -arch=sm_80"])
def test_cuda_targets_keep_the_v1_pipeline_until_it_is_measured_on_a_gpu(target):
    assert gp.default_passes(target) == gp.selected_passes(target) == gp.GPU_DEFAULT == gp.SHIPPED_V1
    assert gp.pipeline_key(target=target) != gp.pipeline_key(target={"kind": "llvm"})
    graph = [p.info.name for p in gp.inference_passes(stage=gp.GRAPH, target=target)]
    assert graph == ["FoldBatchnormToConv2D", "FoldConstant"]
    assert gp.inference_passes(stage=gp.TASKS, target=target) == []  # no layout-free weights marked
    with gp.use_passes(gp.LAYOUT):  # an ablation's explicit choice holds for every target
        assert gp.selected_passes(target) == gp.LAYOUT
    assert gp.selected_passes(target) == gp.SHIPPED_V1
    with gp.use_passes(None):
        assert gp.selected_passes(target) == gp.SHIPPED_V1 and gp.selected_passes() == gp.LAYOUT


def test_the_pipeline_selects_the_passes_for_its_target():
    """The pipeline hands its target to the pass selection: a CUDA build converts no layout."""
    import tvm

    def names(target):
        return [p.info.name for p in rp._fuse_passes(tvm.target.Target(target))]

    cpu, cuda = names({"kind": "llvm"}), names({"kind": "cuda", "arch": "sm_80", "host": {"kind": "llvm"}})
    assert "ConvertLayout" in cpu and "AttachAttrLayoutFreeBuffers" in cpu
    assert "ConvertLayout" not in cuda and "AttachAttrLayoutFreeBuffers" not in cuda
    assert "FoldBatchnormToConv2D" in cpu and "FoldBatchnormToConv2D" in cuda


def test_a_pipeline_key_reads_in_words():
    version = f"{gp.PIPELINE_NAME}/{gp.PIPELINE_VERSION}"
    assert gp.describe_pipeline(gp.pipeline_key(gp.LAYOUT)) == (
        f"BatchNorm folded into the convs; convs in NHWC; weights pre-packed for their schedules ({version})")
    assert gp.describe_pipeline(gp.pipeline_key([])) == f"no graph passes ({version})"
    assert all(gp.PASS_WORDS[name] for name in gp.PASS_ORDER)  # every pass has its words
    # a key stored by another version names a pass this one does not know as it is
    assert gp.describe_pipeline("dlopt-relax/9:fold_batchnorm+fuse_more") == (
        "BatchNorm folded into the convs; fuse_more (dlopt-relax/9)")


def test_no_pass_returns_the_module_unchanged(model):
    mod = rp.onnx_to_relax(model)
    assert gp.optimize_for_inference(mod, gp.NONE) is mod


# --------------------------------------------------------------------------- data layout (the LAYOUT ablation)
LAYOUT_SELECTIONS = (
    gp.SHIPPED_V1,
    ("fold_batchnorm", "layout_rewrite"),
    ("fold_batchnorm", "convert_layout"),
    ("fold_batchnorm", "convert_layout", "layout_rewrite"),
)


def _conv_input_shapes(model, target) -> list[tuple[int, ...]]:
    """Shape of every buffer of the conv tasks' PrimFuncs."""
    import re

    shapes = []
    for task in rp.extract_tasks(model, target):
        if "conv2d" in task.task_name:
            script = re.sub(r"T\.int(?:32|64)\((\d+)\)", r"\1", task.dispatched[0]["main"].script())
            for dims in re.findall(r"T\.Buffer\(\(([\d, ]+)\)", script):
                shapes.append(tuple(int(d) for d in dims.split(",") if d.strip()))
    return shapes


def test_convert_layout_is_a_named_graph_pass_after_fold_batchnorm():
    assert gp.PASS_ORDER.index("fold_batchnorm") < gp.PASS_ORDER.index("convert_layout")
    assert gp.inference_passes(["convert_layout"], gp.GRAPH)
    assert gp.inference_passes(["convert_layout"], gp.TASKS) == []
    assert gp.inference_passes(["convert_layout"], gp.TUNED) == []
    # the CPU default since the quiet 30-minute rows (graph_passes' docstring); CUDA keeps v1 until measured
    assert gp.LAYOUT == ("fold_batchnorm", "convert_layout", "layout_rewrite")
    assert gp.DEFAULT == gp.LAYOUT
    assert gp.pipeline_key(gp.LAYOUT) == f"{gp.PIPELINE_NAME}/{gp.PIPELINE_VERSION}:fold_batchnorm+convert_layout+layout_rewrite"


def test_every_layout_pass_selection_has_its_own_pipeline_key():
    keys = {gp.pipeline_key(p) for p in LAYOUT_SELECTIONS}
    assert len(keys) == len(LAYOUT_SELECTIONS)
    assert gp.pipeline_key(gp.SHIPPED_V1) != gp.pipeline_key(gp.SHIPPED_V1 + ("convert_layout",))


def test_convert_layout_gives_nhwc_conv_tasks(model, cpu_target):
    with gp.use_passes(gp.SHIPPED_V1):
        nchw = _conv_input_shapes(model, cpu_target)
    with gp.use_passes(["fold_batchnorm", "convert_layout"]):
        nhwc = _conv_input_shapes(model, cpu_target)
    assert (1, 3, 16, 16) in nchw and (1, 16, 16, 3) not in nchw
    assert (1, 16, 16, 3) in nhwc and (1, 3, 16, 16) not in nhwc
    assert (8, 3, 3, 3) in nhwc  # OHWI weight of the first conv (O=8, I=3)


def test_layout_passes_compute_the_same(model, cpu_target):
    """Untuned builds under every layout selection give the outputs of the pipeline without passes (the
    executable keeps its NCHW interface: the transposes sit inside it)."""
    inputs = rp.random_inputs(model)
    with gp.use_passes(gp.NONE):
        ref, _ = rp.run_and_time(rp.compile_model(model, cpu_target), inputs, cpu_target, number=1, repeat=1, threads=1)
    for passes in LAYOUT_SELECTIONS:
        with gp.use_passes(passes):
            out, _ = rp.run_and_time(rp.compile_model(model, cpu_target), inputs, cpu_target, number=1, repeat=1,
                                     threads=1)
        assert out[0].shape == ref[0].shape
        np.testing.assert_allclose(out[0], ref[0], rtol=1e-4, atol=1e-5, err_msg=str(passes))


def test_records_of_one_pipeline_match_no_task_of_another(model, cpu_target):
    """TVM's database finds a record by its task's workload hash: a conv record tuned under the shipped pipeline
    (NCHW) has a hash no conv task of the layout pipeline (NHWC) has, so it is never applied there; and the
    pipeline keys, part of the cache and result identity, differ too."""
    from tuning.engine.records.publish import task_workloads

    def conv_hashes(passes):
        with gp.use_passes(passes):
            return {w["workload_hash"] for w in task_workloads(model, cpu_target) if "conv2d" in w["name"]}

    v1, v2 = conv_hashes(gp.SHIPPED_V1), conv_hashes(gp.LAYOUT)
    assert v1 and v2 and not (v1 & v2)


def _layout_rewritten_schedule(mod, target):
    """A conv task's first design space with every CPU postproc applied, as MetaSchedule measures it."""
    from tvm.s_tir import meta_schedule as ms

    ctx = ms.TuneContext(mod=mod, target=rp.make_target(target), space_generator="post-order-apply",
                         num_threads=1).clone()
    postprocs = ctx.space_generator.postprocs
    sch = ctx.space_generator.generate_design_space(ctx.mod)[0]
    for postproc in postprocs:
        assert postproc.apply(sch), type(postproc).__name__
    return sch, postprocs


def test_cpu_tuning_applies_rewrite_layout_to_layout_free_weights(model, cpu_target):
    """The space generator the engine tunes with (post-order-apply, search._tune_contexts) carries TVM's
    RewriteLayout postproc on CPU targets, and with layout_rewrite selected it rewrites the conv weights:
    the scheduled module reads them through a layout-rewrite preprocessing block."""
    with gp.use_passes(gp.LAYOUT):
        task = next(t for t in rp.extract_tasks(model, cpu_target) if "conv2d" in t.task_name)
    sch, postprocs = _layout_rewritten_schedule(task.dispatched[0], cpu_target)
    assert any(type(p).__name__ == "RewriteLayout" for p in postprocs)
    assert "layout_rewrite_preproc" in sch.mod.script()
    assert "transform_layout" in str(sch.trace)


def test_a_layout_rewritten_candidate_survives_the_journal(model, cpu_target, tmp_path):
    """A candidate whose trace carries RewriteLayout's IndexMap is journaled and committed back under the
    key the sink gave it (TuningRecord.as_json() refuses the IndexMap: the journal must not use it)."""
    from tvm.s_tir import meta_schedule as ms

    from tuning.engine.workdir import StreamJournal, commit_streamed, open_json_db, records_by_task
    from tuning.engine.events import candidate_key
    from tuning.engine.compile.workloads import collect_tasks

    target = rp.make_target(cpu_target)
    with gp.use_passes(gp.LAYOUT):
        tasks = collect_tasks(model, target)
    i = next(k for k, t in enumerate(tasks) if "conv2d" in t.name)
    sch, _ = _layout_rewritten_schedule(tasks[i].mod, cpu_target)
    cand = ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_prim_func(tasks[i].mod["main"]))
    StreamJournal(str(tmp_path), [t.mod for t in tasks]).record([(i, 0, cand, [1e-3])])
    db = open_json_db(str(tmp_path))
    assert commit_streamed(str(tmp_path), db, tasks, target) == 1
    (rec,) = records_by_task(db, tasks)[i]
    assert candidate_key(tasks[i].name, rec.trace) == candidate_key(tasks[i].name, sch.trace)
    assert commit_streamed(str(tmp_path), db, tasks, target) == 0  # known by its key: not committed twice


def _transform_layout_trace(index_map_text: str) -> list:
    return [[["GetSBlock", [], ['"conv"', '"main"'], ["b0"]],
             ["TransformLayout", ["b0", index_map_text], [2, 0, None, False], []]], []]


@pytest.fixture(scope="module")
def index_map_text():
    import tvm
    from tvm.tirx import IndexMap

    return tvm.ir.save_json(IndexMap.from_func(lambda o, i: [o // 4, i, o % 4]))


def test_a_layout_rewritten_trace_passes_the_record_check(index_map_text):
    """RewriteLayout's records (IndexMap as TVM's JSON graph text) are imported and seeded like any other."""
    from tuning.engine.records.check import check_trace_json

    check_trace_json(_transform_layout_trace(index_map_text))


@pytest.mark.parametrize("tamper, message", [
    (lambda g: g["nodes"].append({"type": "ffi.Function", "data": "x"}), "is not index arithmetic"),
    (lambda g: g["nodes"].append({"type": "ffi.String", "data": "/etc/passwd"}), "not a plain name"),
    (lambda g: g["nodes"].append({"type": "ffi.Array", "data": [10 ** 6]}), "outside the graph"),
    (lambda g: g.update(root_index=0), "root is not an IndexMap"),
    (lambda g: g.update(b64ndarrays=["AAAA"]), "not a JSON graph"),
    (lambda g: g["nodes"].append({"type": "ir.Var", "data": {"span": 0, "body": 1}}), "unknown fields"),
])
def test_a_tampered_index_map_is_refused(index_map_text, tamper, message):
    import json

    from tuning.engine.records.check import check_trace_json

    graph = json.loads(index_map_text)
    tamper(graph)
    with pytest.raises(ValueError, match=message):
        check_trace_json(_transform_layout_trace(json.dumps(graph)))
    with pytest.raises(ValueError, match="not finite JSON"):
        check_trace_json(_transform_layout_trace("{not json"))
