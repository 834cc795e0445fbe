from django.apps import AppConfig


class RecordCacheConfig(AppConfig):
    name = "recordcache"
    verbose_name = "Tuning-record cache"
    default_auto_field = "django.db.models.BigAutoField"
