"""Writes for teams, memberships, tokens, quotas and the model registry.

Keyword-only, typed, atomic: views, admin, commands and tasks call these.
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.files.base import ContentFile
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify

from core.onnx_models.errors import OnnxValidationError

from .exceptions import ConflictError, NotFound, PermissionDenied, ServiceError
from .models import ENERGY_LIMITS, ApiToken, DLModel, EnergySettings, Membership, Quota, Team, TeamInvitation

if TYPE_CHECKING:
    from core.onnx_models.validate import ValidatedModel

log = logging.getLogger(__name__)


# --- Teams and memberships -----------------------------------------------------

def require_team_creator(actor: AbstractBaseUser | None) -> None:
    """Teams are created by staff (or the platform itself, ``actor=None``: commands, bootstrap).

    Every team gets its own quota, so teams anyone could create would multiply every quota.
    """
    if actor is not None and not actor.is_staff:
        raise PermissionDenied("Only staff can create teams (each team gets its own quotas); ask an "
                               "administrator to create one for you.")


@transaction.atomic
def create_team(*, name: str, owner: AbstractBaseUser, description: str = "",
                actor: AbstractBaseUser | None = None) -> Team:
    """A team with the default quota, ``owner`` its first owner. ``actor`` must be staff (None = the platform)."""
    require_team_creator(actor)
    name = name.strip()
    if not name:
        raise ServiceError("A team needs a name.", field="name")
    slug = slugify(name)[:100] or "team"
    if Team.objects.filter(name__iexact=name).exists() or Team.objects.filter(slug=slug).exists():
        raise ConflictError(f"A team named '{name}' already exists.", field="name")
    team = Team.objects.create(name=name, slug=slug, description=description)
    Quota.objects.create(team=team)
    Membership.objects.create(team=team, user=owner, role=Membership.Role.OWNER)
    return team


TEAM_FIELDS = ("name", "description", "grid_intensity_g_per_kwh")


@transaction.atomic
def update_team(*, actor: AbstractBaseUser, team: Team, **fields) -> Team:
    """Owners rename or describe their team; only staff set its grid intensity (its carbon figures),
    within ENERGY_LIMITS, or clear it (None: the platform default)."""
    unknown = set(fields) - set(TEAM_FIELDS)
    if unknown:
        raise ServiceError(f"Unknown team field(s): {', '.join(sorted(unknown))}.")
    if "grid_intensity_g_per_kwh" in fields:
        if not actor.is_staff:
            raise PermissionDenied("Only staff can set a team's grid intensity (it sets the team's carbon figures).")
        if fields["grid_intensity_g_per_kwh"] is not None:
            _check_energy_value("grid_intensity_g_per_kwh", fields["grid_intensity_g_per_kwh"])
    if set(fields) - {"grid_intensity_g_per_kwh"} and not actor.is_staff and not Membership.objects.filter(
            team=team, user=actor, role=Membership.Role.OWNER).exists():
        raise PermissionDenied("Only the team's owners can change it.")
    for name, value in fields.items():
        setattr(team, name, value)
    team.save(update_fields=list(fields) or None)
    return team


def _require_owner(*, actor: AbstractBaseUser, team: Team) -> None:
    if actor.is_staff:
        return
    if not Membership.objects.filter(team=team, user=actor, role=Membership.Role.OWNER).exists():
        raise PermissionDenied("Only the team's owners can manage its members.")


@transaction.atomic
def add_member(*, actor: AbstractBaseUser, team: Team, user: AbstractBaseUser, role: str) -> Membership:
    """Staff (admin, commands) put a user in a team directly; owners invite (invite_member)."""
    if not actor.is_staff:
        raise PermissionDenied("Owners invite users (POST /api/invitations/); the user joins by accepting.")
    _check_role(role)
    try:
        with transaction.atomic():
            return Membership.objects.create(team=team, user=user, role=role)
    except IntegrityError:
        raise ConflictError(f"{user} is already a member of {team}.", field="user") from None


def _check_role(role: str) -> None:
    if role not in Membership.Role.values:
        raise ServiceError(f"Unknown role '{role}'; use one of {', '.join(Membership.Role.values)}.", field="role")


@transaction.atomic
def invite_member(*, actor: AbstractBaseUser, team: Team, username: str, role: str) -> TeamInvitation | None:
    """An owner invites a user by name. The outcome is not told to the caller: an unknown or inactive
    name, or a user already in the team, makes no invitation but looks the same (None here, the same
    202 at the API), so invitations cannot be used to find out who has an account."""
    _require_owner(actor=actor, team=team)
    _check_role(role)
    User = get_user_model()
    user = User.objects.filter(**{User.USERNAME_FIELD: (username or "").strip()}, is_active=True).first()
    if user is None or Membership.objects.filter(team=team, user=user).exists():
        return None
    invitation, _ = TeamInvitation.objects.update_or_create(
        team=team, user=user, defaults={"role": role, "invited_by": actor})
    return invitation


@transaction.atomic
def accept_invitation(*, actor: AbstractBaseUser, invitation: TeamInvitation) -> Membership:
    invitation = _own_invitation(actor, invitation)
    inviter = invitation.invited_by
    if inviter is None or not (inviter.is_staff or Membership.objects.filter(
            team_id=invitation.team_id, user=inviter, role=Membership.Role.OWNER).exists()):
        # only the invitee sees an invitation, so the team cannot revoke it: it lapses with its
        # inviter's ownership (an owner being removed cannot leave a way back in behind them)
        raise NotFound("No such invitation.")
    membership, _ = Membership.objects.get_or_create(team=invitation.team, user=actor,
                                                     defaults={"role": invitation.role})
    invitation.delete()
    return membership


@transaction.atomic
def decline_invitation(*, actor: AbstractBaseUser, invitation: TeamInvitation) -> None:
    _own_invitation(actor, invitation).delete()


def _own_invitation(actor: AbstractBaseUser, invitation: TeamInvitation) -> TeamInvitation:
    row = TeamInvitation.objects.select_for_update().filter(pk=invitation.pk, user=actor).first()
    if row is None:
        raise NotFound("No such invitation.")
    return row


def _ensure_an_owner_remains(team: Team, excluding: Membership,
                             message: str = "A team must keep at least one owner.") -> None:
    others = Membership.objects.filter(team=team, role=Membership.Role.OWNER).exclude(pk=excluding.pk)
    if not others.exists():
        raise ConflictError(message)


@transaction.atomic
def change_member_role(*, actor: AbstractBaseUser, membership: Membership, role: str) -> Membership:
    membership = Membership.objects.select_for_update().get(pk=membership.pk)
    _require_owner(actor=actor, team=membership.team)
    _check_role(role)
    if membership.role == Membership.Role.OWNER and role != Membership.Role.OWNER:
        _ensure_an_owner_remains(membership.team, membership)
    membership.role = role
    membership.save(update_fields=["role"])
    return membership


@transaction.atomic
def remove_member(*, actor: AbstractBaseUser, membership: Membership) -> None:
    """Owners remove members; any member removes themself (leaves), except the last owner."""
    membership = Membership.objects.select_for_update().select_related("team").get(pk=membership.pk)
    leaving = membership.user_id == actor.pk
    if not leaving:
        _require_owner(actor=actor, team=membership.team)
    if membership.role == Membership.Role.OWNER:
        _ensure_an_owner_remains(membership.team, membership, **({"message": (
            "You are the team's last owner: make another member an owner before leaving.")} if leaving else {}))
    membership.delete()


# --- Quotas --------------------------------------------------------------------

QUOTA_FIELDS = ("max_concurrent_runs", "tuning_trials_per_month", "gpu_hours_per_month", "energy_kwh_per_month",
                "max_concurrent_simulations", "max_simulation_job_gpus")


@transaction.atomic
def update_quota(*, actor: AbstractBaseUser, quota: Quota, **limits) -> Quota:
    if not actor.is_staff:
        raise PermissionDenied("Only staff can change quotas.")
    unknown = set(limits) - set(QUOTA_FIELDS)
    if unknown:
        raise ServiceError(f"Unknown quota field(s): {', '.join(sorted(unknown))}.")
    for name, value in limits.items():
        if value is None or value < 0:
            raise ServiceError(f"{name} must be a non-negative number.", field=name)
        setattr(quota, name, value)
    quota.save()
    return quota


def lock_team_quota(team_id: int) -> Quota:
    """Serialize quota checks for one team until the caller's transaction ends.

    PostgreSQL: a row lock (SELECT ... FOR UPDATE). SQLite ignores FOR UPDATE,
    so we also write the row: that takes SQLite's database write lock, and a
    concurrent checker waits at its own write until we commit.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("lock_team_quota must be called inside transaction.atomic()")
    quota, _ = Quota.objects.get_or_create(team_id=team_id)
    quota = Quota.objects.select_for_update().get(pk=quota.pk)
    Quota.objects.filter(pk=quota.pk).update(updated_at=timezone.now())
    return quota


