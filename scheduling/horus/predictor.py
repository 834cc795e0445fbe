"""Horus utilization predictor: XGBoost regressors from graph features to GPU
utilization (%) and peak GPU memory (MB), with no online profiling.

Inputs are ``FEATURE_COLUMNS`` (see :mod:`.features`) followed by
``GPU_COLUMNS`` (datasheet numbers of the GPU model the record was taken on),
so one predictor can serve a heterogeneous fleet. Targets are fitted as
``log1p(y)`` with squared error, i.e. the model minimises RMSLE, the error the
Horus paper reports (0.154 on its profile set).

Error is estimated with k-fold cross-validation. With ``group_by_model=True``
(the default) all records of one model fall in the same fold, so every
held-out prediction is for a model the regressor has never seen - the honest
figure for "a user uploads a new model". The out-of-fold predictions are kept
(``TrainedPredictor.cv_predictions``) so the simulator can give policies
predictions with realistic error rather than in-sample ones.
"""

from __future__ import annotations

import base64
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .features import FEATURE_COLUMNS, feature_vector
from .profiles import ProfileRecord, gpu_spec

__all__ = ["UtilizationPredictor", "TrainedPredictor", "GPU_COLUMNS", "PREDICTOR_COLUMNS", "rmsle", "PREDICTOR_VERSION"]

PREDICTOR_VERSION = 1
GPU_COLUMNS: tuple[str, ...] = ("gpu_log10_peak_tflops", "gpu_log10_mem_bw_gbs", "gpu_mem_gb")
PREDICTOR_COLUMNS: tuple[str, ...] = FEATURE_COLUMNS + GPU_COLUMNS

DEFAULT_XGB_PARAMS: dict[str, Any] = {
    "n_estimators": 300,
    "max_depth": 4,
    "learning_rate": 0.05,
    "subsample": 0.9,
    "colsample_bytree": 0.9,
    "min_child_weight": 1.0,
    "reg_lambda": 1.0,
    "n_jobs": 1,
    "tree_method": "hist",
}


def rmsle(pred: np.ndarray, true: np.ndarray) -> float:
    """Root mean squared log error, ``sqrt(mean((log1p(p) - log1p(t))^2))``."""
    p = np.log1p(np.maximum(np.asarray(pred, float), 0.0))
    t = np.log1p(np.maximum(np.asarray(true, float), 0.0))
    return float(np.sqrt(np.mean((p - t) ** 2))) if len(t) else float("nan")


def _gpu_row(gpu_model: str | None) -> np.ndarray:
    g = gpu_spec(gpu_model or "V100")
    return np.array([math.log10(g.peak_tflops), math.log10(g.mem_bw_gbs), g.mem_mb / 1024.0])


def _x_row(features: Mapping[str, Any], gpu_model: str | None) -> np.ndarray:
    return np.concatenate([feature_vector(features), _gpu_row(gpu_model)])


class _Booster:
    """Minimal regressor over XGBoost's native API (scikit-learn is not a dependency)."""

    def __init__(self, params: Mapping[str, Any], seed: int, booster: Any = None):
        self.params = dict(params)
        self.seed = seed
        self.booster = booster

    def fit(self, X: np.ndarray, y: np.ndarray) -> _Booster:
        import xgboost as xgb

        p = dict(self.params)
        rounds = int(p.pop("n_estimators", 300))
        p = {
            "objective": "reg:squarederror",
            "seed": self.seed,
            "nthread": p.pop("n_jobs", 1),
            "verbosity": 0,
            "eta": p.pop("learning_rate", 0.05),
            "lambda": p.pop("reg_lambda", 1.0),
            **p,
        }
        self.booster = xgb.train(p, xgb.DMatrix(X, label=y), num_boost_round=rounds)
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        import xgboost as xgb

        return self.booster.predict(xgb.DMatrix(X))

    def save_raw(self) -> bytes:
        return bytes(self.booster.save_raw("json"))

    @classmethod
    def from_raw(cls, raw: bytes) -> _Booster:
        import xgboost as xgb

        b = xgb.Booster()
        b.load_model(bytearray(raw))
        return cls({}, 0, b)


