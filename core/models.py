"""Teams, memberships, quotas, API tokens and the DL model registry."""
from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models


# (min, max) of each energy setting: the model, the service and the API all check these.
ENERGY_LIMITS = {
    "cpu_watts_per_core": (0.1, 1e4),
    "gpu_board_watts": (1.0, 1e5),
    "grid_intensity_g_per_kwh": (0.0, 1e5),
    "joules_per_trial_estimate": (0.001, 1e9),
}


def _energy_bounds(name: str) -> list:
    low, high = ENERGY_LIMITS[name]
    return [MinValueValidator(low), MaxValueValidator(high)]


class Team(models.Model):
    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    # Overrides the platform-wide grid intensity for carbon accounting; set by staff only.
    grid_intensity_g_per_kwh = models.FloatField(
        null=True, blank=True, validators=_energy_bounds("grid_intensity_g_per_kwh"),
        help_text="gCO2e per kWh for this team's carbon figures (staff only); empty = platform default.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner", "Owner"
        MEMBER = "member", "Member"
        VIEWER = "viewer", "Viewer"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team__name", "user__username"]
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="unique_membership")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"

    @property
    def can_write(self) -> bool:
        return self.role in (self.Role.OWNER, self.Role.MEMBER)


class TeamInvitation(models.Model):
    """An owner's invitation of a user into a team. Nobody joins a team without saying so: the
    membership is made only when the invited user accepts (the invitation is then deleted)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="invitations")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="team_invitations")
    role = models.CharField(max_length=10, choices=Membership.Role.choices, default=Membership.Role.MEMBER)
    invited_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="unique_team_invitation")]

    def __str__(self) -> str:
        return f"{self.user} invited to {self.team} ({self.role})"


class Quota(models.Model):
    """Monthly limits per team; usage is computed by core.selectors."""

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="quota")
    max_concurrent_runs = models.PositiveIntegerField(default=2)
    tuning_trials_per_month = models.PositiveIntegerField(default=20_000)
    gpu_hours_per_month = models.FloatField(default=100.0, validators=[MinValueValidator(0.0)])
    energy_kwh_per_month = models.FloatField(default=50.0, validators=[MinValueValidator(0.0)])
    max_concurrent_simulations = models.PositiveIntegerField(
        default=2, help_text="Trace simulations queued or running at once.")
    max_simulation_job_gpus = models.PositiveBigIntegerField(
        default=20_000_000, help_text="Largest simulation: jobs simulated x cluster GPUs.")
    # 15M units ~ 30 min of a simulation worker at scheduling.horus.cost.SECONDS_PER_UNIT
    max_simulation_units = models.PositiveBigIntegerField(
        default=15_000_000, help_text="Dearest simulation, in simulation units (scheduling.horus.cost: jobs x "
                                      "policies x cluster and queue-window factors; about 1.2e-4 worker seconds each).")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["team__name"]

    def __str__(self) -> str:
        return f"Quota of {self.team}"


class EnergySettings(models.Model):
    """The platform's energy model, one row edited by staff in the admin.

    Modeled energy (no RAPL or NVML on the host) is CPU-seconds x watts per core plus
    GPU-busy-seconds x board power; carbon is energy x grid intensity (a team's own
    intensity wins). Until staff save this row, the environment settings (ENERGY_*) apply.
    Runs snapshot the values they used, so an edit changes new runs, not history.
    """

    SINGLETON_PK = 1

    cpu_watts_per_core = models.FloatField(
        validators=_energy_bounds("cpu_watts_per_core"), help_text="Watts one busy CPU core draws (modeled energy).")
    gpu_board_watts = models.FloatField(
        validators=_energy_bounds("gpu_board_watts"), help_text="Watts a busy GPU board draws (modeled energy).")
    grid_intensity_g_per_kwh = models.FloatField(
        validators=_energy_bounds("grid_intensity_g_per_kwh"),
        help_text="gCO2e per kWh for carbon figures of teams without their own intensity.")
    joules_per_trial_estimate = models.FloatField(
        validators=_energy_bounds("joules_per_trial_estimate"),
        help_text="Energy of one tuning trial for the energy-quota check, until a team has finished runs.")
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+", editable=False)

    class Meta:
        verbose_name = verbose_name_plural = "energy settings"
        constraints = [models.CheckConstraint(condition=models.Q(pk=1), name="energy_settings_singleton")]

    def __str__(self) -> str:
        return "Energy settings"

    def save(self, *args, **kwargs):
        self.pk = self.SINGLETON_PK
        super().save(*args, **kwargs)


class ApiToken(models.Model):
    """A named, revocable API key. Only its SHA-256 is stored; the key is shown once."""

    PREFIX_LEN = 8

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=PREFIX_LEN, db_index=True, editable=False)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}...)"

    @staticmethod
    def hash_key(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    @staticmethod
    def generate_key() -> str:
        # never a leading "-": command lines (`dlopt login --token KEY`, curl, shells) read it as an option
        while (key := secrets.token_urlsafe(32)).startswith("-"):
            pass
        return key

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


def model_upload_path(instance: DLModel, filename: str) -> str:
    return f"models/{instance.team_id}/{instance.sha256[:16]}.onnx"


class DLModel(models.Model):
    """An uploaded (or zoo-generated) ONNX model with its validated graph features."""

    class Source(models.TextChoices):
        UPLOAD = "upload", "Upload"
        ZOO = "zoo", "Model zoo"

    class State(models.TextChoices):
        VALIDATING = "validating", "Validating"  # a large upload, checked by the core.validate_model task
        READY = "ready", "Ready"
        INVALID = "invalid", "Invalid"  # refused after upload: error_code/error_message say why; no file kept

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="models")
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.UPLOAD)
    state = models.CharField(max_length=10, choices=State.choices, default=State.READY, db_index=True)
    error_code = models.CharField(max_length=40, blank=True)
    error_message = models.TextField(blank=True)
    file = models.FileField(upload_to=model_upload_path, max_length=255, blank=True)
    file_size = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    opset = models.PositiveIntegerField()
    ir_version = models.PositiveIntegerField()
    producer = models.CharField(max_length=200, blank=True)
    inputs = models.JSONField(help_text="[{name, shape, dtype}]")
    outputs = models.JSONField(default=list)
    batch_size = models.PositiveIntegerField()
    # Graph features (Horus's predictor inputs); the full set is in `features`.
    total_flops = models.BigIntegerField()
    param_count = models.BigIntegerField()
    activation_bytes = models.BigIntegerField()
    conv_count = models.PositiveIntegerField()
    linear_count = models.PositiveIntegerField()
    activation_count = models.PositiveIntegerField()
    other_count = models.PositiveIntegerField()
    op_histogram = models.JSONField(default=dict)
    features = models.JSONField(default=dict)
    num_tuning_tasks = models.PositiveIntegerField(null=True, blank=True)
    tuning_task_names = models.JSONField(default=list, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # Archived (the API's DELETE): hidden from lists, restorable; its runs, jobs and usage are kept.
    archived_at = models.DateTimeField(null=True, blank=True, db_index=True)

    class Meta:
        ordering = ["team__name", "name"]
        verbose_name = "DL model"
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="unique_model_name_per_team")]
        indexes = [models.Index(fields=["team", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.name} ({self.team})"

    @property
    def gflops(self) -> float:
        return self.total_flops / 1e9


class TeamWebhook(models.Model):
    """Where a team is told that one of its tuning runs or GPU jobs ended (set by its owners).

    The body is signed with HMAC-SHA256 under ``secret`` (core.services.webhooks): the key is shown to
    the owner once, when it is made or rotated, and kept here because every delivery must sign with it.
    """

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="webhook")
    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=64, editable=False)
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    updated_at = models.DateTimeField(auto_now=True)
    secret_rotated_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"Webhook of {self.team}"

    @staticmethod
    def generate_secret() -> str:
        return secrets.token_hex(32)


class WebhookDelivery(models.Model):
    """One event for a team's webhook and what became of sending it (attempts, last answer)."""

    class State(models.TextChoices):
        PENDING = "pending", "Pending"        # queued, or waiting for its next retry
        DELIVERED = "delivered", "Delivered"  # the receiver answered 2xx
        FAILED = "failed", "Failed"           # given up: refused (4xx) or out of attempts

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="webhook_deliveries")
    event = models.CharField(max_length=40, help_text="e.g. tuning_run.succeeded, gpu_job.failed")
    # one delivery per object reaching a terminal state: a transition announced twice is sent once
    event_key = models.CharField(max_length=80, unique=True)
    payload = models.JSONField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        indexes = [models.Index(fields=["team", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.event} for {self.team} ({self.state})"


class UsageLedgerError(Exception):
    """A write the usage ledger refuses: its rows are only ever inserted."""


class UsageChargeQuerySet(models.QuerySet):
    """Bulk writes are refused too; Django's own SET_NULL on a deleted referent goes through the base
    manager (a plain queryset), so a deleted model or run leaves its charges behind, unlinked."""

    def update(self, **kwargs):
        raise UsageLedgerError("Usage charges are append-only: they cannot be updated.")

    def delete(self):
        raise UsageLedgerError("Usage charges are append-only: they cannot be deleted.")


class UsageCharge(models.Model):
    """One entry of a team's append-only usage ledger: what a piece of work cost when it was done.

    Quota usage and the usage, energy and carbon pages sum these rows, so deleting or archiving the
    model, run, job or simulation that incurred a cost never lowers what the team spent. Rows are
    written only by ``core.services.charge_usage`` (insert, never update nor delete); the references
    to what incurred a charge become empty when it is deleted, and ``label`` keeps it readable.
    """

    class Kind(models.TextChoices):
        TRIALS = "trials", "Tuning trials"
        GPU_SECONDS = "gpu_seconds", "GPU-seconds"
        ENERGY_JOULES = "energy_joules", "Energy (J)"
        SIMULATION_UNITS = "simulation_units", "Simulation units"

    class EnergySource(models.TextChoices):
        NONE = "", "Not energy"
        MEASURED = "measured", "Measured"
        MODELED = "modeled", "Modeled"

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="usage_charges")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    amount = models.FloatField(help_text="In the kind's unit: trials, GPU-seconds, joules, simulated policies.")
    source = models.CharField(max_length=10, choices=EnergySource.choices, blank=True,
                              help_text="For energy: measured (RAPL/NVML) or modeled.")
    meter = models.CharField(max_length=40, blank=True, help_text='For energy: e.g. "rapl", "rapl+nvml", "modeled".')
    grid_intensity_g_per_kwh = models.FloatField(
        null=True, blank=True, help_text="For energy: gCO2e per kWh in force when it was charged (carbon history).")
    # Unique per incurring event: a retried task charging the same event again inserts nothing.
    idempotency_key = models.CharField(max_length=200, unique=True)
    label = models.CharField(max_length=300, help_text="What incurred it, in words (kept after it is deleted).")
    model = models.ForeignKey(DLModel, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    run = models.ForeignKey("tuning.TuningRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    job = models.ForeignKey("scheduling.GpuJob", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    simulation = models.ForeignKey("scheduling.SimulationRun", null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    objects = UsageChargeQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-pk"]
        indexes = [models.Index(fields=["team", "kind", "created_at"])]
        constraints = [models.CheckConstraint(condition=models.Q(amount__gte=0), name="usage_charge_amount_nonneg")]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.amount:g} for {self.team} ({self.label})"

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise UsageLedgerError("Usage charges are append-only: they cannot be updated.")
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise UsageLedgerError("Usage charges are append-only: they cannot be deleted.")
