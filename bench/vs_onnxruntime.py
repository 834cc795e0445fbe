#!/usr/bin/env python
"""Tuned TVM vs onnxruntime: is the tuned model worth deploying?

For each zoo model, two tuning jobs (each in a fresh interpreter, order
alternating between models), with the platform's engine
(``tuning.engine.session.run_tuning``, DOPpler mode, the bench's stated budget):

  mcpu     the canonical target, ``tuning.engine.compile.targets.resolve_cpu_target(threads)``
           (``mcpu`` = this host's CPU as LLVM names it, ``mtriple``, ``num-cores``)
  no-mcpu  ``{"kind": "llvm", "num-cores": threads}``, the target the platform uses today

Both jobs extract tasks, tune, and compile the untuned baseline and the tuned model
through the platform's one pipeline (``tuning.engine.compile.pipeline``) with the
graph passes ``--passes`` selects (``graph_passes.use_passes``; default
``graph_passes.DEFAULT``, the CPU default: ``fold_batchnorm,convert_layout,layout_rewrite``), so
the records match what is compiled.

Each job, in order: onnxruntime (CPU provider, intra-op threads = ``--threads``,
``tuning.engine.yardstick`` timer: warm-up, median of ``--repeat`` repeats), the
untuned TVM build, tuning (a sink follows the best-so-far end-to-end estimate,
sum over tasks of weight x best measured latency, and records the trials and
wall seconds at which it first reached onnxruntime's latency), then onnxruntime
again and the tuned build, one after the other (``ratio_blocks``). TVM is timed with ``time_evaluator``
(median of ``--repeat`` repeats, each at least 50 ms of runs, after one output
run and TVM's own warm-up call). Then the row's verdict, ``ratio``: ``--paired-rounds`` interleaved
rounds of one sample of each engine (``bench/paired_timing.py``'s samplers, order rotated per round),
the median of the per-round ratios, so a host that drifts between two blocks of timings moves both
engines alike (``paired`` holds both medians and IQRs; ``--paired-rounds 0``: ``ratio`` = ``ratio_blocks``).
Outputs of both TVM builds are checked against
onnxruntime's (|tvm - ort| <= 1e-4 * max(1, max|ort|) + 1e-4 * |ort|).
Last, once those timings are taken, ``bench/tuned_tasks.py`` reads the job's work directory: the row's
``tasks`` (per task: weight, trials, best measured latency, share of the estimate, the trial that found
it, ``still falling`` or ``flat`` over its last quarter of trials, the untuned kernel's latency) and
``profile`` (every VM call of the tuned build timed, matched to the tasks next to their estimate, with the
calls no task accounts for and the VM's own time as rows of their own: where the estimate and the
compiled latency part). Both are printed per job. The work directory keeps the job's model, target and
passes (``bench_job.json``), so with ``--keep`` ``bench/tuned_tasks.py WORK_DIR --profile`` reads it again.

    .venv/bin/python bench/vs_onnxruntime.py [--quick] [--models small_cnn,...] [--threads 2]
                                             [--trials N | --budget-minutes M] [--ablation]
                                             [--json bench/results/vs_onnxruntime.json]

``--budget-minutes M`` tunes every job for M minutes of wall time (the sink finishes
the search between rounds once they are spent and DOPpler's final serial re-measure
then runs, its time reported apart as ``final_remeasure_s``; the trial budget is
unbounded unless ``--trials`` is given too). ``--ablation`` tunes each model once per pass selection
(:data:`ABLATION`: the v1 pipeline (``fold_batchnorm``), + ``layout_rewrite``, + ``convert_layout``,
+ both: the CPU default), each its own job and row, so every layout pass is measured on its own.

``overall.tvm_vs_ort_latency_ratio`` is the geomean over models of tuned TVM
(mcpu target, the default pass selection where it ran, else the row run) /
onnxruntime; ``..._no_mcpu`` the same for the portable target; ``by_row`` the
geomean of every row; ``estimate_vs_compiled`` the largest relative gap between
a job's end-to-end estimate (sum over tasks of weight x best measured latency)
and its compiled tuned latency; ``calibrated_estimate_vs_compiled`` the same for the run page's estimate
(search-time bests, ``search_estimate_ms``: the basis the checkpoint was taken on) plus the difference the
run's compiled checkpoint measured (``tuning.engine.checkpoint``: the model compiled and timed once every
task had a record), over the jobs that took one: a research figure, the product does not show it.
On a shared machine every figure is noisy: the load average is in the JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import geomean, machine_info, run_child, tuning_config, write_result  # noqa: E402
from tuning.engine.events import NullSink  # noqa: E402 - data classes only, no TVM
from tuning.engine.measuring.timer import COLD_CPU_EVALUATOR, default_evaluator  # noqa: E402 - TVM imported lazily
from tuning.engine.verdict import checkpoint_note  # noqa: E402 - pure

SCRIPT = str(Path(__file__).resolve())

# zoo model -> (full budget in trials, trials per round); quick uses QUICK
BUDGETS = {
    "small_cnn": (640, 32),
    "mobilenet_v2": (2048, 32),
    "resnet18": (1536, 32),
    "bert_encoder": (768, 32),
}
QUICK = {"small_cnn": (160, 16)}
VARIANTS = ("mcpu", "no-mcpu")
# How candidates are timed while tuning (--evaluator). "auto": what the product does (``timer.choose_evaluator``:
# cold on every CPU). "warm": TVM's default (>= 100 ms of back-to-back calls per sample: operands stay in
# cache). "cold": MetaSchedule's cache-flush option as TVM documents it (flush every argument but the data input
# before each sample, one call per sample), so a kernel is timed as it runs inside the model, once, after the
# other layers evicted what it reads
AUTO = "auto"
EVALUATORS = {
    AUTO: AUTO,
    "warm": default_evaluator("cpu").to_dict(),
    "cold": COLD_CPU_EVALUATOR.to_dict(),
}
# --ablation: (row label, pass selection); the label says what is added to the v1 pipeline (fold_batchnorm,
# the default before the layout passes; "+both" is today's CPU default)
ABLATION = (
    ("v1", ("fold_batchnorm",)),
    ("+layout_rewrite", ("fold_batchnorm", "layout_rewrite")),
    ("+convert_layout", ("fold_batchnorm", "convert_layout")),
    ("+both", ("fold_batchnorm", "convert_layout", "layout_rewrite")),
)
UNBOUNDED_TRIALS = 1_000_000  # --budget-minutes without --trials: the wall-time budget stops tuning


# --------------------------------------------------------------------------- child
class ParitySink(NullSink):
    """Follows the best-so-far end-to-end estimate; remembers when it first reached ``goal_s``."""

    def __init__(self, goal_s: float | None, budget_s: float | None = None):
        self.goal_s = goal_s
        self.budget_s = budget_s
        self.t0 = time.perf_counter()
        self.weights: dict[int, float] = {}
        self.best: dict[int, float] = {}
        self.trials = 0
        self.parity: dict | None = None
        self.trajectory: list[tuple[int, float, float]] = []  # (trials, wall s, estimate s)
        self._lock = threading.Lock()

    def on_tasks(self, tasks):
        self.weights = {t.index: float(t.weight) for t in tasks}

    def on_measurements(self, records):
        with self._lock:
            for rec in records:
                self.trials += 1
                lat = rec.latency_s
                if lat is not None and lat < 1e9 and lat < self.best.get(rec.task_index, float("inf")):
                    self.best[rec.task_index] = lat
            self._update()

    def control(self):
        """Finish the search (between rounds) once the wall budget is spent: the run succeeds, so DOPpler's
        final serial re-measure still runs and the estimate comes from serial timings, not parallel rounds."""
        if self.budget_s is not None and time.perf_counter() - self.t0 >= self.budget_s:
            return "finish"
        return None

    def _update(self) -> None:
        if not self.weights or set(self.best) < set(self.weights):
            return  # a task without a valid measurement: no end-to-end estimate yet
        estimate = sum(w * self.best[i] for i, w in self.weights.items())
        wall = time.perf_counter() - self.t0
        self.trajectory.append((self.trials, round(wall, 2), estimate))
        if self.parity is None and self.goal_s is not None and estimate <= self.goal_s:
            self.parity = {"trials": self.trials, "wall_s": round(wall, 2), "estimate_ms": estimate * 1e3}


def _target(variant: str, threads: int) -> dict:
    from tuning.engine.compile.targets import resolve_cpu_target

    if variant == "mcpu":
        return resolve_cpu_target(num_cores=threads)
    return {"kind": "llvm", "num-cores": threads}


def _time_tvm(executable, inputs, target, spec) -> tuple[list, float]:
    from tuning.engine.compile.pipeline import run_and_time

    outs, secs = run_and_time(executable, inputs, target, number=1, repeat=spec["repeat"],
                              threads=spec["threads"], min_repeat_ms=50)
    return outs, secs * 1e3


def _yardstick(model, inputs, spec, tvm_outputs=None):
    from tuning.engine.yardstick import measure_onnxruntime

    return measure_onnxruntime(model, inputs, threads=spec["threads"], repeat=spec["repeat"], tvm_outputs=tvm_outputs)


def _job_variant(spec: dict) -> dict:
    from tuning.engine.compile.passes import use_passes

    with use_passes(spec["passes"]):  # extraction, tuning and both compilations: one pipeline
        return _tune_and_compare(spec)


def _tune_and_compare(spec: dict) -> dict:
    from bench.tuned_tasks import analyse_executables, write_job
    from core.onnx_models.zoo import build_model
    from tuning.engine.compile.passes import pipeline_key
    from tuning.engine.compile.pipeline import compile_model, onnx_to_relax, random_inputs
    from tuning.engine.workdir import open_database
    from tuning.engine.session import run_tuning
    from tuning.engine.compile.targets import canonical_key

    model = build_model(spec["model"])
    inputs = random_inputs(model, seed=0)
    target = _target(spec["variant"], spec["threads"])
    spec = dict(spec, evaluator=_evaluator(spec.get("evaluator")))
    write_job(spec["work_dir"], model=spec["model"], target=target, passes=spec["passes"], threads=spec["threads"],
              evaluator=spec["evaluator"])
    mod = onnx_to_relax(model)
    ort_before = _yardstick(model, inputs, spec)
    t0 = time.perf_counter()
    untuned = compile_model(mod, target)
    untuned_out, untuned_ms = _time_tvm(untuned, inputs, target, spec)
    untuned_wall = time.perf_counter() - t0
    budget_s = spec["budget_minutes"] * 60 if spec.get("budget_minutes") else None
    sink = ParitySink(ort_before.latency_median_ms / 1e3, budget_s)
    # the product's default: a compiled checkpoint when the run is long enough (tuning.engine.checkpoint)
    summary = run_tuning(mod, tuning_config(dict(spec, target=target), time_budget_s=budget_s,
                                            compiled_checkpoint=None), sink)
    tuned = compile_model(mod, target, database=open_database(spec["work_dir"]))
    tuned_out, tuned_ms = _time_tvm(tuned, inputs, target, spec)
    ort_after = _yardstick(model, inputs, spec, tvm_outputs=tuned_out)
    paired = _paired(tuned, model, inputs, target, spec)
    from tuning.engine.yardstick import compare_outputs

    untuned_agree, untuned_err = compare_outputs(untuned_out, ort_after.outputs)
    estimate_ms = (summary.best_latency_s or 0) * 1e3 or None
    # the product's estimate (the run page's): search-time bests, the basis the checkpoint's estimate_s has too;
    # estimate_ms above takes the final serial re-measure where there is one
    bests = [t.best_latency_s for t in summary.tasks]
    search_estimate_s = None if None in bests else sum(t.weight * b for t, b in zip(summary.tasks, bests))
    calibrated_ms = _calibrated_ms(search_estimate_s, summary.compiled_checkpoint)
    try:  # after the timings above, which stay side by side; a failure here must not lose the job
        analysis = analyse_executables(spec["work_dir"], mod, target, inputs, tuned=tuned, untuned=untuned,
                                       threads=spec["threads"], repeat=spec["repeat"], evaluator=spec["evaluator"])
    except Exception as exc:  # noqa: BLE001
        analysis = {"analysis_error": f"{type(exc).__name__}: {exc}"[:2000]}
    return {**analysis,
        "variant": spec["variant"], "row": spec["row"], "passes": list(spec["passes"]),
        "evaluator": spec.get("evaluator"),
        "target": target, "target_key": canonical_key(target), "pipeline_key": pipeline_key(),
        "n_tasks": len(summary.tasks), "tasks_without_records": [t.name for t in summary.tasks if not t.n_records],
        "late_first_rounds": list(summary.late_first_rounds),
        "ort_before": ort_before.to_dict(), "ort": ort_after.to_dict(),
        "untuned_ms": untuned_ms, "untuned_compile_and_time_s": untuned_wall, "tuned_ms": tuned_ms,
        "tuned_outputs_agree": ort_after.outputs_agree, "tuned_max_abs_err": ort_after.max_abs_err,
        "untuned_outputs_agree": untuned_agree, "untuned_max_abs_err": untuned_err,
        "tuning_wall_s": summary.wall_secs, "final_remeasure_s": summary.phase_secs.get("final_remeasure"),
        "trials": sink.trials, "estimate_ms": estimate_ms,
        "estimate_vs_compiled": abs(estimate_ms - tuned_ms) / tuned_ms if estimate_ms else None,
        # the product's compiled checkpoint (tuning.engine.checkpoint) and the estimate it calibrates
        "checkpoint": summary.compiled_checkpoint, "calibrated_estimate_ms": calibrated_ms,
        "search_estimate_ms": search_estimate_s * 1e3 if search_estimate_s else None,
        "calibrated_estimate_vs_compiled": abs(calibrated_ms - tuned_ms) / tuned_ms if calibrated_ms else None,
        "budget_minutes": spec.get("budget_minutes"), "status": summary.status, "stop_reason": summary.stop_reason,
        "parity": sink.parity, "trajectory": sink.trajectory[:: max(1, len(sink.trajectory) // 40)],
        "paired": paired, "ratio_blocks": tuned_ms / ort_after.latency_median_ms,
        "ratio": paired["ratio"] if paired else tuned_ms / ort_after.latency_median_ms,
    }


def _calibrated_ms(estimate_s: float | None, checkpoint: dict | None) -> float | None:
    """A research figure, not the product's: the estimate plus what the whole model added to it at the compiled
    checkpoint (compiled - estimate then), as if that overhead were fixed."""
    if not estimate_s or not checkpoint or not checkpoint.get("compiled_s"):
        return None
    return (estimate_s + checkpoint["compiled_s"] - checkpoint["estimate_s"]) * 1e3


def _evaluator(choice) -> dict:
    """The job's evaluator as a dict; "auto": the product's choice for a CPU target, with why."""
    if choice != AUTO:
        return dict(choice)
    from tuning.engine.measuring.timer import choose_evaluator

    return choose_evaluator("cpu").to_dict()


def _paired(tuned, model, inputs, target, spec) -> dict | None:
    """The tuned build and onnxruntime timed in interleaved rounds (``bench/paired_timing.py``): the row's
    verdict, since two blocks of timings a minute apart can differ by the host's drift alone."""
    rounds = spec.get("paired_rounds") or 0
    if rounds <= 0:
        return None
    from bench.paired_timing import REFERENCE, interleave, ort_sampler, summarize, tvm_sampler

    sides = {"tvm": tvm_sampler(tuned, inputs, target, spec["threads"]),
             REFERENCE: ort_sampler(model, inputs, spec["threads"])}
    summary = summarize(interleave(sides, rounds))
    return {"rounds": rounds, "tvm_median_ms": summary["tvm"]["median_ms"], "tvm_iqr_ms": summary["tvm"]["iqr_ms"],
            "ort_median_ms": summary[REFERENCE]["median_ms"], "ort_iqr_ms": summary[REFERENCE]["iqr_ms"],
            "ratio": summary["tvm"]["vs_onnxruntime_paired"]}