# --- Energy model ----------------------------------------------------------------

def ensure_energy_settings() -> EnergySettings:
    """The settings row, created from the ENERGY_* defaults the first time (the admin edits it)."""
    from .selectors import energy_defaults

    row, _ = EnergySettings.objects.get_or_create(pk=EnergySettings.SINGLETON_PK, defaults=energy_defaults())
    return row


def _check_energy_value(name: str, value) -> None:
    low, high = ENERGY_LIMITS[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low <= value <= high):
        raise ServiceError(f"{name} must be a number from {low:g} to {high:g}.", field=name)


@transaction.atomic
def update_energy_settings(*, actor: AbstractBaseUser, **values) -> EnergySettings:
    """Staff change the platform's energy model; new runs use it, finished runs keep theirs."""
    if not actor.is_staff:
        raise PermissionDenied("Only staff can change the energy settings.")
    unknown = set(values) - set(ENERGY_LIMITS)
    if unknown:
        raise ServiceError(f"Unknown energy setting(s): {', '.join(sorted(unknown))}.")
    row = ensure_energy_settings()
    row = EnergySettings.objects.select_for_update().get(pk=row.pk)
    for name, value in values.items():
        _check_energy_value(name, value)
        setattr(row, name, float(value))
    row.updated_by = actor
    row.save()
    log.info("energy settings changed by %s: %s", actor, values)
    return row


