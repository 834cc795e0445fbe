"""What a page shows, as plain data: the template and the live JSON use the same dicts.

Numbers are formatted here once (``display``), so the server-rendered page and
the values the browser swaps in every 2 s can never disagree.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from django.core.cache import cache
from django.urls import reverse
from django.utils import timezone

from common.units import JOULES_PER_KWH, joules_to_kwh
from tuning import selectors as tuning_selectors
from tuning.models import TuningRun
from tuning.services.runs import Control, Outcome, transition

from . import charts, queries

CURVE_MAX_POINTS = 400         # per series, after server-side downsampling
CURVE_MAX_POINTS_MANY_TASKS = 200
MANY_TASKS = 20
FULL_RESOLUTION = 10**9
DASH = "—"


def fmt_latency(seconds: float | None) -> str:
    if seconds is None:
        return DASH
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} µs"


def fmt_spread(median_s: float | None, iqr_s: float | None) -> str:
    """A compiled latency as every page and the CLI print it: the median, and its IQR when known."""
    if median_s is None:
        return DASH
    return fmt_latency(median_s) + (f" (IQR {fmt_latency(iqr_s)})" if iqr_s is not None else "")


def fmt_duration(seconds: float | None) -> str:
    if not seconds:
        return DASH if seconds is None else "0 s"
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(int(round(seconds)), 60)
    if minutes < 120:
        return f"{minutes} min {sec:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def fmt_number(value, digits: int = 2, suffix: str = "") -> str:
    if value is None:
        return DASH
    return f"{value:,.{digits}f}{suffix}"


def fmt_flops(flops: float | None) -> str:
    if not flops:
        return DASH
    for unit, scale in (("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if flops >= scale:
            return f"{flops / scale:.2f} {unit}"
    return f"{flops:.0f} FLOP"


def fmt_energy(joules: float | None) -> str:
    if joules is None:
        return DASH
    if joules >= 0.1 * JOULES_PER_KWH:
        return f"{joules_to_kwh(joules):.3f} kWh"
    if joules >= 1000:
        return f"{joules / 1000:.2f} kJ"
    return f"{joules:.1f} J"


def fmt_carbon(grams: float | None) -> str:
    if grams is None:
        return DASH
    return f"{grams / 1000:.3f} kgCO2e" if grams >= 1000 else f"{grams:.2f} gCO2e"


def fmt_target(target: dict) -> str:
    if not target:
        return DASH
    extras = ", ".join(f"{k} {v}" for k, v in target.items() if k != "kind")
    return f"{target.get('kind')}" + (f" ({extras})" if extras else "")


def run_actions(run: TuningRun) -> dict:
    """The controls that would change the run, by the run state machine's own table."""
    return {control: transition(run.status, run.requested_action, control)[0] not in (Outcome.REFUSED,
                                                                                       Outcome.UNCHANGED)
            for control in (Control.CANCEL, Control.PAUSE, Control.RESUME)}


def live_wall(run: TuningRun, now=None) -> tuple[float, str | None]:
    """(tuning wall time so far, the ISO time the running attempt began or None).

    ``wall_seconds`` grows only when an attempt ends, so a running run adds the time since it started;
    only the first attempt's start is stored, so a resumed run adds nothing until its attempt ends."""
    if run.status == TuningRun.Status.RUNNING and run.started_at and run.attempts <= 1:
        now = now or timezone.now()
        return run.wall_seconds + max(0.0, (now - run.started_at).total_seconds()), run.started_at.isoformat()
    return run.wall_seconds, None


def fmt_wall(run: TuningRun, seconds: float, running_since: str | None) -> str:
    if run.status != TuningRun.Status.RUNNING:
        return fmt_duration(run.wall_seconds)
    if running_since is None:
        return f"{fmt_duration(run.wall_seconds)} before this attempt (it adds its time when it ends)"
    return f"{fmt_duration(seconds)} so far"


def eta_seconds(run: TuningRun, elapsed: float) -> float | None:
    """Time left at this run's pace so far (trials per second), or of its time budget when that ends it
    sooner; None before the first trial."""
    if run.status != TuningRun.Status.RUNNING or not run.trials_done or elapsed <= 0:
        return None
    at_pace = max(0, run.max_trials - run.trials_done) * elapsed / run.trials_done
    return min(at_pace, max(0.0, run.max_minutes * 60 - elapsed)) if run.max_minutes else at_pace


