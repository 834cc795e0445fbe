"""What a DOP rule is configured with and what it hands back: its settings (every tunable number's one
default), a round's plan, the decision after a round, and the statistics a round leaves behind."""

from __future__ import annotations

import dataclasses

__all__ = ["DopSettings", "RoundStat", "RoundDecision", "RoundPlan"]


@dataclasses.dataclass(frozen=True)
class DopSettings:
    """The rules' tunable numbers, each with its one default (DOPpler's where the paper states one)."""

    cap: float = 128.0  # DOPpler's initial DOP cap
    error_threshold: float = 0.05  # mean parallel-vs-serial error a DOP may show (above the serial noise)
    failure_threshold: float = 0.05  # failures caused by parallelism a round may show, x DOP
    z_threshold: float = 3.0  # |robust z| past which a candidate is an outlier (re-timed serially)
    sample_share: float = 0.2  # DOPpler's share of a round's good candidates re-timed serially
    correction_limit: float = 0.25  # |mean signed error| below which the rest is corrected, not re-timed
    min_step: int = 2  # a good round raises the DOP by half the way to the cap, clamped to [min, max]
    max_step: int = 7
    reprobe_after: int = 2  # rounds at DOP 1 after a back-off before parallelism is re-probed (then 2x, 4x)
    max_reprobes: int = 3
    noise_window: int = 16  # measured serial noise: the last repeated serial timings averaged
    noise_z: float = 1.0  # standard errors of (mean error - mean noise) allowed on top of the threshold
    pair_window: int = 12  # pooled sample: the recent pairs at the current DOP a round decides on
    min_pooled_pairs: int = 4  # pooled sample: pairs after which a round re-times only its fastest
    min_noise_pairs: int = 2  # pooled sample: noise pairs known before a round stops adding one

    def __post_init__(self) -> None:
        for name in (
            "reprobe_after",
            "noise_window",
            "pair_window",
            "min_pooled_pairs",
            "min_noise_pairs",
            "min_step",
            "max_step",
        ):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)!r}")
        for name in ("max_reprobes", "noise_z", "error_threshold", "failure_threshold", "correction_limit"):
            if float(getattr(self, name)) < 0:
                raise ValueError(f"{name} must not be negative, not {getattr(self, name)!r}")
        if not 0 < float(self.sample_share) <= 1:
            raise ValueError(f"sample_share must be in (0, 1], not {self.sample_share!r}")
        if float(self.cap) < 1:
            raise ValueError(f"cap must be at least 1, not {self.cap!r}")


@dataclasses.dataclass
class RoundStat:
    dop: int
    mean_error: float | None
    n_sampled: int
    failures: int = 0
    cap: float = 128.0
    dop_after: int = 1
    mean_signed_error: float | None = None
    adapted: bool = True
    reprobe: bool = False  # this round's decision re-opened parallelism after a back-off to 1
    sample_share: float | None = None  # the share of good candidates this round re-measured serially
    serial_noise: float | None = None  # the host's serial noise this round's decision allowed for
    outliers_skipped: int = 0  # slow candidates left as measured, not timed serially (rankable_bound)
    sample_topped_up: int = 0  # candidates added to a shrunk sample whose error was past correction (top_up_sample)
    n_pooled: int | None = None  # the pairs this round's decision used (pooled sample: recent rounds' too)
    allowed_error: float | None = None  # the mean error this round could show and keep its DOP (allowed_error)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class RoundDecision:
    dop_before: int
    dop_after: int
    mean_error: float | None
    mean_signed_error: float | None
    n_sampled: int
    failures: int
    backed_off: bool
    cap_before: float
    cap_after: float
    corrected_latencies: list[float] | None = None
    correction_applied: bool = False
    errors: list[float] = dataclasses.field(default_factory=list)
    serial_noise: float | None = None


@dataclasses.dataclass(frozen=True)
class RoundPlan:
    """How a round of ``n`` candidates starts: the DOP it measures at, and the candidates it probes
    first (in parallel, then serially) when that DOP is not validated yet (empty: no probe)."""

    dop: int
    probe: tuple[int, ...] = ()
