"""Helpers for benchmark scripts that tests may share; bench/ never imports tests/.

FakeWorker is a pretend tuning worker: it claims a queued run and feeds tasks, measurements and DOP
rounds through tuning's DatabaseSink, as a Celery worker does, without TVM. The figures it writes are
synthetic (a noisy 1/log improvement curve), made to fill dashboards and API pages with a big run;
bench/dashboard_render.py times pages over it and the dashboard tests drive runs with it.
Needs Django set up (it imports tuning's models and services).
"""
from __future__ import annotations

import math
import random
from types import SimpleNamespace

from django.utils import timezone

from tuning import services as tuning_services
from tuning.models import TuningRun, TuningTask

TASK_NAMES = ["fused_conv2d_add_relu", "fused_conv2d_add", "fused_dense_add", "fused_max_pool2d",
              "fused_conv2d_add_relu_1", "fused_reshape_transpose", "fused_batch_matmul", "fused_softmax",
              "fused_layer_norm", "fused_conv2d_add_relu_2"]


class FakeWorker:
    """Claims a queued run and reports progress as the engine would."""

    def __init__(self, run: TuningRun, *, n_tasks: int = 4, seed: int = 0, worker: str = "fake-worker"):
        self.run_id = run.pk
        self.rng = random.Random(seed)
        self.lease = tuning_services.claim_run(run.pk, worker=worker)
        assert self.lease, f"run {run.pk} could not be claimed (status {run.status})"
        self.sink = tuning_services.DatabaseSink(run.pk, self.lease)
        self.tasks = [SimpleNamespace(index=i, name=TASK_NAMES[i % len(TASK_NAMES)] + (f"_{i}" if i >= 10 else ""),
                                      flops=float(self.rng.randint(2, 400)) * 1e6, weight=float(1 + i % 3))
                      for i in range(n_tasks)]
        self.sink.on_tasks(self.tasks)
        self.round_index = 0
        self.trial = 0
        self.base = {t.index: 1e-4 * (1 + t.index) for t in self.tasks}

    def step(self, n: int, *, dop: int = 2, task_index: int | None = None, failures: int = 0) -> None:
        """One round of `n` measured candidates of one task (round-robin by default)."""
        task = self.tasks[self.round_index % len(self.tasks)] if task_index is None else self.tasks[task_index]
        records = []
        for k in range(n):
            self.trial += 1
            # Latency improves with a noisy 1/log curve, like a real search.
            improve = 1.0 / (1.0 + 0.35 * math.log1p(self.trial / len(self.tasks)))
            latency = self.base[task.index] * improve * self.rng.uniform(0.9, 1.6)
            failed = k < failures
            records.append(SimpleNamespace(
                task_index=task.index, task_name=task.name, round_index=self.round_index,
                candidate_key=f"r{self.round_index}-c{k}-{self.rng.getrandbits(40):010x}",
                run_secs=[] if failed else [latency, latency * 1.01, latency * 0.99],
                latency_s=None if failed else latency,
                build_secs=0.2, run_wall_secs=0.05, error="build failed" if failed else "", worker="fake-worker",
                dop=dop, remeasured_serially=False, serial_secs=None))
        self.sink.on_measurements(records)
        self.sink.on_round(SimpleNamespace(
            round_index=self.round_index, task_index=task.index, dop=dop,
            mean_error=self.rng.uniform(0.005, 0.04), n_candidates=n, n_remeasured=max(1, n // 8),
            n_failures=failures))
        self.round_index += 1

    def preempt(self, task_index: int) -> None:
        TuningTask.objects.filter(run_id=self.run_id, index=task_index).update(status=TuningTask.Status.PREEMPTED)
        TuningRun.objects.filter(pk=self.run_id).touch()  # as the sink does after a task-only write

    def finish(self, *, tuned_latency_s: float = 0.9e-3, untuned_latency_s: float = 2.7e-3) -> None:
        TuningTask.objects.filter(run_id=self.run_id, status=TuningTask.Status.TUNING).update(
            status=TuningTask.Status.DONE)
        TuningRun.objects.filter(pk=self.run_id).update(
            status=TuningRun.Status.SUCCEEDED, finished_at=timezone.now(), lease="", final_dop=2,
            mean_parallel_error=0.018, tuned_latency_s=tuned_latency_s, untuned_latency_s=untuned_latency_s,
            outputs_match=True, max_abs_diff=1e-6, wall_seconds=123.4)
