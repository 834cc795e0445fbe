"""Reads for teams, memberships, quotas and models, always scoped to a user."""
from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet
from django.utils import timezone

from .models import DLModel, EnergySettings, Membership, Quota, Team


def teams_for_user(user: AbstractBaseUser) -> QuerySet[Team]:
    if not user.is_authenticated:
        return Team.objects.none()
    return Team.objects.filter(memberships__user=user).distinct()


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


def models_for_user(user: AbstractBaseUser) -> QuerySet[DLModel]:
    return DLModel.objects.filter(team__in=teams_for_user(user)).select_related("team")


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
