"""The DL model registry: an ONNX upload validated (inline, or by the ``core.validate_model`` task for a
large one) and stored with its graph features and tuning tasks; refused, or deleted, with its file."""
from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from core.dispatch import send_on_commit
from core.exceptions import ConflictError, PermissionDenied, ServiceError
from core.filestore import delete_stored_on_commit, save_with_file
from core.fieldtext import fit_to_field
from core.models import DLModel, Team
from core.onnx_models.errors import ERROR_CODES, OnnxValidationError
from core.permissions import require_team_writer
from core.upload_sandbox import SandboxFailure, parse_in_sandbox

if TYPE_CHECKING:
    from core.onnx_models.validate import TaskCounter, ValidatedModel

log = logging.getLogger(__name__)


def task_counter() -> TaskCounter | None:
    """The function that names a model's tuning tasks: settings.ONNX_TASK_COUNTER (a dotted path; the
    tuning engine's by default, so core imports no tuning code), None when counting is switched off."""
    if not settings.ONNX_COUNT_TUNING_TASKS or not settings.ONNX_TASK_COUNTER:
        return None
    return import_string(settings.ONNX_TASK_COUNTER)


def validate_model_bytes(*, data: bytes, filename: str, background: bool = False) -> ValidatedModel:
    """Run the registry's validation with the platform's limits; raises OnnxValidationError.

    Only the name and size are checked here; everything that parses the bytes (onnx's checker and shape
    inference, graph features, TVM's import and task extraction) runs in a sandboxed child process
    (core.upload_sandbox), so a hostile model costs this process nothing. A child stopped at its memory,
    CPU or wall-clock limit (``background``: the Celery task's longer one), or one that crashed, is a
    refusal: ``validation_aborted``."""
    from core.onnx_models.validate import ValidatedModel, check_upload_basics

    check_upload_basics(filename=filename, size=len(data), max_bytes=settings.ONNX_MAX_UPLOAD_BYTES)
    counter = settings.ONNX_TASK_COUNTER if settings.ONNX_COUNT_TUNING_TASKS else ""
    try:
        answer = parse_in_sandbox(
            "core.onnx_models.validate:validate_upload_in_child", data=data, background=background,
            what="validating the model", kwargs=dict(
                filename=filename, max_bytes=settings.ONNX_MAX_UPLOAD_BYTES, max_gflops=settings.ONNX_MAX_GFLOPS,
                max_tensor_elements=settings.ONNX_MAX_TENSOR_ELEMENTS,
                max_activation_bytes=settings.ONNX_MAX_ACTIVATION_BYTES,
                count_tasks=settings.ONNX_COUNT_TUNING_TASKS, target=settings.DEFAULT_TUNING_TARGET,
                task_counter=counter or None))
    except SandboxFailure as exc:
        raise OnnxValidationError(*_stopped_validation(exc, background=background)) from None
    if not isinstance(answer, dict) or "ok" not in answer:
        raise OnnxValidationError("validation_failed", "Validation gave no usable answer; upload the model again, "
                                                       "or ask an administrator.")
    if not answer["ok"]:
        code = str(answer.get("code", ""))
        raise OnnxValidationError(code if code in ERROR_CODES else "validation_failed",
                                  str(answer.get("message", ""))[:2000])
    return ValidatedModel.from_dict(answer["validated"])


