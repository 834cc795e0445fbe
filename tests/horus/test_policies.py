"""Each policy's decisions on small hand-made clusters."""

from __future__ import annotations

import numpy as np
import pytest

from scheduling.horus.cluster import ClusterSpec, ClusterState, NodeSpec, WorkloadType
from scheduling.horus.policies import (
    FGD,
    HORUS_HEADROOM_MB,
    POLICIES,
    BestFit,
    FifoExclusive,
    Gandiva,
    Horus,
    HorusMigrate,
    PlacementPolicy,
    RandomFit,
    horus_score,
    make_policy,
)

from .helpers import put, view


def test_registry_has_every_policy():
    assert set(POLICIES) == {"fifo_exclusive", "gandiva", "best_fit", "random_fit", "horus", "horus_migrate", "fgd",
                             "usage_fgd"}
    for name in POLICIES:
        p = make_policy(name)
        assert isinstance(p, PlacementPolicy) and p.name == name
    with pytest.raises(KeyError, match="unknown policy"):
        make_policy("nope")


# ---------------------------------------------------------------- Horus score


def test_horus_score_terms():
    # memory term 1.3 x (in use + job) / cap, util term |sum - 100| / 100, jobs term
    c = horus_score(np.array([30.0]), np.array([4096.0]), np.array([1]), np.array([16384.0]), 50.0, 4096.0)
    assert c[0] == pytest.approx(1.3 * 0.5 + 0.2 + 1)


def test_horus_score_penalises_over_subscription_more():
    under = horus_score(np.array([0.0]), 0.0, 0, 16384.0, 90.0, 0.0)[0]  # 90 %: 10 under
    over = horus_score(np.array([20.0]), 0.0, 0, 16384.0, 90.0, 0.0)[0]  # 110 %: 10 over
    assert under == pytest.approx(0.10)
    assert over == pytest.approx(0.16)  # x 1.6


def test_horus_prefers_under_over_oversubscribed_because_of_penalty(small_spec):
    s = ClusterState(small_spec)
    put(s, "a", [0], pred_util=75, pred_mem=2000)  # + 40 -> 115 %: 0.15 x 1.6 = 0.24
    put(s, "b", [1], pred_util=40, pred_mem=2000)  # + 40 ->  80 %: 0.20
    put(s, "c", [2], pred_util=10, pred_mem=2000)
    put(s, "d", [3], pred_util=10, pred_mem=2000)  # + 40 -> 50 %: 0.50
    assert Horus().place(view("x", util=40, mem=2000), s.view(), 0.0) == [1]
    # without the 1.6 factor GPU 0 (0.15) would have won: the penalty decided
    assert abs(115 - 100) / 100 < abs(80 - 100) / 100


def test_horus_spreads_to_an_empty_gpu_first(small_spec):
    s = ClusterState(small_spec)
    put(s, "a", [0], pred_util=10, pred_mem=1000)
    got = Horus().place(view("x", util=10, mem=1000), s.view(), 0.0)
    assert got == [1]  # empty GPU: the jobs-on-GPU term dominates


def test_horus_at_most_three_jobs_per_gpu():
    s = ClusterState(ClusterSpec.uniform(1, 2, gpu_mem_mb=16384.0))
    for k in range(3):
        put(s, f"a{k}", [0], pred_util=5, pred_mem=500)
    for k in range(2):
        put(s, f"b{k}", [1], pred_util=45, pred_mem=500)
    # GPU 0 would score best on utilization (15 % + 50 %... no: both < 100) but is full
    assert Horus().place(view("x", util=5, mem=500), s.view(), 0.0) == [1]
    put(s, "b2", [1], pred_util=1, pred_mem=500)
    assert Horus().place(view("y", util=5, mem=500), s.view(), 0.0) is None


def test_horus_keeps_500mb_headroom_when_colocating():
    s = ClusterState(ClusterSpec.uniform(1, 1, gpu_mem_mb=16384.0))
    put(s, "a", [0], pred_util=10, pred_mem=15000)
    assert Horus().place(view("x", util=10, mem=1000), s.view(), 0.0) is None  # 384 MB would be left
    assert 16384 - 15000 - 884 >= HORUS_HEADROOM_MB
    assert Horus().place(view("y", util=10, mem=884), s.view(), 0.0) == [0]  # exactly 500 MB left


