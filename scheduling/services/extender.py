"""The Kubernetes scheduler extender: filter, prioritize, bind and release pods that name a model.

The decisions are ``scheduling.horus.extender`` (Django-free) with the live placement's policy
(``SCHEDULING_POLICY``) over each candidate node's schedulable GPUs and their load: placed GPU jobs,
pods bound earlier and fresh telemetry. Bind records one :class:`PodBinding` per GPU of the pod (under
the same GPU row locks as a placement pass), writes ``dlopt.io/gpu-index`` on the pod and binds it
through the API server; a failure there rolls the record back and answers the error to kube-scheduler.

A bound pod costs its model's team GPU time, as a GPU job does: bind reserves the most a binding can hold
(the binding TTL per GPU) against the team's monthly GPU-hour quota and refuses a pod that does not fit
(:class:`QuotaExceeded`, a 429); the time it held is charged to the team's usage ledger when it is
released or, unreleased, when the TTL has passed (:func:`settle_expired_pod_bindings`, each heartbeat).
"""
from __future__ import annotations

import datetime as dt
import hmac
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.exceptions import NotFound, PermissionDenied, QuotaExceeded, ServiceError
from core.models import DLModel
from core.services import lock_team_quota, require_ready

from .. import adapters, selectors
from ..adapters import extender_core as core
from ..kube_api import KubeApi, KubeApiError, in_cluster_url
from ..models import GPU, PodBinding
from .jobs import check_gpu_quota
from .placement import _lock_gpus, default_policy, request_placement_pass
from .predictors import predict_job
from .usage import charge_pod_binding

log = logging.getLogger(__name__)

ExtenderError = core.ExtenderError


def extender_enabled() -> bool:
    return bool(settings.SCHEDULER_EXTENDER_TOKEN)


def token_matches(presented: str) -> bool:
    """Constant-time check of a presented Bearer token against SCHEDULER_EXTENDER_TOKEN."""
    expected = settings.SCHEDULER_EXTENDER_TOKEN
    return bool(expected) and hmac.compare_digest(presented.encode(), expected.encode())


def resolve_model(ref: str) -> DLModel:
    """A registered, ready, unarchived model by id or ``<team-slug>/<name>``."""
    qs = DLModel.objects.filter(archived_at__isnull=True).select_related("team")
    if "/" in ref:
        slug, name = ref.split("/", 1)
        model = qs.filter(team__slug=slug, name=name).first()
    else:
        model = qs.filter(pk=int(ref)).first()
    if model is None:
        raise NotFound(f"No registered model '{ref}' (annotation {core.ANNOTATION_MODEL}).", field="model")
    require_ready(model)
    return model


def _job_view(pod: core.PodRequest | None, now: dt.datetime):
    if pod is None:
        return None
    model = resolve_model(pod.model_ref)
    if settings.SCHEDULER_EXTENDER_TEAM_NAMESPACES and pod.namespace != model.team.slug:
        # a namespace stands for the team of the same slug: no pod borrows another team's models
        raise PermissionDenied(f"Pods in namespace '{pod.namespace}' may use only the models of team "
                               f"'{pod.namespace}'; model '{pod.model_ref}' is not one of them.", field="model")
    prediction = predict_job(model=model, batch_size=pod.batch_size)
    return adapters.extender_job_view(pod_uid=pod.uid or f"{pod.namespace}/{pod.name}", num_gpus=pod.num_gpus,
                                      batch_size=pod.batch_size, model_name=model.name, prediction=prediction,
                                      now=now), model


def _nodes(names: list[str], now: dt.datetime, gpus: list[GPU] | None = None) -> dict[str, core.ExtenderNode]:
    """The asked-for nodes' schedulable GPUs and their load (a Kubernetes node name is the dlopt node's
    name, DLOPT_NODE_NAME)."""
    wanted = set(names)
    by_node: dict[str, list[GPU]] = {}
    for g in gpus if gpus is not None else selectors.schedulable_gpus(now):
        if g.node.name in wanted:
            by_node.setdefault(g.node.name, []).append(g)
    ids = [g.pk for group in by_node.values() for g in group]
    fresh = selectors.latest_samples(ids, since=now - dt.timedelta(seconds=selectors.telemetry_fresh_s()))
    placements = list(selectors.active_placements_on(ids))
    bound = list(selectors.active_pod_bindings_on(ids, now))
    out = {}
    for name, group in by_node.items():
        own = {g.pk for g in group}
        out[name] = adapters.extender_node(group, active=[p for p in placements if p.gpu_id in own],
                                           samples={k: v for k, v in fresh.items() if k in own},
                                           bound=[b for b in bound if b.gpu_id in own])
    return out


