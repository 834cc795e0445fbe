"""A Kubernetes scheduler extender's decisions, with the live placement's policy (no Django, no HTTP).

kube-scheduler calls an extender over HTTP with JSON whose shapes are the Go types of
``k8s.io/kube-scheduler/extender/v1`` (field names as Go writes them, no JSON tags):

* filter and prioritize get ``ExtenderArgs`` ``{"Pod": v1.Pod, "Nodes": v1.NodeList | null,
  "NodeNames": [str] | null}`` (``Nodes`` when the extender is not ``nodeCacheCapable``, else
  ``NodeNames``);
* filter answers ``ExtenderFilterResult`` ``{"Nodes" | "NodeNames", "FailedNodes": {name: reason},
  "FailedAndUnresolvableNodes": {}, "Error": str}``, in the form it was asked;
* prioritize answers ``HostPriorityList`` ``[{"Host": name, "Score": int}]``, scores ``0..10``
  (``MaxExtenderPriority``), multiplied by the extender's ``weight`` by kube-scheduler;
* bind gets ``ExtenderBindingArgs`` ``{"PodName", "PodNamespace", "PodUID", "Node"}`` and answers
  ``ExtenderBindingResult`` ``{"Error": str}``.

A pod is the platform's when its annotations name a registered model (:data:`ANNOTATION_MODEL`); its
batch size and GPU count are :data:`ANNOTATION_BATCH_SIZE` and :data:`ANNOTATION_GPUS`. Other pods pass
the filter unchanged and score 0 everywhere (they are not ours to judge). For ours, each candidate
node's GPUs are a :class:`ExtenderNode` (a ``ClusterState`` of that node alone, with the NVML index of
each flat GPU), and the placement policy (Horus, as the live placement passes use it) decides: a node
passes when the policy places the pod on it; its priority is the policy's cost of that placement,
best node 10, worst 0; bind picks the GPUs the policy chooses on the bound node. A gang (more than one
GPU) is placed on one node as a unit: every GPU it asks for, or none.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .cluster import ClusterState, JobView
from .policies import PlacementPolicy

__all__ = [
    "ANNOTATION_BATCH_SIZE",
    "ANNOTATION_GPUS",
    "ANNOTATION_GPU_INDEX",
    "ANNOTATION_GPU_UUIDS",
    "ANNOTATION_MODEL",
    "MAX_EXTENDER_PRIORITY",
    "MAX_GANG_GPUS",
    "ExtenderError",
    "ExtenderNode",
    "PodRequest",
    "binding_args",
    "bind_result",
    "candidate_node_names",
    "choose_gpus",
    "filter_nodes",
    "parse_pod",
    "prioritize",
    "release_args",
]

ANNOTATION_MODEL = "dlopt.io/model"
ANNOTATION_BATCH_SIZE = "dlopt.io/batch-size"
ANNOTATION_GPUS = "dlopt.io/gpus"
#: written on the pod at bind: the NVML indices of its GPUs on the node, comma-separated (what a
#: GPU-sharing device plugin reads in Allocate, as Aliyun gpushare reads ``ALIYUN_COM_GPU_MEM_IDX``)
ANNOTATION_GPU_INDEX = "dlopt.io/gpu-index"
ANNOTATION_GPU_UUIDS = "dlopt.io/gpu-uuids"
MAX_EXTENDER_PRIORITY = 10
#: the largest gang a pod may ask for (one node's GPUs; NVIDIA's largest boards have 16)
MAX_GANG_GPUS = 16
DEFAULT_BATCH_SIZE = 1
MAX_BATCH_SIZE = 4096

# DNS-1123 names (namespaces, node names: subdomains) and UIDs, as Kubernetes validates them
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_UID = re.compile(r"^[A-Za-z0-9-]{1,64}$")
_DIGITS = re.compile(r"[0-9]{1,9}")
_MODEL_REF = re.compile(r"^(\d{1,18}|[a-z0-9][-a-z0-9_]{0,99}/[^/\x00-\x1f]{1,100})$")


class ExtenderError(ValueError):
    """A request kube-scheduler would not send (malformed JSON shapes, bad annotations): a 400."""


@dataclass(frozen=True)
class PodRequest:
    """What a pod asks of the platform: a registered model (``"<id>"`` or ``"<team-slug>/<name>"``),
    a batch size and a GPU count."""

    namespace: str
    name: str
    uid: str
    model_ref: str
    batch_size: int
    num_gpus: int


@dataclass(frozen=True)
class ExtenderNode:
    """One node's schedulable GPUs: ``state`` holds them alone (flat index ``i`` is NVML index
    ``gpu_indices[i]``) with their load (placed jobs, bound pods, fresh samples)."""

    state: ClusterState
    gpu_indices: tuple[int, ...]


def _dict(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ExtenderError(f"{what} must be a JSON object.")
    return value


def _field(obj: Mapping[str, Any], name: str) -> Any:
    """A Go-encoded field (``Pod``); Go's decoder also accepts it in any case, so do we."""
    if name in obj:
        return obj[name]
    lower = name.lower()
    for k, v in obj.items():
        if isinstance(k, str) and k.lower() == lower:
            return v
    return None


