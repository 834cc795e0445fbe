"""Scheduling API: nodes, GPUs, telemetry, GPU jobs, placements, profiles, predictors,
trace uploads and simulations. Thin views over scheduling.services / scheduling.selectors."""
from __future__ import annotations

import django_filters
from django.db.models import Prefetch
from django.http import Http404
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, parsers, permissions, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied as DRFPermissionDenied
from rest_framework.response import Response

from core.api.filters import UtcIsoDateTimeFilter, VisibleRowsFilterSet
from core.api.permissions import IsTeamMemberWriteOrReadOnly
from core.api.throttles import UploadThrottle
from core.api.uploads import body_over
from core.exceptions import ServiceError
from scheduling import selectors, services
from scheduling.models import GPU, GpuJob, GpuProfile, GpuTelemetry, Placement, SimulationRun

from .serializers import (
    GpuJobCreateSerializer,
    GpuJobSerializer,
    GpuProfileSerializer,
    GPUSerializer,
    GpuTelemetrySerializer,
    NodeSerializer,
    PlacementSerializer,
    PlaceSerializer,
    PredictorTrainingSerializer,
    PredictorVersionSerializer,
    SimulationCreateSerializer,
    SimulationEstimateSerializer,
    SimulationRunDetailSerializer,
    SimulationRunSerializer,
    TraceUploadCreateSerializer,
    TraceUploadSerializer,
    TrainPredictorSerializer,
)


def _staff_only(request) -> None:
    if not request.user.is_staff:
        raise DRFPermissionDenied("Only staff can do this.")


# --- cluster ---------------------------------------------------------------------------------------

class DrainMixin:
    drain_service = None

    def _set_drained(self, request, drained: bool):
        _staff_only(request)
        obj = type(self).drain_service(actor=request.user, drained=drained, **{self.drain_kwarg: self.get_object()})
        return Response(self.get_serializer(self.get_queryset().get(pk=obj.pk)).data)


