"""What a stored latency means: TVM's failure marker, and the one test for it (pure, no TVM import)."""

from __future__ import annotations

import math
from typing import TypeGuard

__all__ = ["TVM_FAILED_RUN_SECS", "FAILED_AT_S", "is_failed_latency", "is_timing"]

#: the run time TVM stores for a candidate that failed to build or run (MetaSchedule's convention)
TVM_FAILED_RUN_SECS = 1e10
#: a latency at or above this is a failure marker, never a timing (no real candidate runs for 15 minutes)
FAILED_AT_S = 1e9


def is_failed_latency(secs: float | None) -> bool:
    """True for a failure: no latency, NaN/inf, or TVM's failure marker."""
    return secs is None or not math.isfinite(secs) or secs >= FAILED_AT_S


def is_timing(secs: float | None) -> TypeGuard[float]:
    """True for a real timing (the opposite of :func:`is_failed_latency`; narrows to ``float``)."""
    return not is_failed_latency(secs)