def test_horus_uses_predictions_not_truth():
    s = ClusterState(ClusterSpec.uniform(1, 2, gpu_mem_mb=16384.0))
    # GPU 0 truly saturated but predicted light; GPU 1 truly light, predicted heavy
    put(s, "a", [0], pred_util=20, pred_mem=1000, true_util=95)
    put(s, "b", [1], pred_util=90, pred_mem=1000, true_util=10)
    assert Horus(state="predicted").place(view("x", util=60, mem=1000), s.view(), 0.0) == [0]
    # the default (the authors'): the GPUs' sampled utilization, capped at 100 %, plus the job's prediction
    assert Horus().place(view("x", util=60, mem=1000), s.view(), 0.0) == [1]
    # gandiva looks at measured utilization only (lower is better)
    assert Gandiva().place(view("x", util=60, mem=1000), s.view(), 0.0) == [1]


def test_horus_multi_gpu_picks_k_cheapest(small_spec):
    s = ClusterState(small_spec)
    put(s, "a", [0], pred_util=90, pred_mem=1000)
    got = Horus().place(view("x", util=50, mem=1000, num_gpus=3), s.view(), 0.0)
    assert got == [1, 2, 3]


def test_horus_single_node_job_stays_on_one_node(small_spec):
    s = ClusterState(small_spec)
    put(s, "a", [0], pred_util=90, pred_mem=1000)
    got = Horus().place(view("x", util=50, mem=1000, num_gpus=2, single_node=True), s.view(), 0.0)
    assert got == [2, 3]


def test_horus_max_util_cap_option():
    s = ClusterState(ClusterSpec.uniform(1, 1, gpu_mem_mb=16384.0))
    put(s, "a", [0], pred_util=80, pred_mem=1000)
    assert Horus().place(view("x", util=50, mem=1000), s.view(), 0.0) == [0]
    assert Horus(max_util_pct=120).place(view("x", util=50, mem=1000), s.view(), 0.0) is None


# ---------------------------------------------------------------- baselines


def test_fifo_exclusive_one_job_per_gpu(small_spec):
    s = ClusterState(small_spec)
    p = FifoExclusive()
    assert p.place(view("x"), s.view(), 0.0) == [0]
    put(s, "a", [0], pred_util=1, pred_mem=100)
    put(s, "b", [1], pred_util=1, pred_mem=100)
    assert p.place(view("x"), s.view(), 0.0) == [2]
    assert p.place(view("x", num_gpus=3), s.view(), 0.0) is None
    assert p.place(view("x", num_gpus=2), s.view(), 0.0) == [2, 3]


def test_best_fit_packs_tightest_memory(small_spec):
    s = ClusterState(small_spec)
    put(s, "a", [0], pred_util=10, pred_mem=4000)
    put(s, "b", [1], pred_util=10, pred_mem=12000)
    assert BestFit().place(view("x", mem=2000), s.view(), 0.0) == [1]
    assert BestFit().place(view("x", mem=4000), s.view(), 0.0) == [0]  # 12000+4000 leaves < 500 MB


def test_best_fit_packs_milli_when_enforced(milli_spec):
    s = ClusterState(milli_spec)
    put(s, "a", [3], pred_util=10, pred_mem=500, milli=600)
    put(s, "b", [4], pred_util=10, pred_mem=500, milli=300)
    assert BestFit().place(view("x", milli=400), s.view(), 0.0) == [3]  # 600 + 400 = 1000
    assert BestFit().place(view("x", milli=500), s.view(), 0.0) == [4]


def test_random_fit_is_seeded_and_feasible(small_spec):
    s = ClusterState(small_spec)
    for k in range(3):
        put(s, f"a{k}", [0], pred_util=1, pred_mem=100)
    picks = []
    for seed in (0, 0, 1):
        p = RandomFit()
        p.reset(seed)
        picks.append([p.place(view(f"x{i}"), s.view(), 0.0)[0] for i in range(20)])
    assert picks[0] == picks[1]
    assert 0 not in picks[0] + picks[2]  # GPU 0 holds 3 jobs


def test_fgd_fills_a_partial_gpu_instead_of_fragmenting_a_free_one(milli_spec):
    s = ClusterState(milli_spec)
    s.workload = [WorkloadType(1, 500, 0.5), WorkloadType(1, 1000, 0.5)]
    put(s, "a", [2], pred_util=10, pred_mem=500, milli=500)
    assert FGD().place(view("x", milli=500), s.view(), 0.0) == [2]
    # a whole-GPU job never shares a GPU under FGD
    got = FGD().place(view("y", milli=1000), s.view(), 0.0)
    assert got is not None and got[0] != 2


def test_fgd_whole_node_job(milli_spec):
    s = ClusterState(milli_spec)
    s.workload = [WorkloadType(1, 1000, 0.5), WorkloadType(2, 1000, 0.5)]
    put(s, "a", [2], pred_util=10, pred_mem=500, milli=1000)
    got = FGD().place(view("x", num_gpus=2, single_node=True), s.view(), 0.0)
    assert got in ([0, 1], [3, 4], [3, 5], [4, 5])
    assert len({int(s.gpu_node[g]) for g in got}) == 1


