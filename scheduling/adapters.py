"""The boundary between the scheduling app's rows and the Django-free engine (``scheduling.horus``,
``scheduling.horus.experiments``, ``core.onnx_models``).

This is the only scheduling module that imports both Django models and the engine. Rows become engine
inputs here (the live cluster state for a placement pass, profile records for the predictor, graph
features of a registered model, a simulation's trace and parameters) and engine outputs become row
values here (trained predictors as files, trace summaries, simulation results). Engine errors are turned
into the app's ServiceErrors here. Services call these and write the rows; an adapter reads only the rows
it is given (and their stored files), and writes none.
"""
from __future__ import annotations

import datetime as dt
import io
import logging
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import onnx

from common.jsonsafe import json_safe
from core.exceptions import ServiceError
from core.models import DLModel
from core.onnx_models.features import GraphFeatures, compute_features
from core.upload_sandbox import parse_in_sandbox

from .horus import experiments
from .horus.cost import SECONDS_PER_UNIT as SIMULATION_SECONDS_PER_UNIT
from .horus.cost import SimulationCost, estimate_simulation_cost
from .horus.cluster import ClusterSpec, ClusterState, JobView, NodeSpec, workload_types
from .horus.policies import POLICIES, PlacementPolicy, make_policy
from .horus.predictor import TrainedPredictor, UtilizationPredictor
from .horus.predictor_eval import evaluate_predictor as evaluate_utilization_predictor
from .horus.predictor_eval import format_evaluation as format_predictor_evaluation
from .horus.profiles import (DEFAULT_SEED_PROFILES_PATH, ProfileFormatError, ProfileRecord, gpu_spec, load_profiles,
                             roofline_profile)
from .horus.traces import TraceFormatError, TraceTooLarge, decode_trace, gpu_request_per_pod, trace_summary
from .horus import extender as extender_core  # the kube-scheduler extender's rules, for services.extender
from .horus.extender import ExtenderNode
from .horus.live_rule import InterferenceMove, interference_moves  # the simulator's re-placement rule, live
from .models import (GPU, GpuJob, GpuProfile, GpuTelemetry, Placement, PodBinding, PredictorVersion, TraceUpload,
                     placement_gpu_ids)

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_SEED_PROFILES_PATH", "EXPERIMENT_PARAMETERS", "LiveCluster", "POLICY_NAMES", "ProfileRecord",
    "SHIPPED_TRACES", "SIMULATION_INPUT_ERRORS", "TraceRejected", "TrainedPredictor", "cluster_state",
    "evaluate_utilization_predictor", "experiment_parameter_choices", "experiment_params", "format_predictor_evaluation", "job_view", "load_trained_predictor", "make_live_policy", "model_features",
    "trace_upload_verdict", "decode_trace_file", "trace_summary", "profile_records_from_rows", "profile_row_values",
    "run_simulation", "seed_profile_records", "simulation_cost", "simulation_results", "simulation_size",
    "SimulationCost", "SimulationStopped", "SIMULATION_SECONDS_PER_UNIT", "trace_input", "file_trace_input",
    "TraceInput", "extender_core", "extender_job_view", "extender_node", "pod_view",
    "train_utilization_predictor", "analytic_prediction", "InterferenceMove", "interference_moves",
]

POLICY_NAMES: tuple[str, ...] = tuple(POLICIES)
SHIPPED_TRACES = experiments.SHIPPED_TRACES
EXPERIMENT_PARAMETERS: tuple[str, ...] = tuple(f.name for f in fields(experiments.ExperimentParams))

# A job with no prediction (none could be made) is taken as the JobView defaults.
FALLBACK_UTIL_PCT = 50.0
FALLBACK_MEM_MB = 2048.0


class TraceRejected(ServiceError):
    """An uploaded trace is malformed; ``line`` (1-based, header = 1) and ``column`` say where."""

    code = "trace_malformed"

    def __init__(self, message: str, *, line: int | None = None, column: str | None = None):
        super().__init__(message, code="trace_malformed", field="file")
        self.line, self.column = line, column