def _decide(args: Any, now: dt.datetime):
    names, _ = core.candidate_node_names(args)
    found = _job_view(core.extender_pod(args), now)
    job = None if found is None else found[0]
    policy = adapters.make_live_policy(default_policy(), now)
    return names, job, policy


def filter_pod(*, args: Any, now: dt.datetime | None = None) -> dict[str, Any]:
    """``ExtenderFilterResult`` for ``ExtenderArgs``; a pod naming an unusable model gets its ``Error``."""
    now = now or timezone.now()
    try:
        names, job, policy = _decide(args, now)
    except ServiceError as exc:  # the pod names a model it cannot use: kube-scheduler reports this error
        return {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                "Error": str(exc)}
    return core.filter_nodes(args, _nodes(names, now) if job else {}, job, policy, now.timestamp())


def prioritize_pod(*, args: Any, now: dt.datetime | None = None) -> list[dict[str, Any]]:
    """``HostPriorityList`` for ``ExtenderArgs`` (a ServiceError when the pod's model is unusable)."""
    now = now or timezone.now()
    names, job, policy = _decide(args, now)
    return core.prioritize(args, _nodes(names, now) if job else {}, job, policy, now.timestamp())


def kube_api() -> KubeApi:
    url = settings.SCHEDULER_EXTENDER_KUBE_API_URL or in_cluster_url()
    if not url:
        raise ServiceError("No Kubernetes API server is configured (SCHEDULER_EXTENDER_KUBE_API_URL) and this "
                           "process is not in a cluster: the extender cannot bind.", code="no_kube_api")
    token_file = Path(settings.SCHEDULER_EXTENDER_KUBE_TOKEN_FILE)
    token = token_file.read_text().strip() if token_file.is_file() else ""
    ca = settings.SCHEDULER_EXTENDER_KUBE_CA_FILE
    return KubeApi(base_url=url, token=token, ca_file=ca if Path(ca).is_file() else "")


def _record_binding(pod: core.PodRequest, uid: str, node_name: str, now: dt.datetime) -> list[PodBinding]:
    """Choose the pod's GPUs on the node (locked) and record them; the bindings the pod already has when
    kube-scheduler retries a bind."""
    job, model = _job_view(pod, now)
    # binds of one team's pods wait here for each other (the quota row, locked until the bind commits, before
    # the GPU rows, as submit_job does), so a bind retried while the first is still at the API server finds
    # the first's bindings below instead of choosing GPUs of its own
    lock_team_quota(model.team_id)
    # the pod's bindings past their expiry no heartbeat settled yet: settled now (their TTL charged), so they
    # hold no (pod, GPU) slot a new binding needs
    _release(list(selectors.expired_pod_bindings(now, pod_uid=uid).select_for_update(of=("self",))
                  .select_related("model")), lambda b: b.expires_at)
    existing = selectors.active_pod_bindings(uid, now)
    if existing:
        if any(b.gpu.node.name != node_name for b in existing):
            raise ServiceError(f"Pod {pod.namespace}/{pod.name} is already bound to another node.",
                               code="already_bound")
        return existing
    # the most a binding holds unreleased, per GPU: the team's quota must have room for it, as for a job's
    # declared duration
    ttl_s = selectors.extender_binding_ttl_s()
    check_gpu_quota(team_id=model.team_id, hours=ttl_s * pod.num_gpus / 3600.0,
                    what=f" by pod {pod.namespace}/{pod.name} ({pod.num_gpus} GPU(s) x {ttl_s / 3600.0:g} h, the "
                         f"binding TTL it may hold them unreleased; team '{model.team.slug}')")
    gpus = [g for g in selectors.schedulable_gpus(now) if g.node.name == node_name]
    if not gpus:
        raise ServiceError(f"Node {node_name} has no schedulable dlopt GPU.", code="no_gpu")
    _lock_gpus(gpus)
    node = _nodes([node_name], now, gpus=gpus).get(node_name)
    policy_name = default_policy()
    flat, score = core.choose_gpus(node, job, adapters.make_live_policy(policy_name, now), now.timestamp())
    by_index = {g.index: g for g in gpus}
    rows = [PodBinding(pod_uid=uid, pod_namespace=pod.namespace, pod_name=pod.name,
                       gpu=by_index[node.gpu_indices[i]], model=model, batch_size=pod.batch_size,
                       num_gpus=pod.num_gpus, predicted_util_pct=job.pred_util_pct,
                       predicted_mem_mb=job.pred_mem_mb, policy=policy_name, score=score, bound_at=now,
                       expires_at=now + dt.timedelta(seconds=ttl_s))
            for i in flat]
    return PodBinding.objects.bulk_create(rows)


