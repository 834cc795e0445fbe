"""CUDA binaries for runtime-only GPU workers (tuning/engine/measuring/cuda_binaries.py).

TVM 0.27 compiles a CUDA candidate's source when the library is loaded, through a Python
callback that needs TVM's compiler library; a runtime-only worker gets this module's callback
instead. Runs in a subprocess with TVM_USE_RUNTIME_LIB=1, as a measuring worker does."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tuning.engine.measuring.cuda_binaries import binary_name

KERNEL = 'extern "C" __global__ void k(float* __restrict__ a) { a[threadIdx.x] = 1.0f; }\n'
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FATBIN_MAGIC = bytes.fromhex("50ed55ba")


def _run_callback(sources, env_extra, loading=""):
    code = (
        "import contextlib, json, sys, tvm_ffi\n"
        "from tuning.engine.measuring.cuda_binaries import install_runtime_compiler, loading\n"
        "installed = install_runtime_compiler('sm_90')\n"
        "f = tvm_ffi.get_global_func('tvm_callback_cuda_compile')\n"
        "out = []\n"
        "with (loading(sys.argv[2]) if sys.argv[2] else contextlib.nullcontext()):\n"
        "    for src in json.loads(sys.argv[1]):\n"
        "        try:\n"
        "            out.append(bytes(f(src)).hex())\n"
        "        except Exception as exc:\n"
        "            out.append('error: ' + str(exc))\n"
        "print(json.dumps({'installed': installed, 'out': out}))\n"
    )
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1", PYTHONPATH=ROOT, **env_extra)
    done = subprocess.run([sys.executable, "-c", code, json.dumps(sources), str(loading)], env=env, capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_runtime_only_worker_serves_the_binary_beside_the_candidate(tmp_path):
    beside = tmp_path / "cand" / "cuda_bin"
    beside.mkdir(parents=True)
    (beside / binary_name(KERNEL, "sm_90")).write_bytes(FATBIN_MAGIC + b"BESIDE")
    (beside / binary_name(KERNEL, "sm_80")).write_bytes(FATBIN_MAGIC + b"OTHER-ARCH")
    res = _run_callback([KERNEL], {"DLOPT_CUDA_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/nonexistent"},
                        loading=tmp_path / "cand" / "candidate.so")
    # TVM's own callback is registered by a runtime-only import too, and fails there: ours replaces it
    assert res["installed"] is True
    assert bytes.fromhex(res["out"][0]) == FATBIN_MAGIC + b"BESIDE"
    assert not (tmp_path / "cache").exists()  # nothing compiled


def test_without_a_binary_or_nvcc_the_error_says_what_is_missing(tmp_path):
    res = _run_callback([KERNEL], {"DLOPT_CUDA_CACHE_DIR": str(tmp_path),
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
    binary beside it, where its measuring worker looks first (no nvcc at measuring time)."""
    if not (shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc")):
        import pytest

        pytest.skip("needs nvcc (the CUDA toolkit)")
    import tvm
    from tvm import s_tir

    from tuning.engine.runners.builder import _target_json, build_in_worker, tvm_save_json
    from tuning.engine.testing import matmul_primfunc

    sch = s_tir.Schedule(tvm.IRModule({"main": matmul_primfunc(64)}))
    loops = sch.get_loops(sch.get_child_blocks(sch.get_sblock("root"))[-1])
    bx, tx = sch.split(sch.fuse(*loops[:2]), [None, 64])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90", "host": {"kind": "llvm"}})
    path, _ = build_in_worker(tvm_save_json(sch.mod), _target_json(target), str(tmp_path / "out"))
    assert os.path.exists(path)
    (binary,) = (Path(path).parent / "cuda_bin").iterdir()  # beside the candidate: a payload carries it
    # keyed by the kernel source the module holds (what the runtime hands the callback on load)
    from tvm.driver import build as tvm_build

    source = tvm_build(sch.mod, target=target).imports[0].inspect_source("cuda")
    assert binary.name == binary_name(source, "sm_90") and binary.read_bytes().startswith(FATBIN_MAGIC)


def test_a_payload_carries_the_kernels_and_a_hostile_name_is_refused():
    """A remote GPU worker gets the candidate's kernel binaries with it; their names are checked
    before anything is written (no path can be smuggled in)."""
    from tuning.engine.measuring.measure import make_payload, measure_payload

    name = binary_name(KERNEL, "sm_90")
    ok = make_payload(b"not a shared library", device_type="cuda", args_info_json=[], evaluator=None,
                      threads=None, kernel_binaries={name: b"FATBIN"})
    assert ok["kernel_binaries_b64"] == {name: "RkFUQklO"}
    out = measure_payload(ok)
    assert "refused" not in out["error"]  # accepted; this host just has no GPU to measure on
    for hostile in ("../../../tmp/x.fatbin", "/etc/passwd", name + "/x", "a" * 64 + ".sm_90.so"):
        bad = make_payload(b"x", device_type="cuda", args_info_json=[], evaluator=None, threads=None,
                           kernel_binaries={hostile: b"X"})
        assert measure_payload(bad)["error"].startswith("refused payload: refused kernel binary name")
    bad = dict(ok, kernel_binaries_b64={name: "not base64!"})
    assert "not base64" in measure_payload(bad)["error"]


def test_the_parent_reads_no_link_and_nothing_but_fatbins_from_beside_a_candidate(tmp_path):
    """The payload's binaries are read by the secret-holding tuning process from a folder a build
    worker wrote: a link (say to /proc/self/environ) or a non-fatbin file never goes into a payload."""
    from tuning.engine.measuring.cuda_binaries import binaries_beside

    cand = tmp_path / "cand_x"
    (cand / "cuda_bin").mkdir(parents=True)
    good, linked, junk = (binary_name(k, "sm_90") for k in (KERNEL, KERNEL + " ", KERNEL + "  "))
    (cand / "cuda_bin" / good).write_bytes(FATBIN_MAGIC + b"ok")
    (cand / "cuda_bin" / linked).symlink_to("/proc/self/environ")
    (cand / "cuda_bin" / junk).write_bytes(b"DJANGO_SECRET_KEY=x")
    (cand / "cuda_bin" / (good[:-7] + ".fatbin\n")).write_bytes(FATBIN_MAGIC)  # a name with a newline
    assert binaries_beside(cand / "candidate.so") == {good: FATBIN_MAGIC + b"ok"}
    # a folder that is itself a link is not followed either
    (tmp_path / "cand_y").mkdir()
    (tmp_path / "cand_y" / "cuda_bin").symlink_to(cand / "cuda_bin")
    assert binaries_beside(tmp_path / "cand_y" / "candidate.so") == {}
