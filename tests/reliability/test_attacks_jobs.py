"""A hostile team member's pass over the GPU-job features that landed together: training jobs (kind, optimizer,
learning rate, gangs), OOM and interference re-placement, measured profiles fed to the predictor, and the
kube-scheduler extender. One test per hole found (each failed before its fix), then one parametrized test
per attack that already failed safely."""
from __future__ import annotations

import datetime as dt
import json
from unittest import mock

import pytest
from django.test import Client
from django.utils import timezone

from core.models import UsageCharge
from scheduling import services, tasks
from scheduling.models import GpuJob, GpuProfile, Placement
from tests.scheduling.fakes import fake_gpu, make_job, register_gpu_node
from tests.scheduling.test_gpu_job_process import ChildrenNvml

pytestmark = pytest.mark.django_db

HOSTILE = "tests.reliability.hostile_runtimes"
TOKEN = "attack-extender-token"


@pytest.fixture(autouse=True)
def _no_celery(settings, tmp_path):
    settings.SCHEDULING_GPU_SLOTS_DIR = str(tmp_path / "slots")
    settings.SCHEDULING_JOB_KILL_GRACE_S = 1.0
    with mock.patch.object(tasks.place_pending, "delay"), mock.patch.object(tasks.run_job, "apply_async"):
        yield


def _run_in_real_child(model, runtime_fn: str, settings, nvml=None, **job):
    """A one-GPU inference job placed on GPU 1 and run through the REAL job child with a hostile runtime."""
    settings.SCHEDULING_JOB_RUNTIMES = {"onnxruntime": f"{HOSTILE}:{runtime_fn}"}
    gpu = register_gpu_node().gpus.get(index=1)
    j = make_job(model, state="placed", runtime="onnxruntime", iterations=2, estimate=600, **job)
    p = Placement.objects.create(job=j, gpu=gpu, policy="horus", queue=gpu.queue,
                                 placed_at=timezone.now() - dt.timedelta(seconds=1))
    services.execute_job(job_id=j.pk, placement_id=p.pk, worker="w",
                         nvml=nvml or ChildrenNvml([fake_gpu(), fake_gpu()]))
    j.refresh_from_db()
    p.refresh_from_db()
    return j, p


# --- holes ------------------------------------------------------------------------------------------------


def test_another_teams_measured_profiles_are_not_listed(api_other, model_a, api_owner):
    """Was open: GET /api/gpu-profiles/ listed every profile, and a finished job's ``measured:job`` profile
    names its team and model (``team<id>/<model>``), its job, batch size and figures: any user read every
    other team's. Now a team sees its own (and the shared seed / zoo ones); also once the model is gone."""
    record = services.record_profiles  # the write record_measured_profile makes
    from scheduling import adapters

    (row,) = record(records=[adapters.measured_profile_record(
        model=f"team{model_a.team_id}/{model_a.name}", batch_size=8, gpu_model="V100", features={"flops": 1.0},
        util_pct=40.0, peak_mem_mb=900.0, power_w=None, source=GpuProfile.MEASURED_JOB_SOURCE,
        meta={"job": 1})], dl_model=model_a)
    def names(api):
        return {p["model_name"] for p in api.get("/api/gpu-profiles/?page_size=500").json()["results"]}

    assert row.model_name in names(api_owner)
    assert row.model_name not in names(api_other)
    assert api_other.get(f"/api/gpu-profiles/{row.pk}/").status_code == 404
    model_a.delete()  # the profile keeps its figures with dl_model NULL: still not shared
    assert row.model_name not in names(api_other)


def test_a_job_childs_forged_figures_do_not_become_a_measured_profile(model_a, settings):
    """Was open: the profile a finished job leaves for the predictor took its utilization, memory, power
    and GPU model from the job child's JSON answer, and the child runs the team's model: code there could
    teach the predictor that its kind of model needs 1 MB on an A100. Now the profile holds what the
    worker itself sampled of the child's pid (12 %, 345 MB) on the GPU it placed it on (V100)."""
    job, _ = _run_in_real_child(model_a, "forges_its_figures", settings, batch_size=4, mem=2000.0)
    assert job.state == GpuJob.State.FINISHED, job.error
    row = GpuProfile.objects.get(source=GpuProfile.MEASURED_JOB_SOURCE)
    assert (row.util_pct, row.peak_mem_mb, row.gpu_model) == (12.0, 345.0, "V100")
    assert row.power_w is None


def test_nan_in_a_job_childs_answer_fails_the_job_instead_of_leaving_it_running(model_a, settings):
    """Was open: the worker read the child's answer with json.loads, which takes NaN and Infinity; the
    result then failed to save (PostgreSQL's jsonb refuses them), the exception left the job ``running``
    on a GPU it held until a worker restart. Now such an answer is refused: the job fails, the GPU is free."""
    job, placement = _run_in_real_child(model_a, "answers_nan", settings, batch_size=4)
    assert job.state == GpuJob.State.FAILED and "not JSON" in job.error, job.error
    assert placement.released_at is not None


