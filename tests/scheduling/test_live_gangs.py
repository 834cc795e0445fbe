"""Gangs and training jobs on the live path, on a fake 4-GPU node: each placed as one unit by the same
policy pass, each job's real child sees exactly its GPUs (CUDA_VISIBLE_DEVICES), and the usage ledger
charges a gang for every GPU it held."""
from __future__ import annotations

from unittest import mock

import pytest

from core.models import UsageCharge
from scheduling import services, tasks
from scheduling.models import GPU, GpuJob, Placement

from .fakes import FakeNvml, fake_gpu, register_gpu_node

RUNTIMES = "tests.scheduling.job_runtimes"


@pytest.fixture
def job_in_this_process():
    """Overrides conftest's seam: the jobs run in the real child."""


@pytest.fixture
def four_gpu_node(db):
    return register_gpu_node("quad", gpus=[fake_gpu() for _ in range(4)])


def test_a_gang_and_a_training_job_are_placed_as_units_and_run_on_their_own_gpus(
        four_gpu_node, model_a, user_owner, predictor, settings, tmp_path, django_capture_on_commit_callbacks):
    settings.SCHEDULING_GPU_SLOTS_DIR = str(tmp_path / "slots")
    settings.SCHEDULING_JOB_RUNTIMES = {"onnxruntime": f"{RUNTIMES}:onnxruntime_on_cpu",
                                        "train:tvm": f"{RUNTIMES}:train_on_cpu"}
    with mock.patch.object(tasks.place_pending, "delay"), \
            mock.patch.object(tasks.run_job, "apply_async") as dispatched:
        gang = services.submit_job(actor=user_owner, model=model_a, batch_size=2, iterations=3, num_gpus=2,
                                   runtime="onnxruntime", duration_estimate_s=600)
        train = services.submit_job(actor=user_owner, model=model_a, batch_size=2, iterations=5, kind="train",
                                    duration_estimate_s=600)
        with django_capture_on_commit_callbacks(execute=True):
            placed = {p.job_id: p for p in services.place_pending_jobs(policy="horus")}
    assert set(placed) == {gang.pk, train.pk}
    assert Placement.objects.filter(job__in=[gang, train]).count() == 2  # one placement (unit) per job
    gang_gpus = placed[gang.pk].gang_gpu_ids
    assert len(gang_gpus) == 2 and placed[gang.pk].gpu_id == gang_gpus[0]
    assert placed[train.pk].gang_gpu_ids == []
    assert set(GPU.objects.filter(pk__in=gang_gpus).values_list("node_id", flat=True)) == {four_gpu_node.pk}
    assert sorted(call.kwargs["queue"] for call in dispatched.call_args_list) == sorted(
        p.queue for p in placed.values())  # each job goes to its lead GPU's worker

    nvml = FakeNvml([fake_gpu() for _ in range(4)])
    with mock.patch.object(tasks.place_pending, "delay"):
        for job in (gang, train):
            services.execute_job(job_id=job.pk, placement_id=placed[job.pk].pk, worker="w", nvml=nvml)
    gang.refresh_from_db()
    train.refresh_from_db()
    assert gang.state == train.state == GpuJob.State.FINISHED, (gang.error, train.error)
    index_of = dict(GPU.objects.values_list("pk", "index"))
    gang_indices = [index_of[g] for g in gang_gpus]
    assert gang.result["isolation"]["gpu_indices"] == gang_indices
    for replica in gang.result["replicas"]:  # every replica's child saw the gang's two GPUs, and only them
        assert replica["child"]["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, gang_indices))
    assert sorted(r["child"]["device_index"] for r in gang.result["replicas"]) == [0, 1]
    assert train.result["kind"] == "train" and train.result["steps"] == 5
    assert train.result["child"]["env"]["CUDA_VISIBLE_DEVICES"] == str(index_of[placed[train.pk].gpu_id])

    for job, n in ((gang, 2), (train, 1)):  # the ledger charges every GPU a job held
        p = Placement.objects.get(job=job)
        charge = UsageCharge.objects.get(idempotency_key=f"gpu_seconds:placement:{p.pk}")
        assert charge.amount == pytest.approx(n * (p.released_at - p.placed_at).total_seconds())