def fmt_eta(run: TuningRun, eta: float | None) -> str:
    if run.status in TuningRun.TERMINAL or run.status == TuningRun.Status.PAUSED:
        return DASH
    if eta is None:
        return "after the first measured round" if run.status == TuningRun.Status.RUNNING else "when it starts"
    note = ", sooner if Trimmer stops it" if run.trimmer_enabled else ""
    return f"about {fmt_duration(eta)} (estimate at this run's pace{note})"


def fmt_energy_split(energy: dict | None) -> str:
    """Build, measure and the rest of the total (idle time, the search, compiling the final model), so the
    parts add up to the total shown above them."""
    if energy is None:
        return DASH
    build, measure, total = energy["build_j"] or 0.0, energy["measure_j"] or 0.0, energy["energy_j"] or 0.0
    other = total - build - measure
    text = f"build {fmt_energy(build)} · measure {fmt_energy(measure)}"
    if other > max(0.5, 0.005 * total):
        text += f" · other (idle, search) {fmt_energy(other)}"
    return text + f" = {fmt_energy(max(total, build + measure))}"


def fmt_energy_saved(run: TuningRun, energy: dict | None) -> str:
    """Trimmer's estimated saving; when it is zero, why (the ML filter swaps candidates, it saves no trials)."""
    if energy is None or energy["saved_j"] is None:
        return DASH
    if energy["saved_j"] > 0:
        return fmt_energy(energy["saved_j"]) + (f" ({energy['trials_saved']:,} trials)"
                                                 if energy["trials_saved"] else "")
    if not run.trimmer_enabled:
        return "0 J (Trimmer was off)"
    return ("0 J: Trimmer did not stop the run before its budget; filtering picks which candidates are "
            "measured, it does not measure fewer")


def fmt_filtered(run: TuningRun) -> str:
    if not run.candidates_generated:
        return DASH
    text = (f"{run.candidates_filtered:,} of {run.candidates_generated:,} scored candidates dropped before "
            "building (replaced by better-scored ones)")
    if run.candidates_not_sent:
        text += (f"; {run.candidates_not_sent:,} kept but not measured (measured earlier in the run, or past "
                 "its trial budget)")
    return text


def fmt_charged(run: TuningRun) -> str:
    """What the team's usage ledger holds for this run: a failed run the ledger did not charge shows no charge."""
    charged = queries.run_energy_charged(run)
    if charged is None:
        if run.status == TuningRun.Status.FAILED and not run.trials_done:
            return "not charged (failed before any trial)"
        return "nothing charged yet"
    text = f"{fmt_energy(charged)} (usage ledger)"
    if run.status == TuningRun.Status.FAILED and not run.trials_done:
        text += ": failed before any trial; the energy its worker used is still counted"
    return text


