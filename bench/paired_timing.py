"""Time kept tuning work directories' compiled models and onnxruntime in interleaved rounds (paired timing).

On a shared or drifting host a model timed a few minutes apart from another can read 50 % slower
(``bench/vs_onnxruntime.py`` rows on a noisy VM: onnxruntime 11.3 ms at a job's start, 18.8 ms at its
end). Here every side is compiled first, then each round takes one sample of every side back to back
(order rotated per round), so drift hits all sides alike; the per-round ratio to onnxruntime is the
paired figure, its median the verdict. Both engines run in this one process, as in the bench rows.

    .venv/bin/python bench/paired_timing.py WORK_DIR [WORK_DIR ...] [--rounds 30] [--json PATH]

Each work directory is one ``bench/vs_onnxruntime.py --keep`` job (``bench_job.json`` names the model,
target, passes and threads); directories of the same model are compared with one onnxruntime session.

``--vm-exec-modes bytecode,compiled`` builds each directory once per Relax VM execution mode (the product
builds ``bytecode``, Relax's default; ``compiled`` turns the VM's instruction stream into native code) and
pairs them all: the ablation of the VM's own time, the same kernels on both sides. Each mode after the first
also gets its per-round ratio to the first mode's build of the same directory (``vs_<first mode>_paired``),
which does not go through onnxruntime's spread.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine_info, write_json  # noqa: E402

REFERENCE = "onnxruntime"
EXEC_MODES = ("bytecode", "compiled")  # tvm.relax.build's exec_mode values


def job_threads(job: dict) -> int | None:
    """The threads a kept job was tuned and timed with."""
    return job.get("threads") or job["target"].get("num-cores")


def tvm_sampler(executable, inputs, target, threads: int | None) -> Callable[[], float]:
    """One sample (seconds) of a compiled model per call: ``time_evaluator``, one call per repeat, at least
    50 ms of runs; warmed up once here."""
    from tuning.engine.compile.pipeline import run_and_time_samples

    run_and_time_samples(executable, inputs, target, number=1, repeat=1, threads=threads)  # warm-up

    def sample() -> float:
        _, secs = run_and_time_samples(executable, inputs, target, number=1, repeat=1, threads=threads,
                                       min_repeat_ms=50)
        return secs[0]

    return sample


def ort_sampler(model, inputs, threads: int) -> Callable[[], float]:
    """One sample (seconds) of onnxruntime per call: the yardstick's own session and timer (what every bench
    row's onnxruntime figure uses), at least 50 ms of runs; warmed up here."""
    from tuning.engine.yardstick import _model_bytes, _provider_for, _runner, _session, _time_runs

    sess = _session(_model_bytes(model), _provider_for("cpu"), threads, 0)
    run, _ = _runner(sess, inputs, "cpu", 0)
    _time_runs(run, 10, 1, 50.0)  # warm-up

    def sample() -> float:
        samples, _ = _time_runs(run, 0, 1, 50.0)
        return samples[0]

    return sample


def interleave(sides: dict[str, Callable[[], float]], rounds: int, settle_s: float = 0.0) -> dict[str, list[float]]:
    """``rounds`` rounds of one sample of every side, back to back, the order rotated each round."""
    names = list(sides)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[: r % len(names)]:
            if settle_s:
                time.sleep(settle_s)
            samples[n].append(sides[n]())
    return samples


def summarize(samples: dict[str, list[float]], reference: str = REFERENCE) -> dict[str, dict]:
    """Per side: median and IQR (ms) and the median over rounds of its sample / the reference's."""
    from tuning.engine.yardstick import _iqr

    ref = samples[reference]
    return {n: {"median_ms": statistics.median(s) * 1e3, "iqr_ms": _iqr(s) * 1e3,
                "vs_onnxruntime_paired": statistics.median(a / b for a, b in zip(s, ref, strict=True))}
            for n, s in samples.items()}


@contextlib.contextmanager
def vm_exec_mode(mode: str | None):
    """``compile_model``'s ``relax.build`` with ``exec_mode=mode`` (None: as the product builds). An ablation
    lives here, not as a mode of the product's compile."""
    if mode is None:
        yield
        return
    from tvm import relax

    build = relax.build
    relax.build = functools.partial(build, exec_mode=mode)
    try:
        yield
    finally:
        relax.build = build


def against_first_mode(samples: dict[str, list[float]], dirs: Sequence[str], exec_modes: Sequence[str]
                       ) -> dict[str, float]:
    """Side ``DIR[mode]`` -> the median over rounds of its sample / ``DIR[first mode]``'s, for every mode after
    the first."""
    return {f"{d}[{mode}]": statistics.median(a / b for a, b in zip(samples[f"{d}[{mode}]"],
                                                                      samples[f"{d}[{exec_modes[0]}]"], strict=True))
            for d in dirs for mode in exec_modes[1:]}


