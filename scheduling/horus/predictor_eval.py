"""An honest evaluation of the utilization predictor: what it is worth to a scheduler.

* **Main figure: leave one model FAMILY out.** Every profile record of a family (residual CNNs,
  plain conv stacks, mobile CNNs, transformers, recurrent nets: :data:`MODEL_FAMILIES`) is predicted
  by a regressor trained on the other families only - a user's new kind of model, not another batch
  size of a model it has seen. (Grouping by model alone lets VGG-11 be predicted from the small CNN.)
* **Baselines beside it, on the same folds:** a constant (the training records' mean utilization on
  the same GPU model) and an analytic FLOPs model, ``u = 100 x t / (t + c_gpu)`` with ``t`` the step's
  ideal compute time (3 x forward FLOPs / the GPU's peak FLOP/s) and one overhead ``c_gpu`` (seconds)
  per GPU model fitted on the training records.
* **A short online-profiling baseline** (``online_profile_<w>s``): run the job itself for ``w`` seconds
  on the target GPU and take the mean NVML utilization - accurate, but it costs ``w`` GPU-seconds per
  new job before it can be placed (Horus's premise is to avoid that). Where a profile record carries
  its measured samples (``meta.util_samples``, one per ``meta.sample_period_s``, from the start of
  the run, warm-up included) the estimate is the mean of the first ``w`` seconds of them: MEASURED.
  Otherwise (every synthetic record) it is MODELED as the truth read through ``w / period`` samples
  each with Gaussian noise (``sample_noise_pct``, the held-out bench's telemetry noise): on synthetic
  profiles it wins by construction, and the row says so.
* **Any profile file** (:func:`load_profile_sources`): every JSON file in ``data/profiles/`` whose
  records carry a ``source`` field is read (``bench/gpu_profile.sh`` writes measured ones there); a
  record without graph features gets the zoo's (same model and batch size), else it is skipped with
  the reason. Figures are given per source as well as pooled.
* **Metrics:** MAE in utilization points; Spearman rank correlation (what a scheduler ranking GPUs
  needs); and a decision metric: of all pairs of held-out configurations on one GPU model that the
  method calls SAFE to co-locate (predicted utilizations sum to <= 100 %), the share whose TRUE sum
  exceeds 100 % (``unsafe_share_of_safe``), beside the base rate over all pairs.

The shipped profiles are SYNTHETIC (``synthetic-roofline-v1``: a roofline-style model of a training
step, see :mod:`.profiles`) until ``profile_gpu`` records real ones on a GPU host. The analytic
baseline shares that generator's structure (utilization from FLOPs over a fixed overhead), so on
synthetic profiles it is favoured and every figure here says how the predictor does on the roofline
model, not on real GPUs. No Django here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .features import DATA_DIR
from .predictor import DEFAULT_XGB_PARAMS, _regressor, _x_row
from .profiles import ProfileFormatError, ProfileRecord, gpu_spec

__all__ = [
    "MODEL_FAMILIES",
    "PROFILES_DIR",
    "evaluate_predictor",
    "format_evaluation",
    "load_profile_sources",
    "model_family",
    "online_profile_estimates",
]

PROFILES_DIR = DATA_DIR / "profiles"
#: default online-profiling window (seconds), NVML sample period (seconds) and per-sample noise (points)
ONLINE_WINDOW_S, SAMPLE_PERIOD_S, SAMPLE_NOISE_PCT = 30.0, 1.0, 5.0

#: zoo model -> architecture family (the unit held out)
MODEL_FAMILIES: dict[str, str] = {
    "resnet18": "residual-cnn",
    "vgg11": "plain-cnn",
    "small_cnn": "plain-cnn",
    "mobilenet_v2": "mobile-cnn",
    "bert_encoder": "transformer",
    "lstm_lm": "recurrent",
}
METHODS = ("predictor", "constant", "analytic_flops")


def load_profile_sources(
    directory: str | os.PathLike[str] = PROFILES_DIR,
) -> tuple[list[ProfileRecord], list[dict[str, str]]]:
    """Every profile record in ``directory``'s JSON files that carries a ``source`` field:
    ``(records, skipped)``, ``skipped`` naming each file or record left out and why. A file is a list of
    records or ``{"records": [...]}``; a record without ``features`` gets the zoo's for its model and
    batch size (``data/profiles/zoo_features.json``)."""
    from .features import zoo_feature_table

    zoo = None
    records: list[ProfileRecord] = []
    skipped: list[dict[str, str]] = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            skipped.append({"where": path.name, "why": f"not readable JSON ({e})"})
            continue
        rows = data.get("records") if isinstance(data, dict) else data
        if not isinstance(rows, list) or not any(isinstance(r, dict) and "source" in r for r in rows):
            continue  # not a profile file (the zoo's feature table, a manifest)
        for i, row in enumerate(rows):
            where = f"{path.name} record {i}"
            if not isinstance(row, dict) or not row.get("source"):
                skipped.append({"where": where, "why": "no 'source' field"})
                continue
            row = dict(row)
            if "features" not in row:
                if zoo is None:
                    zoo = zoo_feature_table()
                key = (str(row.get("model")), int(row.get("batch_size") or 0))
                if key not in zoo:
                    skipped.append({"where": where, "why": f"no graph features for {key[0]} at batch {key[1]}"})
                    continue
                row["features"] = zoo.get(*key)
            try:
                records.append(ProfileRecord.from_dict(row, where=where))
            except ProfileFormatError as e:
                skipped.append({"where": where, "why": str(e)})
    return records, skipped


def online_profile_estimates(
    records: Sequence[ProfileRecord],
    *,
    window_s: float = ONLINE_WINDOW_S,
    sample_period_s: float = SAMPLE_PERIOD_S,
    sample_noise_pct: float = SAMPLE_NOISE_PCT,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """``(estimates, measured)``: each record's utilization as a ``window_s`` online profile reads it,
    and whether that came from its measured samples (True) or was modeled (module docstring)."""
    rng = np.random.default_rng([seed, 0x0F11])
    est, measured = np.zeros(len(records)), np.zeros(len(records), dtype=bool)
    for i, r in enumerate(records):
        samples = r.meta.get("util_samples")
        if samples:
            period = float(r.meta.get("sample_period_s") or sample_period_s)
            k = max(1, round(window_s / period))
            est[i], measured[i] = float(np.mean(np.asarray(samples[:k], float))), True
        else:
            k = max(1, round(window_s / sample_period_s))
            noise = rng.normal(0.0, sample_noise_pct, k).mean()
            est[i] = r.gpu_util_pct + noise
    return np.clip(est, 0.0, 100.0), measured


def model_family(model: str) -> str:
    """A model's family; a model not in :data:`MODEL_FAMILIES` is its own family."""
    return MODEL_FAMILIES.get(model, model)


