"""Training-step GPU jobs (kind ``train``): a real TVM Relax training loop (loss, gradient, optimizer) of an
uploaded ONNX model, submitted through the API/service and run in the job's child. This machine has no CUDA,
so the llvm target stands in for cuda through the same scheduling.train_step program."""
from __future__ import annotations

import datetime as dt
import itertools
from unittest import mock

import numpy as np
import onnx
import pytest
from django.utils import timezone
from onnx import TensorProto, helper, numpy_helper

from core.exceptions import ServiceError
from scheduling import gpu_runtime, services, tasks, train_step
from scheduling.models import GpuJob, Placement
from scheduling.services.jobs import TRAIN_MEMORY_FACTOR

from .fakes import FakeNvml, fake_gpu, register_gpu_node

RUNTIMES = "tests.scheduling.job_runtimes"


def tiny_mlp(outputs: int = 1) -> onnx.ModelProto:
    """x[N,16] -> MatMul/Add/Relu -> MatMul -> y[N,4] (and, with outputs=2, its Relu output too)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 32)) * 0.2).astype("float32"), "w1"),
             numpy_helper.from_array(np.zeros(32, "float32"), "b1"),
             numpy_helper.from_array((rng.standard_normal((32, 4)) * 0.2).astype("float32"), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h2"]), helper.make_node("MatMul", ["h2", "w2"], ["y"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])]
    if outputs == 2:
        outs.append(helper.make_tensor_value_info("h2", TensorProto.FLOAT, ["N", 32]))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                              outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _program(model, optimizer: str, batch: int = 8, lr: float | None = None):
    import tvm

    rebatched = gpu_runtime.rebatch(model.SerializeToString(), batch)
    return train_step.build_training_program(rebatched, gpu_runtime._inputs(rebatched), target={"kind": "llvm"},
                                             device=tvm.cpu(), optimizer=optimizer, lr=lr)


@pytest.mark.parametrize("optimizer,lr", [("adam", 1e-2), ("sgd", 5e-2)])
def test_the_loss_of_a_tiny_mlp_falls_over_its_training_steps(optimizer, lr):
    out = train_step.run_training_steps(_program(tiny_mlp(), optimizer, lr=lr), 30)
    losses = out["losses"]
    assert len(losses) == 30 == len(out["latencies_s"]) and out["data"] == "synthetic"
    assert out["optimizer"] == optimizer and out["learning_rate"] == lr and out["trained_params"] == 3 and out["trained_param_values"] == 16 * 32 + 32 + 32 * 4
    assert losses[-1] < 0.5 * losses[0]
    assert sum(b < a for a, b in itertools.pairwise(losses)) >= 25  # falls step after step, not by luck once


def test_the_loop_stops_when_its_check_says_so():
    program = _program(tiny_mlp(), "sgd")
    calls = []

    def check():
        calls.append(1)
        if len(calls) == 3:
            raise gpu_runtime.JobStopped("stop")

    with pytest.raises(gpu_runtime.JobStopped):
        train_step.run_training_steps(program, 100, check)


def test_a_model_with_two_outputs_is_refused_by_name():
    with pytest.raises(train_step.TrainingUnsupported, match="one output"):
        _program(tiny_mlp(outputs=2), "adam")


def test_an_unknown_optimizer_is_refused():
    with pytest.raises(train_step.TrainingUnsupported, match="optimizer"):
        _program(tiny_mlp(), "lbfgs")


@pytest.fixture
def job_in_this_process():
    """Overrides conftest's seam: jobs here run in the real child."""


@pytest.fixture
def _no_celery():
    with mock.patch.object(tasks.place_pending, "delay"), mock.patch.object(tasks.run_job, "apply_async") as run:
        yield run


def test_the_api_submits_a_training_job_with_its_optimizer_and_a_training_memory_prediction(
        api_owner, model_a, predictor, gpu_node, _no_celery):
    inference = api_owner.post("/api/gpu-jobs/", {"model": model_a.pk, "batch_size": 8}, format="json").json()
    resp = api_owner.post("/api/gpu-jobs/", {"model": model_a.pk, "batch_size": 8, "kind": "train",
                                             "optimizer": "sgd", "learning_rate": 0.01, "iterations": 50},
                           format="json")
    assert resp.status_code == 201, resp.json()
    body = resp.json()
    assert body["kind"] == "train" and body["optimizer"] == "sgd" and body["learning_rate"] == 0.01
    assert body["iterations"] == 50
    assert body["predicted_mem_mb"] == pytest.approx(inference["predicted_mem_mb"] * TRAIN_MEMORY_FACTOR,
                                                     rel=1e-3)
    assert inference["kind"] == "inference"