def test_a_job_child_holding_too_much_host_memory_is_stopped(model_a, settings):
    """Was open: the job child has no address-space cap (CUDA forbids one) and nothing else bounded its host
    memory, so a model whose import or training build explodes took the node's memory from the worker and
    its other jobs. Now the worker stops a child over SCHEDULING_JOB_MAX_HOST_MEMORY_MB at its next poll."""
    from tests.reliability.hostile_runtimes import HOARD_MB

    settings.SCHEDULING_JOB_MAX_HOST_MEMORY_MB = HOARD_MB - 200
    job, placement = _run_in_real_child(model_a, "hoards_host_memory", settings, batch_size=1)
    assert job.state == GpuJob.State.FAILED, job.error
    assert "host memory" in job.error and "SCHEDULING_JOB_MAX_HOST_MEMORY_MB" in job.error, job.error
    assert job.replacements == [] and placement.released_at is not None  # not taken for a GPU OOM


def test_a_deeply_nested_extender_body_is_a_400(settings):
    """Was open: json.loads raises RecursionError (not ValueError) on arrays nested past its depth: the
    extender answered 500 with a traceback in the log instead of kube-scheduler's 400 {"Error": ...}."""
    settings.SCHEDULER_EXTENDER_TOKEN = TOKEN
    resp = Client().post("/scheduler/extender/filter", data="[" * 200_000, content_type="application/json",
                         HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert resp.status_code == 400 and "not JSON" in resp.json()["Error"]


def _mlp_with_dead_branch(dead: bool):
    """x[N,16] -> MatMul -> y[N,4]; with ``dead``, also a VGG-sized MatMul/Relu stack on x whose result no
    output reads (valid ONNX; onnxruntime and TVM never run it)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.ones((16, 4), "float32"), "w")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    if dead:
        inits += [numpy_helper.from_array(np.ones((16, 2048), "float32"), "big1"),
                  numpy_helper.from_array(np.ones((2048, 2048), "float32"), "big2")]
        nodes += [helper.make_node("MatMul", ["x", "big1"], ["d1"]), helper.make_node("Relu", ["d1"], ["d2"]),
                  helper.make_node("MatMul", ["d2", "big2"], ["d3"]), helper.make_node("Relu", ["d3"], ["d4"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def test_a_dead_subgraph_does_not_make_a_small_model_look_large_to_the_predictor():
    """Was open: graph features counted every node, also those no output reads, which no runtime runs. A
    team could upload a tiny model carrying a dead copy of a large network: features of the large one,
    measured figures (now the worker's own, real) of the tiny one, and its measured:job profiles teach the
    predictor that large networks are cheap, so other teams' jobs are under-predicted and over-packed.
    Features now count only what the outputs depend on."""
    from core.onnx_models.features import compute_features

    live_only = compute_features(_mlp_with_dead_branch(False), batch_size=8)
    with_dead = compute_features(_mlp_with_dead_branch(True), batch_size=8)
    assert with_dead == live_only


def test_a_training_job_that_diverges_finishes_with_its_result(model_a, settings):
    """Was open: a learning rate the model cannot take (any up to 1.0 is accepted) or weights that overflow
    make the loss Infinity/NaN; the child could not write its answer as JSON and the job failed with
    "ValueError: Out of range float values are not JSON compliant" after spending its GPU time, its result
    lost. Now the steps' non-finite losses are None and counted: the job finishes, saying it diverged."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    from tests.scheduling.test_train_jobs import tiny_mlp

    overflowing = tiny_mlp()
    for init in overflowing.graph.initializer:  # y ~ 1e21, its square past float32
        init.CopyFrom(numpy_helper.from_array(np.full(tuple(init.dims), 1e19, "float32"), init.name))
    with model_a.file.open("wb") as f:
        f.write(overflowing.SerializeToString())
    onnx.checker.check_model(overflowing)
    settings.SCHEDULING_JOB_RUNTIMES = {"train:tvm": "tests.scheduling.job_runtimes:train_on_cpu"}
    gpu = register_gpu_node().gpus.get(index=0)
    job = make_job(model_a, state="placed", kind="train", optimizer="sgd", learning_rate=1.0, iterations=3,
                   estimate=600, batch_size=2)
    p = Placement.objects.create(job=job, gpu=gpu, policy="horus", queue=gpu.queue,
                                 placed_at=timezone.now() - dt.timedelta(seconds=1))
    services.execute_job(job_id=job.pk, placement_id=p.pk, worker="w", nvml=ChildrenNvml([fake_gpu()]))
    job.refresh_from_db()
    assert job.state == GpuJob.State.FINISHED, job.error
    assert job.result["steps"] == 3 and job.result["non_finite_losses"] == 3 and job.result["losses"] == [None] * 3


def _matmuls_in_a_loop(trips: int):
    """x[1,256] -> Loop(trips) { x @ w } -> y: ``trips`` MatMuls of 256x256 that graph features, which do not
    look inside a Loop's body, do not count."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    body = helper.make_graph(
        [helper.make_node("MatMul", ["carry_in", "w"], ["carry_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("carry_in", TensorProto.FLOAT, [1, 256])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("carry_out", TensorProto.FLOAT, [1, 256])])
    inits = [numpy_helper.from_array(np.eye(256, dtype="float32"), "w"),
             numpy_helper.from_array(np.array(trips, dtype="int64"), "trips"),
             numpy_helper.from_array(np.array(True), "cond")]
    graph = helper.make_graph([helper.make_node("Loop", ["trips", "cond", "x"], ["y"], body=body)], "looped",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def test_a_model_hiding_its_work_in_a_loop_leaves_no_measured_profile(model_a):
    """Was open: graph features do not count what a Loop (If, Scan) body does, so a model doing 10^6 MatMuls
    in a Loop has the features of an empty one; its real, heavy measured figures taught the predictor that
    such features need a whole GPU. A model with control flow now leaves no measured:job profile."""
    from core.onnx_models.features import compute_features
    from scheduling.services.replacement import record_measured_profile

    features = compute_features(_matmuls_in_a_loop(10**6))
    assert features.total_flops == 0  # what the predictor would have been taught: nothing to do
    model_a.features, model_a.batch_size = features.to_dict(), 1
    model_a.save()
    job = make_job(model_a, state="finished", batch_size=1)
    observed = {"util_mean_pct": 99.0, "mem_peak_mb": 15000.0, "samples": 60, "gpu_model": "V100",
                "gpu_memory_total_mb": 16384.0}
    assert record_measured_profile(job, observed=observed) is None
    assert not GpuProfile.objects.exists()


class GrandchildNvml(ChildrenNvml):
    """Per-process accounting in which the job child holds little and a process it started holds 6 GB."""

    def _procs(self):
        import os

        import psutil

        me = psutil.Process(os.getpid())
        children = {c.pid for c in me.children()}
        deeper = {c.pid for c in me.children(recursive=True)} - children
        return [(pid, 5, 100.0) for pid in children] + [(pid, 60, 6000.0) for pid in deeper]


def test_gpu_memory_held_by_a_process_the_job_child_started_counts_against_its_share(model_a, settings):
    """Was open: the worker sampled NVML's per-process figures of the child's pid alone; a process the child
    started could hold any GPU memory beyond the job's share (and, without MPS, nothing else stops it),
    taking it from the other jobs on the GPU. The child's descendants now count: the job is stopped over its
    share and placed again with what its processes held."""
    job, placement = _run_in_real_child(model_a, "starts_a_gpu_grandchild", settings, batch_size=1, mem=2000.0,
                                        nvml=GrandchildNvml([fake_gpu(), fake_gpu()]))
    assert job.state == GpuJob.State.PENDING and placement.released_at is not None, job.error
    (entry,) = job.replacements
    assert entry["reason"] == "oom" and entry["measured_mem_mb"] == 6100.0


def _running_on(model, gpu, *, pred: float, live: float, **extra) -> GpuJob:
    job = make_job(model, util=pred, mem=1000.0, state="running", live_util_pct=live, live_mem_mb=900.0,
                   started_at=timezone.now() - dt.timedelta(minutes=5), **extra)
    Placement.objects.create(job=job, gpu=gpu, policy="horus", queue=gpu.queue,
                             placed_at=timezone.now() - dt.timedelta(minutes=5))
    return job


def test_an_under_predicted_job_does_not_get_another_teams_job_restarted(model_a, model_b, team_a, team_b):
    """Was open: the live re-placement rule moved the smallest job whose departure ended a GPU's
    over-subscription. Team B's model hides its work in an ONNX Loop (graph features do not count it), is
    predicted 30 % and runs at 70 %: the GPU, predicted 90 %, measures 120 %, and team A's 20 % job was
    restarted, its work lost and its GPU time charged to team A, up to twice. Now the job measured furthest
    over its prediction is the one moved, and if it cannot move, nobody is."""
    from scheduling.services.execution import finish_job
    from scheduling.services.replacement import replace_job, replacement_request

    g0, _ = register_gpu_node().gpus.order_by("index")
    looped = _running_on(model_b, g0, pred=30.0, live=70.0)
    steady = _running_on(model_a, g0, pred=30.0, live=30.0)
    small = _running_on(model_a, g0, pred=30.0, live=20.0)
    assert services.request_interference_replacements() == [looped.pk]
    looped.refresh_from_db()
    assert replacement_request(looped)["job_measured_util_pct"] == 70.0
    # its worker stops it: the restart's cost (the GPU time its placement held) is team B's, none is team A's
    replace_job(job_id=looped.pk, reason="interference", detail={}, finish=finish_job, predicted_util_pct=70.0)
    charges = UsageCharge.objects.filter(kind="gpu_seconds")
    assert {c.team_id for c in charges} == {team_b.pk} and charges.get().job_id == looped.pk
    for job in (steady, small):
        job.refresh_from_db()
        assert job.state == GpuJob.State.RUNNING and not job.replacements

    # the same job already re-placed twice (the rule's limit): it stays, and team A's jobs stay too
    GpuJob.objects.filter(pk=looped.pk).delete()
    done = [{"status": "done", "reason": "interference"}] * 2
    again = _running_on(model_b, g0, pred=30.0, live=70.0, replacements=done)
    assert services.request_interference_replacements() == []
    for job in (again, steady, small):
        job.refresh_from_db()
        assert replacement_request(job) is None


def test_extender_pods_are_charged_to_their_teams_gpu_hour_quota_and_refused_over_it(model_a, team_a, settings):
    """Was open: a pod bound through the kube-scheduler extender was charged to no quota, and a binding
    counts as load for up to 24 h unless released: a team out of GPU hours (or on any quota) could hold
    GPUs through Kubernetes for free. Now bind reserves the binding TTL per GPU against the team's GPU-hour
    quota (refused with a 429 saying so, before anything is written or bound) and the time held is charged."""
    from core.models import Quota
    from scheduling import selectors
    from scheduling.models import PodBinding
    from tests.scheduling.test_extender_api import FakeApiServer, pod_object

    settings.SCHEDULER_EXTENDER_TOKEN = TOKEN
    register_gpu_node("gpu-b")
    Quota.objects.filter(team=team_a).update(gpu_hours_per_month=30.0)  # one 24 h binding fits, two do not
    headers = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}
    for uid, gpus, status in (("u-first", "1", 200), ("u-second", "1", 429), ("u-gang", "2", 429)):
        pod = pod_object(str(model_a.pk), gpus=gpus, uid=uid)
        with FakeApiServer({("team-a", "resnet-infer-7f9c"): pod}) as api:
            settings.SCHEDULER_EXTENDER_KUBE_API_URL = api.url
            resp = Client().post("/scheduler/extender/bind", content_type="application/json", **headers, data=json.dumps(
                {"PodName": "resnet-infer-7f9c", "PodNamespace": "team-a", "PodUID": uid, "Node": "gpu-b"}))
        assert resp.status_code == status, resp.content
        if status == 429:
            error = resp.json()["Error"]
            assert "Quota 'GPU hours per month' would be exceeded" in error and "team 'team-a'" in error, error
            assert [q["method"] for q in api.requests] == ["GET"]  # nothing annotated, nothing bound
            assert not PodBinding.objects.filter(pod_uid=uid).exists()
    assert selectors.gpu_hours_committed(team_a.pk) == pytest.approx(24.0, abs=0.01)


def _reshape_named(name: str):
    """x[N,16] -> Reshape to [3,5]: valid ONNX that fails when it runs (16 values are not 15), in a node
    whose name the team chose; onnxruntime's error quotes the name."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name=name)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])],
        [numpy_helper.from_array(np.array([3, 5], dtype="int64"), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def test_a_failure_whose_text_says_out_of_memory_is_not_re_placed_as_a_gpu_oom(model_a, settings):
    """Was open: a job failure was taken for a GPU out-of-memory when its text contained "out of memory"
    (the worker's check, and the sandbox's reading of the child's error), and the text is the team's: here
    an ONNX node named "CUDA failure 2: out of memory" whose Reshape fails, which onnxruntime quotes. The
    job was re-placed up to 3 times asking 1.5 x more GPU memory each time (a GPU of its own, for nothing).
    Now only the worker's own NVML figures at failure (the job's process near its share, or the GPU near
    full) make it an OOM: the child held 345 MB of its 2512 MB share, so the job fails with its error."""
    with model_a.file.open("wb") as f:
        f.write(_reshape_named("CUDA failure 2: out of memory").SerializeToString())
    job, placement = _run_in_real_child(model_a, "onnxruntime_on_cpu", settings, batch_size=1, mem=2000.0)
    assert job.state == GpuJob.State.FAILED and job.replacements == [], (job.state, job.replacements)
    assert "Name:'CUDA failure 2: out of memory'" in job.error and "cannot be reshaped" in job.error, job.error
    assert placement.released_at is not None
    assert job.predicted_mem_mb == 2000.0  # asked no more memory


def _as_measured_next_to_each_other(*true_utils: float) -> list[float]:
    """What the worker's per-process NVML figures read for jobs of these standalone utilizations sharing one
    V100, by the project's own telemetry model (``horus.observation``: a job slowed by its partners keeps
    its kernels resident longer, so it reads more than it uses alone; ``horus.interference``: the fitted
    slowdowns)."""
    from scheduling.horus.interference import FittedInterference, stretched_speeds
    from scheduling.horus.observation import per_process_util

    fit = FittedInterference.from_data().params_for("V100")
    speeds = stretched_speeds([u / 100.0 for u in true_utils], fit.capacity, fit.interference)
    return [round(per_process_util(u, 1.0 / s), 1) for u, s in zip(true_utils, speeds)]


@pytest.mark.parametrize("heavy,light", [(70.0, 30.0), (90.0, 10.0), (60.0, 35.0)])
def test_a_job_whose_prediction_held_is_not_restarted_for_sharing_a_gpu_with_a_heavy_one(
        model_a, model_b, heavy, light):
    """Was open: the live rule restarted the job measured furthest over its PREDICTION, but a job's
    per-process figure reads more than its standalone utilization whenever a partner slows it (the
    telemetry model the simulator itself uses), and the lighter job reads the most over. Team B's job,
    predicted exactly (70 %), next to team A's exactly predicted 30 % job: measured 75.7 + 43.3 = 119 %, and
    team A's job was restarted, its work lost, though no prediction was wrong. Now each job is compared with
    what it would read if every prediction on its GPU held (the same model), and only a job over that by
    more than the tolerance is a cause."""
    g0, _ = register_gpu_node().gpus.order_by("index")
    heavy_read, light_read = _as_measured_next_to_each_other(heavy, light)
    assert heavy_read + light_read > 105.0  # the GPU reads over the bound, its predictions within it
    _running_on(model_b, g0, pred=heavy, live=heavy_read)
    victim = _running_on(model_a, g0, pred=light, live=light_read)
    assert services.request_interference_replacements() == []
    victim.refresh_from_db()
    assert not victim.replacements


def _pod_on(gpu, model, *, pred: float):
    from scheduling.models import PodBinding

    now = timezone.now()
    return PodBinding.objects.create(
        pod_uid=f"uid-{model.pk}-{gpu.pk}", pod_namespace=model.team.slug, pod_name="p", gpu=gpu, model=model,
        batch_size=1, num_gpus=1, predicted_util_pct=pred, predicted_mem_mb=1000.0, policy="horus",
        bound_at=now - dt.timedelta(minutes=5), expires_at=now + dt.timedelta(hours=1))


@pytest.mark.parametrize("unmeasured", ["pod", "job-without-figures"])
def test_a_partner_counted_at_its_prediction_does_not_get_a_measured_job_restarted(
        model_a, model_b, unmeasured):
    """Was open: a Kubernetes pod (never measured per process) and a job whose worker has not reported
    per-process figures (still compiling, or a GPU without per-process accounting) count at their
    prediction, so what they really do is unknown, and the GPU's "measured" load is partly a guess. Team B's
    pod predicted 60 % sits idle; team A's job, predicted 30 %, runs at 52 % (alone on the GPU in truth):
    the GPU "measured" 112 % and team A's job was restarted on a GPU that was half idle. (A pod that really
    runs past its prediction makes its partners read high the same way.) Now a GPU with a member counted at
    its prediction moves nobody: its over-subscription cannot be told."""
    g0, _ = register_gpu_node().gpus.order_by("index")
    if unmeasured == "pod":
        _pod_on(g0, model_b, pred=60.0)
    else:
        _running_on(model_b, g0, pred=60.0, live=None)
    victim = _running_on(model_a, g0, pred=30.0, live=52.0)
    assert services.request_interference_replacements() == []
    victim.refresh_from_db()
    assert not victim.replacements


def test_equal_causes_are_told_apart_by_the_lower_job_id_as_a_number():
    """Was open: on a tie the rule took the lowest job id as a STRING ("1000000" < "999999"), not the
    lowest id the documentation promises. Now ids compare as numbers."""
    from scheduling.horus.cluster import ClusterState, ClusterSpec
    from scheduling.horus.live_rule import over_prediction_cause
    from tests.horus.helpers import view

    state = ClusterState(ClusterSpec.uniform(1, 1))
    for job_id in ("1000000", "999999"):
        state.add(view(job_id, util=20.0), [0], true_util=20.0, true_mem=900.0, now=0.0, meas_util=60.0)
    assert over_prediction_cause(state.view().jobs_on(0)).view.job_id == "999999"


def test_a_failure_on_a_gpu_its_partners_filled_is_no_oom_while_the_job_had_room_for_its_share(model_a, settings):
    """Was open: a job's failure was an out-of-memory whenever its GPU was 90 % full at failure, whoever held
    the memory. A job with a 912 MB share holding 345 MB, on a 16 GB GPU its partners had filled to 15000 MB
    (1384 MB free, more than the 567 MB its share still allowed it), failed for its own reason: it was
    re-placed asking 1.5 x its share, up to 3 times, each failed run charged to its team, its real error
    buried in the re-placements. The GPU running out is now evidence only when its free memory was below
    what the job's share still allowed it to take: here the job fails with its error."""
    job, placement = _run_in_real_child(model_a, "runs_a_while_then_raises", settings, batch_size=1, mem=400.0,
                                        nvml=ChildrenNvml([fake_gpu(), fake_gpu(used_mb=15000)]))
    assert job.state == GpuJob.State.FAILED and job.replacements == [], (job.state, job.replacements)
    assert "a plain bug of the team's" in job.error and placement.released_at is not None
    assert job.predicted_mem_mb == 400.0


# --- what held -------------------------------------------------------------------------------------------

HOSTILE_JOB_BODIES = {
    "lr-nan-form": ({"learning_rate": "NaN"}, "learning_rate"),
    "lr-inf-form": ({"learning_rate": "Infinity"}, "learning_rate"),
    "lr-nan-json": ({"learning_rate": float("nan")}, None),  # sent as JSON's NaN constant: the parser refuses it
    "lr-negative": ({"learning_rate": -0.1}, "learning_rate"),
    "lr-huge": ({"learning_rate": 1e308}, "learning_rate"),
    "lr-zero": ({"learning_rate": 0}, "learning_rate"),
    "lr-string": ({"learning_rate": "fast"}, "learning_rate"),
    "steps-huge": ({"iterations": 10**12}, "iterations"),
    "steps-negative": ({"iterations": -5}, "iterations"),
    "gpus-beyond-any-node": ({"num_gpus": 9}, "num_gpus"),
    "gpus-zero": ({"num_gpus": 0}, "num_gpus"),
    "gpus-float": ({"num_gpus": 2.5}, "num_gpus"),
    "optimizer-outside-list": ({"optimizer": "rmsprop"}, "optimizer"),
    "optimizer-unicode": ({"optimizer": "аdam"}, "optimizer"),  # Cyrillic a
    "optimizer-nul": ({"optimizer": "adam\x00"}, "optimizer"),
    "kind-outside-list": ({"kind": "finetune"}, "kind"),
    "duration-tiny": ({"duration_estimate_s": 0.001}, "duration_estimate_s"),
    "duration-nan-form": ({"duration_estimate_s": "nan"}, "duration_estimate_s"),
    "duration-beyond-cap": ({"duration_estimate_s": 10**9}, "duration_estimate_s"),
    "unknown-field": ({"replacements": []}, None),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_JOB_BODIES))
def test_hostile_training_job_values_are_400_and_store_nothing(api_owner, model_a, case):
    extra, field = HOSTILE_JOB_BODIES[case]
    body = {"model": model_a.pk, "batch_size": 8, "kind": "train", **extra}
    form = case.endswith("-form")  # a form-encoded body: 'NaN' reaches float() as text, not as a JSON constant
    if case.endswith("-json"):  # a bare NaN token, which no JSON encoder of a client writes
        resp = api_owner.post("/api/gpu-jobs/", json.dumps(body), content_type="application/json")
    else:
        resp = api_owner.post("/api/gpu-jobs/", body, format="multipart" if form else "json")
    assert resp.status_code == 400, resp.content
    if field is not None:
        assert field in resp.json()["errors"], resp.json()
    assert not GpuJob.objects.exists()


def test_nan_reaching_the_service_directly_is_refused(model_a, user_owner):
    from core.exceptions import ServiceError

    for kwargs in ({"learning_rate": float("nan")}, {"learning_rate": float("inf")},
                   {"duration_estimate_s": float("nan")}, {"num_gpus": True}):
        with pytest.raises(ServiceError):
            services.submit_job(actor=user_owner, model=model_a, batch_size=8, kind="train", place=False, **kwargs)
    assert not GpuJob.objects.exists()


def test_an_oversized_job_body_is_refused_before_anything_is_stored(api_owner, model_a):
    resp = api_owner.post("/api/gpu-jobs/", json.dumps({"model": model_a.pk, "batch_size": 8,
                                                        "kind": "x" * (3 << 20)}), content_type="application/json")
    assert resp.status_code in (400, 413) and not GpuJob.objects.exists()


@pytest.mark.parametrize("who", ["other-team-model", "other-team-job", "viewer"])
def test_another_teams_models_and_jobs_are_out_of_reach(api_other, api_owner, model_a, model_b, user_viewer, who):
    from rest_framework.test import APIClient

    if who == "other-team-model":  # team B names team A's model for a training gang
        resp = api_other.post("/api/gpu-jobs/", {"model": model_a.pk, "batch_size": 8, "kind": "train",
                                                 "num_gpus": 4}, format="json")
        assert resp.status_code == 400 and "model" in resp.json()["errors"]
        assert not GpuJob.objects.exists()
    elif who == "other-team-job":  # team B reads or cancels team A's job by id
        job = make_job(model_a, kind="train")
        assert api_other.get(f"/api/gpu-jobs/{job.pk}/").status_code == 404
        assert api_other.post(f"/api/gpu-jobs/{job.pk}/cancel/").status_code == 404
        job.refresh_from_db()
        assert job.state == GpuJob.State.PENDING
    else:  # a viewer of team A submits a training job
        viewer = APIClient()
        viewer.force_authenticate(user_viewer)
        resp = viewer.post("/api/gpu-jobs/", {"model": model_a.pk, "batch_size": 8, "kind": "train"}, format="json")
        assert resp.status_code in (400, 403) and not GpuJob.objects.exists()


def test_a_gang_is_charged_per_gpu_and_replacements_end_charged(model_a, team_a):
    """A 4-GPU gang held 30 minutes costs 2 GPU-hours, not 0.5; a job re-placed on OOM over and over is
    charged every placement it held and fails after MAX_REPLACEMENTS instead of looping."""
    from core.selectors import quota_usage
    from scheduling.services.execution import finish_job
    from scheduling.services.replacement import MAX_REPLACEMENTS, replace_job

    node = register_gpu_node(gpus=[fake_gpu() for _ in range(4)])
    gpus = list(node.gpus.order_by("index"))
    gang = make_job(model_a, state="running", num_gpus=4, kind="train", started_at=timezone.now())
    Placement.objects.create(job=gang, gpu=gpus[0], policy="horus", queue=gpus[0].queue,
                             gang_gpu_ids=[g.pk for g in gpus], placed_at=timezone.now() - dt.timedelta(minutes=30))
    finish_job(job_id=gang.pk, result={})
    assert quota_usage(team_a.pk).gpu_hours_this_month == pytest.approx(2.0, abs=0.01)

    looping = make_job(model_a, kind="train")
    for _ in range(MAX_REPLACEMENTS + 1):
        looping.refresh_from_db()
        looping.state, looping.started_at = GpuJob.State.RUNNING, timezone.now()
        looping.save()
        Placement.objects.create(job=looping, gpu=gpus[0], policy="horus", queue=gpus[0].queue,
                                 placed_at=timezone.now() - dt.timedelta(minutes=6))
        replace_job(job_id=looping.pk, reason="oom", detail={"measured_mem_mb": 9e9}, finish=finish_job,
                    predicted_mem_mb=9e9)
    looping.refresh_from_db()
    assert looping.state == GpuJob.State.FAILED and "re-placed 3 times" in looping.error
    charged = UsageCharge.objects.filter(kind="gpu_seconds", job_id=looping.pk).count()
    assert charged == MAX_REPLACEMENTS + 1  # every placement it held, the last one too


def test_no_api_writes_a_profile_whose_source_says_measured(api_owner, api_other, model_a):
    for api in (api_owner, api_other):
        body = {"model_name": "resnet50", "batch_size": 8, "gpu_model": "V100", "util_pct": 1,
                "peak_mem_mb": 1, "source": "measured:job", "features": {}}
        assert api.post("/api/gpu-profiles/", body, format="json").status_code == 405
    assert not GpuProfile.objects.exists()


def _pod(model_ref: str, namespace: str = "team-b", **annotations) -> dict:
    return {"Pod": {"metadata": {"name": "p", "namespace": namespace, "uid": "u-1", "annotations": {
        "dlopt.io/model": model_ref, **annotations}}}, "NodeNames": ["gpunode"]}


EXTENDER_ATTACKS = {
    "no-token": (None, "filter", lambda m: _pod(str(m.pk)), 401),
    "wrong-token": ("guess", "filter", lambda m: _pod(str(m.pk)), 401),
    "other-teams-model-by-id": (TOKEN, "prioritize", lambda m: _pod(str(m.pk)), 403),
    "other-teams-model-by-slug": (TOKEN, "prioritize", lambda m: _pod(f"{m.team.slug}/{m.name}"), 403),
    "gpus-beyond-a-node": (TOKEN, "filter", lambda m: _pod(str(m.pk), **{"dlopt.io/gpus": "999"}), 400),
    "batch-float": (TOKEN, "filter", lambda m: _pod(str(m.pk), **{"dlopt.io/batch-size": "1e3"}), 400),
    "model-ref-traversal": (TOKEN, "filter", lambda m: _pod("../../etc/passwd"), 400),
    "body-a-list": (TOKEN, "filter", lambda m: [1, 2], 400),
    "annotations-a-list": (TOKEN, "filter", lambda m: {"Pod": {"metadata": {"annotations": ["dlopt.io/model"]}}, "NodeNames": []},
                           400),
    "bind-forged-uid": (TOKEN, "bind", lambda m: {"PodName": "p", "PodNamespace": "team-b", "PodUID": "x/../y",
                                                  "Node": "gpunode"}, 400),
}


@pytest.mark.parametrize("case", sorted(EXTENDER_ATTACKS))
def test_extender_forgeries_are_refused(settings, model_a, team_b, case):
    """A pod in team B's namespace naming team A's model (by id or slug), forged annotations, malformed
    bodies, no token: refused, and nothing bound."""
    from scheduling.models import PodBinding

    settings.SCHEDULER_EXTENDER_TOKEN = TOKEN
    register_gpu_node()
    token, verb, body, status = EXTENDER_ATTACKS[case]
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    resp = Client().post(f"/scheduler/extender/{verb}", data=json.dumps(body(model_a)),
                         content_type="application/json", **headers)
    assert resp.status_code == status, resp.content
    assert not PodBinding.objects.exists()


def test_a_training_job_declaring_a_tiny_duration_gets_no_steps_beyond_it(model_a, team_a, settings):
    """A training job declaring 1 s (the least) compiles past it in the child (the compile is not
    interruptible), but it is stopped at its declared duration (its first step check, or the wall-clock
    kill at the duration + SCHEDULING_JOB_KILL_GRACE_S while it compiles): no training beyond the declared
    time, and the time its placement held is charged, not the 1 s it reserved."""
    from core.selectors import quota_usage

    settings.SCHEDULING_JOB_RUNTIMES = {"train:tvm": "tests.scheduling.job_runtimes:train_on_cpu"}
    gpu = register_gpu_node().gpus.get(index=0)
    job = make_job(model_a, state="placed", kind="train", iterations=10_000_000, estimate=1.0, batch_size=2)
    p = Placement.objects.create(job=job, gpu=gpu, policy="horus", queue=gpu.queue,
                                 placed_at=timezone.now() - dt.timedelta(seconds=1))
    services.execute_job(job_id=job.pk, placement_id=p.pk, worker="w", nvml=ChildrenNvml([fake_gpu()]))
    job.refresh_from_db()
    p.refresh_from_db()
    assert job.state == GpuJob.State.FAILED and "declared duration" in job.error, job.error
    held_s = (p.released_at - p.placed_at).total_seconds()
    assert held_s > 1.0
    assert quota_usage(team_a.pk).gpu_hours_this_month * 3600 == pytest.approx(held_s, rel=0.01)


class HoldsMostOfItsShareNvml(ChildrenNvml):
    """Per-process accounting in which the job child holds 2270 MB: 90.4 % of the 2512 MB share of a job
    predicted 2000 MB."""

    def _procs(self):
        return [(pid, util, 2270.0 if mem == 345.0 else mem) for pid, util, mem in super()._procs()]


def test_holding_90_percent_of_the_share_then_raising_buys_no_more_than_asking_for_it(model_a, team_a, settings):
    """A job that fills 90 % of its memory share on purpose and then raises any error is taken for a GPU
    out-of-memory (the worker cannot tell an allocation that failed between two samples) and re-placed asking
    1.5 x its share (3768 MB). Is that a risk? It buys nothing a job cannot take openly: going past its share
    gets it stopped and re-placed with whatever it measured using (test_replacement), and memory is not what
    the GPU-hour quota prices. What it costs: the restart's GPU time, charged to its own team only, at most
    MAX_REPLACEMENTS times (then it fails); other teams lose only the packing room its larger prediction
    takes, as with any job that needs that much. One per cent under the line it is just a failure."""
    from scheduling.services.replacement import measured_gpu_oom

    job, placement = _run_in_real_child(model_a, "runs_a_while_then_raises", settings, batch_size=1, mem=2000.0,
                                        nvml=HoldsMostOfItsShareNvml([fake_gpu(), fake_gpu()]))
    assert job.state == GpuJob.State.PENDING and placement.released_at is not None, job.error
    (entry,) = job.replacements
    assert entry["reason"] == "oom" and entry["measured_by"] == "nvml-process" and entry["mem_share_mb"] == 2512.0
    assert job.predicted_mem_mb == pytest.approx(1.5 * 2512.0)
    charges = UsageCharge.objects.filter(kind="gpu_seconds")
    assert charges.exists() and {(c.team_id, c.job_id) for c in charges} == {(team_a.pk, job.pk)}
    assert measured_gpu_oom(process_mem_mb=0.89 * 2512.0, share_mb=2512.0, gpu_mem_used_mb=4000.0,
                            gpu_memory_total_mb=16384.0) is None


def test_a_gang_hiding_its_work_is_never_moved_and_gets_no_partner_restarted(model_a, model_b):
    """Team B's 2-GPU gang hides its work in a Loop (predicted 30 %, runs at 70 % on each GPU) next to team
    A's exactly predicted jobs: a gang cannot be moved, so nobody on its GPUs is restarted. Left as the
    documented cost: team A's jobs run slower (and hold their GPU longer) until the gang ends."""
    g0, g1, _ = register_gpu_node(gpus=[fake_gpu(), fake_gpu(), fake_gpu()]).gpus.order_by("index")
    gang = make_job(model_b, util=30.0, mem=1000.0, state="running", num_gpus=2, live_util_pct=70.0,
                    live_mem_mb=900.0, started_at=timezone.now() - dt.timedelta(minutes=5))
    Placement.objects.create(job=gang, gpu=g0, gang_gpu_ids=[g0.pk, g1.pk], policy="horus", queue=g0.queue,
                             placed_at=timezone.now() - dt.timedelta(minutes=5))
    partners = [_running_on(model_a, g, pred=40.0, live=_as_measured_next_to_each_other(70.0, 40.0)[1])
                for g in (g0, g1)]
    assert services.request_interference_replacements() == []
    for job in partners:
        job.refresh_from_db()
        assert job.state == GpuJob.State.RUNNING and not job.replacements
    GpuJob.objects.filter(pk=gang.pk).update(num_gpus=1)  # the control: a one-GPU cause moves (to the free GPU)
    Placement.objects.filter(job=gang).update(gang_gpu_ids=[])
    assert services.request_interference_replacements() == [gang.pk]
