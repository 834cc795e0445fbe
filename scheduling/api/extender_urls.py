"""URLs of the Kubernetes scheduler extender, mounted at ``/scheduler/extender/`` (config/urls.py)."""
from django.urls import path

from . import extender

urlpatterns = [
    path("filter", extender.filter_view, name="scheduler-extender-filter"),
    path("prioritize", extender.prioritize_view, name="scheduler-extender-prioritize"),
    path("bind", extender.bind_view, name="scheduler-extender-bind"),
    path("release", extender.release_view, name="scheduler-extender-release"),
]
