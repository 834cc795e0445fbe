"""Canonical TVM targets: resolve them from the hardware, key them, refuse foreign ones.

Django-free. A target that names no CPU makes TVM emit baseline x86-64 code
(SSE2) and keeps the AVX2/AVX-512 schedule rules from firing; a CUDA target with
no ``arch`` falls back to sm_50. So every target the platform tunes for is
resolved here, from the host (``tvm.target.codegen.llvm_get_system_cpu()`` /
``llvm_get_system_triple()``) or from the GPU (the CUDA driver through TVM's
runtime, else NVML's compute capability), or from a node's registration
(pass ``mcpu=`` / ``triple=`` / ``arch=`` explicitly).

- :func:`resolve_cpu_target` / :func:`resolve_cuda_target`: target dicts.
- :func:`canonical_key`: one stable string per target (sorted JSON of TVM's
  own export), to put in every key that identifies a tuning result.
- :func:`check_measurable_here`: raises :class:`TargetMismatch` when code built
  for a target would run on a CPU or GPU it was not built for.
- :func:`result_identity` / :func:`identity_of`: the full identity of a tuning
  result, the target's key *and* the Relax pipeline's key
  (``graph_passes.pipeline_key``): a record tuned for the same CPU under another
  pass list is another workload, and must not be reused.
- :func:`build_target` / :func:`validate_target_fields` / :func:`check_target`: the closed
  target schema (defined in ``target_schema``, re-exported here): no attribute outside
  :data:`USER_FIELDS` comes from a user, and every target is checked again before TVM parses it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from tuning.engine.compile.target_schema import (
    CUDA_LIMITS,
    MAX_CORES,
    PLATFORM_FIELDS,
    PORTABLE_CPUS,
    TARGET_KINDS,
    USER_FIELDS,
    TargetRefused,
    build_target,
    check_target,
    valid_arch,
    valid_mcpu,
    valid_triple,
    validate_target_fields,
)

__all__ = [
    "TargetMismatch",
    "host_cpu",
    "host_triple",
    "resolve_cpu_target",
    "cuda_arch_of",
    "resolve_cuda_target",
    "canonical_target",
    "canonical_key",
    "check_measurable_here",
    "resolve_run_target",
    "host_cpu_facts",
    "measurable_refusal",
    "result_identity",
    "identity_of",
    "TargetRefused",
    "TARGET_KINDS",
    "USER_FIELDS",
    "PLATFORM_FIELDS",
    "CUDA_LIMITS",
    "PORTABLE_CPUS",
    "MAX_CORES",
    "validate_target_fields",
    "build_target",
    "check_target",
    "valid_mcpu",
    "valid_triple",
    "valid_arch",
    "cpuinfo_fields",
    "host_cpu_flags",
    "isa_flags",
]

GPU_KINDS = ("cuda", "rocm", "vulkan", "metal", "opencl")
# derived by TVM from the kind; not part of a target's identity
_DERIVED_ATTRS = ("keys", "tag")


class TargetMismatch(RuntimeError):
    """Code built for one CPU or GPU would be measured on another."""


# --------------------------------------------------------------------------- host facts
def host_cpu() -> str:
    """This host's CPU as LLVM names it (``znver3``, ``emeraldrapids``, ...)."""
    from tvm.target import codegen

    return str(codegen.llvm_get_system_cpu())


def host_triple() -> str:
    """This host's LLVM triple (as the installed TVM's LLVM spells it)."""
    from tvm.target import codegen

    return str(codegen.llvm_get_system_triple())


def host_cpu_facts() -> dict:
    """``{"mcpu": ..., "triple": ..., "cores": ...}`` of this host: what a node registers so that runs
    measured on it build for its CPU (``resolve_cpu_target(mcpu=..., triple=...)``)."""
    return {"mcpu": host_cpu(), "triple": host_triple(), "cores": _available_cores()}


# The /proc/cpuinfo flags that name instruction sets LLVM may emit for a CPU (x86); on Arm every
# "Features" entry is an instruction-set extension. Others (hypervisor, constant_tsc...) say nothing
# about whether compiled code runs.
_X86_ISA_FLAG = re.compile(
    r"^(sse\w*|ssse3|avx\w*|fma4?|f16c|bmi[12]|popcnt|abm|lzcnt|movbe|adx|aes|pclmulqdq|"
    r"vaes|vpclmulqdq|gfni|sha_ni|amx\w*|cx16|xsave\w*|mmx|rdrand|rdseed|xop|tbm)$"
)


def cpuinfo_fields(cpuinfo_path: str = "/proc/cpuinfo") -> dict[str, str]:
    """The first processor's block of /proc/cpuinfo as fields (``{"model name": ..., "cpu family": ...,
    "flags": ...}``); empty where the file cannot be read."""
    fields: dict[str, str] = {}
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return {}
    return fields


