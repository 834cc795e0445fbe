"""The reliability tests' populated "world": every role, and one object of every kind in team A."""
from __future__ import annotations

from dataclasses import dataclass, field

from django.core.files.base import ContentFile

from tests.factories import (ApiTokenFactory, DLModelFactory, GpuJobFactory, GpuTelemetryFactory, MembershipFactory,
                             NodeFactory, PlacementFactory, PredictorVersionFactory, SimulationRunFactory, TeamFactory,
                             TeamInvitationFactory, TraceUploadFactory, TuningRunFactory, UserFactory)

ROLES = ("anon", "viewer", "member", "owner", "other", "staff")


@dataclass
class World:
    """Team A (owner, member, viewer), team B (another owner), a staff user in no team, and one
    object of every kind in team A (plus a model in team B)."""

    users: dict = field(default_factory=dict)
    tokens: dict = field(default_factory=dict)  # role -> API key
    objects: dict = field(default_factory=dict)  # name -> model instance

    def __getattr__(self, name):
        try:
            return self.__dict__["objects"][name]
        except KeyError:
            raise AttributeError(name) from None


def _teams_and_roles(w: World) -> tuple:
    w.users = {"owner": UserFactory(username="rel-owner"), "member": UserFactory(username="rel-member"),
               "viewer": UserFactory(username="rel-viewer"), "other": UserFactory(username="rel-other"),
               "staff": UserFactory(username="rel-staff", is_staff=True)}
    team_a = TeamFactory(name="Rel Team A", owner=w.users["owner"], quota__max_concurrent_runs=50,
                         quota__tuning_trials_per_month=10**6, quota__gpu_hours_per_month=10**4,
                         quota__energy_kwh_per_month=10**4)
    team_b = TeamFactory(name="Rel Team B", owner=w.users["other"], quota__max_concurrent_runs=50,
                         quota__tuning_trials_per_month=10**6, quota__gpu_hours_per_month=10**4,
                         quota__energy_kwh_per_month=10**4)
    membership = MembershipFactory(team=team_a, user=w.users["member"])
    MembershipFactory(team=team_a, user=w.users["viewer"], role="viewer")
    w.tokens = {role: ApiTokenFactory(user=user, name="rel").key for role, user in w.users.items()}
    return team_a, team_b, membership


def _runs(owner, model) -> dict:
    runs = {"run": TuningRunFactory(model=model, created_by=owner, max_trials=8, trials_per_round=32),
            "paused_run": TuningRunFactory(model=model, created_by=owner, max_trials=8, trials_per_round=32,
                                           paused=True)}
    runs["done_run"] = TuningRunFactory(
        model=model, created_by=owner, max_trials=8, trials_per_round=32, succeeded=True,
        records_file=ContentFile(b"PK\x05\x06" + b"\0" * 18, name="rel-records.zip"),
        module_file=ContentFile(b"\x7fELF-not-really", name="rel-module.so"))
    return runs


def _cluster(team, model) -> dict:
    from scheduling import services as sched_services
    from scheduling.models import GpuProfile

    sched_services.load_seed_profiles()  # what the staff's "train a predictor" trains on
    node = NodeFactory(name="relnode", gpus=2)
    gpu = node.gpus.order_by("index").first()
    job = GpuJobFactory(model=model, predicted_mem_mb=1000.0)
    placed_job = GpuJobFactory(model=model, predicted_mem_mb=1000.0, placed=True)
    return {"node": node, "gpu": gpu, "telemetry": GpuTelemetryFactory(gpu=gpu), "job": job,
            "placed_job": placed_job, "placement": PlacementFactory(job=placed_job, gpu=gpu),
            # a real (small) predictor: creating a GPU job through the API predicts with the active one
            "predictor": PredictorVersionFactory(active=True), "profile": GpuProfile.objects.order_by("pk").first()}


def build_world() -> World:
    w = World()
    team_a, team_b, membership = _teams_and_roles(w)
    owner = w.users["owner"]
    model = DLModelFactory(team=team_a, name="rel-cnn", created_by=owner)
    w.objects.update(
        team_a=team_a, team_b=team_b, model=model, membership=membership, quota=team_a.quota,
        model_b=DLModelFactory(team=team_b, name="rel-cnn-b", created_by=w.users["other"]),
        trace=TraceUploadFactory(team=team_a, name="rel-trace", created_by=owner),
        simulation=SimulationRunFactory(team=team_a, created_by=owner),
        # team A's owner invited team B's owner: only "other" sees, accepts or declines it
        invitation=TeamInvitationFactory(team=team_a, user=w.users["other"], role="viewer", invited_by=owner),
        token=w.users["member"].api_tokens.first(),
        **_runs(owner, model), **_cluster(team_a, model),
    )
    return w