def run_numbers(run: TuningRun, *, dop_rounds: int | None = None) -> dict:
    """The run's headline numbers: raw values for automation, display strings for the page."""
    energy = queries.run_energy(run)
    wall_so_far, running_since = live_wall(run)
    eta = eta_seconds(run, wall_so_far) if running_since else None
    raw = {
        "id": run.pk, "status": run.status, "status_label": run.get_status_display(),
        "requested_action": run.requested_action or "", "progress": round(run.progress, 4),
        "trials_done": run.trials_done, "max_trials": run.max_trials, "wall_seconds": run.wall_seconds,
        "running_since": running_since, "wall_so_far_s": wall_so_far, "eta_s": eta,
        "estimated_latency_s": run.estimated_latency_s, "final_dop": run.final_dop,
        "mean_parallel_error": run.mean_parallel_error, "tuned_latency_s": run.tuned_latency_s,
        "untuned_latency_s": run.untuned_latency_s, "speedup": run.speedup, "outputs_match": run.outputs_match,
        "error": run.error, "is_active": run.is_active, "is_terminal": run.status in TuningRun.TERMINAL,
        "attempts": run.attempts, "worker": run.worker,
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "has_records": bool(run.records_file), "has_module": bool(run.module_file),
        "dop_rounds": dop_rounds, "energy": energy, "actions": run_actions(run),
        "trimmer_enabled": run.trimmer_enabled, "trimmer_options": run.trimmer_options,
        "candidates_generated": run.candidates_generated, "candidates_filtered": run.candidates_filtered,
        "candidates_not_sent": run.candidates_not_sent, "stop_reason": run.stop_reason,
        "builds_in_flight": run.builds_in_flight, "measurements_in_flight": run.measurements_in_flight,
        "compiled_checkpoint": run.compiled_checkpoint,
        **onnxruntime_numbers(run),
    }
    pending = {"cancel": " (cancel requested)", "pause": " (pause requested)"}.get(run.requested_action or "", "")
    position = run.queue_position
    if position is not None:
        pending = f" (number {position} waiting for one of the team's run slots)"
    raw["queue_position"] = position
    display = {
        "status": run.get_status_display() + pending,
        "trials": f"{run.trials_done:,} / {run.max_trials:,}",
        "progress_pct": f"{run.progress * 100:.0f}%",
        "wall": fmt_wall(run, wall_so_far, running_since),
        "eta": fmt_eta(run, eta),
        "estimate": fmt_estimate(run, raw["tasks_missing_from_estimate"]),
        "checkpoint": run.checkpoint_note or DASH,
        "final_dop": str(run.final_dop) if run.final_dop else DASH,
        "mean_error": fmt_number(run.mean_parallel_error * 100 if run.mean_parallel_error is not None else None,
                                 2, " %"),
        "tuned": fmt_spread(run.tuned_latency_s, run.tuned_latency_iqr_s),
        "untuned": fmt_latency(run.untuned_latency_s),
        "speedup": fmt_number(run.speedup, 2, "×"),
        "outputs_match": DASH if run.outputs_match is None else ("yes" if run.outputs_match else "NO"),
        "energy": "not measured yet" if energy is None else f"{fmt_energy(energy['energy_j'])} ({energy['source']}"
        + (f" at {energy['cpu_watts_per_core']:g} W/core" if "modeled" in energy["source"]
           and energy["cpu_watts_per_core"] else "") + ")",
        "energy_split": fmt_energy_split(energy),
        "energy_charged": fmt_charged(run),
        "energy_saved": fmt_energy_saved(run, energy),
        "carbon": "not measured yet" if energy is None else (
            fmt_carbon(energy["carbon_g"]) + (f" at {energy['grid_intensity_g_per_kwh']:g} g/kWh"
                                              if energy["grid_intensity_g_per_kwh"] is not None else "")),
        "trimmer": "on" if run.trimmer_enabled else "off",
        "filtered": fmt_filtered(run),
        "stop_reason": run.stop_reason or DASH,
        "in_flight": (f"{run.builds_in_flight:,} building · {run.measurements_in_flight:,} measuring"
                      if run.is_active else DASH),
        "dop_rounds": DASH if dop_rounds is None else f"{dop_rounds:,}",
        **onnxruntime_display(run),
    }
    raw["display"] = display
    return raw


def onnxruntime_numbers(run: TuningRun) -> dict:
    """The resolved target, the onnxruntime yardstick and the tasks the estimate lacks, raw."""
    return {"tasks_missing_from_estimate": tuning_selectors.tasks_without_measurement(run),
            "resolved_target": run.resolved_target, "target_key": run.target_key,
            "tuned_latency_iqr_s": run.tuned_latency_iqr_s,
            "ort_latency_s": run.ort_latency_s, "ort_latency_iqr_s": run.ort_latency_iqr_s,
            "ratio_to_ort": run.ratio_to_ort,
            "faster_engine": run.faster_engine or None, "ort_outputs_agree": run.ort_outputs_agree,
            "ort_error": (run.summary or {}).get("onnxruntime_error") or "",
            "verdict": run.verdict or None, "verdict_flag": run.verdict_flag, "timing_load": run.timing_load,
            "estimate_gap": run.estimate_gap,
            "deploy_verdict": run.deploy_verdict, "slower_than_ort": run.slower_than_ort,
            "parity_trials": run.parity_trials, "parity_wall_s": run.parity_wall_s,
            "pipeline_key": run.pipeline_key, "evaluator": run.evaluator}