def host_cpu_flags(cpuinfo_path: str = "/proc/cpuinfo") -> list[str]:
    """This host's CPU feature flags as /proc/cpuinfo lists them (x86 ``flags``, Arm ``Features``);
    empty where the file does not exist."""
    fields = cpuinfo_fields(cpuinfo_path)
    return sorted(set((fields.get("flags") or fields.get("Features") or "").split()))


def isa_flags(flags, triple: str = "") -> list[str]:
    """Of ``flags``, those naming instruction sets: what code built for that CPU may require."""
    arch, _ = _triple_arch_os(triple) if triple else ("", "")
    if arch.startswith(("aarch64", "arm")):
        return sorted(set(flags))
    return sorted(f for f in set(flags) if _X86_ISA_FLAG.match(f))


def measurable_refusal(target: Any, *, device_index: int = 0) -> str | None:
    """Why code built for ``target`` must not be measured here (:func:`check_measurable_here`'s message),
    or None when it may (or no target was given): for measuring workers that answer with an error."""
    if not target:
        return None
    try:
        check_target(target)  # a message can carry anything: the schema before TVM parses it
        check_measurable_here(target, device_index=device_index, check_cores=False)
    except TargetRefused as exc:
        return f"TargetRefused: {exc}"
    except TargetMismatch as exc:
        return f"TargetMismatch: {exc}"
    return None


def _available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


# --------------------------------------------------------------------------- resolution
def resolve_cpu_target(num_cores: int | None = None, mcpu: str | None = None, triple: str | None = None) -> dict:
    """``{"kind": "llvm", "mcpu": ..., "num-cores": N, "mtriple": ...}``.

    ``num_cores``: the deployment thread count (default: the cores this process
    may run on). ``mcpu`` / ``triple``: a remote node's registered CPU and triple
    (default: this host's); a CPU name LLVM does not know for the triple is refused.
    """
    from tvm.target import codegen

    triple = triple or host_triple()
    mcpu = mcpu or host_cpu()
    if mcpu not in PORTABLE_CPUS and not codegen.llvm_is_valid_cpu(mcpu, triple):
        raise ValueError(f"LLVM does not know the CPU {mcpu!r} for the triple {triple!r}")
    cores = int(num_cores) if num_cores is not None else _available_cores()
    if cores < 1:
        raise ValueError(f"num_cores must be >= 1, got {num_cores}")
    return {"kind": "llvm", "mcpu": mcpu, "num-cores": cores, "mtriple": triple}


def _arch_from_tvm(device_index: int) -> str | None:
    """sm_XY from the CUDA driver, through TVM's runtime (same device numbering as the
    runtime that measures); None when TVM sees no such device."""
    try:
        import tvm

        dev = tvm.cuda(device_index)
        if not dev.exist:
            return None
        major, _, minor = str(dev.compute_version).partition(".")
        return f"sm_{int(major)}{int(minor or 0)}"
    except Exception:  # noqa: BLE001 - a TVM built without CUDA raises here
        return None


def _arch_from_nvml(device_index: int) -> str | None:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(int(device_index))
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        return f"sm_{int(major)}{int(minor)}"
    except Exception:  # noqa: BLE001 - no such device
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def cuda_arch_of(device_index: int = 0) -> str | None:
    """The compute capability of CUDA device ``device_index`` as ``sm_XY``, or None."""
    return _arch_from_tvm(device_index) or _arch_from_nvml(device_index)


def resolve_cuda_target(device_index: int = 0, arch: str | None = None) -> dict:
    """``{"kind": "cuda", "arch": "sm_XY", "host": {"kind": "llvm"}}``.

    ``arch``: a GPU node's registered architecture (build here, measure there);
    default: the local device's. The host part stays generic on purpose: the
    module ships to GPU workers whose CPUs may differ from the builder's.
    """
    arch = arch or cuda_arch_of(device_index)
    if not arch:
        raise TargetMismatch(
            f"no CUDA device #{device_index} on this host (neither the CUDA driver nor NVML "
            "reports one): pass arch='sm_XY' from the GPU node's registration to build for it here"
        )
    if not valid_arch(arch):
        raise ValueError(f"CUDA arch must look like 'sm_90', got {str(arch)[:40]!r}")
    return {"kind": "cuda", "arch": str(arch), "host": {"kind": "llvm"}}


# --------------------------------------------------------------------------- identity
def _as_target(target: Any):
    from tuning.engine.compile.pipeline import make_target

    return make_target(target)


def _strip_derived(spec: dict) -> dict:
    out = {}
    for key, value in spec.items():
        if key in _DERIVED_ATTRS or value is None or value == "":
            continue
        if isinstance(value, Mapping):
            value = _strip_derived(dict(value))
        elif isinstance(value, tuple):
            value = list(value)
        out[key] = value
    return out


def canonical_target(target: Any) -> dict:
    """The target as TVM normalizes it (defaults filled in, attributes validated),
    without the attributes TVM derives from the kind (``keys``, empty ``tag``)."""
    return _strip_derived(dict(_as_target(target).export()))


