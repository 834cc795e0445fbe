"""Replay a cluster trace under one or every placement policy and print a comparison table.

Every run goes through ``services.simulate`` (``--save``: ``start_simulation`` + ``execute_simulation``,
which call it too): the same path the API and the dashboard use."""
from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from core.models import Team
from scheduling import adapters, services


class Command(BaseCommand):
    help = ("Trace-driven simulation of GPU placement policies (Horus and baselines). Philly: replay of a job "
            "slice on a uniform cluster of --gpus GPUs; Alibaba: the ATC'23 fill method on a --scale fraction of "
            "the trace's own cluster (or of --nodes). The scale is printed with the results.")

    def add_arguments(self, parser):
        parser.add_argument("--trace", required=True,
                            help="philly, alibaba, the id of an uploaded trace, or a local file: a Philly CSV "
                                 "(timestamp,duration,num_gpus[,gpu_time,cluster,gpu_util]; gpu_util = the job's "
                                 "true standalone utilization in %%) or an Alibaba openb pod list (.csv or .csv.gz)")
        parser.add_argument("--nodes", help="With a local Alibaba pod list: its openb node list (the cluster)")
        parser.add_argument("--policy", default="all",
                            help=f"'all' or comma-separated names: {', '.join(adapters.POLICY_NAMES)}")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--json", action="store_true", help="Print one JSON object instead of the table")
        parser.add_argument("--output", help="Also write the JSON result to this file")
        parser.add_argument("--method", choices=["replay", "fill"], default=None)
        parser.add_argument("--scale", type=float, default=None,
                            help="Alibaba: fraction of its 1,213 GPU nodes (default 0.05)")
        parser.add_argument("--gpus", type=int, default=None, help="Philly-style traces: cluster GPUs (default 64)")
        parser.add_argument("--gpus-per-node", type=int, default=None)
        parser.add_argument("--gpu-model", default=None, help="GPU model of the uniform cluster (default V100)")
        parser.add_argument("--jobs", type=int, default=None, help="Replay: jobs in the slice (default 1000)")
        parser.add_argument("--start", type=int, default=None, help="Replay: index of the first job of the slice")
        parser.add_argument("--compress", type=float, default=None, help="Divide inter-arrival times by this")
        parser.add_argument("--max-duration", type=float, default=None, help="Cap job durations (seconds)")
        parser.add_argument("--backfill", type=int, default=None, help="Queue window (1 = strict FIFO)")
        parser.add_argument("--horus-lookahead", type=int, default=None,
                            help="Waiting jobs horus/horus_migrate consider per pass (default 5, as its authors)")
        parser.add_argument("--no-gang-moves", dest="usage_fgd_gang_moves", action="store_const", const=False,
                            default=None, help="usage_fgd without gang moves (the ablation)")
        parser.add_argument("--interference", default=None,
                            help="Interference model: fitted (default), share_penalty or capped (sensitivities)")
        parser.add_argument("--predictor-error", type=float, default=None,
                            help="Extra log-normal sigma on predictions")
        parser.add_argument("--predictions", choices=["predictor", "oracle"], default=None)
        parser.add_argument("--until", type=float, default=None, help="Fill: stop at this share of capacity")
        parser.add_argument("--save", action="store_true", help="Store the run (needs --team)")
        parser.add_argument("--team", help="Team slug or name, for --save and uploaded traces")

    OPTION_PARAMETERS = {"method": "method", "scale": "scale", "gpus": "gpus", "gpus_per_node": "gpus_per_node",
                         "gpu_model": "gpu_model", "jobs": "jobs", "start": "start", "compress": "compress",
                         "max_duration": "max_duration_s", "backfill": "backfill",
                         "horus_lookahead": "horus_lookahead", "usage_fgd_gang_moves": "usage_fgd_gang_moves",
                         "interference": "interference",
                         "predictor_error": "predictor_error", "predictions": "predictions", "until": "until"}

    def _params(self, opts) -> dict:
        return {dst: opts[src] for src, dst in self.OPTION_PARAMETERS.items() if opts.get(src) is not None}

    def handle(self, *args, **opts):
        self.verbosity = opts["verbosity"]
        policies = ["all"] if opts["policy"] == "all" else [p.strip() for p in opts["policy"].split(",") if p.strip()]
        params = self._params(opts)
        team = self._team(opts["team"])
        try:
            if opts["save"]:
                result = self._run_saved(team, opts, policies, params)
            else:
                result = self._run_here(team, opts, policies, params)
        except adapters.SIMULATION_INPUT_ERRORS as exc:
            raise CommandError(str(exc)) from None
        if opts["output"]:
            Path(opts["output"]).write_text(json.dumps(result, indent=1))
        if opts["json"]:
            self.stdout.write(json.dumps(result))
            return
        self._print_table(result)

    @staticmethod
    def _team(ref: str | None) -> Team | None:
        if not ref:
            return None
        team = Team.objects.filter(slug=ref).first() or Team.objects.filter(name=ref).first()
        if team is None:
            raise CommandError(f"No team '{ref}'.")
        return team

    @staticmethod
    def _is_file(trace: str) -> bool:
        return trace not in adapters.SHIPPED_TRACES and not trace.strip().isdigit()

    def _trace_input(self, team, opts) -> adapters.TraceInput:
        trace = opts["trace"]
        if self._is_file(trace):
            return services.read_trace_file(trace, nodes=opts["nodes"])
        if opts["nodes"]:
            raise CommandError("--nodes goes with a local Alibaba pod list file.")
        label, upload, _ = services.resolve_trace(team, trace)
        return adapters.trace_input(label, upload)

    def _run_here(self, team, opts, policies, params) -> dict:
        trace = self._trace_input(team, opts)
        progress = None if self.verbosity < 2 else (lambda n: self.stderr.write(f"  {n}..."))
        result, _ = services.simulate(trace=trace, policies=policies, seed=opts["seed"], parameters=params,
                                      progress=progress)
        return result

    def _run_saved(self, team, opts, policies, params) -> dict:
        if team is None:
            raise CommandError("--save needs --team.")
        if self._is_file(opts["trace"]):
            raise CommandError("--save stores runs of shipped or uploaded traces: upload the file first "
                               "(POST /api/traces/), then pass its id.")
        run = services.start_simulation(actor=None, team=team, trace=opts["trace"], policies=policies,
                                        seed=opts["seed"], parameters=params, enqueue=False)
        run = services.execute_simulation(run_id=run.pk)
        if run.status != run.Status.SUCCEEDED:
            raise CommandError(f"simulation {run.pk} failed: {run.error}")
        return {**run.results, "saved_run": run.pk}

    def _print_table(self, result: dict) -> None:
        c = result["cluster"]
        self.stdout.write(
            f"trace {result['trace']['name']} ({result['trace']['kind']}): {result['trace']['jobs_used']} of "
            f"{result['trace']['jobs_in_trace']} jobs, method {result['method']}, seed {result['seed']}\n"
            f"cluster {c['name']}: {c['nodes']} nodes, {c['gpus']} GPUs {c['gpu_mix']}\n"
            f"true utilization: {result['assumptions']['true_utilization']}\n"
            f"predicted: {result['assumptions']['predicted_utilization']}"
            + (f" (util RMSLE {result['predictor']['util_rmsle']:.3f}, mem RMSLE "
               f"{result['predictor']['mem_rmsle']:.3f})" if result.get("predictor") else "") + "\n")
        self.stdout.write(adapters.format_results_table(result))
        if result.get("saved_run"):
            self.stdout.write(f"\nstored as simulation run {result['saved_run']}")
