from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "scheduling"
    verbose_name = "GPU scheduling"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core.selectors import register_usage_provider

        from . import services

        register_usage_provider("scheduling", services._usage_provider)
