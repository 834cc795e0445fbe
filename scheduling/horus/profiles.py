"""GPU profile records (what a job uses on a GPU) and the synthetic seed set.

A :class:`ProfileRecord` says: model ``model`` at ``batch_size`` on a
``gpu_model`` GPU ran at ``gpu_util_pct`` % utilization, peaked at
``peak_mem_mb`` MB of GPU memory and drew ``power_w`` W. ``features`` is the
model's graph-features dict at that batch size (see :mod:`.features`), and
``source`` says where the numbers came from.

The seed set shipped in ``data/profiles/seed_profiles.json`` is SYNTHETIC:
this machine has no GPU. Every record in it carries
``source = "synthetic-roofline-v1"``. Real records come from the platform's
``profile_gpu`` command and carry their own source; the predictor trains on
whichever it is given. The synthetic model (:func:`roofline_profile`) is a
seeded roofline-style estimate of one *training step* (forward + backward +
optimizer), chosen to be plausible, not measured:

* step FLOPs ``F = 3 x forward FLOPs`` (backward ~ 2 x forward);
  compute time ``t_c = F / (peak_flops x 0.45)``;
  memory traffic ``B = 3 x activation_bytes + 16 x params`` bytes,
  ``t_m = B / bandwidth``; GPU busy time ``t_gpu = max(t_c, t_m)``.
* host side: framework dispatch ``t_d = 0.5 ms + 3 x 10 us x layers`` (kernels
  are launched asynchronously, so it overlaps with the GPU), input pipeline
  ``t_in = 0.1 ms x batch`` (also overlapped, prefetching), and a
  synchronisation gap ``t_s = 1 ms`` per step that never overlaps.
* step time ``t = max(t_gpu, t_d, t_in) + t_s``;
  utilization ``= 100 x t_gpu / t`` (rises with FLOPs per batch, saturates
  below 100), times log-normal noise (sigma 0.05), clipped to [1, 100].
* peak memory ``= 450 MB CUDA context + 128 MB workspace + 16 B x params``
  (weights, gradients, two Adam moments) ``+ activation_bytes`` (saved for the
  backward pass), times log-normal noise (sigma 0.03). A configuration that
  does not fit the GPU's memory is left out (a real profiler would OOM).
* power ``= idle + (TDP - idle) x (util/100)^1.2`` with noise (sigma 0.04).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from .features import DATA_DIR, FEATURE_KEYS, ZOO_BATCH_SIZES, ZooFeatureTable
from .interference import fitted_gpu_type

__all__ = [
    "GpuSpec",
    "GPU_SPECS",
    "gpu_spec",
    "ProfileRecord",
    "ProfileFormatError",
    "load_profiles",
    "save_profiles",
    "roofline_profile",
    "generate_seed_profiles",
    "write_seed_profiles",
    "ProfileTable",
    "SYNTHETIC_SOURCE",
    "DEFAULT_SEED_PROFILES_PATH",
    "ZOO_GAVEL_FAMILY",
    "gavel_speed_ratios",
    "util_on_gpu",
    "speed_on_gpu",
]

SYNTHETIC_SOURCE = "synthetic-roofline-v1"
DEFAULT_SEED_PROFILES_PATH = DATA_DIR / "profiles" / "seed_profiles.json"
_FILE_VERSION = 1


@dataclass(frozen=True)
class GpuSpec:
    """Datasheet numbers of a GPU model (FP32 peak, memory, bandwidth, power)."""

    name: str
    mem_mb: float
    peak_tflops: float
    mem_bw_gbs: float
    tdp_w: float
    idle_w: float
    assumed: bool = False  # True where the vendor does not publish the model


# Public datasheet values (FP32, no tensor cores). Alibaba's "G2"/"G3" are
# internal names the trace does not explain: their numbers are ASSUMED
# (a V100-32GB-like part) and flagged so.
GPU_SPECS: dict[str, GpuSpec] = {
    s.name: s
    for s in (
        GpuSpec("V100", 16384, 15.7, 900, 300, 40),
        GpuSpec("V100M16", 16384, 15.7, 900, 300, 40),
        GpuSpec("V100M32", 32768, 15.7, 900, 300, 40),
        GpuSpec("P100", 16384, 9.3, 732, 250, 30),
        GpuSpec("T4", 15360, 8.1, 320, 70, 10),
        GpuSpec("A10", 24576, 31.2, 600, 150, 20),
        GpuSpec("G2", 32768, 15.7, 900, 300, 40, assumed=True),
        GpuSpec("G3", 32768, 15.7, 900, 300, 40, assumed=True),
    )
}


def gpu_spec(name: str) -> GpuSpec:
    """Spec of a GPU model by name; an unknown name gets V100 numbers, flagged assumed."""
    if name in GPU_SPECS:
        return GPU_SPECS[name]
    v = GPU_SPECS["V100"]
    return GpuSpec(name, v.mem_mb, v.peak_tflops, v.mem_bw_gbs, v.tdp_w, v.idle_w, assumed=True)


# ------------------------------------------------------------------------ utilization per GPU type
GAVEL_THROUGHPUTS_PATH = DATA_DIR / "interference" / "gavel_oracle_throughputs.json"
#: zoo model -> the Gavel job family whose measured speed ratios between GPU types stand in for it
#: (closest architecture; a model not listed uses the median over all 26 Gavel job types)
ZOO_GAVEL_FAMILY = {
    "resnet18": "ResNet-18",
    "small_cnn": "ResNet-18",
    "mobilenet_v2": "ResNet-18",
    "vgg11": "ResNet-50",
    "bert_encoder": "Transformer",
    "lstm_lm": "LM",
}


@lru_cache(maxsize=1)
def gavel_speed_ratios() -> dict[str, dict[str, float]]:
    """``{family or "*": {gpu type: median standalone throughput / its V100 throughput}}`` from Gavel's
    measured standalone throughputs (``data/interference/``, the ``"null"`` entries)."""
    doc = json.loads(GAVEL_THROUGHPUTS_PATH.read_text())
    per_family: dict[str, dict[str, list[float]]] = {}
    for gpu, table in doc.items():
        for job, row in table.items():
            ref = float(doc["v100"][job]["null"])
            if ref > 0 and float(row["null"]) > 0:
                for key in (job.split(" (")[0], "*"):
                    per_family.setdefault(key, {}).setdefault(gpu, []).append(float(row["null"]) / ref)
    return {f: {g: float(np.median(v)) for g, v in by_gpu.items()} for f, by_gpu in per_family.items()}


def util_on_gpu(util_pct: float, *, measured_on: str, run_on: str, model: str | None = None) -> float:
    """A job's standalone utilization on ``run_on`` given ``util_pct`` on ``measured_on``.

    Its host-side time per step (input pipeline, dispatch: the ``1 - u`` share) does not depend on the
    GPU; the step time scales with the measured throughput ratio ``r = thr(run_on) / thr(measured_on)``
    (Gavel's standalone throughputs for the job's family on the GPU types that stand in for both, see
    ``interference.fitted_gpu_type``), so ``u' = 1 - (1 - u) * r``: the same job keeps a K80 busier than
    a V100. Clipped to [1, 100]. Same stand-in type: unchanged."""
    a, b = fitted_gpu_type(measured_on), fitted_gpu_type(run_on)
    if a == b:
        return float(util_pct)
    ratios = gavel_speed_ratios()
    fam = ratios.get(ZOO_GAVEL_FAMILY.get(model or "", ""), ratios["*"])
    r = fam[b] / fam[a]
    return float(min(100.0, max(1.0, 100.0 * (1.0 - (1.0 - util_pct / 100.0) * r))))


def speed_on_gpu(*, measured_on: str, run_on: str, model: str | None = None) -> float:
    """How fast a job runs on ``run_on`` relative to ``measured_on`` (its standalone throughput ratio):
    Gavel's measured standalone throughputs for the job's family (:data:`ZOO_GAVEL_FAMILY`, else the median
    over Gavel's 26 job types) on the GPU types that stand in for both (``interference.fitted_gpu_type``).
    A trace's duration was measured on ``measured_on``; on a K80 the same work takes ``1 / ratio`` as long.
    Same stand-in type (every type Gavel did not measure maps to one it did): 1.0."""
    a, b = fitted_gpu_type(measured_on), fitted_gpu_type(run_on)
    if a == b:
        return 1.0
    ratios = gavel_speed_ratios()
    fam = ratios.get(ZOO_GAVEL_FAMILY.get(model or "", ""), ratios["*"])
    return float(fam[b] / fam[a])


class ProfileFormatError(ValueError):
    """A profile file or record is malformed (the message names the record)."""


@dataclass(frozen=True)
class ProfileRecord:
    model: str
    batch_size: int
    gpu_model: str
    features: dict[str, Any]
    gpu_util_pct: float
    peak_mem_mb: float
    power_w: float | None
    source: str
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str = "record") -> ProfileRecord:
        try:
            rec = cls(
                model=str(d["model"]),
                batch_size=int(d["batch_size"]),
                gpu_model=str(d["gpu_model"]),
                features=dict(d["features"]),
                gpu_util_pct=float(d["gpu_util_pct"]),
                peak_mem_mb=float(d["peak_mem_mb"]),
                power_w=None if d.get("power_w") is None else float(d["power_w"]),
                source=str(d["source"]),
                meta=dict(d.get("meta") or {}),
            )
        except KeyError as e:
            raise ProfileFormatError(f"{where}: missing field {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ProfileFormatError(f"{where}: {e}") from None
        missing = [k for k in FEATURE_KEYS if k not in rec.features]
        if missing:
            raise ProfileFormatError(f"{where}: features lack {', '.join(missing)}")
        if rec.batch_size < 1 or not (0 <= rec.gpu_util_pct <= 100) or rec.peak_mem_mb <= 0:
            raise ProfileFormatError(
                f"{where}: out of range (batch_size={rec.batch_size}, gpu_util_pct={rec.gpu_util_pct}, "
                f"peak_mem_mb={rec.peak_mem_mb})"
            )
        return rec


def save_profiles(
    records: Iterable[ProfileRecord], path: str | os.PathLike[str], *, meta: Mapping[str, Any] | None = None
) -> None:
    """Write records as ``{"version": 1, "meta": {...}, "records": [...]}``."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    body = {"version": _FILE_VERSION, "meta": dict(meta or {}), "records": [r.to_dict() for r in records]}
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
    tmp.replace(p)


def load_profiles(path: str | os.PathLike[str] = DEFAULT_SEED_PROFILES_PATH) -> list[ProfileRecord]:
    """Read a profile file (the format :func:`save_profiles` writes, or a bare list)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ProfileFormatError(f"{p}: not JSON ({e})") from None
    if isinstance(data, dict):
        if int(data.get("version", _FILE_VERSION)) != _FILE_VERSION:
            raise ProfileFormatError(f"{p}: unsupported version {data.get('version')!r}")
        data = data.get("records")
    if not isinstance(data, list):
        raise ProfileFormatError(f"{p}: expected a list of records")
    return [ProfileRecord.from_dict(d, where=f"{p} record {i}") for i, d in enumerate(data)]


# --------------------------------------------------------------------------- synthetic model

_EFFICIENCY = 0.45
_DISPATCH_BASE_S = 0.5e-3
_DISPATCH_PER_LAYER_S = 10e-6
_INPUT_PER_SAMPLE_S = 0.10e-3
_SYNC_S = 1e-3
_CONTEXT_MB = 450.0
_WORKSPACE_MB = 128.0


def roofline_profile(
    features: Mapping[str, Any], gpu: GpuSpec, *, rng: np.random.Generator | None = None
) -> tuple[float, float, float]:
    """Synthetic ``(gpu_util_pct, peak_mem_mb, power_w)`` of one training step
    (module docstring has the model). ``rng=None`` gives the noise-free value."""
    flops = 3.0 * float(features["total_flops"])
    params = float(features["param_count"])
    act = float(features["activation_bytes"])
    bs = max(1, int(features["batch_size"]))
    layers = sum(int(features[k]) for k in ("conv_count", "linear_count", "activation_count", "other_count"))
    t_c = flops / (gpu.peak_tflops * 1e12 * _EFFICIENCY)
    t_m = (3.0 * act + 16.0 * params) / (gpu.mem_bw_gbs * 1e9)
    t_gpu = max(t_c, t_m)
    t_d = _DISPATCH_BASE_S + 3 * _DISPATCH_PER_LAYER_S * layers
    t_in = _INPUT_PER_SAMPLE_S * bs
    step = max(t_gpu, t_d, t_in) + _SYNC_S
    util = 100.0 * t_gpu / step
    mem = _CONTEXT_MB + _WORKSPACE_MB + (16.0 * params + act) / 2**20
    if rng is not None:
        util *= math.exp(rng.normal(0.0, 0.05))
        mem *= math.exp(rng.normal(0.0, 0.03))
    util = min(100.0, max(1.0, util))
    power = gpu.idle_w + (gpu.tdp_w - gpu.idle_w) * (util / 100.0) ** 1.2
    if rng is not None:
        power *= math.exp(rng.normal(0.0, 0.04))
    return util, mem, min(power, gpu.tdp_w)


def generate_seed_profiles(
    table: ZooFeatureTable,
    *,
    gpu_models: Sequence[str] = ("V100", "P100", "T4", "A10"),
    batch_sizes: Sequence[int] = ZOO_BATCH_SIZES,
    seed: int = 0,
) -> list[ProfileRecord]:
    """The synthetic seed profile set: every zoo model x batch size x GPU model
    that fits in memory, one noisy roofline sample each, seeded."""
    rng = np.random.default_rng(seed)
    out: list[ProfileRecord] = []
    for gname in gpu_models:
        gpu = gpu_spec(gname)
        for model in table.models:
            for bs in batch_sizes:
                if (model, bs) not in table:
                    continue
                feats = table.get(model, bs)
                util, mem, power = roofline_profile(feats, gpu, rng=rng)
                if mem > gpu.mem_mb:
                    continue  # would OOM: a real profiler records nothing
                out.append(
                    ProfileRecord(
                        model=model,
                        batch_size=int(bs),
                        gpu_model=gname,
                        features=feats,
                        gpu_util_pct=round(util, 3),
                        peak_mem_mb=round(mem, 1),
                        power_w=round(power, 2),
                        source=SYNTHETIC_SOURCE,
                        meta={"workload": "train-step", "seed": seed},
                    )
                )
    return out


def write_seed_profiles(
    path: str | os.PathLike[str] = DEFAULT_SEED_PROFILES_PATH, *, seed: int = 0
) -> list[ProfileRecord]:
    """Regenerate ``data/profiles/seed_profiles.json`` from the cached zoo table."""
    from .features import zoo_feature_table

    recs = generate_seed_profiles(zoo_feature_table(), seed=seed)
    save_profiles(
        recs,
        path,
        meta={
            "source": SYNTHETIC_SOURCE,
            "synthetic": True,
            "note": "No GPU was used: a seeded roofline-style model of a training step "
            "(scheduling/horus/profiles.py). Replace with profile_gpu measurements.",
            "seed": seed,
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    )
    return recs


class ProfileTable:
    """Per-(model, batch size) profile lookup for one GPU model: the TRUE
    utilization and memory the simulator runs. Several records of the same
    configuration are averaged."""

    def __init__(self, records: Iterable[ProfileRecord], gpu_model: str):
        acc: dict[tuple[str, int], list[ProfileRecord]] = {}
        for r in records:
            if r.gpu_model == gpu_model:
                acc.setdefault((r.model, r.batch_size), []).append(r)
        if not acc:
            raise ValueError(f"no profile records for GPU model {gpu_model!r}")
        self.gpu_model = gpu_model
        self.keys: list[tuple[str, int]] = sorted(acc)
        self.util = {k: float(np.mean([r.gpu_util_pct for r in v])) for k, v in acc.items()}
        self.mem = {k: float(np.mean([r.peak_mem_mb for r in v])) for k, v in acc.items()}
        self.features = {k: v[0].features for k, v in acc.items()}
        self.sources = sorted({r.source for v in acc.values() for r in v})

    def __len__(self) -> int:
        return len(self.keys)

    def summary(self) -> dict[str, Any]:
        u = np.array([self.util[k] for k in self.keys])
        m = np.array([self.mem[k] for k in self.keys])
        return {
            "gpu_model": self.gpu_model,
            "configs": len(self.keys),
            "sources": self.sources,
            "util_pct": {
                "mean": float(u.mean()),
                "p25": float(np.percentile(u, 25)),
                "median": float(np.median(u)),
                "p75": float(np.percentile(u, 75)),
            },
            "mem_mb": {"mean": float(m.mean()), "median": float(np.median(m)), "max": float(m.max())},
        }
