from django.apps import AppConfig


class TuningConfig(AppConfig):
    name = "tuning"
    verbose_name = "Tuning"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, pre_delete

        from core.selectors import register_usage_provider

        from . import selectors, services
        from .models import TuningRun

        register_usage_provider("tuning", selectors.usage_since)
        pre_delete.connect(services.run_deleting, sender=TuningRun, dispatch_uid="tuning.run_charge")
        post_delete.connect(services.run_deleted, sender=TuningRun, dispatch_uid="tuning.run_files")
