"""Measuring on remote hosts: built candidates shipped to the hosts' queues, DOPpler-style per queue
(see :class:`DistributedRunner`)."""

from __future__ import annotations

import concurrent.futures
import functools
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import PyRunner, RunnerInput

from tuning.engine.doppler.platform_rule import make_rule
from tuning.engine.doppler.rounds import measure_round
from tuning.engine.doppler.rule import DopRule
from tuning.engine.measuring.cuda_binaries import binaries_beside
from tuning.engine.measuring.measure import MeasureOutcome, _jsonable, make_payload
from tuning.engine.measuring.timer import EvaluatorConfig
from tuning.engine.process.sandbox import read_untrusted_file
from tuning.engine.runners.measure_jobs import (
    answer_search,
    record_candidates,
    INFRASTRUCTURE_ERROR,
    EngineFuture,
    MeasureJob,
    MeasureLedger,
    RoundReport,
    deal_by_capacity,
)

__all__ = ["DistributedRunner", "device_index_from_queue", "read_artifact", "MAX_ARTIFACT_BYTES"]


def device_index_from_queue(name: str) -> int:
    m = re.search(r"gpu(\d+)$", name)
    return int(m.group(1)) if m else 0


def _weighted_error(parts: Sequence[RoundReport]) -> float | None:
    known = [(p.mean_error, p.n_candidates) for p in parts if p.mean_error is not None]
    total = sum(n for _, n in known)
    return sum(e * n for e, n in known) / total if total else None


MAX_ARTIFACT_BYTES = 256 * 1024 * 1024


def read_artifact(path: str) -> bytes:
    """A built candidate's bytes, as this (secret-holding) process ships them: the path came from a
    build worker, so only a regular ELF shared object is read, through no link
    (sandbox.read_untrusted_file)."""
    data = read_untrusted_file(path, max_bytes=MAX_ARTIFACT_BYTES, magic=b"\x7fELF")
    if data is None:
        raise ValueError(f"{os.path.basename(path)!r} is not a built candidate (a regular shared object)")
    return data