# ==================================================================================================
# Placement: the live cluster as the policies see it
# ==================================================================================================

def make_live_policy(name: str, now: dt.datetime) -> PlacementPolicy:
    if name not in POLICIES:
        raise ServiceError(f"Unknown policy '{name}'; use one of {', '.join(POLICIES)}.", field="policy")
    policy = make_policy(name)
    policy.reset(int(now.timestamp()))
    return policy


def job_view(job: GpuJob) -> JobView:
    return JobView(
        job_id=str(job.pk), submit_time=job.created_at.timestamp(), num_gpus=job.num_gpus,
        single_node=job.num_gpus > 1,
        pred_util_pct=job.predicted_util_pct if job.predicted_util_pct is not None else FALLBACK_UTIL_PCT,
        pred_mem_mb=job.predicted_mem_mb if job.predicted_mem_mb is not None else FALLBACK_MEM_MB,
        model=job.model.name if job.model_id else None, batch_size=job.batch_size,
    )


@dataclass
class LiveCluster:
    """A ``horus.cluster.ClusterState`` over real GPUs: flat GPU index ``i`` is ``gpus[i]``."""

    state: ClusterState
    gpus: list[GPU]

    def expect_workload(self, views: Sequence[JobView]) -> None:
        self.state.workload = workload_types(views)

    def choose(self, policy: PlacementPolicy, view: JobView,
               now: dt.datetime) -> tuple[list[GPU], float | None] | None:
        """``(GPUs, score)`` the policy places the job on (all ``view.num_gpus`` of them, on one node, or
        none), counted in the state; None when it waits."""
        cv, t = self.state.view(), now.timestamp()
        chosen = policy.place(view, cv, t)
        if not chosen or len(chosen) != view.num_gpus \
                or len({self.gpus[int(i)].node_id for i in chosen}) != 1:
            return None
        flat = [int(i) for i in chosen]
        score = policy.score(view, cv, flat)
        # Until its worker reports the job's own figures, it counts at its prediction.
        self.state.add(view, flat, true_util=view.pred_util_pct, true_mem=view.pred_mem_mb, now=t)
        return [self.gpus[i] for i in flat], score


def _node_specs(gpus: list[GPU]) -> list[NodeSpec]:
    """One NodeSpec per run of same-model GPUs of a node, so flat GPU indices follow ``gpus``."""
    specs: list[NodeSpec] = []
    run: list[GPU] = []
    for g in [*gpus, None]:
        if run and (g is None or g.node_id != run[0].node_id or g.gpu_model != run[0].gpu_model
                    or g.memory_total_mb != run[0].memory_total_mb):
            specs.append(NodeSpec(run[0].node.name, len(run), run[0].gpu_model, float(run[0].memory_total_mb)))
            run = []
        if g is not None:
            run.append(g)
    return specs


def pod_view(binding: PodBinding) -> JobView:
    """A bound pod as the policies see it (its gang on one node)."""
    return JobView(job_id=f"pod:{binding.pod_uid}", submit_time=binding.bound_at.timestamp(),
                   num_gpus=binding.num_gpus, pred_util_pct=binding.predicted_util_pct,
                   pred_mem_mb=binding.predicted_mem_mb, batch_size=binding.batch_size,
                   single_node=binding.num_gpus > 1)


def extender_job_view(*, pod_uid: str, num_gpus: int, batch_size: int, model_name: str,
                      prediction: dict[str, Any], now: dt.datetime) -> JobView:
    """A pod the extender is asked about, with its model's prediction (a gang: one node)."""
    return JobView(job_id=f"pod:{pod_uid}", submit_time=now.timestamp(), num_gpus=num_gpus,
                   pred_util_pct=prediction["util_pct"], pred_mem_mb=prediction["mem_mb"], model=model_name,
                   batch_size=batch_size, single_node=num_gpus > 1)