def fmt_estimate(run: TuningRun, missing: list[str]) -> str:
    if not missing or run.estimated_latency_s is None:
        return fmt_latency(run.estimated_latency_s)
    names = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    return f"{fmt_latency(run.estimated_latency_s)} (without {len(missing)} unmeasured task(s): {names})"


def engine_verdict(run: TuningRun) -> str:
    """Which engine to deploy, in words (the run's deploy_verdict); without a comparison, why there is none."""
    summary = run.summary or {}
    return run.deploy_verdict or summary.get("not_measured_here") or summary.get("onnxruntime_error") or DASH


def fmt_parity(run: TuningRun) -> str:
    """When the end-to-end estimate first reached onnxruntime's latency: stored only when the compiled
    model's verdict confirms it reached onnxruntime (tuning.services.finish)."""
    if run.parity_trials is not None:
        wall = f" after {fmt_duration(run.parity_wall_s)}" if run.parity_wall_s is not None else ""
        return f"trial {run.parity_trials:,}{wall}"
    return "not reached by the compiled model" if run.ort_latency_s is not None else DASH


def fmt_estimate_gap(run: TuningRun) -> str:
    gap = run.estimate_gap
    return gap["note"] if gap else ""


# what the run page says of a run's target, graph passes and timing before a worker has resolved them
NOT_RESOLVED_YET = "resolved when a worker starts the run"


def onnxruntime_display(run: TuningRun) -> dict:
    return {
        "resolved_target": fmt_target(run.resolved_target) if run.resolved_target else NOT_RESOLVED_YET,
        "pipeline": run.pipeline_words or NOT_RESOLVED_YET,
        "timing": run.timing_words or NOT_RESOLVED_YET,
        "ort": fmt_spread(run.ort_latency_s, run.ort_latency_iqr_s),
        "estimate_gap": fmt_estimate_gap(run),
        "ratio_to_ort": fmt_number(run.ratio_to_ort, 2, "×"),
        "ort_outputs_agree": DASH if run.ort_outputs_agree is None else ("yes" if run.ort_outputs_agree else "NO"),
        "verdict": engine_verdict(run),
        "parity": fmt_parity(run),
    }


def task_table(run: TuningRun, tasks=None) -> list[dict]:
    tasks = queries.tasks_of_run(run) if tasks is None else tasks
    rows = queries.task_rows(tasks)
    for row in rows:
        row["display"] = {
            "flops": fmt_flops(row["flops"]), "trials": f"{row['trials']:,}",
            "best": fmt_latency(row["best_latency_s"]), "gflops": fmt_number(row["gflops_per_s"], 2),
            "weight": f"{row['weight']:g}",
            "status": row["status_label"] + (f" at trial {row['preempted_at_trial']:,}"
                                             if row["preempted_at_trial"] is not None else ""),
        }
    return rows


def compress_steps(xs: list, ys: list, max_points: int) -> tuple[list, list]:
    """Keep only the points where a best-so-far staircase changes (plus its last point).

    Lossless for a line drawn with shape "hv" (what the curve figures use): a
    run of 10,000 measurements has a few hundred improvements, not 10,000
    distinct points. Trials before the first valid measurement (None) are
    dropped. Only if more than `max_points` changes remain is the staircase
    thinned (evenly, keeping the last point).
    """
    out_x: list = []
    out_y: list = []
    last = len(xs) - 1
    prev = None
    for i, (x, y) in enumerate(zip(xs, ys)):
        if y is None:
            continue
        if y != prev or i == last:
            out_x.append(x)
            out_y.append(y)
            prev = y
    if len(out_x) > max_points:
        step = len(out_x) / max_points
        idx = sorted({int(k * step) for k in range(max_points)} | {len(out_x) - 1})
        out_x, out_y = [out_x[k] for k in idx], [out_y[k] for k in idx]
    return out_x, out_y


def curve_max_points(n_tasks: int | None) -> int:
    many = n_tasks is not None and n_tasks > MANY_TASKS
    return CURVE_MAX_POINTS_MANY_TASKS if many else CURVE_MAX_POINTS


