"""Create the demo user and team and register the zoo; safe to run again."""
from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from core.models import Membership, Team
from core.services import create_team

from .register_zoo import register_zoo_models


class Command(BaseCommand):
    help = "Create a demo user (staff) and team, and register the model zoo for it."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="demo")
        parser.add_argument("--password", default="demo-password")
        parser.add_argument("--team", default="Demo team")
        parser.add_argument("--no-zoo", action="store_true", help="Skip registering the zoo")
        parser.add_argument("--models", nargs="*", help="Subset of zoo models to register")

    def handle(self, *args, username, password, team, no_zoo, models, **options):
        User = get_user_model()
        user, created = User.objects.get_or_create(username=username, defaults={"is_staff": True,
                                                                               "is_superuser": True})
        if created:
            user.set_password(password)
            user.save()
        team_obj = Team.objects.filter(name=team).first() or create_team(name=team, owner=user)
        Membership.objects.get_or_create(team=team_obj, user=user, defaults={"role": Membership.Role.OWNER})
        self.stdout.write(f"Demo user '{username}' ({'created' if created else 'exists'}), team '{team_obj.name}'.")
        if not no_zoo:
            self.stdout.write("Registering the model zoo (first time: builds ONNX graphs and imports them into TVM)...")
            register_zoo_models(team=team_obj, names=models, stdout=self.stdout)
