"""Record-cache API: a team's publish/read setting (owners change it), a run's per-task cache use, and
staff's stats, export (a TVM JSON database), import (checked, then pending) and purge."""
from __future__ import annotations

import io
import zipfile

from django.http import Http404, HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import parsers, permissions, serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.strict import StrictQueryParamsMixin
from core.api.throttles import UploadThrottle
from core.selectors import team_ref_filter, teams_for_user
from core.services import read_upload
from recordcache import adapters, selectors, services
from tuning.selectors import runs_for_user

from .serializers import (CacheImportSerializer, CacheLookupSerializer, PurgeSerializer,
                          TeamCacheSettingsSerializer)

IMPORT_MAX_BYTES = 200 * 1024 * 1024


class IsStaff(permissions.BasePermission):
    message = "Only staff can use the shared record cache's export, import, purge and statistics."

    def has_permission(self, request, view):
        return bool(request.user and request.user.is_authenticated and request.user.is_staff)


class TeamCacheSettingsView(StrictQueryParamsMixin, APIView):
    permission_classes = [permissions.IsAuthenticated]

    def _team(self, request, team_ref: str):
        team = teams_for_user(request.user).filter(**team_ref_filter(team_ref)).first()
        if team is None:
            raise Http404
        return team

    @extend_schema(responses=TeamCacheSettingsSerializer, summary="The team's record-cache setting")
    def get(self, request, team_ref: str):
        return Response(TeamCacheSettingsSerializer(selectors.team_settings(self._team(request, team_ref).pk)).data)

    @extend_schema(request=TeamCacheSettingsSerializer, responses=TeamCacheSettingsSerializer,
                   summary="Publish to / read from the shared record cache (owners)")
    def patch(self, request, team_ref: str):
        team = self._team(request, team_ref)
        body = TeamCacheSettingsSerializer(data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        row = services.update_team_settings(actor=request.user, team=team, publish=body.validated_data.get("publish"),
                                            read=body.validated_data.get("read"))
        return Response(TeamCacheSettingsSerializer(row).data)


class RunCacheView(StrictQueryParamsMixin, APIView):
    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(summary="Per task: cache hit or miss, source run, verification, trials saved (estimated)",
                   responses=inline_serializer("RunCacheUse", {"tasks": CacheLookupSerializer(many=True),
                                                               "savings": serializers.DictField()}))
    def get(self, request, run_id: int):
        run = runs_for_user(request.user).filter(pk=run_id).first()
        if run is None:
            raise Http404
        return Response({"tasks": CacheLookupSerializer(selectors.lookups_of_run(run), many=True).data,
                         "savings": selectors.run_cache_savings(run)})


class CacheStatsView(StrictQueryParamsMixin, APIView):
    permission_classes = [IsStaff]

    @extend_schema(summary="Cache size and hit rate (staff)", responses=OpenApiTypes.OBJECT)
    def get(self, request):
        return Response(selectors.cache_stats())


class CacheExportView(StrictQueryParamsMixin, APIView):
    permission_classes = [IsStaff]
    query_params = {"get": ["target_key", "tvm_version", "hardware"]}

    @extend_schema(summary="Trusted entries (filter: target_key, tvm_version, hardware) as a TVM JSON database zip",
                   responses={(200, "application/zip"): OpenApiTypes.BINARY})
    def get(self, request):
        q = request.query_params
        entries = selectors.entries_for_export(target_key=q.get("target_key", ""),
                                               tvm_version=q.get("tvm_version", ""), hardware=q.get("hardware", ""))
        workloads, records = adapters.export_lines(entries)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("database_workload.json", "".join(x + "\n" for x in workloads))
            zf.writestr("database_tuning_record.json", "".join(x + "\n" for x in records))
        response = HttpResponse(buf.getvalue(), content_type="application/zip")
        response["Content-Disposition"] = 'attachment; filename="record-cache.zip"'
        return response


class CacheImportView(StrictQueryParamsMixin, APIView):
    permission_classes = [IsStaff]
    parser_classes = [parsers.MultiPartParser, parsers.FormParser]
    throttle_classes = [UploadThrottle]

    @extend_schema(request=CacheImportSerializer, summary="Import a TVM JSON database (staff): checked, then "
                   "pending until a run measures it",
                   responses=inline_serializer("CacheImportResult", {"imported": serializers.IntegerField(),
                                                                     "status": serializers.CharField()}))
    def post(self, request):
        body = CacheImportSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        d = body.validated_data
        n = services.import_entries(
            actor=request.user, workloads=read_upload(d["workloads"], max_bytes=IMPORT_MAX_BYTES),
            records=read_upload(d["records"], max_bytes=IMPORT_MAX_BYTES), target=d["target"],
            hardware=d["hardware"], tvm_version=d["tvm_version"])
        return Response({"imported": n, "status": "pending"})


class CachePurgeView(StrictQueryParamsMixin, APIView):
    permission_classes = [IsStaff]

    @extend_schema(request=PurgeSerializer, summary="Delete the entries of a target and/or TVM version (staff)",
                   responses=inline_serializer("CachePurgeResult", {"deleted": serializers.IntegerField()}))
    def post(self, request):
        body = PurgeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response({"deleted": services.purge(actor=request.user, **body.validated_data)})
