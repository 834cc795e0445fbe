"""A compiled checkpoint: once every task has a record (the end of the first round robin), the model is
compiled from the records committed by then and timed, while the search waits.

Why: until the end of a run the only end-to-end number was the per-task estimate (weight x best kernel, each
kernel timed alone), and it runs below the compiled model, most while the search is young (resnet18 on a
2-core ``znver3`` VM: 47.6 ms estimated against 66.7 ms compiled at the first round's end). A checkpoint puts
a real compiled latency on the run while it tunes, beside the estimate of that moment. It is not used to
correct the estimate: carried to the end as a fixed overhead it narrowed the gap on some kept jobs and
widened it on others (resnet18 in that run: 18 % raw, 44 % so corrected; docs/research/tuning-vs-onnxruntime.md),
because the kernels change too much after the first round.

Cost: one compile and its timing, spent from the run's budget (resnet18 on a 2-core ``znver3`` VM: 33 s in
all, 22 s of it the compile; compiles of 12-22 s for resnet18 / mobilenet_v2 on ``znver5``); so it is taken
only while the search has enough ahead of it for the measurement to be worth reading before the final one
(:func:`worth_taking`). The compile runs in a sandboxed child, as the final compile does (the user's graph
goes through TVM's compiler there), from the records' bytes sent over its pipe: the run's database stays the
engine's. It is stopped when the run is asked to stop (cancel, pause, its time budget) or past
:data:`MAX_CHECKPOINT_S`. A checkpoint that fails is recorded with its error and the run goes on; the final
compile decides the run.

CPU targets measured on this host only: a GPU's measuring workers hold its timing lock, and a remote run's
kernels are timed on another machine.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from tuning.engine.config import LOCAL_RUNNERS
from tuning.engine.latency import is_failed_latency
from tuning.engine.workdir import DB_RECORDS, DB_WORKLOAD, load_checkpoint, save_checkpoint

__all__ = [
    "CHECKPOINT_MIN_REPEAT_MS",
    "CHECKPOINT_REPEATS",
    "MAX_CHECKPOINT_S",
    "MAX_DATABASE_BYTES",
    "MIN_SECONDS_LEFT",
    "MIN_SHARE_LEFT",
    "as_reported",
    "runs_end_to_end",
    "compile_and_time",
    "hook",
    "report_saved",
    "saved",
    "take",
    "worth_taking",
]

log = logging.getLogger(__name__)

# the checkpoint's timing: fewer repeats than the final one (15), each of at least 50 ms like it
CHECKPOINT_REPEATS = 10
CHECKPOINT_MIN_REPEAT_MS = 50
# taken only when at least this share of the search's budget, and this many seconds, are ahead of it:
# a checkpoint close to the end tells little more than the final compile that follows it
MIN_SHARE_LEFT = 0.25
MIN_SECONDS_LEFT = 120.0
# the longest a checkpoint may hold the search (the session lowers it to a quarter of a time budget's rest);
# past it the child is stopped and the checkpoint recorded as failed
MAX_CHECKPOINT_S = 300.0
# a run's record database larger than this is not sent to a checkpoint's child
MAX_DATABASE_BYTES = 512 * 1024 * 1024


def runs_end_to_end(model) -> bool:
    """An ONNX model, or a Relax module with a ``main`` function: what a VM runs end to end (a PrimFunc, or
    a module of PrimFuncs, is its own tuning task: its best record is already its latency)."""
    if hasattr(model, "graph"):
        return True
    try:
        from tvm import relax

        return isinstance(model["main"], relax.Function)
    except Exception:  # noqa: BLE001 - no "main", or not a module
        return False


def worth_taking(*, trials_done: int, budget: int, elapsed_s: float, deadline_left_s: float | None) -> bool:
    """Whether the search has enough ahead of it for a checkpoint to pay: ``trials_done`` of ``budget``
    trials measured in ``elapsed_s`` seconds of search; ``deadline_left_s``: what is left of the caller's
    time budget (None: none). The search ends at whichever comes first, its trials or its deadline; the
    seconds its trials have left are projected from the rate so far."""
    if budget <= 0 or trials_done <= 0 or elapsed_s <= 0:
        return False
    trials_left = max(0, budget - trials_done)
    share = trials_left / budget
    seconds = trials_left * elapsed_s / trials_done
    if deadline_left_s is not None:
        deadline_left_s = max(0.0, deadline_left_s)
        share = min(share, deadline_left_s / (elapsed_s + deadline_left_s))
        seconds = min(seconds, deadline_left_s)
    return share >= MIN_SHARE_LEFT and seconds >= MIN_SECONDS_LEFT


def compile_and_time(
    model, workload: bytes, records: bytes, target, threads: int | None, seed: int = 0
) -> dict[str, float]:
    """Compile ``model`` with the given database (the bytes of its two JSON files) and time it as the final
    timing does (repeats of at least :data:`CHECKPOINT_MIN_REPEAT_MS`; median and IQR as
    :func:`verdict.spread` takes them). Runs in the sandboxed child: the files live in its private folder
    only until TVM has read them, so a child killed mid-compile leaves no copy of the run's records."""
    from tuning.engine.compile.pipeline import compile_model, random_inputs, run_and_time_samples
    from tuning.engine.verdict import spread
    from tuning.engine.workdir import open_json_db

    t0 = time.perf_counter()
    folder = tempfile.mkdtemp(prefix="checkpoint-")
    try:
        for name, data in ((DB_WORKLOAD, workload), (DB_RECORDS, records)):
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)
        database = open_json_db(folder)  # TVM's JSONDatabase reads both files when it opens
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    executable = compile_model(model, target, database=database)
    t1 = time.perf_counter()
    _, samples = run_and_time_samples(
        executable,
        random_inputs(model, seed=seed),
        target,
        number=1,
        repeat=CHECKPOINT_REPEATS,
        threads=threads,
        min_repeat_ms=CHECKPOINT_MIN_REPEAT_MS,
    )
    median, q25, q75 = spread(samples)
    return {
        "compiled_s": median,
        "compiled_iqr_s": q75 - q25,
        "compile_s": t1 - t0,
        "timing_s": time.perf_counter() - t1,
    }


