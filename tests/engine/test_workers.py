"""Persistent builder, measuring workers, pooled and distributed runners."""

import base64
import concurrent.futures
import os

import pytest

from tuning.engine.measuring.measure import (
    MeasureOutcome,
    make_payload,
    measure_artifact,
    measure_path,
    measure_payload,
    queue_name,
)
from tuning.engine.runners.distributed import device_index_from_queue
from tuning.engine.measuring.timer import EvaluatorConfig, default_evaluator

FAST = EvaluatorConfig(number=2, repeat=2, min_repeat_ms=5)


# ----------------------------------------------------------------- pure parts
def test_queue_names():
    assert queue_name("node-a", "cpu") == "measure.node-a.cpu"
    assert queue_name("node-a", "cuda", 3) == "measure.node-a.gpu3"
    assert queue_name("gpu.box.lan", "cuda", 0) == "measure.gpu-box-lan.gpu0"
    assert device_index_from_queue("measure.node-a.gpu3") == 3
    assert device_index_from_queue("measure.node-a.cpu") == 0


def test_evaluator_config_roundtrip():
    cfg = EvaluatorConfig(number=5, repeat=3, min_repeat_ms=20, enable_cpu_cache_flush=True)
    assert EvaluatorConfig.from_any(cfg.to_dict()) == cfg
    from tuning.engine.runners.plugins import tvm_evaluator_config

    tvm_cfg = tvm_evaluator_config(cfg)
    assert EvaluatorConfig.from_any(tvm_cfg) == cfg
    assert default_evaluator("cpu") == EvaluatorConfig()
    assert default_evaluator("cuda").repeat >= 3


def test_payload_is_json_and_complete():
    import json

    p = make_payload(
        b"\x7fELFabc",
        device_type="cuda",
        args_info_json=[["TENSOR", "float32", [4, 4]]],
        evaluator=FAST,
        threads=None,
        device_index=1,
        queue="measure.h.gpu1",
    )
    json.dumps(p)
    assert base64.b64decode(p["artifact_b64"]) == b"\x7fELFabc"
    assert p["device_type"] == "cuda" and p["device_index"] == 1 and p["queue"] == "measure.h.gpu1"
    assert p["evaluator"] == FAST.to_dict() and p["args_info"] == [["TENSOR", "float32", [4, 4]]]


def test_missing_gpu_error_is_clear(matmul_artifacts):
    paths, args = matmul_artifacts
    out = measure_path(paths[0], device_type="cuda", args_info_json=args, evaluator=FAST)
    assert out.run_secs == [] and "DeviceUnavailable" in out.error and "gpu" in out.error


# ----------------------------------------------------------------- builder
def test_persistent_builder_reuses_workers(builder, cpu_target):
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tuning.engine.compile.pipeline import make_target
    from tuning.engine.testing import matmul_primfunc

    mod = tvm.IRModule({"main": matmul_primfunc(32)})
    inputs = [ms.builder.BuilderInput(mod, make_target(cpu_target)) for _ in range(4)]
    builder.build(inputs)
    pids = builder.worker_pids()
    for _ in range(2):
        res = builder.build(inputs)
        assert builder.worker_pids() == pids  # same processes across batches
        for r in res:
            assert r.error_msg is None and str(r.artifact_path).endswith(".so")
    assert all(w.starts == 1 for w in builder.pool.workers)


def test_builder_recycles_after_max_uses(cpu_target):
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tuning.engine.runners.builder import PersistentBuilder
    from tuning.engine.compile.pipeline import make_target
    from tuning.engine.testing import matmul_primfunc

    b = PersistentBuilder(max_workers=1, max_uses=2)
    try:
        mod = tvm.IRModule({"main": matmul_primfunc(16)})
        inp = [ms.builder.BuilderInput(mod, make_target(cpu_target))]
        b.build(inp)
        pid = b.worker_pids()[0]
        b.build(inp)
        assert b.worker_pids()[0] == pid
        b.build(inp)  # third build: recycled
        assert b.worker_pids()[0] != pid
    finally:
        b.shutdown()


def test_builder_reports_errors(builder, cpu_target):
    import tvm
    from tvm import te
    from tvm.s_tir import meta_schedule as ms

    from tuning.engine.compile.pipeline import make_target

    # a cuda-only construct for a CPU target: thread binding fails to build on llvm
    a = te.placeholder((64,), name="A")
    b = te.compute((64,), lambda i: a[i] + 1, name="B")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b]))
    (i,) = sch.get_loops(sch.get_sblock("B"))
    sch.bind(i, "threadIdx.x")
    res = builder.build([ms.builder.BuilderInput(sch.mod, make_target(cpu_target))])
    assert res[0].artifact_path is None and "exception" in res[0].error_msg.lower()


