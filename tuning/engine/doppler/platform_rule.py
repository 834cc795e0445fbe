"""The platform's DOP rule (a run's ``dop="auto"``): DOPpler's, refined where the host's timings showed it
had to be. Each refinement is a mixin over :class:`~tuning.engine.doppler.doppler_rule.DopplerRule`;
:class:`PlatformRule` is all of them, and ``bench/dop_presets.py`` puts DOPpler's choices back one at a
time (the ablations the benches measure).

:class:`ProbeStart`: DOPpler's first round runs at DOP 1, a whole round measured serially to learn nothing
about parallel error. Here the first round starts at the DOP that serial round would have led to, and its
probe (rounds.py: a spread sample measured in parallel, then serially, before the rest of the round)
decides whether to keep it; a bad probe measures the rest serially.

:class:`PooledSample`: the error a round decides on is pooled with the recent rounds' at the same DOP (the
last ``pair_window`` pairs; emptied when the DOP changes or backs off): once that window holds
``min_pooled_pairs`` pairs, a round re-times serially only its fastest candidate (plus its fast outliers
and failures), and a noise pair (one of a probe) only while fewer than ``min_noise_pairs`` are known or
when the decision hinges on it. A round whose own pairs are :meth:`~PooledSample.contested` (they would
back off alone, or their error is past the pooled allowance) first times them serially once more (with
:class:`ConfirmedBackOff`: one timing where the top-up is several, and a single glitched serial timing was
what contested most such rounds), then, still contested, is topped up to ``sample_share`` and, if its own
evidence still backs off, decides alone. Interference is a property of the host and the DOP that drifts
slowly (a change shows as a contested round), so the pooled pairs give the decision as many pairs as
DOPpler's 20 % of a round at a fraction of the serial timings, and the serial share no longer caps the
gain of a large DOP: DOPpler's 20 % keeps a round at DOP 16 at 1/16 + 0.2 of a serial one (x0.26), the
fastest alone at 1/16 + 1/n. A shrunk sample whose error is past ``correction_limit`` is topped up to
``sample_share`` before the round decides (``DopRule.top_up_sample``): past that limit the round times
its whole rest serially, and two timings (one of them possibly a serial glitch: a -0.62 error read from
two was seen) are too little evidence to pay for that.

:class:`PairsProbe`: with the pooled sample, a probe times ``min_pooled_pairs`` candidates (two per slot
at least), the window's first pairs, not DOPpler's 20 % of the round (a probe of 7 pairs in a round of 32
bought 3 serial timings that no decision needed).

:class:`MeasuredNoise`: the threshold is judged against the serial measurement's own repeatability on this
host: each parallel round re-measures serially a second time the fastest of its sample (two of a probe),
the relative difference of the two serial timings is the host's *serial noise*, and a round backs off only
when its parallel-vs-serial error exceeds the mean serial noise (last ``noise_window`` pairs) by more than
``error_threshold`` plus ``noise_z`` standard errors of that difference (``allowed_error``), the excess
allowed never beyond ``correction_limit``. Both means come from a handful of pairs (2-4 sampled, 3-16
noise pairs), so their difference is itself noisy: the standard errors follow from the means, each pair's
error being the absolute difference of two noisy timings (half-normal: sd = mean x sqrt(pi/2 - 1)).
Without that term, 42 % of the DOP 2 rounds of the 2026-12-03 runs backed off on this 2-core VM where the
replay found parallel timings rank candidates as well as a second serial pass does (Spearman 0.970
against 0.985, 0.947 against 0.944); with it (z = 1), 11 % of those rounds would have. DOPpler's rule
compares against one serial timing as if it were exact; where one serial timing differs from the next by
more than 5 % (measured on a 2-core VM: 6-10 % mean, number=3, repeat=1, min_repeat_ms=100), every round
of any DOP "fails" and parallelism never engages, though parallel timings are no further from the serial
ones than serial timings are from each other.

:class:`RankableOutliers`: a *slow* outlier is re-measured serially only when its parallel latency is at
most DOP x the round's median: DOP measurements sharing its core could have made that much of a candidate
in the round's faster half. A slower one ranks after the round's median whatever its true latency, so its
serial timing cannot change what the search keeps, and it is the dearest timing of the round (a candidate
30x the median costs 30x as much as the median's minimum repeat). Fast outliers and failures are always
re-measured. On a 2-core host the slow outliers were most of DOPpler's serial time (2026-12-03: 11 sample
timings of 0.8 s each against 0.24 s for the probe's). The same bound (``rankable_bound``, widened by the
error when serial timings came out slower) spares the candidates past it when a round's error is too large
to correct and its rest is timed serially.

:class:`ConfirmedBackOff`: a round about to back off for its error (a probe's, or a round's own pairs
deciding alone) first times its sampled candidates serially once more (``confirm_wanted``): each
candidate's two serial timings are a noise pair and their mean its serial reference, and the round decides
on that. A single serial timing on a shared host is itself off by tens of percent now and then
(``bench/probe_back_offs.py``, 2026-12-04: a serial repeat differed by 0.10-0.13 on average and by
0.47-0.56 at most on a 2-core VM), and one probe's four pairs and one noise pair then read as interference:
the engine's probe round replayed over such timings backed off 31-42 % of the time under the immediate
rule, 7-10 % confirmed, for about one more serial timing a probe. A real interference keeps the parallel
timings slow, so the confirmed round backs off all the same (a bias past ``correction_limit`` whatever the
noise), where a wrong back-off costs rounds at DOP 1 and a re-probe. The second timings join the
serial-noise window like any repeat; taken when timings disagreed, they widen the allowance of the next
rounds for a while (at most to ``correction_limit`` above the noise).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

from tuning.engine.doppler.doppler_rule import DopplerRule
from tuning.engine.doppler.rule import DopRule, FixedDop
from tuning.engine.latency import is_timing

__all__ = [
    "ProbeStart",
    "PooledSample",
    "PairsProbe",
    "MeasuredNoise",
    "RankableOutliers",
    "ConfirmedBackOff",
    "PlatformRule",
    "make_rule",
]

_HALF_NORMAL_SD = math.sqrt(math.pi / 2 - 1)  # sd / mean of |N(0, s)|


class ProbeStart(DopplerRule):
    """The first round at the DOP a serial first round would have led to, its probe deciding (module doc)."""

    def _starting_dop(self, initial_dop: int) -> int:
        dop = super()._starting_dop(initial_dop)
        return self._clamp(min(self._cap, 1 + self._step(1))) if initial_dop == 1 else dop


class MeasuredNoise(DopplerRule):
    """The error threshold counted above the host's measured serial noise (module doc)."""

    @property
    def serial_noise(self) -> float | None:
        """Mean relative difference of repeated serial timings (recent ``noise_window``); None before any."""
        if not self.noise_errors:
            return None
        return sum(self.noise_errors) / len(self.noise_errors)

    def noise_pairs_wanted(self, probe: bool = False, contested: bool = False) -> int:
        """Two noise pairs a probe, one any other round."""
        return 2 if probe else 1

    def allowed_error(self, errors: Sequence[float] = ()) -> float:
        """Before any serial repeat: the threshold. After: the serial noise, plus the threshold and
        ``noise_z`` standard errors of (mean error - mean noise), the excess never beyond
        ``correction_limit`` (module doc)."""
        s = self.settings
        noise = self.serial_noise
        if noise is None:
            return s.error_threshold
        excess = s.error_threshold + s.noise_z * self._excess_standard_error(errors, noise)
        return noise + min(excess, max(s.error_threshold, s.correction_limit))

    def _excess_standard_error(self, errors: Sequence[float], noise: float) -> float:
        """Standard error of mean(errors) - mean(noise pairs), each an absolute difference of two noisy
        timings (half-normal: sd = mean x sqrt(pi/2 - 1)), so that two pairs need not give their own sd."""
        var = (_HALF_NORMAL_SD * noise) ** 2 / max(1, len(self.noise_errors))
        if errors:
            var += (_HALF_NORMAL_SD * sum(errors) / len(errors)) ** 2 / len(errors)
        return math.sqrt(var)


