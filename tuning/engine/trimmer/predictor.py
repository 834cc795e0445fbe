"""Trimmer's own latency predictor, independent of the search's cost model.

The evolutionary search already ranks its candidates with MetaSchedule's XGBoost model; re-ranking
them with that same model only removes the search's exploration. Trimmer's candidate filter asks a
second opinion instead: a ridge regression of log latency on MetaSchedule's per-store features
(mean and max over the stores of a candidate), trained only on the candidates this run measured
for the task. Its leave-one-out error says how far to trust it: a candidate is vetoed only when it
is predicted worse than the task's best by more than that error (and a fixed margin).

numpy only (the features come in as arrays), so it is unit-tested without TVM.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from tuning.engine.latency import is_timing

__all__ = ["RidgeLatencyPredictor", "pool_store_features"]


def pool_store_features(per_store: np.ndarray) -> np.ndarray:
    """One vector per candidate from its (stores x features) matrix: mean and max over stores."""
    m = np.asarray(per_store, dtype="float64")
    if m.ndim == 1:
        m = m[None, :]
    if m.shape[0] == 0:
        return np.zeros(2 * m.shape[1])
    return np.concatenate([m.mean(axis=0), m.max(axis=0)])


class RidgeLatencyPredictor:
    """log(latency) ~ ridge on standardized features (dual form: few samples, many features)."""

    def __init__(self, *, alpha: float = 10.0, min_samples: int = 16, max_samples: int = 512) -> None:
        self.alpha = float(alpha)
        self.min_samples = int(min_samples)
        self.max_samples = int(max_samples)
        self.x: list[np.ndarray] = []
        self.y: list[float] = []
        self._fit: tuple | None = None  # (mean, scale, X train std, dual coefficients, y mean)
        self.loo_rmse: float | None = None

    @property
    def n_samples(self) -> int:
        return len(self.y)

    @property
    def ready(self) -> bool:
        return self.n_samples >= max(2, self.min_samples)

    def add(self, features: Sequence[np.ndarray], latencies: Sequence[float | None]) -> None:
        """Measured candidates: a failed one (None) says nothing about speed and is left out."""
        for f, lat in zip(features, latencies):
            if is_timing(lat) and lat > 0:
                self.x.append(np.asarray(f, dtype="float64"))
                self.y.append(math.log(lat))
        if len(self.y) > self.max_samples:  # keep the newest: the search has moved on
            self.x, self.y = self.x[-self.max_samples :], self.y[-self.max_samples :]
        self._fit = None

    def _train(self) -> tuple:
        if self._fit is not None:
            return self._fit
        x = np.vstack(self.x)
        y = np.asarray(self.y)
        mean = x.mean(axis=0)
        scale = x.std(axis=0)
        scale[scale < 1e-9] = np.inf  # a constant feature carries nothing
        xs = (x - mean) / scale
        y_mean = float(y.mean())
        gram = xs @ xs.T
        inv = np.linalg.inv(gram + self.alpha * np.eye(len(y)))
        coef = inv @ (y - y_mean)
        hat = gram @ inv
        loo = (y - y_mean - hat @ (y - y_mean)) / np.maximum(1e-9, 1 - np.diag(hat))
        self.loo_rmse = float(np.sqrt(np.mean(loo**2)))
        self._fit = (mean, scale, xs, coef, y_mean)
        return self._fit

    def predict_log(self, features: Sequence[np.ndarray]) -> np.ndarray | None:
        """Predicted log latency of each candidate; None until ``min_samples`` were measured."""
        if not self.ready or not len(features):
            return None
        mean, scale, xs, coef, y_mean = self._train()
        q = (np.vstack([np.asarray(f, dtype="float64") for f in features]) - mean) / scale
        return y_mean + (q @ xs.T) @ coef

    def veto_threshold(self, best_latency: float, margin: float) -> float | None:
        """Log latency above which a candidate is vetoed: the best, plus the larger of the fixed
        margin and the predictor's leave-one-out error; None without a best or a trained model."""
        if not self.ready or not (best_latency and math.isfinite(best_latency) and best_latency > 0):
            return None
        self._train()
        return math.log(best_latency) + max(math.log1p(margin), self.loo_rmse or 0.0)