# ----------------------------------------------------------------- measuring
def test_measure_artifact_from_bytes(matmul_artifacts):
    paths, args = matmul_artifacts
    with open(paths[0], "rb") as fh:
        data = fh.read()
    out = measure_artifact(data, device_type="cpu", args_info_json=args, evaluator=FAST, threads=1, cpu_ids=None)
    assert out.error is None and len(out.run_secs) == 2 and all(0 < s < 0.1 for s in out.run_secs)
    payload = make_payload(data, device_type="cpu", args_info_json=args, evaluator=FAST, threads=1)
    d = measure_payload(payload)
    assert d["error"] is None and len(d["run_secs"]) == 2
    assert MeasureOutcome.from_any(d).run_secs == d["run_secs"]


def test_pooled_runner_measures_on_slots(matmul_artifacts, n_cores):
    from tvm.s_tir.meta_schedule.arg_info import TensorInfo
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    from tuning.engine.runners.pooled import PooledAsyncRunner

    paths, args = matmul_artifacts
    infos = [TensorInfo(a[1], a[2]) for a in args]
    # deployment at 1 thread: one slot per core, DOP up to the core count
    runner = PooledAsyncRunner(evaluator=FAST, threads=1, dop=max(2, n_cores), timeout_sec=30)
    try:
        futs = runner.run([RunnerInput(p, "cpu", infos) for p in paths])
        results = [f.result() for f in futs]
        assert all(r.error_msg is None and len(r.run_secs) == 2 for r in results)
        rep = runner.ledger.rounds[0]
        assert rep.n_candidates == 4
        dop = rep.dop
        layout = runner.worker_layout(dop)
        assert sum(t for _, t in layout) <= n_cores
        pool_workers = runner._pools[dop].workers
        for w, (cpus, t) in zip(pool_workers, layout):
            assert w.spec.threads == t and list(w.spec.cpu_ids) == cpus
        if n_cores >= 2:
            # parallel config != serial config -> a sample was re-measured serially
            assert rep.n_remeasured >= 1
            metas = [runner.ledger.pop(p) for p in paths]
            assert {m.dop for m in metas} == {dop}
            assert any(m.remeasured_serially for m in metas)
            assert runner.rule.history and runner.rule.history[0].n_sampled >= 1
        # worker processes keep their affinity, and measure on TVM's runtime library alone (no compiler)
        for w in pool_workers:
            assert set(os.sched_getaffinity(w.pid)) == set(w.spec.cpu_ids)
            with open(f"/proc/{w.pid}/maps") as fh:
                libs = {os.path.basename(line.split()[-1]) for line in fh if ".so" in line}
            assert "libtvm_runtime.so" in libs and "libtvm_compiler.so" not in libs, sorted(libs)
        assert runner.wait_idle(timeout=5)
    finally:
        runner.shutdown()


def test_distributed_runner_sends_payloads(matmul_artifacts):
    from tvm.s_tir.meta_schedule.arg_info import TensorInfo
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    from tuning.engine.doppler.doppler_rule import DopplerRule
    from tuning.engine.runners.distributed import DistributedRunner

    paths, args = matmul_artifacts
    infos = [TensorInfo(a[1], a[2]) for a in args]
    sent = []
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)

    def submit(payload):
        sent.append(payload)
        return pool.submit(measure_payload, payload)

    queues = [queue_name("hostA", "cpu"), queue_name("hostB", "cpu")]
    # DOPpler's serial start: the first round measures each host's serial reference (DOP 1)
    runner = DistributedRunner(submit, queues, evaluator=FAST, threads=1, dop_rule=DopplerRule)
    futs = runner.run([RunnerInput(p, "cpu", infos) for p in paths])
    results = [f.result() for f in futs]
    pool.shutdown()
    assert all(r.error_msg is None for r in results)
    described = [p for p in sent if p.get("kind") == "describe"]
    measured = [p for p in sent if p.get("kind") != "describe"]
    assert sorted(p["queue"] for p in described) == sorted(queues)  # each host asked for its slots
    assert sorted(p["queue"] for p in measured[:4]) == sorted(queues * 2)  # dealt by the hosts' DOPs
    assert all(p["threads"] == 1 and p["evaluator"] == FAST.to_dict() for p in measured)
    meta = runner.ledger.pop(paths[0])
    assert meta is not None and meta.dop == 1 and meta.worker
    runner.shutdown()


def test_distributed_runner_surfaces_remote_errors(matmul_artifacts):
    from tvm.s_tir.meta_schedule.arg_info import TensorInfo
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    from tuning.engine.runners.distributed import DistributedRunner

    paths, args = matmul_artifacts
    infos = [TensorInfo(a[1], a[2]) for a in args]

    def submit(payload):
        f = concurrent.futures.Future()
        f.set_exception(RuntimeError("broker down"))
        return f

    runner = DistributedRunner(submit, "measure.x.gpu0")
    (res,) = [f.result() for f in runner.run([RunnerInput(paths[0], "cuda", infos)])]
    assert res.run_secs is None and "broker down" in res.error_msg