@extend_schema_view(
    list=extend_schema(summary="Worker nodes (a node with no GPU says why)"),
    retrieve=extend_schema(summary="A worker node"),
)
class NodeViewSet(DrainMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = NodeSerializer
    filterset_fields = ["drained", "nvml_available"]
    search_fields = ["name", "hostname"]
    ordering_fields = ["name", "last_seen"]
    drain_service = staticmethod(services.set_node_drained)
    drain_kwarg = "node"

    def get_queryset(self):
        return selectors.nodes()

    @extend_schema(request=None, responses=NodeSerializer, summary="Drain a node: no new placements (staff)")
    @action(detail=True, methods=["post"])
    def drain(self, request, pk=None):
        return self._set_drained(request, True)

    @extend_schema(request=None, responses=NodeSerializer, summary="Undrain a node (staff)")
    @action(detail=True, methods=["post"])
    def undrain(self, request, pk=None):
        return self._set_drained(request, False)


class GPUFilter(VisibleRowsFilterSet):
    node_name = django_filters.CharFilter(field_name="node__name")

    class Meta:
        model = GPU
        fields = ["node", "node_name", "gpu_model", "drained", "present"]


@extend_schema_view(
    list=extend_schema(summary="GPUs with their latest telemetry and active jobs"),
    retrieve=extend_schema(summary="A GPU"),
)
class GPUViewSet(DrainMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = GPUSerializer
    filterset_class = GPUFilter
    ordering_fields = ["index", "memory_total_mb"]
    drain_service = staticmethod(services.set_gpu_drained)
    drain_kwarg = "gpu"

    def get_queryset(self):
        return selectors.gpus()

    @extend_schema(request=None, responses=GPUSerializer, summary="Drain a GPU: no new placements (staff)")
    @action(detail=True, methods=["post"])
    def drain(self, request, pk=None):
        return self._set_drained(request, True)

    @extend_schema(request=None, responses=GPUSerializer, summary="Undrain a GPU (staff)")
    @action(detail=True, methods=["post"])
    def undrain(self, request, pk=None):
        return self._set_drained(request, False)


class TelemetryFilter(VisibleRowsFilterSet):
    since = UtcIsoDateTimeFilter(field_name="ts", lookup_expr="gte")
    until = UtcIsoDateTimeFilter(field_name="ts", lookup_expr="lte")
    node = django_filters.CharFilter(field_name="gpu__node__name")

    class Meta:
        model = GpuTelemetry
        fields = ["gpu", "node", "since", "until"]


@extend_schema_view(
    list=extend_schema(summary="GPU telemetry samples (filter by gpu, node, since/until; paginated)"),
    retrieve=extend_schema(summary="A telemetry sample"),
)
class GpuTelemetryViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = GpuTelemetrySerializer
    filterset_class = TelemetryFilter
    ordering_fields = ["ts", "util_pct", "power_w"]
    ordering = ["-ts"]

    def get_queryset(self):
        return selectors.telemetry()


# --- profiles and predictors --------------------------------------------------------------------------

class ProfileFilter(VisibleRowsFilterSet):
    synthetic = django_filters.BooleanFilter(method="filter_synthetic")

    class Meta:
        model = GpuProfile
        fields = ["model_name", "gpu_model", "batch_size", "source", "synthetic"]

    def filter_synthetic(self, queryset, name, value):
        q = queryset.filter(source__startswith=GpuProfile.SYNTHETIC_PREFIX)
        return q if value else queryset.exclude(source__startswith=GpuProfile.SYNTHETIC_PREFIX)


@extend_schema_view(
    list=extend_schema(summary="GPU profile records (source shown; synthetic ones say so)",
                       description="Records from `profile_gpu` on a GPU worker, or the shipped seed set. The seed "
                       "set is SYNTHETIC (no GPU was used): each such record has `synthetic: true` and a note."),
    retrieve=extend_schema(summary="A GPU profile record"),
)
class GpuProfileViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = GpuProfileSerializer
    filterset_class = ProfileFilter
    search_fields = ["model_name"]
    ordering_fields = ["model_name", "batch_size", "util_pct", "peak_mem_mb"]

    def get_queryset(self):
        return selectors.profiles_for_user(self.request.user)


@extend_schema_view(
    list=extend_schema(summary="Trained predictor versions with k-fold RMSLE/MAE"),
    retrieve=extend_schema(summary="A predictor version"),
)
class PredictorVersionViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = PredictorVersionSerializer
    filterset_fields = ["active"]
    ordering_fields = ["version", "trained_at"]

    def get_queryset(self):
        return selectors.predictor_versions()

    @extend_schema(request=TrainPredictorSerializer, responses={202: PredictorTrainingSerializer},
                   summary="Queue a predictor training on every stored profile (staff)",
                   description="Training runs in a Celery task (`scheduling.train_predictor`), never in the request: "
                   "the answer is 202 with the training's `state` (queued) and the `url` to poll (Location too) "
                   "until it is `succeeded` (with the new `version`) or `failed` (with the `error`). Grouped k-fold "
                   "cross-validation (a model is never in its own test fold); the new version is activated unless "
                   "`activate` is false. 503 with Retry-After when the task broker is unreachable.")
    @action(detail=False, methods=["post"])
    def train(self, request):
        _staff_only(request)
        body = TrainPredictorSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        training = services.start_predictor_training(actor=request.user, **body.validated_data)
        data = PredictorTrainingSerializer(training).data
        return Response(data, status=status.HTTP_202_ACCEPTED, headers={"Location": data["url"]})

    @extend_schema(request=None, responses={200: PredictorTrainingSerializer},
                   parameters=[OpenApiParameter("task_id", str, OpenApiParameter.PATH,
                                                description="The `task_id` the train action answered.")],
                   summary="The state of a queued predictor training (staff)")
    @action(detail=False, methods=["get"], url_path=r"training/(?P<task_id>[^/.]+)")
    def training(self, request, task_id=None):
        _staff_only(request)
        training = selectors.predictor_training(task_id)
        if training is None:
            raise Http404("No such predictor training.")
        return Response(PredictorTrainingSerializer(training).data)

    @extend_schema(request=None, responses=PredictorVersionSerializer, summary="Make this version active (staff)")
    @action(detail=True, methods=["post"])
    def activate(self, request, pk=None):
        _staff_only(request)
        pv = services.activate_predictor(actor=request.user, version=self.get_object())
        return Response(PredictorVersionSerializer(pv).data)


# --- jobs and placements (team-scoped) ------------------------------------------------------------------

class GpuJobFilter(VisibleRowsFilterSet):
    created_after = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="lte")

    class Meta:
        model = GpuJob
        fields = ["team", "model", "state", "policy", "created_after", "created_before"]


@extend_schema_view(
    list=extend_schema(summary="GPU jobs of your teams"),
    retrieve=extend_schema(summary="A GPU job with its prediction and placement"),
)
class GpuJobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                    viewsets.GenericViewSet):
    serializer_class = GpuJobSerializer
    permission_classes = [permissions.IsAuthenticated, IsTeamMemberWriteOrReadOnly]
    filterset_class = GpuJobFilter
    ordering_fields = ["created_at", "state", "predicted_util_pct"]
    ordering = ["-created_at"]

    def get_queryset(self):
        return selectors.jobs_for_user(self.request.user).prefetch_related(
            Prefetch("placements", queryset=Placement.objects.select_related("gpu", "gpu__node")))

    @extend_schema(
        request=GpuJobCreateSerializer, responses={201: GpuJobSerializer},
        summary="Submit a GPU job",
        description="Its GPU utilization and memory are predicted from the model's graph (active predictor) and "
        "it is placed by the configured policy on a GPU, whose queue `measure.<node>.gpu<i>` runs it. Refused "
        "with 429 (`quota: gpu_hours_per_month`) when its estimated GPU time would exceed the team's quota.",
        examples=[OpenApiExample("ResNet at batch 32", request_only=True,
                                 value={"model": 1, "batch_size": 32, "iterations": 200, "duration_estimate_s": 120})],
    )
    def create(self, request, *args, **kwargs):
        body = GpuJobCreateSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        data = body.validated_data
        job = services.submit_job(actor=request.user, model=data["model"], batch_size=data["batch_size"],
                                  iterations=data["iterations"], duration_estimate_s=data.get("duration_estimate_s"),
                                  runtime=data["runtime"], num_gpus=data["num_gpus"], kind=data["kind"],
                                  optimizer=data["optimizer"], learning_rate=data.get("learning_rate"))
        return Response(GpuJobSerializer(self.get_queryset().get(pk=job.pk)).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=GpuJobSerializer, summary="Cancel a GPU job")
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        job = services.cancel_job(actor=request.user, job=self.get_object())
        return Response(GpuJobSerializer(self.get_queryset().get(pk=job.pk)).data)

    @extend_schema(request=PlaceSerializer, responses=PlacementSerializer(many=True),
                   summary="Run a placement pass now (staff)")
    @action(detail=False, methods=["post"])
    def place(self, request):
        _staff_only(request)
        body = PlaceSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        placed = services.place_pending_jobs(policy=body.validated_data.get("policy"))
        return Response(PlacementSerializer(placed, many=True).data)


