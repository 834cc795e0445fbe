"""Thin API views over core.services / core.selectors."""
from __future__ import annotations

import django_filters
from django.conf import settings
from django.http import FileResponse, Http404
from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_view
from rest_framework import exceptions, mixins, parsers, permissions, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from core import selectors, services
from core.models import ApiToken, DLModel, Membership, Quota, Team, TeamInvitation, UsageCharge
from core.onnx_models.errors import OnnxValidationError

from .archive import ARCHIVED_PARAMETER, archived_param
from .fast import RowListMixin, read_columns
from .filters import UtcIsoDateTimeFilter, VisibleRowsFilterSet
from .permissions import IsStaffOrReadOnly, IsTeamMemberWriteOrReadOnly, with_caller_role
from .serializers import (
    ApiTokenCreatedSerializer,
    ApiTokenCreateSerializer,
    ApiTokenSerializer,
    DLModelSerializer,
    DLModelUploadSerializer,
    InvitationCreateSerializer,
    InvitationSentSerializer,
    MembershipSerializer,
    MembershipUpdateSerializer,
    MeSerializer,
    QuotaSerializer,
    TeamCreateSerializer,
    TeamInvitationSerializer,
    TeamSerializer,
    UsageChargeSerializer,
)
from .strict import StrictQueryParamsMixin
from .throttles import TokenCreateThrottle, UploadThrottle
from .uploads import body_over, declared_length

MODEL_LIST_VALUES = [*read_columns(DLModel, DLModelSerializer.Meta.fields), "team__name"]


class MeView(StrictQueryParamsMixin, APIView):
    @extend_schema(responses=MeSerializer, summary="The caller and their teams")
    def get(self, request):
        teams = [
            {"id": m.team_id, "slug": m.team.slug, "name": m.team.name, "role": m.role}
            for m in Membership.objects.filter(user=request.user).select_related("team")
        ]
        return Response(
            {"id": request.user.pk, "username": request.user.get_username(), "is_staff": request.user.is_staff,
             "teams": teams}
        )


@extend_schema_view(
    list=extend_schema(summary="Teams you belong to"),
    create=extend_schema(
        request=TeamCreateSerializer, responses={201: TeamSerializer}, summary="Create a team (staff)",
        description="Staff only (each team gets its own quotas, so self-service teams would multiply them): "
        "anyone else gets a 403. `owner` (a username, default the caller) becomes its first owner."),
    partial_update=extend_schema(summary="Rename or describe a team (owners); grid intensity: staff only"),
)
class TeamViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                  mixins.UpdateModelMixin, viewsets.GenericViewSet):
    serializer_class = TeamSerializer
    search_fields = ["name"]
    ordering_fields = ["name", "created_at"]
    http_method_names = ["get", "post", "patch", "head", "options"]

    lookup_value_regex = r"[-a-zA-Z0-9_]+"

    def get_queryset(self):
        return selectors.teams_for_user(self.request.user).order_by("name")

    def get_object(self):
        """/api/teams/<id or slug>/."""
        queryset = self.filter_queryset(self.get_queryset())
        team = queryset.filter(**selectors.team_ref_filter(self.kwargs[self.lookup_field])).first()
        if team is None:
            raise Http404
        self.check_object_permissions(self.request, team)
        return team

    def create(self, request, *args, **kwargs):
        services.require_team_creator(request.user)  # a 403 before anything else is looked at
        body = TeamCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        team = services.create_team(actor=request.user, name=data["name"], owner=data.get("owner", request.user),
                                    description=data.get("description", ""))
        return Response(self.get_serializer(team).data, status=status.HTTP_201_CREATED)

    def perform_update(self, serializer):
        serializer.instance = services.update_team(actor=self.request.user, team=serializer.instance,
                                                   **serializer.validated_data)


class MembershipFilter(VisibleRowsFilterSet):
    class Meta:
        model = Membership
        fields = ["team", "role"]


@extend_schema_view(
    list=extend_schema(summary="Members of your teams"),
    partial_update=extend_schema(request=MembershipUpdateSerializer, summary="Change a member's role (owners)"),
    destroy=extend_schema(summary="Remove a member (owners), or leave a team (your own membership)"),
)
class MembershipViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin,
                        viewsets.GenericViewSet):
    """Members join by accepting an invitation (/api/invitations/), never by being added."""

    serializer_class = MembershipSerializer
    filterset_class = MembershipFilter
    ordering_fields = ["created_at", "role"]
    http_method_names = ["get", "patch", "delete", "head", "options"]

    def get_queryset(self):
        return selectors.memberships_for_user(self.request.user)

    def partial_update(self, request, *args, **kwargs):
        membership = self.get_object()
        body = MembershipUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        membership = services.change_member_role(actor=request.user, membership=membership,
                                                 role=body.validated_data["role"])
        return Response(self.get_serializer(membership).data)

    def perform_destroy(self, instance):
        services.remove_member(actor=self.request.user, membership=instance)