def _regressor(params: Mapping[str, Any], seed: int) -> _Booster:
    return _Booster(params, seed)


def _group_folds(groups: Sequence[str], k: int, seed: int) -> list[np.ndarray]:
    """Fold index arrays; whole groups per fold, groups shuffled by ``seed``,
    assigned largest-first to the currently smallest fold."""
    uniq = sorted(set(groups))
    rng = np.random.default_rng(seed)
    order = list(rng.permutation(len(uniq)))
    sizes = {g: 0 for g in uniq}
    for g in groups:
        sizes[g] += 1
    order.sort(key=lambda i: -sizes[uniq[i]])  # stable: ties keep the shuffled order
    k = max(2, min(k, len(uniq)))
    fold_of: dict[str, int] = {}
    load = [0] * k
    for i in order:
        f = int(np.argmin(load))
        fold_of[uniq[i]] = f
        load[f] += sizes[uniq[i]]
    gi = np.array([fold_of[g] for g in groups])
    return [np.flatnonzero(gi == f) for f in range(k)]


@dataclass
class TrainedPredictor:
    """A fitted predictor. ``predict(features, gpu_model=...) -> (util_pct, peak_mem_mb)``."""

    util_model: Any
    mem_model: Any
    metrics: dict[str, Any]
    n_records: int
    feature_columns: tuple[str, ...] = PREDICTOR_COLUMNS
    trained_at: str = ""
    version: int = PREDICTOR_VERSION
    params: dict[str, Any] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    #: out-of-fold predictions: ``{(model, batch_size, gpu_model): (util, mem)}``
    cv_predictions: dict[tuple[str, int, str], tuple[float, float]] = field(default_factory=dict)

    def predict(self, features: Mapping[str, Any], *, gpu_model: str | None = None) -> tuple[float, float]:
        u, m = self.predict_many([features], gpu_model=gpu_model)
        return float(u[0]), float(m[0])

    def predict_many(
        self, features_list: Sequence[Mapping[str, Any]], *, gpu_model: str | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        if not features_list:
            return np.zeros(0), np.zeros(0)
        X = np.vstack([_x_row(f, gpu_model) for f in features_list])
        util = np.clip(np.expm1(self.util_model.predict(X)), 0.0, 100.0)
        mem = np.maximum(np.expm1(self.mem_model.predict(X)), 1.0)
        return util, mem

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike[str]) -> None:
        """One JSON file: metadata plus both boosters (XGBoost's own JSON, base64)."""
        body = {
            "format": "horus-predictor",
            "version": self.version,
            "trained_at": self.trained_at,
            "n_records": self.n_records,
            "feature_columns": list(self.feature_columns),
            "metrics": self.metrics,
            "params": self.params,
            "sources": self.sources,
            "cv_predictions": [[k[0], k[1], k[2], v[0], v[1]] for k, v in sorted(self.cv_predictions.items())],
            "util_model": base64.b64encode(self.util_model.save_raw()).decode(),
            "mem_model": base64.b64encode(self.mem_model.save_raw()).decode(),
        }
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(json.dumps(body, sort_keys=True))
        tmp.replace(p)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TrainedPredictor:
        body = json.loads(Path(path).read_text())
        if body.get("format") != "horus-predictor":
            raise ValueError(f"{path}: not a horus predictor file")
        if int(body.get("version", -1)) != PREDICTOR_VERSION:
            raise ValueError(f"{path}: predictor version {body.get('version')!r}, this code reads {PREDICTOR_VERSION}")
        cols = tuple(body["feature_columns"])
        if cols != PREDICTOR_COLUMNS:
            raise ValueError(f"{path}: trained on columns {cols}, this code builds {PREDICTOR_COLUMNS}")

        def booster(b64: str) -> _Booster:
            return _Booster.from_raw(base64.b64decode(b64))

        return cls(
            util_model=booster(body["util_model"]),
            mem_model=booster(body["mem_model"]),
            metrics=body["metrics"],
            n_records=int(body["n_records"]),
            feature_columns=cols,
            trained_at=body.get("trained_at", ""),
            version=int(body["version"]),
            params=body.get("params", {}),
            sources=list(body.get("sources", [])),
            cv_predictions={(m, int(b), g): (float(u), float(mm)) for m, b, g, u, mm in body.get("cv_predictions", [])},
        )


