"""Dashboard reads that the apps' selectors do not offer.

Everything here is read-only and takes the caller's team ids or user, so a
page can never show another team's object. Where nothing is recorded yet (no
run measured its energy, no GPU job ran), the functions say so and the pages
show a placeholder.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, F, FloatField, Max, Q, QuerySet, Sum, Value
from django.db.models.functions import Coalesce, Greatest, TruncMonth
from django.http import Http404

from common.units import JOULES_PER_KWH, joules_to_kwh
from core import selectors as core_selectors
from core.models import DLModel, Quota, Team, UsageCharge
from scheduling.selectors import colocation_savings_by_team_month
from tuning import selectors as tuning_selectors
from tuning.models import DopRound, TuningRun, TuningTask, charged_to_run

# --- models ---------------------------------------------------------------------------


def models_in_scope(team_ids: list[int], *, archived: bool = False) -> QuerySet[DLModel]:
    return (DLModel.objects.filter(team_id__in=team_ids, archived_at__isnull=not archived).select_related("team")
            .annotate(run_count=Count("tuning_runs")).order_by("team__name", "name"))


def model_for_user(user: AbstractBaseUser, pk: int) -> DLModel:
    """A model of the user's teams, archived or not (its page offers the restore)."""
    model = core_selectors.models_for_user(user, archived=None).filter(pk=pk).first()
    if model is None:
        raise Http404("No such model in your teams.")
    return model


def recent_runs_of_model(model: DLModel, *, limit: int = 10) -> list[TuningRun]:
    return list(TuningRun.objects.filter(model=model).select_related("team", "model")
                .order_by("-created_at")[:limit])


# --- runs ---------------------------------------------------------------------------------


def runs_in_scope(team_ids: list[int]) -> QuerySet[TuningRun]:
    """The runs the run list shows: archived ones are left out."""
    return TuningRun.objects.filter(team_id__in=team_ids, archived_at__isnull=True).select_related("model", "team")


def run_for_user(user: AbstractBaseUser, pk: int) -> TuningRun:
    run = tuning_selectors.runs_for_user(user).filter(pk=pk).first()
    if run is None:
        raise Http404("No such tuning run in your teams.")
    return run


def runs_for_user_by_ids(user: AbstractBaseUser, ids: list[int]) -> list[TuningRun]:
    """The runs in the order asked; Http404 when any of them is not in the user's teams."""
    found = {r.pk: r for r in tuning_selectors.runs_for_user(user).filter(pk__in=ids)}
    missing = [i for i in ids if i not in found]
    if missing:
        raise Http404("No such tuning run in your teams.")
    return [found[i] for i in ids]


def tasks_of_run(run: TuningRun) -> list[TuningTask]:
    return list(tuning_selectors.tasks_of_run(run))


#: the columns of a DOP round the run page and its live JSON show
DOP_ROUND_FIELDS = ("round_index", "task_index", "dop", "mean_error", "n_candidates", "n_remeasured", "n_failures",
                    "wall_secs", "parallel_wall_secs", "serial_wall_secs")


def dop_rounds_of_run(run: TuningRun) -> list[dict]:
    return list(tuning_selectors.dop_rounds_of_run(run).values(*DOP_ROUND_FIELDS))


def task_rows(tasks: list[TuningTask]) -> list[dict]:
    """The per-task table, as plain values (the page and the live JSON use the same rows)."""
    rows = []
    for t in tasks:
        rows.append({
            "index": t.index, "name": t.name, "flops": t.flops, "weight": t.weight, "trials": t.trials,
            "best_latency_s": t.best_latency_s, "gflops_per_s": t.gflops_per_s, "status": t.status,
            "status_label": t.get_status_display(), "preempted_at_trial": t.preempted_at_trial,
        })
    return rows


# --- energy -------------------------------------------------------------------------------
# TuningRun.energy_joules is 0 and energy_source empty until a run's executor
# records energy (measured with RAPL/NVML, or modeled); the UI then says
# "not measured yet" instead of showing a zero.


def run_has_energy(run: TuningRun) -> bool:
    return bool(run.energy_source) or bool(run.energy_joules)


def run_energy_charged(run: TuningRun) -> float | None:
    """Joules the team's usage ledger charged for this run, or None when it charged none."""
    return UsageCharge.objects.filter(run_id=run.pk, kind=UsageCharge.Kind.ENERGY_JOULES).aggregate(
        j=Sum("amount"))["j"]


def recent_per_trial_costs(team_id: int, model_id: int | None = None, *, limit: int = 10) -> dict | None:
    """Mean wall seconds and joules per trial of the team's recent finished runs (the model's own when it
    has some): the start form's estimate. None when no finished run measured a trial."""
    base = TuningRun.objects.filter(team_id=team_id, status=TuningRun.Status.SUCCEEDED, trials_done__gt=0,
                                    wall_seconds__gt=0)
    runs = list(base.filter(model_id=model_id).order_by("-finished_at")[:limit]) if model_id else []
    basis = "this model's"
    if not runs:
        runs, basis = list(base.order_by("-finished_at")[:limit]), "the team's"
    if not runs:
        return None
    trials = sum(r.trials_done for r in runs)
    with_energy = [r for r in runs if r.energy_joules]
    energy_trials = sum(r.trials_done for r in with_energy)
    return {"runs": len(runs), "basis": f"{basis} last {len(runs)} finished run(s)",
            "wall_s_per_trial": sum(r.wall_seconds for r in runs) / trials,
            "joules_per_trial": sum(r.energy_joules for r in with_energy) / energy_trials if energy_trials else None}


