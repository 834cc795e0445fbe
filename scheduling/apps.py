from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "scheduling"
    verbose_name = "GPU scheduling"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from core.selectors import register_usage_provider

        from . import selectors
        from . import tasks  # noqa: F401 - registered in every process (web too): services send them by name

        register_usage_provider("scheduling", selectors.quota_usage)
