"""One DRF router for the whole API; each app adds its viewsets in its api/urls.py."""
from rest_framework.routers import DefaultRouter

router = DefaultRouter()
