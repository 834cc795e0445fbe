"""Thinning of plotted series: charts draw at most ``n`` points, always keeping the last one."""

from __future__ import annotations


def thin(xs: list, ys: list, n: int) -> tuple[list, list]:
    if len(xs) <= n:
        return xs, ys
    step = len(xs) / n
    idx = sorted({int(i * step) for i in range(n)} | {len(xs) - 1})
    return [xs[i] for i in idx], [ys[i] for i in idx]
