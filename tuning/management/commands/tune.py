"""Tune a registered model (or an ONNX file) from the terminal, with a progress bar and a JSON summary."""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from tqdm import tqdm

from core.exceptions import ServiceError
from core.models import DLModel, Membership, Team
from core.onnx_models.errors import OnnxValidationError
from core.services import register_model
from tuning import services
from tuning.models import RUN_LIMITS, TuningRun, parse_dop


class Command(BaseCommand):
    help = ("Tune a model with TVM MetaSchedule. Runs in this process by default; --worker hands the run to a "
            "Celery worker and follows its progress.")

    def add_arguments(self, parser):
        parser.add_argument("model", help="Registered model: id or name (with --team), or a path to an .onnx file")
        parser.add_argument("--team", help="Team slug or name (required for a name or a file)")
        parser.add_argument("--trials", type=int, default=64,
                            help=f"Total trial budget (default 64, at most {RUN_LIMITS['max_trials'][1]})")
        parser.add_argument("--minutes", type=int, default=None,
                            help=f"Time budget: tuning finishes after this many minutes (or the trials, whichever "
                                 f"comes first; at most {RUN_LIMITS['max_minutes'][1]}) and compiles the best found")
        parser.add_argument("--trials-per-round", type=int, default=32)
        parser.add_argument("--target", default=None,
                            help='Target as JSON from the closed set of fields: \'{"kind": "llvm", "num-cores": 2}\' '
                                 '(plus "mcpu" as a registered node reports it) or \'{"kind": "cuda", "arch": "sm_90"}\'; '
                                 'any other key is refused (default: this CPU)')
        parser.add_argument("--mode", choices=TuningRun.Mode.values, default=TuningRun.Mode.DOPPLER)
        parser.add_argument("--dop", default="auto", help="'auto' or a fixed degree of parallelism")
        parser.add_argument("--threads", type=int, default=None)
        parser.add_argument("--population", type=int, default=None, help="Evolutionary search population")
        parser.add_argument("--seed", type=int, default=None)
        parser.add_argument("--worker", action="store_true", help="Run on a Celery worker instead of in-process")
        parser.add_argument("--json", action="store_true", help="Print a JSON summary at the end")
        parser.add_argument("--no-progress", action="store_true")

    def _resolve_model(self, ref: str, team_ref: str | None) -> DLModel:
        team = None
        if team_ref:
            team = Team.objects.filter(slug=team_ref).first() or Team.objects.filter(name=team_ref).first()
            if team is None:
                raise CommandError(f"No team '{team_ref}'.")
        path = Path(ref)
        if ref.endswith(".onnx") or path.exists():
            if not path.is_file():
                raise CommandError(f"No such file: {ref}")
            if team is None:
                raise CommandError("--team is required to register an ONNX file.")
            name = path.stem
            existing = DLModel.objects.filter(team=team, name=name).first()
            if existing:
                return existing
            try:
                return register_model(team=team, name=name, data=path.read_bytes(), filename=path.name,
                                      background=True)
            except OnnxValidationError as exc:
                raise CommandError(f"{path.name} refused ({exc.code}): {exc}") from exc
        qs = DLModel.objects.all() if team is None else DLModel.objects.filter(team=team)
        model = qs.filter(pk=int(ref)).first() if ref.isdigit() else qs.filter(name=ref).first()
        if model is None:
            raise CommandError(f"No model '{ref}'" + (f" in team {team}" if team else "") + ".")
        return model

    def handle(self, *args, **opt):
        model = self._resolve_model(opt["model"], opt["team"])
        owner = Membership.objects.filter(team=model.team, role=Membership.Role.OWNER).select_related("user").first()
        if owner is None:
            raise CommandError(f"Team {model.team} has no owner to run as.")
        try:
            target = json.loads(opt["target"]) if opt["target"] else None
        except json.JSONDecodeError as exc:
            raise CommandError(f"--target is not valid JSON: {exc}") from exc
        options = {k: v for k, v in (("search_population", opt["population"]), ("seed", opt["seed"])) if v}
        try:
            dop = parse_dop(opt["dop"]) or "auto"
        except ValueError as exc:
            raise CommandError(f"--{exc}") from None
        try:
            run = services.start_run(
                actor=owner.user, model=model, max_trials=opt["trials"], max_minutes=opt["minutes"], target=target,
                trials_per_round=opt["trials_per_round"], measurement_mode=opt["mode"], dop=dop,
                threads=opt["threads"], options=options, enqueue=opt["worker"],
                queue_when_busy=opt["worker"])  # run here: no waiting for a slot the queue would give
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        out = sys.stderr if opt["json"] else self.stdout
        budget = f"{run.max_trials} trials" + (f" or {run.max_minutes} min" if run.max_minutes else "")
        out.write(f"Run {run.pk}: {model.name} on {run.target}, {budget}, mode {run.measurement_mode}, "
                  f"DOP {run.dop_mode}\n")
        stop = threading.Event()
        bar = None if opt["no_progress"] else threading.Thread(target=self._progress, args=(run.pk, stop), daemon=True)
        if bar:
            bar.start()
        started = time.perf_counter()
        try:
            if opt["worker"]:
                while TuningRun.objects.get(pk=run.pk).status not in TuningRun.TERMINAL + (TuningRun.Status.PAUSED,):
                    time.sleep(1.0)
            else:
                services.execute_run(run_id=run.pk, worker="cli")
        except KeyboardInterrupt:
            services.cancel_run(actor=owner.user, run=TuningRun.objects.get(pk=run.pk))
            raise CommandError(f"Interrupted; run {run.pk} cancelled.") from None
        finally:
            stop.set()
            if bar:
                bar.join()
        run.refresh_from_db()
        summary = self._summary(run, time.perf_counter() - started)
        if opt["json"]:
            self.stdout.write(json.dumps(summary, indent=2))
        else:
            self._print(summary)
        if run.status != TuningRun.Status.SUCCEEDED:
            raise CommandError(f"Run {run.pk} ended {run.status}: {run.error}")

    def _progress(self, run_id: int, stop: threading.Event) -> None:
        run = TuningRun.objects.get(pk=run_id)
        with tqdm(total=run.max_trials, unit="trial", file=sys.stderr, dynamic_ncols=True) as bar:
            while not stop.wait(0.5):
                run = TuningRun.objects.only("trials_done", "estimated_latency_s", "status").get(pk=run_id)
                bar.n = min(run.trials_done, run.max_trials)
                est = f"{run.estimated_latency_s * 1e3:.3f} ms" if run.estimated_latency_s else "-"
                bar.set_postfix_str(f"{run.status}, est. {est}")
                bar.refresh()
        connection.close()

    @staticmethod
    def _summary(run: TuningRun, wall: float) -> dict:
        return {
            "run": run.pk, "model": run.model.name, "status": run.status, "wall_seconds": round(wall, 2),
            "tuning_wall_seconds": round(run.wall_seconds, 2), "measurements": run.trials_done,
            "max_trials": run.max_trials, "max_minutes": run.max_minutes, "stop_reason": run.stop_reason or None,
            "final_dop": run.final_dop, "mean_parallel_error": run.mean_parallel_error,
            "tuned_latency_ms": _ms(run.tuned_latency_s), "tuned_latency_iqr_ms": _ms(run.tuned_latency_iqr_s),
            "untuned_latency_ms": run.untuned_latency_s * 1e3 if run.untuned_latency_s else None,
            "speedup": run.speedup, "outputs_match": run.outputs_match,
            "resolved_target": run.resolved_target, "target_key": run.target_key,
            "onnxruntime_latency_ms": _ms(run.ort_latency_s), "onnxruntime_latency_iqr_ms": _ms(run.ort_latency_iqr_s),
            "estimated_latency_ms": _ms(run.estimated_latency_s), "estimate_gap": run.estimate_gap,
            "compiled_checkpoint": run.compiled_checkpoint,
            "checkpoint_note": run.checkpoint_note,
            "verdict": run.verdict or None, "verdict_flag": run.verdict_flag, "timing_load": run.timing_load,
            "ratio_to_onnxruntime": run.ratio_to_ort, "faster_engine": run.faster_engine or None,
            "onnxruntime_outputs_agree": run.ort_outputs_agree,
            "onnxruntime_error": (run.summary or {}).get("onnxruntime_error") or "",
            "untuned_ratio_to_onnxruntime": (run.summary or {}).get("untuned_ratio_to_onnxruntime"),
            "deploy_verdict": run.deploy_verdict, "pipeline_key": run.pipeline_key, "pipeline": run.pipeline_words,
            "evaluator": run.evaluator, "timing": run.timing_words,
            "result_identity": run.result_identity,
            "parity": {"trials": run.parity_trials, "wall_s": run.parity_wall_s} if run.parity_trials else None,
            "tasks": [{"index": t.index, "name": t.name, "trials": t.trials,
                       "best_latency_ms": t.best_latency_s * 1e3 if t.best_latency_s else None}
                      for t in run.tasks.order_by("index")],
        }

    def _print(self, s: dict) -> None:
        self.stdout.write(f"\nRun {s['run']} {s['status']} in {s['wall_seconds']} s, {s['measurements']} measurements, "
                          f"final DOP {s['final_dop']}")
        if s.get("stop_reason"):  # why tuning ended before its trial budget (the time budget, Trimmer)
            self.stdout.write(s["stop_reason"])
        if s["resolved_target"]:  # what the worker resolved the requested target to (its CPU, triple, threads)
            self.stdout.write(f"Target as built and measured: {json.dumps(s['resolved_target'], sort_keys=True)}")
        if s.get("pipeline"):
            self.stdout.write(f"Graph passes: {s['pipeline']}")
        if s.get("timing"):
            self.stdout.write(f"Candidate timing: {s['timing']}")
        for t in s["tasks"]:
            best = f"{t['best_latency_ms']:.4f} ms" if t["best_latency_ms"] else "-"
            self.stdout.write(f"  task {t['index']:>2} {t['name'][:48]:<48} {t['trials']:>5} trials  best {best}")
        if s["tuned_latency_ms"]:
            self.stdout.write(f"Latency (compiled, median of repeats): tuned {_spread(s, 'tuned_latency')} vs "
                              f"untuned {s['untuned_latency_ms']:.4f} ms ({s['speedup']:.2f}x), outputs match: "
                              f"{s['outputs_match']}")
        if s.get("estimated_latency_ms"):
            self.stdout.write(f"Estimate (sum of per-task bests, not measured end to end): "
                              f"{s['estimated_latency_ms']:.4f} ms")
        if s.get("checkpoint_note"):
            self.stdout.write(f"Compiled checkpoint: {s['checkpoint_note']}")
        if s.get("estimate_gap"):
            self.stdout.write(s["estimate_gap"]["note"])
        if s["onnxruntime_latency_ms"]:
            parity = (f"reached at trial {s['parity']['trials']:,}" if s["parity"]
                      else "not reached by the compiled model")
            if s["parity"] and s["parity"]["wall_s"] is not None:
                parity += f" ({s['parity']['wall_s']:.0f} s)"
            self.stdout.write(f"onnxruntime: {_spread(s, 'onnxruntime_latency')}, tuned/onnxruntime "
                              f"{s['ratio_to_onnxruntime']:.2f}, outputs agree: {s['onnxruntime_outputs_agree']}, "
                              f"parity of the estimate {parity}")
        if s.get("deploy_verdict"):
            self.stdout.write(s["deploy_verdict"])
        if s["onnxruntime_error"] and not s["onnxruntime_latency_ms"]:
            self.stdout.write(f"onnxruntime: not compared ({s['onnxruntime_error']})")


def _ms(seconds: float | None) -> float | None:
    return seconds * 1e3 if seconds is not None else None


def _spread(summary: dict, name: str) -> str:
    """"median ms (IQR x ms)", as the run page prints it."""
    iqr = summary.get(f"{name}_iqr_ms")
    return f"{summary[f'{name}_ms']:.4f} ms" + (f" (IQR {iqr:.4f} ms)" if iqr is not None else "")