class PlacementFilter(VisibleRowsFilterSet):
    active = django_filters.BooleanFilter(field_name="released_at", lookup_expr="isnull")

    class Meta:
        model = Placement
        fields = ["job", "gpu", "policy", "active"]


@extend_schema_view(
    list=extend_schema(summary="Placements of your teams' GPU jobs"),
    retrieve=extend_schema(summary="A placement"),
)
class PlacementViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = PlacementSerializer
    filterset_class = PlacementFilter
    ordering_fields = ["placed_at", "score"]

    def get_queryset(self):
        return selectors.placements_for_user(self.request.user)


# --- traces and simulations (team-scoped) -----------------------------------------------------------------

def _trace_too_large() -> ServiceError:
    return ServiceError(f"The file is over the {services.max_trace_bytes() // 2**20} MB limit.", code="too_large",
                        field="file")


TRACE_ERROR_EXAMPLE = OpenApiExample(
    "Malformed row", response_only=True, status_codes=["400"],
    value={"detail": "philly.csv, line 3, column 'duration': expected a number, got 'abc'",
           "code": "trace_malformed", "errors": {"file": ["philly.csv, line 3, column 'duration': expected a "
                                                          "number, got 'abc'"]},
           "line": 3, "column": "duration"})


@extend_schema_view(
    list=extend_schema(summary="Traces your teams uploaded"),
    retrieve=extend_schema(summary="An uploaded trace with its summary"),
    destroy=extend_schema(summary="Delete an uploaded trace"),
)
class TraceUploadViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                         mixins.DestroyModelMixin, viewsets.GenericViewSet):
    serializer_class = TraceUploadSerializer
    permission_classes = [permissions.IsAuthenticated, IsTeamMemberWriteOrReadOnly]
    parser_classes = [parsers.MultiPartParser, parsers.FormParser]
    filterset_fields = ["team", "kind"]
    search_fields = ["name"]
    ordering_fields = ["created_at", "name", "n_jobs"]

    def get_throttles(self):
        return [*super().get_throttles(), UploadThrottle()]

    def get_queryset(self):
        return selectors.traces_for_user(self.request.user)

    @extend_schema(
        request={"multipart/form-data": TraceUploadCreateSerializer},
        responses={201: TraceUploadSerializer, 400: OpenApiResponse(description="Malformed trace: `line` and "
                                                                   "`column` name the first bad cell.")},
        summary="Upload a cluster trace (Philly jobs or an Alibaba pod list)",
        description="Every row is validated; a malformed one gets a 400 whose `line` (1-based, the header is "
        "line 1) and `column` name it, and nothing is stored.",
        examples=[TRACE_ERROR_EXAMPLE],
    )
    def create(self, request, *args, **kwargs):
        if body_over(request, services.max_trace_bytes()):  # refused before the body is read
            raise _trace_too_large()
        body = TraceUploadCreateSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        upload = body.validated_data["file"]
        if upload.size > services.max_trace_bytes():
            raise _trace_too_large()
        try:
            trace = services.upload_trace(actor=request.user, team=body.validated_data["team"],
                                          name=body.validated_data["name"], data=upload.read(),
                                          filename=upload.name)
        except services.TraceRejected as exc:
            return Response({"detail": exc.message, "code": exc.code, "errors": {"file": [exc.message]},
                             "line": exc.line, "column": exc.column}, status=status.HTTP_400_BAD_REQUEST)
        return Response(TraceUploadSerializer(trace).data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance):
        services.delete_trace(actor=self.request.user, trace=instance)