class UtilizationPredictor:
    """Trainer. ``UtilizationPredictor(**xgb_overrides).train(records) -> TrainedPredictor``."""

    def __init__(self, **xgb_params: Any):
        self.params = {**DEFAULT_XGB_PARAMS, **xgb_params}

    def train(
        self,
        records: Sequence[ProfileRecord],
        *,
        k_folds: int = 5,
        seed: int = 0,
        group_by_model: bool = True,
    ) -> TrainedPredictor:
        """Fit on all records and report k-fold error of both targets.

        ``metrics`` = ``{"util": {"rmsle", "mae_pct"}, "mem": {"rmsle",
        "mae_mb"}, "k_folds", "grouped_by", "per_fold": [...], "train": {...}}``.
        Needs at least 2 groups (models) when grouping, 2 records otherwise.
        """
        recs = list(records)
        if len(recs) < 2:
            raise ValueError("need at least 2 profile records to train")
        X = np.vstack([_x_row(r.features, r.gpu_model) for r in recs])
        yu = np.log1p(np.array([r.gpu_util_pct for r in recs]))
        ym = np.log1p(np.array([r.peak_mem_mb for r in recs]))
        groups = [r.model for r in recs] if group_by_model else [str(i) for i in range(len(recs))]
        if len(set(groups)) < 2:
            raise ValueError("grouped k-fold needs records of at least 2 models")
        folds = _group_folds(groups, k_folds, seed)

        oof_u = np.zeros(len(recs))
        oof_m = np.zeros(len(recs))
        per_fold = []
        for fi, test in enumerate(folds):
            train = np.setdiff1d(np.arange(len(recs)), test)
            mu = _regressor(self.params, seed).fit(X[train], yu[train])
            mm = _regressor(self.params, seed).fit(X[train], ym[train])
            oof_u[test] = mu.predict(X[test])
            oof_m[test] = mm.predict(X[test])
            tu, tm = np.expm1(yu[test]), np.expm1(ym[test])
            pu, pm = np.clip(np.expm1(oof_u[test]), 0, 100), np.maximum(np.expm1(oof_m[test]), 1)
            per_fold.append(
                {
                    "fold": fi,
                    "held_out": sorted({groups[i] for i in test}) if group_by_model else len(test),
                    "n": int(len(test)),
                    "util_rmsle": rmsle(pu, tu),
                    "mem_rmsle": rmsle(pm, tm),
                }
            )
        true_u, true_m = np.expm1(yu), np.expm1(ym)
        pred_u, pred_m = np.clip(np.expm1(oof_u), 0, 100), np.maximum(np.expm1(oof_m), 1)

        util_model = _regressor(self.params, seed).fit(X, yu)
        mem_model = _regressor(self.params, seed).fit(X, ym)
        fit_u = np.clip(np.expm1(util_model.predict(X)), 0, 100)
        fit_m = np.maximum(np.expm1(mem_model.predict(X)), 1)
        metrics = {
            "util": {"rmsle": rmsle(pred_u, true_u), "mae_pct": float(np.mean(np.abs(pred_u - true_u)))},
            "mem": {"rmsle": rmsle(pred_m, true_m), "mae_mb": float(np.mean(np.abs(pred_m - true_m)))},
            "k_folds": len(folds),
            "grouped_by": "model" if group_by_model else "record",
            "per_fold": per_fold,
            "train": {"util_rmsle": rmsle(fit_u, true_u), "mem_rmsle": rmsle(fit_m, true_m)},
        }
        cv = {(r.model, r.batch_size, r.gpu_model): (float(pred_u[i]), float(pred_m[i])) for i, r in enumerate(recs)}
        return TrainedPredictor(
            util_model=util_model,
            mem_model=mem_model,
            metrics=metrics,
            n_records=len(recs),
            trained_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            params=dict(self.params),
            sources=sorted({r.source for r in recs}),
            cv_predictions=cv,
        )
