from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "scheduling"
    verbose_name = "GPU scheduling"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import pre_delete

        from core.selectors import register_usage_provider

        from . import selectors
        from . import tasks  # noqa: F401 - registered in every process (web too): services send them by name
        from .models import Placement
        from .services.usage import placement_deleted

        register_usage_provider("scheduling", selectors.quota_usage)
        pre_delete.connect(placement_deleted, sender=Placement, dispatch_uid="scheduling.placement_charge")
