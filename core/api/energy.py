"""The platform's energy model over the API: everyone signed in reads it, staff change it."""
from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import permissions, serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from core import selectors, services
from core.models import ENERGY_LIMITS

from .permissions import IsStaffOrReadOnly
from .strict import RejectUnknownFieldsMixin, StrictQueryParamsMixin


def _limited(name: str, help_text: str) -> serializers.FloatField:
    low, high = ENERGY_LIMITS[name]
    return serializers.FloatField(min_value=low, max_value=high, help_text=help_text)


class EnergySettingsSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    cpu_watts_per_core = _limited("cpu_watts_per_core", "Watts of one busy CPU core (modeled energy).")
    gpu_board_watts = _limited("gpu_board_watts", "Watts of a busy GPU board (modeled energy).")
    grid_intensity_g_per_kwh = _limited("grid_intensity_g_per_kwh",
                                        "gCO2e per kWh for teams without their own intensity.")
    joules_per_trial_estimate = _limited("joules_per_trial_estimate", "Energy of one trial for the energy-quota "
                                                                      "check before a team has finished runs.")
    origin = serializers.CharField(read_only=True, help_text="'admin' once staff saved the settings, else "
                                                             "'environment' (the ENERGY_* defaults).")
    updated_at = serializers.DateTimeField(read_only=True, allow_null=True)


def _payload(model: selectors.EnergyModel) -> dict:
    return {**model.as_dict(), "origin": model.origin, "updated_at": model.updated_at}


class EnergySettingsView(StrictQueryParamsMixin, APIView):
    permission_classes = [permissions.IsAuthenticated, IsStaffOrReadOnly]

    @extend_schema(responses=EnergySettingsSerializer, summary="The energy model behind modeled figures",
                   description="Modeled energy is CPU-seconds x cpu_watts_per_core plus GPU-busy-seconds x "
                               "gpu_board_watts; carbon is energy x grid intensity. Runs keep the values "
                               "they started with.")
    def get(self, request):
        return Response(_payload(selectors.energy_model()))

    @extend_schema(request=EnergySettingsSerializer, responses=EnergySettingsSerializer,
                   summary="Change the energy model (staff)",
                   examples=[OpenApiExample("Greener grid", value={"grid_intensity_g_per_kwh": 120.0},
                                            request_only=True)])
    def patch(self, request):
        serializer = EnergySettingsSerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        services.update_energy_settings(actor=request.user, **serializer.validated_data)
        return Response(_payload(selectors.energy_model()))