@pytest.mark.parametrize("body,field", [({"kind": "finetune"}, "kind"), ({"optimizer": "rmsprop"}, "optimizer"),
                                        ({"kind": "train", "runtime": "onnxruntime"}, "runtime"),
                                        ({"kind": "train", "learning_rate": 2.0}, "learning_rate")])
def test_a_bad_training_request_is_a_400_naming_the_field(api_owner, model_a, predictor, body, field):
    before = GpuJob.objects.count()
    resp = api_owner.post("/api/gpu-jobs/", {"model": model_a.pk, "batch_size": 8, **body}, format="json")
    assert resp.status_code == 400 and field in resp.json()["errors"], resp.json()
    assert GpuJob.objects.count() == before
    if field == "runtime":
        with pytest.raises(ServiceError, match="TVM"):
            services.submit_job(actor=model_a.created_by, model=model_a, batch_size=1, kind="train",
                                runtime="onnxruntime")


def test_a_training_job_runs_its_steps_in_the_job_child_and_reports_a_falling_loss(model_a, settings, tmp_path):
    """The real child (not the in-process seam): the job's ONNX is parsed, compiled for training and stepped
    there; the job finishes after its steps (its work), long before its declared duration."""
    settings.SCHEDULING_GPU_SLOTS_DIR = str(tmp_path / "slots")
    settings.SCHEDULING_JOB_RUNTIMES = {"train:tvm": f"{RUNTIMES}:train_on_cpu"}
    gpu = register_gpu_node().gpus.get(index=0)
    job = GpuJob.objects.create(team_id=model_a.team_id, model=model_a, batch_size=2, iterations=12, kind="train",
                                optimizer="adam", duration_estimate_s=600, predicted_util_pct=30,
                                predicted_mem_mb=1000, state="placed")
    p = Placement.objects.create(job=job, gpu=gpu, policy="horus", queue=gpu.queue,
                                 placed_at=timezone.now() - dt.timedelta(seconds=1))
    with mock.patch.object(tasks.place_pending, "delay"):
        services.execute_job(job_id=job.pk, placement_id=p.pk, worker="w", nvml=FakeNvml([fake_gpu()]))
    job.refresh_from_db()
    assert job.state == GpuJob.State.FINISHED, job.error
    r = job.result
    assert r["kind"] == "train" and r["steps"] == 12 and len(r["losses"]) == 12 and r["optimizer"] == "adam"
    assert r["learning_rate"] == train_step.OPTIMIZERS["adam"]
    assert r["loss_last"] < r["loss_first"]
    assert r["child"]["pid"] != __import__("os").getpid()  # it ran in the child
    assert r["child"]["env"]["CUDA_VISIBLE_DEVICES"] == "0"




def test_the_training_step_of_a_cnn_compiles_for_cuda_on_a_host_without_a_gpu():
    """Every kernel of the training module (forward, backward, Adam) gets a GPU schedule: DLight's rule
    that fails on some of them in TVM 0.27 is dropped for those kernels only."""
    from core.onnx_models.zoo import build_model
    from tuning.engine.compile.pipeline import make_target

    rebatched = gpu_runtime.rebatch(build_model("small_cnn").SerializeToString(), 4)
    built = train_step.compile_trainer(rebatched, gpu_runtime._inputs(rebatched),
                                       target=make_target({"kind": "cuda"}), optimizer="adam")
    assert built.executable is not None and len(built.params) == 6
    assert {"backbone_loss_adjoint", "optimizer"} <= {gv.name_hint for gv in built.train_mod.functions}


def test_a_model_with_an_op_relax_cannot_differentiate_is_refused_naming_the_op():
    from core.onnx_models.zoo import build_model

    with pytest.raises(train_step.TrainingUnsupported, match="relax.erf"):  # BERT's exact GELU
        _program(build_model("bert_encoder"), "adam", batch=1)