def _tvm_side(snap: str, job: dict, model, inputs, exec_mode: str | None = None) -> Callable[[], float]:
    """Sampler of one work directory's tuned build, compiled from ``snap``, a snapshot of its records."""
    from tuning.engine.compile.passes import use_passes
    from tuning.engine.compile.pipeline import compile_model, onnx_to_relax
    from tuning.engine.workdir import open_database

    with use_passes(job.get("passes")), vm_exec_mode(exec_mode):
        exe = compile_model(onnx_to_relax(model), job["target"], database=open_database(snap))
    return tvm_sampler(exe, inputs, job["target"], job_threads(job))


def pair(jobs: dict[str, dict], rounds: int, settle_s: float = 0.0, exec_modes: Sequence[str] = ()) -> dict:
    """``jobs``: work directory -> its ``bench_job.json`` (``tuned_tasks.load_job``); ``exec_modes``: build
    each directory once per Relax VM execution mode (side ``DIR[mode]``), or once as the product does."""
    from bench.tuned_tasks import _model, snapshot
    from tuning.engine.compile.pipeline import random_inputs

    models: dict[str, list[str]] = {}
    for w, job in jobs.items():
        models.setdefault(job["model"], []).append(w)
    out = {}
    with tempfile.TemporaryDirectory(prefix="paired_") as tmp:
        for model_name, dirs in models.items():
            model = _model(model_name)
            inputs = random_inputs(model, seed=0)
            threads = job_threads(jobs[dirs[0]])
            sides = {REFERENCE: ort_sampler(model, inputs, threads)}
            for w in dirs:
                # one snapshot for every mode: a job still tuning must not give the modes different records
                snap = snapshot(w, os.path.join(tmp, Path(w).name))
                for mode in exec_modes or (None,):
                    name = Path(w).name + (f"[{mode}]" if mode else "")
                    sides[name] = _tvm_side(snap, jobs[w], model, inputs, mode)
            samples = interleave(sides, rounds, settle_s)
            summary = summarize(samples)
            for side, ratio in against_first_mode(samples, [Path(w).name for w in dirs], exec_modes).items():
                summary[side][f"vs_{exec_modes[0]}_paired"] = ratio
            out[model_name] = {
                "threads": threads, "rounds": rounds, "vm_exec_modes": list(exec_modes) or None,
                "sides": summary, "jobs": {Path(w).name: jobs[w] for w in dirs},
            }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work_dirs", nargs="+")
    ap.add_argument("--rounds", type=int, default=30, help="interleaved rounds (one sample of every side each)")
    ap.add_argument("--settle-ms", type=float, default=0.0,
                    help="idle time before each sample (default none: on the 2-core VM a 200 ms pause made "
                         "every side 10-50 %% slower and noisier, each sample starting from an idle CPU)")
    ap.add_argument("--vm-exec-modes", default="",
                    help="comma-separated Relax VM execution modes to build each directory with "
                         f"({', '.join(EXEC_MODES)}); default: once, as the product builds")
    ap.add_argument("--json", default=None, help="write the result JSON here")
    args = ap.parse_args(argv)
    if args.rounds < 4:
        ap.error("--rounds must be at least 4 (a median and an IQR)")
    exec_modes = list(dict.fromkeys(m.strip() for m in args.vm_exec_modes.split(",") if m.strip()))
    unknown = sorted(set(exec_modes) - set(EXEC_MODES))
    if unknown:
        ap.error(f"--vm-exec-modes: unknown {', '.join(unknown)} (known: {', '.join(EXEC_MODES)})")
    missing = [w for w in args.work_dirs if not Path(w).is_dir()]
    if missing:
        ap.error(f"not a directory: {', '.join(missing)}")
    from bench.tuned_tasks import load_job

    try:
        jobs = {w: load_job(w) for w in args.work_dirs}
    except (ValueError, OSError) as exc:
        ap.error(str(exc))
    threads = {job_threads(job) for job in jobs.values()} - {None}
    if len(threads) == 1:  # before TVM's thread pool starts: it can shrink later, not grow
        os.environ["TVM_NUM_THREADS"] = str(threads.pop())
    import logging

    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    result = pair(jobs, args.rounds, args.settle_ms / 1e3, exec_modes)
    for model_name, res in result.items():
        print(f"\n{model_name} ({res['rounds']} interleaved rounds, {res['threads']} threads)")
        print(f"  {'side':32s} {'median ms':>10s} {'IQR ms':>8s} {'/ ORT paired':>13s}")
        for n, s in res["sides"].items():
            also = "".join(f"  {k[:-len('_paired')]} paired {v:.3f}" for k, v in s.items()
                           if k.endswith("_paired") and k != "vs_onnxruntime_paired")
            print(f"  {n:32s} {s['median_ms']:10.3f} {s['iqr_ms']:8.3f} {s['vs_onnxruntime_paired']:13.3f}{also}")
    overall = {f"{m}:{n}": s["vs_onnxruntime_paired"] for m, r in result.items() for n, s in r["sides"].items()
               if n != REFERENCE}
    write_json({"machine": machine_info(), "models": result, "overall": overall}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
