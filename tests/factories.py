"""factory-boy factories: one per model the tests use, each making a consistent row in one call.

Use a factory when the test is not about the service that makes the row (tests of upload,
validation, start-run rules, registration... keep calling the service). Related rows are made on
demand: ``TuningRunFactory()`` makes its model, whose team gets a quota, as ``create_team`` does.

The ONNX file of ``DLModelFactory`` is the zoo's ``small_cnn``, built and validated once per test
process (``zoo_model``); every model row after that stores it without parsing it again.
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import factory
from django.conf import settings
from django.contrib.auth.hashers import make_password
from django.core.files.base import ContentFile
from django.db.models import Max
from django.utils import timezone
from django.utils.text import slugify
from factory.django import DjangoModelFactory

from core import services as core_services
from core.models import ApiToken, DLModel, EnergySettings, Membership, Quota, Team, TeamInvitation
from recordcache.models import CacheEntry, TeamCacheSettings
from scheduling.models import (GPU, GpuJob, GpuProfile, GpuTelemetry, Node, Placement, PredictorVersion, SimulationRun,
                               TraceUpload, gpu_queue_name)
from tuning.engine.records import cache_key
from tuning.models import DopRound, Measurement, TuningRun, TuningTask

from .helpers import PHILLY_CSV

# --- core ------------------------------------------------------------------------------------------


class UserFactory(DjangoModelFactory):
    """A user whose password is ``pw-<username>`` (what the login tests type)."""

    class Meta:
        model = settings.AUTH_USER_MODEL

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.LazyAttribute(lambda u: make_password("pw-" + u.username))


class QuotaFactory(DjangoModelFactory):
    class Meta:
        model = Quota

    team = factory.SubFactory("tests.factories.TeamFactory", quota=None)


class TeamFactory(DjangoModelFactory):
    """A team with its default quota (as ``core.services.create_team`` makes it); ``owner=user`` adds
    the user as its owner."""

    class Meta:
        model = Team
        skip_postgeneration_save = True

    name = factory.Sequence(lambda n: f"Team {n}")
    slug = factory.LazyAttribute(lambda t: slugify(t.name)[:100])
    quota = factory.RelatedFactory(QuotaFactory, factory_related_name="team")

    @factory.post_generation
    def owner(team, create, extracted, **kwargs):
        if extracted is not None:
            MembershipFactory(team=team, user=extracted, role=Membership.Role.OWNER)


class MembershipFactory(DjangoModelFactory):
    class Meta:
        model = Membership

    team = factory.SubFactory(TeamFactory)
    user = factory.SubFactory(UserFactory)
    role = Membership.Role.MEMBER


class TeamInvitationFactory(DjangoModelFactory):
    class Meta:
        model = TeamInvitation

    team = factory.SubFactory(TeamFactory)
    user = factory.SubFactory(UserFactory)
    role = Membership.Role.MEMBER
    invited_by = None


class EnergySettingsFactory(DjangoModelFactory):
    """The admin's energy settings row (a singleton: pk 1)."""

    class Meta:
        model = EnergySettings
        django_get_or_create = ("id",)

    id = EnergySettings.SINGLETON_PK
    cpu_watts_per_core = 10.0
    gpu_board_watts = 250.0
    grid_intensity_g_per_kwh = 400.0
    joules_per_trial_estimate = 5.0


class ApiTokenFactory(DjangoModelFactory):
    """A token with a fresh key; the plain key is on the returned row as ``token.key`` (shown once in
    the product, kept here so the test can send it)."""

    class Meta:
        model = ApiToken

    user = factory.SubFactory(UserFactory)
    name = "test"
    key = factory.LazyFunction(ApiToken.generate_key)
    prefix = factory.LazyAttribute(lambda t: t.key[:ApiToken.PREFIX_LEN])
    key_hash = factory.LazyAttribute(lambda t: ApiToken.hash_key(t.key))

    @classmethod
    def _create(cls, model_class, *args, key: str, **kwargs):
        token = super()._create(model_class, *args, **kwargs)
        token.key = key
        return token


@dataclass(frozen=True)
class ZooModel:
    data: bytes
    validated: object  # core.onnx_models.validate.ValidatedModel


