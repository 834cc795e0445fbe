"""The one rule that turns final timings into a deployment verdict. Django-free and pure.

Only compiled measurements count: the tuned module's and onnxruntime's per-repeat samples, timed in the
same minutes on the same host and thread count. Each side is summarised as its median and inter-quartile
range (IQR, 25th to 75th percentile). The rule, in order:

1. a timing taken while the host's 1-minute load average exceeded the cores the timing uses is
   ``overloaded``: flagged, never a clean verdict (the caller re-times once before accepting it);
2. without onnxruntime samples there is ``no comparison``;
3. when the two IQR intervals overlap the engines are ``within noise`` of each other;
4. otherwise the lower median wins: ``faster`` (tuned TVM) or ``slower`` (deploy onnxruntime).

The per-task estimate (sum over tasks of weight x best kernel latency) is never part of the verdict; when it
is more than :data:`ESTIMATE_GAP_LIMIT` away from the compiled latency, :func:`estimate_gap` says so and why.
A run that took a compiled checkpoint mid-run (``tuning.engine.checkpoint``) shows it beside the estimate
(:func:`checkpoint_note`).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import NamedTuple

__all__ = [
    "ESTIMATE_GAP_LIMIT",
    "FASTER",
    "FLAGGED",
    "HostLoad",
    "LABELS",
    "NO_COMPARISON",
    "SLOWER",
    "Verdict",
    "WITHIN_NOISE",
    "checkpoint_note",
    "estimate_gap",
    "spread",
    "verdict",
]

FASTER = "faster"
SLOWER = "slower"
WITHIN_NOISE = "within noise"
FLAGGED = "overloaded"
NO_COMPARISON = "no comparison"
LABELS = (FASTER, SLOWER, WITHIN_NOISE, FLAGGED, NO_COMPARISON)

# |compiled - estimate| / estimate above this is shown and explained beside the result
ESTIMATE_GAP_LIMIT = 0.15


@dataclasses.dataclass(frozen=True)
class HostLoad:
    """The highest 1-minute load average sampled around the timing, and the cores the timing uses."""

    load: float
    cores: int

    @property
    def overloaded(self) -> bool:
        return self.load > max(1, int(self.cores))

    def reason(self) -> str:
        return (
            f"host load {self.load:.2f} was above the {max(1, int(self.cores))} core(s) the timing uses: "
            "the timings describe a contended machine, not the model"
        )


def spread(samples: Sequence[float]) -> tuple[float, float, float]:
    """(median, 25th percentile, 75th percentile) of ``samples`` (linear interpolation, as numpy's default)."""
    values = sorted(float(s) for s in samples)
    if not values:
        raise ValueError("no samples")
    if len(values) == 1:
        return values[0], values[0], values[0]
    q25, _, q75 = statistics.quantiles(values, n=4, method="inclusive")
    return statistics.median(values), q25, q75


@dataclasses.dataclass(frozen=True)
class Verdict:
    label: str  # one of LABELS
    ratio: float | None  # tuned median / onnxruntime median (< 1: tuned TVM is faster)
    tuned_median: float | None
    tuned_iqr: float | None
    ort_median: float | None
    ort_iqr: float | None
    flagged_reason: str = ""

    @property
    def faster_engine(self) -> str | None:
        """ "tvm" or "onnxruntime" only when the verdict is clear; None when within noise, flagged or missing."""
        return {FASTER: "tvm", SLOWER: "onnxruntime"}.get(self.label)

    @property
    def sentence(self) -> str:
        """The verdict in the words every page, the API, the package and the CLI use ("" without one)."""
        ratio = f" (tuned / onnxruntime median {self.ratio:.2f}×)" if self.ratio is not None else ""
        if self.label == FASTER:
            return f"Tuned TVM is faster than onnxruntime on this target: deploy the tuned module{ratio}"
        if self.label == SLOWER:
            return f"Tuned TVM is slower than onnxruntime on this target: deploy onnxruntime{ratio}"
        if self.label == WITHIN_NOISE:
            return (
                "Tuned TVM and onnxruntime are within noise of each other on this target (their "
                f"inter-quartile ranges overlap){ratio}: either engine will do"
            )
        if self.label == FLAGGED:
            return f"No verdict: {self.flagged_reason}{ratio}"
        return ""

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "faster_engine": self.faster_engine, "sentence": self.sentence}