def _step_compute_s(r: ProfileRecord) -> float:
    return 3.0 * float(r.features["total_flops"]) / (gpu_spec(r.gpu_model).peak_tflops * 1e12)


def _fit_overhead(t: np.ndarray, u: np.ndarray) -> float:
    """The overhead ``c`` (seconds) minimising the squared error of ``100 t / (t + c)`` against ``u``."""
    from scipy.optimize import minimize_scalar

    def sse(log_c: float) -> float:
        c = np.exp(log_c)
        return float(((100.0 * t / (t + c) - u) ** 2).sum())

    return float(np.exp(minimize_scalar(sse, bounds=(-20.0, 5.0), method="bounded").x))


def _baselines(train: list[ProfileRecord], test: list[ProfileRecord]) -> dict[str, np.ndarray]:
    """Constant and analytic predictions of ``test``, each fitted per GPU model on ``train``."""
    const, analytic = np.zeros(len(test)), np.zeros(len(test))
    for g in {r.gpu_model for r in test}:
        tr = [r for r in train if r.gpu_model == g] or train
        u = np.array([r.gpu_util_pct for r in tr])
        c = _fit_overhead(np.array([_step_compute_s(r) for r in tr]), u)
        for i, r in enumerate(test):
            if r.gpu_model == g:
                const[i] = u.mean()
                t = _step_compute_s(r)
                analytic[i] = 100.0 * t / (t + c)
    return {"constant": const, "analytic_flops": analytic}


