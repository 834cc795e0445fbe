"""Name a function for a child process: callers pass the function itself, the pipe carries its name.

A child resolves ``"package.module:qualname"`` by importing the module (``_procworker``,
``_isolated_child``); naming the function through this helper keeps every entry point visible to
tools (go-to-definition, rename, import-linter) instead of spelling it as a string.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["entry_point"]


def entry_point(func: Callable[..., Any] | str) -> str:
    """``func``'s importable name; a name passed in is returned unchanged. A function a fresh
    interpreter cannot import by name (a lambda, a closure, one defined in ``__main__``) is refused
    here rather than in the child."""
    if isinstance(func, str):
        return func
    module, qualname = getattr(func, "__module__", None), getattr(func, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:
        raise ValueError(f"{func!r} cannot be imported by a child process: use a module-level function")
    return f"{module}:{qualname}"