def run_energy(run: TuningRun) -> dict | None:
    """The run's energy figures with their source, or None when none was recorded."""
    if not run_has_energy(run):
        return None
    return {
        "energy_j": run.energy_joules,
        "kwh": run.energy_kwh,
        "source": run.energy_source or "unknown",
        "cpu_watts_per_core": (run.energy_model or {}).get("cpu_watts_per_core"),
        "build_j": run.energy_build_joules,
        "measure_j": run.energy_measure_joules,
        "saved_j": run.energy_saved_joules,
        "trials_saved": run.trials_saved,
        "savings_basis": run.savings_basis,
        "grid_intensity_g_per_kwh": run.grid_intensity_g_per_kwh,
        "carbon_g": run.carbon_g,
    }


@dataclass
class EnergyMonth:
    team_id: int
    team_name: str
    month: dt.date
    runs: int
    trials: int
    wall_hours: float
    runs_with_energy: int = 0
    energy_kwh: float | None = None
    saved_kwh: float | None = None
    carbon_g: float | None = None
    sources: list[str] = field(default_factory=list)
    # Horus co-location on the real cluster (modeled; see scheduling.selectors.COLOCATION_BASIS).
    colocation_saved_kwh: float | None = None
    colocation_gpu_hours: float | None = None


def energy_by_team_month(team_ids: list[int]) -> list[EnergyMonth]:
    """Tuning activity, energy (with its sources) and carbon per team and calendar month.

    Energy, carbon and trials come from the usage ledger (core.models.UsageCharge), so a deleted or archived
    run's cost stays in its month; what a run row records beyond its charges is added to the run's month.
    Carbon is each charge's joules at the grid intensity in force when it was charged; a run's uncharged
    energy uses the run's intensity, else the team's, else the platform's (admin energy settings, else
    ENERGY_GRID_INTENSITY_G_PER_KWH). Runs, wall time and Trimmer's savings describe the runs still stored.
    """
    default_intensity = core_selectors.energy_model().grid_intensity_g_per_kwh
    intensity = Coalesce(F("grid_intensity_g_per_kwh"), F("team__grid_intensity_g_per_kwh"),
                         Value(default_intensity), output_field=FloatField())
    measured = Q(energy_joules__gt=0) | ~Q(energy_source="")
    energy_gap = Greatest(F("energy_joules") - charged_to_run(UsageCharge.Kind.ENERGY_JOULES), Value(0.0))
    trials_gap = Greatest(F("trials_done") + F("serial_remeasures") - charged_to_run(UsageCharge.Kind.TRIALS),
                          Value(0.0))
    run_rows = (TuningRun.objects.filter(team_id__in=team_ids)
                .annotate(month=TruncMonth("created_at"))
                .values("team_id", "team__name", "month")
                .annotate(runs=Count("id"), wall=Sum("wall_seconds"),
                          with_energy=Count("id", filter=measured),
                          saved_j=Sum("energy_saved_joules", filter=measured),
                          gap_j=Sum(energy_gap, filter=measured, output_field=FloatField()),
                          gap_carbon_g=Sum(energy_gap / JOULES_PER_KWH * intensity, filter=measured,
                                           output_field=FloatField()),
                          gap_trials=Sum(trials_gap, output_field=FloatField()))
                .order_by())
    sources: dict[tuple, set] = {}
    for r in (TuningRun.objects.filter(team_id__in=team_ids).filter(measured)
              .annotate(month=TruncMonth("created_at")).values("team_id", "month", "energy_source").distinct()):
        sources.setdefault((r["team_id"], _month(r["month"])), set()).add(r["energy_source"] or "unknown")
    charged_j: dict[tuple, float] = {}
    charged_carbon: dict[tuple, float] = {}
    charged_trials: dict[tuple, float] = {}
    for c in core_selectors.charges_by_team_month(team_ids, default_intensity_g_per_kwh=default_intensity):
        key = (c["team_id"], c["month"])
        if c["kind"] == UsageCharge.Kind.TRIALS:
            charged_trials[key] = charged_trials.get(key, 0.0) + c["total"]
        elif c["kind"] == UsageCharge.Kind.ENERGY_JOULES:
            charged_j[key] = charged_j.get(key, 0.0) + c["total"]
            charged_carbon[key] = charged_carbon.get(key, 0.0) + (c["carbon_g"] or 0.0)
            sources.setdefault(key, set()).add(c["meter"] or "unknown")

    by_key: dict[tuple, EnergyMonth] = {}
    gaps: dict[tuple, tuple[float, float, float]] = {}
    for r in run_rows:
        key = (r["team_id"], _month(r["month"]))
        by_key[key] = EnergyMonth(team_id=r["team_id"], team_name=r["team__name"], month=key[1], runs=r["runs"],
                                  trials=0, wall_hours=(r["wall"] or 0.0) / 3600.0,
                                  runs_with_energy=r["with_energy"],
                                  saved_kwh=joules_to_kwh(r["saved_j"]) if r["saved_j"] is not None else None)
        gaps[key] = (r["gap_j"] or 0.0, r["gap_carbon_g"] or 0.0, r["gap_trials"] or 0.0)
    orphans = {*charged_j, *charged_trials} - set(by_key)  # months whose runs are all deleted
    names = dict(Team.objects.filter(pk__in={t for t, _ in orphans}).values_list("pk", "name")) if orphans else {}
    for key in orphans:
        by_key[key] = EnergyMonth(team_id=key[0], team_name=names.get(key[0], "?"), month=key[1], runs=0, trials=0,
                                  wall_hours=0.0)
    for key, row in by_key.items():
        gap_j, gap_carbon, gap_trials = gaps.get(key, (0.0, 0.0, 0.0))
        row.trials = round(charged_trials.get(key, 0.0) + gap_trials)
        if row.runs_with_energy or key in charged_j:
            row.energy_kwh = joules_to_kwh(charged_j.get(key, 0.0) + gap_j)
            row.carbon_g = charged_carbon.get(key, 0.0) + gap_carbon
            row.sources = sorted(sources.get(key, ()))
        else:
            row.saved_kwh = None
    out = sorted(by_key.values(), key=lambda r: (-r.month.toordinal(), r.team_name))
    _add_colocation_savings(out, team_ids)
    return out


