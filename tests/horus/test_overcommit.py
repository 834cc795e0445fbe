"""Overcommit at equal terms: a baseline given usage_fgd's reservation rule holds exactly what usage_fgd
would hold; the fill's sharing figures judge the interference bound on TRUE utilizations; replays report
the slowdown's tail."""

from __future__ import annotations

import pytest

from scheduling.horus.cluster import ClusterSpec, ClusterState, JobView, NodeSpec
from scheduling.horus.fill import BOUND_MIN_SPEED, Fill, sharing_stats
from scheduling.horus.overcommit import with_reservation
from scheduling.horus.reference_policies import BestFitRef
from scheduling.horus.traces import Job
from scheduling.horus.usage_fgd import UsageFGD

from .helpers import job, put


def node(name: str, gpus: int = 2) -> NodeSpec:
    return NodeSpec(name, gpus, "V100", 16384.0, 32000, 262144)


def test_reservation_rule_is_usage_fgds_own():
    spec = ClusterSpec((node("n0"),), "hand-made", enforce_milli=True)
    cv = ClusterState(spec).view()
    wrapped = with_reservation(BestFitRef())
    assert wrapped.name == "best_fit_ref+reserve"
    for util, milli in ((12.0, 1000), (60.0, 1000), (90.0, 500), (0.5, 1000)):
        v = JobView("p", 0.0, 1, milli, util, 1000.0, 4000, 8192, True)
        assert wrapped.reserve(v, cv).gpu_milli == UsageFGD().reserve(v, cv).gpu_milli
    assert wrapped.reserve(JobView("p", 0.0, 1, 1000, 12.0, 1000.0, 4000, 8192, True), cv).gpu_milli == 150


def test_a_reserving_baseline_packs_whole_gpu_pods_it_predicts_light():
    # four whole-GPU pods predicted at 20 %: as published they need four GPUs; reserved (250 milli each) one
    pods = [Job(f"p{i}", 0.0, 1.0, 1, 1000, cpu_milli=1000, ram_mib=1000, true_util_pct=20.0, true_mem_mb=1000.0,
                pred_util_pct=20.0, pred_mem_mb=1000.0) for i in range(4)]
    spec = ClusterSpec((node("n0", 4),), "hand-made", enforce_milli=True)
    plain = Fill(pods, spec, BestFitRef(), seed=0, max_pods=4).run()
    held = Fill(pods, spec, with_reservation(BestFitRef()), seed=0, max_pods=4).run()
    assert plain.state.free_gpus == 0 and plain.result(wall_s=0).reserved_share == pytest.approx(1.0)
    assert held.state.free_gpus == 3 and held.result(wall_s=0).reserved_share == pytest.approx(0.25)
    assert held.result(wall_s=0).unallocated_gpus == pytest.approx(0.0)  # scored on requests, as usage_fgd is


def test_bound_is_checked_on_true_utilization_not_on_predictions():
    spec = ClusterSpec((node("n0", 2),), "hand-made", enforce_milli=False)
    st = ClusterState(spec)
    # predicted light (the bound looks safe on predictions), truly heavy: both jobs slow below the bound
    put(st, "a", [0], pred_util=10.0, pred_mem=1000.0, true_util=95.0)
    put(st, "b", [0], pred_util=10.0, pred_mem=1000.0, true_util=95.0)
    put(st, "c", [1], pred_util=95.0, pred_mem=1000.0, true_util=10.0)
    s = sharing_stats(st)
    assert s["bound_min_speed"] == BOUND_MIN_SPEED and s["gpus_over_bound"] == 1
    assert s["p99_slowdown"] >= s["p95_slowdown"] >= s["mean_slowdown"] > 1.0 / BOUND_MIN_SPEED * 0.9


def test_light_sharing_stays_within_the_bound():
    spec = ClusterSpec((node("n0", 1),), "hand-made", enforce_milli=False)
    st = ClusterState(spec)
    put(st, "a", [0], pred_util=5.0, pred_mem=1000.0)
    put(st, "b", [0], pred_util=5.0, pred_mem=1000.0)
    s = sharing_stats(st)
    assert s["gpus_over_bound"] == 0 and s["shared_gpus"] == 1


def test_replay_reports_the_slowdown_tail():
    from scheduling.horus.policies import make_policy
    from scheduling.horus.simulator import simulate

    jobs = [job(f"j{i}", 0.0, 100.0, util=90.0) for i in range(4)]
    spec = ClusterSpec((NodeSpec("n", 2, "V100", 16384.0),), "2 GPUs")
    r = simulate(jobs, spec, make_policy("best_fit"))
    d = r.to_dict()
    assert d["p99_slowdown"] >= d["p95_slowdown"] >= d["mean_slowdown"] > 1.0  # two heavy jobs share each GPU
    assert d["p99_jct_s"] >= d["p95_jct_s"]


def test_reserving_baseline_co_locates_only_where_predicted_memory_fits():
    spec = ClusterSpec((node("n0", 2),), "hand-made", enforce_milli=True)
    st = ClusterState(spec)
    # GPU 0 holds a light pod with 14 GB predicted: a second 2 GB pod would leave < 500 MB of 16 GB
    st.add(JobView("a", 0.0, 1, 150, 10.0, 14000.0, 1000, 1000, True), [0], true_util=10.0, true_mem=14000.0, now=0.0)
    st.add(JobView("b", 0.0, 1, 150, 10.0, 1000.0, 1000, 1000, True), [1], true_util=10.0, true_mem=1000.0, now=0.0)
    incoming = JobView("c", 0.0, 1, 1000, 10.0, 2000.0, 1000, 1000, True)
    for memory_check, expect in ((True, [1]), (False, [0])):
        policy = with_reservation(BestFitRef(), memory_check=memory_check)
        policy.reset(0)
        held = policy.reserve(incoming, st.view())
        # best fit alone prefers GPU 0 (slot order among equal shares); the memory rule sends it to GPU 1
        assert policy.place(held, st.view(), 0.0) == expect
    assert with_reservation(BestFitRef(), memory_check=False).name == "best_fit_ref+reserve-nomem"