class SimulationFilter(VisibleRowsFilterSet):
    class Meta:
        model = SimulationRun
        fields = ["team", "trace", "status"]


@extend_schema_view(
    list=extend_schema(summary="Simulation runs of your teams (summary table per run)"),
    retrieve=extend_schema(summary="A simulation run with its full results"),
    create=extend_schema(description="Refused (429, `quota` names the limit) past the team's concurrency, size "
                         "(jobs x GPUs) or cost (`max_simulation_units`, estimated by scheduling.horus.cost) limits; "
                         "the response carries the estimate (`cost_units`, `estimated_worker_s`)."),
)
class SimulationRunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                           viewsets.GenericViewSet):
    serializer_class = SimulationRunSerializer
    permission_classes = [permissions.IsAuthenticated, IsTeamMemberWriteOrReadOnly]
    filterset_class = SimulationFilter
    ordering_fields = ["created_at", "status"]
    ordering = ["-created_at"]

    def get_queryset(self):
        qs = selectors.simulations_for_user(self.request.user)
        return qs if self.action == "retrieve" else qs.defer("results")

    def get_serializer_class(self):
        return SimulationRunDetailSerializer if self.action == "retrieve" else SimulationRunSerializer

    @extend_schema(
        request=SimulationCreateSerializer, responses={201: SimulationRunSerializer},
        summary="Simulate placement policies on a trace (runs on a Celery worker)",
        description="Replay (Philly: a job slice on a uniform cluster of `gpus`) or the ATC'23 fill method "
        "(Alibaba pods on a `scale` fraction of the trace's own cluster). The cluster scale is stored with the "
        "results.",
        examples=[OpenApiExample("Philly slice, all policies", request_only=True, value={
            "team": 1, "trace": "philly", "policies": ["all"], "seed": 0,
            "parameters": {"jobs": 2000, "start": 10000, "gpus": 64}})],
    )
    def create(self, request, *args, **kwargs):
        body = SimulationCreateSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        data = body.validated_data
        run = services.start_simulation(actor=request.user, team=data["team"], trace=data["trace"],
                                        policies=data["policies"], seed=data["seed"],
                                        parameters=dict(data.get("parameters") or {}))
        return Response(SimulationRunSerializer(run).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=SimulationCreateSerializer, responses={200: SimulationEstimateSerializer},
                   summary="Estimate a simulation's cost against your team's limit (nothing is started)")
    @action(detail=False, methods=["post"])
    def estimate(self, request):
        body = SimulationCreateSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        data = body.validated_data
        estimate = services.estimate_simulation(actor=request.user, team=data["team"], trace=data["trace"],
                                                policies=data["policies"], seed=data["seed"],
                                                parameters=dict(data.get("parameters") or {}))
        return Response(SimulationEstimateSerializer(estimate).data)

    @extend_schema(request=None, responses=SimulationRunSerializer,
                   summary="Cancel a simulation (a queued one at once; a running one stops at its next check)")
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        run = services.cancel_simulation(actor=request.user, run=self.get_object())
        return Response(SimulationRunSerializer(run).data)
