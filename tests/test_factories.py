"""Every factory in tests/factories.py makes a row that passes the model's own validation, with the
related rows the product would have made alongside it."""
from __future__ import annotations

import pytest

from tests import factories as f

pytestmark = pytest.mark.django_db

ALL = [f.UserFactory, f.TeamFactory, f.MembershipFactory, f.TeamInvitationFactory, f.EnergySettingsFactory,
       f.ApiTokenFactory, f.DLModelFactory, f.TuningRunFactory, f.TuningTaskFactory, f.MeasurementFactory,
       f.DopRoundFactory, f.NodeFactory, f.GpuFactory, f.GpuTelemetryFactory, f.PredictorVersionFactory,
       f.GpuProfileFactory, f.GpuJobFactory, f.PlacementFactory, f.TraceUploadFactory, f.SimulationRunFactory]


@pytest.mark.parametrize("factory", ALL, ids=lambda fac: fac.__name__)
def test_factory_row_is_valid(factory):
    row = factory()
    row.full_clean(validate_unique=False)
    row.refresh_from_db()


def test_team_gets_a_quota_and_its_owner():
    owner = f.UserFactory(username="boss")
    team = f.TeamFactory(owner=owner)
    assert team.quota.max_concurrent_runs == 2
    assert team.memberships.get().user == owner and team.memberships.get().role == "owner"


def test_model_row_carries_the_validated_zoo_features_and_file():
    model = f.DLModelFactory()
    cached = f.zoo_model()
    assert model.state == "ready" and model.file_size == len(cached.data) and model.file.read() == cached.data
    assert model.total_flops == cached.validated.features.total_flops and model.conv_count > 0


def test_node_gpus_and_queues():
    node = f.NodeFactory(name="n1", gpus=2)
    assert node.queues == ["measure.n1.cpu", "measure.n1.gpu0", "measure.n1.gpu1"]
    assert list(node.gpus.values_list("index", "queue")) == [(0, "measure.n1.gpu0"), (1, "measure.n1.gpu1")]
    assert f.NodeFactory(name="n2", gpus=1, gpus__serve=False).queues == ["measure.n2.cpu"]


def test_api_token_key_authenticates(client):
    token = f.ApiTokenFactory()
    assert client.get("/api/teams/", HTTP_AUTHORIZATION=f"Token {token.key}").status_code == 200


def test_predictor_loads_and_predicts():
    from scheduling import services

    version = f.PredictorVersionFactory(active=True)
    model = f.DLModelFactory()
    util, mem = services.load_predictor(version).predict(services.model_features(model, 8), gpu_model="V100")
    assert 0 <= util <= 100 and mem > 0
