"""One DRF router for the whole API; each app's api/urls.py adds its viewsets, config/urls.py mounts it.
It lives in core (which every app depends on), so no app imports the config package."""
from rest_framework.routers import APIRootView, DefaultRouter

from .strict import StrictQueryParamsMixin


class StrictAPIRootView(StrictQueryParamsMixin, APIRootView):
    """/api/: the router's index, refusing unknown query parameters like every API view."""


router = DefaultRouter()
router.APIRootView = StrictAPIRootView
