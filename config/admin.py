"""The admin app with our admin site as its default (Django's documented way to override the default site).
Loaded while the app registry is populated, so it imports no models: the site lives in config/admin_site.py."""
from django.contrib.admin.apps import AdminConfig


class PlatformAdminConfig(AdminConfig):
    default_site = "config.admin_site.PlatformAdminSite"
