"""The fault table (issue 40): real workers, real runs, one fault each; what the run ends with.

Each row starts a real worker the way `make run` does (scripts/worker.sh, beat inside) on the embedded
default (SQLite + the SQLite-backed broker in a fresh DLOPT_VAR_DIR; the PostgreSQL row uses a throwaway
database on 127.0.0.1:5432), starts a run of the zoo's small_cnn with the row's budget, injects the fault
once the first round of measurements has landed, restarts the worker the way a user would where the row
needs it, waits for the run to end (and for the live workers' attempts on it to close: a cancel can end the
run while the executor it stopped still has its attempt to close) and counts:

* trials stored against the budget (and the round size: the budget may be overshot by the round in flight);
* duplicate records in the run's TVM database (the same workload with the same trace);
* candidates in TVM's database missing from the platform's store, and stored ones missing from TVM's;
* engine processes (``_isolated_child``) of a killed executor still alive after the kill;
* the final re-measure's rows against the re-measures charged to the run;
* the run's final status (and, for SIGSTOP, whether the cancel sent while it was stopped was honoured).

A last row points the Django cache at a dead Redis and asks ``GET /api/runs/`` through the test client
(the real cache backend, core/cache.py).

    .venv/bin/python bench/fault_table.py --quick --json bench/results/fault_table.json
    .venv/bin/python bench/fault_table.py --rows kill_child,dead_redis      # some rows only

Needs root for the disk row (a small tmpfs mounted under the row's var dir); without it that row is skipped.
The worker's lease (TUNING_STALE_AFTER_S) is shortened to --stale-s so recovery does not wait two minutes.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# bench/ is sys.path[0] when run as a script, and bench/common.py would shadow the platform's `common`
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

ENGINE_MARKER = "_isolated_child"  # the engine child's module name, in its command line
ROWS = ("kill_child", "kill_main_twice", "pg_drop", "sigstop", "disk_full", "dead_redis")
TITLES = {
    "kill_child": "SIGKILL the Celery child running the run (embedded default)",
    "kill_main_twice": "SIGKILL the worker's main process, then again during the final compile",
    "pg_drop": "drop every PostgreSQL connection mid-run (PostgreSQL)",
    "sigstop": "SIGSTOP the executor's process tree, cancel while stopped",
    "disk_full": "fill the disk under var/",
    "dead_redis": "cache pointed at a dead Redis: GET /api/runs/",
}
PG = "postgres://postgres@127.0.0.1:5432"
DEAD_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1
OPTIONS = {"search_population": 64, "genetic_num_iters": 1, "seed": 1,
           "evaluator": {"number": 2, "repeat": 1, "min_repeat_ms": 1}}


# --------------------------------------------------------------------------- helper (runs inside Django)
def helper(argv: list[str]) -> None:
    """``python -m bench.fault_table --helper CMD ...`` in the row's environment: setup / cancel / final /
    cache. Prints one JSON line."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from core import services as core
    from core.models import Quota
    from core.onnx_models import zoo
    from tuning import services
    from tuning.models import Measurement, TuningRun

    cmd = argv[0]
    if cmd in ("setup", "cache"):
        user = get_user_model().objects.create_user(username="op", password="pw-op-fault-table")
        team = core.create_team(name="Faults", owner=user)
        Quota.objects.filter(team=team).update(tuning_trials_per_month=10**6, energy_kwh_per_month=10**4)
    if cmd == "setup":
        max_trials, per_round = int(argv[1]), int(argv[2])
        data = zoo.build_model("small_cnn").SerializeToString()
        model = core.register_model(team=team, name="small_cnn", data=data, filename="small_cnn.onnx", actor=user)
        run = services.start_run(actor=user, model=model, max_trials=max_trials, trials_per_round=per_round,
                                 target={"kind": "llvm", "num-cores": 1}, options=OPTIONS)
        print(json.dumps({"run_id": run.pk}))
    elif cmd == "cancel":
        run = TuningRun.objects.get(pk=int(argv[1]))
        try:
            run = services.cancel_run(actor=run.created_by, run=run)
            print(json.dumps({"accepted": True, "status": run.status, "requested": run.requested_action}))
        except Exception as exc:  # noqa: BLE001 - the refusal is the answer
            print(json.dumps({"accepted": False, "error": str(exc)}))
    elif cmd == "final":
        import onnx

        from tuning.adapters import run_files_dir
        from tuning.engine.session import database_records
        from tuning.engine.workdir import load_final_rows

        run = TuningRun.objects.get(pk=int(argv[1]))
        stored = list(Measurement.objects.filter(run=run).values_list("task__index", "candidate_key"))
        work = run_files_dir(run.pk) / "work"
        path = work / "database_tuning_record.json"
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
        raw = [(w, json.dumps(rec[0], sort_keys=True)) for w, rec in lines]
        in_tvm: set = set()
        tvm_error = ""
        try:
            model = onnx.load_model_from_string(run.model.file.open("rb").read())
            in_tvm = {(r.task_index, r.candidate_key)
                      for r in database_records(str(work), model, run.engine_target)}
        except Exception as exc:  # noqa: BLE001 - reported, not hidden
            tvm_error = f"{type(exc).__name__}: {exc}"
        final_rows = load_final_rows(str(work)) if work.exists() else None
        print(json.dumps({
            "status": run.status, "error": run.error[:300], "attempts": run.attempts,
            "losses": run.executor_losses, "trials_done": run.trials_done, "stored": len(stored),
            "stored_duplicates": len(stored) - len(set(stored)), "max_trials": run.max_trials,
            "trials_per_round": run.trials_per_round, "serial_remeasures": run.serial_remeasures,
            "final_rows": len(final_rows["rows"]) if final_rows else 0,
            "final_rows_charged": bool(final_rows and final_rows["charged"]),
            "tvm_records": len(raw), "tvm_duplicates": len(raw) - len(set(raw)),
            "tvm_not_stored": None if tvm_error else len(in_tvm - set(stored)),
            "stored_not_in_tvm": None if tvm_error else len(set(stored) - in_tvm), "tvm_error": tvm_error,
            "requested_action": run.requested_action}))
    elif cmd == "settled":
        from tuning.services.settle import journal_settled

        print(json.dumps({"settled": journal_settled(int(argv[1]))}))
    elif cmd == "cache":
        from django.conf import settings
        from django.test import Client

        key = core.create_api_token(user=user, name="bench").key
        client, answers = Client(), []
        for _ in range(3):  # the first meets the dead server, the next ones the outage window
            t0 = time.monotonic()
            resp = client.get("/api/runs/", HTTP_AUTHORIZATION=f"Token {key}", HTTP_HOST="127.0.0.1")
            answers.append({"status": resp.status_code, "seconds": round(time.monotonic() - t0, 3)})
        print(json.dumps({"backend": settings.CACHES["default"]["BACKEND"],
                          "location": settings.CACHES["default"].get("LOCATION"), "answers": answers}))


