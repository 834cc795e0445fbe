"""The last write of a successful run: results, artifacts, task states and status, all or nothing."""
from __future__ import annotations

from pathlib import Path

from django.core.files.base import ContentFile
from django.db import transaction
from django.db.models import Count, Sum
from django.utils import timezone

from common.jsonsafe import json_safe
from core.exceptions import ServiceError
from core.services import notify_terminal
from core.fieldtext import fit_to_field
from tuning import adapters
from tuning.adapters import LeaseLost
from tuning.engine import verdict as verdict_rule
from tuning.adapters.reconnect import lease_margin_s, wait_for_database
from tuning.engine.doppler.parallel_error import as_fraction
from tuning.models import DopRound, Measurement, TuningRun, TuningTask
from tuning.selectors import time_to_parity

from .run_queue import dispatch_when_slot_frees


class NoMeasurement(ServiceError):
    pass


def finish_succeeded(run_id: int, lease: str, model_proto, summary, work_dir: Path, stop_reason: str = "") -> None:
    """Compile and compare the tuned model, then store everything in one transaction: a failure at any
    write (or a lost lease) leaves the run, its tasks and the media directory as they were. ``stop_reason``:
    why the caller ended tuning before its trial budget (the run's time budget), when it did."""
    run = TuningRun.objects.get(pk=run_id)
    comparison = adapters.compile_and_compare(model_proto, work_dir, run)
    wait_for_database(within_s=lease_margin_s())  # the compile takes minutes: the connection may have dropped
    require_a_measurement(run)
    records_zip = adapters.zip_database(work_dir)
    trim = _summary_field(summary, "trimmer") or {}
    summary_dict = summary.to_dict() if hasattr(summary, "to_dict") else dict(getattr(summary, "__dict__", {}))
    saved_files: list = []
    try:
        with transaction.atomic():
            run = TuningRun.objects.select_for_update().get(pk=run_id)
            if run.lease != lease:
                raise LeaseLost(f"run {run_id} was taken over")
            _store_task_states(run_id, summary, trim)
            saved_files += _store_artifacts(run, records_zip, work_dir)
            run.tuned_latency_s = comparison.get("tuned_latency_s")
            run.tuned_latency_iqr_s = comparison.get("tuned_latency_iqr_s")
            run.untuned_latency_s = comparison.get("untuned_latency_s")
            run.outputs_match = comparison.get("outputs_match")
            run.max_abs_diff = comparison.get("max_abs_diff")
            _store_onnxruntime(run, comparison)
            _store_time_to_parity(run)
            run.final_dop = getattr(summary, "final_dop", None)
            run.mean_parallel_error = as_fraction(getattr(summary, "mean_parallel_error", None))
            run.summary = adapters.public_json(json_safe({**summary_dict, **_comparison_summary(comparison)}),
                                               work_dir)
            run.trials_done = Measurement.objects.filter(run_id=run_id).count()
            if run.trimmer_enabled:
                _store_trimmer_results(run, trim, getattr(summary, "stop_reason", None))
            if stop_reason:  # the caller's reason: the engine's own only says the caller finished it
                run.stop_reason = fit_to_field(TuningRun, "stop_reason", stop_reason + _late_rounds_words(summary))
            run.status, run.finished_at, run.lease = TuningRun.Status.SUCCEEDED, timezone.now(), ""
            run.requested_action = ""
            run.save()
            announce_run_end(run.pk)
    except BaseException:
        for f in saved_files:  # written to storage before the row that would name them rolled back
            f.storage.delete(f.name)
        raise


def close_task_rows(run: TuningRun) -> None:
    """No task of a stopped run stays "tuning": a paused run's go back to pending (it resumes them); a
    finished run's are done when they have a valid measurement, else untuned."""
    open_rows = TuningTask.objects.filter(run_id=run.pk, status__in=[TuningTask.Status.TUNING,
                                                                     TuningTask.Status.PENDING])
    if run.status == TuningRun.Status.PAUSED:
        open_rows.filter(status=TuningTask.Status.TUNING).update(status=TuningTask.Status.PENDING)
        return
    open_rows.filter(best_latency_s__isnull=False).update(status=TuningTask.Status.DONE)
    open_rows.filter(best_latency_s__isnull=True).update(status=TuningTask.Status.UNTUNED)