def take(
    model,
    *,
    work_dir: str,
    target,
    threads: int | None,
    estimate_s: float,
    trials: int,
    limit_s: float = MAX_CHECKPOINT_S,
    should_stop: Callable[[], str | None] | None = None,
) -> dict[str, Any]:
    """Compile and time ``model`` from the records ``work_dir``'s database holds now, in a sandboxed child;
    ``estimate_s``: the per-task estimate at this point, ``trials``: the run's records so far. The child is
    stopped after ``limit_s`` seconds, or as soon as ``should_stop()`` (polled each second: the caller's
    control) names a command. Saved in ``work_dir`` (a resumed run keeps it and takes no other) and
    returned; a failure is returned (and saved) with its ``error`` and no ``compiled_s``."""
    from tuning.engine.process.isolate import Abort, call_isolated
    from tuning.engine.process.sandbox import read_untrusted_file

    checkpoint: dict[str, Any] = {"at": "first round", "trials": int(trials), "estimate_s": float(estimate_s)}
    t0 = time.perf_counter()
    abort, done = Abort(), threading.Event()

    def watch() -> None:
        while not done.wait(1.0):
            command = should_stop() if should_stop is not None else None
            if command:
                abort.trigger(f"the run was asked to {command} during the checkpoint")
            elif time.perf_counter() - t0 > limit_s:
                abort.trigger(f"the checkpoint took more than {limit_s:.0f} s")
            if abort.is_set():
                return

    watcher = threading.Thread(target=watch, name="checkpoint-watch", daemon=True)
    try:
        # sandboxed children may write the work dir (the final compile): its files are read only if they are
        # regular files, not links, so no file the worker can read is handed to the sandbox instead
        files = [
            read_untrusted_file(os.path.join(work_dir, name), max_bytes=MAX_DATABASE_BYTES, magic=b"")
            for name in (DB_WORKLOAD, DB_RECORDS)
        ]
        if any(data is None for data in files):
            raise ValueError(f"the run's database is not two regular files of at most {MAX_DATABASE_BYTES} bytes")
        watcher.start()
        timed = call_isolated(
            compile_and_time,
            model,
            *files,
            target,
            threads,
            what="compiling and timing the model at its checkpoint",
            scrub=True,
            sandbox_user=True,
            abort=abort,
        )
        if not (isinstance(timed, dict) and math.isfinite(timed.get("compiled_s", math.nan))):
            raise ValueError(f"the checkpoint's child answered {timed!r}")
        checkpoint.update({k: float(timed[k]) for k in ("compiled_s", "compiled_iqr_s", "compile_s", "timing_s")})
    except Exception as exc:  # noqa: BLE001 - the final compile decides the run; this one only informs it
        log.warning("the compiled checkpoint failed: %s", exc)
        checkpoint["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    finally:
        done.set()
    checkpoint["wall_s"] = time.perf_counter() - t0
    save_checkpoint(work_dir, checkpoint)
    return checkpoint


_NUMBERS = ("estimate_s", "compiled_s", "compiled_iqr_s", "compile_s", "timing_s", "wall_s")


def as_reported(value: Any) -> dict[str, Any] | None:
    """A checkpoint as the platform stores it (it comes from the engine's child): only the fields
    :func:`take` writes, numbers finite and not negative, the error text cut to 2,000 characters; None when
    ``value`` is no checkpoint (no estimate it was taken at)."""
    if not isinstance(value, dict):
        return None
    out: dict[str, Any] = {"at": str(value.get("at") or "first round")[:40]}
    trials = value.get("trials")
    if isinstance(trials, int) and not isinstance(trials, bool) and trials >= 0:
        out["trials"] = trials
    for key in _NUMBERS:
        number = value.get(key)
        if isinstance(number, (int, float)) and not isinstance(number, bool) and math.isfinite(number) and number >= 0:
            out[key] = float(number)
    if isinstance(value.get("error"), str) and value["error"]:
        out["error"] = value["error"][:2000]
        out.pop("compiled_s", None)
    if "estimate_s" not in out or ("compiled_s" not in out and "error" not in out):
        return None
    return out


def saved(work_dir: str) -> dict[str, Any] | None:
    """The checkpoint an earlier call on ``work_dir`` took, as reported (:func:`as_reported`), or None."""
    return as_reported(load_checkpoint(work_dir))


def hook(run, search_budget: int):
    """The compiled checkpoint for the scheduler's first round robin (``state.after_first_round``) of the
    session's run (``session._Run``), or None where none is taken: one taken by an earlier call,
    ``compiled_checkpoint`` False (stock mode's default), a GPU, or kernels timed on another host."""
    cfg = run.cfg
    wanted = cfg.compiled_checkpoint if cfg.compiled_checkpoint is not None else cfg.mode == "doppler"
    if not wanted or run.device_type != "cpu" or cfg.runner not in LOCAL_RUNNERS:
        return None
    if not runs_end_to_end(run.model):
        return None
    if load_checkpoint(run.work_dir) is not None:
        return None

    def take_now() -> None:
        state = run.state
        best = [state.best.get(t.index, math.inf) for t in run.infos]
        if any(not math.isfinite(b) or is_failed_latency(b) for b in best):
            return  # a task without a measured candidate: no estimate to set it beside
        pacer, now = state.pacer, time.perf_counter()
        deadline_left = None if run.deadline is None else run.deadline - now
        if cfg.compiled_checkpoint is None and (
            pacer is None
            or not worth_taking(
                trials_done=state.trials_done,
                budget=search_budget,
                elapsed_s=now - pacer.started,
                deadline_left_s=deadline_left,
            )
        ):
            return
        limit = MAX_CHECKPOINT_S
        taken = take(
            run.model,
            work_dir=run.work_dir,
            target=cfg.target,
            threads=run.threads,
            estimate_s=sum(t.weight * b for t, b in zip(run.infos, best)),
            # the run's trials so far, as the caller counts them (its store may be ahead of TVM's database)
            trials=max(run.n_existing, int(cfg.trials_spent or 0)) + state.n_reported,
            limit_s=limit if deadline_left is None else max(1.0, min(limit, deadline_left / 4)),
            should_stop=state.poll_control,
        )
        run.phases["checkpoint"] = taken["wall_s"]
        if hasattr(run.sink, "on_checkpoint"):
            state.notify_sink("on_checkpoint", taken)

    return take_now


def report_saved(run, state) -> None:
    """A checkpoint an earlier call took is reported again: that call's report may not have reached the
    caller (its store was unreachable, the call was killed right after), and this call takes no other."""
    earlier = saved(run.work_dir)
    if earlier is not None and hasattr(run.sink, "on_checkpoint"):
        state.notify_sink("on_checkpoint", earlier)
