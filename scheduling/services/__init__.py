"""Writes for the GPU cluster, one module per job:

* ``nodes``       node registration and heartbeats, telemetry retention, draining;
* ``predictors``  profile records, training/activating/loading predictor versions, job predictions;
* ``jobs``        GPU-job bounds, the GPU-hour quota, submit and cancel;
* ``placement``   placement passes and the one way to ask for one (``request_placement_pass``);
* ``replacement`` stopping a running job and placing it again (memory share exceeded, interference),
                  measured profiles back to the predictor;
* ``execution``   running a placed job on its GPU's worker; settling jobs of dead or silent workers;
* ``extender``    the Kubernetes scheduler extender: filter, prioritize, bind (charged to the pod's team's
                  GPU-hour quota), release and settling bindings that expired unreleased;
* ``simulations`` trace uploads, queued simulations (cost-checked) and their results;
* ``simulation_queue`` the simulation worker's fair queue (one per team at a time) and cancelling;
* ``messages``    the Celery messages these send after commit.

Keyword-only, typed, atomic where they write. Reads are in ``scheduling.selectors``; every conversion
between rows and the Django-free engine (``scheduling.horus``) is in ``scheduling.adapters``. Tasks,
views, admin and commands import this package; it sends tasks by their registered names (``messages``)
and never imports ``scheduling.tasks``.
"""
from ..adapters import TraceRejected
from .execution import (
    claim_job,
    execute_job,
    finish_job,
    reconcile_restarted_gpu_worker,
    recover_lost_jobs,
)
from .extender import settle_expired_pod_bindings
from .jobs import cancel_job, default_job_estimate_s, gpu_job_limits, submit_job
from .nodes import (
    HeartbeatResult,
    HostFacts,
    local_host_facts,
    prune_telemetry,
    record_heartbeat,
    register_node,
    set_gpu_drained,
    set_node_drained,
)
from .placement import (
    build_cluster_state,
    default_policy,
    dispatch_placement,
    place_pending_jobs,
    request_placement_pass,
)
from .predictors import (
    activate_predictor,
    ensure_active_predictor,
    evaluate_predictor,
    format_predictor_evaluation,
    load_predictor,
    load_seed_profiles,
    model_features,
    predict_job,
    record_profiles,
    request_predictor_training,
    run_requested_training,
    start_predictor_training,
    train_predictor,
    training_records,
)
from .replacement import (
    MAX_REPLACEMENTS,
    MEASURED_JOB_SOURCE,
    record_measured_profile,
    replace_job,
    request_interference_replacements,
)
from .simulation_queue import cancel_check, cancel_simulation, dispatch_simulations, fair_dispatch_order
from .simulations import (
    estimate_simulation,
    max_trace_bytes,
    delete_trace,
    execute_simulation,
    resolve_policies,
    read_trace_file,
    resolve_trace,
    simulate,
    simulation_choices,
    simulation_inputs,
    start_simulation,
    upload_trace,
)

__all__ = [
    "HeartbeatResult", "HostFacts", "max_trace_bytes", "TraceRejected", "activate_predictor", "build_cluster_state",
    "cancel_job", "claim_job", "default_job_estimate_s", "default_policy", "delete_trace", "dispatch_placement",
    "ensure_active_predictor", "evaluate_predictor", "format_predictor_evaluation", "execute_job", "execute_simulation", "finish_job", "gpu_job_limits",
    "load_predictor", "load_seed_profiles", "local_host_facts", "model_features", "place_pending_jobs",
    "predict_job", "prune_telemetry", "reconcile_restarted_gpu_worker", "record_heartbeat", "record_profiles",
    "recover_lost_jobs", "register_node", "request_placement_pass", "resolve_policies", "set_gpu_drained",
    "set_node_drained", "read_trace_file", "resolve_trace", "simulate", "simulation_choices", "simulation_inputs", "start_simulation", "submit_job", "train_predictor",
    "request_predictor_training", "run_requested_training", "start_predictor_training",
    "training_records", "upload_trace", "cancel_check", "cancel_simulation", "dispatch_simulations",
    "estimate_simulation", "fair_dispatch_order",
    "MAX_REPLACEMENTS", "MEASURED_JOB_SOURCE", "record_measured_profile", "replace_job",
    "request_interference_replacements", "settle_expired_pod_bindings",
]
