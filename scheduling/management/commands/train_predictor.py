"""Train the Horus utilization/memory predictor on the stored profiles and activate it; ``--eval``
evaluates it instead (leave one model family out, beside a constant and an analytic FLOPs baseline)."""
from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from core.exceptions import ServiceError
from scheduling import services
from scheduling.models import GpuProfile


class Command(BaseCommand):
    help = ("Train a predictor version (XGBoost, grouped k-fold: a model is never in its own test fold) on every "
            "stored GPU profile; the shipped seed set is loaded first when there is none.")

    def add_arguments(self, parser):
        parser.add_argument("--k-folds", type=int, default=5)
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--no-activate", action="store_true", help="Store it without making it active")
        parser.add_argument("--json", action="store_true")
        parser.add_argument("--eval", action="store_true",
                            help="Evaluate only (stores nothing): leave-one-model-family-out MAE, Spearman and the "
                                 "share of co-locations called safe that truly exceed 100 %%, beside baselines")

    def handle(self, *args, **opts):
        if opts["eval"]:
            return self._evaluate(opts)
        try:
            pv = services.train_predictor(actor=None, k_folds=opts["k_folds"], seed=opts["seed"],
                                          activate=not opts["no_activate"])
        except ServiceError as exc:
            raise CommandError(str(exc)) from None
        m = pv.metrics
        summary = {"version": pv.version, "active": pv.active, "n_records": pv.n_records, "sources": pv.sources,
                   "util_rmsle": m["util"]["rmsle"], "util_mae_pct": m["util"]["mae_pct"],
                   "mem_rmsle": m["mem"]["rmsle"], "mem_mae_mb": m["mem"]["mae_mb"], "k_folds": m["k_folds"],
                   "grouped_by": m["grouped_by"], "file": pv.file.name}
        if opts["json"]:
            self.stdout.write(json.dumps(summary))
            return
        synthetic = all(s.startswith(GpuProfile.SYNTHETIC_PREFIX) for s in pv.sources)
        self.stdout.write(
            f"predictor v{pv.version}{' (active)' if pv.active else ''}: {pv.n_records} records from "
            f"{', '.join(pv.sources)}{' - SYNTHETIC, no GPU measured them' if synthetic else ''}\n"
            f"  {m['k_folds']}-fold by {m['grouped_by']}: utilization RMSLE {m['util']['rmsle']:.3f} "
            f"(MAE {m['util']['mae_pct']:.1f} pts), memory RMSLE {m['mem']['rmsle']:.3f} "
            f"(MAE {m['mem']['mae_mb']:.0f} MB)")

    def _evaluate(self, opts):
        try:
            ev = services.evaluate_predictor(seed=opts["seed"])
        except ServiceError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(json.dumps(ev) if opts["json"] else services.format_predictor_evaluation(ev))
