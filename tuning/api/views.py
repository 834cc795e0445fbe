"""Tuning API: runs (create/list/detail/cancel/pause/resume), tasks, measurements, artifacts."""
from __future__ import annotations

from django.db.models import CharField
from django.db.models.functions import Cast
from django.http import FileResponse, Http404, HttpResponse
from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_view
from rest_framework import mixins, parsers, permissions, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from core.api.archive import ARCHIVED_PARAMETER, archived_param
from core.api.fast import RowListMixin, read_columns
from core.api.filters import UtcIsoDateTimeFilter, VisibleRowsFilterSet
from core.api.permissions import IsTeamMemberWriteOrReadOnly, with_caller_role
from core.api.throttles import UploadThrottle
from core.api.uploads import body_over
from core.exceptions import ServiceError
from core.models import DLModel
from core.services import read_upload
from tuning import selectors, services
from tuning.services import package as package_service
from tuning.models import TuningRun

from .serializers import (
    DopRoundSerializer,
    ImportRecordsSerializer,
    MeasurementSerializer,
    TuningRunCreateSerializer,
    TuningRunSerializer,
    TuningTaskSerializer,
)


# The columns TuningRunSerializer shows (its properties derive from shown columns too): parsing the
# others (lease, energy model, file paths) on every row of a page is wasted work.
RUN_SOURCES = {"dop": "dop_fixed", "trimmer": "trimmer_enabled", "queue_position": "team"}  # columns they read
RUN_COLUMNS = [f.name for f in TuningRun._meta.concrete_fields
               if f.name in TuningRunSerializer.Meta.fields or f.name in RUN_SOURCES.values()]
RUN_LIST_VALUES = [*read_columns(TuningRun, RUN_COLUMNS), "model__name"]
IMPORT_WORKLOADS_MAX_BYTES = 50 * 1024 * 1024
IMPORT_RECORDS_MAX_BYTES = 200 * 1024 * 1024
ARCHIVE_RUN_TEXT = ("The run is hidden from lists (`?archived=true` lists archived ones) and can be restored; its "
                    "measurements, files and the team's usage are kept. A queued, running or paused run is refused "
                    "with 409: cancel it first.")


class TuningRunFilter(VisibleRowsFilterSet):
    created_after = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="lte")

    class Meta:
        model = TuningRun
        fields = ["team", "model", "status", "target_kind", "measurement_mode"]