def cluster_state(gpus: list[GPU], *, active: Iterable[Placement], samples: dict[int, GpuTelemetry],
                  bound: Iterable[PodBinding] = ()) -> LiveCluster:
    """The live cluster from its rows: ``active`` placements (with their jobs), the Kubernetes pods the
    extender ``bound`` (one row per GPU of a pod) and each GPU's fresh sample.

    * predicted load of a GPU = sum of the predictions of the jobs placed on it (what Horus sees);
    * measured load = its latest NVML sample when fresh (what Gandiva-like policies see), plus the
      predictions of jobs placed after that sample; with no fresh sample, the placed jobs' predictions.
    """
    state = ClusterState(ClusterSpec(tuple(_node_specs(gpus)), "live"))
    flat = {g.pk: i for i, g in enumerate(gpus)}
    newer_util = [0.0] * len(gpus)  # predictions of jobs placed after the GPU's latest sample
    newer_mem = [0.0] * len(gpus)
    for p in active:
        view = job_view(p.job)
        held = [flat[g] for g in placement_gpu_ids(p) if g in flat]  # a gang GPU drained since: not here
        if not held:
            continue
        i = held[0]
        # A running job's measured load is its own per-process NVML figures once its worker reported them;
        # until then (placed, or no per-process accounting) it is counted at its prediction, and the GPU's
        # device sample below replaces the GPU's total either way.
        live_util, live_mem = p.job.live_util_pct, p.job.live_mem_mb
        state.add(view, held, true_util=view.pred_util_pct,
                  true_mem=live_mem if live_mem is not None else view.pred_mem_mb, now=p.placed_at.timestamp(),
                  meas_util=live_util, migrations=len(p.job.replacements or []))
        for g in placement_gpu_ids(p):
            sample = samples.get(g)
            if g in flat and sample is not None and p.placed_at > sample.ts:
                newer_util[flat[g]] += view.pred_util_pct
                newer_mem[flat[g]] += view.pred_mem_mb
    pods: dict[str, list[PodBinding]] = {}
    for b in bound:
        if b.gpu_id in flat:
            pods.setdefault(b.pod_uid, []).append(b)
    for rows in pods.values():
        view = pod_view(rows[0])
        state.add(view, [flat[b.gpu_id] for b in rows], true_util=view.pred_util_pct, true_mem=view.pred_mem_mb,
                  now=rows[0].bound_at.timestamp())
        for b in rows:
            sample = samples.get(b.gpu_id)
            if sample is not None and b.bound_at > sample.ts:
                newer_util[flat[b.gpu_id]] += view.pred_util_pct
                newer_mem[flat[b.gpu_id]] += view.pred_mem_mb
    for gpu_id, sample in samples.items():
        i = flat[gpu_id]
        state.true_util[i] = state.meas_util[i] = float(sample.util_pct) + newer_util[i]
        state.true_mem[i] = float(sample.mem_used_mb) + newer_mem[i]
    return LiveCluster(state=state, gpus=gpus)


def extender_node(gpus: list[GPU], *, active: Iterable[Placement], samples: dict[int, GpuTelemetry],
                  bound: Iterable[PodBinding]) -> ExtenderNode:
    """One node's GPUs (sorted by NVML index) and their load, as the extender's core takes them."""
    gpus = sorted(gpus, key=lambda g: g.index)
    live = cluster_state(gpus, active=active, samples=samples, bound=bound)
    return ExtenderNode(state=live.state, gpu_indices=tuple(g.index for g in gpus))


# ==================================================================================================
# Profiles, predictors, model features
# ==================================================================================================

def profile_records_from_rows(rows: Iterable[GpuProfile]) -> list[ProfileRecord]:
    return [
        ProfileRecord(model=p.model_name, batch_size=p.batch_size, gpu_model=p.gpu_model, features=dict(p.features),
                      gpu_util_pct=p.util_pct, peak_mem_mb=p.peak_mem_mb, power_w=p.power_w, source=p.source,
                      meta=dict(p.meta or {}))
        for p in rows
    ]


