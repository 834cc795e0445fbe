"""DOPpler's degree-of-parallelism (DOP) controller, as pure functions.

The rule (DOPpler, IEEE TPDS 2023; Conductor's ``doppler_bic``):

* DOP starts at 1 under a cap of 128 (and never above ``max_dop``, what the
  measuring cores allow: workers x threads <= cores). With ``start="probe"`` (the
  platform's default, see ``DOP_STARTS``) it starts where that first serial round
  would have taken it, validated by the round's probe instead.
* Each round measures its candidates DOP at a time, then re-measures
  *serially* (one worker, the deployment thread count) a sample: the outliers
  (robust z-score with a double MAD > ``z_threshold``) plus ``sample_share``
  of the good candidates.
* error_i = |parallel_i - serial_i| / parallel_i, averaged over the sample.
* If the mean error > ``error_threshold`` or failures caused by parallelism
  > ``failure_threshold`` x DOP: cap = 0.9 x DOP (cap stays DOP if DOP was at
  the cap) and DOP x= 0.8. Else DOP += (cap - DOP) / 2, the step clamped to
  [2, 7], never above the cap or ``max_dop``.
* Latencies that were not re-measured are scaled by (1 - mean error) when
  |mean error| < ``correction_limit`` (0.25). We use the *signed* mean
  ((parallel - serial) / parallel), which equals DOPpler's unsigned one when
  parallel runs are slower, and does not push numbers the wrong way when they
  are not.

Every parallel worker measures at the deployment thread count T on a slot of its own (slots.py),
and the serial reference is slot 0 at T threads while the other slots idle, so the error measures
interference only, never thread scaling; max DOP = the number of slots (floor(cores / T)).
With ``sample="adaptive"`` (see ``DOP_SAMPLES``) a round whose sample showed
an error below half the threshold, at a DOP that stays, lets the next round at that DOP sample half as
many good candidates (never under ``min_sample_share``; outliers, failures and the fastest are always
re-measured); any other round restores ``sample_share``. A shrunk sample whose error is past
``correction_limit`` is topped up to ``sample_share`` before the round decides (``top_up_sample``): past
that limit the round times its whole rest serially, and two timings (one of them possibly a serial
glitch: a -0.62 error read from two was seen) are too little evidence to pay for that. DOPpler
samples 20 % every round, which keeps a DOP 2 round at 0.5 + 0.2 of a serial one however calm the host.

With ``sample="pooled"`` (the platform's default) the error a round decides on is pooled with the recent
rounds' at the same DOP (the last ``pair_window`` pairs; emptied when the DOP changes or backs off): once
that window holds ``min_pooled_pairs`` pairs, a round re-times serially only its fastest candidate (plus
its fast outliers and failures), and a noise pair (one of a probe) only while fewer than
``min_noise_pairs`` are known or when the decision hinges on it. A round whose own pairs are
:meth:`~DOPController.contested` (they would back off alone, or their error is past the pooled
allowance) first times them serially once more (``back_off="confirmed"``: one timing where the top-up is
several, and a single glitched serial timing was what contested most such rounds), then, still contested,
is topped up to ``sample_share`` and, if its own evidence still backs off, decides alone. A probe under
this rule times ``min_pooled_pairs`` candidates (two per slot at least), the window's first pairs, not
20 % of the round (``probe="pairs"``, :meth:`~DOPController.probe_size`; ``"share"``: DOPpler's 20 %).
Interference is a property of the host and the DOP that drifts slowly (a change shows as a contested
round), so the pooled pairs give the decision as many pairs as DOPpler's 20 % of a round at a fraction
of the serial timings, and the serial share no longer caps the gain of a large DOP: DOPpler's 20 % keeps
a round at DOP 16 at 1/16 + 0.2 of a serial one (x0.26), the fastest alone at 1/16 + 1/n.

With ``noise="measured"`` (the platform's default, see ``DOP_NOISES``) the threshold is judged against
the serial measurement's own repeatability on this host: each parallel round re-measures serially a
second time the fastest of its sample (two of a probe), the relative difference of the two serial
timings is the host's *serial noise*, and a round backs off only when its parallel-vs-serial error
exceeds the mean serial noise (last ``noise_window`` pairs) by more than ``error_threshold`` plus
``noise_z`` standard errors of that difference (``allowed_error``), the excess allowed never beyond
``correction_limit``. Both means come from a handful of pairs (2-4 sampled, 3-16 noise pairs), so their
difference is itself noisy: the standard errors follow from the means, each pair's error being the absolute
difference of two noisy timings (half-normal: sd = mean x sqrt(pi/2 - 1)). Without that term, 42 % of the
DOP 2 rounds of the 2026-12-03 runs backed off on this 2-core VM where the replay found parallel timings
rank candidates as well as a second serial pass does (Spearman 0.970 against 0.985, 0.947 against 0.944);
with it (z = 1), 11 % of those rounds would have. DOPpler's
rule compares against one serial timing as if it were exact; where one serial timing differs from the
next by more than 5 % (measured on a 2-core VM: 6-10 % mean, number=3, repeat=1, min_repeat_ms=100),
every round of any DOP "fails" and parallelism never engages, though parallel timings are no further
from the serial ones than serial timings are from each other. ``noise="none"`` is DOPpler's rule.

With ``outliers="rankable"`` (the platform's default, see ``DOP_OUTLIERS``) a *slow* outlier is re-measured
serially only when its parallel latency is at most DOP x the round's median: DOP measurements sharing
its core could have made that much of a candidate in the round's faster half. A slower one ranks after
the round's median whatever its true latency, so its serial timing cannot change what the search keeps,
and it is the dearest timing of the round (the evaluator runs a candidate ``number`` times at least: a
candidate 30x the median costs 30x as much as the median's minimum repeat). Fast outliers and failures
are always re-measured. On a 2-core host the slow outliers were most of DOPpler's serial time
(2026-12-03: 11 sample timings of 0.8 s each against 0.24 s for the probe's). The same bound (``rankable_bound``,
widened by the error when serial timings came out slower) spares the candidates past it when a round's
error is too large to correct and its rest is timed serially. ``outliers="all"`` is DOPpler's.

With ``back_off="confirmed"`` (the platform's default, see ``DOP_BACK_OFFS``) a round about to back off for
its error (a probe's, or a round's own pairs deciding alone) first times its sampled candidates serially
once more (:meth:`~DOPController.confirm_wanted`): each candidate's two serial timings are a noise pair and
their mean its serial reference, and the round decides on that. A single serial timing on a shared host
is itself off by tens of percent now and then (``bench/probe_back_offs.py``, 2026-12-04: a serial repeat
differed by 0.10-0.13 on average and by 0.47-0.56 at most on a 2-core VM), and one probe's four pairs and
one noise pair then read as interference: the engine's probe round replayed over such timings backed off
31-42 % of the time under the immediate rule, 7-10 % confirmed, for about one more serial timing a probe.
A real interference keeps the parallel timings slow, so the confirmed round backs off all the same (a bias
past ``correction_limit`` whatever the noise), where a wrong back-off costs rounds at DOP 1 and a re-probe.
The second timings join the serial-noise window like any repeat; taken when timings disagreed, they
widen the allowance of the next rounds for a while (at most to ``correction_limit`` above the noise).
``back_off="immediate"`` decides on the first serial timings (DOPpler's rule).

A back-off to DOP 1 (one noisy probe on a loaded host) is not final: parallelism is re-probed after
``reprobe_after`` rounds, then twice as many, at most ``max_reprobes`` times (RoundStat.reprobe).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

from tuning.engine.doppler.parallel_error import summarize_parallel_error
from tuning.engine.latency import is_failed_latency
from tuning.engine.process.procpool import available_cpus

__all__ = ["DOPController", "RoundDecision", "RoundStat", "robust_z_scores", "default_max_dop", "DOP_STARTS",
           "DOP_SAMPLES", "DOP_NOISES", "DOP_OUTLIERS", "DOP_BACK_OFFS", "DOP_PROBES"]

# "serial": DOPpler as published, the first round at DOP 1 (a whole round measured serially to learn
# nothing about parallel error). "probe": start at the DOP that serial round would have led to, and
# let the first round's probe (rounds.py: a spread sample measured in parallel, then serially,
# before the rest of the round) decide whether to keep it; a bad probe measures the rest serially.
DOP_STARTS = ("probe", "serial")
# "fixed": DOPpler's sample_share every round. "adaptive": halve it after a calm round (module doc).
# "pooled": once recent rounds at the DOP hold min_pooled_pairs pairs, a round re-times only its fastest
# (and its outliers and failures) and decides on the pooled pairs (module doc).
DOP_SAMPLES = ("pooled", "adaptive", "fixed")
# "measured": the error threshold is counted above the host's measured serial noise (module doc).
# "none": DOPpler's rule, the serial timing taken as exact.
DOP_NOISES = ("measured", "none")
# "rankable": slow outliers past DOP x the round's median are not re-measured serially (module doc).
# "all": DOPpler's rule, every outlier is.
DOP_OUTLIERS = ("rankable", "all")
# "confirmed": a round about to back off for its error times its sample serially once more and decides on
# the mean of the two serial timings (module doc). "immediate": DOPpler's rule, it decides on the first.
DOP_BACK_OFFS = ("confirmed", "immediate")
# "pairs": with sample="pooled", a probe times the min_pooled_pairs the pooled rule decides on (two per slot
# at least; module doc). "share": DOPpler's sample_share of the round (any sample rule but pooled does).
DOP_PROBES = ("pairs", "share")

_HALF_NORMAL_SD = math.sqrt(math.pi / 2 - 1)  # sd / mean of |N(0, s)|


def default_max_dop(threads: int | None = None) -> int:
    """Cores this process may use (its affinity set): each parallel worker
    needs at least one core of its own."""
    return max(1, len(available_cpus()))


def _valid(x) -> bool:
    return not is_failed_latency(x)


def robust_z_scores(values: Sequence[float]) -> list[float]:
    """Robust z-scores with a double MAD: deviations below the median are
    scaled by the MAD of the lower half, above it by the MAD of the upper half
    (skewed latency distributions). z = 0.6745 (x - median) / MAD_side.
    A side with MAD 0 gives z = 0 for x == median and +-inf otherwise."""
    xs = [float(v) for v in values]
    if not xs:
        return []
    med = statistics.median(xs)
    lower = [med - v for v in xs if v <= med]
    upper = [v - med for v in xs if v >= med]
    mad_lo = statistics.median(lower) if lower else 0.0
    mad_hi = statistics.median(upper) if upper else 0.0
    out = []
    for v in xs:
        dev = v - med
        mad = mad_lo if v <= med else mad_hi
        if dev == 0:
            out.append(0.0)
        elif mad == 0:
            out.append(math.copysign(math.inf, dev))
        else:
            out.append(0.6745 * dev / mad)
    return out


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
    outliers_skipped: int = 0  # slow candidates left as measured, not timed serially (outliers="rankable")
    sample_topped_up: int = 0  # candidates added to a shrunk sample whose error was past correction (top_up_sample)
    n_pooled: int | None = None  # the pairs this round's decision used (sample="pooled": recent rounds' too)
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


class DOPController:
    """Chooses the DOP round by round from the measured parallel-vs-serial error."""

    def __init__(
        self,
        cap: float = 128,
        error_threshold: float = 0.05,
        failure_threshold: float = 0.05,
        z_threshold: float = 3.0,
        sample_share: float = 0.2,
        correction_limit: float = 0.25,
        max_dop: int | None = None,
        *,
        initial_dop: int = 1,
        min_step: int = 2,
        max_step: int = 7,
        adaptive: bool = True,
        reprobe_after: int = 2,
        max_reprobes: int = 3,
        start: str = "serial",
        sample: str = "fixed",
        min_sample_share: float = 0.1,
        noise: str = "none",
        noise_window: int = 16,
        noise_z: float = 1.0,
        outliers: str = "all",
        pair_window: int = 12,
        min_pooled_pairs: int = 4,
        min_noise_pairs: int = 2,
        back_off: str = "immediate",
        probe: str = "share",
    ) -> None:
        self.cap = float(cap)
        self.initial_cap = float(cap)
        # after backing off to DOP 1 (one noisy probe on a loaded host), try parallelism again after
        # reprobe_after rounds, then 2x, 4x ... as many rounds, at most max_reprobes times
        self.reprobe_after = max(1, int(reprobe_after))
        self.max_reprobes = max(0, int(max_reprobes))
        self.reprobes = 0
        self._reprobe_at: int | None = None
        self.error_threshold = float(error_threshold)
        self.failure_threshold = float(failure_threshold)
        self.z_threshold = float(z_threshold)
        self.sample_share = float(sample_share)
        self.correction_limit = float(correction_limit)
        self.max_dop = int(max_dop) if max_dop else default_max_dop()
        self.min_step = int(min_step)
        self.max_step = int(max_step)
        self.adaptive = bool(adaptive)
        if start not in DOP_STARTS:
            raise ValueError(f"start must be one of {', '.join(DOP_STARTS)}, not {start!r}")
        self.start = start
        if sample not in DOP_SAMPLES:
            raise ValueError(f"sample must be one of {', '.join(DOP_SAMPLES)}, not {sample!r}")
        self.sample = sample
        self.min_sample_share = min(float(min_sample_share), self.sample_share)
        if noise not in DOP_NOISES:
            raise ValueError(f"noise must be one of {', '.join(DOP_NOISES)}, not {noise!r}")
        self.noise = noise
        if outliers not in DOP_OUTLIERS:
            raise ValueError(f"outliers must be one of {', '.join(DOP_OUTLIERS)}, not {outliers!r}")
        self.outliers = outliers
        if back_off not in DOP_BACK_OFFS:
            raise ValueError(f"back_off must be one of {', '.join(DOP_BACK_OFFS)}, not {back_off!r}")
        self.back_off = back_off
        if probe not in DOP_PROBES:
            raise ValueError(f"probe must be one of {', '.join(DOP_PROBES)}, not {probe!r}")
        self.probe = probe
        self.noise_window = max(1, int(noise_window))
        self.noise_z = max(0.0, float(noise_z))
        self.noise_errors: list[float] = []  # |serial_1 - serial_2| / serial_1 of repeated serial timings
        # sample="pooled": signed errors of recent pairs at the current DOP (emptied when the DOP changes)
        self.pair_window = max(1, int(pair_window))
        self.min_pooled_pairs = max(1, int(min_pooled_pairs))
        self.min_noise_pairs = max(1, int(min_noise_pairs))
        self.pairs: list[float] = []
        self.share = self.sample_share  # this round's (adaptive: shrinks after calm rounds)
        self.dop = self._clamp(initial_dop)
        if start == "probe" and self.adaptive and initial_dop == 1:
            self.dop = self._clamp(min(self.cap, 1 + self._step(1)))
        self.history: list[RoundStat] = []

    @classmethod
    def for_dop(cls, dop: str | int, max_dop: int, *, start: str = "probe", sample: str = "pooled",
                noise: str = "measured", outliers: str = "rankable",
                back_off: str = "confirmed", probe: str = "pairs") -> "DOPController":
        """The controller a runner uses for a run's ``dop`` setting: "auto" adapts (from ``start``,
        sampling as ``sample`` says, judging errors as ``noise`` says, re-measuring the outliers
        ``outliers`` says, backing off as ``back_off`` says, probing as ``probe`` says), a number is fixed."""
        if dop == "auto":
            return cls(max_dop=max_dop, start=start, sample=sample, noise=noise, outliers=outliers,
                       back_off=back_off, probe=probe)
        return cls(max_dop=max_dop, initial_dop=int(dop), adaptive=False)

    # ------------------------------------------------------------------ helpers
    def _step(self, dop: int) -> float:
        """How far a good round raises the DOP: half the way to the cap, clamped to [min_step, max_step]."""
        return min(max((self.cap - dop) / 2.0, self.min_step), self.max_step)

    def _clamp(self, dop: float) -> int:
        return max(1, min(int(math.floor(dop + 1e-9)), int(math.floor(self.cap + 1e-9)) or 1, self.max_dop))

    @staticmethod
    def latency_of(run_secs: Sequence[float] | None) -> float | None:
        if not run_secs:
            return None
        vals = [float(x) for x in run_secs]
        lat = sum(vals) / len(vals)
        return lat if _valid(lat) else None

    # ------------------------------------------------------------------ sampling
    def split_outliers(self, latencies: Sequence[float | None], dop: int = 1) -> tuple[list[int], list[int]]:
        """The outliers (|robust z| > z_threshold) among the valid ``latencies``, measured at ``dop``:
        (the ones to re-measure serially, the slow ones ``outliers="rankable"`` leaves as they are: past
        DOP x the median of the valid latencies)."""
        return self._split_outliers(latencies, *self._scored(latencies), dop)

    def rankable_bound(self, latencies: Sequence[float | None], dop: int,
                       mean_signed_error: float | None = None) -> float | None:
        """The parallel latency past which a candidate measured at ``dop`` ranks after the round's median
        whatever its serial timing (``outliers="rankable"``; None: DOPpler's rule, or DOP 1): DOP x the
        median of the valid ``latencies``, widened by (1 - error) when the round's serial timings came
        out slower than its parallel ones (a negative signed error)."""
        valid = [x for x in latencies if _valid(x)]
        if not valid or self.outliers == "all" or dop <= 1:
            return None
        widen = max(1.0, 1.0 - mean_signed_error) if mean_signed_error is not None else 1.0
        return max(1, int(dop)) * statistics.median(valid) * widen

    def _split_outliers(self, latencies, idx: list[int], z: list[float], dop: int) -> tuple[list[int], list[int]]:
        outliers = [i for i, zi in zip(idx, z) if abs(zi) > self.z_threshold]
        bound = self.rankable_bound(latencies, dop) if idx else None
        if bound is None:
            return outliers, []
        return ([i for i in outliers if latencies[i] <= bound], [i for i in outliers if latencies[i] > bound])

    def _spread_picks(self, good: list[int], share: float) -> list[int]:
        """ceil(share x #good) of ``good`` (sorted fastest first), spread evenly over its ranks, the fastest
        always among them (share 0: the fastest alone)."""
        k = min(len(good), max(1, math.ceil(share * len(good)))) if good else 0
        if k <= 0:
            return []
        if k == 1:
            return [good[0]]
        step = (len(good) - 1) / (k - 1)
        return sorted({good[round(j * step)] for j in range(k)})

    @staticmethod
    def _scored(latencies: Sequence[float | None]) -> tuple[list[int], list[float]]:
        """The indices of the valid ``latencies`` and their robust z-scores."""
        idx = [i for i, x in enumerate(latencies) if _valid(x)]
        return idx, robust_z_scores([latencies[i] for i in idx])

    def _good_sorted(self, latencies, idx: list[int], z: list[float]) -> list[int]:
        return sorted((i for i, zi in zip(idx, z) if abs(zi) <= self.z_threshold), key=lambda i: latencies[i])

    def sample_for_serial(self, latencies: Sequence[float | None], dop: int = 1) -> tuple[list[int], list[int]]:
        """(indices to re-measure serially, slow outliers left as measured): the outliers worth it at
        ``dop`` (:meth:`split_outliers`) plus ceil(sample_share x #good) good candidates, spread
        evenly over the good ones' ranks and always including the fastest.
        Failed candidates (None / inf / >= 1e9) are not selected here."""
        idx, z = self._scored(latencies)
        if not idx:
            return [], []
        outliers, skipped = self._split_outliers(latencies, idx, z, dop)
        picks = self._spread_picks(self._good_sorted(latencies, idx, z), self.share)
        return sorted(set(outliers) | set(picks)), skipped

    def top_up_sample(self, latencies: Sequence[float | None], sample: Sequence[int],
                      serial: Sequence[float | None]) -> list[int]:
        """Good candidates to time serially on top of ``sample`` (whose serial timings are ``serial``)
        before the round decides: with ``sample="adaptive"`` or ``"pooled"``, a sample this round shrank
        (after calm rounds, or to its fastest once pairs were pooled) that is :meth:`contested` (an error
        that would back the DOP off, a bias past ``correction_limit``, or, pooled, an error past the
        pooled pairs' allowance) is brought back to ``sample_share``. Two timings are too few to send a
        whole round back to serial timing (the uncorrectable branch) or the next rounds to DOP 1; the
        top-up candidates are ones that branch would time anyway, and a few of those cost less than a
        serial round. Empty when the sample was full, its error neither uncorrectable nor too large, or
        the rule is DOPpler's."""
        if not (self.adaptive and self.sample in ("adaptive", "pooled")) or self.share >= self.sample_share:
            return []
        if not self.contested([latencies[i] for i in sample], serial):
            return []
        idx, z = self._scored(latencies)
        taken = set(sample)
        return [i for i in self._spread_picks(self._good_sorted(latencies, idx, z), self.sample_share)
                if i not in taken]

    @property
    def second_look(self) -> bool:
        """Whether serial timings that would change a round's course are taken once more first
        (``back_off="confirmed"``, DOP auto): a round about to back off (:meth:`confirm_wanted`), and a shrunk
        sample :meth:`top_up_sample` would top up, topped up only if the mean of its two serial timings
        still contests the round."""
        return self.adaptive and self.back_off == "confirmed"

    def probe_size(self, n_candidates: int, dop: int) -> int:
        """How many of a round's ``n_candidates`` a probe of ``dop`` times in parallel, then serially: two per
        slot at least, and DOPpler's ``sample_share`` of the round; with ``sample="pooled"`` and
        ``probe="pairs"`` the ``min_pooled_pairs`` the pooled rule decides on instead of the share (the rounds
        after the probe add their pairs to its window, so a probe of 7 pairs in a round of 32 bought 3 serial
        timings that no decision needed)."""
        floor = 2 * max(1, int(dop))
        if self.pooling and self.probe == "pairs":
            return max(floor, self.min_pooled_pairs)
        return max(floor, math.ceil(self.sample_share * n_candidates))

    def select_for_serial_remeasure(self, latencies: Sequence[float | None], dop: int = 1) -> list[int]:
        """The indices :meth:`sample_for_serial` re-measures serially."""
        return self.sample_for_serial(latencies, dop)[0]

    # ------------------------------------------------------------------ serial noise
    def noise_pairs_wanted(self, probe: bool = False, contested: bool = False) -> int:
        """How many sampled candidates this round should time serially a second time (0: none): two of a
        probe, one of any other round. With ``sample="pooled"`` one of a probe, and a round after it adds
        one only while fewer than ``min_noise_pairs`` are known or when its decision hinges on the noise
        (``contested``, see :meth:`contested`): the standard-error term of :meth:`allowed_error` already
        widens the allowance of a noise estimate from few pairs."""
        if self.noise != "measured" or not self.adaptive:
            return 0
        if not self.pooling:
            return 2 if probe else 1
        if probe or contested or len(self.noise_errors) < self.min_noise_pairs:
            return 1
        return 0

    def record_serial_repeat(self, first: Sequence[float | None], second: Sequence[float | None]) -> None:
        """Two serial timings of the same candidates: their relative differences are the host's serial noise."""
        for a, b in zip(first, second):
            if _valid(a) and _valid(b) and a > 0:
                self.noise_errors.append(abs(a - b) / a)
        del self.noise_errors[:-self.noise_window]

    @property
    def serial_noise(self) -> float | None:
        """Mean relative difference of repeated serial timings (recent ``noise_window``); None before any."""
        if self.noise != "measured" or not self.noise_errors:
            return None
        return sum(self.noise_errors) / len(self.noise_errors)

    def allowed_error(self, errors: Sequence[float] = ()) -> float:
        """The mean parallel-vs-serial error a round whose sampled pairs erred by ``errors`` (absolute,
        relative) may show and keep its DOP. DOPpler's rule, or before any serial repeat: its threshold.
        With the serial noise measured: that noise, plus the threshold and ``noise_z`` standard errors of
        (mean error - mean noise), the excess never beyond ``correction_limit`` (module doc)."""
        noise = self.serial_noise
        if noise is None:
            return self.error_threshold
        excess = self.error_threshold + self.noise_z * self._excess_standard_error(errors, noise)
        return noise + min(excess, max(self.error_threshold, self.correction_limit))

    def _excess_standard_error(self, errors: Sequence[float], noise: float) -> float:
        """Standard error of mean(errors) - mean(noise pairs), each an absolute difference of two noisy
        timings (half-normal: sd = mean x sqrt(pi/2 - 1)), so that two pairs need not give their own sd."""
        var = (_HALF_NORMAL_SD * noise) ** 2 / max(1, len(self.noise_errors))
        if errors:
            var += (_HALF_NORMAL_SD * sum(errors) / len(errors)) ** 2 / len(errors)
        return math.sqrt(var)

    def would_back_off(self, parallel: Sequence[float | None], serial: Sequence[float | None]) -> bool:
        """Whether these paired timings alone would make :meth:`update` back off for their error."""
        return self._error_too_large(self._signed_errors(parallel, serial))

    def confirm_wanted(self, parallel: Sequence[float | None], serial: Sequence[float | None]) -> bool:
        """Whether a round whose sampled pairs are these should time its sample serially once more before it
        decides (``back_off="confirmed"``, DOP auto): the error it would decide on is too large to keep its
        DOP. Failures caused by parallelism back off without a second look: a second serial timing does
        not change them."""
        if not self.second_look:
            return False
        return self._error_too_large(self._decision_errors(self._signed_errors(parallel, serial)))

    @property
    def pooling(self) -> bool:
        """Whether rounds decide on recent rounds' pairs too (``sample="pooled"``, DOP auto)."""
        return self.adaptive and self.sample == "pooled"

    def contested(self, parallel: Sequence[float | None], serial: Sequence[float | None]) -> bool:
        """Whether a round's own pairs disagree with what its DOP may show: they would back off on their
        own, or (``sample="pooled"``) their mean error is past the allowance of the pooled pairs (the
        host may have changed: the round's sample is topped up and, past the allowance on its own
        evidence, decides alone)."""
        signed = self._signed_errors(parallel, serial)
        if self._error_too_large(signed):
            return True
        if not (self.pooling and signed and self.pairs):
            return False
        pooled = [abs(e) for e in self.pairs + signed]
        return sum(abs(e) for e in signed) / len(signed) > self.allowed_error(pooled)

    def _decision_errors(self, signed: list[float]) -> list[float]:
        """The signed errors a round decides on: its own, or (``sample="pooled"``) its own after the recent
        rounds' at this DOP, unless its own would back off (then the pooled pairs are dropped)."""
        if not self.pooling or not signed or self._error_too_large(signed):
            return signed
        return self.pairs + signed

    def _error_too_large(self, signed: Sequence[float]) -> bool:
        """A round's sampled error is too large to keep its DOP: the mean absolute error is past
        :meth:`allowed_error`, or the mean signed one past ``correction_limit`` (a bias that large
        cannot be corrected, whatever the serial noise: the round's rest is timed serially)."""
        if not signed:
            return False
        errors = [abs(e) for e in signed]
        mean_error, mean_signed = sum(errors) / len(errors), sum(signed) / len(signed)
        return mean_error > self.allowed_error(errors) or not self.can_correct(mean_signed)

    # ------------------------------------------------------------------ rule
    @staticmethod
    def _signed_errors(parallel: Sequence[float | None], serial: Sequence[float | None]) -> list[float]:
        """(parallel - serial) / parallel of each valid pair."""
        if len(parallel) != len(serial):
            raise ValueError("parallel and serial must be paired")
        return [(p - s) / p for p, s in zip(parallel, serial) if _valid(p) and _valid(s) and p > 0]

    def sample_error(self, parallel: Sequence[float | None], serial: Sequence[float | None]) -> float | None:
        """The signed mean error of paired timings (what :meth:`update` corrects by); None without a pair."""
        signed = self._signed_errors(parallel, serial)
        return sum(signed) / len(signed) if signed else None

    def correct(self, latencies: Sequence[float], mean_error: float | None) -> list[float]:
        """Scale latencies by (1 - mean_error) when |mean_error| < correction_limit."""
        if mean_error is None or abs(mean_error) >= self.correction_limit:
            return [float(x) for x in latencies]
        return [float(x) * (1.0 - mean_error) if _valid(x) else x for x in latencies]

    def can_correct(self, mean_error: float | None) -> bool:
        return mean_error is not None and abs(mean_error) < self.correction_limit

    def update(
        self,
        parallel: Sequence[float | None],
        serial: Sequence[float | None],
        failures: int = 0,
        *,
        latencies: Sequence[float] | None = None,
    ) -> RoundDecision:
        """Apply the DOPpler rule to one round. ``parallel[i]``/``serial[i]`` are
        the latencies of the i-th re-measured candidate (pairs with a failure on
        either side are skipped); ``failures`` counts candidates that failed in
        parallel but not serially. With ``latencies``, also returns them
        corrected by the round's mean (signed) error."""
        signed = self._decision_errors(self._signed_errors(parallel, serial))
        errors = [abs(e) for e in signed]
        mean_error = sum(errors) / len(errors) if errors else None
        mean_signed = sum(signed) / len(signed) if signed else None

        dop_before, cap_before = self.dop, self.cap
        backed_off = False
        noise = self.serial_noise if parallel else None
        allowed = self.allowed_error(errors)
        if self.adaptive:
            too_noisy = self._error_too_large(signed)
            too_many_failures = dop_before > 1 and failures > self.failure_threshold * dop_before
            if too_noisy or too_many_failures:
                backed_off = True
                self.cap = float(dop_before) if dop_before >= self.cap else 0.9 * dop_before
                self.dop = self._clamp(0.8 * dop_before)
            elif mean_error is not None or dop_before == 1:
                self.dop = self._clamp(min(self.cap, dop_before + self._step(dop_before)))
            reprobe = self._schedule_reprobe(dop_before, backed_off)
        else:
            reprobe = False
        share_used = self.share if parallel else None
        if self.pooling:  # the window holds pairs of the DOP the next round measures at
            keep = signed and not backed_off and self.dop == dop_before
            self.pairs = signed[-self.pair_window:] if keep else []
        self._next_share(dop_before, None if mean_error is None else mean_error - (noise or 0.0), backed_off)
        decision = RoundDecision(
            dop_before=dop_before,
            dop_after=self.dop,
            mean_error=mean_error,
            mean_signed_error=mean_signed,
            n_sampled=len(parallel),
            failures=int(failures),
            backed_off=backed_off,
            cap_before=cap_before,
            cap_after=self.cap,
            errors=errors,
            serial_noise=noise,
        )
        if latencies is not None:
            decision.corrected_latencies = self.correct(latencies, mean_signed)
            decision.correction_applied = self.can_correct(mean_signed)
        self.history.append(
            RoundStat(
                dop=dop_before,
                mean_error=mean_error,
                n_sampled=len(parallel),
                failures=int(failures),
                cap=self.cap,
                dop_after=self.dop,
                mean_signed_error=mean_signed,
                adapted=self.adaptive,
                reprobe=reprobe,
                sample_share=share_used,
                serial_noise=noise,
                allowed_error=allowed if errors else None,
                n_pooled=len(signed) if self.pooling and parallel else None,
            )
        )
        return decision

    def _next_share(self, dop_before: int, mean_error: float | None, backed_off: bool) -> None:
        """Adaptive sampling: a calm round (sampled error, above the serial noise when measured, under
        half the threshold) at a DOP > 1 that stays halves the next round's share, down to
        min_sample_share; any other round restores it."""
        if self.pooling:  # the fastest alone once the window holds enough pairs of this DOP
            self.share = 0.0 if len(self.pairs) >= self.min_pooled_pairs else self.sample_share
            return
        calm = (self.sample == "adaptive" and not backed_off and mean_error is not None and dop_before > 1
                and self.dop == dop_before and mean_error <= self.error_threshold / 2)
        self.share = max(self.min_sample_share, self.share / 2) if calm else self.sample_share

    def _schedule_reprobe(self, dop_before: int, backed_off: bool) -> bool:
        """Keep a back-off to DOP 1 from lasting the whole run: when it happens, plan a re-probe
        (at a doubling distance); when its round comes, restore the cap and try the smallest
        parallel DOP again. Returns whether this round re-opened parallelism."""
        n_round = len(self.history)  # this round's index (appended after)
        if backed_off and self.dop == 1 and self.max_dop > 1:
            if self.reprobes < self.max_reprobes:
                self._reprobe_at = n_round + 1 + self.reprobe_after * (2 ** self.reprobes)
            return False
        if self.dop == 1 and self._reprobe_at is not None and n_round + 1 >= self._reprobe_at:
            self._reprobe_at = None
            self.reprobes += 1
            self.cap = self.initial_cap
            self.dop = self._clamp(2)
            return self.dop > 1
        return False

    def update_serial_round(self, n_candidates: int, failures: int = 0) -> RoundDecision:
        """A round whose parallel configuration *is* the serial one (DOP 1 at
        the deployment thread count): error 0 by definition, nothing sampled."""
        return self._serial(failures)

    def _serial(self, failures: int) -> RoundDecision:
        dec = self.update([], [], failures=failures)
        dec.mean_error = 0.0
        dec.mean_signed_error = 0.0
        self.history[-1].mean_error = 0.0
        self.history[-1].mean_signed_error = 0.0
        return dec

    # ------------------------------------------------------------------ summary
    def mean_parallel_error(self) -> float | None:
        """Error over rounds that really ran in parallel (DOP > 1 or fewer
        threads than serial) and re-measured a sample."""
        # a fraction, median of capped round errors: parallel_error says why
        return summarize_parallel_error(h.mean_error for h in self.history if h.n_sampled > 0)

    def history_dicts(self) -> list[dict]:
        return [h.to_dict() for h in self.history]
