"""Remove upload temp files that killed requests left behind (run at web start; beat runs it too)."""
from __future__ import annotations

from django.core.management.base import BaseCommand

from core.services.upload_temp import remove_stale_upload_files, upload_temp_dir


class Command(BaseCommand):
    help = "Remove upload temp files not written for UPLOAD_TEMP_MAX_AGE_S (leftovers of killed requests)."

    def add_arguments(self, parser):
        parser.add_argument("--max-age", type=float, default=None,
                            help="seconds since the file was last written (default: UPLOAD_TEMP_MAX_AGE_S)")

    def handle(self, *args, max_age=None, **options):
        removed = remove_stale_upload_files(max_age_s=max_age)
        self.stdout.write(f"{len(removed)} stale upload temp file(s) removed from {upload_temp_dir()}")