@extend_schema_view(
    list=extend_schema(summary="Tuning runs of your teams", parameters=[ARCHIVED_PARAMETER]),
    retrieve=extend_schema(summary="A run with its progress and results"),
    destroy=extend_schema(summary="Archive a finished run (as POST .../archive/)", description=ARCHIVE_RUN_TEXT),
)
class TuningRunViewSet(RowListMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                       mixins.DestroyModelMixin, viewsets.GenericViewSet):
    serializer_class = TuningRunSerializer
    permission_classes = [permissions.IsAuthenticated, IsTeamMemberWriteOrReadOnly]
    filterset_class = TuningRunFilter
    ordering_fields = ["created_at", "status", "trials_done", "wall_seconds", "tuned_latency_s"]
    ordering = ["-created_at"]
    search_fields = ["model__name", "=status", "=id_text"]
    query_params = {"list": ["archived"], "measurements": ["task_index"]}  # read by the views (core.api.strict)  # id_text: the id as text (get_queryset)
    list_model, list_values, list_related = TuningRun, RUN_LIST_VALUES, {"model": DLModel}
    parser_classes = [parsers.JSONParser, parsers.MultiPartParser, parsers.FormParser]

    def get_throttles(self):
        # an import is an upload (up to 250 MB) that holds a web worker while TVM checks it
        extra = [UploadThrottle()] if self.action == "import_records" else []
        return [*super().get_throttles(), *extra]

    def get_queryset(self):
        # The serializers read the run's own columns and its model's name: load nothing more (the model's
        # graph features and the team are ~1/3 of the row-building time of a 50-run page).
        # a detail route finds archived runs too (to read or restore them); lists show one kind
        archived = None if getattr(self, "detail", False) else archived_param(self.request)
        qs = (selectors.runs_for_user(self.request.user, archived=archived).select_related(None)
              .select_related("model").only(*RUN_COLUMNS, "model__name"))
        if getattr(self, "detail", False):  # the object permission reads the caller's role from the same query
            qs = with_caller_role(qs, self.request.user)
        if self.request.query_params.get("search"):  # ?search= matches a run's id exactly (also on get_object,
            qs = qs.annotate(id_text=Cast("id", output_field=CharField()))  # which filters the same way)
        return qs

    @extend_schema(
        request=TuningRunCreateSerializer, responses={201: TuningRunSerializer},
        summary="Start a tuning run",
        description="Queued on the `tuning` Celery queue. Refused with 429 and the quota's name when the team's "
        "concurrent-run or monthly-trial quota would be exceeded.",
        examples=[OpenApiExample("Small DOPpler run", request_only=True, value={
            "model": 1, "max_trials": 64, "target": {"kind": "llvm", "num-cores": 2},
            "measurement_mode": "doppler", "dop": "auto"})],
    )
    def create(self, request, *args, **kwargs):
        body = TuningRunCreateSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        data = body.validated_data
        options = {k: data[k] for k in ("search_population", "seed", "measure_queues")
                   if data.get(k) not in (None, [])}
        run = services.start_run(
            actor=request.user, model=data["model"], max_trials=data["max_trials"], max_minutes=data.get("max_minutes"),
            target=data.get("target"),
            trials_per_round=data["trials_per_round"], measurement_mode=data["measurement_mode"],
            dop=data["dop"] or "auto", threads=data.get("threads"), options=options,
            trimmer=data["trimmer"], trimmer_options=data.get("trimmer_options") or None,
        )
        return Response(TuningRunSerializer(run).data, status=status.HTTP_201_CREATED)

    def _control(self, fn):
        run = self.get_object()
        run = fn(actor=self.request.user, run=run)
        return Response(TuningRunSerializer(run).data)

    @extend_schema(request=None, responses=TuningRunSerializer, summary="Cancel a run")
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        return self._control(services.cancel_run)

    @extend_schema(request=None, responses=TuningRunSerializer, summary="Pause a run (stops between rounds)")
    @action(detail=True, methods=["post"])
    def pause(self, request, pk=None):
        return self._control(services.pause_run)

    @extend_schema(request=None, responses=TuningRunSerializer, summary="Resume a paused run")
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        return self._control(services.resume_run)

    def destroy(self, request, *args, **kwargs):
        return self._control(services.archive_run)

    @extend_schema(request=None, responses=TuningRunSerializer, summary="Archive a finished run",
                   description=ARCHIVE_RUN_TEXT)
    @action(detail=True, methods=["post"])
    def archive(self, request, pk=None):
        return self._control(services.archive_run)

    @extend_schema(request=None, responses=TuningRunSerializer, summary="Restore an archived run")
    @action(detail=True, methods=["post"])
    def restore(self, request, pk=None):
        return self._control(services.restore_run)

    @extend_schema(responses=TuningTaskSerializer(many=True), summary="The run's tuning tasks")
    @action(detail=True, methods=["get"])
    def tasks(self, request, pk=None):
        qs = selectors.tasks_of_run(self.get_object())
        page = self.paginate_queryset(qs)
        return self.get_paginated_response(TuningTaskSerializer(page, many=True).data)

    @extend_schema(responses=MeasurementSerializer(many=True), summary="Every measured candidate (paginated)")
    @action(detail=True, methods=["get"])
    def measurements(self, request, pk=None):
        qs = selectors.measurements_of_run(self.get_object())
        task = request.query_params.get("task_index")
        if task is not None:
            if not task.isdigit():
                raise ValidationError({"task_index": ["Must be a non-negative integer."]})
            qs = qs.filter(task__index=int(task))
        page = self.paginate_queryset(qs)
        return self.get_paginated_response(MeasurementSerializer(page, many=True).data)

    @extend_schema(responses=DopRoundSerializer(many=True), summary="DOP and parallel-vs-serial error per round")
    @action(detail=True, methods=["get"], url_path="dop-rounds")
    def dop_rounds(self, request, pk=None):
        page = self.paginate_queryset(selectors.dop_rounds_of_run(self.get_object()))
        return self.get_paginated_response(DopRoundSerializer(page, many=True).data)

    def _file(self, field: str, filename: str):
        run = self.get_object()
        f = getattr(run, field)
        if not f:
            raise Http404("Not available yet: the run has not finished successfully.")
        return FileResponse(f.open("rb"), as_attachment=True, filename=filename,
                            content_type="application/octet-stream")

    @extend_schema(responses={(200, "application/zip"): bytes}, summary="TVM tuning database (zip of JSON files)")
    @action(detail=True, methods=["get"])
    def records(self, request, pk=None):
        return self._file("records_file", f"run{pk}-records.zip")

    @extend_schema(responses={(200, "application/octet-stream"): bytes}, summary="Compiled tuned module (.so)",
                   description="The X-Deploy-Verdict header says which engine is faster on this target.")
    @action(detail=True, methods=["get"])
    def module(self, request, pk=None):
        response = self._file("module_file", f"run{pk}-tuned.so")
        verdict = self.get_object().deploy_verdict or "no onnxruntime comparison"
        response["X-Deploy-Verdict"] = verdict.replace("×", "x")  # a header is latin-1
        return response

    @extend_schema(responses={(200, "application/zip"): bytes}, summary="Deployment package (.zip)",
                   description="The compiled module (module.so), manifest.json (input/output signature, target "
                   "and the CPU features it needs, TVM and runtime versions, pipeline identity, measured "
                   "latencies) and run.py (checks the host, runs the module, prints its latency). Use it: "
                   "`unzip run<ID>-package.zip -d run<ID>`, `pip install apache-tvm numpy`, "
                   "`python run<ID>/run.py`. 404 until the run succeeded with a module.")
    @action(detail=True, methods=["get"])
    def package(self, request, pk=None):
        run = self.get_object()
        data = package_service.build_run_package(run=run)
        response = HttpResponse(data, content_type="application/zip")
        response["Content-Disposition"] = f'attachment; filename="{package_service.package_filename(run)}"'
        response["X-Deploy-Verdict"] = (run.deploy_verdict or "no onnxruntime comparison").replace("×", "x")
        return response

    @extend_schema(request={"multipart/form-data": ImportRecordsSerializer},
                   responses={200: TuningRunSerializer}, summary="Import an existing TVM tuning database")
    @action(detail=True, methods=["post"], url_path="import-records")
    def import_records(self, request, pk=None):
        run = self.get_object()
        if body_over(request, IMPORT_WORKLOADS_MAX_BYTES + IMPORT_RECORDS_MAX_BYTES):  # before reading the body
            raise ServiceError("The upload is over the 250 MB limit of a TVM database import.", code="too_large")
        body = ImportRecordsSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.import_database(
            actor=request.user, run=run,
            workloads=read_upload(body.validated_data["workloads"], max_bytes=IMPORT_WORKLOADS_MAX_BYTES),
            records=read_upload(body.validated_data["records"], max_bytes=IMPORT_RECORDS_MAX_BYTES))
        run.refresh_from_db()
        return Response(TuningRunSerializer(run).data)
