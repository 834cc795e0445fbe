"""Start a simulation from the dashboard (bundled or uploaded trace, cluster size, method, policies, seeds,
predictor error), upload a trace, and follow a queued simulation's progress. The simulation is started
through scheduling.services.start_simulation, the call POST /api/simulations/ makes."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import Http404, JsonResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from core.api.fast import not_modified, version_etag, with_validators
from core.api.throttles import UploadThrottle, upload_throttled_message
from core.api.uploads import body_over
from core.exceptions import QuotaExceeded, ServiceError
from scheduling import selectors, services
from scheduling.models import SimulationRun

from .forms import refuse_unread
from .forms_scheduling import SimulationForm, TraceUploadForm
from .scope import get_scope

SIM_FIELDS = {"trace", "policies", "seeds", "jobs", "gpus", "scale", "predictor_error", "method", "team", "backfill",
              "horus_lookahead"}


def _form_field(service_field: str | None) -> str | None:
    name = (service_field or "").removeprefix("parameters.")
    return {"seed": "seeds"}.get(name, name) if name in SIM_FIELDS | {"seed"} else None


def _writable_teams(scope):
    return [t for t in scope.scoped_teams if t.pk in scope.writable_ids]


def _start(request, form) -> list[SimulationRun] | None:
    """One simulation per seed, all or none (a refused seed leaves nothing queued)."""
    data = form.cleaned_data
    try:
        with transaction.atomic():
            return [services.start_simulation(actor=request.user, team=data["team"], trace=data["trace"],
                                              policies=data["policies"] or "all", seed=seed,
                                              parameters=form.parameters()) for seed in data["seeds"]]
    except QuotaExceeded as exc:
        form.add_error(None, exc.message)
    except ServiceError as exc:
        form.add_error(_form_field(exc.field), exc.message)
    return None


def _estimate(request, form) -> dict | None:
    """The cost of what the form asks for (every seed), against the team's limit; nothing is started."""
    data = form.cleaned_data
    try:
        return services.estimate_simulation(actor=request.user, team=data["team"], trace=data["trace"],
                                            policies=data["policies"] or "all", seed=data["seeds"][0],
                                            parameters=form.parameters(), seeds=len(data["seeds"]))
    except ServiceError as exc:
        form.add_error(_form_field(exc.field), exc.message)
    return None


def _upload(request, form) -> bool:
    upload = form.cleaned_data["file"]
    if upload.size > services.max_trace_bytes():
        form.add_error("file", f"The file is over the {services.max_trace_bytes() // 2**20} MB limit.")
        return False
    try:
        trace = services.upload_trace(actor=request.user, team=form.cleaned_data["team"],
                                      name=form.cleaned_data["name"], data=upload.read(), filename=upload.name)
    except services.TraceRejected as exc:
        form.add_error("file", exc.message)
        return False
    except ServiceError as exc:
        form.add_error(exc.field if exc.field in ("name", "file") else None, exc.message)
        return False
    messages.success(request, f"Trace '{trace.name}' uploaded: {trace.n_jobs:,} rows ({trace.kind}). Pick it below.")
    return True


@login_required
def simulation_new(request):
    scope = get_scope(request)
    teams = _writable_teams(scope)
    traces = list(selectors.traces_for_user(request.user).filter(team__in=teams).select_related("team")
                  .order_by("-created_at")[:50])
    uploading = request.method == "POST" and request.GET.get("upload") == "1"
    throttle = UploadThrottle()  # the API's upload budget (POST /api/traces/ counts against it too)
    throttled = uploading and not throttle.allow_request(request, None)
    # Both refusals come before the body is read.
    too_large = uploading and not throttled and body_over(request, services.max_trace_bytes())
    refused = throttled or too_large
    sim_form = SimulationForm(request.POST if request.method == "POST" and not uploading else None,
                              teams=teams, traces=traces)
    upload_form = TraceUploadForm(request.POST if uploading and not refused else None,
                                  request.FILES if uploading and not refused else None, teams=teams)
    if throttled:
        refuse_unread(upload_form, upload_throttled_message(throttle))
    elif too_large:
        refuse_unread(upload_form, f"The file is over the {services.max_trace_bytes() // 2**20} MB limit.")
    elif uploading and upload_form.is_valid() and _upload(request, upload_form):
        return redirect("simulation-new")
    if sim_form.is_bound and sim_form.is_valid():
        if "estimate" in request.POST:
            sim_form.estimate = _estimate(request, sim_form)  # shown in the form, above its buttons
        else:
            runs = _start(request, sim_form)
            if runs:
                units = sum(r.cost_units for r in runs)
                waiting = sum(1 for r in runs if r.dispatched_at is None)
                messages.success(request, f"Simulation(s) {', '.join(str(r.pk) for r in runs)} queued, estimated at "
                                          f"{units:,} simulation units"
                                 + (f"; {waiting} wait in the fair queue until your team's previous one is done."
                                    if waiting else "."))
                return redirect("simulation-detail", pk=runs[0].pk)
    return render(request, "frontend/simulation_new.html", {
        "scope": scope, "form": sim_form, "upload_form": upload_form, "no_teams": not teams,
        "max_trace_mb": services.max_trace_bytes() // 2**20, "nav": "simulations"},
        status=429 if throttled else 400 if too_large else 200)


@login_required
@require_GET
def simulation_progress(request, pk: int):
    """Status of one simulation for the page's poller; an unchanged one is a 304 (ETag of its state)."""
    sim = (SimulationRun.objects.filter(pk=pk, team_id__in=get_scope(request).all_team_ids)
           .values("status", "created_at", "started_at", "finished_at", "cancel_requested_at", "error").first())
    if sim is None:
        raise Http404("No such simulation in your teams.")
    changed = sim["finished_at"] or sim["cancel_requested_at"] or sim["started_at"] or sim["created_at"]
    running = sim["status"] == SimulationRun.Status.RUNNING
    # A running one's elapsed time changes every second: validate it per 5 s window only.
    tick = int(timezone.now().timestamp() // 5) if running else 0
    etag = version_etag("sim-progress", pk, f"{sim['status']}|{changed.isoformat()}|{tick}")
    hit = not_modified(request, etag, None)
    if hit is not None:
        return hit
    end = sim["finished_at"] or timezone.now()
    elapsed = (end - sim["started_at"]).total_seconds() if sim["started_at"] else None
    return with_validators(JsonResponse({
        "id": pk, "status": sim["status"], "error": sim["error"], "elapsed_s": elapsed,
        "cancel_requested": sim["cancel_requested_at"] is not None,
        "terminal": sim["status"] in SimulationRun.TERMINAL}), etag, None)


@login_required
@require_POST
def simulation_cancel(request, pk: int):
    """The detail page's Cancel button: POST /api/simulations/{id}/cancel/'s service."""
    sim = SimulationRun.objects.filter(pk=pk, team_id__in=get_scope(request).all_team_ids).first()
    if sim is None:
        raise Http404("No such simulation in your teams.")
    try:
        sim = services.cancel_simulation(actor=request.user, run=sim)
    except ServiceError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Simulation {sim.pk} cancelled." if sim.status == SimulationRun.Status.CANCELLED
                         else f"Simulation {sim.pk} will stop at its next check; its partial results are discarded.")
    return redirect("simulation-detail", pk=pk)
