"""Run a tuned model from its dlopt deployment package (this file is the package's run.py).

    pip install apache-tvm numpy
    python run.py                          # random inputs
    python run.py --input x=x.npy --runs 100 --save-outputs out.npz

It prints two latencies: TVM's ``time_evaluator`` over the repeats the manifest records (15 of at least 50 ms
of runs each when the run was timed so; the timer behind the manifest's figure, so the two compare), and the
time of each call from Python (what an application sees, the Python call and a cold start of each call
included; a different measurement, not to be compared one to one with the manifest's).

Needs only the standard library, numpy and the TVM runtime. Before loading the module it checks that this
host can run code built for the package's target (CPU instruction sets from /proc/cpuinfo, architecture,
CUDA architecture); on a host that cannot it says what is missing and exits with status 3.
Exit status: 0 ran, 2 bad arguments or inputs, 3 this host does not match the target.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

EXIT_USAGE, EXIT_HOST_MISMATCH = 2, 3
# the final timing's (tuning.engine.compare), for a manifest that does not record how its figure was timed
DEFAULT_REPEATS, DEFAULT_MIN_REPEAT_MS = 15, 50
MAX_REPEATS, MAX_MIN_REPEAT_MS = 1000, 10_000
HERE = Path(__file__).resolve().parent


def host_cpu_flags(path: str = "/proc/cpuinfo") -> set[str] | None:
    """This host's CPU flags (x86 ``flags``, Arm ``Features``); None where /proc/cpuinfo is unreadable."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        return None
    return set()


def _arch_family(name: str) -> str:
    name = (name or "").lower()
    if name in ("x86_64", "amd64", "x64"):
        return "x86_64"
    if name in ("aarch64", "arm64"):
        return "aarch64"
    return name


def host_refusal(target: dict) -> str | None:
    """Why this host cannot run code built for ``target`` (the manifest's section), or None when it can."""
    triple = target.get("mtriple") or ""
    if triple:
        built, here = _arch_family(triple.split("-")[0]), _arch_family(platform.machine())
        if built != here:
            return f"the module was built for {built} ({triple}); this host is {here}."
    required = set(target.get("required_cpu_flags") or [])
    if required:
        flags = host_cpu_flags()
        if flags is None:
            return "cannot read /proc/cpuinfo to check the CPU features the module needs: " + ", ".join(
                sorted(required)
            )
        missing = sorted(required - flags)
        if missing:
            return (
                f"the module was built for the CPU {target.get('mcpu')!r} and uses instruction-set features "
                f"this CPU lacks: {', '.join(missing)}. Run it on a CPU with them, or tune the model again "
                "on this host."
            )
    return None


def cuda_refusal(tvm, target: dict) -> str | None:
    dev = tvm.cuda(0)
    if not dev.exist:
        return "the module was built for a CUDA GPU and this host has none visible to TVM."
    arch = target.get("cuda_arch")
    here = "sm_" + str(dev.compute_version).replace(".", "")
    if arch and arch != here:
        return f"the module was built for the GPU architecture {arch}; GPU 0 here is {here}."
    return None


def _random_input(spec: dict, rng):
    import numpy as np

    dtype = np.dtype(spec["dtype"])
    shape = tuple(spec["shape"])
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    return rng.integers(0, 2, shape).astype(dtype)  # ids, indices: small values are valid for any vocabulary


