"""Dashboard pages. Thin: read through selectors/queries, write through services, render templates.

Lists show the team scope picked in the header's switcher ("all my teams" or
one team); detail pages take any object of the user's teams and 404 on any
other team's object.
"""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from core import login_guard
from core import selectors as core_selectors
from core import services as core_services
from core.api.throttles import UploadThrottle, upload_throttled_message
from core.exceptions import QuotaExceeded, ServiceError
from core.models import DLModel
from core.onnx_models.errors import ERROR_CODES, OnnxValidationError
from recordcache import selectors as record_cache
from scheduling.selectors import COLOCATION_BASIS, most_registered_cores, schedulable_gpus
from tuning import services as tuning_services
from tuning.services.package import package_usage

from . import charts, clusterdata, presenters, queries
from .filters import RunListFilter
from .forms import ModelUploadForm, StartRunForm, parse_id_list, refuse_unread
from .forms_account import GuardedAuthenticationForm
from .scope import get_scope, set_current_team

RUNS_PER_PAGE = 50
MAX_COMPARE = 8


# --- login ---------------------------------------------------------------------------------------


class LoginView(auth_views.LoginView):
    """Django's login page, with attempts limited per client address and per account (core.login_guard):
    a refused attempt checks no password and answers 429 with Retry-After."""

    authentication_form = GuardedAuthenticationForm

    def form_invalid(self, form):
        return login_guard.refused_status(super().form_invalid(form))


# --- team switcher ------------------------------------------------------------------------


@login_required
@require_POST
def switch_team(request):
    value = request.POST.get("team", "all")
    nxt = request.POST.get("next") or reverse("home")
    if not url_has_allowed_host_and_scheme(nxt, allowed_hosts={request.get_host()},
                                           require_https=request.is_secure()):
        nxt = reverse("home")
    if value in ("", "all"):
        set_current_team(request, None)
    elif not value.isdigit() or not set_current_team(request, int(value)):
        raise Http404("No such team among yours.")
    return HttpResponseRedirect(nxt)


# --- overview ---------------------------------------------------------------------------------


@login_required
def home(request):
    scope = get_scope(request)
    counts = queries.overview_counts(scope.team_ids)
    recent = list(queries.runs_in_scope(scope.team_ids).order_by("-created_at")[:8])
    models = list(queries.models_in_scope(scope.team_ids)[:8])
    return render(request, "frontend/home.html", {
        "scope": scope, "counts": counts, "recent_runs": recent, "models": models, "nav": "home"})


# --- models ------------------------------------------------------------------------------------


@login_required
def model_list(request):
    scope = get_scope(request)
    archived = request.GET.get("archived") == "1"
    models = queries.models_in_scope(scope.team_ids, archived=archived)
    return render(request, "frontend/model_list.html", {
        "scope": scope, "models": models, "archived": archived, "writable_ids": scope.writable_ids,
        "can_upload": bool(scope.writable_ids), "nav": "models"})


@login_required
@require_POST
def model_archive(request, pk: int):
    """The model page's Archive: hidden from lists, restorable; its runs and the team's usage are kept."""
    model = queries.model_for_user(request.user, pk)
    try:
        kept = core_services.archive_model(actor=request.user, model=model)
    except ServiceError as exc:
        messages.error(request, exc.message)
        return redirect("model-detail", pk=pk)
    if kept is None:
        messages.success(request, f"Model '{model.name}' was refused after upload: deleted, its name is free again.")
        return redirect("model-list")
    messages.success(request, f"Model '{model.name}' archived: it is hidden from the lists, and its runs and the "
                              "team's usage are kept. Restore it from the archived models.")
    return redirect("model-list")


@login_required
@require_POST
def model_restore(request, pk: int):
    model = queries.model_for_user(request.user, pk)
    try:
        core_services.restore_model(actor=request.user, model=model)
    except ServiceError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Model '{model.name}' restored.")
    return redirect("model-detail", pk=pk)