def test_milli_shares_are_respected_when_enforced(milli_spec):
    s = ClusterState(milli_spec)
    for g in range(6):
        put(s, f"a{g}", [g], pred_util=10, pred_mem=500, milli=700)
    for name in POLICIES:
        assert make_policy(name).place(view("x", milli=400), s.view(), 0.0) is None, name
        got = make_policy(name).place(view("x", milli=300), s.view(), 0.0)
        if name == "fifo_exclusive":
            assert got is None  # never shares a GPU
        else:
            assert got is not None and len(got) == 1, name


def test_node_cpu_is_respected():
    spec = ClusterSpec((NodeSpec("a", 2, cpu_milli=8000, ram_mib=65536), NodeSpec("b", 2, cpu_milli=32000, ram_mib=65536)),
                       enforce_milli=True)
    s = ClusterState(spec)
    for name in POLICIES:
        got = make_policy(name).place(view("x", cpu=16000, ram=1024, milli=500), s.view(), 0.0)
        assert got is not None and got[0] in (2, 3), name


# ---------------------------------------------------------------- migration


def test_horus_migrate_moves_a_job_off_an_oversubscribed_gpu():
    s = ClusterState(ClusterSpec.uniform(1, 2, gpu_mem_mb=16384.0))
    put(s, "a", [0], pred_util=30, pred_mem=2000, true_util=80)
    put(s, "b", [0], pred_util=30, pred_mem=2000, true_util=60)  # measured 140 %
    p = HorusMigrate(min_runtime_s=0)
    moves = p.rebalance(s.view(), 100.0)
    assert moves == [("b", [1])]  # 60 % suffices (excess 35) and is the smaller job that ends it
    assert HorusMigrate(min_runtime_s=1000).rebalance(s.view(), 100.0) == []  # too recent


def test_horus_migrate_admission_uses_measured_demand():
    s = ClusterState(ClusterSpec.uniform(1, 2, gpu_mem_mb=16384.0))
    put(s, "a", [0], pred_util=20, pred_mem=1000, true_util=95)
    put(s, "b", [1], pred_util=20, pred_mem=1000, true_util=95)
    assert Horus().place(view("x", util=30, mem=1000), s.view(), 0.0) is not None
    assert HorusMigrate().place(view("x", util=30, mem=1000), s.view(), 0.0) is None  # both measured full


# ---------------------------------------------------------------- score (what the placement service records)


def _busy_state(spec) -> ClusterState:
    s = ClusterState(spec)
    put(s, "a", [0], pred_util=60, pred_mem=3000, milli=500)
    put(s, "b", [1], pred_util=20, pred_mem=6000, milli=250)
    return s


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_scores_its_own_placement(name, milli_spec):
    """``score`` is public on every policy: a float for those that rank by a cost, None for the others."""
    s = _busy_state(milli_spec)
    pol = make_policy(name)
    j = view("x", util=30, mem=2000, milli=250)
    gpus = pol.place(j, s.view(), 0.0)
    assert gpus
    score = pol.score(j, s.view(), gpus)
    if name in ("fifo_exclusive", "random_fit"):
        assert score is None
    else:
        assert isinstance(score, float) and np.isfinite(score)


@pytest.mark.parametrize("cls", [Horus, HorusMigrate, Gandiva, BestFit])
def test_score_is_the_cost_the_policy_ranked_by(cls, small_spec):
    s = _busy_state(small_spec)
    pol = cls()
    j = view("x", util=30, mem=2000)
    cost, mask = pol.cost(j, s.view())
    g = pol.place(j, s.view(), 0.0)[0]
    assert pol.score(j, s.view(), [g]) == float(cost[g]) == float(cost[mask].min())


def test_fgd_score_is_the_fragmentation_growth_it_minimised(milli_spec):
    s = _busy_state(milli_spec)
    s.workload = [WorkloadType(1, 250, 0.5), WorkloadType(1, 1000, 0.5)]
    pol, j = FGD(), view("x", milli=250)
    g = pol.place(j, s.view(), 0.0)
    scores = [pol.score(j, s.view(), [k]) for k in range(s.n_gpus)]
    assert pol.score(j, s.view(), g) == pytest.approx(min(scores))


def test_random_fit_score_does_not_draw_from_its_stream(small_spec):
    s = ClusterState(small_spec)
    a, b = RandomFit(seed=1), RandomFit(seed=1)
    for k in range(3):
        j = view(f"j{k}", mem=500)
        assert a.score(j, s.view(), [0]) is None
        assert a.place(j, s.view(), 0.0) == b.place(j, s.view(), 0.0)
