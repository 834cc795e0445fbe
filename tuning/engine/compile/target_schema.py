"""The closed target schema: which fields a target may carry, and the one builder of a run's target.

Django-free and TVM-free (the web process checks targets without loading TVM). TVM's llvm kind hands
some attributes (``cl-opt``, ``mattr``, ``libs``, ...) to LLVM as process-wide command-line options
and CPU features, and LLVM has options that load a library or run a program; so no attribute outside
:data:`USER_FIELDS` ever comes from a user, the platform builds the target itself
(:func:`build_target`), and every target is checked again right before TVM parses it
(:func:`check_target`, in ``relax_pipeline.make_target``, the worker's adapters and the measuring
workers). ``tuning.engine.compile.targets`` re-exports all of it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "TargetRefused",
    "TARGET_KINDS",
    "USER_FIELDS",
    "PLATFORM_FIELDS",
    "CUDA_LIMITS",
    "MAX_CORES",
    "PORTABLE_CPUS",
    "validate_target_fields",
    "build_target",
    "check_target",
    "valid_mcpu",
    "valid_triple",
    "valid_arch",
    "target_kind",
]

# "generic" (or no mcpu) is baseline code that runs on every CPU of the triple's architecture
PORTABLE_CPUS = ("", "generic")

TARGET_KINDS = ("llvm", "cuda")
# What a user may set, per kind. Every other attribute TVM's kinds accept (their list:
# tvm.target.TargetKind.options_from_name) is refused, so one a future TVM adds is refused too.
USER_FIELDS = {"llvm": ("kind", "num-cores", "mcpu"), "cuda": ("kind", "arch")}
# What the platform itself adds to a target it built or resolved: the triple of the CPU it named; a
# CUDA target's generic LLVM host and the GPU limits (integers) that make_target and TVM fill in
CUDA_LIMITS = (
    "max_threads_per_block",
    "max_shared_memory_per_block",
    "thread_warp_size",
    "registers_per_block",
    "max_num_threads",
)
PLATFORM_FIELDS = {"llvm": ("mtriple",), "cuda": ("host",) + CUDA_LIMITS}
MAX_CORES = 1024  # RUN_LIMITS["num_cores"]'s ceiling
MAX_CUDA_LIMIT = 2**31 - 1
MAX_NAME_CHARS = 64
# LLVM's names: CPUs ("znver3", "skylake-avx512", "x86-64-v3", "cortex-a72"), triples
# ("x86_64-pc-linux-gnu", "aarch64-unknown-linux-gnu", "x86_64-apple-darwin23.1.0"), NVIDIA
# architectures ("sm_90", "sm_90a", "sm_100a"). No spaces, no leading dash, no "+": nothing LLVM
# could read as an option or a CPU feature.
MCPU_PATTERN = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
TRIPLE_PATTERN = re.compile(r"[a-z0-9_]{1,32}(?:-[a-z0-9_.]{1,32}){1,4}")
ARCH_PATTERN = re.compile(r"sm_\d{2,3}[a-z]?")


class TargetRefused(ValueError):
    """A target with an attribute or a value outside the closed schema; ``key`` names the attribute."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"target[{key!r}]: {reason}" if key else reason)
        self.key, self.reason = key, reason


def _is_name(value: Any, pattern: re.Pattern) -> bool:
    return isinstance(value, str) and len(value) <= MAX_NAME_CHARS and bool(pattern.fullmatch(value))


def valid_mcpu(value: Any) -> bool:
    """An LLVM CPU name (pattern only: whether LLVM knows it is resolve_cpu_target's question)."""
    return _is_name(value, MCPU_PATTERN)


def valid_triple(value: Any) -> bool:
    return _is_name(value, TRIPLE_PATTERN)


def valid_arch(value: Any) -> bool:
    return _is_name(value, ARCH_PATTERN)


def _as_fields(target: Any) -> dict:
    """The target as a dict of fields: a dict, a JSON object string, or a bare kind name ("llvm").
    A string of TVM options ("llvm -mcpu=... -cl-opt=...") is refused: only the platform writes options."""
    if isinstance(target, str):
        text = target.strip()
        if text.startswith("{"):
            try:
                target = json.loads(text)
            except (ValueError, RecursionError):
                raise TargetRefused("", "the target is not valid JSON") from None
        elif text in TARGET_KINDS:
            return {"kind": text}
        else:
            raise TargetRefused(
                "",
                f'a target is a JSON object such as {{"kind": "llvm", "num-cores": 2}}, '
                f"not a string of TVM options ({text[:40]!r})",
            )
    if not isinstance(target, Mapping):
        raise TargetRefused("", 'a target is a JSON object such as {"kind": "llvm", "num-cores": 2}')
    for key in target:
        if not isinstance(key, str):
            raise TargetRefused(str(key)[:40], "target keys are strings")
    return dict(target)


def _check_kind(fields: dict) -> str:
    kind = fields.get("kind")
    if kind not in TARGET_KINDS:
        shown = kind[:40] if isinstance(kind, str) else type(kind).__name__
        raise TargetRefused("kind", f"the kind {shown!r} is not supported; use one of {', '.join(TARGET_KINDS)}")
    return kind


def _check_keys(fields: dict, kind: str, allowed: tuple[str, ...]) -> None:
    for key in fields:
        if key not in allowed:
            raise TargetRefused(
                key[:60],
                f"{key[:60]!r} is not an attribute a {kind} target may set; it may set only {', '.join(allowed)}",
            )


