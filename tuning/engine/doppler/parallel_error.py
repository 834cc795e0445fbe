"""DOPpler's run-level parallel-vs-serial timing error: one unit (a fraction), outliers bounded.

Django-free. A round's error is the mean over its re-measured sample of
``|parallel - serial| / parallel`` (``DopRule.decide``): 0.05 is 5 %.
A parallel timing far *below* the serial one (a failed or truncated parallel
measurement read as a tiny latency) makes that ratio unbounded: one such round gave a
run-level mean of 30.63 (3063 %) where the other runs of the same model read 0.475.
So the run-level figure is the **median** over the rounds that really re-measured a
sample, of each round's error **capped at** :data:`MAX_ROUND_ERROR` (1.0: the parallel
timing is off by at least its own size, which is what "useless" means here). The
median keeps one wild round from standing for the run; the cap keeps a run whose
rounds are mostly wild from printing a number no one can read.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

__all__ = ["MAX_ROUND_ERROR", "as_fraction", "summarize_parallel_error"]

MAX_ROUND_ERROR = 1.0


def as_fraction(error: float | None) -> float | None:
    """One error as a fraction in [0, MAX_ROUND_ERROR]; None when unknown or not a number."""
    if error is None:
        return None
    value = float(error)
    if math.isnan(value):
        return None
    return min(MAX_ROUND_ERROR, abs(value))


def summarize_parallel_error(round_errors: Iterable[float | None]) -> float | None:
    """The run's parallel error: median of the rounds' capped errors (None when no round has one)."""
    values = [v for v in (as_fraction(e) for e in round_errors) if v is not None]
    return float(statistics.median(values)) if values else None
