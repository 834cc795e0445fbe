"""FGD as the ATC'23 paper and its artifact define it: node CPU, memory and GPU type in the
fragmentation measure and in placement, CPU-only pods in the workload (issue 15, item 3)."""

from __future__ import annotations

import io
from dataclasses import replace

import numpy as np
import pytest

from scheduling.horus.cluster import (
    ClusterSpec,
    ClusterState,
    NodeSpec,
    PlacementError,
    WorkloadType,
    fgd_fragmentation,
    gpu_type_allows,
    workload_types,
)
from scheduling.horus.policies import FGD, POLICIES, BestFit, make_policy
from scheduling.horus.simulator import simulate_fill
from scheduling.horus.traces import (
    TraceFormatError,
    load_alibaba_pods,
    with_cpu_pods,
    with_gpu_types,
)

from .helpers import job, view

ONE_GPU = [WorkloadType(1, 1000, 1.0)]
PODS_HEAD = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"


def one_node_free(*free):
    return np.array([list(free)], dtype=np.int64)


def test_idle_gpus_are_fragments_for_a_cpu_only_task_type():
    nf = one_node_free(1000, 1000)
    assert fgd_fragmentation(nf, [WorkloadType(0, 0, 1.0, cpu_milli=4000)])[0] == 2000
    assert fgd_fragmentation(nf, ONE_GPU)[0] == 0


def test_a_node_without_the_typical_pods_cpu_or_memory_is_all_fragment():
    nf = one_node_free(1000, 1000)
    t = [WorkloadType(1, 1000, 1.0, cpu_milli=8000, ram_mib=16384)]
    assert fgd_fragmentation(nf, t, cpu_free=np.array([16000.0]), ram_free=np.array([65536.0]))[0] == 0
    assert fgd_fragmentation(nf, t, cpu_free=np.array([4000.0]), ram_free=np.array([65536.0]))[0] == 2000
    assert fgd_fragmentation(nf, t, cpu_free=np.array([16000.0]), ram_free=np.array([8192.0]))[0] == 2000


def test_a_gpu_type_mismatch_makes_the_node_all_fragment():
    nf = one_node_free(1000, 400)
    t = [WorkloadType(1, 500, 1.0, gpu_type="T4")]
    assert fgd_fragmentation(nf, t, access=np.array([[True]]))[0] == 400  # the 400 left is too small
    assert fgd_fragmentation(nf, t, access=np.array([[False]]))[0] == 1400
    assert gpu_type_allows("V100M16|V100M32", "V100M32") and not gpu_type_allows("V100M16", "T4")
    assert gpu_type_allows("", "T4")


def test_workload_keeps_cpu_only_shapes_and_cuts_at_the_popularity_threshold():
    jobs = [job(f"a{i}", 0, 1) for i in range(6)] + [replace(job(f"c{i}", 0, 1), num_gpus=0, gpu_milli=0, cpu_milli=2000)
                                                      for i in range(3)] + [job("rare", 0, 1, milli=300)]
    full = workload_types(jobs)
    assert {(t.num_gpus, t.milli, t.cpu_milli) for t in full} == {(1, 1000, 0), (0, 0, 2000), (1, 300, 0)}
    cut = workload_types(jobs, popularity=0.9)  # the 10 % tail (one pod) goes
    assert {(t.num_gpus, t.milli) for t in cut} == {(1, 1000), (0, 0)}
    assert sum(t.p for t in cut) == pytest.approx(1.0)
    assert dict(((t.num_gpus, t.milli), t.p) for t in cut)[(0, 0)] == pytest.approx(1 / 3)


def test_gpu_spec_is_parsed_and_cpu_only_pods_are_kept():
    text = PODS_HEAD + ("p0,4000,8192,1,500,V100M32|V100M16,LS,Running,0,9,0\n"
                        "p1,2000,4096,0,0,,LS,Running,0,9,0\n"
                        "p2,2000,4096,1,1000,,LS,Running,0,9,0\n")
    pods = load_alibaba_pods(io.StringIO(text), name="pods.csv")
    assert [(p.num_gpus, p.gpu_type) for p in pods] == [(1, "V100M16|V100M32"), (0, ""), (1, "")]
    assert len(load_alibaba_pods(io.StringIO(text), gpu_only=True)) == 2
    with pytest.raises(TraceFormatError) as e:
        load_alibaba_pods(io.StringIO(PODS_HEAD + "p0,1,1,1,500,V100;rm -rf,LS,Running,0,9,0\n"), name="pods.csv")
    assert e.value.line == 2 and e.value.column == "gpu_spec"


