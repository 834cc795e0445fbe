"""What the lifeline tests run inside an isolated engine child: the process tree a tuning run has."""

import json
import os
import subprocess
import sys
import time


def engine_tree_then_hang(pid_file: str) -> None:
    """Start what a run's engine starts (a builder/measurement worker of the process pool, which leads
    its own process group, and a compiler-like grandchild in the engine's group), name them all in
    ``pid_file``, then hang like a long search."""
    from tuning.engine.process.procpool import WorkerProcess, WorkerSpec

    worker = WorkerProcess(WorkerSpec(name="fence-test"))
    worker.start()
    worker_pid = worker.call("os:getpid", timeout=120)  # started and serving
    compiler = subprocess.Popen(["sleep", "600"])
    with open(pid_file + ".tmp", "w") as fh:
        json.dump({"engine": os.getpid(), "pool_worker": worker_pid, "compiler": compiler.pid}, fh)
    os.replace(pid_file + ".tmp", pid_file)
    time.sleep(3600)


def leave_a_grandchild() -> int:
    """Start a process in the engine's group and return at once, leaving it running."""
    return subprocess.Popen(["sleep", "600"]).pid


def executor_main(pid_file: str) -> None:
    """An executor: runs the engine call above in an isolated child, as `call_engine` does."""
    from tuning.engine.process.isolate import call_isolated

    call_isolated("tests.engine.lifeline_helpers:engine_tree_then_hang", pid_file, what="hanging")


def hold_work_dir(work_dir: str, ready_file: str) -> None:
    """An engine that holds ``work_dir``'s lock until it is killed."""
    from tuning.engine.process.lifeline import lock_work_dir

    with lock_work_dir(work_dir, wait_s=0):
        open(ready_file, "w").close()
        time.sleep(3600)


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