def curve_for(run: TuningRun, *, n_tasks: int | None = None, max_points: int | None = None,
              state: dict | None = None) -> dict:
    """tuning.selectors.best_so_far_curve, reduced to its change points (see compress_steps).
    `state` receives where the series end (the live cursor, see run_live_delta)."""
    if max_points is None:
        max_points = curve_max_points(n_tasks)
    # Unthinned from the selector (index sampling could drop improvements), then compressed losslessly.
    curve = tuning_selectors.best_so_far_curve(run, max_points=FULL_RESOLUTION, state=state)
    for task in curve["tasks"].values():
        task["trials"], task["best_s"] = compress_steps(task["trials"], task["best_s"], max_points)
    e2e = curve["end_to_end"]
    e2e["trials"], e2e["estimate_s"] = compress_steps(e2e["trials"], e2e["estimate_s"], max_points)
    return curve


def full_resolution_curve(run: TuningRun) -> dict:
    """Every measurement a point (the benchmark's baseline)."""
    return tuning_selectors.best_so_far_curve(run, max_points=FULL_RESOLUTION)


def run_curve_figure(run: TuningRun, *, n_tasks: int | None = None, max_points: int | None = None,
                     full_resolution: bool = False, state: dict | None = None) -> dict:
    curve = full_resolution_curve(run) if full_resolution else curve_for(run, n_tasks=n_tasks, max_points=max_points,
                                                                         state=state)
    missing = tuning_selectors.tasks_without_measurement(run) if not curve["end_to_end"]["trials"] else None
    return charts.best_so_far_figure(curve, run_id=run.pk, missing=missing)


def run_dop_figure(run: TuningRun, rounds: list[dict] | None = None) -> dict:
    rounds = queries.dop_rounds_of_run(run) if rounds is None else rounds
    return charts.dop_figure(rounds, run_id=run.pk)


def _round_rows(rounds: list[dict]) -> list[dict]:
    return [{**r, "display": {"mean_error": fmt_number(r["mean_error"] * 100 if r["mean_error"] is not None
                                                      else None, 2, " %"),
                              "measuring": _measuring_time(r)}} for r in rounds]


def _measuring_time(r: dict) -> str:
    """A round's measuring wall time and where it went: at its DOP, and DOPpler's serial re-measures."""
    wall, par, ser = r.get("wall_secs"), r.get("parallel_wall_secs"), r.get("serial_wall_secs")
    if wall is None:
        return DASH
    if par is None or ser is None:
        return fmt_number(wall, 2, " s")
    return f"{fmt_number(wall, 2, ' s')} ({fmt_number(par, 2)} at DOP + {fmt_number(ser, 2)} serial)"


def run_live_payload(run: TuningRun, *, include_figures: bool = True) -> dict:
    """Everything the run page refreshes: numbers, task table, DOP rounds, figures.

    With the figures comes a `cursor`: where the curve, the rounds and the task rows sent stand; a poll
    that sends it back gets only what is new (run_live_delta)."""
    tasks = queries.tasks_of_run(run)
    rounds = queries.dop_rounds_of_run(run)
    rows = task_table(run, tasks)
    payload = {
        "mode": "full",
        "run": run_numbers(run, dop_rounds=len(rounds)),
        "tasks": rows,
        "dop_rounds": _round_rows(rounds),
        "stamp": live_stamp(run, len(rounds)),
    }
    if include_figures:
        state: dict = {}
        payload["figures"] = {
            "curve": run_curve_figure(run, n_tasks=len(tasks), state=state),
            "dop": run_dop_figure(run, rounds),
        }
        next_round = rounds[-1]["round_index"] + 1 if rounds else 0
        payload["cursor"] = remember_cursor(run, n=state["n"], last_id=state["last_id"], next_round=next_round,
                                            best=state["best"], tasks=tasks, rows=rows)
    return payload


# --- live deltas: a changed poll answers what is new since the client's cursor ---------------------------

LIVE_DELTA_MAX_ROWS = 5000      # new measurements one delta carries; a client further behind is re-sent all
CURSOR_STATE_S = 1800           # cursor states outlive the per-version bodies (FIGURE_CACHE_S) they come with
CURSOR_RE = re.compile(r"^(\d{1,12})-(\d{1,15})-(\d{1,9})-([0-9a-f]{8})$")
POINTS_RE = re.compile(r"^\d{1,9}$")