def profile_row_values(record: ProfileRecord) -> dict[str, Any]:
    """The GpuProfile fields of a record other than its key (model, batch size, GPU model, source)."""
    return {"features": dict(record.features), "util_pct": record.gpu_util_pct, "peak_mem_mb": record.peak_mem_mb,
            "power_w": record.power_w, "meta": dict(record.meta)}


def seed_profile_records(path: str | Path | None = None) -> list[ProfileRecord]:
    """The shipped (or a given) profile file; a malformed one is a ServiceError naming the problem."""
    try:
        return load_profiles(path or DEFAULT_SEED_PROFILES_PATH)
    except (ProfileFormatError, OSError) as exc:
        raise ServiceError(str(exc), field="path") from None


def measured_profile_record(*, model: str, batch_size: int, gpu_model: str, features: dict[str, Any],
                            util_pct: float, peak_mem_mb: float, power_w: float | None, source: str,
                            meta: dict[str, Any]) -> ProfileRecord:
    return ProfileRecord(model=model, batch_size=batch_size, gpu_model=gpu_model, features=features,
                         gpu_util_pct=util_pct, peak_mem_mb=peak_mem_mb, power_w=power_w, source=source, meta=meta)


def train_utilization_predictor(records: list[ProfileRecord], *, k_folds: int, seed: int,
                                xgb_params: dict[str, Any] | None) -> tuple[TrainedPredictor, bytes]:
    """The trained predictor and its file's bytes (what PredictorVersion.file stores)."""
    try:
        trained = UtilizationPredictor(**(xgb_params or {})).train(records, k_folds=k_folds, seed=seed)
    except ValueError as exc:
        raise ServiceError(f"Cannot train a predictor: {exc}", code="not_enough_profiles") from None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "predictor.json"
        trained.save(path)
        return trained, path.read_bytes()


def analytic_prediction(features: dict[str, Any], gpu_model: str) -> tuple[float, float]:
    """(util %, peak memory MB) from the graph features and the GPU's datasheet alone (the roofline model of
    a training step, horus.profiles.roofline_profile, without noise): what a job is placed by while no
    predictor has been trained. Needs no training, so it can answer inside a request."""
    util, mem, _power = roofline_profile(features, gpu_spec(gpu_model))
    return util, mem


_predictor_cache: dict[tuple[int, str], TrainedPredictor] = {}
_predictor_lock = threading.Lock()


def remember_predictor(pv: PredictorVersion, trained: TrainedPredictor) -> None:
    with _predictor_lock:
        _predictor_cache[(pv.pk, pv.file.name)] = trained


def load_trained_predictor(pv: PredictorVersion) -> TrainedPredictor:
    """The predictor stored in ``pv.file`` (cached per process, keyed by version and file)."""
    with _predictor_lock:
        cached = _predictor_cache.get((pv.pk, pv.file.name))
    if cached is not None:
        return cached
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.json"
        with pv.file.open("rb") as f:
            path.write_bytes(f.read())
        trained = TrainedPredictor.load(path)
    remember_predictor(pv, trained)
    return trained


_features_cache: dict[tuple[int, str, int], dict[str, Any]] = {}


def model_features(model: DLModel, batch_size: int) -> dict[str, Any]:
    """Cached :func:`_model_features` (recomputing reads the ONNX file: seconds for a large model)."""
    key = (model.pk, model.sha256, int(batch_size))
    if key not in _features_cache:
        if len(_features_cache) > 512:
            _features_cache.clear()
        _features_cache[key] = _model_features(model, batch_size)
    return dict(_features_cache[key])


