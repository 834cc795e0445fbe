from django.urls import path

from core.api.router import router

from . import views
from .energy import EnergySettingsView

router.register("teams", views.TeamViewSet, basename="team")
router.register("memberships", views.MembershipViewSet, basename="membership")
router.register("invitations", views.TeamInvitationViewSet, basename="teaminvitation")
router.register("quotas", views.QuotaViewSet, basename="quota")
router.register("models", views.DLModelViewSet, basename="dlmodel")
router.register("tokens", views.ApiTokenViewSet, basename="apitoken")
router.register("usage-charges", views.UsageChargeViewSet, basename="usagecharge")

urlpatterns = [
    path("me/", views.MeView.as_view(), name="api-me"),
    path("energy-settings/", EnergySettingsView.as_view(), name="api-energy-settings"),
]
