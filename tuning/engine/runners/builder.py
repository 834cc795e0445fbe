"""A MetaSchedule builder whose worker processes stay alive.

TVM's ``LocalBuilder`` starts a fresh ``PopenPoolExecutor`` for every batch
(a memory-leak workaround) and every fresh worker runs
``import tvm.s_tir.tensor_intrin`` (~11-13 s here) before its first build.
:class:`PersistentBuilder` keeps ``max_workers`` Popen-started interpreters
(spawned, never forked) that import only what building needs, recycles each
after ``max_uses`` builds (the leak stays bounded), and exports a ``.so`` (not
TVM's ``.tar``), so a measuring host needs only TVM's runtime - no g++ link at
load time.

Candidates reach the workers as ``tvm.ir.save_json`` text and the target as
its JSON export; the worker returns the artifact path.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable

import tvm
from tvm.driver import build as tvm_build
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult, PyBuilder
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

from common.privileges import hand_over
from tuning.engine.measuring.cuda_binaries import beside, precompile_kernels
from tuning.engine.process.procpool import (
    ProcessPool,
    WorkerError,
    WorkerSpec,
    WorkerTimeout,
    available_cpus,
)
from tuning.engine.process.sandbox import remove_dir

__all__ = ["PersistentBuilder", "build_in_worker"]


def _cuda_env() -> dict[str, str]:
    """Make nvcc findable for CUDA builds when it is installed but not on PATH."""
    env: dict[str, str] = {}
    if shutil.which("nvcc") or os.environ.get("CUDA_PATH"):
        return env
    for cand in ("/usr/local/cuda", "/usr/local/cuda-13.0", "/usr/local/cuda-12.8", "/usr/local/cuda-12.4"):
        if os.path.exists(os.path.join(cand, "bin", "nvcc")):
            env["CUDA_PATH"] = cand
            env["PATH"] = os.path.join(cand, "bin") + os.pathsep + os.environ.get("PATH", "")
            break
    return env


def build_in_worker(mod_json: str, target_json: str, out_dir: str) -> tuple[str, float]:
    """Worker side: build one scheduled IRModule and export it as a ``.so``.
    Returns (artifact path, build seconds). Does *not* import
    ``tvm.s_tir.tensor_intrin``: a candidate that was tensorized already
    carries the intrinsic's body."""
    t0 = time.perf_counter()
    mod = tvm.ir.load_json(mod_json)
    target = tvm.target.Target(json.loads(target_json))
    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    rt_mod = tvm_build(mod, target=target)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(tempfile.mkdtemp(dir=out_dir, prefix="cand_"), "tvm_tmp_mod.so")
    rt_mod.export_library(path)
    if target.kind.name == "cuda":
        # TVM keeps CUDA kernels as source, compiled at load: compile them here, in parallel build
        # workers, beside the candidate, so measuring workers (runtime-only) load binaries
        precompile_kernels(rt_mod, str(target.attrs.get("arch", "")), beside(path))
    return path, time.perf_counter() - t0


def warmup() -> None:
    """Builder worker initializer: importing this module imported the compiler (not tensor_intrin)."""


def _target_json(target) -> str:
    exported = target.export()
    return json.dumps(_plain(exported))


def _plain(x):
    if isinstance(x, dict) or hasattr(x, "items"):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)) or type(x).__name__ in ("Array", "List", "Tuple"):
        return [_plain(v) for v in x]
    if isinstance(x, (bool, int, float, str)) or x is None:
        return x
    return str(x)


@derived_object
class PersistentBuilder(PyBuilder):
    """Builder with long-lived Popen workers (see module doc).

    Parameters: ``max_workers`` (default: usable cores), ``timeout_sec`` per
    build, ``max_uses`` builds before a worker is recycled, ``artifact_dir``
    (default: a fresh temp dir), ``before_build`` an optional callable run at
    the start of every batch (the session uses it to wait for a measuring
    runner that shares the same cores).
    """

    def __init__(
        self,
        *,
        max_workers: int | None = None,
        timeout_sec: float = 60.0,
        max_uses: int = 256,
        artifact_dir: str | None = None,
        before_build: Callable[[], None] | None = None,
        cpu_ids: list[int] | None = None,
    ) -> None:
        super().__init__()
        self.max_workers = int(max_workers or len(available_cpus()))
        self.timeout_sec = float(timeout_sec)
        self.artifact_dir = artifact_dir or tempfile.mkdtemp(prefix="ms_artifacts_")
        os.makedirs(self.artifact_dir, exist_ok=True)
        hand_over(self.artifact_dir)  # the only folder outside their own that the build workers write
        self.before_build = before_build
        env = {"TVM_NUM_THREADS": "1", "TVM_BIND_THREADS": "0", **_cuda_env()}
        cpus = list(cpu_ids) if cpu_ids else available_cpus()  # explicit: never inherit a pinned mask
        specs = [WorkerSpec(name=f"build{i}", cpu_ids=cpus, threads=None, env=env) for i in range(self.max_workers)]
        self.pool = ProcessPool(specs, initializer=warmup, max_uses=max_uses)
        self.build_secs: dict[str, float] = {}
        self.batches = 0
        self.n_built = 0
        self._lock = threading.Lock()

    def build(self, build_inputs: list[BuilderInput]) -> list[BuilderResult]:
        if self.before_build is not None:
            self.before_build()
        self.batches += 1
        jobs: list[concurrent.futures.Future | None] = []  # None: refused before submitting
        for inp in build_inputs:
            if inp.params is not None and len(inp.params):
                jobs.append(None)  # params are not supported by MetaSchedule's default build either
                continue
            jobs.append(
                self.pool.submit(
                    build_in_worker,
                    tvm_save_json(inp.mod),
                    _target_json(inp.target),
                    self.artifact_dir,
                    timeout=self.timeout_sec,
                )
            )
        results: list[BuilderResult] = []
        for fut in jobs:
            if fut is None:
                results.append(BuilderResult(None, "PersistentBuilder: params are not supported"))
                continue
            try:
                path, secs = fut.result()
                with self._lock:
                    self.build_secs[path] = secs
                    self.n_built += 1
                results.append(BuilderResult(path, None))
            except WorkerTimeout:
                results.append(
                    BuilderResult(None, f"PersistentBuilder: Timeout, killed after {self.timeout_sec} seconds")
                )
            except WorkerError as exc:
                results.append(BuilderResult(None, "PersistentBuilder: An exception occurred\n" + str(exc)[-4000:]))
        return results

    def build_many(self, mods: list, target) -> list[str | None]:
        """Build several modules at once on the pool; None where a build failed."""
        futs = [
            self.pool.submit(
                build_in_worker,
                tvm_save_json(m),
                _target_json(target),
                self.artifact_dir,
                timeout=self.timeout_sec,
            )
            for m in mods
        ]
        out: list[str | None] = []
        for f in futs:
            try:
                path, secs = f.result()
                self.build_secs[path] = secs
                out.append(path)
            except (WorkerError, WorkerTimeout):
                out.append(None)
        return out

    def worker_pids(self) -> list[int | None]:
        return self.pool.pids()

    def shutdown(self, remove_artifacts: bool = True) -> None:
        self.pool.shutdown()
        if remove_artifacts:
            remove_dir(self.artifact_dir)


def tvm_save_json(mod) -> str:
    return tvm.ir.save_json(mod)
