"""The team quotas a tuning run is checked against when it starts or resumes (the energy quota is
also enforced while it runs, by the sink's `control()`)."""
from __future__ import annotations

from common.units import JOULES_PER_KWH
from core.exceptions import QuotaExceeded
from core.services import lock_team_quota
from tuning import selectors


def check_run_quota(*, team_id: int, max_trials: int) -> bool:
    """Energy and trials of the month (a refusal is a 429 naming the quota); returns whether one of the
    team's concurrent-run slots is free now (a run without one waits in the team's queue, see
    tuning.services.run_queue). Locks the team's quota row (call inside a transaction), so concurrent
    starts serialize here."""
    quota = lock_team_quota(team_id)
    _check_energy_quota(team_id=team_id, quota=quota, max_trials=max_trials)
    committed = selectors.trials_used_this_month(team_id) + selectors.trials_reserved(team_id)
    if committed + max_trials > quota.tuning_trials_per_month:
        left = max(0, quota.tuning_trials_per_month - committed)
        raise QuotaExceeded(
            f"Quota 'tuning trials per month' would be exceeded: {max_trials} requested, {left} left of "
            f"{quota.tuning_trials_per_month} this month.", quota="tuning_trials_per_month")
    return selectors.active_run_count(team_id) < quota.max_concurrent_runs


def _check_energy_quota(*, team_id: int, quota, max_trials: int) -> None:
    budget_j = quota.energy_kwh_per_month * JOULES_PER_KWH
    used_j = selectors.energy_joules_this_month(team_id)
    if used_j >= budget_j:
        raise QuotaExceeded(
            f"Quota 'energy per month' reached: {used_j / JOULES_PER_KWH:.4f} kWh used of "
            f"{quota.energy_kwh_per_month:g} kWh this month.", quota="energy_kwh_per_month")
    per_trial, basis = selectors.joules_per_trial_estimate(team_id)
    needed_j = per_trial * max_trials
    if used_j + needed_j > budget_j:
        raise QuotaExceeded(
            f"Quota 'energy per month' would be exceeded: this run needs about {needed_j / JOULES_PER_KWH:.4f} kWh "
            f"({per_trial:.1f} J per trial, from {basis}) and {(budget_j - used_j) / JOULES_PER_KWH:.4f} kWh are left "
            f"of {quota.energy_kwh_per_month:g} kWh. Lower max_trials or enable Trimmer.",
            quota="energy_kwh_per_month")