@functools.cache
def zoo_model(name: str = "small_cnn") -> ZooModel:
    """A zoo model's ONNX bytes and what the registry's validation found in them: built and validated
    once per test process, with the platform's limits (tuning tasks are not counted in tests)."""
    from django.test.utils import override_settings

    from core.onnx_models import zoo

    data = zoo.build_model(name).SerializeToString()
    # cached for the process: whatever the first caller's settings, never counted (a test that switched
    # counting on would otherwise hand every later factory model its task count and budget minimum)
    with override_settings(ONNX_COUNT_TUNING_TASKS=False):
        return ZooModel(data, core_services.validate_model_bytes(data=data, filename=f"{name}.onnx"))


class DLModelFactory(DjangoModelFactory):
    """A ready model of a team, its file stored in MEDIA_ROOT and its features those of the zoo model
    ``zoo`` (default small_cnn). The row is written by ``core.services.register_model`` handed the
    cached validation, so every field is filled exactly as an upload fills it, without re-validating.
    Extra field values (``state=...``) are applied after."""

    class Meta:
        model = DLModel

    zoo = "small_cnn"  # not a field: which zoo model's file and features the row gets
    team = factory.SubFactory(TeamFactory)
    name = factory.Sequence(lambda n: f"cnn-{n}")
    description = ""
    source = DLModel.Source.UPLOAD
    created_by = None

    @classmethod
    def _create(cls, model_class, *, team, name, zoo, created_by, **fields):
        cached = zoo_model(zoo)
        model = core_services.register_model(team=team, name=name, data=cached.data, filename=f"{zoo}.onnx",
                                             validated=cached.validated, source=fields.pop("source"),
                                             description=fields.pop("description"))
        if created_by is not None or fields:
            for field_name, value in dict(fields, created_by=created_by).items():
                setattr(model, field_name, value)
            model.save()
        return model


# --- tuning ----------------------------------------------------------------------------------------


def _platform_energy():
    from core.selectors import energy_model

    return energy_model()


class TuningRunFactory(DjangoModelFactory):
    """A queued run of a model on the default target (as ``start_run(..., enqueue=False)`` leaves it);
    traits ``running``, ``paused`` and ``succeeded`` move it along."""

    class Meta:
        model = TuningRun

    class Params:
        running = factory.Trait(status=TuningRun.Status.RUNNING, started_at=factory.LazyFunction(timezone.now),
                                heartbeat_at=factory.LazyFunction(timezone.now), lease="test-lease", attempts=1)
        paused = factory.Trait(status=TuningRun.Status.PAUSED)
        succeeded = factory.Trait(status=TuningRun.Status.SUCCEEDED, started_at=factory.LazyFunction(timezone.now),
                                  finished_at=factory.LazyFunction(timezone.now))

    model = factory.SubFactory(DLModelFactory)
    team = factory.LazyAttribute(lambda r: r.model.team)
    created_by = None
    target = factory.LazyFunction(lambda: dict(settings.DEFAULT_TUNING_TARGET))
    target_kind = factory.LazyAttribute(lambda r: r.target["kind"])
    max_trials = 64
    trials_per_round = 16
    # What start_run snapshots: the team's grid intensity (else the platform's) and the watts model.
    grid_intensity_g_per_kwh = factory.LazyAttribute(
        lambda r: r.team.grid_intensity_g_per_kwh if r.team.grid_intensity_g_per_kwh is not None
        else _platform_energy().grid_intensity_g_per_kwh)
    energy_model = factory.LazyFunction(lambda: {name: getattr(_platform_energy(), name)
                                                 for name in ("cpu_watts_per_core", "gpu_board_watts")})


class TuningTaskFactory(DjangoModelFactory):
    class Meta:
        model = TuningTask

    run = factory.SubFactory(TuningRunFactory)
    index = factory.LazyAttribute(lambda t: t.run.tasks.count())
    name = factory.LazyAttribute(lambda t: f"fused_conv2d_add_relu_{t.index}")
    flops = 2.0e8
    weight = 1.0


class MeasurementFactory(DjangoModelFactory):
    """One measured candidate of a task (3 latency samples around ``latency_s``)."""

    class Meta:
        model = Measurement

    task = factory.SubFactory(TuningTaskFactory)
    run = factory.LazyAttribute(lambda m: m.task.run)
    round_index = 0
    candidate_key = factory.Sequence(lambda n: f"cand-{n:08x}")
    latency_s = 1.0e-4
    run_secs = factory.LazyAttribute(lambda m: [] if m.latency_s is None else [m.latency_s] * 3)
    build_secs = 0.2
    run_wall_secs = 0.05
    worker = "test-worker"
    dop = 2


