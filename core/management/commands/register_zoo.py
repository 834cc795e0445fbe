"""Generate the model zoo (real architectures, random weights) and register it for a team."""
from __future__ import annotations

import io
import time

from django.core.management.base import BaseCommand, CommandError

from core.models import DLModel, Team
from core.onnx_models import zoo
from core.onnx_models.errors import OnnxValidationError
from core.services import register_model


def register_zoo_models(*, team: Team, names: list[str] | None = None, stdout=None) -> list[DLModel]:
    """Build and register each zoo model the team does not have yet (idempotent)."""
    out = stdout or io.StringIO()
    registered = []
    for name in names or zoo.list_models():
        if name not in zoo.ZOO:
            raise CommandError(f"Unknown zoo model '{name}'. Known: {', '.join(zoo.ZOO)}")
        existing = DLModel.objects.filter(team=team, name=name).first()
        if existing:
            out.write(f"  {name}: already registered\n")
            registered.append(existing)
            continue
        started = time.perf_counter()
        proto = zoo.build_model(name)
        model = register_model(
            team=team, name=name, description=zoo.ZOO[name].description, data=proto.SerializeToString(),
            filename=f"{name}.onnx", source=DLModel.Source.ZOO, background=True,
        )
        out.write(
            f"  {name}: {model.gflops:.3f} GFLOPs, {model.param_count / 1e6:.2f} M params, "
            f"{model.num_tuning_tasks} tuning tasks ({time.perf_counter() - started:.1f} s)\n"
        )
        registered.append(model)
    return registered


class Command(BaseCommand):
    help = "Generate the ONNX model zoo (no downloads) and register it for a team."

    def add_arguments(self, parser):
        parser.add_argument("--team", required=True, help="Team slug or name")
        parser.add_argument("--models", nargs="*", help=f"Subset of: {', '.join(zoo.ZOO)}")

    def handle(self, *args, team, models, **options):
        team_obj = Team.objects.filter(slug=team).first() or Team.objects.filter(name=team).first()
        if team_obj is None:
            raise CommandError(f"No team '{team}'. Create it in the admin or with bootstrap_demo.")
        try:
            register_zoo_models(team=team_obj, names=models, stdout=self.stdout)
        except OnnxValidationError as exc:
            raise CommandError(f"A zoo model failed validation ({exc.code}): {exc}") from exc
