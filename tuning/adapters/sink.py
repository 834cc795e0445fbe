"""Where an engine event becomes a row: `DatabaseSink` is the engine's `TuningSink` for a run. It streams
tasks, measurements (as each one lands, before TVM's join), DOP rounds, what is in flight and the final
serial re-measures into the database, heartbeats the run's lease and answers the engine's `control()`
with cancel/pause (requested or at the energy quota) or finish (the run's time budget is spent)."""
from __future__ import annotations

import threading
import time

from django.db import transaction
from django.db.models import Count, F, Min, Q
from django.utils import timezone

from common.units import JOULES_PER_KWH
from core.fieldtext import fit_to_field
from core.models import Quota
from core.selectors import month_start
from tuning.engine import checkpoint as compiled_checkpoint
from tuning.models import DopRound, Measurement, TuningRun, TuningTask, team_usage_since

from .energy import run_energy_model
from .ledger import charge_run_usage
from .workdir import public_text, run_work_dir

# the engine's control() answer that ends the search as a spent trial budget does (the run succeeds)
FINISH = "finish"
MAX_ERROR_CHARS = 5000  # of one candidate's build/run error (a TextField: a cap, not a column width)


class LeaseLost(Exception):
    """Another executor took the run over (this one was presumed dead); stop quietly."""


