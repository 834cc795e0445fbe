from __future__ import annotations

from django.contrib.auth import get_user_model
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core import selectors
from core.api.fast import FastRepresentationMixin
from core.models import ApiToken, DLModel, Membership, Quota, Team, TeamInvitation, UsageCharge

from .strict import RejectUnknownFieldsMixin


TEAM_REF_SCHEMA = {"oneOf": [{"type": "integer"}, {"type": "string"}],
                   "description": "A team's id or its slug (see /api/me/ or /api/teams/)."}


@extend_schema_field(TEAM_REF_SCHEMA)
class SlugOrIdRelatedField(serializers.PrimaryKeyRelatedField):
    """A related object given by its id or by its slug; answered as its id. A row outside the field's
    queryset and one that does not exist get the same error."""

    slug_field = "slug"

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, (int, str)):
            self.fail("incorrect_type", data_type=type(data).__name__)
        if isinstance(data, int) or data.strip().isdigit():
            return super().to_internal_value(data)
        row = self.get_queryset().filter(**{self.slug_field: data.strip()}).first()
        if row is None:
            self.fail("does_not_exist", pk_value=data)
        return row


@extend_schema_field(TEAM_REF_SCHEMA)
class TeamScopedPrimaryKeyField(SlugOrIdRelatedField):
    """A `team` field (id or slug) that only accepts teams the caller can write to."""

    def get_queryset(self):
        request = self.context.get("request")
        if request is None:
            return Team.objects.none()
        return Team.objects.filter(pk__in=selectors.writable_team_ids(request.user))


class TeamSerializer(RejectUnknownFieldsMixin, serializers.ModelSerializer):
    role = serializers.SerializerMethodField(help_text="The caller's role in this team.")

    class Meta:
        model = Team
        fields = ["id", "name", "slug", "description", "grid_intensity_g_per_kwh", "role", "created_at"]
        read_only_fields = ["slug", "created_at"]

    @extend_schema_field(serializers.ChoiceField(choices=Membership.Role.choices, allow_null=True))
    def get_role(self, team: Team) -> str | None:
        request = self.context.get("request")
        return selectors.role_in_team(request.user, team.pk) if request else None


class TeamCreateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    name = serializers.CharField(max_length=100)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    owner = serializers.SlugRelatedField(
        slug_field="username", queryset=get_user_model().objects.filter(is_active=True), required=False,
        help_text="Username of the team's first owner (default: the caller).")


class MembershipSerializer(RejectUnknownFieldsMixin, serializers.ModelSerializer):
    username = serializers.SlugRelatedField(
        source="user", slug_field="username", queryset=get_user_model().objects.filter(is_active=True)
    )
    team = SlugOrIdRelatedField(queryset=Team.objects.all(), help_text="A team's id or slug.")

    class Meta:
        model = Membership
        fields = ["id", "team", "username", "role", "created_at"]
        read_only_fields = ["created_at"]

    def validate_team(self, team):
        request = self.context["request"]
        if not selectors.teams_for_user(request.user).filter(pk=team.pk).exists():
            raise serializers.ValidationError("No such team.")
        return team


@extend_schema_field(TEAM_REF_SCHEMA)
class MemberTeamField(SlugOrIdRelatedField):
    """A team the caller belongs to; a team that does not exist and another team's id get the same error."""

    default_error_messages = {"does_not_exist": "No such team among yours.",
                              "incorrect_type": "No such team among yours."}

    def get_queryset(self):
        request = self.context.get("request")
        return selectors.teams_for_user(request.user) if request is not None else Team.objects.none()


class TeamInvitationSerializer(serializers.ModelSerializer):
    team_name = serializers.CharField(source="team.name", read_only=True)
    invited_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = TeamInvitation
        fields = ["id", "team", "team_name", "role", "invited_by", "created_at"]
        read_only_fields = fields


class InvitationCreateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    team = MemberTeamField(help_text="A team you own.")
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Membership.Role.choices, default=Membership.Role.MEMBER)


class InvitationSentSerializer(serializers.Serializer):
    detail = serializers.CharField()


class MembershipUpdateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    role = serializers.ChoiceField(choices=Membership.Role.choices)


class QuotaSerializer(RejectUnknownFieldsMixin, serializers.ModelSerializer):
    team_name = serializers.CharField(source="team.name", read_only=True)
    usage = serializers.SerializerMethodField(help_text="Current usage this calendar month (UTC).")

    class Meta:
        model = Quota
        fields = [
            "id", "team", "team_name", "max_concurrent_runs", "tuning_trials_per_month",
            "gpu_hours_per_month", "energy_kwh_per_month", "max_concurrent_simulations", "max_simulation_job_gpus",
            "max_simulation_units", "usage", "updated_at",
        ]
        read_only_fields = ["team", "updated_at"]

    @extend_schema_field(serializers.DictField())
    def get_usage(self, quota: Quota) -> dict:
        return selectors.quota_usage(quota.team_id).as_dict()


class UsageChargeSerializer(serializers.ModelSerializer):
    class Meta:
        model = UsageCharge
        fields = ["id", "team", "kind", "amount", "source", "meter", "grid_intensity_g_per_kwh", "label", "model",
                  "run", "job", "simulation", "created_at"]
        read_only_fields = fields


class DLModelSerializer(FastRepresentationMixin, serializers.ModelSerializer):
    team_name = serializers.CharField(source="team.name", read_only=True)
    gflops = serializers.FloatField(read_only=True)

    class Meta:
        model = DLModel
        fields = [
            "id", "team", "team_name", "name", "description", "source", "state", "error_code", "error_message",
            "file_size", "sha256",
            "opset", "ir_version", "producer", "inputs", "outputs", "batch_size",
            "total_flops", "gflops", "param_count", "activation_bytes", "conv_count", "linear_count",
            "activation_count", "other_count", "op_histogram", "num_tuning_tasks", "tuning_task_names",
            "created_at", "archived_at",
        ]
        read_only_fields = fields


class DLModelUploadSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    team = TeamScopedPrimaryKeyField(help_text="A team you are an owner or member of.")
    name = serializers.CharField(max_length=100)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    file = serializers.FileField(help_text="An .onnx file with static input shapes (batch dim may be symbolic).")


class ApiTokenSerializer(RejectUnknownFieldsMixin, serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
        read_only_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]


class ApiTokenCreateSerializer(RejectUnknownFieldsMixin, serializers.ModelSerializer):
    password = serializers.CharField(write_only=True, trim_whitespace=False, style={"input_type": "password"},
                                     help_text="Your account password, typed again: a token acts as you until "
                                               "it is revoked.")

    class Meta:
        model = ApiToken
        fields = ["name", "password"]


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    key = serializers.CharField(read_only=True, help_text="Shown once; store it now.")

    class Meta(ApiTokenSerializer.Meta):
        fields = ApiTokenSerializer.Meta.fields + ["key"]


class MeTeamSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    slug = serializers.CharField(help_text="Accepted wherever a team is given, like the id.")
    name = serializers.CharField()
    role = serializers.ChoiceField(choices=Membership.Role.choices)


class MeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    username = serializers.CharField()
    is_staff = serializers.BooleanField()
    teams = MeTeamSerializer(many=True)
