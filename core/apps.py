from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "core"
    verbose_name = "Teams and model registry"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import schema  # noqa: F401  (registers the OpenAPI auth extension)
