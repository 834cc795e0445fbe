"""Reads for teams, memberships, quotas and models, always scoped to a user."""
from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import F, FloatField, QuerySet, Sum, Value
from django.db.models.functions import Coalesce, TruncMonth
from django.utils import timezone

from common.units import JOULES_PER_KWH

from .models import DLModel, EnergySettings, Membership, Quota, Team, UsageCharge


def teams_for_user(user: AbstractBaseUser) -> QuerySet[Team]:
    if not user.is_authenticated:
        return Team.objects.none()
    return Team.objects.filter(memberships__user=user).distinct()


def team_ref_filter(ref) -> dict:
    """The lookup of a team given by its id or its slug (as every team reference of the API accepts)."""
    ref = str(ref).strip()
    if ref.isdigit():
        return {"pk": int(ref)} if int(ref) <= 2**63 - 1 else {"pk": -1}
    return {"slug": ref}


def role_in_team(user: AbstractBaseUser, team_id: int) -> str | None:
    if not user.is_authenticated:
        return None
    return Membership.objects.filter(user=user, team_id=team_id).values_list("role", flat=True).first()


def writable_team_ids(user: AbstractBaseUser) -> set[int]:
    if not user.is_authenticated:
        return set()
    return set(
        Membership.objects.filter(
            user=user, role__in=[Membership.Role.OWNER, Membership.Role.MEMBER]
        ).values_list("team_id", flat=True)
    )


def memberships_for_user(user: AbstractBaseUser) -> QuerySet[Membership]:
    return Membership.objects.filter(team__in=teams_for_user(user)).select_related("team", "user")


def models_for_user(user: AbstractBaseUser, *, archived: bool | None = False) -> QuerySet[DLModel]:
    """The user's teams' models: live ones by default, archived ones with ``archived=True``, all with None."""
    qs = DLModel.objects.filter(team__in=teams_for_user(user)).select_related("team")
    if archived is not None:
        qs = qs.filter(archived_at__isnull=not archived)
    return qs


def quotas_for_user(user: AbstractBaseUser) -> QuerySet[Quota]:
    return Quota.objects.filter(team__in=teams_for_user(user)).select_related("team")


# --- Quota usage --------------------------------------------------------------
# Apps that consume quota register a provider in their AppConfig.ready(); core
# stays unaware of tuning/scheduling models.

@dataclass
class QuotaUsage:
    concurrent_runs: int = 0
    tuning_trials_this_month: int = 0
    gpu_hours_this_month: float = 0.0
    energy_kwh_this_month: float = 0.0
    concurrent_simulations: int = 0
    sources: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "concurrent_runs": self.concurrent_runs,
            "tuning_trials_this_month": self.tuning_trials_this_month,
            "gpu_hours_this_month": round(self.gpu_hours_this_month, 4),
            "energy_kwh_this_month": round(self.energy_kwh_this_month, 6),
            "concurrent_simulations": self.concurrent_simulations,
        }


UsageProvider = Callable[[int, dt.datetime], dict]
_usage_providers: dict[str, UsageProvider] = {}


def register_usage_provider(name: str, provider: UsageProvider) -> None:
    """`provider(team_id, month_start)` returns a partial dict of QuotaUsage fields."""
    _usage_providers[name] = provider


def month_start(now: dt.datetime | None = None) -> dt.datetime:
    now = now or timezone.now()
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def quota_usage(team_id: int) -> QuotaUsage:
    usage = QuotaUsage()
    start = month_start()
    for provider in _usage_providers.values():
        for key, value in provider(team_id, start).items():
            setattr(usage, key, getattr(usage, key) + value)
    return usage


# --- Usage ledger ------------------------------------------------------------------
# What teams spent, summed from the append-only ledger (core.models.UsageCharge): deleting or
# archiving what incurred a charge never lowers these.

def charged_since(team_id: int, kind: str, since: dt.datetime, *, exclude_run: int | None = None) -> float:
    """The team's charges of ``kind`` since ``since`` (those of run ``exclude_run`` left out)."""
    qs = UsageCharge.objects.filter(team_id=team_id, kind=kind, created_at__gte=since)
    if exclude_run is not None:
        qs = qs.exclude(run_id=exclude_run)
    return qs.aggregate(total=Sum("amount"))["total"] or 0.0


def charges_for_user(user: AbstractBaseUser) -> QuerySet[UsageCharge]:
    return UsageCharge.objects.filter(team__in=teams_for_user(user))


def charges_by_team_month(team_ids: list[int], *, default_intensity_g_per_kwh: float) -> list[dict]:
    """The teams' charges per team, calendar month, kind and meter: {team_id, month (a date), kind, meter,
    total, carbon_g}. Carbon (energy rows) is each charge's joules at the grid intensity in force when it
    was charged, else the team's, else ``default_intensity_g_per_kwh``."""
    intensity = Coalesce(F("grid_intensity_g_per_kwh"), F("team__grid_intensity_g_per_kwh"),
                         Value(default_intensity_g_per_kwh), output_field=FloatField())
    rows = (UsageCharge.objects.filter(team_id__in=team_ids).annotate(month=TruncMonth("created_at"))
            .values("team_id", "month", "kind", "meter")
            .annotate(total=Sum("amount"),
                      carbon_g=Sum(F("amount") / JOULES_PER_KWH * intensity, output_field=FloatField()))
            .order_by())
    return [{**r, "month": r["month"].date() if isinstance(r["month"], dt.datetime) else r["month"]} for r in rows]


# --- Energy model ----------------------------------------------------------------

ENERGY_FIELDS = ("cpu_watts_per_core", "gpu_board_watts", "grid_intensity_g_per_kwh", "joules_per_trial_estimate")


@dataclass(frozen=True)
class EnergyModel:
    """The values modeled energy and carbon figures are computed with, and where they come from."""

    cpu_watts_per_core: float
    gpu_board_watts: float
    grid_intensity_g_per_kwh: float
    joules_per_trial_estimate: float
    origin: str  # "admin" (staff saved the settings) or "environment" (ENERGY_* defaults)
    updated_at: dt.datetime | None = None

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in ENERGY_FIELDS}


def energy_defaults() -> dict[str, float]:
    """The ENERGY_* environment settings: the model until staff save their own."""
    from django.conf import settings

    return {
        "cpu_watts_per_core": float(settings.ENERGY_CPU_WATTS_PER_CORE),
        "gpu_board_watts": float(settings.ENERGY_GPU_BOARD_WATTS),
        "grid_intensity_g_per_kwh": float(settings.ENERGY_GRID_INTENSITY_G_PER_KWH),
        "joules_per_trial_estimate": float(settings.ENERGY_JOULES_PER_TRIAL_ESTIMATE),
    }


def energy_model() -> EnergyModel:
    row = EnergySettings.objects.filter(pk=EnergySettings.SINGLETON_PK).first()
    if row is None:
        return EnergyModel(**energy_defaults(), origin="environment")
    return EnergyModel(**{name: getattr(row, name) for name in ENERGY_FIELDS}, origin="admin",
                       updated_at=row.updated_at)