def _stopped_validation(exc: SandboxFailure, *, background: bool) -> tuple[str, str]:
    """(code, message) of a validation whose child gave no answer; nothing of the model is stored."""
    wall = "UPLOAD_SANDBOX_ASYNC_WALL_S" if background else "UPLOAD_SANDBOX_WALL_S"
    limit = {
        "memory": f"Validating the model needed more memory than its limit ({settings.UPLOAD_SANDBOX_MEMORY_MB} MB, "
                  "UPLOAD_SANDBOX_MEMORY_MB) and was stopped: importing it builds tensors too large to hold "
                  "(constants folded by TVM, or huge intermediates).",
        "cpu_time": "Validating the model used more CPU time than its limit (UPLOAD_SANDBOX_CPU_S) and was stopped.",
        "wall_clock": f"Validating the model took longer than its limit ({wall}) and was stopped.",
        "crashed": f"The validator crashed on this model ({exc}).",
    }.get(exc.reason)
    if limit is None:
        return "validation_failed", (f"Validation failed with an internal error ({exc.error_type or exc.reason}); "
                                     "upload the model again, or ask an administrator.")
    return "validation_aborted", limit + " The model was refused and nothing was stored; upload a smaller model " \
                                         "or input size, or ask an administrator to raise the limit."


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
    require_team_writer(actor, team.pk, "change this team's models")
    name = (name or "").strip()
    if not name:
        raise ServiceError("A model needs a name.", field="name")
    limit = DLModel._meta.get_field("name").max_length
    if len(name) > limit:
        raise ServiceError(f"Model names are at most {limit} characters.", field="name")
    taken = DLModel.objects.filter(team=team, name=name).values("archived_at").first()
    if taken is not None:
        raise ConflictError(_name_taken(team, name, archived=taken["archived_at"] is not None), field="name")
    return name


def _name_taken(team, name: str, *, archived: bool) -> str:
    if archived:
        return f"Team {team} has an archived model named '{name}': restore it or choose another name."
    return f"Team {team} already has a model named '{name}'."


def _apply_validated(model: DLModel, validated: ValidatedModel) -> None:
    """Copy what validation found (inputs, outputs, graph features, tuning tasks) onto the row."""
    features = validated.features
    model.opset, model.ir_version, model.producer = validated.opset, validated.ir_version, fit_to_field(
        DLModel, "producer", validated.producer)
    model.inputs, model.outputs, model.batch_size = validated.inputs, validated.outputs, validated.batch_size
    model.total_flops, model.param_count = features.total_flops, features.param_count
    model.activation_bytes, model.conv_count = features.activation_bytes, features.conv_count
    model.linear_count, model.activation_count = features.linear_count, features.activation_count
    model.other_count, model.op_histogram = features.other_count, dict(features.op_histogram)
    model.features = features.to_dict()
    model.num_tuning_tasks, model.tuning_task_names = validated.num_tuning_tasks, list(validated.task_names or [])


_PENDING_FEATURES = dict(opset=0, ir_version=0, inputs=[], outputs=[], batch_size=0, total_flops=0, param_count=0,
                         activation_bytes=0, conv_count=0, linear_count=0, activation_count=0, other_count=0)


def _file_in_use(name: str) -> bool:
    # Another model of the team may share the same content (same sha256 path).
    return DLModel.objects.filter(file=name).exists()


def _store(model: DLModel, data: bytes, digest: str) -> DLModel:
    """Save the file and the row together: on any failure neither is left behind."""
    return save_with_file(model, "file", f"{digest[:16]}.onnx", data, still_used=_file_in_use,
                          conflict=_name_taken(model.team, model.name, archived=False))


def register_model(
    *,
    team: Team,
    name: str,
    data: bytes,
    filename: str,
    actor: AbstractBaseUser | None = None,
    description: str = "",
    source: str = DLModel.Source.UPLOAD,
    validated: ValidatedModel | None = None,
    background: bool = False,
) -> DLModel:
    """Validate an ONNX file and store it with its features (state ready). Nothing is stored on failure.
    ``background`` (a command line, not a web request): the sandbox's longer wall-clock limit."""
    name = _check_new_model(actor=actor, team=team, name=name)
    validated = validated or validate_model_bytes(data=data, filename=filename, background=background)
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
        _queue_validation(model)
    return model


