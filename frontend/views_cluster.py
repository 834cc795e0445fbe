"""GPU-job pages: submit a job (its prediction and placing policy previewed before submitting) and a
job's detail (prediction vs measurement, placement history, its GPUs' telemetry). Thin: reads through
scheduling.selectors, writes through scheduling.services, as the API's GpuJobViewSet does."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from core.exceptions import QuotaExceeded, ServiceError
from core.models import DLModel
from scheduling import selectors, services
from scheduling.models import GPU_JOB_LIMITS, GpuJob, GpuTelemetry, Placement
from scheduling.services.jobs import TRAIN_MEMORY_FACTOR

from . import charts
from .forms_scheduling import GpuJobForm
from .scope import get_scope

JOB_FIELD_ERRORS = {"batch_size", "iterations", "duration_estimate_s", "runtime", "kind", "optimizer", "learning_rate", "num_gpus"}
TELEMETRY_MAX_ROWS = 5000


def _submittable_models(scope):
    return (DLModel.objects.filter(team_id__in=[t.pk for t in scope.writable_scoped_teams],
                                   state=DLModel.State.READY).select_related("team").order_by("team__name", "name"))


@login_required
def job_new(request):
    scope = get_scope(request)
    models = _submittable_models(scope)
    form = GpuJobForm(request.POST or None, models=models)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            job = services.submit_job(actor=request.user, model=data["model"], batch_size=data["batch_size"],
                                      iterations=data["iterations"], duration_estimate_s=data["duration_estimate_s"],
                                      runtime=data["runtime"], kind=data["kind"] or GpuJob.Kind.INFERENCE,
                                      optimizer=data["optimizer"] or GpuJob.Optimizer.ADAM,
                                      learning_rate=data["learning_rate"], num_gpus=data["num_gpus"] or 1)
        except QuotaExceeded as exc:
            form.add_error(None, exc.message)
        except ServiceError as exc:
            form.add_error(exc.field if exc.field in JOB_FIELD_ERRORS else None, exc.message)
        else:
            messages.success(request, f"GPU job {job.pk} of {job.model.name} queued for placement "
                                      f"({services.default_policy()}).")
            return redirect("job-detail", pk=job.pk)
    return render(request, "frontend/job_new.html", {
        "scope": scope, "form": form, "no_models": not models.exists(), "policy": services.default_policy(),
        "limits": services.gpu_job_limits(), "nav": "cluster"})


def _preview_error(field: str, message: str, status: int = 400) -> JsonResponse:
    return JsonResponse({"detail": message, "code": "invalid", "errors": {field: [message]}}, status=status)


@login_required
@require_GET
def job_preview(request):
    """Predicted utilization and memory of (model, batch size), and the policy that would place it. Only
    models the user may submit (404 otherwise); the batch size is bounded as submit_job bounds it."""
    raw_model, raw_batch = request.GET.get("model", ""), request.GET.get("batch_size", "")
    kind = request.GET.get("kind") or GpuJob.Kind.INFERENCE
    if kind not in GpuJob.Kind.values:
        return _preview_error("kind", f"kind must be one of {', '.join(GpuJob.Kind.values)}.")
    if not raw_model.isdigit():
        return _preview_error("model", "model must be the id of one of your ready models.")
    low, high = GPU_JOB_LIMITS["batch_size"]
    if not raw_batch.isdigit() or not low <= int(raw_batch) <= high:
        return _preview_error("batch_size", f"batch_size must be an integer from {low} to {high}.")
    model = _submittable_models(get_scope(request)).filter(pk=int(raw_model)).first()
    if model is None:
        return JsonResponse({"detail": "No such ready model you can submit jobs for.", "code": "not_found"},
                            status=404)
    try:  # a GET never trains nor queues a training
        prediction = services.predict_job(model=model, batch_size=int(raw_batch), train_if_missing=False)
    except ServiceError as exc:
        return _preview_error("model", exc.message)
    pv = prediction["predictor_version"]
    mem_mb = prediction["mem_mb"]
    if kind == GpuJob.Kind.TRAIN:  # as submit_job predicts a training job's memory (modeled)
        mem_mb = round(mem_mb * TRAIN_MEMORY_FACTOR, 1)
    body = {"model": model.pk, "batch_size": int(raw_batch), "kind": kind, "util_pct": prediction["util_pct"],
            "mem_mb": mem_mb, "gpu_model": prediction["gpu_model"],
            "predictor_version": pv.version if pv else None, "policy": services.default_policy()}
    if prediction["method"] == "analytic":
        body["note"] = ("No predictor is trained yet: this is the analytic estimate (FLOPs and memory against the "
                        "GPU's datasheet). Submitting a job queues the predictor's training.")
    return JsonResponse(body)


def job_for_user(user, pk: int) -> GpuJob:
    job = selectors.jobs_for_user(user).filter(pk=pk).first()
    if job is None:
        raise Http404("No such GPU job in your teams.")
    return job


def _telemetry_figure(placements) -> dict:
    """Utilization of each GPU the job ran on, during its placements (open ones up to now)."""
    series = {}
    for p in placements:
        rows = GpuTelemetry.objects.filter(gpu_id=p.gpu_id, ts__gte=p.placed_at)
        if p.released_at is not None:
            rows = rows.filter(ts__lte=p.released_at)
        rows = list(rows.order_by("ts").values_list("ts", "util_pct")[:TELEMETRY_MAX_ROWS])
        label = f"{p.gpu.node.name}/gpu{p.gpu.index} from {p.placed_at:%H:%M:%S}"
        series[label] = ([ts.isoformat() for ts, _ in rows], [u for _, u in rows])
    return charts.lines_figure(series, title="Utilization of the job's GPU while placed", x_title="time (UTC)",
                               y_title="GPU utilization (%)", y_range=[0, 100])


@login_required
def job_detail(request, pk: int):
    scope = get_scope(request)
    job = job_for_user(request.user, pk)
    placements = list(Placement.objects.filter(job=job).select_related("gpu", "gpu__node").order_by("placed_at"))
    return render(request, "frontend/job_detail.html", {
        "scope": scope, "job": job, "placements": placements, "figures": {"telemetry": _telemetry_figure(placements)},
        "can_cancel": job.team_id in scope.writable_ids and job.state not in GpuJob.TERMINAL, "nav": "cluster"})


@login_required
@require_POST
def job_cancel(request, pk: int):
    job = job_for_user(request.user, pk)
    try:
        services.cancel_job(actor=request.user, job=job)
    except ServiceError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"GPU job {job.pk} cancelled.")
    return redirect("job-detail", pk=pk)