class PooledSample(DopplerRule):
    """Rounds decide on the recent rounds' pairs at their DOP too, and re-time only their fastest once
    those hold ``min_pooled_pairs`` (module doc)."""

    def noise_pairs_wanted(self, probe: bool = False, contested: bool = False) -> int:
        """Of the noise pairs the noise rule wants, one of a probe, and one of a later round only while
        fewer than ``min_noise_pairs`` are known or when its decision hinges on the noise (``contested``):
        the standard-error term of ``allowed_error`` already widens the allowance of few pairs."""
        if super().noise_pairs_wanted(probe, contested) == 0:
            return 0
        return 1 if probe or contested or len(self.noise_errors) < self.settings.min_noise_pairs else 0

    def contested(self, parallel: Sequence[float | None], serial: Sequence[float | None]) -> bool:
        """Also when the round's own mean error is past the allowance of the pooled pairs (the host may have
        changed: the round's sample is topped up and, past the allowance on its own evidence, decides alone)."""
        signed = self._signed_errors(parallel, serial)
        if self._error_too_large(signed):
            return True
        if not (signed and self.pairs):
            return False
        pooled = [abs(e) for e in self.pairs + signed]
        return sum(abs(e) for e in signed) / len(signed) > self.allowed_error(pooled)

    def _decision_errors(self, signed: list[float]) -> list[float]:
        """The round's own signed errors after the recent rounds' at this DOP, unless its own would back off
        (then the pooled pairs are dropped)."""
        if not signed or self._error_too_large(signed):
            return signed
        return self.pairs + signed

    def _remember_pairs(self, signed: list[float], backed_off: bool, dop_before: int) -> None:
        """The window holds pairs of the DOP the next round measures at."""
        keep = signed and not backed_off and self._dop == dop_before
        self.pairs = signed[-self.settings.pair_window :] if keep else []

    def _next_share(self, dop_before: int, excess_error: float | None, backed_off: bool) -> None:
        """The fastest alone once the window holds enough pairs of this DOP."""
        s = self.settings
        self._share = 0.0 if len(self.pairs) >= s.min_pooled_pairs else s.sample_share

    def _pooled_count(self, signed: list[float]) -> int | None:
        return len(signed)


