"""Graph features for the Horus predictor, as fixed-order numeric vectors.

Feature *extraction* lives in :mod:`core.onnx_models.features`
(``compute_features``) and the model zoo in :mod:`core.onnx_models.zoo`; this
module only (a) turns a features dict into a vector with a stable, documented
column order and (b) keeps a cached table of zoo-model features at batch
sizes 1..256 so the simulator never rebuilds ONNX graphs.

Column order of :func:`feature_vector` (``FEATURE_COLUMNS``) - never reorder,
only append (a saved predictor records the columns it was trained on):

====  =======================  ==================================================
 idx  column                   definition (``log10p(x) = log10(1 + x)``)
====  =======================  ==================================================
  0   log10_total_flops        log10p(total_flops)       forward FLOPs at the batch
  1   log10_param_count        log10p(param_count)
  2   log10_activation_bytes   log10p(activation_bytes)  all intermediate tensors
  3   log2_batch_size          log2(batch_size)
  4   conv_count               number of conv layers (raw count)
  5   linear_count             linear/embedding layers, recurrent cells unrolled
  6   activation_count         activation layers
  7   other_count              every other compute node
  8   log10_flops_per_sample   log10p(total_flops / batch_size)
  9   log10_arith_intensity    log10((1 + total_flops) / (1 + 4*param_count + activation_bytes))
====  =======================  ==================================================

Layer counts stay linear: they are small integers and tree models do not care
about monotone rescaling; the heavy-tailed magnitudes are log-scaled so
distances (and plots) mean something.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "FEATURE_COLUMNS",
    "ZOO_BATCH_SIZES",
    "DEFAULT_ZOO_FEATURES_PATH",
    "FEATURE_KEYS",
    "feature_vector",
    "feature_matrix",
    "features_of_model",
    "ZooFeatureTable",
    "zoo_feature_table",
    "build_zoo_feature_table",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = REPO_ROOT / "data"
DEFAULT_ZOO_FEATURES_PATH = DATA_DIR / "profiles" / "zoo_features.json"

FEATURE_COLUMNS: tuple[str, ...] = (
    "log10_total_flops",
    "log10_param_count",
    "log10_activation_bytes",
    "log2_batch_size",
    "conv_count",
    "linear_count",
    "activation_count",
    "other_count",
    "log10_flops_per_sample",
    "log10_arith_intensity",
)

#: Keys a features dict must carry (``GraphFeatures.to_dict()`` has them all).
FEATURE_KEYS: tuple[str, ...] = (
    "total_flops",
    "param_count",
    "activation_bytes",
    "conv_count",
    "linear_count",
    "activation_count",
    "other_count",
    "batch_size",
)

#: Batch sizes of the cached zoo table: powers of two from 1 to 256.
ZOO_BATCH_SIZES: tuple[int, ...] = tuple(2**i for i in range(9))

_TABLE_VERSION = 1


def _log10p(x: float) -> float:
    return math.log10(1.0 + max(float(x), 0.0))


def feature_vector(features: Mapping[str, Any]) -> np.ndarray:
    """The features dict (``GraphFeatures.to_dict()`` or equivalent) as a
    float64 vector in ``FEATURE_COLUMNS`` order.

    Raises ``KeyError`` naming the missing key, ``ValueError`` for a negative
    count or a batch size < 1.
    """
    missing = [k for k in FEATURE_KEYS if k not in features]
    if missing:
        raise KeyError(f"features dict lacks {', '.join(missing)}")
    vals = {k: float(features[k]) for k in FEATURE_KEYS}
    for k, v in vals.items():
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"feature {k} must be a finite number >= 0, got {features[k]!r}")
    bs = vals["batch_size"]
    if bs < 1:
        raise ValueError(f"batch_size must be >= 1, got {features['batch_size']!r}")
    flops = vals["total_flops"]
    params = vals["param_count"]
    act = vals["activation_bytes"]
    return np.array(
        [
            _log10p(flops),
            _log10p(params),
            _log10p(act),
            math.log2(bs),
            vals["conv_count"],
            vals["linear_count"],
            vals["activation_count"],
            vals["other_count"],
            _log10p(flops / bs),
            math.log10((1.0 + flops) / (1.0 + 4.0 * params + act)),
        ],
        dtype=np.float64,
    )


def feature_matrix(features_list: Iterable[Mapping[str, Any]]) -> np.ndarray:
    """Stack :func:`feature_vector` rows into an ``(n, len(FEATURE_COLUMNS))`` array."""
    rows = [feature_vector(f) for f in features_list]
    if not rows:
        return np.zeros((0, len(FEATURE_COLUMNS)))
    return np.vstack(rows)


def _onnx_engine():
    """``core.onnx_models``, the graph-feature extractor and model zoo: the one engine horus uses
    (Django-free, like horus), imported here only and lazily because onnx is heavy."""
    import core.onnx_models as onnx_engine

    return onnx_engine


def features_of_model(model: Any, batch_size: int | None = None) -> dict[str, Any]:
    """Features dict of an ``onnx.ModelProto`` (delegates to
    :func:`core.onnx_models.features.compute_features`)."""
    return _onnx_engine().compute_features(model, batch_size=batch_size).to_dict()


class ZooFeatureTable:
    """Features of zoo models at several batch sizes: ``table.get(name, bs)``."""

    def __init__(
        self, entries: Mapping[str, Mapping[int, Mapping[str, Any]]], *, meta: Mapping[str, Any] | None = None
    ):
        self._entries: dict[str, dict[int, dict[str, Any]]] = {
            str(m): {int(b): dict(f) for b, f in per.items()} for m, per in entries.items()
        }
        self.meta = dict(meta or {})

    @property
    def models(self) -> list[str]:
        return sorted(self._entries)

    def batch_sizes(self, model: str) -> list[int]:
        return sorted(self._entries[model])

    def get(self, model: str, batch_size: int) -> dict[str, Any]:
        try:
            return dict(self._entries[model][int(batch_size)])
        except KeyError:
            raise KeyError(f"no cached features for {model!r} at batch size {batch_size}") from None

    def __contains__(self, key: tuple[str, int]) -> bool:
        m, b = key
        return m in self._entries and int(b) in self._entries[m]

    def items(self):
        for m in self.models:
            for b in self.batch_sizes(m):
                yield m, b, dict(self._entries[m][b])

    def to_json(self) -> dict[str, Any]:
        return {
            "version": _TABLE_VERSION,
            "meta": self.meta,
            "models": {m: {str(b): self._entries[m][b] for b in sorted(self._entries[m])} for m in self.models},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ZooFeatureTable:
        if int(data.get("version", 0)) != _TABLE_VERSION:
            raise ValueError(f"unsupported zoo feature table version {data.get('version')!r}")
        return cls({m: {int(b): f for b, f in per.items()} for m, per in data["models"].items()}, meta=data.get("meta"))

    def save(self, path: str | os.PathLike[str]) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")
        tmp.replace(p)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ZooFeatureTable:
        return cls.from_json(json.loads(Path(path).read_text()))


def build_zoo_feature_table(
    models: Sequence[str] | None = None, batch_sizes: Sequence[int] = ZOO_BATCH_SIZES, *, seed: int = 0
) -> ZooFeatureTable:
    """Build every zoo model once (batch 1) and compute its features at each
    batch size (``compute_features`` rebatches a copy). Needs onnx."""
    onnx_engine = _onnx_engine()
    compute_features, build_model = onnx_engine.compute_features, onnx_engine.build_model
    names = list(models) if models is not None else list(onnx_engine.list_models())
    entries: dict[str, dict[int, dict[str, Any]]] = {}
    t0 = time.perf_counter()
    for name in names:
        model = build_model(name, batch_size=1, seed=seed)
        entries[name] = {int(b): compute_features(model, batch_size=int(b)).to_dict() for b in batch_sizes}
    meta = {
        "generated_by": "scheduling.horus.features.build_zoo_feature_table",
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(time.perf_counter() - t0, 2),
        "batch_sizes": [int(b) for b in batch_sizes],
        "zoo_seed": seed,
    }
    return ZooFeatureTable(entries, meta=meta)


def zoo_feature_table(
    *,
    path: str | os.PathLike[str] | None = None,
    batch_sizes: Sequence[int] = ZOO_BATCH_SIZES,
    models: Sequence[str] | None = None,
    rebuild: bool = False,
) -> ZooFeatureTable:
    """The cached zoo feature table: loaded from ``path`` (default
    ``data/profiles/zoo_features.json``) when it holds every requested model and
    batch size, else built from the zoo (needs onnx) and written back."""
    p = Path(path) if path is not None else DEFAULT_ZOO_FEATURES_PATH
    if p.exists() and not rebuild:
        table = ZooFeatureTable.load(p)
        wanted = list(models) if models is not None else table.models
        if all((m, b) in table for m in wanted for b in batch_sizes):
            return table
    table = build_zoo_feature_table(models, batch_sizes)
    table.save(p)
    return table
