"""Per-process GPU utilization and memory of model families, inference and a training step (NVML).

Driven by ``bench/gpu_profile.sh``. On a host with an NVIDIA GPU, for each of the model families below
(CNNs, transformers, recurrent nets: the project's zoo plus small ones built here with onnx.helper) at
several batch sizes, runs in a fresh child process (``CUDA_VISIBLE_DEVICES=0``, what a job's child gets):

* ``inference``: ``scheduling.gpu_runtime.run_model_on_gpu`` (runtime auto: onnxruntime's CUDA provider
  where installed, else TVM's cuda target with DLight's default schedules, untuned);
* ``train``: the same call with ``kind="train"``: a TVM Relax training step (forward, backward, Adam) of
  the model on a fixed synthetic batch (``scheduling.train_step``), where TVM can differentiate it.

Each run reports the child's OWN utilization and memory (``nvmlDeviceGetProcessUtilization`` and the
process's memory, sampled by ``scheduling.telemetry.GpuSampler``), the device's, and the step latency.
The whole run keeps to a time budget (default 13 minutes): what does not fit is listed as skipped. The
JSON (``--json``) says ``"source": "measured"`` and names the device; a family TVM cannot train is listed
with the reason. Without a GPU it prints ``no GPU here (...)`` and exits 0; ``--dry-run`` then builds and
checks every family's ONNX at every batch size and writes the plan (nothing measured).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# bench/common.py would shadow the project's `common` package (the script's folder comes first on the path)
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

INFER_BATCHES = (1, 8, 32)
TRAIN_BATCHES = (8, 32)
ITERATIONS = 30
RUN_TIMEOUT_S = 150


# ------------------------------------------------------------------ families built here (onnx.helper)
def _model(nodes, inputs, outputs, inits, name):
    import onnx
    from onnx import helper

    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


class _B:
    """Seeded weights and unique names for the small builders."""

    def __init__(self, seed=0):
        import numpy as np

        self.np, self.rng, self.inits, self.nodes, self.n = np, np.random.default_rng(seed), [], [], 0

    def w(self, *shape, scale=None):
        from onnx import numpy_helper

        self.n += 1
        fan_in = shape[0] if len(shape) > 1 else 1
        arr = (self.rng.standard_normal(shape) * (scale or fan_in ** -0.5)).astype("float32")
        name = f"w{self.n}"
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def const(self, values, dtype="int64"):
        from onnx import numpy_helper

        self.n += 1
        name = f"c{self.n}"
        self.inits.append(numpy_helper.from_array(self.np.array(values, dtype=dtype), name))
        return name

    def op(self, kind, inputs, **attrs):
        from onnx import helper

        self.n += 1
        out = f"t{self.n}"
        self.nodes.append(helper.make_node(kind, inputs, [out], **attrs))
        return out

    def dense(self, x, d_in, d_out, act=None):
        y = self.op("Add", [self.op("MatMul", [x, self.w(d_in, d_out)]), self.w(d_out, scale=0.01)])
        return self.op(act, [y]) if act else y

    def layer_norm(self, x, d):
        """LayerNorm from ops Relax can differentiate (ReduceMean, Sub, Mul, Sqrt, Div)."""
        mean = self.op("ReduceMean", [x], axes=[-1], keepdims=1)
        xc = self.op("Sub", [x, mean])
        var = self.op("ReduceMean", [self.op("Mul", [xc, xc])], axes=[-1], keepdims=1)
        eps = self.w(1, scale=1e-9)
        std = self.op("Sqrt", [self.op("Add", [var, self.op("Abs", [eps])])])
        return self.op("Mul", [self.op("Div", [xc, std]), self.w(d, scale=1.0)])


def mlp(batch_size=1, seed=0):
    from onnx import TensorProto, helper

    b = _B(seed)
    h = b.dense("x", 784, 1024, "Relu")
    h = b.dense(h, 1024, 1024, "Relu")
    y = b.dense(h, 1024, 10)
    return _model(b.nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch_size, 784])],
                  [helper.make_tensor_value_info(y, TensorProto.FLOAT, [batch_size, 10])], b.inits, "mlp")


def tiny_transformer(batch_size=1, seed=0, seq=64, d=256, heads=4, layers=2):
    """Pre-norm encoder blocks: self-attention (MatMul, Softmax) and a ReLU feed-forward."""
    from onnx import TensorProto, helper

    b = _B(seed)
    dh = d // heads
    x = "x"
    for _ in range(layers):
        h = b.layer_norm(x, d)
        q, k, v = (b.op("Transpose", [b.op("Reshape", [b.op("MatMul", [h, b.w(d, d)]),
                                                        b.const([batch_size, seq, heads, dh])])], perm=[0, 2, 1, 3])
                   for _ in range(3))
        kt = b.op("Transpose", [k], perm=[0, 1, 3, 2])
        att = b.op("Softmax", [b.op("Mul", [b.op("MatMul", [q, kt]), b.const([dh ** -0.5], "float32")])], axis=-1)
        ctx = b.op("Reshape", [b.op("Transpose", [b.op("MatMul", [att, v])], perm=[0, 2, 1, 3]),
                               b.const([batch_size, seq, d])])
        x = b.op("Add", [x, b.op("MatMul", [ctx, b.w(d, d)])])
        x = b.op("Add", [x, b.dense(b.dense(b.layer_norm(x, d), d, 4 * d, "Relu"), 4 * d, d)])
    y = b.op("ReduceMean", [x], axes=[1], keepdims=0)
    return _model(b.nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch_size, seq, d])],
                  [helper.make_tensor_value_info(y, TensorProto.FLOAT, [batch_size, d])], b.inits,
                  "tiny_transformer")


def _recurrent(batch_size, seed, cell, steps=16, d_in=64, hidden=256):
    """An unrolled recurrent net over ``steps`` time steps (Split, MatMul, Tanh/Sigmoid), last state out."""
    from onnx import TensorProto, helper

    b = _B(seed)
    xs = [f"x_t{t}" for t in range(steps)]
    from onnx import helper as h

    b.nodes.append(h.make_node("Split", ["x", b.const([1] * steps)], xs, axis=1))
    flat = [b.op("Reshape", [x_t, b.const([batch_size, d_in])]) for x_t in xs]
    wx = {g: b.w(d_in, hidden) for g in ("z", "r", "n")}
    wh = {g: b.w(hidden, hidden) for g in ("z", "r", "n")}
    state = b.op("Tanh", [b.op("MatMul", [flat[0], wx["n"]])])
    for x_t in flat[1:]:
        if cell == "elman":
            state = b.op("Tanh", [b.op("Add", [b.op("MatMul", [x_t, wx["n"]]), b.op("MatMul", [state, wh["n"]])])])
            continue
        z = b.op("Sigmoid", [b.op("Add", [b.op("MatMul", [x_t, wx["z"]]), b.op("MatMul", [state, wh["z"]])])])
        r = b.op("Sigmoid", [b.op("Add", [b.op("MatMul", [x_t, wx["r"]]), b.op("MatMul", [state, wh["r"]])])])
        n = b.op("Tanh", [b.op("Add", [b.op("MatMul", [x_t, wx["n"]]),
                                      b.op("MatMul", [b.op("Mul", [r, state]), wh["n"]])])])
        state = b.op("Add", [n, b.op("Mul", [z, b.op("Sub", [state, n])])])  # (1 - z) n + z h
    y = b.dense(state, hidden, 10)
    return _model(b.nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch_size, steps, d_in])],
                  [helper.make_tensor_value_info(y, TensorProto.FLOAT, [batch_size, 10])], b.inits, f"{cell}_rnn")


def elman_rnn(batch_size=1, seed=0):
    return _recurrent(batch_size, seed, "elman")


def gru(batch_size=1, seed=0):
    return _recurrent(batch_size, seed, "gru")


def _zoo(name):
    def build(batch_size=1, seed=0):
        from core.onnx_models.zoo import build_model

        return build_model(name, batch_size=batch_size, seed=seed)

    return build


#: family -> (kind of network, builder(batch_size) -> ONNX)
FAMILIES = {
    "small_cnn": ("cnn", _zoo("small_cnn")),
    "vgg11": ("cnn", _zoo("vgg11")),
    "resnet18": ("cnn", _zoo("resnet18")),
    "mobilenet_v2": ("cnn", _zoo("mobilenet_v2")),
    "bert_encoder": ("transformer", _zoo("bert_encoder")),
    "tiny_transformer": ("transformer", tiny_transformer),
    "lstm_lm": ("recurrent", _zoo("lstm_lm")),
    "elman_rnn": ("recurrent", elman_rnn),
    "gru": ("recurrent", gru),
    "mlp": ("mlp", mlp),
}


def plan() -> list[dict]:
    """Every run in the order it is measured: all families at the smallest batch first (so a short budget
    still covers every family), inference before training."""
    runs = []
    for rank in range(max(len(INFER_BATCHES), len(TRAIN_BATCHES))):
        for family, (kind_of_net, _) in FAMILIES.items():
            if rank < len(INFER_BATCHES):
                runs.append({"family": family, "net": kind_of_net, "kind": "inference", "batch_size": INFER_BATCHES[rank]})
            if rank < len(TRAIN_BATCHES):
                runs.append({"family": family, "net": kind_of_net, "kind": "train", "batch_size": TRAIN_BATCHES[rank]})
    return runs


# ------------------------------------------------------------------ GPU side
def gpu_or_reason() -> tuple[bool, str, dict]:
    from common.nvml import load_nvml
    from scheduling.telemetry import read_gpus

    nvml, why = load_nvml()
    if nvml is None:
        return False, f"pynvml: {why}", {}
    reading = read_gpus(nvml)
    if not reading.available or not reading.gpus:
        return False, reading.summary, {}
    g = reading.gpus[0]
    return True, reading.summary, {"name": g.name, "gpu_model": g.gpu_model, "memory_total_mb": g.memory_total_mb}


def cuda_runtimes() -> dict[str, bool]:
    """Which runtimes can use a GPU in this environment: TVM built with CUDA (inference and training),
    onnxruntime with its CUDA provider (inference only)."""
    import tvm

    try:
        import onnxruntime as ort

        ort_cuda = "CUDAExecutionProvider" in ort.get_available_providers()
    except ImportError:
        ort_cuda = False
    return {"tvm": bool(tvm.runtime.enabled("cuda")), "onnxruntime": ort_cuda}


def child(spec: dict) -> dict:
    """One run, in this (child) process: CUDA device 0 is the GPU; NVML index 0 samples it."""
    from scheduling import gpu_runtime

    model = FAMILIES[spec["family"]][1](batch_size=spec["batch_size"])
    out = gpu_runtime.run_model_on_gpu(model.SerializeToString(), batch_size=spec["batch_size"],
                                       iterations=spec["iterations"], device_index=0, nvml_index=0,
                                       runtime="auto", kind=spec["kind"], max_seconds=RUN_TIMEOUT_S - 10)
    keep = ("runtime", "provider", "latency_ms", "throughput_per_s", "proc_util_mean_pct", "proc_mem_peak_mb",
            "util_mean_pct", "mem_used_by_job_mb", "power_mean_w", "loss_first", "loss_last", "runtime_errors")
    return {k: out.get(k) for k in keep}


def run_one(spec: dict, iterations: int) -> dict:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get("PROFILE_GPU", "0"), "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
           "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", json.dumps({**spec, "iterations": iterations})],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {**spec, "error": f"timed out after {RUN_TIMEOUT_S} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {**spec, "error": tail[0][:400], "wall_s": round(time.monotonic() - started, 1)}
    return {**spec, **json.loads(lines[-1]), "wall_s": round(time.monotonic() - started, 1)}


def dry_run() -> dict:
    """Build and check every family's ONNX at every batch size it is planned at (no GPU needed)."""
    import onnx

    built = {}
    for run in plan():
        key = (run["family"], run["batch_size"])
        if key not in built:
            model = FAMILIES[run["family"]][1](batch_size=run["batch_size"])
            onnx.checker.check_model(model)
            built[key] = len(model.graph.node)
    return {"runs": plan(), "families": {f: net for f, (net, _) in FAMILIES.items()},
            "models_built": len(built)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the profile JSON here")
    ap.add_argument("--budget-s", type=float, default=780.0, help="stop starting runs after this (default 13 min)")
    ap.add_argument("--iterations", type=int, default=ITERATIONS)
    ap.add_argument("--dry-run", action="store_true", help="with no GPU: build every model, write the plan")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    ok, summary, device = gpu_or_reason()
    if not ok:
        print(f"no GPU here ({summary}): nothing measured")
        if args.dry_run:
            report = {"source": "none", "measured": False, "device": None, "why": f"no GPU here ({summary})",
                      **dry_run()}
            print(f"dry run: {len(report['runs'])} runs planned over {len(report['families'])} families "
                  f"({report['models_built']} ONNX models built and checked)")
            if args.json:
                Path(args.json).write_text(json.dumps(report, indent=1))
        return 0
    runtimes = cuda_runtimes()
    if not any(runtimes.values()):
        print(f"GPU present ({device['name']}) but no runtime here can use it: this TVM is built without CUDA "
              "and onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu or a CUDA build of TVM)")
        return 2
    print(f"profiling on {device['name']} ({summary}); budget {args.budget_s:.0f} s; CUDA runtimes: "
          f"{', '.join(k for k, v in runtimes.items() if v)}")
    started, results, skipped = time.monotonic(), [], []
    print(f"{'family':18} {'kind':9} {'batch':>5} {'runtime':>8} {'proc util %':>11} {'proc MB':>9} "
          f"{'dev util %':>10} {'ms/step':>9}  note")
    for spec in plan():
        if time.monotonic() - started > args.budget_s:
            skipped.append({**spec, "why": "time budget"})
            continue
        if spec["kind"] == "train" and not runtimes["tvm"]:
            skipped.append({**spec, "why": "a training step needs TVM built with CUDA"})
            continue
        r = run_one(spec, args.iterations)
        results.append(r)

        def f(key, fmt, r=r):
            return format(r[key], fmt) if r.get(key) is not None else "-"

        note = r.get("error", "")
        if r.get("loss_first") is not None:
            note = f"loss {r['loss_first']:.3g} -> {r['loss_last']:.3g}"
        print(f"{spec['family']:18} {spec['kind']:9} {spec['batch_size']:>5} {r.get('runtime') or '-'!s:>8} "
              f"{f('proc_util_mean_pct', '.1f'):>11} {f('proc_mem_peak_mb', '.0f'):>9} {f('util_mean_pct', '.1f'):>10} "
              f"{f('latency_ms', '.2f'):>9}  {note[:80]}", flush=True)
    ok_runs = [r for r in results if "error" not in r]
    families = sorted({r["family"] for r in ok_runs})
    report = {"source": "measured", "measured": True, "device": device, "nvml": summary, "cuda_runtimes": runtimes,
              "iterations": args.iterations, "wall_s": round(time.monotonic() - started, 1),
              "families_measured": families, "profiles": results, "skipped": skipped,
              "note": "per-process figures of one job alone on the GPU; training steps on a fixed synthetic batch"}
    print(f"{len(ok_runs)} of {len(results)} runs measured ({len(families)} families; "
          f"{sum(r['kind'] == 'train' for r in ok_runs)} training steps), {len(skipped)} skipped")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
