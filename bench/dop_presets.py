"""DOP rules the benches compare, none of them a production choice: the platform's rule with one of
DOPpler's published choices put back (the ablations), and the halving sample the pooled one replaced.

The platform's rule (``tuning/engine/doppler/platform_rule.py``) is DOPpler's with six refinements, each a
mixin; an ablation here is the platform's rule without one of them, so it behaves as DOPpler does in that
respect and as the platform does in every other. A bench passes the class as a run's or runner's
``dop_rule`` (a class is a factory of rules: ``Rule(max_dop)``).

    serial_start        the first round at DOP 1, timed serially (no ProbeStart)
    fixed_sample        DOPpler's 20 % re-timed every round, no pooled pairs (no PooledSample, PairsProbe)
    dopplers_threshold  one serial timing taken as exact (no MeasuredNoise)
    all_outliers        every outlier re-timed serially (no RankableOutliers)
    immediate_back_off  a round backs off on its first serial timings (no ConfirmedBackOff)
    share_probe         a probe times 20 % of the round, not the pooled rule's pairs (no PairsProbe)
"""

from __future__ import annotations

from tuning.engine.doppler.doppler_rule import DopplerRule
from tuning.engine.doppler.platform_rule import (
    ConfirmedBackOff,
    MeasuredNoise,
    PairsProbe,
    PlatformRule,
    PooledSample,
    ProbeStart,
    RankableOutliers,
)

__all__ = ["SerialStart", "FixedSample", "DopplersThreshold", "AllOutliers", "ImmediateBackOff", "ShareProbe",
           "AdaptiveSample", "ABLATIONS", "rule_named", "PlatformRule",
           "DopplerRule"]


class SerialStart(PairsProbe, PooledSample, MeasuredNoise, RankableOutliers, ConfirmedBackOff, DopplerRule):
    """The platform's rule, its first round at DOP 1 (DOPpler's start)."""


class FixedSample(ProbeStart, MeasuredNoise, RankableOutliers, ConfirmedBackOff, DopplerRule):
    """The platform's rule re-timing DOPpler's 20 % every round (no pooled pairs; a probe 20 % too)."""


class DopplersThreshold(ProbeStart, PairsProbe, PooledSample, RankableOutliers, ConfirmedBackOff, DopplerRule):
    """The platform's rule with DOPpler's threshold: one serial timing taken as exact, no noise pairs."""


class AllOutliers(ProbeStart, PairsProbe, PooledSample, MeasuredNoise, ConfirmedBackOff, DopplerRule):
    """The platform's rule re-timing every outlier serially, however slow (DOPpler's)."""


class ImmediateBackOff(ProbeStart, PairsProbe, PooledSample, MeasuredNoise, RankableOutliers, DopplerRule):
    """The platform's rule backing off on a round's first serial timings (DOPpler's)."""


class ShareProbe(ProbeStart, PooledSample, MeasuredNoise, RankableOutliers, ConfirmedBackOff, DopplerRule):
    """The platform's rule whose probe times DOPpler's 20 % of the round."""


class AdaptiveSample(DopplerRule):
    """The sample rule the pooled one replaced: a calm round (its error above the serial noise under half
    the threshold, at a DOP > 1 that stays) lets the next round at that DOP time half as many good
    candidates serially, never under ``min_sample_share``; any other round restores ``sample_share``."""

    min_sample_share = 0.1

    def _next_share(self, dop_before: int, excess_error: float | None, backed_off: bool) -> None:
        s = self.settings
        calm = (not backed_off and excess_error is not None and dop_before > 1 and self.dop == dop_before
                and excess_error <= s.error_threshold / 2)
        floor = min(self.min_sample_share, s.sample_share)
        self._share = max(floor, self.share / 2) if calm else s.sample_share


# name -> rule class, as the benches' sides and JSON keys name them
ABLATIONS = {
    "serial_start": SerialStart,
    "fixed_sample": FixedSample,
    "dopplers_threshold": DopplersThreshold,
    "all_outliers": AllOutliers,
    "immediate_back_off": ImmediateBackOff,
    "share_probe": ShareProbe,
}


def rule_named(name: str | None):
    """The rule class an ablation's name stands for (None: None, the platform's rule); names travel in a
    bench's JSON job specs where classes cannot."""
    if name is None:
        return None
    try:
        return ABLATIONS[name]
    except KeyError:
        raise ValueError(f"no DOP rule preset {name!r}: one of {', '.join(ABLATIONS)}") from None
