"""GPU profiles and the Horus predictor: storing profile records, training, activating and loading
predictor versions, and predicting a job's GPU utilization and memory."""
from __future__ import annotations

import os
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.files.base import ContentFile
from django.db import transaction
from django.db.models import Max

from core.exceptions import ServiceError
from core.fieldtext import fit_to_field
from core.models import DLModel

from .. import adapters, selectors
from ..models import GpuProfile, PredictorVersion
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
    if not 2 <= k_folds <= 20:
        raise ServiceError("k_folds must be between 2 and 20.", field="k_folds")
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
    """The active predictor; one is trained from the stored (or seed) profiles when none exists."""
    pv = selectors.active_predictor_version()
    if pv is None:
        pv = train_predictor(actor=None)
    return pv, load_predictor(pv)


def predict_job(*, model: DLModel, batch_size: int, gpu_model: str | None = None) -> dict[str, Any]:
    """Predicted GPU utilization (%) and peak memory (MB) of the model at ``batch_size``."""
    pv, trained = ensure_active_predictor()
    gpu_model = gpu_model or selectors.fleet_gpu_model() or "V100"
    util, mem = trained.predict(model_features(model, batch_size), gpu_model=gpu_model)
    return {"util_pct": round(float(util), 3), "mem_mb": round(float(mem), 1), "gpu_model": gpu_model,
            "predictor_version": pv}
