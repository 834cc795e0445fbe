"""The ATC'23 artifact's baselines (scheduling/horus/reference_policies.py) on hand-made cases: integer
scores, ties to the smallest node name as the artifact's run renames the nodes (a random order drawn
per run), typical pods keyed without memory, node-level Best Fit."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scheduling.horus.cluster import ClusterSpec, ClusterState, JobView, NodeSpec
from scheduling.horus.fill import Fill
from scheduling.horus.reference_policies import (
    REFERENCE_POLICIES,
    BestFitRef,
    DotProdRef,
    FGDRef,
    GpuClusteringRef,
    GpuPackingRef,
    RandomRef,
    fgd_score,
    make_reference_policy,
    typical_pods,
)
from scheduling.horus.traces import Job

from .helpers import job


def pod(job_id: str = "p", *, gpus: int = 1, milli: int = 1000, cpu: int = 4000, ram: int = 8192,
        gpu_type: str = "") -> JobView:
    return JobView(job_id, 0.0, gpus, milli, 50.0, 1000.0, cpu, ram, True, gpu_type=gpu_type)


def node(name: str, gpus: int = 2, *, cpu: int = 32000, ram: int = 262144, model: str = "V100") -> NodeSpec:
    return NodeSpec(name, gpus, model, 16384.0, cpu, ram)


def state_of(*nodes: NodeSpec) -> ClusterState:
    return ClusterState(ClusterSpec(tuple(nodes), "hand-made", enforce_milli=True))


def put(state: ClusterState, p: JobView, gpus: list[int]) -> None:
    state.check_placement(p, gpus)
    state.add(p, gpus, true_util=50.0, true_mem=1000.0, now=0.0)


# ------------------------------------------------------------------ FGD's score and typical pods
def test_fgd_score_is_the_integer_sigmoid_of_the_fragmentation_drop():
    got = fgd_score(np.array([0.0, 1000.0, 0.0, 2500.0]), np.array([0.0, 0.0, 5000.0, 500.0]))
    assert got.dtype == np.int64
    want = [math.floor(100 / (1 + math.exp(-d))) for d in (0.0, 1.0, -5.0, 2.0)]
    assert got.tolist() == want == [50, 73, 0, 88]


def test_typical_pods_key_on_cpu_share_gpus_and_type_but_not_memory():
    pods = [job(f"a{i}", 0, 1, num_gpus=1, milli=500) for i in range(4)]
    # the same shape with four different memory requests: one typical pod
    pods = [Job(p.job_id, 0.0, 1.0, 1, 500, cpu_milli=4000, ram_mib=1000 * (i + 1)) for i, p in enumerate(pods)]
    pods += [Job("b", 0.0, 1.0, 1, 500, cpu_milli=8000, ram_mib=1000)]  # another CPU: another shape
    pods += [Job("c", 0.0, 1.0, 0, 0, cpu_milli=2000, ram_mib=1000)]  # a CPU-only pod counts too
    types = typical_pods(pods, popularity=1.0)
    assert [(t.num_gpus, t.milli, t.cpu_milli, t.ram_mib, round(t.p, 3)) for t in types] == [
        (1, 500, 4000, 0, 0.667), (0, 0, 2000, 0, 0.167), (1, 500, 8000, 0, 0.167)]


def test_typical_pods_keep_the_fewest_shapes_covering_the_popularity():
    pods = [Job(f"a{i}", 0.0, 1.0, 1, 1000, cpu_milli=4000) for i in range(90)]
    pods += [Job(f"b{i}", 0.0, 1.0, 2, 1000, cpu_milli=8000) for i in range(8)]
    pods += [Job(f"c{i}", 0.0, 1.0, 8, 1000, cpu_milli=64000) for i in range(2)]
    types = typical_pods(pods, popularity=0.95)
    assert [(t.num_gpus, round(t.p, 4)) for t in types] == [(1, round(90 / 98, 4)), (2, round(8 / 98, 4))]
    with pytest.raises(ValueError, match="popularity"):
        typical_pods(pods, popularity=0.0)


def test_a_fill_gives_fgd_ref_its_typical_pods_without_memory():
    pods = [Job(f"p{i}", 0.0, 1.0, 1, 500, cpu_milli=4000, ram_mib=1000 + i, true_util_pct=50.0, true_mem_mb=1000.0,
                pred_util_pct=50.0, pred_mem_mb=1000.0) for i in range(6)]
    spec = ClusterSpec((node("n0"), node("n1")), "hand-made", enforce_milli=True)
    fill = Fill(pods, spec, FGDRef(), seed=0).run()
    assert [(t.num_gpus, t.milli, t.cpu_milli, t.ram_mib, t.p) for t in fill.state.workload] == [(1, 500, 4000, 0, 1.0)]
    assert fill.result(wall_s=0.0).unallocated_gpus == pytest.approx(0.0)


# ------------------------------------------------------------------ ties to the smallest node name
@pytest.mark.parametrize("name", sorted(REFERENCE_POLICIES.keys() - {"random_ref"}))
def test_every_scored_policy_breaks_ties_by_the_smallest_node_name(name):
    # identical nodes, listed with the larger name first: the second one (index 1, "node-a") wins
    st = state_of(node("node-b"), node("node-a"), node("node-c"))
    policy = make_reference_policy(name, ties="name")
    policy.reset(0)
    assert policy.place(pod(milli=300), st.view(), 0.0) == [2]  # node-a's first GPU
    assert policy.place_cpu_pod(pod(gpus=0, milli=0), st.view()) == 1
    # the same policy on another cluster (no reset in between) orders that cluster's names
    other = state_of(node("node-z"), node("node-y"), node("node-x"))
    assert policy.place_cpu_pod(pod(gpus=0, milli=0), other.view()) == 2


@pytest.mark.parametrize("name", sorted(REFERENCE_POLICIES.keys() - {"random_ref"}))
def test_ties_follow_the_artifacts_renamed_nodes_a_random_order_fixed_per_run(name):
    # the artifact prefixes every node name with a random permutation index ("0917-openb-node-0000") before
    # it schedules: among identical nodes a tie goes to the node the run's permutation puts first - not
    # always the smallest raw name - and the same seed gives the same order
    names = [f"node-{i}" for i in range(6)]
    firsts = []
    for seed in range(6):
        st = state_of(*(node(n, 2, cpu=8000) for n in names))
        policy = make_reference_policy(name)  # ties="shuffled", the default
        policy.reset(seed)
        rank = policy.tie_ranks(st.view())
        assert sorted(rank.tolist()) == list(range(6))
        first = int(np.argmin(rank))
        assert policy.place(pod(gpus=1, cpu=4000), st.view(), 0.0) == [2 * first]
        assert policy.place_cpu_pod(pod(gpus=0, milli=0, cpu=4000), st.view()) == first
        again = make_reference_policy(name)
        again.reset(seed)
        assert again.tie_ranks(st.view()).tolist() == rank.tolist()
        firsts.append(first)
    assert len(set(firsts)) > 1  # the raw names' order would always give node-0


def test_gpu_packing_ref_piles_tied_pods_in_the_runs_node_order():
    # GpuPacking gives every CPU-only pod 0 on every node: they fill the run's first node, then its second;
    # whole GPUs prefer used nodes (49) to idle ones (31), so the next pod follows the first
    st = state_of(*(node(f"n{i}", 2, cpu=8000) for i in range(4)))
    policy = GpuPackingRef()
    policy.reset(5)
    order = np.argsort(policy.tie_ranks(st.view())).tolist()
    got = []
    for k in range(4):
        n = policy.place_cpu_pod(pod(f"c{k}", gpus=0, milli=0, cpu=4000), st.view())
        st.add_cpu_pod(pod(f"c{k}", gpus=0, milli=0, cpu=4000), n)
        got.append(n)
    assert got == [order[0], order[0], order[1], order[1]]
    first = policy.place(pod("w", gpus=1, cpu=0), st.view(), 0.0)
    assert first == [2 * order[0]]  # every node idle, all tie at 31: the run's first node, its first GPU
    put(st, pod("w", gpus=1, cpu=0), first)
    assert policy.place(pod("v", gpus=1, cpu=0), st.view(), 0.0) == [2 * order[0] + 1]
    with pytest.raises(ValueError, match="ties"):
        GpuPackingRef(ties="smallest")


def test_fgd_ref_takes_the_gpu_that_keeps_room_for_the_typical_pods():
    st = state_of(node("a", 2))
    put(st, pod("half", milli=500), [0])
    st.workload = typical_pods([Job("t", 0.0, 1.0, 1, 500, cpu_milli=4000)], popularity=1.0)
    policy = FGDRef()
    # a 500 pod on GPU 0 (500 left) leaves no fragment; on GPU 1 it would leave 500 per GPU, still usable
    assert policy.place(pod(milli=500), st.view(), 0.0) == [0]
    # a 300 pod on GPU 0 leaves 200 that no typical 500 pod can use (a fragment): GPU 1 keeps it out
    assert policy.place(pod(milli=300), st.view(), 0.0) == [1]


# ------------------------------------------------------------------ Best Fit and the others, node level
def test_best_fit_ref_scores_the_node_by_its_cpu_and_gpu_left():
    st = state_of(node("a", 2, cpu=64000), node("b", 4, cpu=32000))
    put(st, pod("x", gpus=2, cpu=16000), [2, 3])  # node b: 2 GPUs and 16 cores left
    p = pod(gpus=1, cpu=8000)
    scores = BestFitRef().node_scores(p, st.view(), np.array([0, 1]))
    left_a = 0.5 * (64000 - 8000) / 128000 + 0.5 * (2000 - 1000) / 8000
    left_b = 0.5 * (16000 - 8000) / 128000 + 0.5 * (2000 - 1000) / 8000
    assert scores.tolist() == [int((1 - left_a) * 100), int((1 - left_b) * 100)]
    assert BestFitRef().place(p, st.view(), 0.0) == [4]  # the node with less left: b's first idle GPU


def test_best_fit_ref_puts_a_share_on_the_fullest_gpu_that_fits():
    st = state_of(node("a", 4))
    put(st, pod("x", milli=700), [1])
    put(st, pod("y", milli=400), [2])
    assert BestFitRef().place(pod(milli=300), st.view(), 0.0) == [1]  # 300 left on GPU 1: the least that fits
    assert BestFitRef().place(pod(milli=500), st.view(), 0.0) == [2]


def test_dot_prod_ref_prefers_the_smallest_dot_product():
    st = state_of(node("a", 8, cpu=96000), node("b", 2, cpu=96000))
    p = pod(gpus=1, cpu=16000)
    scores = DotProdRef().node_scores(p, st.view(), np.array([0, 1]))
    dot = [96000 / 128000 * 16000 / 128000 + g / 8000 * 1000 / 8000 for g in (8000, 2000)]
    assert scores.tolist() == [int(100 * (1 - d / 2)) for d in dot]
    assert DotProdRef().place(p, st.view(), 0.0) == [8]  # node b


def test_gpu_packing_ref_prefers_shared_gpus_then_used_nodes_then_small_idle_nodes():
    st = state_of(node("a", 8), node("b", 2), node("c", 4), node("d", 4))
    put(st, pod("x", milli=600), [10])  # node c, GPU 0: 400 left
    put(st, pod("w", gpus=1), [14])  # node d: one whole GPU used
    view = st.view()
    scores = GpuPackingRef().node_scores(pod(milli=300), view, np.arange(4))
    assert scores.tolist() == [25, 31, 96, 49]  # idle 8-GPU, idle 2-GPU, 40 % free shared GPU, idle GPU of a used node
    assert GpuPackingRef().place(pod(milli=300), view, 0.0) == [10]
    # no share fits: an idle GPU of a used node (c and d tie at 49: c, the smaller name)
    assert GpuPackingRef(ties="name").place(pod(milli=500), view, 0.0) == [11]
    assert GpuPackingRef().node_scores(pod(gpus=0, milli=0), view, np.arange(4)).tolist() == [0, 0, 0, 0]


def test_gpu_clustering_ref_keeps_one_affinity_per_node():
    st = state_of(node("a", 4), node("b", 4), node("c", 4))
    put(st, pod("s", milli=500), [0])  # node a: a shared-GPU pod
    put(st, pod("w", gpus=2), [4, 5])  # node b: a 2-GPU pod
    policy = GpuClusteringRef()
    view = st.view()
    # 25 x (8000 - the node's free GPU milli) / 8000 (integer) + 75 this affinity only, 25 idle node, 0 others
    assert policy.node_scores(pod(milli=300), view, np.arange(3)).tolist() == [
        25 * (8000 - 3500) // 8000 + 75, 25 * (8000 - 2000) // 8000, 25 * (8000 - 4000) // 8000 + 25]
    assert policy.place(pod(milli=300), view, 0.0) == [0]
    assert policy.place(pod(gpus=2), view, 0.0) == [6, 7]
    put(st, pod("s2", milli=200), [1])
    put(st, pod("w2", gpus=1), [2])  # node a now holds two affinities
    assert policy.node_scores(pod(milli=300), st.view(), np.arange(3)).tolist()[0] == 25 * (8000 - 2300) // 8000 + 50


def test_random_ref_is_seeded_and_only_picks_feasible_nodes():
    st = state_of(node("a", 2, model="T4"), node("b", 2), node("c", 2), node("d", 2))
    picks = []
    for seed in (0, 0, 1):
        policy = RandomRef()
        policy.reset(seed)
        picks.append([policy.place(pod(milli=300, gpu_type="V100"), st.view(), 0.0)[0] for _ in range(12)])
    assert picks[0] == picks[1] != picks[2]
    assert all(g >= 2 for g in picks[0] + picks[2])  # never node a (T4)


# ------------------------------------------------------------------ constraints and bad input
@pytest.mark.parametrize("name", sorted(REFERENCE_POLICIES))
def test_reference_policies_honour_cpu_memory_type_and_one_node(name):
    st = state_of(node("a", 2, cpu=8000), node("b", 4, model="T4"), node("c", 2, ram=4096))
    policy = make_reference_policy(name)
    policy.reset(0)
    view = st.view()
    assert policy.place(pod(gpus=1, cpu=40000), view, 0.0) is None  # no node has 40 cores
    assert policy.place(pod(gpus=4, cpu=4000, gpu_type="V100"), view, 0.0) is None  # 4 V100s on no one node
    gpus = policy.place(pod(gpus=2, cpu=4000, ram=8192, gpu_type="V100"), view, 0.0)
    assert gpus == [0, 1]  # a: c lacks the memory, b is T4
    st.check_placement(pod(gpus=2, cpu=4000, ram=8192, gpu_type="V100"), gpus)


def test_unknown_reference_policy_lists_the_known_ones():
    with pytest.raises(KeyError, match="fgd_ref"):
        make_reference_policy("fgd_reference")


def test_tuned_stream_submits_every_pod_once_plus_extras_to_the_target():
    # the artifact's workload tuning: 4 pods asking 0.5 GPU each on 2 GPUs (1.0 of capacity) -> to 1.3 x 2 GPUs
    pods = [Job(f"p{i}", 0.0, 1.0, 1, 500, cpu_milli=1000, ram_mib=1000, true_util_pct=50.0, true_mem_mb=1000.0,
                pred_util_pct=50.0, pred_mem_mb=1000.0) for i in range(4)]
    spec = ClusterSpec((node("n0"),), "hand-made", enforce_milli=True)
    fill = Fill(pods, spec, BestFitRef(), seed=3, sampling="tuned", tune=1.3)
    order = fill.order
    assert sorted(set(order)) == [0, 1, 2, 3] and len(order) == 5  # 4 originals + 1 extra (2.5 of 2.6 GPUs)
    fill.run()
    assert fill.submitted == 4  # the fill stops when the arrived request reaches 100 % of capacity
    # a list above the target loses pods at random: 8 of 0.5 GPU on one 2-GPU node at tune 1.3 keep 5
    many = [Job(f"q{i}", 0.0, 1.0, 1, 500, cpu_milli=1000, ram_mib=1000, true_util_pct=50.0, true_mem_mb=1000.0,
                pred_util_pct=50.0, pred_mem_mb=1000.0) for i in range(8)]
    assert len(Fill(many, spec, BestFitRef(), seed=0, sampling="tuned").order) == 5
    with pytest.raises(ValueError, match="sampling"):
        Fill(pods, spec, BestFitRef(), sampling="bogus")
