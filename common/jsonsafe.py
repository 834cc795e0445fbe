"""One conversion of engine results (numpy scalars and arrays, tuples, non-finite floats, dataclass-like
objects) into what ``json.dumps`` and a JSONField accept; and a ``json.loads`` that refuses non-finite
numbers (:func:`loads_finite`)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, is_dataclass
from typing import Any


def json_safe(x: Any) -> Any:
    """Dict keys become strings, tuples lists, numpy values Python values, NaN and +-inf ``None``;
    dataclasses become dicts and any other object its ``__dict__`` (or ``str``) so nothing raises."""
    if x is None or isinstance(x, (str, bool, int)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in x]
    if hasattr(x, "tolist"):  # numpy arrays and scalars
        return json_safe(x.tolist())
    if is_dataclass(x) and not isinstance(x, type):
        return json_safe(asdict(x))
    if hasattr(x, "__dict__"):
        return json_safe(vars(x))
    return str(x)


class NonFiniteNumber(ValueError):
    """A JSON text holds NaN, Infinity, or a number too large for a float."""


def _refuse_constant(name: str):
    raise NonFiniteNumber(f"{name} is not a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses to inf
        raise NonFiniteNumber(f"{text[:40]} is not a finite number")
    return value


def loads_finite(text: str | bytes | bytearray) -> Any:
    """``json.loads`` without ``NaN``, ``Infinity`` or numbers that overflow to them (Python's json accepts
    all three; TVM's databases cannot load them back). NonFiniteNumber (a ValueError) when it meets one."""
    return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
