"""The degree-of-parallelism (DOP) rule's interface, its settings, and a fixed DOP.

A rule owns its state (the DOP, the cap, the serial-noise and pooled-pair windows, the rounds'
history); the round code (:mod:`tuning.engine.doppler.rounds`) and the runners only *ask* it
(:meth:`DopRule.plan_round`, :meth:`~DopRule.serial_sample`, :meth:`~DopRule.confirm_wanted`, ...) and
*tell* it what was measured (:meth:`~DopRule.record_serial_repeat`, :meth:`~DopRule.decide`,
:meth:`~DopRule.note_round`, :meth:`~DopRule.limit_max_dop`). The rules:

* :class:`FixedDop`: a DOP that never changes (a run's ``dop=<int>``); its rounds still sample
  DOPpler's 20 % serially and correct the rest by the sampled error.
* :class:`~tuning.engine.doppler.doppler_rule.DopplerRule`: DOPpler as published (IEEE TPDS 2023).
* :class:`~tuning.engine.doppler.platform_rule.PlatformRule`: the platform's rule (DOP "auto"):
  DOPpler's with the refinements its module doc measures.

Every tunable number has its default in :class:`DopSettings`, and nowhere else. The refinements are
methods a subclass overrides (this base class states DOPpler's choice for each): ``_starting_dop``,
``serial_noise`` / ``allowed_error`` / ``noise_pairs_wanted``, ``rankable_bound``, ``second_look``,
``probe_size`` and the sampling hooks (``_decision_errors``, ``contested``, ``_remember_pairs``,
``_next_share``, ``_pooled_count``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from tuning.engine.doppler.parallel_error import summarize_parallel_error
from tuning.engine.doppler.plan import DopSettings, RoundDecision, RoundPlan, RoundStat
from tuning.engine.latency import is_timing
from tuning.engine.process.procpool import available_cpus

__all__ = ["DopRule", "FixedDop", "robust_z_scores", "default_max_dop"]


def default_max_dop() -> int:
    """Cores this process may use (its affinity set): each parallel worker needs a core of its own."""
    return max(1, len(available_cpus()))


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


class DopRule:
    """A DOP rule: its state and the questions a round asks it (module doc). This base class never
    changes its DOP (see :class:`FixedDop`); :class:`~tuning.engine.doppler.doppler_rule.DopplerRule`
    adapts it."""

    adapts = False  # whether decide() may change the DOP (RoundStat.adapted)

    def __init__(
        self, max_dop: int | None = None, *, initial_dop: int = 1, settings: DopSettings | None = None
    ) -> None:
        self.settings = settings or DopSettings()
        self._cap = float(self.settings.cap)
        self._max_dop = int(max_dop) if max_dop else default_max_dop()
        self.noise_errors: list[float] = []  # |serial_1 - serial_2| / serial_1 of repeated serial timings
        self.pairs: list[float] = []  # pooled sample: signed errors of recent pairs at the current DOP
        self._share = self.settings.sample_share  # this round's share of good candidates timed serially
        self.history: list[RoundStat] = []
        self._dop = self._starting_dop(int(initial_dop))

    # ------------------------------------------------------------------ state (read only)
    @property
    def dop(self) -> int:
        """The DOP the next round measures at."""
        return self._dop

    @property
    def cap(self) -> float:
        return self._cap

    @property
    def max_dop(self) -> int:
        return self._max_dop

    @property
    def share(self) -> float:
        """The share of good candidates the next round times serially."""
        return self._share

    def limit_max_dop(self, max_dop: int) -> None:
        """The measuring slots allow at most ``max_dop`` workers: the DOP never goes above."""
        self._max_dop = max(1, min(self._max_dop, int(max_dop)))
        self._dop = max(1, min(self._dop, self._max_dop))

    # ------------------------------------------------------------------ helpers
    def _starting_dop(self, initial_dop: int) -> int:
        """The first round's DOP (DOPpler: ``initial_dop``, 1 unless a caller says otherwise)."""
        return self._clamp(initial_dop)

    def _step(self, dop: int) -> float:
        """How far a good round raises the DOP: half the way to the cap, clamped to [min_step, max_step]."""
        return min(max((self._cap - dop) / 2.0, self.settings.min_step), self.settings.max_step)

    def _clamp(self, dop: float) -> int:
        return max(1, min(int(math.floor(dop + 1e-9)), int(math.floor(self._cap + 1e-9)) or 1, self._max_dop))

    # ------------------------------------------------------------------ planning and sampling
    def plan_round(
        self, n_candidates: int, *, validated: set[int] | frozenset[int] = frozenset(), probe_first: bool = True
    ) -> RoundPlan:
        """The round's DOP (never above the candidates, the cap or ``max_dop``) and, for a parallel DOP not in
        ``validated``, the probe: :meth:`probe_size` candidates spread evenly over the round."""
        n = int(n_candidates)
        dop = max(1, min(self._dop, self._max_dop, n))
        if dop <= 1 or not probe_first or dop in validated:
            return RoundPlan(dop)
        n_probe = self.probe_size(n, dop)
        if n <= n_probe:
            return RoundPlan(dop)
        step = n / n_probe
        return RoundPlan(dop, tuple(sorted({int(k * step) for k in range(n_probe)})))

    def probe_size(self, n_candidates: int, dop: int) -> int:
        """How many of a round's ``n_candidates`` a probe of ``dop`` times in parallel, then serially: two per
        slot at least, and DOPpler's ``sample_share`` of the round."""
        return max(2 * max(1, int(dop)), math.ceil(self.settings.sample_share * n_candidates))

    def split_outliers(self, latencies: Sequence[float | None], dop: int = 1) -> tuple[list[int], list[int]]:
        """The outliers (|robust z| > z_threshold) among the valid ``latencies``, measured at ``dop``:
        (the ones to re-measure serially, the slow ones past :meth:`rankable_bound`)."""
        return self._split_outliers(latencies, *self._scored(latencies), dop)

    def rankable_bound(
        self, latencies: Sequence[float | None], dop: int, mean_signed_error: float | None = None
    ) -> float | None:
        """The parallel latency past which a candidate ranks after the round's median whatever its serial
        timing; None: DOPpler's rule, every outlier is re-timed."""
        return None

    def _split_outliers(self, latencies, idx: list[int], z: list[float], dop: int) -> tuple[list[int], list[int]]:
        outliers = [i for i, zi in zip(idx, z) if abs(zi) > self.settings.z_threshold]
        bound = self.rankable_bound(latencies, dop) if idx else None
        if bound is None:
            return outliers, []
        return ([i for i in outliers if latencies[i] <= bound], [i for i in outliers if latencies[i] > bound])

    @staticmethod
    def _spread_picks(good: list[int], share: float) -> list[int]:
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
        valid = [(i, x) for i, x in enumerate(latencies) if is_timing(x)]
        return [i for i, _ in valid], robust_z_scores([x for _, x in valid])

    def _good_sorted(self, latencies, idx: list[int], z: list[float]) -> list[int]:
        return sorted((i for i, zi in zip(idx, z) if abs(zi) <= self.settings.z_threshold), key=lambda i: latencies[i])

    def serial_sample(self, latencies: Sequence[float | None], dop: int = 1) -> tuple[list[int], list[int]]:
        """(indices to re-measure serially, slow outliers left as measured): the outliers worth it at
        ``dop`` (:meth:`split_outliers`) plus ceil(share x #good) good candidates, spread evenly over the
        good ones' ranks and always including the fastest. Failed candidates are not selected here."""
        idx, z = self._scored(latencies)
        if not idx:
            return [], []
        outliers, skipped = self._split_outliers(latencies, idx, z, dop)
        picks = self._spread_picks(self._good_sorted(latencies, idx, z), self._share)
        return sorted(set(outliers) | set(picks)), skipped

    def top_up_sample(
        self, latencies: Sequence[float | None], sample: Sequence[int], serial: Sequence[float | None]
    ) -> list[int]:
        """Good candidates to time serially on top of ``sample`` (whose serial timings are ``serial``) before
        the round decides: a sample shrunk below ``sample_share`` that is :meth:`contested` is brought back
        to it (two timings are too few to send a round's rest to serial timing, or the next rounds to DOP
        1). Empty when the sample was full (DOPpler's rule always samples in full)."""
        if self._share >= self.settings.sample_share:
            return []
        if not self.contested([latencies[i] for i in sample], serial):
            return []
        idx, z = self._scored(latencies)
        taken = set(sample)
        return [
            i
            for i in self._spread_picks(self._good_sorted(latencies, idx, z), self.settings.sample_share)
            if i not in taken
        ]

    # ------------------------------------------------------------------ serial noise and second looks
    @property
    def second_look(self) -> bool:
        """Whether serial timings that would change a round's course are taken once more first (DOPpler: no)."""
        return False

    def noise_pairs_wanted(self, probe: bool = False, contested: bool = False) -> int:
        """How many sampled candidates this round should time serially a second time (DOPpler: none)."""
        return 0

    def record_serial_repeat(self, first: Sequence[float | None], second: Sequence[float | None]) -> None:
        """Two serial timings of the same candidates: their relative differences are the host's serial noise."""
        for a, b in zip(first, second):
            if is_timing(a) and is_timing(b) and a > 0:
                self.noise_errors.append(abs(a - b) / a)
        del self.noise_errors[: -self.settings.noise_window]

    @property
    def serial_noise(self) -> float | None:
        """The host's serial noise the rule allows for (DOPpler: none, one serial timing taken as exact)."""
        return None

    def allowed_error(self, errors: Sequence[float] = ()) -> float:
        """The mean parallel-vs-serial error a round whose pairs erred by ``errors`` may show and keep its DOP."""
        return self.settings.error_threshold

    def would_back_off(self, parallel: Sequence[float | None], serial: Sequence[float | None]) -> bool:
        """Whether these paired timings alone are too far apart to keep the DOP."""
        return self._error_too_large(self._signed_errors(parallel, serial))

    def confirm_wanted(self, parallel: Sequence[float | None], serial: Sequence[float | None]) -> bool:
        """Whether a round whose sampled pairs are these should time its sample serially once more before it
        decides: with :attr:`second_look`, when the error it would decide on is too large to keep its DOP."""
        if not self.second_look:
            return False
        return self._error_too_large(self._decision_errors(self._signed_errors(parallel, serial)))

    def contested(self, parallel: Sequence[float | None], serial: Sequence[float | None]) -> bool:
        """Whether a round's own pairs disagree with what its DOP may show (they would back off)."""
        return self._error_too_large(self._signed_errors(parallel, serial))

    def _decision_errors(self, signed: list[float]) -> list[float]:
        """The signed errors a round decides on (DOPpler: its own)."""
        return signed

    def _error_too_large(self, signed: Sequence[float]) -> bool:
        """The mean absolute error is past :meth:`allowed_error`, or the mean signed one past
        ``correction_limit`` (a bias that large cannot be corrected: the round's rest is timed serially)."""
        if not signed:
            return False
        errors = [abs(e) for e in signed]
        mean_error, mean_signed = sum(errors) / len(errors), sum(signed) / len(signed)
        return mean_error > self.allowed_error(errors) or not self.can_correct(mean_signed)

    # ------------------------------------------------------------------ correction
    @staticmethod
    def _signed_errors(parallel: Sequence[float | None], serial: Sequence[float | None]) -> list[float]:
        """(parallel - serial) / parallel of each valid pair."""
        if len(parallel) != len(serial):
            raise ValueError("parallel and serial must be paired")
        return [(p - s) / p for p, s in zip(parallel, serial) if is_timing(p) and is_timing(s) and p > 0]

    def sample_error(self, parallel: Sequence[float | None], serial: Sequence[float | None]) -> float | None:
        """The signed mean error of paired timings (what :meth:`decide` corrects by); None without a pair."""
        signed = self._signed_errors(parallel, serial)
        return sum(signed) / len(signed) if signed else None

    def correct(self, latencies: Sequence[float], mean_error: float | None) -> list[float]:
        """Scale latencies by (1 - mean_error) when |mean_error| < correction_limit."""
        if mean_error is None or not self.can_correct(mean_error):
            return [float(x) for x in latencies]
        return [float(x) * (1.0 - mean_error) if is_timing(x) else x for x in latencies]

    def can_correct(self, mean_error: float | None) -> bool:
        return mean_error is not None and abs(mean_error) < self.settings.correction_limit

    # ------------------------------------------------------------------ deciding
    def decide(
        self,
        parallel: Sequence[float | None],
        serial: Sequence[float | None],
        failures: int = 0,
        *,
        latencies: Sequence[float] | None = None,
    ) -> RoundDecision:
        """Tell the rule one round's evidence; it sets the next round's DOP. ``parallel[i]``/``serial[i]``:
        the latencies of the i-th re-measured candidate (pairs with a failure on either side are skipped);
        ``failures``: candidates that failed in parallel but not serially. With ``latencies``, the decision
        carries them corrected by the round's mean signed error."""
        signed = self._decision_errors(self._signed_errors(parallel, serial))
        errors = [abs(e) for e in signed]
        mean_error = sum(errors) / len(errors) if errors else None
        mean_signed = sum(signed) / len(signed) if signed else None

        dop_before, cap_before = self._dop, self._cap
        noise = self.serial_noise if parallel else None
        allowed = self.allowed_error(errors)
        backed_off, reprobe = self._next_dop(dop_before, signed, mean_error, int(failures))
        share_used = self._share if parallel else None
        self._remember_pairs(signed, backed_off, dop_before)
        self._next_share(dop_before, None if mean_error is None else mean_error - (noise or 0.0), backed_off)
        decision = RoundDecision(
            dop_before=dop_before,
            dop_after=self._dop,
            mean_error=mean_error,
            mean_signed_error=mean_signed,
            n_sampled=len(parallel),
            failures=int(failures),
            backed_off=backed_off,
            cap_before=cap_before,
            cap_after=self._cap,
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
                cap=self._cap,
                dop_after=self._dop,
                mean_signed_error=mean_signed,
                adapted=self.adapts,
                reprobe=reprobe,
                sample_share=share_used,
                serial_noise=noise,
                allowed_error=allowed if errors else None,
                n_pooled=self._pooled_count(signed) if parallel else None,
            )
        )
        return decision

    def decide_serial_round(self, failures: int = 0) -> RoundDecision:
        """A round whose parallel configuration *is* the serial one (DOP 1 at the deployment thread
        count): error 0 by definition, nothing sampled."""
        dec = self.decide([], [], failures=failures)
        dec.mean_error = dec.mean_signed_error = 0.0
        self.history[-1].mean_error = self.history[-1].mean_signed_error = 0.0
        return dec

    def note_round(self, *, outliers_skipped: int = 0, sample_topped_up: int = 0) -> None:
        """The last decided round's counts, known once its rest is measured (its history row)."""
        if self.history:
            self.history[-1].outliers_skipped = int(outliers_skipped)
            self.history[-1].sample_topped_up = int(sample_topped_up)

    def _next_dop(
        self, dop_before: int, signed: list[float], mean_error: float | None, failures: int
    ) -> tuple[bool, bool]:
        """Set the next round's DOP; (backed off, re-opened parallelism). A fixed DOP stays."""
        return False, False

    def _remember_pairs(self, signed: list[float], backed_off: bool, dop_before: int) -> None:
        """Keep what the next rounds decide on besides their own pairs (DOPpler: nothing)."""

    def _next_share(self, dop_before: int, excess_error: float | None, backed_off: bool) -> None:
        """The next round's share of good candidates (DOPpler: ``sample_share`` every round)."""
        self._share = self.settings.sample_share

    def _pooled_count(self, signed: list[float]) -> int | None:
        """The pairs a round decided on, when it pooled other rounds' (RoundStat.n_pooled)."""
        return None

    # ------------------------------------------------------------------ summary
    def mean_parallel_error(self) -> float | None:
        """Error over rounds that really ran in parallel and re-measured a sample (parallel_error says why
        a median of capped round errors)."""
        return summarize_parallel_error(h.mean_error for h in self.history if h.n_sampled > 0)

    def history_dicts(self) -> list[dict]:
        return [h.to_dict() for h in self.history]


class FixedDop(DopRule):
    """A run's ``dop=<int>``: every round at that DOP (within ``max_dop``), its sample timed serially and the
    rest corrected by the sampled error as DOPpler does, the DOP itself never changed."""

    def __init__(self, dop: int, max_dop: int | None = None, *, settings: DopSettings | None = None) -> None:
        super().__init__(max_dop, initial_dop=int(dop), settings=settings)