@login_required
def model_upload(request):
    scope = get_scope(request)
    teams = [t for t in scope.teams if t.pk in scope.writable_ids]
    throttle = UploadThrottle()  # the API's upload budget: one count per user for both
    throttled = request.method == "POST" and not throttle.allow_request(request, None)  # before the body is read
    form = ModelUploadForm(None if throttled else request.POST or None, None if throttled else request.FILES or None,
                           teams=teams, initial_team=scope.current)
    refusal, status = None, 200
    if throttled:
        refuse_unread(form, upload_throttled_message(throttle))
        status = 429
    elif request.method == "POST" and form.is_valid():
        upload = form.cleaned_data["file"]
        try:
            data = core_services.read_upload(upload)
            model = core_services.submit_model(
                team=form.cleaned_data["team"], name=form.cleaned_data["name"], data=data,
                filename=upload.name, actor=request.user, description=form.cleaned_data["description"])
        except OnnxValidationError as exc:
            refusal = {"code": exc.code, "message": exc.message, "meaning": ERROR_CODES.get(exc.code, "")}
            form.add_error("file", exc.message)
        except ServiceError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        else:
            if model.state == DLModel.State.VALIDATING:
                messages.info(request, f"Model '{model.name}' uploaded to {model.team.name}; it is being "
                                       "validated (large file). This page shows the result when it is done.")
            else:
                messages.success(request, f"Model '{model.name}' registered in {model.team.name}: "
                                          f"{model.gflops:.3f} GFLOPs, {model.param_count:,} parameters.")
            return redirect("model-detail", pk=model.pk)
    return render(request, "frontend/model_upload.html", {
        "scope": scope, "form": form, "refusal": refusal, "no_teams": not teams, "nav": "models"}, status=status)


@login_required
def model_detail(request, pk: int):
    scope = get_scope(request)
    model = queries.model_for_user(request.user, pk)
    histogram = sorted(model.op_histogram.items(), key=lambda kv: (-kv[1], kv[0]))
    return render(request, "frontend/model_detail.html", {
        "scope": scope, "model": model, "histogram": histogram,
        "features": sorted((model.features or {}).items()),
        "runs": queries.recent_runs_of_model(model),
        "ops_figure": charts.op_histogram_figure(model),
        "can_tune": model.team_id in scope.writable_ids, "nav": "models"})


# --- tuning runs --------------------------------------------------------------------------------