def child_main(spec: dict) -> None:
    os.environ["TVM_NUM_THREADS"] = str(spec["threads"])
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    Path(spec["out"]).write_text(json.dumps(_job_variant(spec), indent=1, default=str))


# --------------------------------------------------------------------------- driver
def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="small_cnn only, small budget and search (< 10 min on 2 cores)")
    ap.add_argument("--models", default=None, help=f"comma list (default: {','.join(BUDGETS)}; quick: {','.join(QUICK)})")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="mcpu,no-mcpu (default both)")
    ap.add_argument("--threads", type=int, default=None, help="deployment/measurement threads (default: all cores)")
    ap.add_argument("--trials", type=int, default=None, help="override every model's budget")
    ap.add_argument("--budget-minutes", type=float, default=None,
                    help="tune each job for this many minutes of wall time (stops between rounds)")
    ap.add_argument("--passes", default=None, help="graph passes, comma list or 'none' (default: graph_passes.DEFAULT)")
    ap.add_argument("--ablation", action="store_true",
                    help="one job per pass selection: v1, +layout_rewrite, +convert_layout, +both (the default)")
    ap.add_argument("--evaluator", choices=sorted(EVALUATORS), default=AUTO,
                    help="how tuning times candidates: auto (the product's choice: cold on CPUs), warm (TVM's "
                         "default) or cold (cache flushed per sample)")
    ap.add_argument("--repeat", type=int, default=10, help="timing repeats, both engines")
    ap.add_argument("--paired-rounds", type=int, default=30,
                    help="interleaved rounds timing the tuned build and onnxruntime side by side, whose median "
                         "per-round ratio is the row's ratio (0: the ratio of the two blocks of timings)")
    ap.add_argument("--population", type=int, default=None, help="evolutionary population (quick: 128, else 512)")
    ap.add_argument("--genetic-iters", type=int, default=None, help="genetic iterations (quick: 2, else 4)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default=None, help="write the result JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the work directories")
    args = ap.parse_args(argv)
    if args.budget_minutes is not None and args.budget_minutes <= 0:
        ap.error("--budget-minutes must be positive")
    if args.trials is not None and args.trials <= 0:
        ap.error("--trials must be positive")
    if args.paired_rounds < 0 or 0 < args.paired_rounds < 4:
        ap.error("--paired-rounds must be 0 or at least 4 (a median and an IQR)")
    if args.ablation and args.passes is not None:
        ap.error("--ablation runs its own pass selections; drop --passes")
    try:
        from tuning.engine.compile.passes import normalize_passes

        normalize_passes(args.passes)
    except ValueError as exc:
        ap.error(str(exc))
    unknown = sorted(set(v for v in args.variants.split(",") if v) - set(VARIANTS))
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    return args


def _specs(args, root: Path, threads: int) -> list[dict]:
    from tuning.engine.compile.passes import normalize_passes

    budgets = QUICK if args.quick else BUDGETS
    names = args.models.split(",") if args.models else list(budgets)
    variants = [v for v in args.variants.split(",") if v]
    selections = ABLATION if args.ablation else ((None, normalize_passes(args.passes)),)
    jobs = [(variant, row, passes) for variant in variants for row, passes in selections]
    specs = []
    for i, name in enumerate(names):
        trials, per_round = budgets.get(name) or BUDGETS.get(name) or (640, 32)
        if args.budget_minutes and not args.trials:
            trials = UNBOUNDED_TRIALS
        for variant, row, passes in (jobs if i % 2 == 0 else list(reversed(jobs))):
            row = f"{variant} {row}" if row else variant
            if args.evaluator != AUTO:
                row = f"{row} {args.evaluator}"
            label = f"{name}__{row.replace(' ', '_').replace('+', 'with_')}"
            specs.append({
                "label": label, "model": name, "variant": variant, "row": row, "threads": threads,
                "trials": args.trials or trials, "per_round": per_round, "seed": args.seed,
                "budget_minutes": args.budget_minutes, "evaluator": EVALUATORS[args.evaluator],
                "passes": list(normalize_passes(passes)), "repeat": args.repeat, "paired_rounds": args.paired_rounds,
                "population": args.population or (128 if args.quick else None),
                "genetic_iters": args.genetic_iters or (2 if args.quick else None),
                "work_dir": str(root / label), "out": str(root / f"{label}.json"),
            })
    return specs


def _fmt(v, digits=3) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def _rows(results: dict) -> list[dict]:
    """One row per model: every job's result under its row label (``mcpu``, ``mcpu +both``, ...)."""
    rows = []
    for name, by_row in results.items():
        row = {"model": name, "jobs": by_row}
        ok = [r for r in by_row.values() if "error" not in r]
        row["ort_ms"] = min((r["ort"]["latency_median_ms"] for r in ok), default=None)
        rows.append(row)
    return rows


def _print_table(rows: list[dict]) -> None:
    print()
    print(f"{'model':14s} {'row':24s} {'tasks':>5s} {'trials':>6s} {'ORT ms':>9s} {'untuned':>10s} {'tuned':>9s} "
          f"{'est ms':>9s} {'ratio':>6s} {'blocks':>6s} {'parity trials/wall':>19s} {'agree':>5s} {'tune s':>7s}")
    for row in rows:
        for label, r in row["jobs"].items():
            if "error" in r:
                print(f"{row['model']:14s} {label:24s} failed: {r['error'][:120]}")
                continue
            par = r.get("parity")
            par_s = f"{par['trials']} / {par['wall_s']:.0f} s" if par else "not reached"
            print(f"{row['model']:14s} {label:24s} {r['n_tasks']:5d} {r['trials']:6d} {_fmt(r['ort']['latency_median_ms']):>9s} "
                  f"{_fmt(r['untuned_ms']):>10s} {_fmt(r['tuned_ms']):>9s} {_fmt(r['estimate_ms']):>9s} "
                  f"{_fmt(r['ratio'], 2):>6s} {_fmt(r.get('ratio_blocks'), 2):>6s} {par_s:>19s} "
                  f"{str(bool(r['tuned_outputs_agree'] and r['untuned_outputs_agree'])):>5s} {r['tuning_wall_s']:7.0f}")


def _print_tasks(rows: list[dict]) -> None:
    """Per job: the task table (how far each task got, flat or still falling) and where the compiled
    model's time goes next to the estimate (bench/tuned_tasks.py)."""
    from bench.tuned_tasks import print_breakdown, print_task_table

    for row in rows:
        for label, r in row["jobs"].items():
            if "error" in r:
                continue
            print(f"\n## {row['model']} {label}: tuned {_fmt(r['tuned_ms'])} ms, estimate {_fmt(r['estimate_ms'])} ms "
                  f"(calibrated {_fmt(r.get('calibrated_estimate_ms'))}), onnxruntime {_fmt(r['ort']['latency_median_ms'])} ms")
            if r.get("checkpoint"):
                print(f"   compiled checkpoint: {checkpoint_note(r['checkpoint'])}")
            if r.get("tasks"):
                print_task_table(r["tasks"])
            if r.get("profile"):
                print()
                print_breakdown(r["profile"])
            if r.get("analysis_error"):
                print(f"no task table: {r['analysis_error'][:300]}")


def _headline(row: dict, variant: str) -> dict | None:
    """The job of ``variant`` that speaks for the model: the default pass selection where it ran, else the
    variant's only (or first) job."""
    from tuning.engine.compile.passes import DEFAULT

    jobs = [r for r in row["jobs"].values() if "error" not in r and r.get("variant") == variant]
    return next((r for r in jobs if tuple(r.get("passes", ())) == DEFAULT), jobs[0] if jobs else None)


def _overall(rows: list[dict]) -> dict:
    def ratios(variant):
        return [job["ratio"] for job in (_headline(row, variant) for row in rows) if job is not None]

    by_row: dict[str, list[float]] = {}
    gaps, calibrated_gaps = [], []
    for row in rows:
        for label, r in row["jobs"].items():
            if "error" in r:
                continue
            by_row.setdefault(label, []).append(r["ratio"])
            if r.get("estimate_vs_compiled") is not None:
                gaps.append(r["estimate_vs_compiled"])
            if r.get("calibrated_estimate_vs_compiled") is not None:
                calibrated_gaps.append(r["calibrated_estimate_vs_compiled"])
    return {
        "tvm_vs_ort_latency_ratio": geomean(ratios("mcpu")),
        "tvm_vs_ort_latency_ratio_no_mcpu": geomean(ratios("no-mcpu")),
        "by_row": {label: geomean(values) for label, values in by_row.items()},
        "estimate_vs_compiled": max(gaps) if gaps else None,
        # the same, for the estimate calibrated by a compiled checkpoint (jobs that took one)
        "calibrated_estimate_vs_compiled": max(calibrated_gaps) if calibrated_gaps else None,
        "models_at_or_below_parity": [row["model"] for row in rows
                                      if (job := _headline(row, "mcpu")) is not None and job["ratio"] <= 1.0],
    }


def main(argv=None) -> int:
    args = _parse(argv)
    if args.job:
        child_main(json.loads(args.job))
        return 0
    threads = args.threads or len(os.sched_getaffinity(0))
    root = Path(tempfile.mkdtemp(prefix="bench_vs_ort_"))
    started = time.perf_counter()
    machine = machine_info(threads=threads)
    specs = _specs(args, root, threads)
    print(f"# vs_onnxruntime: {len(specs)} jobs, threads={threads}, quick={args.quick}, ablation={args.ablation}, "
          f"budget_minutes={args.budget_minutes}, passes={specs[0]['passes'] if specs else []}")
    print(f"# machine: {machine['cpu']}, load average at start {machine.get('loadavg')}")
    results: dict[str, dict] = {}
    for spec in specs:
        t0 = time.perf_counter()
        try:
            res = run_child(SCRIPT, spec, timeout=4 * 3600)
        except Exception as exc:  # noqa: BLE001 - one failed model must not lose the others
            res = {"error": str(exc)[-2000:]}
        results.setdefault(spec["model"], {})[spec["row"]] = res
        print(f"  {spec['label']:28s} job {time.perf_counter() - t0:7.1f} s", flush=True)
    rows = _rows(results)
    _print_table(rows)
    _print_tasks(rows)
    overall = _overall(rows)
    print(f"\noverall tuned TVM / onnxruntime (geomean): mcpu {_fmt(overall['tvm_vs_ort_latency_ratio'], 2)}, "
          f"no-mcpu {_fmt(overall['tvm_vs_ort_latency_ratio_no_mcpu'], 2)}; estimate vs compiled, largest gap "
          f"{_fmt(overall['estimate_vs_compiled'], 2)}, calibrated by the compiled checkpoint "
          f"{_fmt(overall['calibrated_estimate_vs_compiled'], 2)}")
    for label, ratio in overall["by_row"].items():
        print(f"  {label:24s} geomean ratio {_fmt(ratio, 2)}")
    machine["loadavg_end"] = list(os.getloadavg())
    result = {
        "benchmark": "vs_onnxruntime", "overall": overall, "models": rows, "machine": machine,
        "settings": {"quick": args.quick, "threads": threads, "repeat": args.repeat, "ablation": args.ablation,
                 "budget_minutes": args.budget_minutes, "specs": specs},
        "bench_wall_s": time.perf_counter() - started,
    }
    write_result(result, json_path=args.json, work_root=root, keep=args.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