def canonical_key(target: Any) -> str:
    """One stable string per target: sorted, compact JSON of :func:`canonical_target`.
    Equal for a dict, its JSON string and the ``tvm.target.Target`` built from it;
    ``relax_pipeline.make_target`` accepts it back."""
    return json.dumps(canonical_target(target), sort_keys=True, separators=(",", ":"), default=str)


def identity_of(target_key: str, pipeline_key: str) -> str:
    """The identity of a tuning result from stored keys (a run's ``target_key`` and ``pipeline_key``):
    equal exactly when both are. Needs no TVM (for record caches keyed on stored runs)."""
    return json.dumps(
        {"pipeline": str(pipeline_key or ""), "target": str(target_key or "")}, sort_keys=True, separators=(",", ":")
    )


def result_identity(target: Any, pipeline_key: str | None = None) -> str:
    """The identity of what tuning for ``target`` here produces: :func:`canonical_key` of the target and
    the pipeline's key (default: the pipeline this process extracts and compiles with for that target)."""
    from tuning.engine.compile.passes import pipeline_key as current_pipeline_key

    return identity_of(canonical_key(target), pipeline_key or current_pipeline_key(target=target))


# --------------------------------------------------------------------------- refusal
def _triple_arch_os(triple: str) -> tuple[str, str]:
    """(architecture, OS) of an LLVM triple; the vendor part ("pc", "unknown",
    "conda") does not change the code."""
    parts = str(triple).split("-")
    arch = parts[0] if parts else ""
    os_name = parts[2] if len(parts) > 2 else (parts[1] if len(parts) > 1 else "")
    return arch, os_name


def _check_cpu(spec: dict, *, check_cores: bool) -> None:
    here_cpu, here_triple = host_cpu(), host_triple()
    mcpu = str(spec.get("mcpu") or "")
    if mcpu not in PORTABLE_CPUS and mcpu != here_cpu:
        raise TargetMismatch(
            f"the target was built for the CPU {mcpu!r}, this host is {here_cpu!r}: its timings would "
            f"describe neither machine. Measure on a {mcpu!r} host, or tune again for "
            f"{here_cpu!r} (resolve_cpu_target())"
        )
    triple = spec.get("mtriple")
    if triple and _triple_arch_os(triple) != _triple_arch_os(here_triple):
        raise TargetMismatch(f"the target was built for {triple!r}, this host is {here_triple!r}")
    cores = spec.get("num-cores")
    if check_cores and cores is not None and int(cores) > _available_cores():
        raise TargetMismatch(
            f"the target runs {int(cores)} threads, this process may use {_available_cores()} cores: "
            "measuring would over-subscribe them"
        )


def _check_cuda(spec: dict, device_index: int) -> None:
    here = cuda_arch_of(device_index)
    if here is None:
        raise TargetMismatch(f"the target is a CUDA target, and this host has no CUDA device #{device_index}")
    arch = spec.get("arch")
    if arch and str(arch) != here:
        raise TargetMismatch(
            f"the target was built for {arch!r}, CUDA device #{device_index} here is {here!r}: "
            f"measure on an {arch!r} GPU, or build again with arch={here!r}"
        )


def check_measurable_here(target: Any, *, device_index: int = 0, check_cores: bool = True) -> None:
    """Raise :class:`TargetMismatch` if code built for ``target`` must not be measured on
    this host: another CPU (``mcpu`` not this host's; no ``mcpu`` or "generic" runs
    anywhere), another architecture/OS, more threads than cores here (``check_cores``),
    or another GPU architecture / no GPU. Kinds other than llvm and cuda pass."""
    spec = canonical_target(target)
    kind = spec.get("kind")
    if kind == "llvm":
        _check_cpu(spec, check_cores=check_cores)
    elif kind == "cuda":
        _check_cuda(spec, device_index)
        host = spec.get("host")
        if isinstance(host, Mapping) and host.get("kind") == "llvm":
            _check_cpu(dict(host), check_cores=False)


# --------------------------------------------------------------------------- a run's target
def resolve_run_target(target: Mapping, threads: int | None = None) -> dict:
    """The target a run tunes for, resolved on the host that executes it: ``{"target": ..., "key": ...,
    "pipeline_key": ...}`` (the pipeline this engine extracts tasks and compiles with).

    llvm: this host's ``mcpu`` and triple (or the ones the platform named from a node), ``num-cores`` =
    the run's thread count (else the target's). cuda: ``arch`` from the local device when the target
    names none and one is present (else left as given: a GPU node's registered arch is not known here).
    The target is checked against the closed schema first (:func:`check_target`)."""
    spec = check_target(target)
    kind = spec.get("kind")
    if kind == "llvm":
        cores = threads or spec.get("num-cores")
        spec.update(resolve_cpu_target(num_cores=cores, mcpu=spec.get("mcpu"), triple=spec.get("mtriple")))
    elif kind == "cuda" and not spec.get("arch"):
        arch = cuda_arch_of(0)
        if arch:
            spec["arch"] = arch
    from tuning.engine.compile.passes import pipeline_key

    return {"target": spec, "key": canonical_key(spec), "pipeline_key": pipeline_key(target=spec)}
