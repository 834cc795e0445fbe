"""Store the shipped GPU profile seed set (synthetic: no GPU measured it)."""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from core.exceptions import ServiceError
from scheduling import adapters, services


class Command(BaseCommand):
    help = ("Load data/profiles/seed_profiles.json into the GPU profile table (idempotent). The shipped set is "
            "SYNTHETIC (source 'synthetic-roofline-v1'); `profile_gpu` adds measured records on a GPU worker.")

    def add_arguments(self, parser):
        parser.add_argument("--path", default=str(adapters.DEFAULT_SEED_PROFILES_PATH))

    def handle(self, *args, **opts):
        try:
            n = services.load_seed_profiles(path=opts["path"])
        except ServiceError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"loaded {n} profile records from {opts['path']}")
