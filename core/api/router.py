"""One DRF router for the whole API; each app's api/urls.py adds its viewsets, config/urls.py mounts it.
It lives in core (which every app depends on), so no app imports the config package."""
from rest_framework.routers import DefaultRouter

router = DefaultRouter()