def _model_features(model: DLModel, batch_size: int) -> dict[str, Any]:
    """Graph features of a registered model at ``batch_size``.

    Recomputed from the stored ONNX file when the batch differs; if the graph hard-codes its
    batch, FLOPs and activation bytes are scaled linearly from the stored features (and the
    result says ``"batch_scaled": True``).
    """
    feats = dict(model.features or {})
    if batch_size == model.batch_size and feats:
        return feats
    try:
        with model.file.open("rb") as f:
            data = f.read()
        # parsed in the upload sandbox: a team's model is never parsed in the web process
        answer = parse_in_sandbox("core.onnx_models.features:features_at_batch_in_child", data=data,
                                  kwargs={"batch_size": int(batch_size)},
                                  what=f"computing the model's features at batch size {batch_size}")
        if not isinstance(answer, dict) or not isinstance(answer.get("features"), dict):
            raise ValueError(answer.get("refused") if isinstance(answer, dict) else "no features")
        return GraphFeatures.from_dict(answer["features"]).to_dict()  # the child's answer, as plain numbers
    except Exception as exc:
        log.info("features of %s at batch %s scaled linearly (%s)", model, batch_size, exc)
        base = max(1, int(feats.get("batch_size") or model.batch_size or 1))
        ratio = batch_size / base
        return {**feats, "total_flops": int(model.total_flops * ratio),
                "activation_bytes": int(model.activation_bytes * ratio), "param_count": model.param_count,
                "conv_count": model.conv_count, "linear_count": model.linear_count,
                "activation_count": model.activation_count, "other_count": model.other_count,
                "batch_size": batch_size, "batch_scaled": True}


def onnx_features(data: bytes, batch_size: int) -> dict[str, Any]:
    """Graph features of ONNX bytes at ``batch_size`` (a model profiled by ``profile_gpu``)."""
    return compute_features(onnx.load_from_string(data), batch_size=batch_size).to_dict()


# ==================================================================================================
# Traces and simulations
# ==================================================================================================

# What an unrunnable simulation raises (its message is the run's error); anything else is a bug.
SIMULATION_INPUT_ERRORS: tuple[type[Exception], ...] = (
    ServiceError, experiments.ExperimentError, TraceFormatError, ValueError)


def trace_upload_verdict(answer: Any, filename: str) -> tuple[str, int, dict[str, Any]]:
    """``(kind, n_jobs, summary)`` from the sandboxed parser's answer (``horus.traces.check_upload``); a refusal
    is a TraceRejected naming the bad cell, or a ServiceError ``too_large``."""
    if not isinstance(answer, dict) or "ok" not in answer:
        raise TraceRejected(f"{filename}: the trace parser gave no usable answer.")
    message = str(answer.get("message", ""))[:2000]
    if not answer["ok"]:
        if answer.get("code") == "too_large":
            raise ServiceError(message, code="too_large", field="file")
        line, column = answer.get("line"), answer.get("column")
        raise TraceRejected(message, line=line if isinstance(line, int) else None,
                            column=column if isinstance(column, str) else None)
    kind = str(answer.get("kind", ""))
    if kind not in TraceUpload.Kind.values:
        raise TraceRejected(f"{filename}: a {kind.replace('_', ' ')} describes a cluster, not jobs; "
                            "upload Philly jobs or an Alibaba pod list.")
    summary = answer.get("summary")
    return kind, int(answer.get("n_jobs", 0)), summary if isinstance(summary, dict) else {}


def decode_trace_file(data: bytes, filename: str, *, max_bytes: int) -> str:
    """A local trace file's text (gzip undone once, bounded); refusals as in :func:`trace_upload_verdict`."""
    try:
        return decode_trace(data, name=filename, max_bytes=max_bytes)
    except TraceTooLarge as exc:
        raise ServiceError(str(exc), code="too_large", field="trace") from None
    except TraceFormatError as exc:
        raise TraceRejected(str(exc), line=exc.line, column=exc.column) from None


def experiment_params(parameters: dict[str, Any] | None, kind: str) -> experiments.ExperimentParams:
    """Validated parameters; a bad one is a ServiceError on ``parameters.<name>``."""
    try:
        return experiments.ExperimentParams.from_dict(parameters).validate(kind)
    except experiments.ExperimentError as exc:
        raise ServiceError(str(exc), field=f"parameters.{exc.field}" if exc.field else "parameters") from None