# --------------------------------------------------------------------------- processes
def proc_children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(pid: int) -> set[int]:
    children, out, todo = proc_children(), set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def ppid_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def signal_pids(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class Row:
    """One row's world: its var dir, database, workers (every process they ever had, to clean up)."""

    def __init__(self, name: str, args, work: Path, *, postgres: bool = False, var_dir: Path | None = None):
        self.name, self.args = name, args
        self.dir = work / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.var = var_dir or self.dir / "var"
        self.var.mkdir(parents=True, exist_ok=True)
        self.db_name = f"dlopt_bench_faults_{os.getpid()}" if postgres else None
        self.workers: list[subprocess.Popen] = []
        self.seen: set[int] = set()  # every process of our workers ever seen
        self.engines: set[int] = set()
        self.events: list[str] = []
        self.t0 = time.monotonic()
        env = {k: v for k, v in os.environ.items() if k not in (
            "DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "TEST_DATABASE_URL", "DJANGO_MEDIA_ROOT",
            "DJANGO_CACHE_URL", "TEST_REDIS_URL")}
        env |= {"DLOPT_VAR_DIR": str(self.var), "PYTHON": sys.executable, "PYTHONPATH": str(ROOT),
                "TUNING_STALE_AFTER_S": str(args.stale_s), "DLOPT_NODE_NAME": "embedded", "PYTHONUNBUFFERED": "1"}
        if postgres:
            env["DATABASE_URL"] = f"{PG}/{self.db_name}"
        self.env = env

    def note(self, text: str) -> None:
        line = f"{time.monotonic() - self.t0:7.1f}s {text}"
        self.events.append(line)
        print(f"  [{self.name}] {line}", flush=True)

    # ----- platform
    def prepare(self) -> int:
        if self.db_name:
            self.psql(f"DROP DATABASE IF EXISTS {self.db_name}")
            self.psql(f"CREATE DATABASE {self.db_name}")
        subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, env=self.env, check=True,
                       capture_output=True, timeout=600)
        out = self.helper("setup", str(self.args.trials), str(self.args.round))
        self.run_id = out["run_id"]
        return self.run_id

    def psql(self, sql: str, db: str = "postgres") -> str:
        return subprocess.run(["psql", f"{PG}/{db}", "-Atc", sql], check=True, capture_output=True, text=True,
                              timeout=60).stdout

    def helper(self, *argv: str, env: dict | None = None) -> dict:
        out = subprocess.run([sys.executable, "-m", "bench.fault_table", "--helper", *argv], cwd=ROOT,
                             env=env or self.env, capture_output=True, text=True, timeout=600)
        if out.returncode:
            raise RuntimeError(f"helper {argv[0]} failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    def poll(self) -> dict:
        """The run's row, read with plain SQL (no Django start-up per poll)."""
        cols = "status, trials_done, serial_remeasures, attempts, requested_action"
        sql = f"SELECT {cols} FROM tuning_tuningrun WHERE id = {int(self.run_id)}"
        try:
            if self.db_name:
                row = self.psql(sql, self.db_name).strip().split("|")
            else:
                with sqlite3.connect(f"file:{self.var / 'db.sqlite3'}?mode=ro", uri=True, timeout=5) as con:
                    row = list(con.execute(sql).fetchone())
        except (sqlite3.Error, subprocess.SubprocessError, TypeError):
            return {}
        return {"status": row[0], "trials_done": int(row[1]), "serial_remeasures": int(row[2]),
                "attempts": int(row[3]), "requested_action": row[4]}

    def wait(self, predicate, timeout: float, what: str) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.track()
            state = self.poll()
            if state and predicate(state):
                return state
            time.sleep(1.0)
        raise TimeoutError(f"{what}: not within {timeout:.0f}s (last {self.poll()})")

    def finished(self, timeout: float) -> dict:
        return self.wait(lambda s: s["status"] in ("succeeded", "failed", "cancelled"), timeout, "the run's end")

    def attempts_open(self) -> int:
        """``tuning.execute_run`` tasks a live worker received and has not finished yet (from its log)."""
        open_ids: set[str] = set()
        for proc in self.workers:
            if proc.poll() is not None:
                continue
            for line in (self.dir / f"worker-{proc.tag}.log").read_text(errors="replace").splitlines():
                if "tuning.execute_run[" not in line:
                    continue
                task_id = line.split("tuning.execute_run[", 1)[1].split("]", 1)[0]
                if line.rstrip().endswith("] received"):
                    open_ids.add(task_id)
                elif any(w in line for w in (" succeeded in ", " failed:", " raised ", " retry:")):
                    open_ids.discard(task_id)
        return len(open_ids)

    def attempts_ended(self, timeout: float) -> None:
        """Wait (bounded) until the live workers' attempts on the run have ended: a run can end (a cancel
        honoured by recovery) while an executor still has its attempt to close (the stopped one, resumed)."""
        deadline = time.monotonic() + timeout
        while self.attempts_open() and time.monotonic() < deadline:
            time.sleep(1.0)
        left = self.attempts_open()
        self.note(f"attempts still open: {left}" if left else "every attempt on live workers ended")

    def settled_by_sweep(self, timeout: float) -> dict:
        """Restart a worker (as a user would after the kill) and wait, bounded, until the run's TVM
        database is settled: the beat's `tuning.settle_ended_runs` runs once a minute."""
        t0 = time.monotonic()
        if self.helper("settled", str(self.run_id))["settled"]:
            self.note("the run's journal was settled already: no sweep needed")
            return {"needed": False, "waited_s": 0.0}
        proc = self.start_worker("sweep")
        settled = False
        while time.monotonic() - t0 < timeout and not settled:
            time.sleep(5.0)
            settled = self.helper("settled", str(self.run_id))["settled"]
        waited = round(time.monotonic() - t0, 1)
        self.stop_worker(proc)
        self.note(f"settled by the sweep after {waited}s" if settled else f"not settled within {timeout:.0f}s")
        return {"needed": True, "settled": settled, "waited_s": waited}

    # ----- workers
    def start_worker(self, tag: str, **extra) -> subprocess.Popen:
        log = open(self.dir / f"worker-{tag}.log", "wb")
        proc = subprocess.Popen(["scripts/worker.sh"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env=self.env | {"WORKER_HOSTNAME": f"{tag}@embedded"} | extra,
                                start_new_session=True)
        proc.tag = tag  # its log: worker-<tag>.log
        self.workers.append(proc)
        self.note(f"worker {tag} started (pid {proc.pid})")
        return proc

    def track(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                tree = descendants(proc.pid)
                self.seen |= tree | {proc.pid}
                self.engines |= {p for p in tree if ENGINE_MARKER in cmdline(p)}

    def engine_of(self, proc: subprocess.Popen) -> int | None:
        found = [p for p in descendants(proc.pid) if ENGINE_MARKER in cmdline(p)]
        return found[0] if found else None

    def stop_worker(self, proc: subprocess.Popen) -> None:
        """What a user does to a worker: Ctrl-C (SIGTERM to its group), then SIGKILL if it does not go."""
        self.track()
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        except ProcessLookupError:
            pass

    def live_engines(self) -> list[int]:
        return sorted(p for p in self.engines if alive(p) and ENGINE_MARKER in cmdline(p))

    def cleanup(self) -> None:
        self.track()
        for proc in self.workers:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        signal_pids([p for p in self.seen if alive(p)], signal.SIGCONT)
        signal_pids([p for p in self.seen if alive(p)], signal.SIGKILL)
        for proc in self.workers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass

    def drop_database(self) -> None:
        if self.db_name:
            try:
                self.psql(f"DROP DATABASE IF EXISTS {self.db_name} WITH (FORCE)")
            except subprocess.SubprocessError:
                pass


# --------------------------------------------------------------------------- rows
def first_round(row: Row, timeout: float) -> dict:
    return row.wait(lambda s: s["trials_done"] >= row.args.round, timeout, "the first measurements")


def row_kill_child(row: Row, a) -> dict:
    row.prepare()
    first = row.start_worker("first")
    first_round(row, a.row_timeout)
    engine = row.engine_of(first)
    if engine is None:
        raise RuntimeError("no engine process found under the worker")
    executor = ppid_of(engine)
    engine_tree = {engine} | descendants(engine)
    os.kill(executor, signal.SIGKILL)
    row.note(f"SIGKILL executor {executor} (engine {engine}, {len(engine_tree)} engine processes)")
    time.sleep(a.grace_s)
    left = [p for p in engine_tree if alive(p)]
    row.note(f"{len(left)} engine processes alive {a.grace_s}s after the kill")
    row.stop_worker(first)
    row.start_worker("second")
    return {"engines_alive_after_kill": len(left)}


def row_kill_main_twice(row: Row, a) -> dict:
    row.prepare()
    first = row.start_worker("first")
    first_round(row, a.row_timeout)
    tree = descendants(first.pid)
    engines = {p for p in tree if ENGINE_MARKER in cmdline(p)}
    os.kill(first.pid, signal.SIGKILL)
    row.seen |= tree
    row.note(f"SIGKILL worker main {first.pid} ({len(tree)} processes under it)")
    time.sleep(a.grace_s)
    left1 = [p for p in engines if alive(p)]
    orphans1 = [p for p in tree if alive(p)]
    row.note(f"{a.grace_s}s later: {len(left1)} engines, {len(orphans1)} of its processes alive")
    row.seen |= tree  # left running: the orphaned executor must give way to the next worker by itself
    row.start_worker("second")
    work = row.var / "media" / "runs" / str(row.run_id) / "work" / "final_remeasure.json"
    state = row.wait(lambda s: work.exists() or s["serial_remeasures"] > 0
                     or s["status"] in ("succeeded", "failed", "cancelled"), a.row_timeout, "the final stage")
    out = {"engines_alive_after_kill": len(left1), "orphans_after_first_kill": len(orphans1)}
    if state["status"] != "running":
        row.note(f"run ended ({state['status']}) before the final compile could be hit")
        out["second_kill"] = "missed"
        return out
    time.sleep(1.0)  # in the final compile: the re-measure's rows are saved, the module is being built
    # The worker whose executor runs the final compile: the second one, or the first one's orphaned executor
    # if it outlived its main process (then there is no main to kill: the executor itself is killed).
    row.track()
    engines = [p for p in row.seen if alive(p) and ENGINE_MARKER in cmdline(p)]
    if not engines:
        row.note("no engine alive in the final stage")
        out["second_kill"] = "no engine"
        return out
    executor = ppid_of(engines[0])
    main = ppid_of(executor)
    victim = main if any(w.pid == main and w.poll() is None for w in row.workers) else executor
    tree = descendants(victim)
    row.seen |= tree
    os.kill(victim, signal.SIGKILL)
    row.note(f"SIGKILL {'worker main' if victim == main else 'orphaned executor'} {victim} in the final stage "
             f"(re-measures charged so far {row.poll().get('serial_remeasures')})")
    time.sleep(a.grace_s)
    left2 = [p for p in engines if alive(p)]
    orphans2 = [p for p in tree if alive(p)]
    row.note(f"{a.grace_s}s later: {len(left2)} engines, {len(orphans2)} of its processes alive")
    row.start_worker("third")
    out.update(second_kill="worker main" if victim == main else "orphaned executor",
               engines_alive_after_kill=len(left1) + len(left2), orphans_after_second_kill=len(orphans2))
    return out


def row_pg_drop(row: Row, a) -> dict:
    row.prepare()
    row.start_worker("only")
    first_round(row, a.row_timeout)
    n = row.psql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                 f"WHERE datname = '{row.db_name}' AND pid <> pg_backend_pid()")
    row.note(f"terminated {n.strip()} PostgreSQL connections")
    return {"connections_dropped": int(n.strip() or 0)}


def row_sigstop(row: Row, a) -> dict:
    row.prepare()
    worker = row.start_worker("only")
    first_round(row, a.row_timeout)
    engine = row.engine_of(worker)
    if engine is None:
        raise RuntimeError("no engine process found under the worker")
    executor = ppid_of(engine)
    tree = [executor] + sorted(descendants(executor))
    signal_pids(tree, signal.SIGSTOP)
    row.note(f"SIGSTOP executor {executor} and its {len(tree) - 1} descendants for {a.stop_s}s")
    try:
        time.sleep(min(a.cancel_after_s, a.stop_s))
        cancel = row.helper("cancel", str(row.run_id))
        row.note(f"cancel sent while stopped: {cancel}")
        time.sleep(max(0, a.stop_s - a.cancel_after_s))
    finally:
        signal_pids(tree, signal.SIGCONT)
    row.note("SIGCONT")
    return {"cancel": cancel, "stopped_s": a.stop_s}


def row_disk_full(row: Row, a) -> dict:
    row.prepare()
    row.start_worker("only")
    first_round(row, a.row_timeout)
    filler = row.var / "filler.bin"
    chunk, written = b"\0" * (1 << 20), 0
    with open(filler, "wb") as fh:
        try:
            while True:
                fh.write(chunk)
                fh.flush()
                written += 1
        except OSError as exc:
            row.note(f"disk full after {written} MiB ({exc.strerror})")
    try:
        time.sleep(a.fill_s)
    finally:
        filler.unlink()
    row.note(f"disk freed after {a.fill_s}s")
    return {"filled_mib": written, "full_s": a.fill_s}


def row_dead_redis(row: Row, a) -> dict:
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, env=row.env, check=True,
                   capture_output=True, timeout=600)
    out = row.helper("cache", env=row.env | {"DJANGO_CACHE_URL": DEAD_REDIS})
    row.note(f"{out}")
    return out


RUNNERS = {"kill_child": row_kill_child, "kill_main_twice": row_kill_main_twice, "pg_drop": row_pg_drop,
           "sigstop": row_sigstop, "disk_full": row_disk_full, "dead_redis": row_dead_redis}


def run_row(name: str, a, work: Path) -> dict:
    print(f"\n== {name}: {TITLES[name]}", flush=True)
    mounted = None
    if name == "disk_full":
        if os.geteuid() != 0:
            return {"row": name, "title": TITLES[name], "skipped": "needs root to mount a small tmpfs"}
        mounted = work / name / "var"
        mounted.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={a.tmpfs_mib}m", "tmpfs", str(mounted)], check=True)
    row = Row(name, a, work, postgres=(name == "pg_drop"), var_dir=mounted)
    result: dict = {"row": name, "title": TITLES[name]}
    t0 = time.monotonic()
    try:
        result["fault"] = RUNNERS[name](row, a)
        if name != "dead_redis":
            end = row.finished(a.row_timeout)
            row.note(f"run ended: {end['status']}")
            row.attempts_ended(a.attempt_end_s)
            for proc in row.workers:
                if proc.poll() is None:
                    row.stop_worker(proc)
            time.sleep(2)
            result["engines_alive_at_end"] = len(row.live_engines())
            result["final"] = row.helper("final", str(row.run_id))
            if a.settle_wait_s > 0:  # what the sweep of ended runs makes of it, on a restarted worker
                result["final_before_sweep"] = result["final"]
                result["sweep"] = row.settled_by_sweep(a.settle_wait_s)
                result["final"] = row.helper("final", str(row.run_id))
    except Exception as exc:  # noqa: BLE001 - a row that fails is reported, the others still run
        result["failure"] = f"{type(exc).__name__}: {exc}"
        row.note(result["failure"])
        if name != "dead_redis" and getattr(row, "run_id", None):
            row.cleanup()
            try:
                result["final"] = row.helper("final", str(row.run_id))
            except Exception as exc2:  # noqa: BLE001
                result["final_failure"] = str(exc2)
    finally:
        row.cleanup()
        row.drop_database()
        if mounted is not None:
            subprocess.run(["umount", "-l", str(mounted)], check=False)
    result["wall_s"] = round(time.monotonic() - t0, 1)
    result["events"] = row.events
    result["verdict"] = verdict(result)
    return result


def verdict(r: dict) -> dict:
    """Whether the row meets issue 40's bar: within budget (+ one round), 0 duplicates, 0 lost."""
    if r.get("skipped"):
        return {"ok": None}
    if r["row"] == "dead_redis":
        answers = (r.get("fault") or {}).get("answers") or []
        return {"ok": bool(answers) and all(x["status"] == 200 for x in answers)}
    f = r.get("final") or {}
    if not f:
        return {"ok": False}
    checks = {
        "within_budget": f["trials_done"] <= f["max_trials"] + f["trials_per_round"],
        "no_duplicates": f["tvm_duplicates"] == 0 and f["stored_duplicates"] == 0,
        "none_lost": f["tvm_not_stored"] == 0 and f["stored_not_in_tvm"] == 0,
        # a killed executor's engine must end with it; a killed main process leaves its executor (and so
        # its engine) running, which the lease fence has to stop instead: only the end counts there
        "no_engine_left": r.get("engines_alive_at_end", 0) == 0 and (
            r["row"] != "kill_child" or (r.get("fault") or {}).get("engines_alive_after_kill", 0) == 0),
        "remeasure_charged_once": f["serial_remeasures"] <= max(f["final_rows"], 0) or f["final_rows"] == 0,
    }
    if r["row"] == "sigstop":
        checks["cancel_honoured"] = f["status"] == "cancelled"
    else:
        checks["succeeded"] = f["status"] == "succeeded"
    return {"ok": all(checks.values()) and not r.get("failure"), **checks}


def table(results: list[dict]) -> str:
    head = ("| fault | status | trials / budget (round) | TVM dup | TVM not stored | stored not in TVM | "
            "engines left | re-measures charged / rows | attempts | ok |")
    lines = [head, "|" + "---|" * 10]
    for r in results:
        f = r.get("final") or {}
        if r.get("skipped"):
            lines.append(f"| {r['title']} | skipped: {r['skipped']} |" + " |" * 8)
            continue
        if r["row"] == "dead_redis":
            ans = (r.get("fault") or {}).get("answers") or []
            codes = ", ".join(f"{x['status']} ({x['seconds']} s)" for x in ans) or r.get("failure", "")
            lines.append(f"| {r['title']} | {codes} | - | - | - | - | - | - | - | {r['verdict']['ok']} |")
            continue
        fault = r.get("fault") or {}
        engines = f"{fault.get('engines_alive_after_kill', '-')} / {r.get('engines_alive_at_end', '-')}"
        lines.append(
            f"| {r['title']} | {f.get('status', r.get('failure', '?'))} | "
            f"{f.get('trials_done', '?')} / {f.get('max_trials', '?')} ({f.get('trials_per_round', '?')}) | "
            f"{f.get('tvm_duplicates', '?')} | {f.get('tvm_not_stored', '?')} | {f.get('stored_not_in_tvm', '?')} | "
            f"{engines} | {f.get('serial_remeasures', '?')} / {f.get('final_rows', '?')} | "
            f"{f.get('attempts', '?')} | {r['verdict']['ok']} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--helper":
        helper(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma list of {', '.join(ROWS)}")
    ap.add_argument("--quick", action="store_true", help="40 trials (small_cnn's minimum), 8 a round")
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--round", type=int, default=16)
    ap.add_argument("--stale-s", type=float, default=30.0, help="the executor lease (TUNING_STALE_AFTER_S)")
    ap.add_argument("--stop-s", type=float, default=156.0, help="how long SIGSTOP holds the executor")
    ap.add_argument("--cancel-after-s", type=float, default=100.0,
                    help="cancel sent this long into the stop (after the lease expired and beat swept)")
    ap.add_argument("--fill-s", type=float, default=120.0, help="how long the disk stays full")
    ap.add_argument("--tmpfs-mib", type=int, default=256)
    ap.add_argument("--grace-s", type=float, default=20.0, help="wait after a kill before counting survivors")
    ap.add_argument("--attempt-end-s", type=float, default=90.0,
                    help="after the run ends, how long its live workers' attempts may take to close")
    ap.add_argument("--settle-wait-s", type=float, default=0.0,
                    help="after the row, restart a worker and wait this long (at most) for the sweep of "
                         "ended runs to settle the run's TVM database; 0: don't")
    ap.add_argument("--row-timeout", type=float, default=900.0, help="bound on each wait of a row")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--keep", action="store_true", help="keep the rows' var dirs and logs")
    a = ap.parse_args()
    if a.quick:
        a.trials, a.round = 40, 8  # small_cnn: 5 tasks x the 8-trial minimum
    names = [n for n in a.rows.split(",") if n]
    unknown = sorted(set(names) - set(ROWS))
    if unknown:
        ap.error(f"unknown rows {', '.join(unknown)} (choose from {', '.join(ROWS)})")
    from bench.common import machine_info

    work = Path(tempfile.mkdtemp(prefix="fault-table-"))
    print(f"rows in {work}; budget {a.trials} trials, {a.round} a round; lease {a.stale_s}s", flush=True)
    results: list[dict] = []

    def write_json() -> None:  # after every row: a long table interrupted still leaves its finished rows
        if not a.json:
            return
        overall = {"rows": len(results), "rows_ok": sum(1 for r in results if r["verdict"]["ok"]),
                   "all_ok": all(r["verdict"]["ok"] in (True, None) for r in results),
                   "trials": a.trials, "trials_per_round": a.round}
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({
            "overall": overall, "rows": results,
            "machine": machine_info(command=" ".join(sys.argv), lease_s=a.stale_s, date=time.strftime(
                "%Y-%m-%d %H:%M UTC", time.gmtime()))}, indent=2))

    try:
        for name in names:
            results.append(run_row(name, a, work))
            print(table(results[-1:]).splitlines()[-1], flush=True)
            write_json()
    finally:
        if not a.keep:
            subprocess.run(["rm", "-rf", str(work)], check=False)
    print("\n" + table(results))


if __name__ == "__main__":
    main()