def load_inputs(manifest: dict, given: list[str], seed: int) -> list:
    """The module's arguments in order: ``--input name=file.npy`` where given, random elsewhere."""
    import numpy as np

    specs = {s["name"]: s for s in manifest["inputs"]}
    files: dict[str, str] = {}
    for item in given:
        name, sep, path = item.partition("=")
        if not sep or name not in specs:
            raise SystemExit(_usage(f"--input {item!r}: expected NAME=FILE.npy with NAME one of {', '.join(specs)}"))
        files[name] = path
    rng = np.random.default_rng(seed)
    arrays = []
    for name, spec in specs.items():
        if name not in files:
            arrays.append(_random_input(spec, rng))
            continue
        try:
            array = np.load(files[name], allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise SystemExit(_usage(f"--input {name}: cannot read {files[name]}: {exc}")) from None
        if list(array.shape) != list(spec["shape"]) or array.dtype != np.dtype(spec["dtype"]):
            raise SystemExit(
                _usage(
                    f"--input {name}: expected shape {spec['shape']} {spec['dtype']}, got "
                    f"{list(array.shape)} {array.dtype}"
                )
            )
        arrays.append(np.ascontiguousarray(array))
    return arrays


def _usage(message: str) -> int:
    print(f"run.py: {message}", file=sys.stderr)
    return EXIT_USAGE


def _flatten(result) -> list:
    if hasattr(result, "numpy"):
        return [result.numpy()]
    if isinstance(result, (list, tuple)) or type(result).__name__ in ("Array", "ADT", "Tuple"):
        out = []
        for item in result:
            out.extend(_flatten(item))
        return out
    return [result]


def _spread(values: list[float]) -> str:
    """``median X ms (IQR Y ms)`` of seconds; one value has no spread."""
    median = statistics.median(values) * 1e3
    if len(values) < 2:
        return f"median {median:.4f} ms (IQR n/a: one sample)"
    q = statistics.quantiles(values, n=4, method="inclusive")
    return f"median {median:.4f} ms (IQR {(q[2] - q[0]) * 1e3:.4f} ms)"


def _is_finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def recorded_setting(latency: dict, key: str, lowest: int, highest: int) -> int | None:
    """The manifest's ``latency[key]`` when it is a whole number from ``lowest`` to ``highest``; None when
    absent, and None with a warning when it is anything else (the file may have been edited)."""
    value = latency.get(key)
    if value is None:
        return None
    if not _is_finite_number(value) or value != int(value) or not lowest <= value <= highest:
        print(
            f"run.py: warning: the manifest's latency.{key} is {value!r}, not a whole number from {lowest} to "
            f"{highest}; ignored.",
            file=sys.stderr,
        )
        return None
    return int(value)


def _seconds(value, lowest: float = 0.0) -> float | None:
    """A manifest's figure in seconds if it is a finite number above ``lowest`` (or equal to 0 where that is
    the lowest), else None."""
    ok = _is_finite_number(value)
    return float(value) if ok and (value > lowest or value == lowest == 0.0) else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the tuned model of this dlopt package.")
    parser.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=FILE.npy",
        help="an input as a .npy file (repeat per input); others are random",
    )
    parser.add_argument("--runs", type=int, default=50, help="calls timed one by one from Python (default 50)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="time_evaluator repeats (default: the manifest's, else 15), each at least the manifest's min_repeat_ms "
        "(else 50) of runs; 0 skips",
    )
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs first (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument("--save-outputs", metavar="FILE.npz", help="write the outputs there")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.warmup < 0 or (args.repeats is not None and not 0 <= args.repeats <= MAX_REPEATS):
        return _usage(f"--runs must be at least 1, --warmup at least 0 and --repeats from 0 to {MAX_REPEATS}")

    manifest = json.loads((HERE / "manifest.json").read_text(encoding="utf-8"))
    target = manifest["target"]
    refusal = host_refusal(target)
    if refusal:
        print(f"run.py: this host cannot run this package: {refusal}", file=sys.stderr)
        return EXIT_HOST_MISMATCH
    if not target.get("cpu_flags_recorded"):
        print(
            "run.py: warning: the package does not record the CPU features its module needs; not checked.",
            file=sys.stderr,
        )
    # the latencies in the manifest were measured with this many threads
    if target.get("num_cores") and "TVM_NUM_THREADS" not in os.environ:
        os.environ["TVM_NUM_THREADS"] = str(target["num_cores"])

    arrays = load_inputs(manifest, args.input, args.seed)
    import numpy as np
    import tvm
    from tvm import relax

    if target.get("kind") == "cuda":
        refusal = cuda_refusal(tvm, target)
        if refusal:
            print(f"run.py: this host cannot run this package: {refusal}", file=sys.stderr)
            return EXIT_HOST_MISMATCH
        dev = tvm.cuda(0)
    else:
        dev = tvm.cpu(0)
    built = manifest.get("versions", {}).get("apache-tvm")
    if built and getattr(tvm, "__version__", built) != built:
        print(f"run.py: warning: built with TVM {built}, this is TVM {tvm.__version__}.", file=sys.stderr)

    vm = relax.VirtualMachine(tvm.runtime.load_module(str(HERE / manifest["module"])), dev)
    tensors = [tvm.runtime.tensor(a, device=dev) for a in arrays]
    main_fn = vm[manifest.get("entry", "main")]
    for _ in range(args.warmup):
        main_fn(*tensors)
    dev.sync()
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        result = main_fn(*tensors)
        dev.sync()
        times.append(time.perf_counter() - start)
    outputs = _flatten(result)
    for spec, out in zip(manifest["outputs"], outputs):
        print(f"output {spec['name']}: shape {list(np.shape(out))} {np.asarray(out).dtype}")
    if args.save_outputs:
        named = {spec["name"]: np.asarray(out) for spec, out in zip(manifest["outputs"], outputs)}
        # numpy >= 2.1 types savez's keyword-only allow_pickle, which **named could hit; older numpy, which
        # run.py also serves, has no such parameter, so passing it explicitly is not an option
        np.savez(args.save_outputs, **named)  # type: ignore[arg-type]
    latency = manifest.get("latency") if isinstance(manifest.get("latency"), dict) else {}
    is_gpu = target.get("kind") == "cuda"
    threads = "" if is_gpu else f", threads: {os.environ.get('TVM_NUM_THREADS') or 'TVM default'}"
    recorded_repeats = recorded_setting(latency, "repeats", 1, MAX_REPEATS)
    recorded_min_ms = recorded_setting(latency, "min_repeat_ms", 0, MAX_MIN_REPEAT_MS)
    repeats = args.repeats if args.repeats is not None else (recorded_repeats or DEFAULT_REPEATS)
    if repeats:
        min_repeat_ms = DEFAULT_MIN_REPEAT_MS if recorded_min_ms is None else recorded_min_ms
        timer = vm.time_evaluator(
            manifest.get("entry", "main"), dev, number=1, repeat=repeats, min_repeat_ms=min_repeat_ms
        )
        how = (
            "the timer of the manifest's figure"
            if recorded_min_ms is not None
            else "the manifest does not record how its figure was timed"
        )
        print(
            f"latency: {_spread([float(x) for x in timer(*tensors).results])} over {repeats} repeats of at least "
            f"{min_repeat_ms} ms (TVM time_evaluator{threads}; {how})"
        )
    print(
        f"per call from Python: {_spread(times)} over {args.runs} runs (each call timed alone: what an application "
        "sees)"
    )
    measured = _seconds(latency.get("tuned_median_s"), lowest=1e-12)
    if measured:
        iqr = _seconds(latency.get("tuned_iqr_s"))
        spread = f" (IQR {iqr * 1e3:.4f} ms)" if iqr is not None else ""
        built_threads = latency.get("threads") or target.get("num_cores")
        with_threads = f", threads: {built_threads}" if built_threads and not is_gpu else ""
        print(
            f"measured when tuned: median {measured * 1e3:.4f} ms{spread} on the build host{with_threads}, "
            "TVM time_evaluator"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
