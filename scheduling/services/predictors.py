"""GPU profiles and the Horus predictor: storing profile records, training, activating and loading
predictor versions, and predicting a job's GPU utilization and memory."""
from __future__ import annotations

import json
import os
import uuid
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.files.base import ContentFile
from django.db import transaction
from django.db.models import Max
from django.utils import timezone
from django_celery_results.models import TaskResult

from core.exceptions import ServiceError, ServiceUnavailable
from core.fieldtext import fit_to_field
from core.models import DLModel

from .. import adapters, selectors
from ..models import GpuProfile, PredictorVersion
from .messages import TRAIN_PREDICTOR, send_with_id_after_commit
from .staff import acting_user, require_staff

_PROFILE_FIELDS = ("features", "util_pct", "peak_mem_mb", "power_w", "meta", "dl_model")

model_features = adapters.model_features  # cached graph features of a registered model at a batch size


def _profile_key(model_name: str, batch_size: int, gpu_model: str, source: str) -> tuple[str, int, str, str]:
    return (fit_to_field(GpuProfile, "model_name", model_name), int(batch_size),
            fit_to_field(GpuProfile, "gpu_model", gpu_model), fit_to_field(GpuProfile, "source", source))


def _upsert_profiles(records: list[adapters.ProfileRecord], dl_model: DLModel | None = None) -> list[GpuProfile]:
    """Insert or update profile rows keyed by (model, batch size, GPU model, source), in bulk."""
    wanted = {_profile_key(r.model, r.batch_size, r.gpu_model, r.source): r for r in records}
    existing = {_profile_key(p.model_name, p.batch_size, p.gpu_model, p.source): p
                for p in GpuProfile.objects.filter(model_name__in={k[0] for k in wanted},
                                                   source__in={k[3] for k in wanted})}
    create, update = [], []
    for k, r in wanted.items():
        values = {**adapters.profile_row_values(r), "dl_model": dl_model}
        if k in existing:
            p = existing[k]
            for f, v in values.items():
                setattr(p, f, v)
            update.append(p)
        else:
            create.append(GpuProfile(model_name=k[0], batch_size=k[1], gpu_model=k[2], source=k[3], **values))
    GpuProfile.objects.bulk_create(create, batch_size=500)
    GpuProfile.objects.bulk_update(update, list(_PROFILE_FIELDS), batch_size=500)
    return [*create, *update]


@transaction.atomic
def load_seed_profiles(*, path: str | os.PathLike[str] | None = None) -> int:
    """Store the shipped profile set (synthetic unless the file says otherwise); idempotent."""
    records = adapters.seed_profile_records(path)
    _upsert_profiles(records)
    return len(records)


@transaction.atomic
def record_profiles(*, records: list[adapters.ProfileRecord], dl_model: DLModel | None = None) -> list[GpuProfile]:
    """Store measured profile records (from `profile_gpu`)."""
    return _upsert_profiles(records, dl_model)


def training_records() -> list[adapters.ProfileRecord]:
    """Profiles in the database; the shipped seed set is loaded first when there are none."""
    if not selectors.has_profiles():
        load_seed_profiles()
    return selectors.profile_records()


def evaluate_predictor(*, seed: int = 0) -> dict[str, Any]:
    """Leave-one-model-family-out evaluation of the predictor and two baselines on the stored (or seed)
    profiles; stores nothing (``horus.predictor_eval``)."""
    try:
        return adapters.evaluate_utilization_predictor(training_records(), seed=seed)
    except ValueError as exc:
        raise ServiceError(f"Cannot evaluate the predictor: {exc}", code="not_enough_profiles") from None


format_predictor_evaluation = adapters.format_predictor_evaluation


def train_predictor(
    *,
    actor: AbstractBaseUser | None = None,
    k_folds: int = 5,
    seed: int = 0,
    activate: bool = True,
    xgb_params: dict[str, Any] | None = None,
) -> PredictorVersion:
    """Train the Horus predictor on every stored profile, store it with its k-fold RMSLE/MAE, activate it."""
    require_staff(actor, "train predictors")
    _check_k_folds(k_folds)
    trained, data = adapters.train_utilization_predictor(training_records(), k_folds=k_folds, seed=seed,
                                                         xgb_params=xgb_params)
    with transaction.atomic():
        # Serialize version numbering (PostgreSQL advisory-free: lock the current rows).
        list(PredictorVersion.objects.select_for_update().values_list("pk", flat=True))
        number = (PredictorVersion.objects.aggregate(m=Max("version"))["m"] or 0) + 1
        pv = PredictorVersion(version=number, metrics=trained.metrics, params=trained.params,
                              sources=trained.sources, n_records=trained.n_records, trained_by=acting_user(actor))
        pv.file.save(f"predictor-v{number}.json", ContentFile(data), save=False)
        if activate:
            PredictorVersion.objects.filter(active=True).update(active=False)
            pv.active = True
        pv.save()
    adapters.remember_predictor(pv, trained)
    return pv


def _check_k_folds(k_folds: int) -> None:
    if isinstance(k_folds, bool) or not isinstance(k_folds, int) or not 2 <= k_folds <= 20:
        raise ServiceError("k_folds must be between 2 and 20.", field="k_folds")


