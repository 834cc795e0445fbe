"""Small TVM 0.27 workarounds.

``ms.TuneContext.__init__`` runs ``import tvm.s_tir.tensor_intrin``, whose
``__init__`` imports the tensor intrinsics of *every* backend (CUDA alone
~7.7 s, all ~11 s on this machine) although a CPU target only uses the x86
(or Arm) ones. :func:`ensure_tensor_intrin` registers just the intrinsics the
target needs (~0.1 s for x86) and installs the package object, so the later
import inside TuneContext is a no-op. The schedule rules see the same
intrinsics they would use for that target, so the search space is unchanged.
"""

from __future__ import annotations

import importlib
import importlib.util
import platform
import sys
import types

__all__ = ["ensure_tensor_intrin"]

_PKG = "tvm.s_tir.tensor_intrin"


def _submodules_for(kind: str) -> list[str] | None:
    machine = platform.machine().lower()
    if kind in ("llvm", "c"):
        if machine in ("x86_64", "amd64", "i686", "i386"):
            return ["x86"]
        if machine in ("aarch64", "arm64") or machine.startswith("arm"):
            return ["arm_cpu"]
        return None
    if kind == "cuda":
        return ["cuda"]
    if kind == "rocm":
        return ["rocm"]
    return None


def ensure_tensor_intrin(target) -> str:
    """Register the tensor intrinsics ``target`` needs. Returns "full" when the
    whole package is (or had to be) imported, else "light:<modules>"."""
    mod = sys.modules.get(_PKG)
    kind = target.kind.name if hasattr(target, "kind") else str(target)
    subs = _submodules_for(kind)
    if mod is not None and not getattr(mod, "_engine_light", False):
        return "full"
    if subs is None:
        if mod is not None:  # a light stub is installed: load everything into it
            for name in ("cuda", "arm_cpu", "x86", "rocm", "hexagon", "riscv_cpu"):
                importlib.import_module(f"{_PKG}.{name}")
            return "light:all"
        importlib.import_module(_PKG)
        return "full"
    if mod is None:
        spec = importlib.util.find_spec(_PKG)
        if spec is None or spec.submodule_search_locations is None:  # pragma: no cover
            importlib.import_module(_PKG)
            return "full"
        mod = types.ModuleType(_PKG)
        mod.__path__ = list(spec.submodule_search_locations)
        mod.__spec__ = spec
        mod.__file__ = spec.origin
        mod.__package__ = _PKG
        mod._engine_light = True  # type: ignore[attr-defined]
        sys.modules[_PKG] = mod
        import tvm.s_tir  # after the stub is registered: any tensor_intrin import from here on finds the stub

        tvm.s_tir.tensor_intrin = mod
    for name in subs:
        importlib.import_module(f"{_PKG}.{name}")
    return "light:" + ",".join(subs)