class PairsProbe(PooledSample):
    """A probe times the ``min_pooled_pairs`` the pooled rule decides on (two per slot at least), not
    DOPpler's 20 % of the round (module doc)."""

    def probe_size(self, n_candidates: int, dop: int) -> int:
        return max(2 * max(1, int(dop)), self.settings.min_pooled_pairs)


class RankableOutliers(DopplerRule):
    """Slow outliers past DOP x the round's median are left as measured (module doc)."""

    def rankable_bound(
        self, latencies: Sequence[float | None], dop: int, mean_signed_error: float | None = None
    ) -> float | None:
        """DOP x the median of the valid ``latencies`` (None at DOP 1), widened by (1 - error) when the
        round's serial timings came out slower than its parallel ones (a negative signed error)."""
        valid = [x for x in latencies if is_timing(x)]
        if not valid or dop <= 1:
            return None
        widen = max(1.0, 1.0 - mean_signed_error) if mean_signed_error is not None else 1.0
        return max(1, int(dop)) * statistics.median(valid) * widen


class ConfirmedBackOff(DopplerRule):
    """A round about to back off for its error times its sample serially once more first (module doc);
    a shrunk sample about to be topped up too."""

    @property
    def second_look(self) -> bool:
        return True


class PlatformRule(
    ProbeStart, PairsProbe, PooledSample, MeasuredNoise, RankableOutliers, ConfirmedBackOff, DopplerRule
):
    """The platform's rule: DOPpler's with every refinement of the module doc."""


def make_rule(dop: str | int, max_dop: int, rule: Callable[[int], DopRule] | None = None) -> DopRule:
    """The rule a runner uses for a run's ``dop`` setting: "auto" adapts (``rule``, default
    :class:`PlatformRule`; benches pass an ablation), a number is a :class:`FixedDop`."""
    if dop == "auto":
        return (rule or PlatformRule)(max_dop)
    try:
        fixed = int(dop)
    except (TypeError, ValueError):
        raise ValueError(f"dop must be 'auto' or a whole number, not {dop!r}") from None
    return FixedDop(fixed, max_dop)
