"""CUDA device code for measuring workers that hold TVM's runtime only.

TVM 0.27's CUDA codegen keeps each kernel as CUDA C++ source inside the exported
library (format ``cuda``) and compiles it when the library is *loaded*, through the
Python callback ``tvm_callback_cuda_compile`` (``tvm.support.nvcc``). That callback
needs TVM's compiler library (it reads ``Target.current()``), which a runtime-only
GPU worker (``TVM_USE_RUNTIME_LIB=1``) does not have: there every CUDA candidate
failed to load (seen on an H200, session 19). This module is the worker's callback:

1. a binary compiled ahead, found by the source's SHA-256 and the device's arch
   in ``cuda_bin/`` beside the library being loaded (the persistent builder
   compiles each CUDA candidate's kernels there when its host has nvcc, a payload
   to a remote GPU worker carries them, ``bench/gpu_check.sh --prepare`` writes
   them next to its candidates) or in the cache;
2. else ``nvcc`` on this host, for the device's own arch, with TVM's flags; the
   result is cached on disk (``DLOPT_CUDA_CACHE_DIR``, which the parent resolves to
   this user's private ``<tmp>/dlopt-<uid>/cuda``), so a candidate measured serially
   and then in parallel is compiled once.

Importable with TVM's runtime only: nothing here touches the compiler library.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "CACHE_DIR_VAR", "CudaCompileError", "binary_name", "compile_source",
    "beside", "binaries_beside", "cache_dir", "install_runtime_compiler", "loading", "lookup", "precompile",
    "precompile_kernels", "write_beside",
]

CACHE_DIR_VAR = "DLOPT_CUDA_CACHE_DIR"
CALLBACK = "tvm_callback_cuda_compile"
# TVM 0.27's own nvcc flags (tvm.support.nvcc._compile_cuda_nvcc), so a kernel compiles as TVM would
_NVCC_FLAGS = [
    "-O3", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_BFLOAT16_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_BFLOAT162_OPERATORS__", "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
    "--expt-relaxed-constexpr", "--expt-extended-lambda", "--use_fast_math",
]


class CudaCompileError(RuntimeError):
    """CUDA source could not be compiled on this host (no nvcc, or nvcc refused it)."""


def binary_name(code: str, arch: str) -> str:
    """``<sha256 of the source>.<arch>.fatbin``: one file per kernel source and device arch."""
    return f"{hashlib.sha256(code.encode()).hexdigest()}.{arch}.fatbin"


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    candidate = Path(home, "bin", "nvcc")
    return str(candidate) if candidate.exists() else None


def compile_source(code: str, arch: str, *, timeout: float = 300.0) -> bytes:
    """Compile CUDA C++ ``code`` to a fatbin for ``arch`` (``sm_90``) with nvcc."""
    nvcc = _nvcc()
    if nvcc is None:
        raise CudaCompileError(f"no nvcc on this host to compile CUDA source for {arch}; install the CUDA "
                               f"toolkit, or build candidates where nvcc is (their kernels travel with them)")
    suffix = arch.split("_", 1)[-1]
    with tempfile.TemporaryDirectory(prefix="dlopt-nvcc-") as tmp:
        src, out = Path(tmp, "kernel.cu"), Path(tmp, "kernel.fatbin")
        src.write_text(code)
        cmd = [nvcc, "--fatbin", "-gencode", f"arch=compute_{suffix},code=sm_{suffix}", *_NVCC_FLAGS,
               "-o", str(out), str(src)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise CudaCompileError(f"nvcc took over {timeout:.0f} s") from None
        if done.returncode != 0 or not out.exists():
            raise CudaCompileError(f"nvcc failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-600:]}")
        return out.read_bytes()


def _store(directory: Path, name: str, data: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    path = directory / name
    os.replace(tmp, path)  # atomic: parallel workers compiling the same kernel never read half a file
    return path


def precompile(code: str, arch: str, out_dir: str | os.PathLike) -> Path:
    """Compile ahead (on a build host with nvcc) and write the binary a worker will look up."""
    return _store(Path(out_dir), binary_name(code, arch), compile_source(code, arch))


def precompile_kernels(rt_mod, arch: str, out_dir: str | os.PathLike) -> int:
    """Builder side: compile each CUDA kernel a freshly built module holds (as source) into
    ``out_dir`` (the builder: beside the exported candidate, where its measuring worker looks
    first and whence a payload carries them). Returns how many were compiled; 0 without nvcc
    here (the GPU host compiles on load). nvcc refusing a kernel raises :class:`CudaCompileError`:
    the candidate would fail to load anyway, so it fails as a build error, without a measurement."""
    if _nvcc() is None or not arch:
        return 0
    n = 0
    for device_mod in getattr(rt_mod, "mod", rt_mod).imports:
        if device_mod.kind != "cuda":
            continue
        code = device_mod.inspect_source("cuda")
        if not (Path(out_dir) / binary_name(code, arch)).exists():
            precompile(code, arch, out_dir)
            n += 1
    return n


BESIDE = "cuda_bin"  # the folder next to an exported candidate that holds its kernels' binaries
_NAME = re.compile(r"^[0-9a-f]{64}\.sm_[0-9]{2,3}a?\.fatbin$")
MAX_BINARY_BYTES = 64 * 1024 * 1024
_loading: list[Path] = []  # the folder beside the library being loaded (measure_path, one at a time)


def beside(artifact_path: str | os.PathLike) -> Path:
    return Path(artifact_path).parent / BESIDE


@contextlib.contextmanager
def loading(artifact_path: str | os.PathLike):
    """While ``artifact_path`` is loaded, the callback looks beside it first (the binaries the
    builder compiled for this candidate, or that a payload carried)."""
    _loading.append(beside(artifact_path))
    try:
        yield
    finally:
        _loading.pop()


def binaries_beside(artifact_path: str | os.PathLike) -> dict[str, bytes]:
    """The kernel binaries next to a candidate, for a payload to a remote GPU worker."""
    folder = beside(artifact_path)
    if not folder.is_dir():
        return {}
    return {f.name: f.read_bytes() for f in sorted(folder.iterdir()) if _NAME.match(f.name) and f.is_file()}


def write_beside(artifact_path: str | os.PathLike, binaries: dict[str, bytes]) -> None:
    """Receiving side of a payload: only well-formed names (no path can be smuggled in), bounded sizes."""
    for name, data in binaries.items():
        if not _NAME.match(str(name)):
            raise ValueError(f"refused kernel binary name {str(name)[:80]!r}")
        if len(data) > MAX_BINARY_BYTES:
            raise ValueError(f"kernel binary {name} is over {MAX_BINARY_BYTES} bytes")
        _store(beside(artifact_path), name, data)


def cache_dir() -> str:
    """The kernel cache a parent hands its build and measuring workers (``DLOPT_CUDA_CACHE_DIR``):
    the variable's value, else this user's private runtime directory (sandbox.user_runtime_dir;
    raises :class:`~tuning.engine.sandbox.UnsafeDirectory` when another user could write there)."""
    from .sandbox import user_runtime_dir

    return os.environ.get(CACHE_DIR_VAR) or user_runtime_dir("cuda")


def _cache_dir() -> Path | None:
    """A worker's cache: only what its parent passed. A worker's own TMPDIR is private to it, so
    a default there would be a cache nobody else reads."""
    value = os.environ.get(CACHE_DIR_VAR)
    return Path(value) if value else None


def lookup(code: str, arch: str, dirs: Iterable[str | os.PathLike]) -> bytes | None:
    name = binary_name(code, arch)
    for d in dirs:
        path = Path(d, name)
        if path.is_file():
            return path.read_bytes()
    return None


def install_runtime_compiler(arch: str) -> bool:
    """Register ``tvm_callback_cuda_compile`` for ``arch`` where TVM's own cannot work: a
    runtime-only import registers TVM's too, but it fails on ``Target.current()``. With the
    compiler library TVM's callback stays. Returns whether this module's callback was installed."""
    import tvm_ffi
    from tvm.base import _RUNTIME_ONLY

    if not _RUNTIME_ONLY and tvm_ffi.get_global_func(CALLBACK, allow_missing=True) is not None:
        return False

    def callback(code: str, *_: object) -> bytes:
        code = str(code)
        cache = _cache_dir()
        found = lookup(code, arch, [*_loading[-1:], *([cache] if cache else [])])
        if found is not None:
            return found
        data = compile_source(code, arch)
        if cache is not None:
            _store(cache, binary_name(code, arch), data)
        return data

    tvm_ffi.register_global_func(CALLBACK, callback, override=True)
    return True