# --- API tokens ----------------------------------------------------------------

@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    key: str  # shown once, never stored


def create_api_token(*, user: AbstractBaseUser, name: str) -> IssuedToken:
    name = (name or "").strip() or "default"
    key = ApiToken.generate_key()
    token = ApiToken.objects.create(
        user=user, name=name[:100], prefix=key[: ApiToken.PREFIX_LEN], key_hash=ApiToken.hash_key(key)
    )
    return IssuedToken(token=token, key=key)


def revoke_api_token(*, user: AbstractBaseUser, token: ApiToken) -> ApiToken:
    if token.user_id != user.pk and not user.is_staff:
        raise PermissionDenied("You can only revoke your own tokens.")
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token


# --- Model registry ------------------------------------------------------------

def _require_writer(*, actor: AbstractBaseUser | None, team: Team) -> None:
    if actor is None or actor.is_staff:
        return
    if not Membership.objects.filter(
        team=team, user=actor, role__in=[Membership.Role.OWNER, Membership.Role.MEMBER]
    ).exists():
        raise PermissionDenied("Viewers cannot change this team's models.")


def validate_model_bytes(*, data: bytes, filename: str) -> "ValidatedModel":
    """Run the registry's validation with the platform's limits; raises OnnxValidationError."""
    # Imported here: validation pulls in onnx (and TVM for task counting), which
    # web processes should only pay for when a model is actually uploaded.
    from core.onnx_models.validate import validate_onnx_bytes

    return validate_onnx_bytes(
        data,
        filename=filename,
        max_bytes=settings.ONNX_MAX_UPLOAD_BYTES,
        max_gflops=settings.ONNX_MAX_GFLOPS,
        max_tensor_elements=settings.ONNX_MAX_TENSOR_ELEMENTS,
        max_activation_bytes=settings.ONNX_MAX_ACTIVATION_BYTES,
        count_tasks=settings.ONNX_COUNT_TUNING_TASKS,
        target=settings.DEFAULT_TUNING_TARGET,
    )