class DatabaseSink:
    """The engine's TuningSink: streams tasks, measurements and rounds into the database."""

    HEARTBEAT_EVERY_S = 2.0
    clock = staticmethod(time.monotonic)  # the heartbeat's and the time budget's

    def __init__(self, run_id: int, lease: str, meter=None):
        self.run_id, self.lease = run_id, lease
        self.work_dir = run_work_dir(run_id)
        self._task_ids: dict[int, int] = dict(TuningTask.objects.filter(run_id=run_id).values_list("index", "pk"))
        self._last_beat = 0.0
        run = TuningRun.objects.only("team_id", "energy_joules", "energy_build_joules", "energy_measure_joules",
                                     "threads", "target", "energy_model", "max_minutes", "wall_seconds").get(pk=run_id)
        self.team_id = run.team_id
        self.cpu_watts_per_core = run_energy_model(run)["cpu_watts_per_core"]
        self.threads = run.threads or run.target.get("num-cores") or 1
        # Energy of earlier attempts (a resumed run) plus what this attempt's meter reads.
        self.meter = meter
        self._base = (run.energy_joules, run.energy_build_joules, run.energy_measure_joules)
        self._build_cpu_s = 0.0
        self._measure_cpu_s = 0.0
        self.stop_reason = ""
        # the time budget: what is left of it after earlier attempts, counted from this attempt's start
        self.max_minutes = run.max_minutes
        self._budget_left_s = run.time_budget_left_s
        self._started = self.clock()
        # the engine may report measurements from its progress thread while its tuning thread
        # asks control(): one writer at a time keeps the CPU-second counters consistent
        self._lock = threading.RLock()
        self._in_flight: tuple[int, int] | None = None

    def energy(self) -> tuple[float, float, float]:
        """(total, build, measure) joules of the whole run so far."""
        if self.meter is None:
            return self._base
        total = self.meter.read().joules
        # Builds use one core each, measurements `threads` cores: split the metered
        # energy in proportion to those CPU-seconds; the rest is search and overhead.
        attributed = (self._build_cpu_s + self._measure_cpu_s) * self.cpu_watts_per_core
        scale = min(1.0, total / attributed) if attributed else 0.0
        build = self._build_cpu_s * self.cpu_watts_per_core * scale
        measure = self._measure_cpu_s * self.cpu_watts_per_core * scale
        return self._base[0] + total, self._base[1] + build, self._base[2] + measure

    def flush(self) -> None:
        """Write the run's energy so far (called when the attempt ends, however it ends); nothing is
        in flight any more."""
        with self._lock, transaction.atomic():
            TuningRun.objects.filter(pk=self.run_id, lease=self.lease).update(
                builds_in_flight=0, measurements_in_flight=0, **self._energy_fields())
            charge_run_usage(self.run_id)
            self._in_flight = (0, 0)

    def on_progress(self, info) -> None:
        """Builds and measurements in flight (written when they change)."""
        counts = (max(0, int(info.builds_in_flight)), max(0, int(info.measurements_in_flight)))
        with self._lock:
            if counts == self._in_flight:
                return
            TuningRun.objects.filter(pk=self.run_id, lease=self.lease).update(
                builds_in_flight=counts[0], measurements_in_flight=counts[1])
            self._in_flight = counts

    def _energy_fields(self) -> dict:
        total, build, measure = self.energy()
        fields = {"energy_joules": total, "energy_build_joules": build, "energy_measure_joules": measure}
        if self.meter is not None:
            fields["energy_source"] = self.meter.source
        return fields

    def _check_lease(self) -> TuningRun:
        run = TuningRun.objects.only("lease", "requested_action", "status").get(pk=self.run_id)
        if run.lease != self.lease:
            raise LeaseLost(f"run {self.run_id} was taken over by another executor")
        return run

    def on_tasks(self, tasks) -> None:
        ids = {}
        with transaction.atomic():
            for t in tasks:
                obj, _ = TuningTask.objects.update_or_create(
                    run_id=self.run_id, index=t.index,
                    defaults={"name": fit_to_field(TuningTask, "name", t.name), "flops": float(t.flops or 0),
                              "weight": float(t.weight or 1)})
                ids[t.index] = obj.pk
            self._touch_run()
        self._task_ids.update(ids)  # only ids that were committed

    def on_measurements(self, records) -> None:
        if not records:
            return
        with self._lock:
            self._store_measurements(records)

    def _store_measurements(self, records) -> None:
        self._check_lease()
        new_ids: dict[int, int] = {}
        counters = (self._build_cpu_s, self._measure_cpu_s)
        # One transaction: a database error leaves neither a task row nor a measurement of this batch,
        # and the task-id cache and CPU-second counters only keep what was committed.
        try:
            with transaction.atomic():
                rows = [self._measurement_row(r, self._task_id(r, new_ids)) for r in records]
                Measurement.objects.bulk_create(rows, ignore_conflicts=True)
                self._refresh_tasks({row.task_id for row in rows})
                self._refresh_run(heartbeat=True)
                charge_run_usage(self.run_id)  # the trials and energy just recorded, in the same commit
        except BaseException:
            self._build_cpu_s, self._measure_cpu_s = counters
            raise
        self._task_ids.update(new_ids)

    def _task_id(self, record, new_ids: dict[int, int]) -> int:
        task_id = self._task_ids.get(record.task_index) or new_ids.get(record.task_index)
        if task_id is None:
            task_id = TuningTask.objects.get_or_create(
                run_id=self.run_id, index=record.task_index,
                defaults={"name": fit_to_field(TuningTask, "name", record.task_name)})[0].pk
            new_ids[record.task_index] = task_id
        return task_id

    def _measurement_row(self, r, task_id: int) -> Measurement:
        """The Measurement of one engine record; counts its CPU-seconds for the energy split."""
        secs = [float(s) for s in (r.run_secs or [])]
        latency = r.latency_s  # None exactly when the record has an error or no samples
        self._build_cpu_s += r.build_secs or 0.0
        # DOP workers share the cores: each measures with cores // DOP threads.
        self._measure_cpu_s += (r.run_wall_secs or 0.0) * max(1, self.threads // max(1, r.dop or 1))
        return Measurement(
            run_id=self.run_id, task_id=task_id, round_index=r.round_index, candidate_key=r.candidate_key,
            run_secs=secs, latency_s=latency, build_secs=r.build_secs, run_wall_secs=r.run_wall_secs,
            error=public_text(r.error or "", self.work_dir)[:MAX_ERROR_CHARS],
            worker=fit_to_field(Measurement, "worker", r.worker), dop=r.dop or 1,
            remeasured_serially=bool(r.remeasured_serially), serial_secs=r.serial_secs)

    def on_serial_remeasure(self, updates) -> None:
        """Final top-10 % serial re-measure: (task_index, candidate_key, serial_secs | None) triples, one
        per candidate built and measured again. Each re-measured time lands on its Measurement row
        (`remeasured_serially`, `serial_secs`), and each re-measure, timed or failed, is charged to the
        trial quota (`serial_remeasures`)."""
        updates = list(updates)
        if not updates:
            return
        self._check_lease()
        with transaction.atomic():
            for task_index, key, serial in updates:
                if serial is not None:
                    Measurement.objects.filter(run_id=self.run_id, task__index=task_index, candidate_key=key).update(
                        remeasured_serially=True, serial_secs=float(serial))
            TuningRun.objects.filter(pk=self.run_id, lease=self.lease).update(
                serial_remeasures=F("serial_remeasures") + len(updates))
            charge_run_usage(self.run_id)

    def _refresh_tasks(self, task_ids) -> None:
        stats = (Measurement.objects.filter(task_id__in=task_ids)
                 .values("task_id").annotate(n=Count("id"), best=Min("latency_s", filter=Q(error=""))))
        for s in stats:
            TuningTask.objects.filter(pk=s["task_id"]).update(
                trials=s["n"], best_latency_s=s["best"], status=TuningTask.Status.TUNING)

    def _refresh_run(self, *, heartbeat: bool) -> None:
        tasks = TuningTask.objects.filter(run_id=self.run_id)
        estimate = None
        if tasks and all(t.best_latency_s for t in tasks):
            estimate = sum(t.weight * t.best_latency_s for t in tasks)
        fields = {"trials_done": Measurement.objects.filter(run_id=self.run_id).count(),
                  "estimated_latency_s": estimate, **self._energy_fields()}
        if heartbeat:
            fields["heartbeat_at"] = timezone.now()
        TuningRun.objects.filter(pk=self.run_id, lease=self.lease).update(**fields)

    def on_round(self, info) -> None:
        with transaction.atomic():  # the round and the version bump that shows it land together
            DopRound.objects.update_or_create(
                run_id=self.run_id, round_index=info.round_index,
                defaults={"task_index": info.task_index, "dop": info.dop, "mean_error": info.mean_error,
                          "n_candidates": info.n_candidates, "n_remeasured": info.n_remeasured,
                          "n_failures": info.n_failures, "n_generated": getattr(info, "n_generated", None),
                          "n_filtered": getattr(info, "n_filtered", None),
                          "n_not_sent": getattr(info, "n_not_sent", None),
                          "wall_secs": getattr(info, "wall_secs", None),
                          "parallel_wall_secs": getattr(info, "parallel_wall_secs", None),
                          "serial_wall_secs": getattr(info, "serial_wall_secs", None)})
            self._touch_run()

    def on_checkpoint(self, checkpoint) -> None:
        """The engine's compiled checkpoint, kept in the run's summary (the page, API and CLI read it there;
        the summary the run ends with carries it again)."""
        clean = compiled_checkpoint.as_reported(checkpoint)
        if clean is None:
            return
        if "error" in clean:
            clean["error"] = public_text(clean["error"], self.work_dir)
        with self._lock, transaction.atomic():
            run = TuningRun.objects.select_for_update().only("summary", "lease").get(pk=self.run_id)
            if run.lease != self.lease:
                raise LeaseLost(f"run {self.run_id} was taken over by another executor")
            TuningRun.objects.filter(pk=self.run_id).update(
                summary={**(run.summary or {}), "compiled_checkpoint": clean})
            self._touch_run()

    def _touch_run(self) -> None:
        """A write to the run's tasks or rounds changes what its pages show: bump the run's version."""
        TuningRun.objects.filter(pk=self.run_id).touch()

    def control(self) -> str | None:
        with self._lock:
            return self._control()

    def _control(self) -> str | None:
        now = self.clock()
        run = self._check_lease()
        if now - self._last_beat > self.HEARTBEAT_EVERY_S:
            TuningRun.objects.filter(pk=self.run_id, lease=self.lease).update(
                heartbeat_at=timezone.now(), **self._energy_fields())
            self._last_beat = now
        if run.requested_action:
            return run.requested_action
        if self._energy_quota_reached():
            return TuningRun.Action.CANCEL
        if self._time_budget_spent(now):
            return FINISH
        return None

    def _time_budget_spent(self, now: float) -> bool:
        """The run's wall-time budget is spent (earlier attempts' time included): tuning finishes between
        rounds as at a spent trial budget, so the best schedules found are compiled and compared."""
        if self._budget_left_s is None or now - self._started < self._budget_left_s:
            return False
        self.stop_reason = (f"Finished at the run's time budget ({self.max_minutes} min of tuning); the best "
                            f"schedules found by then are compiled.")
        return True

    def _energy_quota_reached(self) -> bool:
        budget_kwh = Quota.objects.filter(team_id=self.team_id).values_list("energy_kwh_per_month", flat=True).first()
        if budget_kwh is None:
            return False
        # the team's other work from the usage ledger (deleted or archived runs included), this run live
        used = team_usage_since(self.team_id, month_start(), exclude_run=self.run_id)[1] + self.energy()[0]
        if used >= budget_kwh * JOULES_PER_KWH:
            self.stop_reason = (f"Stopped at the team's energy quota ({budget_kwh:g} kWh per month); "
                                f"results so far are kept.")
            return True
        return False
