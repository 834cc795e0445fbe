"""The one wrapper around NVML (nvidia-ml-py's ``pynvml``): loading it, opening and closing it, and the
queries a GPU may not support. Scheduling's telemetry and the tuning engine's energy meter both read
GPUs through it. Every function takes the NVML module as an argument, so tests pass a fake one; a host
without the library or the driver is not an error here but a reason (``NvmlUnavailable``)."""

from __future__ import annotations

from typing import Any

__all__ = ["NvmlUnavailable", "load_nvml", "open_nvml", "close_nvml", "optional", "text", "total_energy_mj"]


class NvmlUnavailable(OSError):
    """NVML cannot be used here (library missing, driver not loaded); the message is pynvml's reason."""


def load_nvml() -> tuple[Any | None, str]:
    """``(pynvml module, "")`` or ``(None, why)`` when nvidia-ml-py is not installed."""
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a pinned dependency
        return None, f"nvidia-ml-py is not installed ({exc})"
    return pynvml, ""


def open_nvml(nvml: Any = None) -> Any:
    """Initialize NVML (``nvml=None``: the installed pynvml) and return the module; the caller closes it
    with :func:`close_nvml`. Raises :class:`NvmlUnavailable` with pynvml's reason."""
    if nvml is None:
        nvml, why = load_nvml()
        if nvml is None:
            raise NvmlUnavailable(why)
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded on a GPU-less host
        raise NvmlUnavailable(str(exc) or type(exc).__name__) from None
    return nvml


def close_nvml(nvml: Any) -> None:
    """Best effort: a failed shutdown changes nothing for the reading already taken."""
    try:
        nvml.nvmlShutdown()
    except Exception:
        pass


def optional(fn, *args) -> Any:
    """An NVML query a GPU may not support (power, energy on older boards): None instead of an error."""
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported and friends
        return None


def text(value: Any) -> str:
    """NVML strings are bytes in older bindings, str in newer ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


def total_energy_mj(nvml: Any, handle: Any) -> float | None:
    """The board's total-energy counter in millijoules since the driver loaded; None where unsupported."""
    value = optional(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
    return None if value is None else float(value)
