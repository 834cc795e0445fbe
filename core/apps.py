from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "core"
    verbose_name = "Teams and model registry"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in, user_login_failed

        from . import login_guard, schema  # noqa: F401  (schema registers the OpenAPI auth extension)

        user_login_failed.connect(login_guard.on_login_failed, dispatch_uid="core.login_guard.failed")
        user_logged_in.connect(login_guard.on_logged_in, dispatch_uid="core.login_guard.logged_in")