def _xgb_predictions(
    train: list[ProfileRecord], test: list[ProfileRecord], params: Mapping[str, Any], seed: int
) -> np.ndarray:
    X = np.vstack([_x_row(r.features, r.gpu_model) for r in train])
    y = np.log1p(np.array([r.gpu_util_pct for r in train]))
    model = _regressor(params, seed).fit(X, y)
    return np.clip(np.expm1(model.predict(np.vstack([_x_row(r.features, r.gpu_model) for r in test]))), 0, 100)


def _unsafe_share(pred: np.ndarray, true: np.ndarray, gpu: Sequence[str]) -> dict[str, float | int | None]:
    """Pairs of configurations on one GPU model: of those predicted to fit (sum <= 100), the share that do not."""
    safe = unsafe = total = truly_over = 0
    gpu_arr = np.array(gpu)
    for g in sorted(set(gpu)):
        idx = np.flatnonzero(gpu_arr == g)
        i, j = np.triu_indices(len(idx), k=1)
        ps, ts = pred[idx][i] + pred[idx][j], true[idx][i] + true[idx][j]
        called_safe = ps <= 100.0
        safe += int(called_safe.sum())
        unsafe += int((called_safe & (ts > 100.0)).sum())
        total += len(i)
        truly_over += int((ts > 100.0).sum())
    return {
        "pairs": total,
        "called_safe": safe,
        "unsafe_share_of_safe": unsafe / safe if safe else None,
        "base_rate_over_100": truly_over / total if total else None,
    }


def _spearman(pred: np.ndarray, true: np.ndarray) -> float | None:
    from scipy.stats import spearmanr

    return float(spearmanr(pred, true).statistic) if len(pred) > 2 and np.ptp(pred) > 0 and np.ptp(true) > 0 else None


def _scores(pred: np.ndarray, true: np.ndarray, gpu: Sequence[str], groups: Sequence[np.ndarray]) -> dict[str, Any]:
    """MAE, pooled Spearman, Spearman within each held-out family (mean; None for a constant, which
    ranks nothing) and the co-location decision metric."""
    within = [r for r in (_spearman(pred[g], true[g]) for g in groups) if r is not None]
    return {
        "mae_pct": float(np.mean(np.abs(pred - true))),
        "spearman": _spearman(pred, true),
        "spearman_within_family": float(np.mean(within)) if within else None,
        "colocation": _unsafe_share(pred, true, gpu),
    }