class DopRoundFactory(DjangoModelFactory):
    class Meta:
        model = DopRound

    run = factory.SubFactory(TuningRunFactory)
    round_index = factory.LazyAttribute(lambda r: r.run.dop_rounds.count())
    task_index = 0
    dop = 2
    mean_error = 0.02
    n_candidates = 16


# --- scheduling ------------------------------------------------------------------------------------


class NodeFactory(DjangoModelFactory):
    """A live node (seen now) whose worker serves its CPU queue. ``NodeFactory(gpus=2)`` gives it two
    16 GB V100s whose queues it serves (``gpus__serve=False``: not served), as a heartbeat of a worker
    with ``-Q measure.<node>.cpu,measure.<node>.gpu0,...`` would register them."""

    class Meta:
        model = Node
        skip_postgeneration_save = True

    name = factory.Sequence(lambda n: f"node{n}")
    hostname = factory.LazyAttribute(lambda n: f"{n.name}.local")
    cpu_cores = 16
    memory_mb = 64000
    nvml_available = True
    driver_version = "550.54.15"
    last_seen = factory.LazyFunction(timezone.now)
    queues = factory.LazyAttribute(lambda n: [f"measure.{n.name.replace('.', '-')}.cpu"])

    @factory.post_generation
    def gpus(node, create, extracted, serve: bool = True, **gpu_fields):
        for index in range(extracted or 0):
            gpu = GpuFactory(node=node, index=index, **gpu_fields)
            if serve:
                node.queues = [*node.queues, gpu.queue]
        if extracted and serve and create:
            node.save(update_fields=["queues"])


class GpuFactory(DjangoModelFactory):
    """A present 16 GB V100 of a node, with its measure queue."""

    class Meta:
        model = GPU

    node = factory.SubFactory(NodeFactory)
    index = factory.LazyAttribute(lambda g: g.node.gpus.count())
    uuid = factory.LazyAttribute(lambda g: f"GPU-fake-{g.node.name}-{g.index}")
    name = "Tesla V100-SXM2-16GB"
    gpu_model = "V100"
    memory_total_mb = 16384.0
    power_limit_w = 300.0
    queue = factory.LazyAttribute(lambda g: gpu_queue_name(g.node.name, g.index))


class GpuTelemetryFactory(DjangoModelFactory):
    class Meta:
        model = GpuTelemetry

    gpu = factory.SubFactory(GpuFactory)
    ts = factory.LazyFunction(timezone.now)
    util_pct = 10.0
    mem_used_mb = 100.0
    mem_total_mb = factory.LazyAttribute(lambda t: t.gpu.memory_total_mb)


@dataclass(frozen=True)
class TrainedPredictorFile:
    data: bytes
    metrics: dict
    params: dict
    sources: list
    n_records: int