def announce_run_end(run_id: int) -> None:
    """Tell the team's webhook (if it has one) that the run ended; call it where a run becomes terminal or
    paused, inside that transaction (core.services.webhooks sends after commit, once per run). The team's
    next run waiting for a concurrent-run slot is sent after the commit."""
    run = TuningRun.objects.select_related("model").filter(pk=run_id).first()
    if run is None:
        return
    if run.status not in TuningRun.ACTIVE:  # ended or paused: its concurrent-run slot is free
        close_task_rows(run)
        dispatch_when_slot_frees(run.team_id)
    if run.status not in TuningRun.TERMINAL:
        return
    notify_terminal(team_id=run.team_id, kind="tuning_run", object_id=run.pk, state=run.status, data={
        "model": run.model.name, "trials_done": run.trials_done, "max_trials": run.max_trials,
        "tuned_latency_s": run.tuned_latency_s, "error": run.error[:500]})


def _store_onnxruntime(run: TuningRun, comparison: dict) -> None:
    """The yardstick's numbers and the verdict over the compiled timings on `run` (saved by the caller);
    absent when they could not be taken."""
    run.ort_latency_s = comparison.get("onnxruntime_latency_s")
    run.ort_latency_iqr_s = comparison.get("onnxruntime_latency_iqr_s")
    run.ratio_to_ort = comparison.get("ratio_to_onnxruntime")
    run.faster_engine = comparison.get("faster_engine") or ""
    run.ort_outputs_agree = comparison.get("onnxruntime_outputs_agree")
    outcome = comparison.get("verdict") or {}
    run.verdict = outcome.get("label") or ""
    run.verdict_flag = fit_to_field(TuningRun, "verdict_flag", outcome.get("flagged_reason") or "")
    loads = [a["load"] for a in comparison.get("timing_attempts") or [] if a.get("load") is not None]
    run.timing_load = loads[-1] if loads else None


# Verdicts under which the compiled model did reach onnxruntime: only then is the estimate's parity a claim
PARITY_CONFIRMED = (verdict_rule.FASTER, verdict_rule.WITHIN_NOISE)


def _store_time_to_parity(run: TuningRun) -> None:
    """When the best-so-far end-to-end estimate first reached onnxruntime's latency (saved by the caller),
    kept only when the compiled model's verdict confirms it reached onnxruntime (faster or within noise):
    an estimate that crossed onnxruntime while the compiled model stayed slower claims nothing.
    Computed here, from the stored curve, because onnxruntime is timed at the end of the run, in the same
    minutes as the tuned module; measuring it at the start as well would cost another yardstick run."""
    outcome = run.result_verdict
    confirmed = outcome is not None and outcome.label in PARITY_CONFIRMED
    parity = time_to_parity(run, run.ort_latency_s) if confirmed else None
    run.parity_trials = parity["trials"] if parity else None
    run.parity_wall_s = parity["wall_s"] if parity else None


def _comparison_summary(comparison: dict) -> dict:
    """What the summary keeps of the comparison: onnxruntime's measurement (timer, repeats, provider,
    version, samples) and why it is missing, if it is; why nothing was timed (a target of another host);
    the verdict, the tuned module's samples, its timer and the host load of each timing attempt; the build
    host's CPU flags (the deployment package's host check)."""
    keys = ("onnxruntime", "onnxruntime_error", "untuned_ratio_to_onnxruntime", "not_measured_here", "verdict",
            "timing_attempts", "tuned_samples_s", "tuned_timer", "build_host")
    return {k: comparison[k] for k in keys if k in comparison}


def _store_artifacts(run: TuningRun, records_zip: bytes, work_dir: Path) -> list:
    """Save the records zip and the tuned module on `run` (not yet saved); returns the files written."""
    run.records_file.save(f"run{run.pk}-records.zip", ContentFile(records_zip), save=False)
    files = [run.records_file]
    module_path = work_dir / "tuned_module.so"
    if module_path.exists():
        run.module_file.save(f"run{run.pk}-tuned.so", ContentFile(module_path.read_bytes()), save=False)
        files.append(run.module_file)
    return files


