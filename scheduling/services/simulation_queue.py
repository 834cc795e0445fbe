"""The simulation worker's fair queue and the cancel action.

The rule: **at most one simulation per team is in the worker's queue (sent, or running) at a time.** A
team's other queued simulations wait in the database (``SimulationRun.dispatched_at`` empty) and are
sent when the team's slot frees (its simulation finished, failed or was cancelled), teams taken
round-robin (:func:`fair_dispatch_order`: the team served longest ago first, then each team's oldest
run). So another team's first simulation waits behind at most one simulation of each other team, however
many they queued.

Cancelling a queued simulation revokes it by state: it becomes ``cancelled`` at once, and the worker's
``execute_simulation`` starts only ``queued`` runs, so a message already sent is dropped when it is
taken. Cancelling a running simulation sets ``cancel_requested_at``; the engine asks ``should_stop``
every few events (``horus.sim_inputs.STOP_CHECK_EVERY``), the worker looks at the flag at most once a
second, and the run ends ``cancelled`` with its partial results discarded.
"""
from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from core.exceptions import ConflictError
from core.permissions import require_team_writer
from core.services import lock_team_quota

from ..models import SimulationRun
from .messages import RUN_SIMULATION, send_after_commit

log = logging.getLogger(__name__)

__all__ = ["WaitingSimulation", "cancel_simulation", "cancel_check", "dispatch_simulations", "fair_dispatch_order"]

#: seconds between two database looks at a running simulation's cancel flag
CANCEL_POLL_S = 1.0


@dataclass(frozen=True)
class WaitingSimulation:
    run_id: int
    team_id: int
    created_at: dt.datetime


def fair_dispatch_order(waiting: Iterable[WaitingSimulation], *, busy_teams: Iterable[int],
                        last_served: Mapping[int, dt.datetime | None]) -> list[int]:
    """The waiting runs to send now, in order: one per team that has none in the worker's queue
    (``busy_teams``), its oldest; teams never served first, then the one served longest ago
    (``last_served``: a team's latest dispatch), ties by the run's age."""
    busy = set(busy_teams)
    oldest: dict[int, WaitingSimulation] = {}
    for w in waiting:
        if w.team_id in busy:
            continue
        best = oldest.get(w.team_id)
        if best is None or (w.created_at, w.run_id) < (best.created_at, best.run_id):
            oldest[w.team_id] = w
    never = dt.datetime.min.replace(tzinfo=dt.UTC)
    ordered = sorted(oldest.values(), key=lambda w: (last_served.get(w.team_id) or never, w.created_at, w.run_id))
    return [w.run_id for w in ordered]


def _enqueue_simulation(run: SimulationRun) -> None:
    """``scheduling.run_simulation`` after commit; a broker outage fails the run, saying so."""
    def failed(exc):
        SimulationRun.objects.filter(pk=run.pk, status=SimulationRun.Status.QUEUED).update(
            status=SimulationRun.Status.FAILED, finished_at=timezone.now(),
            error=f"Could not be queued: the task broker is unreachable ({exc}). Start it again.")

    send_after_commit(RUN_SIMULATION, args=[run.pk], what=f"simulation {run.pk}", on_error=failed)


def _dispatched_active(team_id: int):
    return SimulationRun.objects.filter(team_id=team_id, status__in=SimulationRun.ACTIVE, dispatched_at__isnull=False)


def dispatch_simulations(*, team_id: int | None = None) -> list[int]:
    """Send the waiting simulations that the fair-queue rule lets go now (of one team, or of all); returns
    their ids. Safe to call anywhere and often: each team's dispatch holds the team's quota lock and
    re-checks its slot, so two callers never send two of one team's runs."""
    waiting_qs = SimulationRun.objects.filter(status=SimulationRun.Status.QUEUED, dispatched_at__isnull=True)
    if team_id is not None:
        waiting_qs = waiting_qs.filter(team_id=team_id)
    waiting = [WaitingSimulation(pk, team, created) for pk, team, created in
               waiting_qs.order_by("created_at", "pk").values_list("pk", "team_id", "created_at")[:1000]]
    if not waiting:
        return []
    teams = {w.team_id for w in waiting}
    busy = set(SimulationRun.objects.filter(team_id__in=teams, status__in=SimulationRun.ACTIVE,
                                            dispatched_at__isnull=False).values_list("team_id", flat=True))
    last = dict(SimulationRun.objects.filter(team_id__in=teams, dispatched_at__isnull=False)
                .values("team_id").annotate(last=Max("dispatched_at")).values_list("team_id", "last"))
    sent = []
    for run_id in fair_dispatch_order(waiting, busy_teams=busy, last_served=last):
        team = next(w.team_id for w in waiting if w.run_id == run_id)
        with transaction.atomic():
            lock_team_quota(team)
            if _dispatched_active(team).exists():
                continue  # another caller filled the slot first
            if SimulationRun.objects.filter(pk=run_id, status=SimulationRun.Status.QUEUED,
                                            dispatched_at__isnull=True).update(dispatched_at=timezone.now()):
                _enqueue_simulation(SimulationRun(pk=run_id))
                sent.append(run_id)
    return sent


@transaction.atomic
def cancel_simulation(*, actor: AbstractBaseUser, run: SimulationRun) -> SimulationRun:
    """Cancel a queued simulation now, or ask a running one to stop at its next check."""
    run = SimulationRun.objects.select_for_update().get(pk=run.pk)
    require_team_writer(actor, run.team_id, "cancel simulations")
    if run.status in SimulationRun.TERMINAL:
        raise ConflictError(f"Simulation {run.pk} is already {run.status}.")
    now = timezone.now()
    if run.status == SimulationRun.Status.QUEUED:
        freed_slot = run.dispatched_at is not None
        run.status, run.finished_at, run.cancel_requested_at = SimulationRun.Status.CANCELLED, now, now
        run.error = "Cancelled before it started."
        run.save(update_fields=["status", "finished_at", "cancel_requested_at", "error"])
        if freed_slot:
            transaction.on_commit(dispatch_simulations)
    elif run.cancel_requested_at is None:
        run.cancel_requested_at = now
        run.save(update_fields=["cancel_requested_at"])
    return run


def cancel_check(run_id: int, *, every_s: float = CANCEL_POLL_S,
                 clock: Callable[[], float] = time.monotonic) -> Callable[[], bool]:
    """The engine's ``should_stop`` for one running simulation: True once its cancel was requested. The
    engine asks every few events; this looks at the database at most once per ``every_s`` seconds."""
    state = {"next": clock() + every_s, "stop": False}

    def should_stop() -> bool:
        if not state["stop"] and clock() >= state["next"]:
            state["stop"] = SimulationRun.objects.filter(pk=run_id, cancel_requested_at__isnull=False).exists()
            state["next"] = clock() + every_s
        return state["stop"]

    return should_stop
