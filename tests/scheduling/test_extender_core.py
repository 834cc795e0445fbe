"""The scheduler extender's decisions (scheduling.horus.extender), without Django, on requests in the
shapes kube-scheduler sends (k8s.io/kube-scheduler/extender/v1, recorded as JSON fixtures)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from scheduling.horus import extender as ext
from scheduling.horus.cluster import ClusterSpec, ClusterState, JobView, NodeSpec
from scheduling.horus.policies import make_policy

FIXTURES = Path(__file__).parent / "extender_fixtures"


def fixture(name: str, model_ref: str = "7") -> dict:
    return json.loads((FIXTURES / name).read_text().replace("MODEL_REF", model_ref))


def node(name: str, n_gpus: int = 2, *, loads: list[tuple[list[int], float, float]] = (),
         indices: tuple[int, ...] | None = None) -> ext.ExtenderNode:
    state = ClusterState(ClusterSpec((NodeSpec(name, n_gpus, "V100", 16384.0),), "t"))
    for k, (gpus, util, mem) in enumerate(loads):
        view = JobView(job_id=f"{name}-{k}", submit_time=0.0, num_gpus=len(gpus), pred_util_pct=util,
                       pred_mem_mb=mem)
        state.add(view, gpus, true_util=util, true_mem=mem, now=0.0)
    return ext.ExtenderNode(state=state, gpu_indices=indices or tuple(range(n_gpus)))


def job(num_gpus=1, util=40.0, mem=3000.0) -> JobView:
    return JobView(job_id="pod:x", submit_time=0.0, num_gpus=num_gpus, pred_util_pct=util, pred_mem_mb=mem,
                   single_node=num_gpus > 1)


HORUS = make_policy("horus")


def test_parse_pod_reads_the_annotations():
    pod = ext.extender_pod(fixture("filter_args_nodelist.json", "team-a/resnet50"))
    assert pod == ext.PodRequest(namespace="team-a", name="resnet-infer-7f9c",
                                 uid="0f6d3c52-5b0e-4a55-9f1e-2d7c1c9c7a10", model_ref="team-a/resnet50",
                                 batch_size=8, num_gpus=1)
    assert ext.extender_pod(fixture("filter_args_foreign_pod.json")) is None


@pytest.mark.parametrize("key,value", [("dlopt.io/gpus", "0"), ("dlopt.io/gpus", "17"), ("dlopt.io/gpus", "two"),
                                       ("dlopt.io/batch-size", "-1"), ("dlopt.io/batch-size", "99999"),
                                       ("dlopt.io/model", "../../etc"), ("dlopt.io/model", 7)])
def test_bad_annotations_are_refused(key, value):
    args = fixture("filter_args_nodelist.json")
    args["Pod"]["metadata"]["annotations"][key] = value
    with pytest.raises(ext.ExtenderError):
        ext.extender_pod(args)


@pytest.mark.parametrize("mutate", [
    lambda a: a.pop("Nodes"),                                   # neither Nodes nor NodeNames
    lambda a: a.update(Nodes={"items": "gpu-a"}),
    lambda a: a.update(Nodes={"items": [{"metadata": {"name": "Bad_Name"}}]}),
    lambda a: a.update(Pod=["not", "a", "pod"]),
])
def test_malformed_extender_args_are_refused(mutate):
    args = fixture("filter_args_nodelist.json")
    mutate(args)
    with pytest.raises(ext.ExtenderError):
        ext.filter_nodes(args, {}, job(), HORUS, 0.0) if "Pod" in args and isinstance(args["Pod"], dict) \
            else ext.extender_pod(args)


def test_filter_keeps_nodes_the_policy_places_on_and_says_why_not_for_others():
    args = fixture("filter_args_nodelist.json")
    full = node("gpu-a", loads=[([0], 30, 1000), ([0], 30, 1000), ([0], 30, 1000),
                                ([1], 30, 1000), ([1], 30, 1000), ([1], 30, 1000)])  # 3 jobs on each GPU
    result = ext.filter_nodes(args, {"gpu-a": full, "gpu-b": node("gpu-b")}, job(), HORUS, 0.0)
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["gpu-b"]
    assert result["Nodes"]["items"][0] == args["Nodes"]["items"][1]  # the node object passed back as sent
    assert result["NodeNames"] is None and result["Error"] == ""
    assert set(result["FailedNodes"]) == {"gpu-a", "cpu-only-1"}
    assert "not a dlopt GPU node" in result["FailedNodes"]["cpu-only-1"]
    assert "fit" in result["FailedNodes"]["gpu-a"]
    json.dumps(result)  # what the view sends


def test_filter_answers_node_names_when_asked_by_name_and_passes_foreign_pods():
    args = fixture("filter_args_foreign_pod.json")
    result = ext.filter_nodes(args, {}, None, HORUS, 0.0)
    assert result["NodeNames"] == ["gpu-a", "cpu-only-1"] and result["FailedNodes"] == {}
    assert result["Nodes"] is None


def test_a_gang_passes_only_nodes_with_all_its_gpus():
    args = fixture("prioritize_args_nodenames.json")
    half = node("gpu-a", loads=[([0], 10, 15000)])  # GPU 0's memory is taken: only one GPU left
    result = ext.filter_nodes(args, {"gpu-a": half, "gpu-b": node("gpu-b")}, job(num_gpus=2), HORUS, 0.0)
    assert result["NodeNames"] == ["gpu-b"]
    assert "2 GPU(s)" in result["FailedNodes"]["gpu-a"]
    one_gpu = node("gpu-b", n_gpus=1)
    result = ext.filter_nodes(args, {"gpu-b": one_gpu}, job(num_gpus=2), HORUS, 0.0)
    assert "2 GPUs requested, the node has 1" in result["FailedNodes"]["gpu-b"]


def test_prioritize_scores_by_horus_cost_from_0_to_10():
    args = fixture("prioritize_args_nodenames.json")
    args["Pod"]["metadata"]["annotations"]["dlopt.io/gpus"] = "1"
    busy = node("gpu-a", loads=[([0], 60, 6000), ([1], 60, 6000)])
    idle = node("gpu-b")
    scores = ext.prioritize(args, {"gpu-a": busy, "gpu-b": idle}, job(util=50), HORUS, 0.0)
    assert scores == [{"Host": "gpu-a", "Score": 0}, {"Host": "gpu-b", "Score": 10},
                      {"Host": "cpu-only-1", "Score": 0}]
    assert all(isinstance(s["Score"], int) and 0 <= s["Score"] <= ext.MAX_EXTENDER_PRIORITY for s in scores)


def test_prioritize_ranks_between_best_and_worst_and_is_neutral_for_foreign_pods():
    args = fixture("prioritize_args_nodenames.json")
    nodes = {"gpu-a": node("gpu-a", loads=[([0], 70, 8000), ([1], 70, 8000)]),
             "gpu-b": node("gpu-b", loads=[([0], 20, 2000), ([1], 20, 2000)]),
             "cpu-only-1": node("cpu-only-1")}
    scores = {s["Host"]: s["Score"] for s in ext.prioritize(args, nodes, job(num_gpus=2), HORUS, 0.0)}
    assert scores["cpu-only-1"] == 10 and scores["gpu-a"] == 0 and 0 < scores["gpu-b"] < 10
    foreign = ext.prioritize(fixture("filter_args_foreign_pod.json"), nodes, None, HORUS, 0.0)
    assert all(s["Score"] == 0 for s in foreign)


def test_choose_gpus_takes_a_whole_gang_on_the_node_or_refuses():
    n = node("gpu-b", n_gpus=4, loads=[([1], 90, 15500)], indices=(0, 1, 2, 3))
    flat, score = ext.choose_gpus(n, job(num_gpus=2), HORUS, 0.0)
    assert len(flat) == 2 and 1 not in flat and score is not None
    crowded = node("gpu-b", n_gpus=2, loads=[([1], 90, 15500)])
    with pytest.raises(ext.ExtenderError, match="Cannot bind"):
        ext.choose_gpus(crowded, job(num_gpus=2), HORUS, 0.0)


def test_a_single_gpu_pod_goes_where_horus_cost_is_lowest():
    n = node("gpu-b", n_gpus=3, loads=[([0], 80, 4000), ([2], 20, 1000)])
    flat, _ = ext.choose_gpus(n, job(util=40), HORUS, 0.0)
    assert flat == [1]  # the empty GPU: no co-location cost


def test_binding_args_are_validated():
    args = fixture("bind_args.json")
    assert ext.binding_args(args) == ("team-a", "resnet-infer-7f9c", "0f6d3c52-5b0e-4a55-9f1e-2d7c1c9c7a10", "gpu-b")
    for key, bad in (("Node", "../etc"), ("PodUID", "x" * 65), ("PodName", None)):
        broken = copy.deepcopy(args)
        broken[key] = bad
        with pytest.raises(ext.ExtenderError):
            ext.binding_args(broken)