INVITATION_SENT = ("If '{username}' is an active user who is not in {team} yet, they have been invited as {role}; "
                   "they join when they accept.")


@extend_schema_view(list=extend_schema(summary="Invitations to teams waiting for your answer"))
class TeamInvitationViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    serializer_class = TeamInvitationSerializer
    filterset_fields = ["team"]
    ordering_fields = ["created_at"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return TeamInvitation.objects.none()
        return TeamInvitation.objects.filter(user=self.request.user).select_related("team", "invited_by")

    @extend_schema(request=InvitationCreateSerializer, responses={202: InvitationSentSerializer},
                   summary="Invite a user to a team you own",
                   description="The answer is the same whether or not the user exists, so it cannot be used to "
                   "find accounts. The user sees the invitation in their list and accepts or declines it.")
    def create(self, request, *args, **kwargs):
        body = InvitationCreateSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        team, username, role = (body.validated_data[k] for k in ("team", "username", "role"))
        services.invite_member(actor=request.user, team=team, username=username, role=role)
        return Response({"detail": INVITATION_SENT.format(username=username, team=team.name, role=role)},
                        status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={201: MembershipSerializer}, summary="Accept an invitation: join the team")
    @action(detail=True, methods=["post"])
    def accept(self, request, pk=None):
        membership = services.accept_invitation(actor=request.user, invitation=self.get_object())
        return Response(MembershipSerializer(membership, context=self.get_serializer_context()).data,
                        status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={204: None}, summary="Decline an invitation")
    @action(detail=True, methods=["post"])
    def decline(self, request, pk=None):
        services.decline_invitation(actor=request.user, invitation=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema_view(
    list=extend_schema(summary="Quotas of your teams, with this month's usage"),
    partial_update=extend_schema(summary="Change a team's limits (staff)"),
)
class QuotaViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.UpdateModelMixin,
                   viewsets.GenericViewSet):
    serializer_class = QuotaSerializer
    permission_classes = [permissions.IsAuthenticated, IsStaffOrReadOnly]
    filterset_fields = ["team"]
    http_method_names = ["get", "patch", "head", "options"]

    def get_queryset(self):
        if self.request.user.is_staff and self.request.method not in permissions.SAFE_METHODS:
            return Quota.objects.select_related("team")
        return selectors.quotas_for_user(self.request.user)

    def perform_update(self, serializer):
        limits = {k: v for k, v in serializer.validated_data.items() if k in services.QUOTA_FIELDS}
        serializer.instance = services.update_quota(actor=self.request.user, quota=serializer.instance, **limits)


class UsageChargeFilter(VisibleRowsFilterSet):
    created_after = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="lte")

    class Meta:
        model = UsageCharge
        fields = ["team", "kind", "source", "model", "run", "job", "simulation"]


@extend_schema_view(list=extend_schema(
    summary="Your teams' usage ledger",
    description="Every charge of tuning trials, GPU-seconds, energy (joules, measured or modeled) and simulated "
    "policies, newest first. Append-only: charges outlive the models, runs and jobs that incurred them (their "
    "references become null; the label says what it was), and nothing here can be changed or deleted."))
class UsageChargeViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    serializer_class = UsageChargeSerializer
    filterset_class = UsageChargeFilter

    def get_queryset(self):
        return selectors.charges_for_user(self.request.user)


