"""onnxruntime as the yardstick: the latency a user gets without tuning anything.

Django-free. :func:`measure_onnxruntime` runs the same ONNX model under
onnxruntime on the same device and thread count as the TVM module it is compared
with, on the same inputs (``relax_pipeline.random_inputs`` with the same seed),
and checks its outputs against the TVM module's.

Timer discipline (stated in every result):

- session: ``intra_op_num_threads = threads``, ``inter_op_num_threads = 1``,
  sequential execution, graph optimizations ``ORT_ENABLE_ALL`` (onnxruntime's
  default, what a user deploys);
- ``warmup`` untimed runs; then ``number`` runs per repeat, ``number`` chosen
  from the warm-up so one repeat lasts at least ``min_repeat_ms`` (as TVM's
  ``time_evaluator`` does); ``repeat`` repeats, each giving the mean of its runs;
  the result is the median over repeats with its inter-quartile range;
- wall clock ``time.perf_counter`` around ``run`` (CPU). On CUDA, inputs and
  outputs are bound on the device (I/O binding) so copies are not timed;
  ``run_with_iobinding`` returns after the device work completes.

Outputs agree when every output satisfies
``|tvm - ort| <= atol * max(1, max|ort|) + rtol * |ort|`` (defaults 1e-4, 1e-4;
float32 models, kernels that sum in different orders).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "ProviderUnavailable",
    "YardstickResult",
    "cuda_provider_available",
    "measure_onnxruntime",
    "compare_outputs",
    "faster_engine",
    "DEFAULT_RTOL",
    "DEFAULT_ATOL",
]

DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-4
_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


class ProviderUnavailable(RuntimeError):
    """The onnxruntime installed here cannot run on the requested device."""


@dataclasses.dataclass
class YardstickResult:
    latency_median_ms: float
    latency_iqr_ms: float
    provider: str
    threads: int
    repeats: int
    runs_per_repeat: int
    warmup: int
    outputs_agree: bool | None  # None: no TVM outputs given to compare with
    max_abs_err: float | None
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL
    onnxruntime_version: str = ""
    timer: str = "median over repeats of the mean of runs_per_repeat runs (perf_counter), after warm-up"
    samples_ms: list = dataclasses.field(default_factory=list)  # one per repeat: the verdict's spread
    outputs: list = dataclasses.field(default_factory=list, repr=False, compare=False)

    def to_dict(self) -> dict:
        """JSON-ready fields (the output arrays left out)."""
        d = dataclasses.asdict(self)
        d.pop("outputs", None)
        return d

    def ratio(self, tvm_latency_ms: float | None) -> float | None:
        """TVM latency / onnxruntime latency (< 1: TVM is faster)."""
        if tvm_latency_ms is None or not self.latency_median_ms:
            return None
        return float(tvm_latency_ms) / self.latency_median_ms


def cuda_provider_available() -> bool:
    import onnxruntime as ort

    return _PROVIDERS["cuda"] in ort.get_available_providers()


def _provider_for(device: str) -> str:
    import onnxruntime as ort

    if device not in _PROVIDERS:
        raise ValueError(f"device must be one of {sorted(_PROVIDERS)}, got {device!r}")
    provider = _PROVIDERS[device]
    available = ort.get_available_providers()
    if provider not in available:
        raise ProviderUnavailable(
            f"the onnxruntime {ort.__version__} installed here has no {provider} (it has "
            f"{', '.join(available)}): no onnxruntime comparison on {device}. Install "
            "onnxruntime-gpu (matching the CUDA driver) on the GPU worker to get one."
        )
    return provider


def _session(model_bytes: bytes, provider: str, threads: int, device_index: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = int(threads)
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    providers: list[Any] = [provider]
    if provider == _PROVIDERS["cuda"]:
        providers = [(provider, {"device_id": int(device_index)})]
    return ort.InferenceSession(model_bytes, sess_options=opts, providers=providers)


def _runner(sess, inputs: dict[str, np.ndarray], device: str, device_index: int):
    """A no-argument callable running one inference, and a function that fetches its outputs."""
    if device == "cpu":
        last: list = []

        def run_cpu():
            last[:] = sess.run(None, inputs)

        return run_cpu, lambda: list(last)
    import onnxruntime as ort

    binding = sess.io_binding()
    for name, value in inputs.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, "cuda", device_index))
    for out in sess.get_outputs():
        binding.bind_output(out.name, "cuda", device_index)
    return (lambda: sess.run_with_iobinding(binding)), (lambda: binding.copy_outputs_to_cpu())


def _time_runs(run, warmup: int, repeat: int, min_repeat_ms: float) -> tuple[list[float], int]:
    """Per-repeat mean seconds per run, and the runs per repeat."""
    t0 = time.perf_counter()
    for _ in range(max(1, warmup)):
        run()
    per_run = (time.perf_counter() - t0) / max(1, warmup)
    number = max(1, int(np.ceil((min_repeat_ms / 1e3) / per_run))) if per_run > 0 else 1
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            run()
        samples.append((time.perf_counter() - start) / number)
    return samples, number


def _model_bytes(model) -> bytes:
    if isinstance(model, bytes | bytearray):
        return bytes(model)
    if isinstance(model, str):
        with open(model, "rb") as fh:
            return fh.read()
    return model.SerializeToString()


def _iqr(values: Sequence[float]) -> float:
    q25, q75 = np.percentile(np.asarray(values, dtype="float64"), [25, 75])
    return float(q75 - q25)


def measure_onnxruntime(
    model,
    inputs: Mapping[str, np.ndarray] | None = None,
    *,
    threads: int,
    device: str = "cpu",
    device_index: int = 0,
    warmup: int = 10,
    repeat: int = 15,
    min_repeat_ms: float = 50.0,
    tvm_outputs: Sequence[np.ndarray] | None = None,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    seed: int = 0,
) -> YardstickResult:
    """Time ``model`` (ModelProto, bytes or path) under onnxruntime; compare with
    ``tvm_outputs`` when given. ``inputs`` default: ``random_inputs(model, seed)``,
    the inputs the TVM side uses. Raises :class:`ProviderUnavailable` for
    ``device="cuda"`` when this onnxruntime has no CUDA provider."""
    import onnxruntime as ort

    provider = _provider_for(device)
    data = _model_bytes(model)
    if inputs is None:
        import onnx

        from tuning.engine.compile.pipeline import random_inputs

        inputs = random_inputs(onnx.load_from_string(data), seed=seed)
    feed = {k: np.ascontiguousarray(v) for k, v in inputs.items()}
    sess = _session(data, provider, threads, device_index)
    run, fetch = _runner(sess, feed, device, device_index)
    samples, number = _time_runs(run, warmup, repeat, min_repeat_ms)
    outputs = [np.asarray(o.numpy() if hasattr(o, "numpy") else o) for o in fetch()]
    agree, err = (None, None)
    if tvm_outputs is not None:
        agree, err = compare_outputs(tvm_outputs, outputs, rtol=rtol, atol=atol)
    return YardstickResult(
        latency_median_ms=float(statistics.median(samples)) * 1e3,
        latency_iqr_ms=_iqr(samples) * 1e3,
        provider=provider,
        threads=int(threads),
        repeats=int(repeat),
        runs_per_repeat=number,
        warmup=int(warmup),
        outputs_agree=agree,
        max_abs_err=err,
        rtol=rtol,
        atol=atol,
        onnxruntime_version=ort.__version__,
        samples_ms=[s * 1e3 for s in samples],
        outputs=outputs,
    )


def compare_outputs(
    actual: Sequence[np.ndarray],
    reference: Sequence[np.ndarray],
    *,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
) -> tuple[bool, float]:
    """(all outputs agree, largest absolute difference). The absolute tolerance is
    scaled by the reference's magnitude (``atol * max(1, max|ref|)``)."""
    actual, reference = list(actual), list(reference)
    if len(actual) != len(reference):
        return False, float("inf")
    agree, worst = True, 0.0
    for a, r in zip(actual, reference):
        a = np.asarray(a, dtype="float64")
        r = np.asarray(r, dtype="float64")
        if a.shape != r.shape:
            return False, float("inf")
        if not r.size:
            continue
        worst = max(worst, float(np.max(np.abs(a - r))))
        scale = max(1.0, float(np.max(np.abs(r))))
        agree = agree and bool(np.allclose(a, r, rtol=rtol, atol=atol * scale))
    return agree, worst


def faster_engine(tvm_latency_ms: float | None, onnxruntime_latency_ms: float | None) -> str | None:
    """ "tvm" or "onnxruntime", whichever median is lower (ties go to onnxruntime: nothing to deploy); None
    when either is unknown. A run's verdict also weighs the spread and the host's load:
    :func:`tuning.engine.verdict.verdict`."""
    if tvm_latency_ms is None or onnxruntime_latency_ms is None:
        return None
    return "tvm" if tvm_latency_ms < onnxruntime_latency_ms else "onnxruntime"