def _int_annotation(annotations: Mapping[str, Any], key: str, default: int, high: int) -> int:
    raw = annotations.get(key)
    if raw is None:
        return default
    # ASCII digits: str.isdigit() also takes "²", which int() refuses
    if not isinstance(raw, str) or not _DIGITS.fullmatch(raw.strip()) or not 1 <= int(raw) <= high:
        raise ExtenderError(f"Annotation {key} must be an integer from 1 to {high}; got {str(raw)[:40]!r}.")
    return int(raw)


def parse_pod(pod: Any) -> PodRequest | None:
    """The pod's request, or None when it names no model (not the platform's pod)."""
    pod = _dict(pod, "Pod")
    meta = _dict(pod.get("metadata") or {}, "Pod.metadata")
    annotations = _dict(meta.get("annotations") or {}, "Pod.metadata.annotations")
    model_ref = annotations.get(ANNOTATION_MODEL)
    if model_ref is None:
        return None
    if not isinstance(model_ref, str) or not _MODEL_REF.match(model_ref.strip()):
        raise ExtenderError(f"Annotation {ANNOTATION_MODEL} must be a model id or '<team-slug>/<model name>'.")
    namespace, name, uid = meta.get("namespace") or "default", meta.get("name"), meta.get("uid") or ""
    if (
        not isinstance(name, str)
        or not _NAME.match(name)
        or not isinstance(namespace, str)
        or not _NAME.match(namespace)
        or not isinstance(uid, str)
        or (uid and not _UID.match(uid))
    ):
        raise ExtenderError("Pod.metadata needs a valid name, namespace and uid.")
    return PodRequest(
        namespace=namespace,
        name=name,
        uid=uid,
        model_ref=model_ref.strip(),
        batch_size=_int_annotation(annotations, ANNOTATION_BATCH_SIZE, DEFAULT_BATCH_SIZE, MAX_BATCH_SIZE),
        num_gpus=_int_annotation(annotations, ANNOTATION_GPUS, 1, MAX_GANG_GPUS),
    )


def candidate_node_names(args: Any) -> tuple[list[str], list[dict[str, Any]] | None]:
    """``(names, node objects or None)``: from ``Nodes.items`` when sent, else ``NodeNames``."""
    args = _dict(args, "ExtenderArgs")
    nodes = _field(args, "Nodes")
    if nodes is not None:
        items = _dict(nodes, "Nodes").get("items")
        if not isinstance(items, list):
            raise ExtenderError("Nodes.items must be a list of nodes.")
        names = []
        for item in items:
            name = _dict(_dict(item, "Nodes.items[]").get("metadata") or {}, "node metadata").get("name")
            if not isinstance(name, str) or not _NAME.match(name):
                raise ExtenderError("Every node in Nodes.items needs a valid metadata.name.")
            names.append(name)
        return names, items
    names = _field(args, "NodeNames")
    if not isinstance(names, list) or not all(isinstance(n, str) and _NAME.match(n) for n in names):
        raise ExtenderError("ExtenderArgs needs Nodes (a NodeList) or NodeNames (a list of node names).")
    return list(names), None


def extender_pod(args: Any) -> PodRequest | None:
    return parse_pod(_field(_dict(args, "ExtenderArgs"), "Pod"))


def _placement(node: ExtenderNode, job: JobView, policy: PlacementPolicy, now: float) -> list[int] | None:
    """The flat GPUs of the node the policy places the job on: all ``job.num_gpus`` of them, or None."""
    if node.state.n_gpus < job.num_gpus:
        return None
    chosen = policy.place(job, node.state.view(), now)
    if not chosen or len(chosen) != job.num_gpus:
        return None
    return [int(g) for g in chosen]


