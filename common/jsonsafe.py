"""One conversion of engine results (numpy scalars and arrays, tuples, non-finite floats, dataclass-like
objects) into what ``json.dumps`` and a JSONField accept."""
from __future__ import annotations

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