def _month(value) -> dt.date:
    return value.date() if isinstance(value, dt.datetime) else value


def _add_colocation_savings(rows: list[EnergyMonth], team_ids: list[int]) -> None:
    """Energy saved by co-locating GPU jobs, on each team-month row (rows added for months without tuning)."""
    savings = colocation_savings_by_team_month(team_ids)
    if not savings:
        return
    by_key = {(r.team_id, r.month): r for r in rows}
    names = dict(Team.objects.filter(pk__in={t for t, _ in savings}).values_list("pk", "name"))
    for (team_id, month), saving in savings.items():
        row = by_key.get((team_id, month))
        if row is None:
            row = EnergyMonth(team_id=team_id, team_name=names.get(team_id, "?"), month=month, runs=0, trials=0,
                              wall_hours=0.0)
            rows.append(row)
        row.colocation_saved_kwh = joules_to_kwh(saving.joules)
        row.colocation_gpu_hours = saving.gpu_seconds / 3600.0
    rows.sort(key=lambda r: (-r.month.toordinal(), r.team_name))


def energy_recorded(team_ids: list[int]) -> bool:
    return TuningRun.objects.filter(team_id__in=team_ids).filter(
        Q(energy_joules__gt=0) | ~Q(energy_source="")).exists() or UsageCharge.objects.filter(
        team_id__in=team_ids, kind=UsageCharge.Kind.ENERGY_JOULES).exists()


def quota_usage_rows(teams) -> list[dict]:
    """This month's usage against each team's quota (core.selectors.quota_usage)."""
    quotas = {q.team_id: q for q in Quota.objects.filter(team__in=teams)}
    rows = []
    for team in teams:
        usage = core_selectors.quota_usage(team.pk)
        rows.append({"team": team, "quota": quotas.get(team.pk), "usage": usage})
    return rows


# --- overview -------------------------------------------------------------------------------


def overview_counts(team_ids: list[int]) -> dict:
    runs = TuningRun.objects.filter(team_id__in=team_ids)
    counts = runs.aggregate(
        total=Count("id"),
        active=Count("id", filter=Q(status__in=TuningRun.ACTIVE)),
        paused=Count("id", filter=Q(status=TuningRun.Status.PAUSED)),
        succeeded=Count("id", filter=Q(status=TuningRun.Status.SUCCEEDED)),
        trials=Sum("trials_done"),
        last=Max("created_at"),
    )
    counts["models"] = DLModel.objects.filter(team_id__in=team_ids).count()
    counts["trials"] = counts["trials"] or 0
    return counts


# --- tuning details ---------------------------------------------------------------------------


def dop_round_count(run: TuningRun) -> int:
    return DopRound.objects.filter(run=run).count()


def dop_rounds_from(run: TuningRun, start: int) -> list[dict]:
    """The run's DOP rounds with round_index >= start (what a live poll has not listed yet)."""
    return list(tuning_selectors.dop_rounds_of_run(run).filter(round_index__gte=start).values(*DOP_ROUND_FIELDS))


def dop_round_stats(run: TuningRun) -> tuple[int, int | None]:
    """(number of DOP rounds, the highest DOP among them) in one aggregate."""
    agg = DopRound.objects.filter(run=run).aggregate(n=Count("id"), top=Max("dop"))
    return agg["n"], agg["top"]