@functools.cache
def small_predictor() -> TrainedPredictorFile:
    """A small Horus predictor (10 trees, 2 folds) trained on the shipped seed profiles, once per test
    process, as the file ``PredictorVersion`` stores."""
    import tempfile
    from pathlib import Path

    from scheduling.horus.predictor import UtilizationPredictor
    from scheduling.horus.profiles import load_profiles

    trained = UtilizationPredictor(n_estimators=10).train(load_profiles(), k_folds=2, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        trained.save(Path(tmp) / "predictor.json")
        data = (Path(tmp) / "predictor.json").read_bytes()
    return TrainedPredictorFile(data, trained.metrics, trained.params, trained.sources, trained.n_records)


class PredictorVersionFactory(DjangoModelFactory):
    """The next predictor version, a real (small) trained predictor: ``small_predictor``. Pass
    ``active=True`` to make it the one jobs are predicted with (only one may be active)."""

    class Meta:
        model = PredictorVersion

    version = factory.LazyFunction(lambda: (PredictorVersion.objects.aggregate(m=Max("version"))["m"] or 0) + 1)
    file = factory.LazyFunction(lambda: ContentFile(small_predictor().data, name="predictor.json"))
    metrics = factory.LazyFunction(lambda: small_predictor().metrics)
    params = factory.LazyFunction(lambda: small_predictor().params)
    sources = factory.LazyFunction(lambda: small_predictor().sources)
    n_records = factory.LazyFunction(lambda: small_predictor().n_records)
    active = False


class GpuProfileFactory(DjangoModelFactory):
    """A measured profile (source ``profile_gpu:test``) of a model at a batch size on a V100."""

    class Meta:
        model = GpuProfile

    model_name = factory.Sequence(lambda n: f"model-{n}")
    batch_size = 8
    gpu_model = "V100"
    features = factory.LazyFunction(lambda: {"total_flops": 1.0e9, "param_count": 1.0e6, "batch_size": 8})
    util_pct = 40.0
    peak_mem_mb = 2000.0
    source = "profile_gpu:test"


class GpuJobFactory(DjangoModelFactory):
    """A pending job of a model's team with a predicted utilization and memory; trait ``placed``."""

    class Meta:
        model = GpuJob

    class Params:
        placed = factory.Trait(state=GpuJob.State.PLACED, placed_at=factory.LazyFunction(timezone.now))

    model = factory.SubFactory(DLModelFactory)
    team = factory.LazyAttribute(lambda j: j.model.team)
    batch_size = 8
    duration_estimate_s = 60.0
    predicted_util_pct = 30.0
    predicted_mem_mb = 2000.0
    state = GpuJob.State.PENDING


class PlacementFactory(DjangoModelFactory):
    """An active placement of a placed job on a GPU."""

    class Meta:
        model = Placement

    job = factory.SubFactory(GpuJobFactory, placed=True)
    gpu = factory.SubFactory(GpuFactory)
    policy = "horus"
    queue = factory.LazyAttribute(lambda p: p.gpu.queue)
    placed_at = factory.LazyFunction(timezone.now)


class TraceUploadFactory(DjangoModelFactory):
    """A stored Philly trace of a team: ``tests.helpers.PHILLY_CSV`` (4 jobs)."""

    class Meta:
        model = TraceUpload

    team = factory.SubFactory(TeamFactory)
    name = factory.Sequence(lambda n: f"trace-{n}")
    kind = TraceUpload.Kind.PHILLY
    sha256 = hashlib.sha256(PHILLY_CSV.encode()).hexdigest()
    file = factory.django.FileField(filename="philly.csv", data=PHILLY_CSV.encode())
    file_size = len(PHILLY_CSV.encode())
    n_jobs = PHILLY_CSV.strip().count("\n")


class SimulationRunFactory(DjangoModelFactory):
    """A queued simulation of the built-in Philly trace (as ``start_simulation(..., enqueue=False)``)."""

    class Meta:
        model = SimulationRun

    team = factory.SubFactory(TeamFactory)
    trace = "philly"
    policies = factory.LazyFunction(lambda: ["fifo_exclusive", "horus"])
    parameters = factory.LazyFunction(lambda: {"jobs": 50, "gpus": 8})


class CacheEntryFactory(DjangoModelFactory):
    """A trusted record-cache entry (as ``recordcache.services.publish_run`` stores one) under the key of
    ``source_run`` and this host's hardware and TVM version. Its team has opted in to publishing (only then
    is an entry served); ``publishing=False`` leaves the team's setting as it is."""

    class Meta:
        model = CacheEntry
        skip_postgeneration_save = True

    source_run = factory.SubFactory(TuningRunFactory, succeeded=True, target_key='{"kind":"llvm","mcpu":"znver3"}')
    source_team = factory.LazyAttribute(lambda e: e.source_run.team)
    workload_hash = factory.Sequence(lambda n: f"{1000 + n}")
    target_key = factory.LazyAttribute(lambda e: e.source_run.target_key)
    hardware = factory.LazyFunction(lambda: cache_key.hardware_fingerprint({"kind": "llvm"}))
    tvm_version = factory.LazyFunction(lambda: cache_key.tvm_version())
    trace_digest = factory.Sequence(lambda n: hashlib.sha1(str(n).encode()).hexdigest())
    task_name = "fused_conv2d_add_relu"
    workload_json = '{"workload": 1}'
    record_json = '[[[], []], null, {"kind": "llvm"}, []]'
    run_secs = factory.LazyAttribute(lambda e: [e.latency_s] * 3)
    latency_s = 1e-3

    @factory.post_generation
    def publishing(obj, create, extracted, **kwargs):  # noqa: N805 - factory_boy's hook signature
        if create and obj.source_team_id and extracted is not False:
            TeamCacheSettings.objects.update_or_create(team_id=obj.source_team_id, defaults={"publish": True})