def read_upload(uploaded, *, max_bytes: int | None = None) -> bytes:
    """Read an uploaded file, refusing it before reading when it is over the cap."""
    max_bytes = max_bytes or settings.ONNX_MAX_UPLOAD_BYTES
    size = getattr(uploaded, "size", None)
    if size is not None and size > max_bytes:
        raise OnnxValidationError(
            "too_large",
            f"The file is {size / 1e6:.1f} MB; the limit is {max_bytes / 1e6:.1f} MB.",
        )
    chunks, total = [], 0
    for chunk in uploaded.chunks() if hasattr(uploaded, "chunks") else [uploaded.read()]:
        total += len(chunk)
        if total > max_bytes:
            raise OnnxValidationError(
                "too_large", f"The file is over the {max_bytes / 1e6:.1f} MB limit."
            )
        chunks.append(chunk)
    return b"".join(chunks)


def _check_new_model(*, actor: AbstractBaseUser | None, team: Team, name: str) -> str:
    _require_writer(actor=actor, team=team)
    name = (name or "").strip()
    if not name:
        raise ServiceError("A model needs a name.", field="name")
    if len(name) > 100:
        raise ServiceError("Model names are at most 100 characters.", field="name")
    if DLModel.objects.filter(team=team, name=name).exists():
        raise ConflictError(f"Team {team} already has a model named '{name}'.", field="name")
    return name


def _apply_validated(model: DLModel, validated: "ValidatedModel") -> None:
    """Copy what validation found (inputs, outputs, graph features, tuning tasks) onto the row."""
    features = validated.features
    model.opset, model.ir_version, model.producer = validated.opset, validated.ir_version, validated.producer[:200]
    model.inputs, model.outputs, model.batch_size = validated.inputs, validated.outputs, validated.batch_size
    model.total_flops, model.param_count = features.total_flops, features.param_count
    model.activation_bytes, model.conv_count = features.activation_bytes, features.conv_count
    model.linear_count, model.activation_count = features.linear_count, features.activation_count
    model.other_count, model.op_histogram = features.other_count, dict(features.op_histogram)
    model.features = features.to_dict()
    model.num_tuning_tasks, model.tuning_task_names = validated.num_tuning_tasks, list(validated.task_names or [])


_PENDING_FEATURES = dict(opset=0, ir_version=0, inputs=[], outputs=[], batch_size=0, total_flops=0, param_count=0,
                         activation_bytes=0, conv_count=0, linear_count=0, activation_count=0, other_count=0)


def _store(model: DLModel, data: bytes, digest: str) -> DLModel:
    """Save the file and the row together: on any failure neither is left behind."""
    stored_name = None
    try:
        with transaction.atomic():
            model.file.save(f"{digest[:16]}.onnx", ContentFile(data), save=False)
            stored_name = model.file.name
            model.save()
    except IntegrityError:
        _delete_file(stored_name)
        raise ConflictError(f"Team {model.team} already has a model named '{model.name}'.", field="name") from None
    except BaseException:
        _delete_file(stored_name)
        raise
    return model


def register_model(
    *,
    team: Team,
    name: str,
    data: bytes,
    filename: str,
    actor: AbstractBaseUser | None = None,
    description: str = "",
    source: str = DLModel.Source.UPLOAD,
    validated: "ValidatedModel | None" = None,
) -> DLModel:
    """Validate an ONNX file and store it with its features (state ready). Nothing is stored on failure."""
    name = _check_new_model(actor=actor, team=team, name=name)
    validated = validated or validate_model_bytes(data=data, filename=filename)
    digest = hashlib.sha256(data).hexdigest()
    model = DLModel(
        team=team, name=name, description=description, source=source, file_size=len(data), sha256=digest,
        state=DLModel.State.READY, created_by=actor if actor is not None and actor.is_authenticated else None,
    )
    _apply_validated(model, validated)
    return _store(model, data, digest)


