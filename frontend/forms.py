"""Dashboard forms. They only validate input; views hand the cleaned data to services."""
from __future__ import annotations

from django import forms
from django.conf import settings

from core.models import DLModel, Team
from tuning.models import RUN_LIMITS, TuningRun, min_trials_for, parse_dop, suggested_trials_for


def refuse_unread(form: forms.Form, message: str) -> None:
    """Show ``message`` on a form left unbound because the request body must not be read (an upload over
    its size or rate limit)."""
    form.cleaned_data = {}  # add_error expects a cleaned form; an unbound one has no cleaned_data
    form.add_error(None, message)


def bounded_integer(name: str, **kwargs) -> forms.IntegerField:
    """An integer field within RUN_LIMITS[name] (the service checks the same table)."""
    low, high = RUN_LIMITS[name]
    return forms.IntegerField(min_value=low, max_value=high, **kwargs)


class ModelUploadForm(forms.Form):
    team = forms.ModelChoiceField(queryset=Team.objects.none(), empty_label=None)
    name = forms.CharField(max_length=100, help_text="Unique within the team.")
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)
    file = forms.FileField(label="ONNX file", widget=forms.ClearableFileInput(attrs={"accept": ".onnx"}),
                           help_text="Static input shapes, weights inside the file (no external data).")

    def __init__(self, *args, teams=(), initial_team: Team | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["team"].queryset = Team.objects.filter(pk__in=[t.pk for t in teams]).order_by("name")
        if initial_team is not None:
            self.fields["team"].initial = initial_team.pk


class StartRunForm(forms.Form):
    TARGET_CHOICES = [("llvm", "CPU (llvm)"), ("cuda", "NVIDIA GPU (cuda)")]
    DOP_CHOICES = [("auto", "automatic (DOPpler picks it from the measured error)"), ("fixed", "fixed")]

    model = forms.ModelChoiceField(queryset=DLModel.objects.none(), empty_label=None)
    target_kind = forms.ChoiceField(label="Target", choices=TARGET_CHOICES, initial="llvm")
    num_cores = bounded_integer("num_cores", label="CPU cores", required=False,
                                help_text="For llvm targets: the cores TVM schedules for.")
    max_trials = bounded_integer("max_trials", label="Trials (measurements)", initial=64)
    max_minutes = bounded_integer("max_minutes", label="Time budget (minutes)", required=False,
                                  help_text="Optional: tuning finishes when this much time is spent, or the trials "
                                            "are, whichever comes first; the best schedules found are compiled.")
    trials_per_round = bounded_integer("trials_per_round", label="Trials per round", initial=32)
    measurement_mode = forms.ChoiceField(label="Measurement mode", choices=TuningRun.Mode.choices,
                                         initial=TuningRun.Mode.DOPPLER)
    dop_mode = forms.ChoiceField(label="Degree of parallelism", choices=DOP_CHOICES, initial="auto",
                                 widget=forms.RadioSelect)
    dop_fixed = bounded_integer("dop", label="Fixed DOP", required=False)
    threads = bounded_integer("threads", label="Threads per measurement", required=False,
                              help_text="Empty = the target's cores.")
    search_population = bounded_integer("search_population", required=False,
                                        help_text="Evolutionary search population (smaller = faster).")
    seed = bounded_integer("seed", required=False)

    # ---- Trimmer (tuning.engine.trimmer.rules.TrimmerConfig) -------------------------------------
    trimmer_enabled = forms.BooleanField(label="Enable Trimmer", required=False, help_text=(
        "Stop tuning operators that stopped improving, stop the whole run on a plateau, and drop "
        "candidates the cost model predicts to be poor before they are built and measured."))
    plateau_rounds = forms.IntegerField(label="Plateau rounds", min_value=1, max_value=50, initial=2,
                                        required=False, help_text="Rounds without improvement before an "
                                        "operator is pre-empted (authors' default 2).")
    min_improvement = forms.FloatField(label="Min. improvement", min_value=0.0, max_value=0.5, initial=0.01,
                                       required=False, help_text="Relative gain that counts as progress.")
    model_patience = forms.IntegerField(label="Model-stop patience", min_value=1, max_value=50, initial=3,
                                        required=False, help_text="Non-improving windows before the run stops.")
    target_latency_ms = forms.FloatField(label="Target latency (ms)", min_value=0.0001, required=False,
                                         help_text="Stop once the estimated end-to-end latency reaches it.")
    filter_enabled = forms.BooleanField(label="ML candidate filter", required=False, initial=True)
    filter_oversample = forms.IntegerField(label="Filter oversampling", min_value=1, max_value=16, initial=4,
                                           required=False, help_text="Candidates scored per measured slot.")

    TRIMMER_FIELDS: tuple[str, ...] = ("trimmer_enabled", "plateau_rounds", "min_improvement", "model_patience",
                                       "target_latency_ms", "filter_enabled", "filter_oversample")

    def trimmer_bound_fields(self):
        return [self[name] for name in self.TRIMMER_FIELDS]

    def trimmer(self) -> tuple[bool, dict | None]:
        """(enabled, TrimmerConfig options) for start_run."""
        data = self.cleaned_data
        if not data.get("trimmer_enabled"):
            return False, None
        options = {key: data[key] for key in ("plateau_rounds", "min_improvement", "model_patience",
                                              "filter_oversample") if data.get(key) is not None}
        options["filter_enabled"] = bool(data.get("filter_enabled"))
        if data.get("target_latency_ms"):
            options["target_latency_s"] = data["target_latency_ms"] / 1e3
        return True, options
    # ------------------------------------------------------------------------------------------

    def __init__(self, *args, models=None, gpu_available: bool = True, node_cores: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.gpu_available, self.node_cores = gpu_available, node_cores
        if not gpu_available:
            # a cuda run on a cluster without a GPU fails on its worker (and still uses energy): not offered
            self.fields["target_kind"].choices = [c for c in self.TARGET_CHOICES if c[0] != "cuda"]
            self.fields["target_kind"].help_text = "No GPU node is registered and live: CPU targets only."
        self.fields["model"].queryset = models if models is not None else DLModel.objects.none()
        self.fields["model"].label_from_instance = lambda m: f"{m.name} ({m.team.name})"
        self.fields["num_cores"].initial = settings.DEFAULT_TUNING_TARGET.get("num-cores")
        self._suggest_budget()

    def _suggest_budget(self) -> None:
        """The chosen model's task count sets the suggested budget and states the minimum."""
        model = self.fields["model"].queryset.filter(pk=self.initial.get("model")).first() \
            if self.initial.get("model") else None
        if model is None or not model.num_tuning_tasks:
            return
        n = model.num_tuning_tasks
        self.initial["max_trials"] = suggested_trials_for(n)
        self.fields["max_trials"].help_text = (f"{model.name} has {n} tuning tasks: at least {min_trials_for(n)} "
                                               f"trials; {suggested_trials_for(n)} suggested.")

    def clean(self):
        data = super().clean()
        # options the page hides are not used, so a bad value left in one must not block the run
        hidden = [] if data.get("trimmer_enabled") else [n for n in self.TRIMMER_FIELDS if n != "trimmer_enabled"]
        if data.get("dop_mode") != "fixed":
            hidden.append("dop_fixed")
        for name in hidden:
            if self._errors.pop(name, None) is not None:
                data[name] = None
        if data.get("dop_mode") == "fixed" and not data.get("dop_fixed"):
            self.add_error("dop_fixed", "Give the fixed degree of parallelism, or choose automatic.")
        return data

    # ---- what the page shows or hides (the same rules drive dashboard.js on change) ----------------
    def value(self, name: str):
        """The field's current value: the submitted one on a bound form, else the initial one."""
        return self[name].value()

    def shows_trimmer_options(self) -> bool:
        return bool(self.value("trimmer_enabled"))

    def shows_fixed_dop(self) -> bool:
        return self.value("dop_mode") == "fixed"

    def effective_threads(self) -> int | None:
        """Threads one measurement takes: threads per measurement, else the target's cores, else every
        core of the node (the engine's default); None when neither is given and no node reported its cores."""
        for name in ("threads", "num_cores"):
            value = self.value(name)
            if value not in (None, "") and str(value).isdigit() and int(value) > 0:
                return int(value)
        return self.node_cores or None

    def dop_stays_one(self) -> bool:
        """True when one measurement takes every core, so no two can run at once (DOP stays 1): the
        engine plans node cores // threads measurement slots."""
        if self.value("target_kind") == "cuda":
            return False
        threads = self.effective_threads()
        if threads is None:
            return True
        return bool(self.node_cores) and threads * 2 > self.node_cores

    def dop_note(self) -> str:
        threads = self.effective_threads()
        if self.node_cores and threads:
            return (f"Each measurement takes {threads} of the node's {self.node_cores} cores, so no two run at "
                    f"once: DOP stays 1 whatever is chosen here. Set fewer threads per measurement (at most "
                    f"{max(1, self.node_cores // 2)}) to measure in parallel.")
        return ("Each measurement takes every core (no thread count given), so no two run at once: DOP stays 1 "
                "whatever is chosen here. Set threads per measurement to measure in parallel.")

    def target(self) -> dict:
        kind = self.cleaned_data["target_kind"]
        target = {"kind": kind}
        if kind == "llvm" and self.cleaned_data.get("num_cores"):
            target["num-cores"] = self.cleaned_data["num_cores"]
        return target

    def dop(self) -> str | int:
        """'auto' or the fixed DOP, read by `parse_dop` like every other entry point (the field's bounds
        are the same RUN_LIMITS entry)."""
        fixed = self.cleaned_data["dop_fixed"] if self.cleaned_data["dop_mode"] == "fixed" else None
        return parse_dop(fixed) or "auto"

    def options(self) -> dict:
        return {k: self.cleaned_data[k] for k in ("search_population", "seed") if self.cleaned_data.get(k) is not None}


MAX_DB_ID = 2**63 - 1  # ids beyond a 64-bit integer cannot exist (and SQLite refuses to bind them)


def parse_id_list(values: list[str]) -> list[int]:
    """`?runs=3&runs=5` or `?runs=3,5` -> [3, 5] (order kept, duplicates dropped); ValueError on junk."""
    ids: list[int] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            if not part.isdigit() or int(part) > MAX_DB_ID:
                raise ValueError(f"'{part}' is not a run id")
            if int(part) not in ids:
                ids.append(int(part))
    return ids