def simulation_size(label: str, upload: TraceUpload | None, kind: str, params: experiments.ExperimentParams,
                    seed: int) -> tuple[int, int]:
    """``(jobs, GPUs)`` the simulation would cover, without running it."""
    if upload is not None:
        n_jobs = upload.n_jobs
    elif params.method == "fill":  # every GPU pod of the shipped trace (parsed once per process)
        n_jobs = len(experiments.load_jobs(label)[1])
    else:
        n_jobs = None
    return experiments.simulation_size(kind, params, trace_jobs=n_jobs, seed=seed)


def simulation_cost(params: experiments.ExperimentParams, *, label: str, upload: TraceUpload | None,
                    policies: Sequence[str], jobs: int, gpus: int, seeds: int = 1) -> SimulationCost:
    """The engine's cost estimate (``horus.cost``) of validated parameters on ``jobs`` x ``gpus``; a fill
    is sized by its pod list's mean GPU request (an upload's summary; the shipped trace, parsed once)."""
    per_pod = None
    if params.method == "fill":
        per_pod = ((upload.summary or {}).get("gpu_request_per_pod") if upload is not None
                   else gpu_request_per_pod(experiments.load_jobs(label)[1]))
    return estimate_simulation_cost(params, policies=policies, jobs=jobs, gpus=gpus, seeds=seeds,
                                    gpu_request_per_pod=per_pod)


SimulationStopped = experiments.SimulationStopped
TraceInput = experiments.TraceInput
experiment_parameter_choices = experiments.parameter_choices


def trace_input(label: str, upload: TraceUpload | None) -> TraceInput:
    """A shipped trace (by label) or an upload's stored file, as the engine's trace input."""
    if upload is None:
        return experiments.load_trace(label)
    with upload.file.open("rb") as f:
        return experiments.load_trace(upload.name, io.BytesIO(f.read()))


def file_trace_input(name: str, data: bytes, *, nodes_name: str | None = None,
                     nodes_data: bytes | None = None) -> TraceInput:
    """A trace file's bytes (and an Alibaba node list's) as the engine's trace input; malformed input is
    a TraceRejected naming the file, line and column."""
    nodes = None if nodes_data is None else io.BytesIO(nodes_data)
    if nodes is not None:
        nodes.name = nodes_name or "nodes.csv"
    try:
        return experiments.load_trace(name, io.BytesIO(data), nodes_source=nodes)
    except TraceFormatError as exc:
        raise TraceRejected(str(exc), line=exc.line, column=exc.column) from None
    except experiments.ExperimentError:
        raise
    except (ValueError, OverflowError, OSError, EOFError, IndexError) as exc:  # hostile input the parser did not foresee
        raise TraceRejected(f"{name}: cannot be read as a trace ({exc}).") from None


def run_simulation(*, trace: TraceInput, policies: list[str], seed: int, params: dict[str, Any],
                   profiles: list[ProfileRecord], predictor: TrainedPredictor | None,
                   progress: Callable[[str], None] | None = None,
                   should_stop: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Every policy on the same jobs and cluster (the engine's one experiment call); ``should_stop`` True
    abandons it (SimulationStopped)."""
    return experiments.run_experiment(trace=trace, policies=policies, seed=seed, params=params, profiles=profiles,
                                      predictor=predictor, progress=progress, should_stop=should_stop)


def simulation_results(results: dict[str, Any], *, predictor_used: bool,
                       predictor_version: PredictorVersion | None) -> dict[str, Any]:
    """What SimulationRun.results stores: the engine's results, with the predictor version that made them."""
    if predictor_used:
        version = predictor_version.version if predictor_version is not None else None
        results = {**results, "predictor": {**(results.get("predictor") or {}), "version": version}}
    return json_safe(results)


def format_results_table(results: dict[str, Any]) -> str:
    return experiments.format_table(results["table"])