def _store_task_states(run_id: int, summary, trim: dict) -> None:
    """Tasks the engine finished are done, those Trimmer pre-empted say at which trial."""
    known = set(TuningTask.objects.filter(run_id=run_id).values_list("index", flat=True))
    preempted = {int(k): int(v) for k, v in (trim.get("preempted_tasks") or {}).items()}
    done = set()
    for t in getattr(summary, "tasks", []) or []:
        idx = t.get("index") if isinstance(t, dict) else getattr(t, "index", None)
        if idx in known and idx not in preempted:
            done.add(idx)
    if done:
        TuningTask.objects.filter(run_id=run_id, index__in=done).update(status=TuningTask.Status.DONE)
    for idx, at_trial in preempted.items():
        TuningTask.objects.filter(run_id=run_id, index=idx).update(status=TuningTask.Status.PREEMPTED,
                                                                  preempted_at_trial=at_trial)
    TuningTask.objects.filter(run_id=run_id, status=TuningTask.Status.PENDING).update(status=TuningTask.Status.DONE)
    # a task no candidate of which was measured successfully is not done, whatever the engine said
    TuningTask.objects.filter(run_id=run_id, best_latency_s__isnull=True).exclude(
        status=TuningTask.Status.PREEMPTED).update(status=TuningTask.Status.UNTUNED)


def require_a_measurement(run: TuningRun) -> None:
    """A run whose every measurement failed has tuned nothing: it fails, saying why."""
    stored = Measurement.objects.filter(run_id=run.pk)
    if not stored.exists() or stored.filter(error="", latency_s__isnull=False).exists():
        return  # nothing to tune (all candidates were already in the database), or tuned
    common = (stored.values("error").annotate(n=Count("id")).order_by("-n").first() or {}).get("error", "")
    raise NoMeasurement(f"No measurement succeeded ({stored.count()} tried); the most common error: {common}")


def _summary_field(summary, name: str):
    """A field of the engine's summary, given as a TuningSummary or as its dict (None when absent)."""
    return summary.get(name) if isinstance(summary, dict) else getattr(summary, name, None)


def _late_rounds_words(summary) -> str:
    """The tasks that had no record when the time budget ended and were given one short round past it."""
    late = _summary_field(summary, "late_first_rounds") or []
    if not late:
        return ""
    return (f" {len(late)} task(s) without a measurement by then got one short round past the budget first, so "
            f"none is compiled on TVM's default schedule.")


def _store_trimmer_results(run: TuningRun, trim: dict, stop_reason: str | None) -> None:
    """Trimmer's counts and savings on the run (saved by the caller). Savings are counted only when
    Trimmer ended the run before its budget: the trials it did not measure, priced at this run's own
    mean energy per measured trial."""
    rounds = DopRound.objects.filter(run_id=run.pk).aggregate(g=Sum("n_generated"), f=Sum("n_filtered"),
                                                              n=Sum("n_not_sent"))
    run.candidates_generated = rounds["g"] or int(trim.get("generated") or 0)
    run.candidates_filtered = rounds["f"] or int(trim.get("filtered") or 0)
    run.candidates_not_sent = rounds["n"] or int(trim.get("not_sent") or 0)
    if stop_reason:
        run.stop_reason = fit_to_field(TuningRun, "stop_reason", stop_reason)
    measured = run.trials_done
    run.trials_saved = max(0, run.max_trials - measured) if stop_reason else 0
    if "trials_saved" in trim:  # the engine's count: no saving on tasks whose search space ran out
        run.trials_saved = min(run.trials_saved, max(0, int(trim["trials_saved"] or 0)))
    if measured and run.energy_joules:
        per_trial = run.energy_joules / measured
        source = run.energy_source or "modeled"
        run.energy_saved_joules = run.trials_saved * per_trial
        run.savings_basis = fit_to_field(TuningRun, "savings_basis", (
            f"Estimated, not measured: an untrimmed run would have measured the {run.trials_saved} trials left "
            f"(of {run.max_trials}) at this run's mean "
            f"energy per measured trial ({per_trial:.1f} J = {run.energy_joules:.0f} J / {measured} trials, "
            f"{source})"))
    else:
        run.energy_saved_joules = None
        run.savings_basis = "No energy reading for this run: savings not estimated"
