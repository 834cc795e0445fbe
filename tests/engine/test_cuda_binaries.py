"""CUDA binaries for runtime-only GPU workers (tuning/engine/cuda_binaries.py).

TVM 0.27 compiles a CUDA candidate's source when the library is loaded, through a Python
callback that needs TVM's compiler library; a runtime-only worker gets this module's callback
instead. Runs in a subprocess with TVM_USE_RUNTIME_LIB=1, as a measuring worker does."""

import json
import os
import shutil
import subprocess
import sys

from tuning.engine.cuda_binaries import binary_name

KERNEL = 'extern "C" __global__ void k(float* __restrict__ a) { a[threadIdx.x] = 1.0f; }\n'
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FATBIN_MAGIC = bytes.fromhex("50ed55ba")


def _run_callback(sources, env_extra):
    code = (
        "import json, sys, tvm_ffi\n"
        "from tuning.engine.cuda_binaries import install_runtime_compiler\n"
        "installed = install_runtime_compiler('sm_90')\n"
        "f = tvm_ffi.get_global_func('tvm_callback_cuda_compile')\n"
        "out = []\n"
        "for src in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        out.append(bytes(f(src)).hex())\n"
        "    except Exception as exc:\n"
        "        out.append('error: ' + str(exc))\n"
        "print(json.dumps({'installed': installed, 'out': out}))\n"
    )
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1", PYTHONPATH=ROOT, **env_extra)
    done = subprocess.run([sys.executable, "-c", code, json.dumps(sources)], env=env, capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_runtime_only_worker_serves_the_prebuilt_binary(tmp_path):
    prebuilt = tmp_path / "bin"
    prebuilt.mkdir()
    (prebuilt / binary_name(KERNEL, "sm_90")).write_bytes(b"PREBUILT")
    (prebuilt / binary_name(KERNEL, "sm_80")).write_bytes(b"OTHER-ARCH")
    res = _run_callback([KERNEL], {"DLOPT_CUDA_BINARY_DIRS": str(prebuilt),
                                   "DLOPT_CUDA_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/nonexistent"})
    # TVM's own callback is registered by a runtime-only import too, and fails there: ours replaces it
    assert res["installed"] is True
    assert bytes.fromhex(res["out"][0]) == b"PREBUILT"
    assert not (tmp_path / "cache").exists()  # nothing compiled


def test_without_a_binary_or_nvcc_the_error_says_what_is_missing(tmp_path):
    res = _run_callback([KERNEL], {"DLOPT_CUDA_BINARY_DIRS": "", "DLOPT_CUDA_CACHE_DIR": str(tmp_path),
                                   "PATH": "/nonexistent", "CUDA_HOME": str(tmp_path / "no-cuda")})
    assert res["out"][0].startswith("error: ") and "no nvcc" in res["out"][0] and "sm_90" in res["out"][0]


def test_nvcc_compiles_once_per_kernel_and_arch(tmp_path):
    if not (shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc")):
        import pytest

        pytest.skip("needs nvcc (the CUDA toolkit)")
    cache = tmp_path / "cache"
    (compiled,) = (bytes.fromhex(h) for h in _run_callback([KERNEL], {"DLOPT_CUDA_CACHE_DIR": str(cache)})["out"])
    assert compiled.startswith(FATBIN_MAGIC)
    assert [p.name for p in cache.iterdir()] == [binary_name(KERNEL, "sm_90")]
    # the next worker (a DOP change, a recycled worker) reads the cache: no nvcc needed
    res = _run_callback([KERNEL], {"DLOPT_CUDA_CACHE_DIR": str(cache), "PATH": "/nonexistent",
                                   "CUDA_HOME": str(tmp_path / "no-cuda")})
    assert bytes.fromhex(res["out"][0]) == compiled


def test_the_builder_compiles_a_cuda_candidates_kernels_for_the_workers(tmp_path, monkeypatch):
    """A CUDA candidate built by the persistent builder's worker function leaves its kernels'
    binary in the cache this host's measuring workers read (no nvcc at measuring time)."""
    if not (shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc")):
        import pytest

        pytest.skip("needs nvcc (the CUDA toolkit)")
    import tvm
    from tvm import s_tir

    from tuning.engine.builder import _target_json, build_in_worker, tvm_save_json
    from tuning.engine.testing import matmul_primfunc

    monkeypatch.setenv("DLOPT_CUDA_CACHE_DIR", str(tmp_path / "cache"))
    sch = s_tir.Schedule(tvm.IRModule({"main": matmul_primfunc(64)}))
    loops = sch.get_loops(sch.get_child_blocks(sch.get_sblock("root"))[-1])
    bx, tx = sch.split(sch.fuse(*loops[:2]), [None, 64])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90", "host": {"kind": "llvm"}})
    path, _ = build_in_worker(tvm_save_json(sch.mod), _target_json(target), str(tmp_path / "out"))
    assert os.path.exists(path)
    (binary,) = (tmp_path / "cache").iterdir()
    # keyed by the kernel source the module holds (what the runtime hands the callback on load)
    from tvm.driver import build as tvm_build

    source = tvm_build(sch.mod, target=target).imports[0].inspect_source("cuda")
    assert binary.name == binary_name(source, "sm_90") and binary.read_bytes().startswith(FATBIN_MAGIC)