class DLModelFilter(VisibleRowsFilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains")
    min_gflops = django_filters.NumberFilter(method="filter_min_gflops")

    class Meta:
        model = DLModel
        fields = ["team", "source", "name", "opset"]

    def filter_min_gflops(self, queryset, name, value):
        return queryset.filter(total_flops__gte=int(value * 1_000_000_000))  # value is a Decimal


@extend_schema_view(
    list=extend_schema(summary="Models of your teams", parameters=[ARCHIVED_PARAMETER]),
    retrieve=extend_schema(summary="A model with its graph features"),
    destroy=extend_schema(summary="Archive a model (owners and members)",
                          description="The model is hidden from lists (`?archived=true` lists archived ones) and "
                          "can be restored; its file, runs, jobs and the team's usage are kept. Only staff can "
                          "delete a model for good, in the admin."),
)
class DLModelViewSet(RowListMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin,
                     viewsets.GenericViewSet):
    serializer_class = DLModelSerializer
    permission_classes = [permissions.IsAuthenticated, IsTeamMemberWriteOrReadOnly]
    filterset_class = DLModelFilter
    parser_classes = [parsers.MultiPartParser, parsers.FormParser, parsers.JSONParser]
    search_fields = ["name", "description"]
    ordering_fields = ["name", "created_at", "total_flops", "param_count"]
    ordering = ["-created_at"]
    query_params = {"list": ["archived"]}  # read by get_queryset (core.api.strict)
    list_model, list_values, list_related = DLModel, MODEL_LIST_VALUES, {"team": Team}

    def get_throttles(self):
        return [*super().get_throttles(), UploadThrottle()]

    def get_queryset(self):
        # a detail route finds archived models too (to read or restore them); lists show one kind
        archived = None if getattr(self, "detail", False) else archived_param(self.request)
        qs = selectors.models_for_user(self.request.user, archived=archived)
        if getattr(self, "detail", False):  # the object permission reads the caller's role from the same query
            qs = with_caller_role(qs, self.request.user)
        return qs

    @extend_schema(
        request={"multipart/form-data": DLModelUploadSerializer},
        responses={201: DLModelSerializer, 202: DLModelSerializer},
        summary="Upload and validate an ONNX model",
        description="The file is validated (size cap, onnx.checker, shape inference, memory caps, TVM Relax "
        "import, tuning-task count) and its graph features computed. A file up to ONNX_ASYNC_VALIDATION_BYTES "
        "is validated in the request: 201 (`state` ready), or a 400 naming the problem (`code` is e.g. "
        "`not_protobuf`, `truncated`, `unsupported_op`, `too_large`) and nothing is stored. A larger file "
        "gets 202 with `state` validating: poll the model until it is `ready`, or `invalid` with "
        "`error_code`/`error_message` (its file is then deleted; delete the model to reuse the name).",
        examples=[OpenApiExample("Bad file", response_only=True, status_codes=["400"], value={
            "detail": "The file is not an ONNX protobuf.", "code": "not_protobuf",
            "errors": {"file": ["The file is not an ONNX protobuf."]}})],
    )
    def create(self, request, *args, **kwargs):
        if body_over(request, settings.ONNX_MAX_UPLOAD_BYTES):  # refused before the body is read
            raise OnnxValidationError("too_large", f"The upload is {declared_length(request) / 1e6:.1f} MB; the "
                                      f"limit is {settings.ONNX_MAX_UPLOAD_BYTES / 1e6:.1f} MB.")
        body = DLModelUploadSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        upload = body.validated_data["file"]
        data = services.read_upload(upload)
        model = services.submit_model(
            team=body.validated_data["team"], name=body.validated_data["name"],
            description=body.validated_data.get("description", ""), data=data,
            filename=upload.name, actor=request.user,
        )
        validating = model.state == DLModel.State.VALIDATING
        return Response(self.get_serializer(model).data,
                        status=status.HTTP_202_ACCEPTED if validating else status.HTTP_201_CREATED)

    def perform_destroy(self, instance):
        services.archive_model(actor=self.request.user, model=instance)

    @extend_schema(request=None, responses=DLModelSerializer, summary="Restore an archived model")
    @action(detail=True, methods=["post"])
    def restore(self, request, pk=None):
        model = services.restore_model(actor=request.user, model=self.get_object())
        return Response(self.get_serializer(model).data)

    @extend_schema(responses={(200, "application/octet-stream"): bytes}, summary="Download the ONNX file")
    @action(detail=True, methods=["get"])
    def download(self, request, pk=None):
        model = self.get_object()
        services.require_ready(model)
        return FileResponse(model.file.open("rb"), as_attachment=True, filename=f"{model.name}.onnx",
                            content_type="application/octet-stream")


@extend_schema_view(
    list=extend_schema(summary="Your API tokens"),
    create=extend_schema(request=ApiTokenCreateSerializer, responses={201: ApiTokenCreatedSerializer},
                         summary="Create a token (key shown once; session login only, never with a token)",
                         description="`password` is your account password, typed again: missing is a 400, "
                         "wrong is a 403, and wrong ones count towards the sign-in lockout (a 429 while "
                         "locked)."),
    destroy=extend_schema(summary="Revoke a token"),
)
class ApiTokenViewSet(mixins.ListModelMixin, mixins.CreateModelMixin, mixins.RetrieveModelMixin,
                      mixins.DestroyModelMixin, viewsets.GenericViewSet):
    serializer_class = ApiTokenSerializer
    queryset = ApiToken.objects.none()
    filterset_fields = []

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return ApiToken.objects.none()
        return ApiToken.objects.filter(user=self.request.user)

    def get_throttles(self):
        return [*super().get_throttles(), TokenCreateThrottle()]

    def create(self, request, *args, **kwargs):
        if isinstance(request.auth, ApiToken):  # a leaked token must not be able to mint children
            raise exceptions.PermissionDenied(
                "Creating API tokens needs a session login (sign in with your password), not an API token.")
        body = ApiTokenCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        issued = services.create_api_token_confirmed(user=request.user, name=body.validated_data["name"],
                                                     password=body.validated_data["password"])
        data = ApiTokenSerializer(issued.token).data | {"key": issued.key}
        return Response(data, status=status.HTTP_201_CREATED)

    def destroy(self, request, *args, **kwargs):
        token = services.revoke_api_token(user=request.user, token=self.get_object())
        return Response(ApiTokenSerializer(token).data, status=status.HTTP_200_OK)
