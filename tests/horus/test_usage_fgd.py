"""``usage_fgd`` (our policy): FGD's gradient on predicted usage, overcommitting only under the
fitted-interference bound (issue 15, item 7)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduling.horus.cluster import ClusterSpec, ClusterState, NodeSpec
from scheduling.horus.policies import POLICIES, make_policy
from scheduling.horus.simulator import simulate, simulate_fill
from scheduling.horus.usage_fgd import UsageFGD, held_milli, min_predicted_speed

from .helpers import job, put, view

HOUR = 3600.0
ONE_GPU = ClusterSpec.uniform(1, 1)


def test_registered_by_its_plain_name():
    assert POLICIES["usage_fgd"] is UsageFGD and make_policy("usage_fgd").shares_gpus


def test_three_saturated_jobs_on_one_gpu_take_three_hours():
    jobs = [job(n, 0, HOUR, util=100.0, mem=2000) for n in "abc"]
    r = simulate(jobs, ONE_GPU, UsageFGD(), record_jobs=True, check_invariants=True)
    assert r.makespan_s >= 3 * HOUR * (1 - 1e-9)
    assert r.util_mean_pct <= 100.0 + 1e-9


def test_three_light_jobs_share_one_gpu_and_gain():
    jobs = [job(n, 0, HOUR, util=20.0, mem=2000) for n in "abc"]
    r = simulate(jobs, ONE_GPU, UsageFGD(), record_jobs=True, check_invariants=True)
    assert r.makespan_s < 1.5 * HOUR and r.shared_gpu_time_frac > 0.9


def test_held_share_is_the_predicted_usage_never_above_the_request():
    assert held_milli(30.0, 1000, 0.15, 50) == 350  # 345 rounded up to 50s
    assert held_milli(40.0, 1000, 0.25, 50) == 500
    assert held_milli(95.0, 1000, 0.15, 50) == 1000
    assert held_milli(30.0, 200, 0.15, 50) == 200
    assert held_milli(0.0, 1000, 0.15, 50) == 50


def test_no_overcommit_past_the_interference_bound():
    """Both GPUs hold a job predicted at 40 %: a third such job shares one only if the fitted model,
    on the predictions, keeps every job on it above the bound."""
    spec = ClusterSpec.uniform(1, 2)
    s = ClusterState(spec)
    put(s, "a", [0], pred_util=40.0, pred_mem=2000)
    put(s, "b", [1], pred_util=40.0, pred_mem=2000)
    incoming = view("c", util=40.0, mem=2000)
    assert 0.5 < min_predicted_speed([40.0, 40.0], "V100") < 0.95
    assert UsageFGD(min_speed_whole=0.5).place(incoming, s.view(), 0.0) in ([0], [1])
    assert UsageFGD(min_speed_whole=0.95).place(incoming, s.view(), 0.0) is None


def test_a_shared_gpu_is_chosen_by_the_work_it_gains():
    """A light job adds more delivered work next to a light job than next to a saturated one."""
    s = ClusterState(ClusterSpec.uniform(1, 2))
    put(s, "busy", [0], pred_util=95.0, pred_mem=2000)
    put(s, "light", [1], pred_util=20.0, pred_mem=2000)
    assert UsageFGD().place(view("c", util=20.0, mem=2000), s.view(), 0.0) == [1]


def test_fill_reserves_predicted_usage_and_counts_allocation_by_request():
    spec = ClusterSpec((NodeSpec("a", 2, "V100", 16384.0, 64000, 262144),), "one", enforce_milli=True)
    pods = [replace(job(f"p{i}", 0, 1, util=20.0, mem=1500), single_node=True, cpu_milli=1000, ram_mib=1024) for i in range(6)]
    fgd = simulate_fill(pods, spec, make_policy("fgd"), seed=0, until=2.0)
    ours = simulate_fill(pods, spec, make_policy("usage_fgd"), seed=0, until=2.0)
    assert fgd.placed == 2  # whole-GPU requests: one pod per GPU
    assert ours.placed > fgd.placed and ours.reserved_share < ours.allocated_share
    assert ours.sharing["shared_gpus"] >= 1 and ours.sharing["mean_slowdown"] >= 1.0


@pytest.mark.parametrize("sigma", [0.0, 1.0])
def test_wrong_predictions_never_break_the_physics(sigma):
    jobs = [job(n, 0, HOUR, util=100.0, mem=2000, pred_util=10.0) for n in "abc"]  # badly under-predicted
    r = simulate(jobs, ONE_GPU, UsageFGD(), predictor_error=sigma, check_invariants=True)
    assert r.makespan_s >= 3 * HOUR * (1 - 1e-9)


def test_a_gang_gets_distinct_gpus_and_shares_only_where_the_bound_allows():
    s = ClusterState(ClusterSpec.uniform(1, 3))
    for g, name in enumerate("abc"):
        put(s, name, [g], pred_util=20.0, pred_mem=2000)
    got = UsageFGD().place(view("gang", util=20.0, mem=2000, num_gpus=2), s.view(), 0.0)
    assert got is not None and len(set(got)) == 2
    assert UsageFGD(min_speed_whole=0.99).place(view("gang", util=20.0, mem=2000, num_gpus=2), s.view(), 0.0) is None


def test_a_partner_avoids_a_gangs_gpu_it_would_slow():
    """Two GPUs each hold a 50 % job; on GPU 0 it is a gang of 4 (its other GPUs elsewhere). A newcomer
    adds about the same work on either GPU, but on GPU 0 it slows the whole gang: the gang-aware gain
    sends it to GPU 1; without it the tie goes to the lower index."""
    s = ClusterState(ClusterSpec.uniform(1, 5))
    put(s, "gang", [0, 2, 3, 4], pred_util=50.0, pred_mem=2000)
    put(s, "solo", [1], pred_util=50.0, pred_mem=2000)
    incoming = view("c", util=50.0, mem=2000)
    assert UsageFGD(gang_aware=False).place(incoming, s.view(), 0.0) == [0]
    assert UsageFGD(gang_aware=True).place(incoming, s.view(), 0.0) == [1]


def test_a_slowed_gang_has_its_partner_migrated_on_telemetry():
    """A gang shares GPU 0 with a busy single-GPU job; telemetry shows the gang slowed below the bound,
    so rebalance moves the partner to the idle GPU. A light partner (gang barely slowed) stays."""
    def state(partner_util: float) -> ClusterState:
        s = ClusterState(ClusterSpec.uniform(1, 4))
        put(s, "gang", [0, 1], pred_util=90.0, pred_mem=2000)
        put(s, "partner", [0], pred_util=partner_util, pred_mem=2000)  # telemetry: its utilization
        return s

    busy = state(90.0)
    assert UsageFGD(gang_aware=True).rebalance(busy.view(), 3600.0) == [("partner", [2])]
    assert UsageFGD(gang_aware=False).rebalance(busy.view(), 3600.0) == []
    assert UsageFGD(gang_aware=True).rebalance(state(2.0).view(), 3600.0) == []


def test_two_slowed_gangs_on_one_gpu_are_parted_by_moving_the_smaller_to_idle_gpus():
    """No single-GPU partner to move: a 2-GPU gang shares GPU 0 with a busy 3-GPU gang, so the smaller
    gang moves whole to idle GPUs of one node (the node where they fit most tightly); with no room for
    it, or with ``move_gangs`` off, nothing moves."""
    def state(nodes: int) -> ClusterState:
        s = ClusterState(ClusterSpec.uniform(nodes, 4))
        put(s, "big", [0, 1, 2], pred_util=90.0, pred_mem=2000)
        put(s, "small", [0, 3], pred_util=90.0, pred_mem=2000, single_node=True)
        return s

    s = state(3)  # node 1 (GPUs 4-7) all idle, node 2 two idle after x and y: the tighter fit
    put(s, "x", [8], pred_util=50.0, pred_mem=2000)
    put(s, "y", [9], pred_util=50.0, pred_mem=2000)
    assert UsageFGD().rebalance(s.view(), 3600.0) == [("small", [10, 11])]
    assert UsageFGD(move_gangs=False).rebalance(s.view(), 3600.0) == []
    assert UsageFGD().rebalance(state(1).view(), 3600.0) == []  # no idle GPU at all
    r = state(2)
    assert UsageFGD().rebalance(r.view(), 3600.0) == [("small", [4, 5])]


def test_gang_moves_keep_the_physics():
    """Three saturated gangs (mispredicted light) on 4 GPUs: two share. Once the short one leaves, one
    of the sharing gangs moves to the freed GPUs; the GPUs never deliver more than one GPU of work each,
    and the move shortens the makespan."""
    jobs = [replace(job("g1", 0, 4 * HOUR, util=95.0, mem=2000, pred_util=10.0), num_gpus=2),
            replace(job("g2", 0, 4 * HOUR, util=95.0, mem=2000, pred_util=10.0), num_gpus=2),
            replace(job("blocker", 0, HOUR, util=95.0, mem=2000, pred_util=10.0), num_gpus=2)]
    r = simulate(jobs, ClusterSpec.uniform(1, 4), UsageFGD(), check_invariants=True, record_jobs=True)
    assert r.unschedulable_jobs == 0 and r.util_mean_pct <= 100.0 + 1e-9
    assert r.migrations >= 1 and r.makespan_s >= 4 * HOUR * (1 - 1e-9)
    stayed = simulate(jobs, ClusterSpec.uniform(1, 4), UsageFGD(move_gangs=False), check_invariants=True)
    assert stayed.migrations == 0 and r.makespan_s < stayed.makespan_s  # simulated hours: 6.0 vs 9.0


def test_gang_relief_keeps_the_physics_and_moves_jobs_at_most_max_migrations_times():
    jobs = [replace(job("gang", 0, 4 * HOUR, util=95.0, mem=2000), num_gpus=2)] + [
        job(f"s{i}", 60.0 * i, HOUR, util=95.0, mem=2000, pred_util=10.0) for i in range(6)]
    r = simulate(jobs, ClusterSpec.uniform(1, 3), UsageFGD(gang_aware=True, max_migrations=1), check_invariants=True, record_jobs=True)
    assert r.unschedulable_jobs == 0 and r.util_mean_pct <= 100.0 + 1e-9
    assert r.migrations <= 6


def test_running_jobs_are_judged_by_telemetry_not_by_their_prediction():
    """Both GPUs hold a job predicted at 20 %; telemetry shows the one on GPU 0 at 95 % (mispredicted):
    a light job goes beside the truly light one, where predictions alone could not tell them apart."""
    s = ClusterState(ClusterSpec.uniform(1, 2))
    put(s, "hidden", [0], pred_util=20.0, pred_mem=2000, true_util=95.0)
    put(s, "light", [1], pred_util=20.0, pred_mem=2000)
    incoming = view("c", util=20.0, mem=2000)
    assert UsageFGD(telemetry_utils=True).place(incoming, s.view(), 0.0) == [1]
    assert UsageFGD(telemetry_utils=False).place(incoming, s.view(), 0.0) == [0]


@pytest.mark.parametrize("utils", [(50.0, 50.0), (99.0, 6.0), (30.0, 20.0, 10.0)])
def test_telemetry_is_read_back_to_standalone_utilizations(utils):
    """Sampled per-process utilization is stretched while jobs share; inverting it through the fitted
    model recovers the standalone values (within a point)."""
    from scheduling.horus.replay import measured_util
    from scheduling.horus.usage_fgd import job_speeds, standalone_from_telemetry

    meas = [measured_util(u, 1.0 / sp) for u, sp in zip(utils, job_speeds(utils, "V100"))]
    assert max(m - u for m, u in zip(meas, utils)) > 1.0  # telemetry alone over-reads them
    assert standalone_from_telemetry(meas, "V100") == pytest.approx(utils, abs=1.0)


def test_looks_ahead_like_horus_by_default():
    assert UsageFGD().queue_lookahead == 5 and UsageFGD(queue_lookahead=1).queue_lookahead == 1
