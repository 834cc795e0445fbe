"""Forms of the GPU-job and simulation pages. Bounds come from the scheduling app (GPU_JOB_LIMITS, the
services' checks), so the page refuses exactly what the API refuses."""
from __future__ import annotations

from django import forms

from core.models import DLModel, Team
from scheduling.adapters import POLICY_NAMES, SHIPPED_TRACES
from scheduling.models import GPU_JOB_LIMITS, GpuJob


def _limit(name: str, index: int):
    return GPU_JOB_LIMITS[name][index]


class GpuJobForm(forms.Form):
    model = forms.ModelChoiceField(queryset=DLModel.objects.none(), empty_label=None)
    batch_size = forms.IntegerField(min_value=_limit("batch_size", 0), max_value=_limit("batch_size", 1), initial=32)
    iterations = forms.IntegerField(min_value=_limit("iterations", 0), max_value=_limit("iterations", 1),
                                    initial=100, help_text="Forward passes (inference) or training steps (train).")
    duration_estimate_s = forms.FloatField(
        label="Duration (s)", min_value=_limit("duration_estimate_s", 0), required=False,
        help_text="GPU time reserved against the monthly GPU-hour quota; the job is stopped at it. "
                  "Empty = the platform default.")
    runtime = forms.ChoiceField(choices=GpuJob.Runtime.choices, initial=GpuJob.Runtime.AUTO)
    # not required: a form posted without them (older pages, scripts) submits a one-GPU inference job
    kind = forms.ChoiceField(choices=GpuJob.Kind.choices, initial=GpuJob.Kind.INFERENCE, required=False,
                             help_text="A training job runs on TVM: forward, backward and optimizer update on a "
                                       "fixed synthetic batch.")
    optimizer = forms.ChoiceField(choices=GpuJob.Optimizer.choices, initial=GpuJob.Optimizer.ADAM, required=False,
                                  help_text="Used by training jobs.")
    learning_rate = forms.FloatField(min_value=_limit("learning_rate", 0), max_value=_limit("learning_rate", 1),
                                     required=False, help_text="Training jobs; empty = the optimizer's default.")
    num_gpus = forms.IntegerField(label="GPUs", min_value=_limit("num_gpus", 0), max_value=_limit("num_gpus", 1),
                                  initial=1, required=False, help_text="More than one: a gang of one node, placed as one unit and "
                                                       "charged per GPU.")

    def __init__(self, *args, models=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["model"].queryset = models if models is not None else DLModel.objects.none()
        self.fields["model"].label_from_instance = lambda m: f"{m.name} ({m.team.name})"


TRACE_CHOICES = [(t, f"{t} (bundled)") for t in SHIPPED_TRACES]
METHOD_CHOICES = [("", "default for the trace (replay for Philly, fill for Alibaba)"), ("replay", "replay"),
                  ("fill", "fill (ATC'23)")]


class SimulationForm(forms.Form):
    team = forms.ModelChoiceField(queryset=None, empty_label=None)
    trace = forms.ChoiceField(help_text="A bundled trace or one your team uploaded (upload below).")
    method = forms.ChoiceField(choices=METHOD_CHOICES, required=False)
    policies = forms.MultipleChoiceField(choices=[(p, p) for p in POLICY_NAMES], widget=forms.CheckboxSelectMultiple,
                                         required=False, help_text="None ticked = every policy.")
    seeds = forms.CharField(initial="0", max_length=60,
                            help_text="One seed, or several separated by commas (one simulation each, at most 5).")
    jobs = forms.IntegerField(required=False, min_value=1, help_text="Replay: jobs in the slice (default 1000).")
    gpus = forms.IntegerField(label="Cluster GPUs", required=False, min_value=1,
                              help_text="Philly-style traces: GPUs in the cluster (default 64).")
    scale = forms.FloatField(required=False, min_value=0.0, help_text="Alibaba fill: fraction of its GPU nodes.")
    predictor_error = forms.FloatField(required=False, min_value=0.0, max_value=5.0,
                                       help_text="Extra log-normal sigma on the predictions (0 = none).")
    backfill = forms.IntegerField(required=False, min_value=1,
                                  help_text="Replay: waiting jobs each scheduling pass offers (default 1: strict FIFO). "
                                            "A wider window costs more.")
    horus_lookahead = forms.IntegerField(required=False, min_value=1,
                                         help_text="Replay: waiting jobs horus / horus_migrate consider (default 5).")

    MAX_SEEDS = 5
    #: the view's cost estimate of the request (``services.estimate_simulation``), when asked for
    estimate: dict | None = None

    def __init__(self, *args, teams=(), traces=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["team"].queryset = Team.objects.filter(pk__in=[t.pk for t in teams]).order_by("name")
        self.fields["trace"].choices = TRACE_CHOICES + [(str(t.pk), f"{t.name} (uploaded, {t.team.name}, "
                                                         f"{t.n_jobs:,} rows)") for t in traces]

    def clean_seeds(self) -> list[int]:
        parts = [p.strip() for p in self.cleaned_data["seeds"].split(",") if p.strip()]
        if not parts or not all(p.isdigit() and int(p) < 2**31 for p in parts):
            raise forms.ValidationError("Seeds are integers from 0 to 2147483647, separated by commas.")
        seeds = list(dict.fromkeys(int(p) for p in parts))
        if len(seeds) > self.MAX_SEEDS:
            raise forms.ValidationError(f"At most {self.MAX_SEEDS} seeds at once.")
        return seeds

    def parameters(self) -> dict:
        """The API's `parameters` dict: only what was given (the service fills in its defaults)."""
        data = self.cleaned_data
        return {k: data[k] for k in ("method", "jobs", "gpus", "scale", "predictor_error", "backfill", "horus_lookahead")
                if data.get(k) not in (None, "")}


class TraceUploadForm(forms.Form):
    team = forms.ModelChoiceField(queryset=None, empty_label=None)
    name = forms.CharField(max_length=100, required=False, help_text="Default: the file's name.")
    file = forms.FileField(help_text="CSV (or .csv.gz): Philly jobs (timestamp,duration,num_gpus[,gpu_util]) or "
                                     "an Alibaba pod list (name,cpu_milli,memory_mib,num_gpu,gpu_milli,...).")

    def __init__(self, *args, teams=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["team"].queryset = Team.objects.filter(pk__in=[t.pk for t in teams]).order_by("name")
