"""A deployment package: the tuned module, what it expects and where it runs, and a script to run it.

Django-free. :func:`build_package` writes a zip with fixed member names (nothing a user named becomes a
path inside it):

- ``module.so``: the compiled tuned Relax executable (``tvm.runtime.load_module`` + ``relax.VirtualMachine``);
- ``manifest.json``: input/output signature (from the ONNX model, with onnx only), the target with the
  instruction-set flags its code may use (so a host is checked without TVM's compiler), the TVM and
  runtime versions, the pipeline identity and the measured latencies;
- ``run.py`` (:mod:`tuning.engine.deploy.package_run`): standard library + numpy + the ``tvm`` runtime; checks
  the host, runs the module on given or random inputs and prints its latencies (the timer of the manifest's
  figure, and each call from Python).
"""

from __future__ import annotations

import io
import json
import platform
import zipfile
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

import numpy as np

__all__ = ["MANIFEST_FORMAT", "MEMBERS", "USAGE", "build_package", "io_signature", "runtime_versions"]

MANIFEST_FORMAT = "dlopt-package/1"
MODULE, MANIFEST, RUN_SCRIPT = "module.so", "manifest.json", "run.py"
MEMBERS = (MODULE, MANIFEST, RUN_SCRIPT)
USAGE = ("unzip {zip} -d {dir}", "pip install apache-tvm numpy", "python {dir}/run.py")
_RUN_SCRIPT_SOURCE = Path(__file__).with_name("package_run.py")


def _dtype(elem_type: int) -> str:
    import onnx

    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).name


def _dims(value_info) -> tuple[list[int | str | None], list[int]]:
    """(declared dims: ints, or the symbol's name / None when unknown; dims as compiled: unknown -> 1, as
    ``relax_pipeline.onnx_input_specs`` compiles them)."""
    declared: list[int | str | None] = []
    compiled: list[int] = []
    for dim in value_info.type.tensor_type.shape.dim:
        if dim.HasField("dim_value") and dim.dim_value > 0:
            declared.append(int(dim.dim_value))
            compiled.append(int(dim.dim_value))
        else:
            declared.append(dim.dim_param or None)
            compiled.append(1)
    return declared, compiled


def io_signature(model_bytes: bytes) -> dict:
    """Inputs (graph inputs that are not initializers, in the order the module's ``main`` takes them) and
    outputs: name, dtype, shape the module was compiled for, and the shape the ONNX model declares."""
    import onnx

    model = onnx.load_from_string(model_bytes)
    initializers = {init.name for init in model.graph.initializer}

    def describe(value_info) -> dict:
        declared, compiled = _dims(value_info)
        return {
            "name": value_info.name,
            "dtype": _dtype(value_info.type.tensor_type.elem_type),
            "shape": compiled,
            "onnx_shape": declared,
        }

    return {
        "inputs": [describe(v) for v in model.graph.input if v.name not in initializers],
        "outputs": [describe(v) for v in model.graph.output],
    }


def runtime_versions() -> dict:
    """Versions of what the package was built with (this process's installs)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("apache-tvm", "apache-tvm-ffi", "numpy", "onnx", "onnxruntime"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _target_section(target: Mapping, build_host: Mapping | None) -> dict:
    spec = dict(target or {})
    cpu = spec if spec.get("kind") == "llvm" else dict(spec.get("host") or {})
    recorded = bool(build_host and "required_cpu_flags" in build_host)
    return {
        "kind": spec.get("kind"),
        "mcpu": cpu.get("mcpu"),
        "mtriple": cpu.get("mtriple"),
        "cuda_arch": spec.get("arch") if spec.get("kind") == "cuda" else None,
        "num_cores": spec.get("num-cores") or cpu.get("num-cores"),
        "spec": spec,
        "cpu_flags_recorded": recorded,
        "required_cpu_flags": list((build_host or {}).get("required_cpu_flags") or []),
        "build_host_cpu_flags": list((build_host or {}).get("cpu_flags") or []),
    }


def build_package(
    *,
    module_bytes: bytes,
    model_bytes: bytes,
    target: Mapping,
    build_host: Mapping | None,
    identity: Mapping,
    latency: Mapping,
    run: Mapping,
    versions: Mapping | None = None,
) -> bytes:
    """The package's zip bytes. ``identity``: target_key, pipeline_key, result_identity; ``latency``: the
    run's measured numbers (JSON-ready); ``run``: id, model name and sha256 (data in the manifest only);
    ``build_host``: the build host's CPU flags and the required ones (``compare.build_host_facts``)."""
    manifest = {
        "format": MANIFEST_FORMAT,
        "module": MODULE,
        "entry": "main",
        "run": dict(run),
        **io_signature(model_bytes),
        "target": _target_section(target, build_host),
        "versions": {**runtime_versions(), **dict(versions or {})},
        "pipeline": dict(identity),
        "latency": dict(latency),
        "usage": list(USAGE),
    }
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(MODULE, module_bytes)
        zf.writestr(MANIFEST, json.dumps(manifest, indent=2, sort_keys=True, default=str))
        zf.writestr(RUN_SCRIPT, _RUN_SCRIPT_SOURCE.read_text(encoding="utf-8"))
    return buf.getvalue()