def _queue_validation(model: DLModel) -> None:
    """After commit, send ``core.validate_model``; with the broker down, the model is refused at once (so it
    never waits in ``validating`` for a message that does not exist) and the uploader is told to retry."""
    from core.tasks import validate_model  # lazy: tasks import the services (the tasks -> services direction)

    pk = model.pk

    def refuse(exc: BaseException) -> None:
        refused = _mark_invalid(pk, "validation_failed",
                                "The platform could not queue this model's validation (its task broker is "
                                "unavailable); upload the model again in a moment.")
        if refused is not None:
            model.state, model.error_code, model.error_message = refused.state, refused.error_code, \
                refused.error_message

    send_on_commit(lambda: validate_model.delay(pk), what=f"validation of model {pk}", on_error=refuse)


def finish_model_validation(*, model_id: int) -> DLModel | None:
    """Validate a ``validating`` model's stored file (in the upload sandbox, with the background wall-clock
    limit): ready with its features, or invalid with the error and its file deleted. Every outcome is
    final, a crashed or stopped validator included, so the task succeeds and is never redelivered for
    it. Idempotent: a model in any other state is left as it is."""
    model = DLModel.objects.filter(pk=model_id, state=DLModel.State.VALIDATING).first()
    if model is None:
        return None
    try:
        with model.file.open("rb") as fh:
            data = fh.read(settings.ONNX_MAX_UPLOAD_BYTES + 1)
        validated = validate_model_bytes(data=data, filename=model.file.name, background=True)
    except OnnxValidationError as exc:  # a refusal, or a sandbox stopped at a limit: a final verdict
        return _mark_invalid(model_id, exc.code, exc.message)
    except Exception as exc:  # never leave it validating for good, and never make the task fail (redelivery)
        log.exception("validating model %s failed", model_id)
        return _mark_invalid(model_id, "validation_failed",
                             f"Validation failed with an internal error ({type(exc).__name__}); "
                             "upload the model again, or ask an administrator.")
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
    delete_stored_on_commit(name, still_used=_file_in_use)
    return model


def require_ready(model: DLModel) -> None:
    """Refuse work on a model that is still being validated or was refused."""
    if model.state == DLModel.State.VALIDATING:
        raise ConflictError(f"Model '{model.name}' is still being validated; try again when it is ready.",
                            code="model_not_ready", field="model")
    if model.state == DLModel.State.INVALID:
        raise ServiceError(f"Model '{model.name}' was refused: {model.error_message}", code="model_invalid",
                           field="model")


@transaction.atomic
def archive_model(*, actor: AbstractBaseUser, model: DLModel) -> DLModel | None:
    """Hide a model from lists (the API's DELETE). Its file, runs, jobs and the team's usage are kept,
    and a team writer can restore it. A model refused after upload (invalid: no file, never tuned nor
    run) is deleted instead, so its name can be used again for the fixed file; None then."""
    require_team_writer(actor, model.team_id, "change this team's models")
    model = DLModel.objects.select_for_update().get(pk=model.pk)
    if model.state == DLModel.State.INVALID:
        name = model.file.name
        model.delete()
        delete_stored_on_commit(name, still_used=_file_in_use)
        return None
    if model.archived_at is None:
        model.archived_at = timezone.now()
        model.save(update_fields=["archived_at"])
    return model


@transaction.atomic
def restore_model(*, actor: AbstractBaseUser, model: DLModel) -> DLModel:
    """Bring an archived model back into the lists."""
    require_team_writer(actor, model.team_id, "change this team's models")
    model = DLModel.objects.select_for_update().get(pk=model.pk)
    if model.archived_at is None:
        raise ConflictError(f"Model '{model.name}' is not archived.", code="not_archived")
    model.archived_at = None
    model.save(update_fields=["archived_at"])
    return model


@transaction.atomic
def delete_model(*, actor: AbstractBaseUser, model: DLModel) -> None:
    """Delete a model for good, with its runs and jobs (staff only, from the admin). The team's usage
    ledger keeps every charge they incurred, unlinked from the deleted rows."""
    if not actor.is_staff:
        raise PermissionDenied("Only staff can delete a model for good; archive it instead.")
    name = model.file.name
    model.delete()
    delete_stored_on_commit(name, still_used=_file_in_use)