TWO_TYPES = ClusterSpec((NodeSpec("t4", 2, "T4", 16384.0, 32000, 131072), NodeSpec("v100", 2, "V100M16", 16384.0, 32000, 131072)),
                        "two-types", enforce_milli=True)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_honours_a_pods_gpu_type(name):
    s = ClusterState(TWO_TYPES)
    v = replace(view("x", milli=500, cpu=1000, ram=1024), gpu_type="V100M16", single_node=True)
    gpus = make_policy(name).place(v, s.view(), 0.0)
    assert gpus is not None and all(s.gpu_node[g] == 1 for g in gpus)
    with pytest.raises(PlacementError, match="asks for V100M16"):
        s.check_placement(v, [0])


def test_fgd_puts_a_cpu_only_pod_where_it_strands_no_gpus():
    """Node a's GPUs are all taken, node b's are idle: FGD puts the CPU pod on a, so the GPU pods keep
    b's CPU; first fit would take b's CPU and strand both its GPUs."""
    spec = ClusterSpec((NodeSpec("a", 1, "V100", 16384.0, 16000, 65536), NodeSpec("b", 2, "V100", 16384.0, 16000, 65536)),
                       "cpu", enforce_milli=True)
    s = ClusterState(spec)
    s.workload = [WorkloadType(1, 1000, 1.0, cpu_milli=8000)]
    s.add(view("busy", cpu=2000), [0], true_util=50, true_mem=1000, now=0)
    cpu_pod = replace(view("c", cpu=10000), num_gpus=0, gpu_milli=0)
    assert FGD().place_cpu_pod(cpu_pod, s.view()) == 0
    assert BestFit().place_cpu_pod(cpu_pod, s.view()) == 0  # least CPU left
    s.add_cpu_pod(cpu_pod, 0)
    fr, free = s.fragmentation()
    assert (fr, free) == (0.0, 2000.0)


def _small_alibaba(n_pods=600, seed=0):
    """A 12-node cluster of two GPU types and a pod mix like the trace's (shares, whole GPUs, CPU-only)."""
    nodes = tuple(NodeSpec(f"n{i}", 4, "T4" if i % 2 else "V100M16", 16384.0, 48000, 196608) for i in range(12))
    spec = ClusterSpec(nodes, "small", enforce_milli=True)
    rng = np.random.default_rng(seed)
    pods = []
    for i in range(n_pods):
        kind = rng.choice(["share", "whole", "cpu"], p=[0.45, 0.4, 0.15])
        milli = int(rng.choice([250, 500, 700])) if kind == "share" else 1000
        pods.append(replace(job(f"p{i}", 0, 1, util=min(milli / 10, 60), mem=2000, milli=milli), single_node=True,
                            num_gpus=0 if kind == "cpu" else 1, gpu_milli=0 if kind == "cpu" else milli,
                            cpu_milli=int(rng.choice([4000, 8000, 12000])), ram_mib=16384))
    return spec, pods


def _unallocated(pods, spec, name, seeds=(0, 1, 2)):
    return float(np.mean([simulate_fill(pods, spec, make_policy(name), seed=s).unallocated_gpus for s in seeds]))


def test_more_gpu_typed_pods_leave_more_gpus_unallocated():
    """Pods typed to the cluster's scarcer model queue for its few GPUs while the others stay idle:
    the more of them, the more GPUs are left unallocated (FGD's gpuspec workloads)."""
    spec, pods = _small_alibaba()
    typed = with_gpu_types(pods, 0.6, spec.nodes, seed=1)
    assert sum(bool(p.gpu_type) for p in typed) == round(0.6 * sum(p.num_gpus > 0 for p in pods))
    assert {p.gpu_type for p in typed} == {"", "T4", "V100M16"}
    def to_t4(share):
        gpu = [i for i, p in enumerate(pods) if p.num_gpus]
        chosen = set(gpu[: int(share * len(gpu))])
        return [replace(p, gpu_type="T4") if i in chosen else p for i, p in enumerate(pods)]
    few, many = _unallocated(to_t4(0.6), spec, "fgd"), _unallocated(to_t4(0.9), spec, "fgd")  # T4: half the GPUs
    assert _unallocated(pods, spec, "fgd") < few < many


def test_more_cpu_only_pods_leave_more_gpus_unallocated():
    spec, pods = _small_alibaba()
    heavy = with_cpu_pods(pods, 0.5, seed=1)
    assert sum(p.num_gpus == 0 for p in heavy) / len(heavy) == pytest.approx(0.5, abs=0.01)
    r = simulate_fill(heavy, spec, make_policy("fgd"), seed=0)
    assert r.cpu_pods["placed"] > 0
    assert _unallocated(heavy, spec, "fgd") > _unallocated(pods, spec, "fgd")