def submit_model(
    *,
    team: Team,
    name: str,
    data: bytes,
    filename: str,
    actor: AbstractBaseUser | None = None,
    description: str = "",
) -> DLModel:
    """An upload from the API or the dashboard. Up to ONNX_ASYNC_VALIDATION_BYTES it is validated here
    (register_model: ready, or refused with nothing stored); a larger file gets only the cheap checks
    here (name, extension, size) and is stored as state ``validating``: the ``core.validate_model`` task
    (default queue) then makes it ``ready``, or ``invalid`` with the error (its file deleted)."""
    if len(data) <= settings.ONNX_ASYNC_VALIDATION_BYTES:
        return register_model(team=team, name=name, data=data, filename=filename, actor=actor,
                              description=description)
    from core.onnx_models.validate import check_upload_basics

    name = _check_new_model(actor=actor, team=team, name=name)
    check_upload_basics(filename=filename, size=len(data), max_bytes=settings.ONNX_MAX_UPLOAD_BYTES)
    digest = hashlib.sha256(data).hexdigest()
    model = DLModel(
        team=team, name=name, description=description, source=DLModel.Source.UPLOAD, file_size=len(data),
        sha256=digest, state=DLModel.State.VALIDATING, **_PENDING_FEATURES,
        created_by=actor if actor is not None and actor.is_authenticated else None,
    )
    with transaction.atomic():
        _store(model, data, digest)
        from core.tasks import validate_model

        pk = model.pk
        transaction.on_commit(lambda: validate_model.delay(pk))
    return model


def finish_model_validation(*, model_id: int) -> DLModel | None:
    """Validate a ``validating`` model's stored file: ready with its features, or invalid with the error
    and its file deleted. Idempotent: a model in any other state is left as it is."""
    model = DLModel.objects.filter(pk=model_id, state=DLModel.State.VALIDATING).first()
    if model is None:
        return None
    try:
        with model.file.open("rb") as fh:
            data = fh.read()
        validated = validate_model_bytes(data=data, filename=model.file.name)
    except OnnxValidationError as exc:
        return _mark_invalid(model_id, exc.code, exc.message)
    except Exception as exc:  # never leave it validating for good
        log.exception("validating model %s failed", model_id)
        _mark_invalid(model_id, "validation_failed",
                      f"Validation failed with an internal error ({type(exc).__name__}); "
                      "upload the model again, or ask an administrator.")
        raise
    with transaction.atomic():
        model = DLModel.objects.select_for_update().filter(pk=model_id, state=DLModel.State.VALIDATING).first()
        if model is None:  # deleted meanwhile
            return None
        _apply_validated(model, validated)
        model.state = DLModel.State.READY
        model.save()
    return model


@transaction.atomic
def _mark_invalid(model_id: int, code: str, message: str) -> DLModel | None:
    model = DLModel.objects.select_for_update().filter(pk=model_id, state=DLModel.State.VALIDATING).first()
    if model is None:
        return None
    name = model.file.name
    model.state, model.error_code, model.error_message, model.file = DLModel.State.INVALID, code, message, ""
    model.save(update_fields=["state", "error_code", "error_message", "file"])
    transaction.on_commit(lambda: _delete_file(name))
    return model


def require_ready(model: DLModel) -> None:
    """Refuse work on a model that is still being validated or was refused."""
    if model.state == DLModel.State.VALIDATING:
        raise ConflictError(f"Model '{model.name}' is still being validated; try again when it is ready.",
                            code="model_not_ready", field="model")
    if model.state == DLModel.State.INVALID:
        raise ServiceError(f"Model '{model.name}' was refused: {model.error_message}", code="model_invalid",
                           field="model")


def _delete_file(name: str | None) -> None:
    if not name:
        return
    from django.core.files.storage import default_storage

    # Another model of the team may share the same content (same sha256 path).
    if DLModel.objects.filter(file=name).exists():
        return
    try:
        default_storage.delete(name)
    except OSError:  # pragma: no cover - best effort cleanup
        log.warning("could not delete stored file %s", name)


@transaction.atomic
def delete_model(*, actor: AbstractBaseUser, model: DLModel) -> None:
    _require_writer(actor=actor, team=model.team)
    name = model.file.name
    model.delete()
    transaction.on_commit(lambda: _delete_file(name))