def evaluate_predictor(
    records: Sequence[ProfileRecord],
    *,
    seed: int = 0,
    xgb_params: Mapping[str, Any] | None = None,
    online_window_s: float | None = None,
) -> dict[str, Any]:
    """Leave-one-family-out evaluation of the predictor and both baselines (module docstring); with
    ``online_window_s``, the short online-profiling baseline beside them."""
    recs = list(records)
    families = sorted({model_family(r.model) for r in recs})
    if len(families) < 2:
        raise ValueError("the evaluation needs profiles of at least 2 model families")
    params = {**DEFAULT_XGB_PARAMS, **(xgb_params or {})}
    pred = {m: np.zeros(len(recs)) for m in METHODS}
    online_name, online_measured = None, None
    if online_window_s is not None:
        online_name = f"online_profile_{online_window_s:g}s"
        pred[online_name], online_measured = online_profile_estimates(recs, window_s=online_window_s, seed=seed)
    names = list(pred)
    folds, groups = [], []
    for fam in families:
        test_idx = [i for i, r in enumerate(recs) if model_family(r.model) == fam]
        groups.append(np.array(test_idx))
        train = [r for r in recs if model_family(r.model) != fam]
        test = [recs[i] for i in test_idx]
        pred["predictor"][test_idx] = _xgb_predictions(train, test, params, seed)
        for name, values in _baselines(train, test).items():
            pred[name][test_idx] = values
        true = np.array([r.gpu_util_pct for r in test])
        folds.append(
            {
                "held_out_family": fam,
                "models": sorted({r.model for r in test}),
                "n": len(test),
                "mae_pct": {m: float(np.mean(np.abs(pred[m][test_idx] - true))) for m in names},
            }
        )
    true = np.array([r.gpu_util_pct for r in recs])
    gpus = [r.gpu_model for r in recs]
    sources = sorted({r.source for r in recs})
    src = np.array([r.source for r in recs])
    per_source = {}
    if len(sources) > 1:
        for s_name in sources:
            idx = np.flatnonzero(src == s_name)
            per_source[s_name] = {
                "n": len(idx),
                "mae_pct": {m: float(np.mean(np.abs(pred[m][idx] - true[idx]))) for m in names},
            }
    out = {
        "method": "leave one model family out (families: " + ", ".join(families) + ")",
        "n_records": len(recs),
        "sources": sources,
        "synthetic": all(s.startswith("synthetic") for s in sources),
        "methods": {m: _scores(pred[m], true, gpus, groups) for m in names},
        "folds": folds,
        "per_source": per_source,
    }
    if online_name is not None and online_measured is not None and online_window_s is not None:
        n_meas = int(online_measured.sum())
        out["online_profile"] = {
            "name": online_name,
            "window_s": online_window_s,
            "gpu_seconds_per_job": online_window_s,
            "records_measured": n_meas,
            "records_modeled": len(recs) - n_meas,
            "modeled_as": f"truth + mean of {max(1, round(online_window_s / SAMPLE_PERIOD_S))} samples of "
            f"N(0, {SAMPLE_NOISE_PCT:g} pts) noise (no warm-up: on synthetic profiles it wins by construction)",
        }
    return out


def format_evaluation(ev: Mapping[str, Any]) -> str:
    """A plain-text report of :func:`evaluate_predictor`."""
    lines = [f"predictor evaluation: {ev['method']}; {ev['n_records']} records from {', '.join(ev['sources'])}"]
    if ev["synthetic"]:
        lines.append(
            "  SYNTHETIC profiles (a roofline model, no GPU measured them) until profile_gpu records real "
            "ones: these figures say nothing about real GPUs; the analytic baseline shares the generator's "
            "structure and is favoured."
        )
    lines.append(
        f"  {'method':<20}{'MAE (pts)':>10}{'Spearman':>10}{'in-family':>10}{'called safe':>13}{'of them >100%':>15}"
    )

    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    for name, m in ev["methods"].items():
        c = m["colocation"]
        share = "-" if c["unsafe_share_of_safe"] is None else f"{c['unsafe_share_of_safe'] * 100:.1f} %"
        lines.append(
            f"  {name:<20}{m['mae_pct']:>10.1f}{num(m['spearman']):>10}{num(m['spearman_within_family']):>10}"
            f"{c['called_safe']:>13d}{share:>15}"
        )
    base = next(iter(ev["methods"].values()))["colocation"]
    lines.append(
        f"  (pairs of configurations on one GPU model: {base['pairs']}; truly over 100 %: "
        f"{base['base_rate_over_100'] * 100:.1f} %)"
    )
    op = ev.get("online_profile")
    if op:
        lines.append(
            f"  {op['name']}: {op['gpu_seconds_per_job']:g} GPU-s per new job before placement; "
            f"{op['records_measured']} records from measured samples, {op['records_modeled']} MODELED ("
            f"{op['modeled_as']})"
        )
    for s_name, d in (ev.get("per_source") or {}).items():
        lines.append(
            f"    source {s_name} ({d['n']} records): MAE " + ", ".join(f"{k} {v:.1f}" for k, v in d["mae_pct"].items())
        )
    for f in ev["folds"]:
        maes = ", ".join(f"{k} {v:.1f}" for k, v in f["mae_pct"].items())
        lines.append(f"    held out {f['held_out_family']} ({', '.join(f['models'])}, {f['n']} records): MAE {maes}")
    return "\n".join(lines)