@derived_object
class DistributedRunner(PyRunner):
    """Measures built candidates on remote hosts' queues, DOPpler-style per queue.

    ``submit(payload: dict) -> concurrent.futures.Future`` is injected (the platform plugs Celery in:
    ``apply_async(queue=payload["queue"])`` wrapped in a Future); its result is a
    :class:`MeasureOutcome` or its dict. ``device_queue``: one queue name or a list (one per host and
    device, e.g. ``measure.<host>.cpu``, ``measure.<host>.gpu0``).

    Per queue: the host reports its measurement slots (a ``describe`` payload, answered by
    :func:`~.measure.describe_host` on that host), which bound that queue's own
    DOP rule (:class:`~tuning.engine.doppler.rule.DopRule`); each batch is dealt in proportion to the
    queues' current DOPs, and each queue's share is measured as one DOPpler round (:func:`~.rounds.measure_round`) *on that host*:
    at most DOP candidates in flight (each tagged with its slot), a sample re-measured with one in
    flight (the host's serial reference), the error and DOP that host's own. Nothing is queued
    behind a busy host by us (at most DOP in flight), and the remote deadline starts when a worker
    takes a candidate (see ``tuning/distributed.py``); every local wait is bounded too.
    """

    def __init__(
        self,
        submit: Callable[[dict], concurrent.futures.Future],
        device_queue: str | Sequence[str],
        *,
        evaluator: EvaluatorConfig | dict | None = None,
        threads: int | None = None,
        cpu_ids: Sequence[int] | None = None,
        timeout_sec: float = 300.0,
        ledger: MeasureLedger | None = None,
        dop: str | int = "auto",
        queue_slots: dict[str, int] | None = None,
        wait_timeout_sec: float | None = None,
        target_device_type: str | None = None,
        dop_rule: Callable[[int], DopRule] | None = None,
    ) -> None:
        super().__init__()
        self.submit = submit
        self.queues = [device_queue] if isinstance(device_queue, str) else list(device_queue)
        if not self.queues:
            raise ValueError("DistributedRunner needs at least one device queue")
        self.evaluator = EvaluatorConfig.from_any(evaluator)
        self.threads = threads
        self.cpu_ids = list(cpu_ids) if cpu_ids else None
        self.timeout_sec = timeout_sec
        # a candidate's whole local wait: a backstop past the platform's own queue (from submission,
        # 3600 s) and run (from a worker's start, 600 s) timeouts, which fire first in tuning/distributed.py
        self.wait_timeout_sec = float(wait_timeout_sec or timeout_sec + 4800.0)
        self.ledger = ledger or MeasureLedger()
        self.target_device_type = target_device_type
        self.slots = dict(queue_slots) if queue_slots else {q: self._describe_slots(q) for q in self.queues}
        self.rules = {q: make_rule(dop, self.slots[q], dop_rule) for q in self.queues}
        for q, rule in self.rules.items():
            rule.limit_max_dop(self.slots[q])
        self.rule = self.rules[self.queues[0]]  # the session reports the first queue's DOP
        self._validated: dict[str, set[int]] = {q: set() for q in self.queues}
        # one thread per queue: its rounds run in order, the queues side by side
        self._rounds = {
            q: concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"dist-{i}")
            for i, q in enumerate(self.queues)
        }
        self.n_sent = 0
        self.bytes_sent = 0
        self._lock = threading.Lock()
        self._parts: dict[int, list[RoundReport]] = {}

    # ------------------------------------------------------------------ hosts
    def _describe_slots(self, q: str) -> int:
        """The measurement slots the host behind ``q`` reports (1 when it does not answer in time)."""
        try:
            answer = self.submit(
                {
                    "kind": "describe",
                    "queue": q,
                    "threads": self.threads,
                    "device_type": "cuda" if "gpu" in q.rsplit(".", 1)[-1] else "cpu",
                    "device_index": device_index_from_queue(q),
                }
            ).result(timeout=60)
            return max(1, int(answer.get("slots") or 1)) if isinstance(answer, dict) else 1
        except Exception:  # noqa: BLE001 - an old worker, a lost message: measure serially there
            return 1

    def queue_dops(self) -> dict[str, int]:
        return {q: c.dop for q, c in self.rules.items()}

    def queues_of_class(self, device_type: str | None) -> list[str]:
        """Queues whose devices are of the run's target class (``cpu`` or a GPU kind)."""
        if not device_type:
            return list(self.queues)
        gpu = device_type not in ("cpu", "llvm")
        picked = [q for q in self.queues if ("gpu" in q.rsplit(".", 1)[-1]) == gpu]
        return picked or list(self.queues)

    # ------------------------------------------------------------------ one candidate
    def _payload(self, job: MeasureJob, q: str, slot: int) -> dict[str, Any]:
        data = read_artifact(job.path)
        with self._lock:
            self.bytes_sent += len(data)
        payload = make_payload(
            data,
            device_type=job.device_type,
            args_info_json=job.args_info,
            evaluator=self.evaluator,
            threads=self.threads,
            cpu_ids=self.cpu_ids,
            device_index=device_index_from_queue(q),
            queue=q,
            candidate=os.path.basename(os.path.dirname(job.path)),
            kernel_binaries=binaries_beside(job.path) if job.device_type == "cuda" else None,
        )
        payload["slot"] = int(slot)
        return payload

    def _one(self, q: str, job: MeasureJob, slot: int) -> tuple[MeasureOutcome, float | None]:
        t0 = time.perf_counter()
        try:
            payload = self._payload(job, q, slot)
        except (OSError, ValueError) as exc:  # the candidate's, not the queue's: no infrastructure error
            return MeasureOutcome([], f"candidate not shipped: {exc}", q), None
        try:
            remote = self.submit(payload)
            with self._lock:
                self.n_sent += 1
        except Exception as exc:  # noqa: BLE001
            return MeasureOutcome([], f"{INFRASTRUCTURE_ERROR}submit to {q} failed: {exc!r}", q), None
        try:
            out = MeasureOutcome.from_any(remote.result(timeout=self.wait_timeout_sec))
        except concurrent.futures.TimeoutError:
            out = MeasureOutcome([], f"{INFRASTRUCTURE_ERROR}{q}: no answer in {self.wait_timeout_sec:g} s", q)
        except Exception as exc:  # noqa: BLE001
            out = MeasureOutcome([], f"{INFRASTRUCTURE_ERROR}{exc}", q)
        return out, time.perf_counter() - t0

    def _measure_on(self, q: str, jobs: Sequence[MeasureJob], dop: int) -> list[tuple[MeasureOutcome, float | None]]:
        """``rounds.Measure`` for one host: at most ``dop`` candidates in flight, slot k of the host each."""
        dop = max(1, min(int(dop), len(jobs) or 1))
        free: queue.Queue = queue.Queue()
        for k in range(dop):
            free.put(k)

        def one(job):
            slot = free.get()
            try:
                return self._one(q, job, slot)
            finally:
                free.put(slot)

        with concurrent.futures.ThreadPoolExecutor(max_workers=dop, thread_name_prefix="dist-send") as ex:
            return list(ex.map(one, jobs))

    # ------------------------------------------------------------------ rounds
    def _queue_round(self, q: str, rnd: int, jobs: list[MeasureJob]) -> None:
        t0 = time.perf_counter()
        try:
            result = measure_round(
                jobs,
                functools.partial(self._measure_on, q),
                self.rules[q],
                is_serial_config=lambda d: int(d) <= 1,
                validated=self._validated[q],
            )
        except BaseException as exc:  # noqa: BLE001 - never leave futures hanging
            for job in jobs:
                if not job.search_future.done():
                    job.search_future.set_result((None, f"{INFRASTRUCTURE_ERROR}round on {q} failed: {exc!r}"))
            return
        self._validated[q] = result.validated
        record_candidates(self.ledger, jobs, result, rnd, default_worker=q)
        self._add_part(
            rnd,
            RoundReport(
                round_index=rnd,
                dop=result.dop,
                dop_after=result.decision.dop_after,
                mean_error=result.decision.mean_error,
                n_candidates=len(jobs),
                n_remeasured=result.n_remeasured,
                n_failures=result.n_failures,
                wall_secs=time.perf_counter() - t0,
                correction_applied=result.correction_applied,
            ),
        )
        answer_search(jobs, result)

    def _add_part(self, rnd: int, part: RoundReport) -> None:
        """One queue's share of round ``rnd``; the round's report (the DOP chart's point) is the sum
        over its queues: total DOP, candidates, re-measures, failures; error weighted by candidates."""
        with self._lock:
            parts = self._parts.setdefault(rnd, [])
            parts.append(part)
            self.ledger.add_round(
                RoundReport(
                    round_index=rnd,
                    dop=sum(p.dop for p in parts),
                    dop_after=sum(p.dop_after for p in parts),
                    mean_error=_weighted_error(parts),
                    n_candidates=sum(p.n_candidates for p in parts),
                    n_remeasured=sum(p.n_remeasured for p in parts),
                    n_failures=sum(p.n_failures for p in parts),
                    wall_secs=max(p.wall_secs for p in parts),
                    correction_applied=any(p.correction_applied for p in parts),
                )
            )

    def run(self, runner_inputs: list[RunnerInput]) -> list[EngineFuture]:
        rnd = self.ledger.next_round()
        owners = deal_by_capacity(len(runner_inputs), [self.rules[q].dop for q in self.queues])
        jobs = [
            MeasureJob(
                path=str(inp.artifact_path),
                device_type=str(inp.device_type),
                args_info=[_jsonable(a.as_json()) for a in inp.args_info],
                future=concurrent.futures.Future(),
            )
            for inp in runner_inputs
        ]
        for d, q in enumerate(self.queues):
            mine = [j for j, o in zip(jobs, owners) if o == d]
            if mine:
                self._rounds[q].submit(self._queue_round, q, rnd, mine)
        # a bound on the engine's join: every candidate waited for twice (parallel and serially)
        return [EngineFuture(j.search_future, 2 * self.wait_timeout_sec + 60) for j in jobs]

    def measure_serial(self, jobs: Sequence[MeasureJob]) -> list[MeasureOutcome]:
        """Measure ``jobs`` one at a time on one device of the run's target class (the final serial
        re-measure: every finalist on the same device, its serial reference slot 0)."""
        qs = self.queues_of_class(self.target_device_type or (jobs[0].device_type if jobs else None))
        return [self._one(qs[0], job, 0)[0] for job in jobs]

    def shutdown(self) -> None:
        for ex in self._rounds.values():
            ex.shutdown(wait=False, cancel_futures=True)
