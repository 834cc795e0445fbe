"""DOPpler's degree-of-parallelism rule as published (IEEE TPDS 2023; Conductor's ``doppler_bic``).

* DOP starts at 1 under a cap of 128 (and never above ``max_dop``, what the measuring slots allow:
  workers x threads <= cores).
* Each round measures its candidates DOP at a time, then re-measures *serially* (one worker, the
  deployment thread count) a sample: the outliers (robust z-score with a double MAD > ``z_threshold``)
  plus ``sample_share`` (20 %) of the good candidates.
* error_i = |parallel_i - serial_i| / parallel_i, averaged over the sample.
* If the mean error > ``error_threshold`` or failures caused by parallelism > ``failure_threshold`` x
  DOP: cap = 0.9 x DOP (cap stays DOP if DOP was at the cap) and DOP x= 0.8. Else DOP += (cap - DOP) / 2,
  the step clamped to [2, 7], never above the cap or ``max_dop``.
* Latencies that were not re-measured are scaled by (1 - mean error) when |mean error| <
  ``correction_limit`` (0.25). We use the *signed* mean ((parallel - serial) / parallel), which equals
  DOPpler's unsigned one when parallel runs are slower, and does not push numbers the wrong way when
  they are not.

Every parallel worker measures at the deployment thread count T on a slot of its own (slots.py), and the
serial reference is slot 0 at T threads while the other slots idle, so the error measures interference
only, never thread scaling; max DOP = the number of slots (floor(cores / T)).

One addition the paper does not have, kept by every adaptive rule here: a back-off to DOP 1 (one noisy
round on a loaded host) is not final: parallelism is re-probed after ``reprobe_after`` rounds, then twice
as many, at most ``max_reprobes`` times (RoundStat.reprobe). The platform's refinements of this rule are
:class:`~tuning.engine.doppler.platform_rule.PlatformRule`.
"""

from __future__ import annotations

from tuning.engine.doppler.plan import DopSettings
from tuning.engine.doppler.rule import DopRule

__all__ = ["DopplerRule"]


class DopplerRule(DopRule):
    """DOPpler's rule as published (module doc): it adapts the DOP from the sampled error."""

    adapts = True

    def __init__(
        self, max_dop: int | None = None, *, initial_dop: int = 1, settings: DopSettings | None = None
    ) -> None:
        super().__init__(max_dop, initial_dop=initial_dop, settings=settings)
        self.initial_cap = self._cap
        self.reprobes = 0
        self._reprobe_at: int | None = None

    def _next_dop(
        self, dop_before: int, signed: list[float], mean_error: float | None, failures: int
    ) -> tuple[bool, bool]:
        s = self.settings
        too_noisy = self._error_too_large(signed)
        too_many_failures = dop_before > 1 and failures > s.failure_threshold * dop_before
        backed_off = too_noisy or too_many_failures
        if backed_off:
            self._cap = float(dop_before) if dop_before >= self._cap else 0.9 * dop_before
            self._dop = self._clamp(0.8 * dop_before)
        elif mean_error is not None or dop_before == 1:
            self._dop = self._clamp(min(self._cap, dop_before + self._step(dop_before)))
        return backed_off, self._schedule_reprobe(backed_off)

    def _schedule_reprobe(self, backed_off: bool) -> bool:
        """Keep a back-off to DOP 1 from lasting the whole run: when it happens, plan a re-probe (at a
        doubling distance); when its round comes, restore the cap and try the smallest parallel DOP
        again. Returns whether this round re-opened parallelism."""
        s = self.settings
        n_round = len(self.history)  # this round's index (its row is appended after)
        if backed_off and self._dop == 1 and self._max_dop > 1:
            if self.reprobes < s.max_reprobes:
                self._reprobe_at = n_round + 1 + s.reprobe_after * (2**self.reprobes)
            return False
        if self._dop == 1 and self._reprobe_at is not None and n_round + 1 >= self._reprobe_at:
            self._reprobe_at = None
            self.reprobes += 1
            self._cap = self.initial_cap
            self._dop = self._clamp(2)
            return self._dop > 1
        return False