@dataclass(frozen=True)
class LiveCursor:
    """Where a client's page stands: `n` measurements drawn (the last of id `last_id`), DOP rounds before
    `next_round` listed, task rows whose digest is `rows`. Opaque to the client: it sends back what it got."""

    n: int
    last_id: int
    next_round: int
    rows: str

    def __str__(self) -> str:
        return f"{self.n}-{self.last_id}-{self.next_round}-{self.rows}"


def parse_cursor(raw: str) -> LiveCursor:
    """ValueError (with the reason) for anything but a cursor this server could have sent."""
    match = CURSOR_RE.match(raw or "")
    if match is None:
        raise ValueError("Not a cursor: send back the `cursor` of the previous answer unchanged.")
    n, last_id, next_round, rows = match.groups()
    return LiveCursor(int(n), int(last_id), int(next_round), rows)


def parse_points(raw: str) -> int:
    if not POINTS_RE.match(raw or ""):
        raise ValueError("A whole number from 0 to 999999999: the most points a curve trace of the page holds.")
    return int(raw)


def _row_hash(row: dict) -> str:
    return hashlib.sha1(json.dumps(row, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _rows_digest(hashes: dict[int, str]) -> str:
    return hashlib.sha1("|".join(f"{i}:{h}" for i, h in sorted(hashes.items())).encode()).hexdigest()[:8]


def _cursor_key(run: TuningRun, cursor: LiveCursor | str) -> str:
    return f"run:{run.pk}:live-cursor:{cursor}"


def remember_cursor(run: TuningRun, *, n: int, last_id: int, next_round: int, best: dict, tasks, rows) -> str:
    """The cursor of an answer, and (in the cache) the state behind it that a delta continues from: the
    best latency per task at that point, the task set and weights, and a hash per task row sent."""
    hashes = {r["index"]: _row_hash(r) for r in rows}
    cursor = LiveCursor(n, last_id, next_round, _rows_digest(hashes))
    cache.set(_cursor_key(run, cursor), {"best": dict(best), "tasks": [(t.index, t.weight) for t in tasks],
                                         "rows": hashes}, CURSOR_STATE_S)
    return str(cursor)


def delta_points_limit(n_tasks: int) -> int:
    """A page extended by deltas holds up to twice the points of a fresh curve, then it is re-sent (thinned)."""
    return 2 * curve_max_points(n_tasks)


def _full(run: TuningRun, reason: str) -> dict:
    body = cached_for_version("live", run, lambda: run_live_payload(run))
    return {**body, "refresh": reason}


def run_live_delta(run: TuningRun, cursor: LiveCursor, points: int, *,
                   rounds: tuple[int, int | None] | None = None) -> dict:
    """What changed since `cursor`: the run's numbers, the task rows that differ from those the client has,
    the DOP rounds from `cursor.next_round` on, and the new points of every curve trace (change points
    and each trace's last point, exactly what compress_steps keeps), for Plotly.extendTraces.

    Reads only the measurements stored after the cursor (and the run's small task and round tables);
    the best-so-far state at the cursor comes from the cache entry the answer that gave the cursor left.
    Where a delta cannot be exact it answers the full payload (mode "full", with the `refresh` reason):
    a finished run, an unknown or expired cursor, one past the stored measurements, changed tasks, a
    client too far behind, a curve grown past delta_points_limit, or a figure that changes shape (the
    first valid measurement of a task while the end-to-end estimate has not started, the first round).
    `rounds`: queries.dop_round_stats(run), when the caller has read it already."""
    if run.status in TuningRun.TERMINAL:
        return _full(run, "the run has finished")
    if cursor.n > run.trials_done:
        return _full(run, "the cursor is past the stored measurements")
    state = cache.get(_cursor_key(run, cursor))
    if state is None:
        return _full(run, "unknown or expired cursor")
    tasks = queries.tasks_of_run(run)
    if [(t.index, t.weight) for t in tasks] != [tuple(t) for t in state["tasks"]]:
        return _full(run, "the run's tasks changed")
    if points > delta_points_limit(len(tasks)):
        return _full(run, "the curve is re-sent thinned")
    new = tuning_selectors.measurements_after(run, cursor.last_id, limit=LIVE_DELTA_MAX_ROWS + 1)
    if len(new) > LIVE_DELTA_MAX_ROWS:
        return _full(run, "too far behind")
    if cursor.n + len(new) != run.trials_done:  # a batch landed meanwhile, or a row committed out of id order
        return _full(run, "measurements were being stored")
    by_index = {t.index: t for t in tasks}
    best = dict(state["best"])
    e2e_prev = tuning_selectors.end_to_end_estimate(by_index, best)
    last_of_task = {row[1]: k for k, row in enumerate(new)}
    if any(ti not in by_index for ti in last_of_task):
        return _full(run, "the run's tasks changed")
    task_prev = {i: best.get(i) for i in by_index}
    task_pts: dict[int, tuple[list, list]] = {i: ([], []) for i in by_index}
    e2e_pts: tuple[list, list] = ([], [])
    n = cursor.n
    for k, (_, task_index, latency, error) in enumerate(new):
        n += 1
        if latency is not None and not error and latency < best.get(task_index, float("inf")):
            if task_index not in best and e2e_prev is None:
                return _full(run, "a task's first valid measurement changes the figure")
            best[task_index] = latency
        y = best.get(task_index)
        if y is not None and (y != task_prev[task_index] or k == last_of_task[task_index]):
            task_pts[task_index][0].append(n)
            task_pts[task_index][1].append(y)
            task_prev[task_index] = y
        estimate = tuning_selectors.end_to_end_estimate(by_index, best)
        if estimate is not None and (estimate != e2e_prev or k == len(new) - 1):
            e2e_pts[0].append(n)
            e2e_pts[1].append(estimate)
            e2e_prev = estimate
    n_rounds, max_dop = queries.dop_round_stats(run) if rounds is None else rounds
    rounds = queries.dop_rounds_from(run, cursor.next_round)
    if rounds and cursor.next_round == 0:
        return _full(run, "the first DOP round changes the figure")
    rows = task_table(run, tasks)
    changed = [r for r in rows if _row_hash(r) != state["rows"].get(r["index"])]
    next_round = rounds[-1]["round_index"] + 1 if rounds else cursor.next_round
    last_id = new[-1][0] if new else cursor.last_id
    return {
        "mode": "delta",
        "run": run_numbers(run, dop_rounds=n_rounds),
        "tasks": changed,
        "dop_rounds": _round_rows(rounds),
        "extend": {"curve": charts.curve_extension(sorted(by_index), e2e_pts, task_pts),
                   "dop": charts.dop_extension(rounds, n_rounds=n_rounds, max_dop=max_dop)},
        "stamp": live_stamp(run, n_rounds),
        "cursor": remember_cursor(run, n=n, last_id=last_id, next_round=next_round, best=best, tasks=tasks,
                                  rows=rows),
    }


def live_stamp(run: TuningRun, n_rounds: int) -> str:
    """Changes whenever anything the page shows changes (the browser skips re-plotting otherwise)."""
    parts = (run.status, run.requested_action, run.trials_done, n_rounds, run.estimated_latency_s,
             run.final_dop, run.tuned_latency_s, run.verdict, bool(run.records_file), bool(run.module_file),
             round(run.energy_joules, 1), run.candidates_filtered, run.stop_reason, run.builds_in_flight,
             run.measurements_in_flight)
    return "|".join(str(p) for p in parts)


def run_links(run: TuningRun) -> dict:
    return {
        "records": f"/api/runs/{run.pk}/records/",
        "module": f"/api/runs/{run.pk}/module/",
        "package": f"/api/runs/{run.pk}/package/",
        "live": reverse("charts-run-live", args=[run.pk]),
        "curve": reverse("charts-run-curve", args=[run.pk]),
        "dop": reverse("charts-run-dop", args=[run.pk]),
    }


def _settings_of(run: TuningRun) -> dict[str, str]:
    """The settings a user chose for a run, in words (the compare page lists those that differ)."""
    trimmer = run.trimmer_options or {}
    out = {
        "Model": run.model.name,
        "Target": fmt_target(run.target),
        "Measurement mode": run.get_measurement_mode_display(),
        "DOP": f"fixed {run.dop_fixed}" if run.dop_fixed else "automatic",
        "Trial budget": f"{run.max_trials:,}",
        "Time budget": f"{run.max_minutes:,} min" if run.max_minutes else "none (trials only)",
        "Trials per round": f"{run.trials_per_round:,}",
        "Threads per measurement": str(run.threads) if run.threads else "the target's cores",
        "Trimmer": "on" if run.trimmer_enabled else "off",
    }
    if run.trimmer_enabled:
        for key in sorted(trimmer):
            out[f"Trimmer: {key.replace('_', ' ')}"] = str(trimmer[key])
    for key in sorted(run.options or {}):
        out[f"Option: {key.replace('_', ' ')}"] = str(run.options[key])
    return out


def settings_diff(runs) -> list[dict]:
    """One row per setting whose value is not the same in every run (a setting a run lacks shows a dash)."""
    settings = [_settings_of(r) for r in runs]
    labels: list[str] = []
    for one in settings:
        labels.extend(label for label in one if label not in labels)
    rows = []
    for label in labels:
        values = [one.get(label, DASH) for one in settings]
        if len(set(values)) > 1:
            rows.append({"label": label, "values": values})
    return rows


def compare_rows(runs) -> list[dict]:
    rows = []
    for run in runs:
        numbers = run_numbers(run)
        rows.append({"run": run, "numbers": numbers, "target": fmt_target(run.engine_target)})
    return rows


FIGURE_CACHE_S = 600  # bodies of one run version; a new version is a new key, so this only bounds memory


def cached_for_version(key: str, run: TuningRun, build):
    """`build()` once per run version (Django cache): the run page and its JSON endpoints share it."""
    key = f"run:{run.pk}:v{run.version}:{key}"
    body = cache.get(key)
    if body is None:
        body = build()
        cache.set(key, body, FIGURE_CACHE_S)
    return body


# --- the start form's estimate ---------------------------------------------------------------------------

MAX_ESTIMATED_MODELS = 50  # the form's model list is short; beyond this a model gets the team's figures


def start_estimates(models, *, default_joules_per_trial: float) -> dict[str, dict]:
    """Per model: its tuning task count and the per-trial wall time and energy of recent finished runs
    (the model's own, else the team's), for the start form's estimate (drawn here and by dashboard.js)."""
    out: dict[str, dict] = {}
    team_costs: dict[int, dict | None] = {}
    for index, model in enumerate(models):
        costs = queries.recent_per_trial_costs(model.team_id, model.pk) if index < MAX_ESTIMATED_MODELS else None
        if costs is None:
            if model.team_id not in team_costs:
                team_costs[model.team_id] = queries.recent_per_trial_costs(model.team_id)
            costs = team_costs[model.team_id]
        joules, energy_basis = (costs or {}).get("joules_per_trial"), None
        if joules is None:
            joules, energy_basis = default_joules_per_trial, "the platform's default energy per trial"
        out[str(model.pk)] = {
            "tasks": model.num_tuning_tasks or 0,
            "wall_s_per_trial": costs["wall_s_per_trial"] if costs else None,
            "joules_per_trial": joules,
            "basis": (costs["basis"] if costs else "no finished run to learn from yet")
            + (f"; energy from {energy_basis}" if energy_basis else ""),
        }
    return out


def fmt_start_estimate(entry: dict | None, max_trials) -> str:
    """The estimate line the start form shows for one model and trial budget (dashboard.js writes the same)."""
    if entry is None:
        return ""
    try:
        trials = int(max_trials)
    except (TypeError, ValueError):
        return "Estimate: give the number of trials."
    wall = entry["wall_s_per_trial"]
    time_text = f"about {fmt_duration(wall * trials)}" if wall else "time unknown"
    tasks = f"; the model has {entry['tasks']} tuning tasks" if entry["tasks"] else ""
    return (f"Estimate for {trials:,} trials: {time_text}, about {fmt_energy(entry['joules_per_trial'] * trials)} "
            f"(from {entry['basis']}{tasks}).")
