"""DistributedRunner: DOP per queue from each host's slots, error sampled per host, finalists
re-measured on a device of the run's target class, bounded in-flight work per host (fake hosts)."""

import concurrent.futures
import threading
import time

import pytest

from tuning.engine.runners.distributed import DistributedRunner
from tuning.engine.runners.measure_jobs import MeasureJob, deal_by_capacity


class FakeHosts:
    """Each queue is a host with ``slots`` slots; a noisy host runs candidates 1.5x slower whenever
    more than one of them is in flight on it (contention), a quiet one does not."""

    def __init__(self, slots: dict[str, int], noisy: set[str]):
        self.slots, self.noisy = slots, noisy
        self.in_flight = {q: 0 for q in slots}
        self.max_in_flight = {q: 0 for q in slots}
        self.measured = {q: 0 for q in slots}
        self.lock = threading.Lock()
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=16)

    def submit(self, payload):
        q = payload["queue"]
        if payload.get("kind") == "describe":
            f = concurrent.futures.Future()
            f.set_result({"kind": "describe", "slots": self.slots[q]})
            return f
        return self.pool.submit(self._measure, q, payload)

    def _measure(self, q, payload):
        with self.lock:
            self.in_flight[q] += 1
            self.max_in_flight[q] = max(self.max_in_flight[q], self.in_flight[q])
            crowded = self.in_flight[q] > 1
        time.sleep(0.01)
        base = 1e-3 * (1 + int(payload["candidate"][1:]) % 7)
        lat = base * (1.5 if crowded and q in self.noisy else 1.0)
        with self.lock:
            self.in_flight[q] -= 1
            self.measured[q] += 1
        return {"run_secs": [lat, lat], "error": None, "worker": q}


def _inputs(tmp_path, n, device_type="cpu", start=0):
    from tvm.s_tir.meta_schedule.arg_info import TensorInfo
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    out = []
    for i in range(start, start + n):
        d = tmp_path / f"c{i}"
        d.mkdir(exist_ok=True)
        (d / "mod.so").write_bytes(b"\x7fELF so")
        out.append(RunnerInput(str(d / "mod.so"), device_type, [TensorInfo("float32", [1])]))
    return out


def test_deal_by_capacity_is_proportional_and_interleaved():
    assert deal_by_capacity(6, [2, 1]) == [0, 1, 0, 0, 1, 0]
    owners = deal_by_capacity(40, [4, 1, 3])
    assert [owners.count(i) for i in range(3)] == [20, 5, 15]
    assert deal_by_capacity(3, [1]) == [0, 0, 0]


def test_dop_per_host_from_its_slots_and_its_own_error(tmp_path):
    hosts = FakeHosts({"measure.quiet.cpu": 4, "measure.noisy.cpu": 4}, noisy={"measure.noisy.cpu"})
    runner = DistributedRunner(hosts.submit, list(hosts.slots), threads=1)
    try:
        assert runner.slots == {"measure.quiet.cpu": 4, "measure.noisy.cpu": 4}  # reported by each host
        start = 0
        for _ in range(4):
            futs = runner.run(_inputs(tmp_path, 24, start=start))
            start += 24
            assert all(f.result().error_msg is None for f in futs)
        dops = runner.queue_dops()
        assert dops["measure.quiet.cpu"] == 4  # no error there: grows to the host's slots
        assert dops["measure.noisy.cpu"] < 4  # ~33 % error there: backs off, on that host only
        noisy = runner.rules["measure.noisy.cpu"].history
        assert any(h.mean_error and h.mean_error > 0.05 for h in noisy)  # its error, sampled there
        assert all(h.mean_error in (None, 0.0) for h in runner.rules["measure.quiet.cpu"].history)
        # one DOP-chart point per round, over both hosts: total DOP and every candidate
        last = runner.ledger.rounds[3]
        assert last.n_candidates == 24 and last.dop == sum(h[3].dop for h in
                                                            (runner.rules[q].history for q in hosts.slots))
        # never more in flight on a host than its DOP allows (nothing waits in a backed-up queue of ours)
        assert all(hosts.max_in_flight[q] <= hosts.slots[q] for q in hosts.slots)
    finally:
        runner.shutdown()


def test_a_host_that_does_not_describe_itself_measures_serially(tmp_path):
    def submit(payload):
        f = concurrent.futures.Future()
        if payload.get("kind") == "describe":
            f.set_exception(RuntimeError("old worker"))
        else:
            f.set_result({"run_secs": [1e-3], "error": None, "worker": "x"})
        return f

    runner = DistributedRunner(submit, "measure.old.cpu")
    try:
        assert runner.slots == {"measure.old.cpu": 1}
        assert all(f.result().error_msg is None for f in runner.run(_inputs(tmp_path, 3)))
        assert runner.queue_dops() == {"measure.old.cpu": 1}
    finally:
        runner.shutdown()


def test_finalists_are_remeasured_on_a_device_of_the_target_class(tmp_path):
    hosts = FakeHosts({"measure.g.gpu0": 2, "measure.c.cpu": 2}, noisy=set())
    runner = DistributedRunner(hosts.submit, list(hosts.slots), target_device_type="cpu")
    try:
        jobs = [MeasureJob(path=inp.artifact_path, device_type="cpu", args_info=[["TENSOR", "float32", [1]]])
                for inp in _inputs(tmp_path, 3)]
        outs = runner.measure_serial(jobs)
        assert [o.worker for o in outs] == ["measure.c.cpu"] * 3  # not queues[0], a GPU queue
        assert hosts.measured == {"measure.g.gpu0": 0, "measure.c.cpu": 3}
    finally:
        runner.shutdown()


def test_a_lost_measurement_is_an_infrastructure_error_not_a_hang(tmp_path):
    def submit(payload):
        f = concurrent.futures.Future()
        if payload.get("kind") == "describe":
            f.set_result({"slots": 1})
        return f  # a measurement nobody ever answers

    runner = DistributedRunner(submit, "measure.lost.cpu", wait_timeout_sec=0.2)
    try:
        (res,) = [f.result() for f in runner.run(_inputs(tmp_path, 1))]
        assert res.run_secs is None and res.error_msg.startswith("infrastructure: ")
    finally:
        runner.shutdown()


@pytest.mark.parametrize("threads", [1, 2])
def test_describe_host_reports_cpu_slots(threads):
    from tuning.engine.measuring.measure import describe_host
    from tuning.engine.measuring.slots import cpu_slots

    d = describe_host(threads, "cpu")
    assert d["slots"] == len(cpu_slots(threads)) and d["threads"] == min(threads, d["threads"])