# A training still queued or running after this long is presumed lost (its task's hard limit is 1900 s), so
# a new first job may queue another.
TRAINING_IN_FLIGHT_S = 3600.0


def request_predictor_training(
    *,
    actor: AbstractBaseUser | None,
    k_folds: int = 5,
    seed: int = 0,
    activate: bool = True,
    unless_in_flight: bool = False,
) -> selectors.PredictorTraining | None:
    """Queue a training (the ``scheduling.train_predictor`` task: seconds to minutes of XGBoost, never inside
    a request) and return its state, polled by task id (its django-celery-results row). ``actor`` None is the
    platform (a GPU job found no predictor); with ``unless_in_flight`` nothing is queued while another
    training is queued or running (None is returned). With the task broker down the training is recorded
    as failed, saying so."""
    require_staff(actor, "train predictors")
    _check_k_folds(k_folds)
    if unless_in_flight and selectors.predictor_training_in_flight(within_s=TRAINING_IN_FLIGHT_S):
        return None
    task_id = str(uuid.uuid4())
    kwargs = {"k_folds": k_folds, "seed": seed, "activate": bool(activate),
              "requested_by": actor.pk if actor is not None and actor.is_authenticated else None}
    TaskResult.objects.create(task_id=task_id, task_name=TRAIN_PREDICTOR, task_kwargs=json.dumps(kwargs),
                              status="PENDING")

    def broker_down(exc: BaseException) -> None:
        TaskResult.objects.filter(task_id=task_id, status="PENDING").update(
            status="FAILURE", date_done=timezone.now(), content_type="application/json", result=json.dumps(
                {"exc_type": "BrokerUnavailable", "exc_module": "builtins",
                 "exc_message": [f"the task broker is unreachable ({exc}); nothing was trained, request it again"]}))

    send_with_id_after_commit(TRAIN_PREDICTOR, task_id=task_id, kwargs=kwargs, what=f"predictor training {task_id}",
                              on_error=broker_down)
    return selectors.predictor_training(task_id)


def start_predictor_training(*, actor: AbstractBaseUser, k_folds: int = 5, seed: int = 0,
                             activate: bool = True) -> selectors.PredictorTraining:
    """A staff request to train: queued (202 to poll), or ServiceUnavailable when it cannot be queued now."""
    training = request_predictor_training(actor=actor, k_folds=k_folds, seed=seed, activate=activate)
    if training.state == "failed":
        raise ServiceUnavailable(f"The predictor training could not be queued: {training.error}",
                                 code="broker_unavailable")
    return training


def run_requested_training(*, k_folds: int, seed: int, activate: bool,
                           requested_by: int | None) -> PredictorVersion:
    """The task's body: train as the staff member who asked (their right is checked again), or as the
    platform when nobody did."""
    actor = get_user_model().objects.filter(pk=requested_by).first() if requested_by is not None else None
    if requested_by is not None and actor is None:
        raise ServiceError("The user who requested this training no longer exists.", code="requester_gone")
    return train_predictor(actor=actor, k_folds=k_folds, seed=seed, activate=activate)


@transaction.atomic
def activate_predictor(*, actor: AbstractBaseUser | None, version: PredictorVersion) -> PredictorVersion:
    require_staff(actor, "activate predictors")
    PredictorVersion.objects.select_for_update().filter(active=True).update(active=False)
    PredictorVersion.objects.filter(pk=version.pk).update(active=True)
    version.refresh_from_db()
    return version


def load_predictor(pv: PredictorVersion) -> adapters.TrainedPredictor:
    return adapters.load_trained_predictor(pv)


def ensure_active_predictor() -> tuple[PredictorVersion, adapters.TrainedPredictor]:
    """The active predictor; one is trained from the stored (or seed) profiles when none exists. Trains:
    for tasks and commands only (a simulation), never a request (predict_job does not train)."""
    pv = selectors.active_predictor_version()
    if pv is None:
        pv = train_predictor(actor=None)
    return pv, load_predictor(pv)


def predict_job(*, model: DLModel, batch_size: int, gpu_model: str | None = None,
                train_if_missing: bool = True) -> dict[str, Any]:
    """Predicted GPU utilization (%) and peak memory (MB) of the model at ``batch_size``: by the active
    predictor, else the last trained one, else (none trained yet) by the analytic roofline estimate
    (``method`` "analytic", ``predictor_version`` None), and then, with ``train_if_missing``, a training is
    queued so that later jobs get the predictor. Never trains here: this runs inside requests."""
    gpu_model = gpu_model or selectors.fleet_gpu_model() or "V100"
    features = model_features(model, batch_size)
    pv = selectors.active_predictor_version() or selectors.latest_predictor_version()
    if pv is None:
        if train_if_missing:
            request_predictor_training(actor=None, unless_in_flight=True)
        util, mem = adapters.analytic_prediction(features, gpu_model)
        method = "analytic"
    else:
        util, mem = load_predictor(pv).predict(features, gpu_model=gpu_model)
        method = "predictor"
    return {"util_pct": round(float(util), 3), "mem_mb": round(float(mem), 1), "gpu_model": gpu_model,
            "predictor_version": pv, "method": method}