def test_measure_needs_only_the_runtime(matmul_artifacts):
    """A measuring worker can run with TVM_USE_RUNTIME_LIB=1 (no compiler library)."""
    import json
    import subprocess
    import sys

    paths, args = matmul_artifacts
    code = (
        "import json, sys\n"
        "from tuning.engine.measuring.measure import measure_path\n"
        f"o = measure_path({paths[1]!r}, device_type='cpu', args_info_json={json.dumps(args)}, "
        "evaluator={'number': 2, 'repeat': 1, 'min_repeat_ms': 5}, threads=1)\n"
        "print(json.dumps({'err': o.error, 'n': len(o.run_secs), "
        "'compiler': any(k.startswith('tvm.s_tir') or k.startswith('tvm.relax') for k in sys.modules)}))\n"
    )
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1", PYTHONPATH=os.getcwd())
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res == {"err": None, "n": 1, "compiler": False}


def _lock_is_free(path) -> bool:
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_candidates_are_timed_inside_the_devices_timing_window(matmul_artifacts, tmp_path, monkeypatch):
    """With a slot group's timing lock set, measure_path holds it while timing, and only then:
    another worker of the group can load and prepare meanwhile, but not time."""
    from tuning.engine.measuring import measure

    paths, args = matmul_artifacts
    lock = tmp_path / "gpu0.lock"
    monkeypatch.setenv("DLOPT_TIMING_LOCK", str(lock))
    seen = []
    real_time_module = measure.time_module

    def spy(*a, **kw):
        seen.append(_lock_is_free(lock))
        return real_time_module(*a, **kw)

    monkeypatch.setattr(measure, "time_module", spy)
    out = measure_path(paths[0], device_type="cpu", args_info_json=args, evaluator=FAST, threads=1)
    assert out.error is None and len(out.run_secs) == FAST.repeat
    assert seen == [False]  # held while timing
    assert _lock_is_free(lock)  # and released after

    monkeypatch.delenv("DLOPT_TIMING_LOCK")
    seen.clear()
    measure_path(paths[0], device_type="cpu", args_info_json=args, evaluator=FAST, threads=1)
    assert seen == [True]  # no slot-group lock: nothing held


def test_runtime_only_worker_loads_the_cuda_runtime():
    """A runtime-only import (TVM_USE_RUNTIME_LIB=1) loads no device backend, so a
    GPU worker would find no CUDA device API at all: check_device loads TVM's CUDA
    sidecar itself. With CUDA present the device API is then registered; without,
    the error names the sidecar and the library the loader missed."""
    import json
    import subprocess
    import sys

    code = (
        "import json, tvm_ffi\n"
        "from tuning.engine.measuring.timer import DeviceUnavailable, check_device\n"
        "err = None\n"
        "try:\n"
        "    check_device('cuda')\n"
        "except DeviceUnavailable as exc:\n"
        "    err = str(exc)\n"
        "print(json.dumps({'err': err, 'api': bool(tvm_ffi.get_global_func('device_api.cuda', allow_missing=True))}))\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1", PYTHONPATH=root)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if res["api"]:
        return  # a CUDA host: the sidecar registered the device API
    assert "libtvm_runtime_cuda.so" in res["err"] and ".so" in res["err"].split("cannot be loaded", 1)[1]


def test_probe_first_validates_a_new_dop(matmul_artifacts, n_cores):
    """A DOP not validated yet is tried on a probe (measured in parallel, then
    serially) before the rest of the round is spent at it."""
    if n_cores < 2:
        pytest.skip("needs 2 cores")
    from tvm.s_tir.meta_schedule.arg_info import TensorInfo
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    from tuning.engine.doppler.doppler_rule import DopplerRule
    from tuning.engine.runners.pooled import PooledAsyncRunner

    paths, args = matmul_artifacts
    infos = [TensorInfo(a[1], a[2]) for a in args]
    runner = PooledAsyncRunner(evaluator=FAST, threads=1,
                               dop_rule=lambda max_dop: DopplerRule(max_dop, initial_dop=2))
    ctrl = runner.rule
    try:
        jobs = [RunnerInput(paths[i % len(paths)], "cpu", infos) for i in range(12)]
        results = [f.result() for f in runner.run(jobs)]
        assert all(r.error_msg is None for r in results)
        (h,) = ctrl.history
        n_probe = max(4, 3)  # max(2 x DOP, ceil(0.2 x 12))
        assert h.dop == 2 and h.n_sampled == n_probe
        rep = runner.ledger.rounds[0]
        assert rep.n_remeasured >= n_probe
        if h.dop_after == 1:  # backed off: the rest was measured serially, once
            assert rep.n_remeasured == n_probe
    finally:
        runner.shutdown()
