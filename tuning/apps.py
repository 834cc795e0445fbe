from django.apps import AppConfig


class TuningConfig(AppConfig):
    name = "tuning"
    verbose_name = "Tuning"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core.selectors import register_usage_provider

        from . import services

        register_usage_provider("tuning", services._usage_provider)
