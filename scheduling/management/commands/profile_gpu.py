"""Profile a model on this host's NVIDIA GPU (utilization, peak memory, power) at several batch sizes."""
from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from core.models import DLModel, Team
from core.onnx_models import zoo
from scheduling import adapters, services, telemetry
from scheduling.gpu_runtime import GpuRuntimeError, NoGpuError, run_model_on_gpu


class Command(BaseCommand):
    help = ("Run a model on this host's NVIDIA GPU at each batch size while sampling NVML, and store the "
            "measured utilization, peak memory and power as GPU profile records (source 'profile_gpu:<gpu>'). "
            "Without a GPU it says so and stores nothing.")

    def add_arguments(self, parser):
        parser.add_argument("--model", required=True,
                            help=f"A zoo model ({', '.join(zoo.list_models())}) or a registered model's name/id")
        parser.add_argument("--team", help="Team slug or name of a registered model")
        parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
        parser.add_argument("--iterations", type=int, default=100)
        parser.add_argument("--gpu-index", type=int, default=0)
        parser.add_argument("--runtime", choices=["auto", "onnxruntime", "tvm"], default="auto")
        parser.add_argument("--json", action="store_true")

    def _model(self, ref: str, team_ref: str | None):
        """(name, DLModel or None, bytes-at-batch function)."""
        qs = DLModel.objects.all()
        if team_ref:
            team = Team.objects.filter(slug=team_ref).first() or Team.objects.filter(name=team_ref).first()
            if team is None:
                raise CommandError(f"No team '{team_ref}'.")
            qs = qs.filter(team=team)
        registered = qs.filter(pk=int(ref)).first() if ref.isdigit() else qs.filter(name=ref).first()
        if registered is not None:
            with registered.file.open("rb") as f:
                data = f.read()
            return registered.name, registered, lambda bs: data
        if ref in zoo.ZOO:
            return ref, None, lambda bs: zoo.build_model(ref, batch_size=bs).SerializeToString()
        raise CommandError(f"No model '{ref}': not a zoo model ({', '.join(zoo.list_models())}) nor a registered one.")

    def handle(self, *args, **opts):
        if any(b < 1 for b in opts["batch_sizes"]):
            raise CommandError("Batch sizes must be >= 1.")
        # Before anything else: no GPU, no profiling, nothing stored.
        reading = telemetry.read_gpus()
        if not reading.available:
            raise CommandError(reading.summary)
        if opts["gpu_index"] >= len(reading.gpus):
            raise CommandError(f"no NVIDIA GPU #{opts['gpu_index']} ({reading.summary})")
        gpu = reading.gpus[opts["gpu_index"]]
        name, registered, model_bytes = self._model(opts["model"], opts["team"])
        records, rows, failures = [], [], []
        for bs in opts["batch_sizes"]:
            data = model_bytes(bs)
            try:
                res = run_model_on_gpu(data, batch_size=bs, iterations=opts["iterations"],
                                       device_index=opts["gpu_index"], runtime=opts["runtime"])
            except NoGpuError as exc:
                raise CommandError(str(exc)) from None
            except (GpuRuntimeError, Exception) as exc:  # an OOM at a large batch is a result, not a crash
                failures.append({"batch_size": bs, "error": str(exc)})
                self.stderr.write(f"  bs {bs}: failed: {exc}")
                continue
            feats = adapters.onnx_features(data, bs)
            util = min(100.0, max(0.0, res["util_mean_pct"] or 0.0))
            records.append(adapters.measured_profile_record(
                model=name, batch_size=bs, gpu_model=gpu.gpu_model, features=feats, util_pct=util,
                peak_mem_mb=max(1.0, res["mem_used_by_job_mb"] or 1.0), power_w=res["power_mean_w"],
                source=f"profile_gpu:{gpu.gpu_model}",
                meta={"workload": "inference", "runtime": res["runtime"], "gpu_name": gpu.name,
                      "latency_ms": res["latency_ms"], "iterations": res["iterations"], "energy_j": res["energy_j"],
                      "energy_source": res["energy_source"], "samples": res["samples"]}))
            rows.append({"batch_size": bs, "util_pct": util, "peak_mem_mb": records[-1].peak_mem_mb,
                         "power_w": res["power_mean_w"], "latency_ms": res["latency_ms"], "runtime": res["runtime"]})
            if not opts["json"]:
                self.stdout.write(f"  bs {bs:>4}: util {util:5.1f} %  mem {records[-1].peak_mem_mb:8.0f} MB  "
                                  f"power {res['power_mean_w'] or 0:6.1f} W  latency {res['latency_ms']:.2f} ms "
                                  f"({res['runtime']})")
        stored = services.record_profiles(records=records, dl_model=registered) if records else []
        if opts["json"]:
            self.stdout.write(json.dumps({"model": name, "gpu": gpu.to_dict(), "profiles": rows,
                                          "stored": [p.pk for p in stored], "failures": failures}))
        else:
            self.stdout.write(f"stored {len(stored)} profile record(s) for {name} on {gpu.name} ({gpu.gpu_model})")
        if failures:
            raise CommandError(f"{len(failures)} batch size(s) failed: "
                               + "; ".join(f"bs {f['batch_size']}: {f['error']}" for f in failures))