@login_required
def run_list(request):
    scope = get_scope(request)
    models = DLModel.objects.filter(team_id__in=scope.team_ids).select_related("team").order_by("name")
    filterset = RunListFilter(request.GET or None, queryset=queries.runs_in_scope(scope.team_ids),
                              teams=scope.scoped_teams, models=models)
    page = Paginator(filterset.qs, RUNS_PER_PAGE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render(request, "frontend/run_list.html", {
        "scope": scope, "filter": filterset, "page": page, "query": query.urlencode(), "nav": "runs",
        "filtered": any(v for k, v in request.GET.items() if k not in ("page",))})


SERVICE_FIELD_TO_FORM = {"target": "target_kind", "dop": "dop_fixed", "max_trials": "max_trials",
                         "max_minutes": "max_minutes",
                         "trials_per_round": "trials_per_round", "measurement_mode": "measurement_mode",
                         "threads": "threads"}  # other fields (e.g. trimmer_options) show above the form


@login_required
def run_start(request):
    scope = get_scope(request)
    models = (DLModel.objects.filter(team_id__in=[t.pk for t in scope.writable_scoped_teams],
                                     state=DLModel.State.READY)
              .select_related("team").order_by("team__name", "name"))
    initial = {}
    if request.GET.get("model", "").isdigit():
        initial["model"] = int(request.GET["model"])
    form = StartRunForm(request.POST or None, models=models, initial=initial, gpu_available=bool(schedulable_gpus()),
                        node_cores=most_registered_cores())
    quota_error = None
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        trimmer, trimmer_options = form.trimmer()
        try:
            run = tuning_services.start_run(
                actor=request.user, model=data["model"], max_trials=data["max_trials"],
                max_minutes=data.get("max_minutes"), target=form.target(),
                trials_per_round=data["trials_per_round"], measurement_mode=data["measurement_mode"],
                dop=form.dop(), threads=data.get("threads"), options=form.options(),
                trimmer=trimmer, trimmer_options=trimmer_options)
        except QuotaExceeded as exc:
            quota_error = exc.message
            form.add_error(None, exc.message)
        except ServiceError as exc:
            form.add_error(SERVICE_FIELD_TO_FORM.get(exc.field or ""), exc.message)
        else:
            waiting = (f" It waits for one of the team's run slots (number {run.queue_position} in line) and "
                       "starts when a run of the team ends." if run.waiting_since else "")
            messages.success(request, f"Tuning run {run.pk} of {run.model.name} queued.{waiting}")
            return redirect("run-detail", pk=run.pk)
    estimates = presenters.start_estimates(
        models, default_joules_per_trial=core_selectors.energy_model().joules_per_trial_estimate)
    chosen = str(form["model"].value() or next(iter(estimates), ""))
    return render(request, "frontend/run_start.html", {
        "scope": scope, "form": form, "quota_error": quota_error, "no_models": not estimates,
        "viewer_only": bool(scope.scoped_teams) and not scope.writable_scoped_teams,
        "estimates": estimates,
        "estimate_text": presenters.fmt_start_estimate(estimates.get(chosen), form["max_trials"].value()),
        "nav": "runs"})


@login_required
def run_detail(request, pk: int):
    scope = get_scope(request)
    run = queries.run_for_user(request.user, pk)
    payload = presenters.cached_for_version("live", run, lambda: presenters.run_live_payload(run))
    return render(request, "frontend/run_detail.html", {
        "scope": scope, "run": run, "live": payload, "numbers": payload["run"], "d": payload["run"]["display"],
        "figures": payload["figures"], "links": presenters.run_links(run), "target": presenters.fmt_target(run.target),
        "can_control": run.team_id in scope.writable_ids, "nav": "runs",
        "package_usage": package_usage(run),
        "cache_rows": record_cache.lookups_of_run(run), "cache_savings": record_cache.run_cache_savings(run)})


CONTROL = {"cancel": tuning_services.cancel_run, "pause": tuning_services.pause_run,
           "resume": tuning_services.resume_run}
CONTROL_DONE = {"cancel": "Cancel", "pause": "Pause", "resume": "Resume"}


@login_required
@require_POST
def run_control(request, pk: int, action: str):
    run = queries.run_for_user(request.user, pk)
    if action not in CONTROL:
        raise Http404("Unknown action.")
    try:
        run = CONTROL[action](actor=request.user, run=run)
    except ServiceError as exc:
        messages.error(request, exc.message)
    else:
        if run.requested_action:
            messages.info(request, f"{CONTROL_DONE[action]} requested: the run stops after its current round.")
        else:
            messages.success(request, f"Run {run.pk} is now {run.get_status_display().lower()}.")
    return redirect("run-detail", pk=pk)


@login_required
def run_compare(request):
    scope = get_scope(request)
    try:
        ids = parse_id_list(request.GET.getlist("runs"))
    except ValueError as exc:
        messages.error(request, f"Cannot compare: {exc}.")
        ids = []
    if len(ids) > MAX_COMPARE:
        messages.warning(request, f"Comparing the first {MAX_COMPARE} of the {len(ids)} runs selected.")
        ids = ids[:MAX_COMPARE]
    runs = queries.runs_for_user_by_ids(request.user, ids) if ids else []
    context = {"scope": scope, "runs": runs, "nav": "runs",
               "candidates": list(queries.runs_in_scope(scope.team_ids).order_by("-created_at")[:30])}
    if len(runs) >= 2:
        curves = {r.pk: presenters.curve_for(r, max_points=presenters.CURVE_MAX_POINTS) for r in runs}
        context["figure"] = charts.compare_figure(runs, curves)
        context["rows"] = presenters.compare_rows(runs)
        context["settings_diff"] = presenters.settings_diff(runs)
    elif ids:
        messages.info(request, "Pick at least two runs to compare.")
    return render(request, "frontend/run_compare.html", context)


# --- energy --------------------------------------------------------------------------------------


@login_required
def energy(request):
    scope = get_scope(request)
    rows = queries.energy_by_team_month(scope.team_ids)
    return render(request, "frontend/energy.html", {
        "scope": scope, "rows": rows, "figure": charts.energy_figure(rows),
        "energy_recorded": queries.energy_recorded(scope.team_ids),
        "quota_rows": queries.quota_usage_rows(scope.scoped_teams), "nav": "energy",
        "energy_model": core_selectors.energy_model(), "colocation_basis": COLOCATION_BASIS,
        "cache_savings": record_cache.team_cache_savings(scope.team_ids)})


# --- cluster and simulations (scheduling app) -------------------------------------------------------


@login_required
def cluster(request):
    scope = get_scope(request)
    context = clusterdata.cluster_context(scope)
    return render(request, "frontend/cluster.html", {"scope": scope, "nav": "cluster", **context})


@login_required
def simulations(request):
    scope = get_scope(request)
    context = clusterdata.simulations_context(scope)
    return render(request, "frontend/simulations.html", {"scope": scope, "nav": "simulations", **context})


@login_required
def simulation_detail(request, pk: int):
    scope = get_scope(request)
    context = clusterdata.simulation_detail_context(scope, pk)
    return render(request, "frontend/simulation_detail.html", {"scope": scope, "nav": "simulations", **context})

