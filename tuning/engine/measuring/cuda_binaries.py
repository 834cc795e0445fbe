"""CUDA device code for measuring workers that hold TVM's runtime only.

TVM 0.27's CUDA codegen keeps each kernel as CUDA C++ source inside the exported
library (format ``cuda``) and compiles it when the library is *loaded*, through the
Python callback ``tvm_callback_cuda_compile`` (``tvm.support.nvcc``). That callback
needs TVM's compiler library (it reads ``Target.current()``), which a runtime-only
GPU worker (``TVM_USE_RUNTIME_LIB=1``) does not have: there every CUDA candidate
failed to load (seen on an H200). This module is the worker's callback:

1. a binary compiled ahead, found by the source's SHA-256 and the device's arch
   in ``cuda_bin/`` beside the library being loaded (the persistent builder
   compiles each CUDA candidate's kernels there when its host has nvcc, a payload
   to a remote GPU worker carries them, ``bench/gpu_check.sh --prepare`` writes
   them next to its candidates) or in the cache;
2. else ``nvcc`` on this host, for the device's own arch, with TVM's flags; a local
   runner's workers share a cache of what they compiled (``DLOPT_CUDA_CACHE_DIR``, a
   fresh private folder per runner), so a candidate measured serially and then in
   parallel is compiled once. A remote queue's workers, which measure every team's
   candidates, keep no cache: their payloads carry the builder's binaries.

Importable with TVM's runtime only: nothing here touches the compiler library.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from common.privileges import hand_over

__all__ = [
    "CACHE_DIR_VAR",
    "CudaCompileError",
    "binary_name",
    "compile_source",
    "beside",
    "binaries_beside",
    "new_cache_dir",
    "install_runtime_compiler",
    "loading",
    "lookup",
    "precompile",
    "precompile_kernels",
    "write_beside",
]

CACHE_DIR_VAR = "DLOPT_CUDA_CACHE_DIR"
CALLBACK = "tvm_callback_cuda_compile"
BESIDE = "cuda_bin"  # the folder next to an exported candidate that holds its kernels' binaries
_NAME = re.compile(r"[0-9a-f]{64}\.sm_[0-9]{2,3}a?\.fatbin")  # fullmatch: no path, no newline
FATBIN_MAGIC = bytes.fromhex("50ed55ba")
MAX_BINARY_BYTES = 16 * 1024 * 1024
MAX_BINARIES = 64  # one candidate's kernels; a payload with more is refused
_loading: list[Path] = []  # the folder beside the library being loaded (measure_path, one at a time)
# TVM 0.27's own nvcc flags (tvm.support.nvcc._compile_cuda_nvcc), so a kernel compiles as TVM would
_NVCC_FLAGS = [
    "-O3",
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT162_OPERATORS__",
    "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "--use_fast_math",
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
        raise CudaCompileError(
            f"no nvcc on this host to compile CUDA source for {arch}; install the CUDA "
            f"toolkit, or build candidates where nvcc is (their kernels travel with them)"
        )
    suffix = arch.split("_", 1)[-1]
    with tempfile.TemporaryDirectory(prefix="dlopt-nvcc-") as tmp:
        src, out = Path(tmp, "kernel.cu"), Path(tmp, "kernel.fatbin")
        src.write_text(code)
        # run in the temporary folder with relative names and TMPDIR there: its messages name no
        # server path, and what nvcc's own children leave goes with the folder
        cmd = [
            nvcc,
            "--fatbin",
            "-gencode",
            f"arch=compute_{suffix},code=sm_{suffix}",
            *_NVCC_FLAGS,
            "-o",
            out.name,
            src.name,
        ]
        proc = subprocess.Popen(
            cmd,
            cwd=tmp,
            env=dict(os.environ, TMPDIR=tmp),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            text, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # nvcc's children (cicc, ptxas) too
            proc.communicate()
            raise CudaCompileError(f"nvcc took over {timeout:.0f} s") from None
        if proc.returncode != 0 or not out.exists():
            raise CudaCompileError(f"nvcc failed ({proc.returncode}): {text.replace(tmp, '.').strip()[-600:]}")
        return out.read_bytes()


def _store(directory: Path, name: str, data: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        path = directory / name
        os.replace(tmp, path)  # atomic: parallel workers compiling the same kernel never read half a file
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # a full disk leaves no half-written file behind
        raise
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


def _read_binary(folder_fd: int, name: str) -> bytes | None:
    """A fatbin of at most MAX_BINARY_BYTES, read as sandbox.read_untrusted_file reads: the reader may
    be the secret-holding parent and the writer a build worker."""
    from tuning.engine.process.sandbox import read_untrusted_file

    try:
        return read_untrusted_file(name, dir_fd=folder_fd, max_bytes=MAX_BINARY_BYTES, magic=FATBIN_MAGIC)
    except OSError:
        return None


@contextlib.contextmanager
def _folder(path: str | os.PathLike):
    """A descriptor of the folder ``path``, opened through no link; None when it cannot be opened."""
    try:
        folder_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        yield None
        return
    try:
        yield folder_fd
    finally:
        os.close(folder_fd)


def binaries_beside(artifact_path: str | os.PathLike) -> dict[str, bytes]:
    """The kernel binaries next to a candidate, for a payload to a remote GPU worker: well-named
    regular files only, at most MAX_BINARIES, none read through a link."""
    with _folder(beside(artifact_path)) as folder_fd:
        if folder_fd is None:
            return {}
        names = sorted(n for n in os.listdir(folder_fd) if _NAME.fullmatch(n))[:MAX_BINARIES]
        found = {n: _read_binary(folder_fd, n) for n in names}
    return {n: data for n, data in found.items() if data is not None}


def write_beside(artifact_path: str | os.PathLike, binaries: dict[str, bytes]) -> None:
    """Receiving side of a payload: only well-formed names (no path can be smuggled in), bounded
    count and sizes."""
    if len(binaries) > MAX_BINARIES:
        raise ValueError(f"{len(binaries)} kernel binaries (at most {MAX_BINARIES})")
    for name, data in binaries.items():
        if not _NAME.fullmatch(str(name)):
            raise ValueError(f"refused kernel binary name {str(name)[:80]!r}")
        if len(data) > MAX_BINARY_BYTES:
            raise ValueError(f"kernel binary {name} is over {MAX_BINARY_BYTES} bytes")
        _store(beside(artifact_path), name, data)


def new_cache_dir() -> str:
    """A kernel cache for one runner's measuring workers (``DLOPT_CUDA_CACHE_DIR``): a fresh
    private folder (``mkdtemp``: 0700, a name nobody can guess ahead), so kernels compiled by one
    run's workers are never loaded by another run's, and no other user can plant one."""
    path = tempfile.mkdtemp(prefix="dlopt-cuda-")
    hand_over(path)  # the measuring workers write it as the sandbox account
    return path


def _cache_dir() -> Path | None:
    """A worker's cache: only what its parent passed. A worker's own TMPDIR is private to it, so
    a default there would be a cache nobody else reads."""
    value = os.environ.get(CACHE_DIR_VAR)
    return Path(value) if value else None


def lookup(code: str, arch: str, dirs: Iterable[str | os.PathLike]) -> bytes | None:
    name = binary_name(code, arch)
    for d in dirs:
        with _folder(d) as folder_fd:
            found = _read_binary(folder_fd, name) if folder_fd is not None else None
        if found is not None:
            return found
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
