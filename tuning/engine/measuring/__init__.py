"""Timing built candidates: the pure measuring function, per-device timers, CPU/GPU measurement slots (TVM runtime only)."""