def bind_pod(*, args: Any, api: KubeApi | None = None, now: dt.datetime | None = None) -> dict[str, str]:
    """``ExtenderBindingResult`` for ``ExtenderBindingArgs``: the pod's GPUs chosen and recorded, written
    on the pod (``dlopt.io/gpu-index``, ``dlopt.io/gpu-uuids``) and the pod bound to the node. A pod that
    names no model is bound without GPUs. Any failure is the result's ``Error`` and nothing is kept; a pod
    its team's GPU-hour quota has no room for raises QuotaExceeded (the view's 429), before any write."""
    namespace, name, uid, node_name = core.binding_args(args)
    now = now or timezone.now()
    try:
        api = api or kube_api()
        pod_object = api.get_pod(namespace, name)
        actual_uid = ((pod_object.get("metadata") or {}).get("uid") if isinstance(pod_object, dict) else None)
        if actual_uid != uid:
            raise ServiceError(f"Pod {namespace}/{name} has UID {actual_uid!r}, not {uid!r}: it was replaced.",
                               code="pod_replaced")
        pod = core.parse_pod(pod_object)
        with transaction.atomic():
            if pod is not None:
                rows = _record_binding(pod, uid, node_name, now)
                api.annotate_pod(namespace, name, {
                    core.ANNOTATION_GPU_INDEX: ",".join(str(b.gpu.index) for b in rows),
                    core.ANNOTATION_GPU_UUIDS: ",".join(b.gpu.uuid for b in rows)})
            api.bind_pod(namespace, name, uid, node_name)
    except QuotaExceeded as exc:
        log.warning("extender bind of %s/%s to %s refused: %s", namespace, name, node_name, exc)
        raise
    except (ServiceError, KubeApiError, ExtenderError) as exc:
        log.warning("extender bind of %s/%s to %s failed: %s", namespace, name, node_name, exc)
        return core.bind_result(str(exc))
    return core.bind_result()


def _release(bindings: list[PodBinding], released_at: Callable[[PodBinding], dt.datetime]) -> None:
    """Release the (locked) bindings and charge the GPU time each held to its team."""
    for b in bindings:
        b.released_at = released_at(b)
        b.save(update_fields=["released_at"])
        charge_pod_binding(b)


def release_pod(*, pod_uid: str, now: dt.datetime | None = None) -> int:
    """Free the GPUs of a pod that ended (its bindings released, the time they held charged to its team);
    how many were released."""
    now = now or timezone.now()
    with transaction.atomic():
        rows = list(PodBinding.objects.select_for_update(of=("self",)).select_related("model")
                    .filter(pod_uid=pod_uid, released_at__isnull=True))
        _release(rows, lambda b: now)
        if rows:
            request_placement_pass(only_if_pending=True)
    return len(rows)


def release_requested(*, args: Any, now: dt.datetime | None = None) -> dict[str, Any]:
    """``{"Released": how many, "Error": ""}`` for a release request ``{"PodUID": ...}`` (ExtenderError when
    it is malformed)."""
    return {"Released": release_pod(pod_uid=core.release_args(args), now=now), "Error": ""}


def settle_expired_pod_bindings(*, now: dt.datetime | None = None) -> int:
    """Release the bindings whose expiry has passed unreleased (no release call came), as of their expiry,
    and charge the TTL's GPU time to their teams; how many. The heartbeat calls it."""
    now = now or timezone.now()
    with transaction.atomic():
        rows = list(selectors.expired_pod_bindings(now).select_for_update(skip_locked=True, of=("self",))
                    .select_related("model"))
        _release(rows, lambda b: b.expires_at)
    if rows:
        log.info("extender: %d pod binding(s) expired unreleased and were charged", len(rows))
    return len(rows)