def _why_not(node: ExtenderNode | None, job: JobView) -> str:
    if node is None:
        return "not a dlopt GPU node (no registered, live, undrained GPU of that name)"
    if node.state.n_gpus < job.num_gpus:
        return f"{job.num_gpus} GPUs requested, the node has {node.state.n_gpus} schedulable"
    return (
        f"no {job.num_gpus} GPU(s) here fit the predicted {job.pred_util_pct:.0f} % / {job.pred_mem_mb:.0f} MB "
        "under the placement policy (jobs per GPU or memory headroom)"
    )


def filter_nodes(
    args: Any, nodes: Mapping[str, ExtenderNode], job: JobView | None, policy: PlacementPolicy, now: float
) -> dict[str, Any]:
    """``ExtenderFilterResult``: the candidate nodes on which the policy places the job (all of them when
    ``job`` is None: a pod that is not the platform's), in the form they were sent, and why each other
    one failed."""
    names, items = candidate_node_names(args)
    failed: dict[str, str] = {}
    keep: list[int] = []
    for i, name in enumerate(names):
        if job is None:
            keep.append(i)
            continue
        node = nodes.get(name)
        if node is not None and _placement(node, job, policy, now) is not None:
            keep.append(i)
        else:
            failed[name] = _why_not(node, job)
    result: dict[str, Any] = {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
    if items is not None:
        result["Nodes"] = {"apiVersion": "v1", "kind": "NodeList", "items": [items[i] for i in keep]}
    else:
        result["NodeNames"] = [names[i] for i in keep]
    return result


def prioritize(
    args: Any, nodes: Mapping[str, ExtenderNode], job: JobView | None, policy: PlacementPolicy, now: float
) -> list[dict[str, Any]]:
    """``HostPriorityList``: the policy's cost of placing the job on each node's chosen GPUs, mapped to
    0..10 (cheapest 10, dearest 0; one cost or a policy without costs: 10); a node it cannot use, 0."""
    names, _ = candidate_node_names(args)
    costs: dict[str, float | None] = {}
    if job is not None:
        for name in names:
            node = nodes.get(name)
            chosen = None if node is None else _placement(node, job, policy, now)
            if node is not None and chosen is not None:
                cost = policy.score(job, node.state.view(), chosen)
                costs[name] = cost if cost is not None and math.isfinite(cost) else None
    ranked = [c for c in costs.values() if c is not None]
    low, high = (min(ranked), max(ranked)) if ranked else (0.0, 0.0)
    out = []
    for name in names:
        node_cost = costs.get(name)
        if name not in costs:
            score = 0
        elif node_cost is None or high - low < 1e-12:
            score = MAX_EXTENDER_PRIORITY
        else:
            score = int(round(MAX_EXTENDER_PRIORITY * (high - node_cost) / (high - low)))
        out.append({"Host": name, "Score": score})
    return out


def binding_args(args: Any) -> tuple[str, str, str, str]:
    """``(pod namespace, pod name, pod UID, node)`` of ``ExtenderBindingArgs``."""
    args = _dict(args, "ExtenderBindingArgs")
    ns, name, uid, node = (_field(args, k) for k in ("PodNamespace", "PodName", "PodUID", "Node"))
    for what, value, pattern in (
        ("PodNamespace", ns, _NAME),
        ("PodName", name, _NAME),
        ("PodUID", uid, _UID),
        ("Node", node, _NAME),
    ):
        if not isinstance(value, str) or not pattern.match(value):
            raise ExtenderError(f"ExtenderBindingArgs.{what} is missing or not a valid Kubernetes name.")
    return ns, name, uid, node


def release_args(args: Any) -> str:
    """The pod UID of a release request ``{"PodUID": str}``, checked as bind checks it."""
    uid = _field(_dict(args, "The release request"), "PodUID")
    if not isinstance(uid, str) or not _UID.fullmatch(uid):
        raise ExtenderError('Send {"PodUID": "<the ended pod\'s UID>"}.')
    return uid


def choose_gpus(
    node: ExtenderNode, job: JobView, policy: PlacementPolicy, now: float
) -> tuple[list[int], float | None]:
    """``(flat GPUs, policy cost)`` for binding the job to the node: every GPU of a gang at once; an
    ExtenderError when none fit (the node filled up since filter)."""
    chosen = _placement(node, job, policy, now)
    if chosen is None:
        raise ExtenderError(f"Cannot bind: {_why_not(node, job)}.")
    return chosen, policy.score(job, node.state.view(), chosen)


def bind_result(error: str = "") -> dict[str, str]:
    return {"Error": error}