def _check_cores(value: Any, max_cores: int) -> int:
    if type(value) is not int or not 1 <= value <= max_cores:
        raise TargetRefused("num-cores", f"num-cores must be an integer from 1 to {max_cores}")
    return value


def _check_value(key: str, value: Any, *, max_cores: int) -> Any:
    """One field of the schema, by its pattern or bounds; TargetRefused names the key."""
    if key == "num-cores":
        return _check_cores(value, max_cores)
    if key == "mcpu" and not valid_mcpu(value):
        raise TargetRefused(key, "mcpu must be an LLVM CPU name (lower-case letters, digits, '-', '_', '.')")
    if key == "mtriple" and not valid_triple(value):
        raise TargetRefused(key, "mtriple must be an LLVM triple such as x86_64-pc-linux-gnu")
    if key == "arch" and not valid_arch(value):
        raise TargetRefused(key, "arch must name an NVIDIA architecture such as sm_90 (sm_ and 2-3 digits)")
    if key in CUDA_LIMITS and (type(value) is not int or not 1 <= value <= MAX_CUDA_LIMIT):
        raise TargetRefused(key, f"{key} must be a positive integer")
    return value


def validate_target_fields(fields: Any, *, cpus: Mapping[str, str] | None = None, max_cores: int = MAX_CORES) -> dict:
    """The fields a user gave, checked against the closed schema: ``kind`` in :data:`TARGET_KINDS` and only
    :data:`USER_FIELDS` of that kind (every other key, nested objects such as ``host`` included, raises
    :class:`TargetRefused` naming it). ``num-cores``: 1 to ``max_cores``. ``mcpu``: one of ``cpus`` (the
    ``{mcpu: triple}`` the platform knows from its nodes) or "generic", never free text. ``arch``:
    ``sm_`` and 2-3 digits. Returns the checked fields."""
    fields = _as_fields(fields)
    kind = _check_kind(fields)
    _check_keys(fields, kind, USER_FIELDS[kind])
    for key, value in fields.items():
        if key != "kind":
            _check_value(key, value, max_cores=max_cores)
    mcpu = fields.get("mcpu")
    if mcpu is not None and mcpu not in PORTABLE_CPUS[1:] and mcpu not in (cpus or {}):
        known = ", ".join(sorted(cpus or {})) or "none registered"
        raise TargetRefused(
            "mcpu",
            f"mcpu {mcpu!r} is not a CPU a registered node reports (known: {known}); "
            "leave it out to build for the executing host",
        )
    return fields


def build_target(
    fields: Any, *, cpus: Mapping[str, str] | None = None, max_cores: int = MAX_CORES, default_cores: int | None = None
) -> dict:
    """The target the platform tunes for, built from the user's fields (:func:`validate_target_fields`):
    llvm ``{"kind", "num-cores"[, "mcpu", "mtriple"]}`` (``num-cores`` defaults to ``default_cores``; the
    triple is the one the node reporting ``mcpu`` registered), cuda ``{"kind"[, "arch"]}``."""
    fields = validate_target_fields(fields, cpus=cpus, max_cores=max_cores)
    if fields["kind"] == "cuda":
        return {"kind": "cuda", **({"arch": fields["arch"]} if "arch" in fields else {})}
    target: dict = {"kind": "llvm"}
    cores = fields.get("num-cores", default_cores)
    if cores is not None:
        target["num-cores"] = _check_cores(min(int(cores), max_cores), max_cores)
    if "mcpu" in fields:
        target["mcpu"] = fields["mcpu"]
        triple = (cpus or {}).get(fields["mcpu"])
        if triple:
            target["mtriple"] = _check_value("mtriple", triple, max_cores=max_cores)
    return target


def check_target(target: Any, *, _nested: bool = False) -> dict:
    """A target about to reach TVM (stored, resolved, or received in a message), checked again: the
    kind, :data:`USER_FIELDS` and :data:`PLATFORM_FIELDS` only, every value by its pattern or bounds;
    a CUDA target's ``host`` is itself a checked llvm target. Nothing else passes, whoever wrote it (a
    row stored before the schema was closed, a hostile message). Returns a plain copy; raises
    :class:`TargetRefused` naming the key."""
    fields = _as_fields(target)
    kind = _check_kind(fields)
    if _nested and kind != "llvm":
        raise TargetRefused("kind", "a CUDA target's host is an llvm target")
    _check_keys(fields, kind, USER_FIELDS[kind] + PLATFORM_FIELDS[kind])
    out: dict = {}
    for key, value in fields.items():
        if key == "host":
            if _nested:
                raise TargetRefused("host", "a host target has no host")
            try:
                value = check_target(value, _nested=True)
            except TargetRefused as exc:
                raise TargetRefused(f"host.{exc.key}" if exc.key else "host", exc.reason) from None
        elif key != "kind":
            value = _check_value(key, value, max_cores=MAX_CORES)
        out[key] = value
    return out


def target_kind(target: Any) -> str:
    """The kind ("llvm", "cuda", ...) of a target spec dict, its JSON text, a ``tvm.target.Target`` or a
    target string (None: the host's CPU). Reads the kind only; it validates nothing (:func:`check_target`
    does)."""
    if target is None:
        return "llvm"
    if isinstance(target, Mapping):
        return str(target.get("kind") or "llvm")
    kind = getattr(target, "kind", None)
    if kind is not None:
        return str(getattr(kind, "name", kind))
    text = str(target).strip()
    if text.startswith("{"):
        try:
            return target_kind(json.loads(text))
        except ValueError:
            return "llvm"
    return text.split()[0] if text else "llvm"