class _Spread(NamedTuple):
    median: float
    iqr: float
    q25: float
    q75: float


def _summary(samples: Sequence[float] | None) -> _Spread | None:
    if not samples:
        return None
    median, q25, q75 = spread(samples)
    return _Spread(median, q75 - q25, q25, q75)


def verdict(
    tuned_samples: Sequence[float] | None, ort_samples: Sequence[float] | None, load: HostLoad | None = None
) -> Verdict:
    """The verdict of the tuned module's timing samples against onnxruntime's (any one unit, the same for
    both), given the host load sampled around the timing (None: not sampled)."""
    tuned = _summary(tuned_samples)
    ort = _summary(ort_samples)
    ratio = tuned.median / ort.median if tuned is not None and ort is not None and ort.median else None

    def judged(label: str, flagged_reason: str = "") -> Verdict:
        return Verdict(
            label,
            ratio=ratio,
            tuned_median=None if tuned is None else tuned.median,
            tuned_iqr=None if tuned is None else tuned.iqr,
            ort_median=None if ort is None else ort.median,
            ort_iqr=None if ort is None else ort.iqr,
            flagged_reason=flagged_reason,
        )

    if tuned is None:
        return judged(NO_COMPARISON)
    if load is not None and load.overloaded:
        return judged(FLAGGED, flagged_reason=load.reason())
    if ort is None:
        return judged(NO_COMPARISON)
    if tuned.q25 <= ort.q75 and ort.q25 <= tuned.q75:  # the IQR intervals overlap
        return judged(WITHIN_NOISE)
    return judged(FASTER if tuned.median < ort.median else SLOWER)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g} ms"


def checkpoint_note(checkpoint: dict | None) -> str:
    """The compiled checkpoint in words, as the run page and the CLIs show it ("" when none was taken): the
    compiled latency then, and the per-task estimate then with its distance from it."""
    if not isinstance(checkpoint, dict):
        return ""
    trials = checkpoint.get("trials")
    after = f"after {trials:,} trials" if isinstance(trials, int) else "once every task had a record"
    compiled, estimate = checkpoint.get("compiled_s"), checkpoint.get("estimate_s")
    if checkpoint.get("error") or not isinstance(compiled, (int, float)) or not isinstance(estimate, (int, float)):
        return f"not timed {after}: {checkpoint.get('error') or 'no latency'}"
    iqr = checkpoint.get("compiled_iqr_s")
    iqr_words = f" (IQR {_ms(iqr)})" if isinstance(iqr, (int, float)) else ""
    gap = (compiled - estimate) / estimate if estimate > 0 else None
    off = "" if gap is None else f": {abs(gap) * 100:.0f} % {'above' if gap >= 0 else 'below'} it"
    return f"{_ms(compiled)}{iqr_words} compiled {after}, when the per-task estimate read {_ms(estimate)}{off}"


def estimate_gap(estimate_s: float | None, compiled_s: float | None) -> dict | None:
    """How far the per-task estimate is from the compiled model's measured latency, and why, when the gap
    exceeds :data:`ESTIMATE_GAP_LIMIT`; None when it does not, or either number is missing."""
    if not estimate_s or not compiled_s:
        return None
    gap = (compiled_s - estimate_s) / estimate_s
    if abs(gap) <= ESTIMATE_GAP_LIMIT:
        return None
    if gap > 0:
        why = (
            "the estimate sums each task's best kernel timed alone (warm caches, one kernel at a time) and "
            "leaves out what the whole model adds: the virtual machine's dispatch and memory allocation, "
            "operators that are not tuning tasks, data moving between kernels, and any load on the host "
            "while the compiled model was timed"
        )
    else:
        why = (
            "the kernels ran faster together than their separate best timings suggest (kernel fusion at "
            "compile time, caches warmed by the previous kernel) or the host was busier while tasks were "
            "tuned than at the final timing"
        )
    return {
        "ratio": compiled_s / estimate_s,
        "gap": gap,
        "note": f"The compiled model measured {abs(gap) * 100:.0f} % {'above' if gap > 0 else 'below'} the "
        f"per-task estimate: {why}. The verdict uses the compiled measurement only.",
    }
