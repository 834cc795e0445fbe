"""bench/tuned_tasks.py: the per-task table of a tuned job (trials, best, trend, the trial that found the
best) and where its compiled model's time goes, on a tiny tuning run and on hand-made databases."""

import collections
import io
import json
import os
import shutil

import pytest

from bench import tuned_tasks as tt
from bench import vs_onnxruntime as bench
from tuning.engine.compile import passes as gp
from tuning.engine.compile.pipeline import compile_model, make_target, onnx_to_relax, random_inputs
from tuning.engine.compile.workloads import collect_tasks
from tuning.engine.config import TuningConfig
from tuning.engine.measuring.timer import EvaluatorConfig
from tuning.engine.session import run_tuning
from tuning.engine.testing import tiny_cnn_onnx
from tuning.engine.workdir import open_json_db, record_latency, records_by_task

TARGET = {"kind": "llvm", "num-cores": 2}


# --------------------------------------------------------------------------- the trend rule
@pytest.mark.parametrize("latencies, label", [
    ([10, 9, 8, 7, 6, 5, 4, 3], tt.FALLING),  # last quarter: 4 -> 3 after a best of 5 before it
    ([10, 5, 6, 7, 8, 9, 9, 9], tt.FLAT),
    ([100, 100, 100, 98.0], tt.FLAT),  # exactly 2 %: not more than 2 %
    ([100, 100, 100, 97.9], tt.FALLING),
    ([100, 100, 100, 100, 100, 100, 100, 98.5], tt.FLAT),
    ([None, None, None, 5.0], tt.FALLING),  # the first valid result came in the last quarter
    ([None, None, None, None], tt.UNMEASURED),
    ([5.0, 4.0, 3.0], tt.TOO_FEW),
])
def test_still_falling_means_more_than_two_percent_over_the_last_quarter(latencies, label):
    assert tt.trend(latencies)[0] == label


def test_the_last_quarter_rounds_up_and_the_gain_is_relative_to_the_best_before_it():
    # 9 trials: the window is the last 3; the best before it is 8, after 6: 25 %
    label, gain = tt.trend([10, 9, 8, 9, 9, 9, 7, 6, 9])
    assert label == tt.FALLING and gain == pytest.approx(0.25)


# --------------------------------------------------------------------------- the breakdown's steps, hand-made
HAND_TABLE = [{"index": 0, "name": "conv", "weight": 2.0, "estimate_us": 260.0},
              {"index": 1, "name": "dense", "weight": 1.0, "estimate_us": 40.0}]
HAND_KERNELS = {"conv": 0, "dense": 1}


def _hand_profile():
    """Two tuned kernels (conv called twice), a builtin, and 20 us of VM dispatch in the uninstrumented run;
    per call, each kernel timed alone reads 100 / 30 us warm and 140 / 45 us cold."""
    return {"calls": {
        "conv": {"count": 2, "in_model_us": 300.0, "standalone_us": 100.0, "standalone_cold_us": 140.0},
        "dense": {"count": 1, "in_model_us": 50.0, "standalone_us": 30.0, "standalone_cold_us": 45.0},
        "vm.builtin.alloc_storage": {"count": 3, "in_model_us": 5.0, "standalone_us": None,
                                     "standalone_cold_us": None},
    }, "profiled_us": 400.0, "compiled_us": 375.0}


@pytest.mark.parametrize("regime, alone_vs_tuning, in_model_vs_alone", [
    ("cold", (280 - 260) + (45 - 40), (300 - 280) + (50 - 45)),
    ("warm", (200 - 260) + (30 - 40), (300 - 200) + (50 - 30)),
])
def test_the_steps_walk_through_the_kernels_timed_as_the_tuning_timed_them(regime, alone_vs_tuning,
                                                                          in_model_vs_alone):
    prof = tt.time_breakdown(HAND_TABLE, _hand_profile(), HAND_KERNELS, regime=regime)
    steps = prof["steps"]
    assert prof["steps_regime"] == regime
    assert steps["alone_vs_tuning_us"] == pytest.approx(alone_vs_tuning)
    assert steps["in_model_vs_alone_us"] == pytest.approx(in_model_vs_alone)
    assert steps["calls_without_task_us"] == pytest.approx(5.0) and steps["vm_rest_us"] == pytest.approx(20.0)
    assert sum(steps.values()) == pytest.approx(prof["compiled_us"])  # the walk ends at the compiled latency
    # both columns stay in the rows and in the regimes' comparison, whichever the steps walk through
    assert prof["alone_regimes"]["warm_us"] == pytest.approx(230.0)
    assert prof["alone_regimes"]["cold_us"] == pytest.approx(325.0)
    text = io.StringIO()
    tt.print_breakdown(prof, file=text)
    assert f"alone {regime}" in text.getvalue() and f"({regime}, as tuned)" in text.getvalue()


def test_the_tuning_regime_is_the_jobs_evaluator_else_the_products_choice():
    assert tt.tuning_regime({"enable_cpu_cache_flush": True, "number": 1}, TARGET) == "cold"
    assert tt.tuning_regime(bench._evaluator(bench.EVALUATORS["warm"]), TARGET) == "warm"
    assert tt.tuning_regime(bench._evaluator(bench.AUTO), TARGET) == "cold"  # the product on a CPU
    assert tt.tuning_regime(None, TARGET) == "cold"
    assert tt.tuning_regime(None, {"kind": "cuda", "arch": "sm_90"}) == "warm"  # a GPU has no cold column
    with pytest.raises(ValueError, match="regime"):
        tt.time_breakdown(HAND_TABLE, _hand_profile(), HAND_KERNELS, regime="gpu")


@pytest.mark.parametrize("saved, regime", [
    ({"evaluator": bench._evaluator(bench.AUTO)}, "cold"),
    ({"evaluator": bench._evaluator(bench.EVALUATORS["cold"])}, "cold"),
    ({"evaluator": bench._evaluator(bench.EVALUATORS["warm"])}, "warm"),
    ({"evaluator": None}, "warm"),  # rows of the bench when its default was TVM's warm evaluator
    ({}, "warm"),  # rows from before the bench saved an evaluator
])
def test_a_jobs_regime_comes_from_its_row_when_its_job_file_has_none(tmp_path, saved, regime):
    work_dir = tmp_path / "resnet18__mcpu"
    work_dir.mkdir()
    (tmp_path / "resnet18__mcpu.json").write_text(json.dumps({"target": TARGET, "passes": ["fold_batchnorm"], **saved}))
    job = tt.load_job(str(work_dir))  # no job file: the row
    assert job["model"] == "resnet18" and tt.tuning_regime(job["evaluator"], job["target"]) == regime
    # an older job file (model, target, passes) beside the row: the row's evaluator still decides
    (work_dir / tt.JOB_FILE).write_text(json.dumps({"model": "resnet18", "target": TARGET,
                                                    "passes": ["fold_batchnorm"], "threads": 2}))
    assert tt.tuning_regime(tt.load_job(str(work_dir))["evaluator"], TARGET) == regime


def test_a_new_job_file_says_how_its_tuning_timed(tmp_path):
    tt.write_job(str(tmp_path), model="resnet18", target=TARGET, passes=["fold_batchnorm"],
                 evaluator=bench._evaluator(bench.EVALUATORS["warm"]))
    assert tt.tuning_regime(tt.load_job(str(tmp_path))["evaluator"], TARGET) == "warm"
    tt.write_job(str(tmp_path), model="resnet18", target=TARGET, passes=["fold_batchnorm"],
                 evaluator=bench._evaluator(bench.AUTO))
    assert tt.tuning_regime(tt.load_job(str(tmp_path))["evaluator"], TARGET) == "cold"


# --------------------------------------------------------------------------- commit order, hand-made
def _commit(work_dir, task, latencies_and_tags):
    """Commit one record per (latency s | None for a failed run, tag) to the run's database, in this order;
    records with the same tag have the same trace (a duplicate candidate)."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.schedule import Schedule

    db = open_json_db(str(work_dir))
    workload = db.commit_workload(task.mod)
    for latency, tag in latencies_and_tags:
        sch = Schedule(task.mod)
        sch.annotate(sch.get_sblock("root"), "test.order", tag)
        db.commit_tuning_record(ms.database.TuningRecord(
            sch.trace, workload, run_secs=[1e10 if latency is None else latency], target=make_target(TARGET),
            args_info=ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])))


@pytest.fixture(scope="module")
def tiny_tasks():
    return collect_tasks(tiny_cnn_onnx(), make_target(TARGET))


def test_the_table_reads_trials_in_commit_order_not_tvms_latency_order(tmp_path, tiny_tasks):
    a, b = tiny_tasks[3], tiny_tasks[4]
    _commit(tmp_path, a, [(5e-6, 0), (4e-6, 1), (None, 2), (6e-6, 3), (3e-6, 4), (7e-6, 5), (3.5e-6, 6), (8e-6, 7)])
    _commit(tmp_path, b, [(2e-6, 0), (1e-6, 1)])
    _commit(tmp_path, a, [(2e-6, 8), (9e-6, 9), (9e-6, 9)])  # a later batch of ``a``; the last a duplicate
    rows = {r["name"]: r for r in tt.task_table(str(tmp_path), tiny_tasks)}
    ra, rb = rows[a.name], rows[b.name]
    assert (ra["trials"], ra["duplicates"], ra["failed"]) == (10, 1, 1)
    assert ra["best_us"] == pytest.approx(2.0) and ra["best_trial"] == 9 and ra["best_trial_overall"] == 11
    assert rb["best_us"] == pytest.approx(1.0) and (rb["best_trial"], rb["best_trial_overall"]) == (2, 10)
    # a: 11 records, window 3 (2, 9, 9 us) after a best of 3 us: still falling, by a third
    assert ra["trend"] == tt.FALLING and ra["last_quarter_gain_pct"] == pytest.approx(100 / 3)
    assert rb["trend"] == tt.TOO_FEW
    assert sum(r["trials"] for r in rows.values()) == 12
    untouched = [r for r in rows.values() if r["name"] not in (a.name, b.name)]
    assert all(r["trials"] == 0 and r["best_us"] is None and r["trend"] == tt.UNMEASURED for r in untouched)
    # share of the estimate: weight x best over the tasks that have one
    assert ra["share_pct"] == pytest.approx(100 * 2 / 3) and rb["share_pct"] == pytest.approx(100 / 3)


def test_records_come_back_in_commit_order_and_a_cut_line_is_skipped(tmp_path, tiny_tasks):
    from tuning.engine.workdir import DB_RECORDS, records_in_commit_order

    a, b = tiny_tasks[3], tiny_tasks[4]
    _commit(tmp_path, a, [(3e-6, 0), (1e-6, 1)])
    _commit(tmp_path, b, [(2e-6, 0)])
    _commit(tmp_path, a, [(4e-6, 2)])
    # TVM's own reader sorts by latency
    assert [record_latency(r) for r in records_by_task(open_json_db(str(tmp_path)), tiny_tasks)[3]] == [1e-6, 3e-6, 4e-6]
    with open(tmp_path / DB_RECORDS, "a") as f:  # (TVM's reader refuses the whole file then)
        f.write('[0, [["a record cut short by a kill"')
    got = [(i, record_latency(rec)) for i, rec in records_in_commit_order(str(tmp_path), tiny_tasks)]
    assert got == [(3, 3e-6), (3, 1e-6), (4, 2e-6), (3, 4e-6)]
    assert records_in_commit_order(str(tmp_path / "none"), tiny_tasks) == []


# --------------------------------------------------------------------------- a tiny tuning job
class _KeepingSink(bench.ParitySink):
    """The bench's sink (it counts the job's trials), keeping what it was told."""

    def __init__(self):
        super().__init__(None)
        self.records = []

    def on_measurements(self, records):
        self.records.extend(records)
        super().on_measurements(records)


@pytest.fixture(scope="module", autouse=True)
def v1_pipeline():
    """These tests run the v1 pipeline (fold_batchnorm alone, the CUDA default), where tiny_cnn keeps a task
    the compiled model runs as a VM view (its reshape): the table's rows for such a task are part of what
    they check. Every extraction and compile of the module, the CLI's included, uses it."""
    with gp.use_passes(gp.SHIPPED_V1):
        yield


@pytest.fixture(scope="module")
def tuned_job(tmp_path_factory, v1_pipeline):
    """tiny_cnn tuned a few rounds as the bench tunes (DOPpler, final serial re-measure), counted by the
    bench's own sink."""
    work_dir = str(tmp_path_factory.mktemp("tuned_job"))
    model = tiny_cnn_onnx()
    cfg = TuningConfig(target=TARGET, max_trials=40, trials_per_round=8, work_dir=work_dir, threads=2,
                       search_population=32, genetic_num_iters=1, seed=1,
                       evaluator=EvaluatorConfig(number=3, repeat=1, min_repeat_ms=5))
    sink = _KeepingSink()
    summary = run_tuning(model, cfg, sink)
    assert summary.status == "succeeded"
    return {"work_dir": work_dir, "model": model, "summary": summary, "sink": sink,
            "tasks": collect_tasks(model, make_target(TARGET))}


@pytest.mark.slow
def test_the_tables_trials_are_the_jobs_trials_and_its_best_the_least_record(tuned_job):
    tasks, work_dir = tuned_job["tasks"], tuned_job["work_dir"]
    rows = tt.task_table(work_dir, tasks)
    assert sum(r["trials"] for r in rows) == tuned_job["sink"].trials > 0
    per_task = collections.Counter(r.task_index for r in tuned_job["sink"].records)
    assert {r["index"]: r["trials"] for r in rows} == {i: per_task.get(i, 0) for i in range(len(tasks))}
    by_task = records_by_task(open_json_db(work_dir), tasks)
    for r in rows:
        lats = [x for x in (record_latency(rec) for rec in by_task[r["index"]]) if x is not None]
        assert r["best_us"] == pytest.approx(min(lats) * 1e6)
        assert 1 <= r["best_trial"] <= r["trials"] and r["best_trial_overall"] <= tuned_job["sink"].trials
    # the estimate is the engine's (weight x best, the serial re-measure where there is one)
    assert sum(r["estimate_us"] for r in rows) == pytest.approx(tuned_job["summary"].best_latency_s * 1e6)
    assert any(r["final_us"] is not None for r in rows)
    assert sum(r["share_pct"] for r in rows) == pytest.approx(100)


@pytest.mark.slow
def test_the_profile_rows_cover_the_compiled_latency(tuned_job):
    model, work_dir = tuned_job["model"], tuned_job["work_dir"]
    mod = onnx_to_relax(model)
    result = tt.analyse_executables(
        work_dir, mod, TARGET, random_inputs(model, seed=0),
        tuned=compile_model(mod, TARGET, database=work_dir), untuned=compile_model(mod, TARGET), threads=2, repeat=3)
    prof, table = result["profile"], result["tasks"]
    rows = prof["rows"]
    assert sum(x["in_model_us"] for x in rows) == pytest.approx(prof["profiled_us"])
    # the steps walk from the estimate to the compiled latency, exactly
    assert prof["steps"]["estimate_us"] + sum(v for k, v in prof["steps"].items() if k != "estimate_us") \
        == pytest.approx(prof["compiled_us"])
    kernels = {x["row"]: x for x in rows if x["kind"] == "task"}
    # each tuned task of tiny_cnn is one kernel called once; the reshape task runs as the VM's reshape view
    assert {name: x["calls"] for name, x in kernels.items()} == {
        r["name"]: int(r["weight"]) for r in table if r["name"] != "reshape"}
    assert all(x["in_model_us"] > 0 and x["standalone_us"] > 0 and x["standalone_cold_us"] > 0
               for x in kernels.values())
    # the evaluator rule's evidence: both ways of timing a kernel alone, summed over the same tasks
    regimes = prof["alone_regimes"]
    assert regimes["tasks"] == len(kernels)
    assert regimes["warm_us"] == pytest.approx(sum(x["standalone_us"] for x in kernels.values()))
    assert regimes["cold_us"] == pytest.approx(sum(x["standalone_cold_us"] for x in kernels.values()))
    assert [x["kind"] for x in rows if x["row"] == "reshape"] == ["task, no kernel in the compiled model"]
    assert {"vm.builtin.alloc_storage", "vm.builtin.reshape", tt.VM_GAP} <= {x["row"] for x in rows}
    # the untuned build's kernels give the table its default-schedule latencies
    assert all(r["untuned_us"] > 0 for r in table if r["name"] != "reshape")
    text = io.StringIO()
    tt.print_breakdown(prof, file=text)
    assert all(x["row"][:40] in text.getvalue() for x in rows) and "VM dispatch" in text.getvalue()


@pytest.mark.slow
def test_the_cli_reads_a_snapshot_and_leaves_the_work_dir_as_it_was(tuned_job, tmp_path, capsys):
    path = tmp_path / "tiny.onnx"
    path.write_bytes(tuned_job["model"].SerializeToString())
    work_dir = tuned_job["work_dir"]
    tt.write_job(work_dir, model=str(path), target=TARGET, passes=["fold_batchnorm"], threads=2)
    before = {p: os.stat(os.path.join(work_dir, p)).st_mtime_ns for p in os.listdir(work_dir)}
    assert tt.main([work_dir, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert sum(r["trials"] for r in out["tasks"]) == tuned_job["sink"].trials
    assert out["journal_committed"] == 0  # the engine settled its journal when it ended
    assert {p: os.stat(os.path.join(work_dir, p)).st_mtime_ns for p in os.listdir(work_dir)} == before
    assert tt.main([work_dir]) == 0
    text = capsys.readouterr().out
    assert "still falling:" in text and all(t.name in text for t in tuned_job["tasks"])


@pytest.mark.slow
def test_a_killed_jobs_journal_counts_as_the_engine_would_commit_it(tuned_job, tmp_path, capsys):
    """A job killed before TVM's joins committed its batches: the journal holds what the sink was told."""
    from tuning.engine.workdir import DB_RECORDS, JOURNAL_SETTLED, STREAM_JOURNAL

    work_dir = tmp_path / "killed"
    shutil.copytree(tuned_job["work_dir"], work_dir)
    (work_dir / DB_RECORDS).write_text("")
    (work_dir / JOURNAL_SETTLED).unlink()  # written by an engine that ended, not by a killed one
    journaled = sum(1 for line in (work_dir / STREAM_JOURNAL).read_text().splitlines() if '"record"' in line)
    path = tmp_path / "tiny.onnx"
    path.write_bytes(tuned_job["model"].SerializeToString())
    assert tt.main([str(work_dir), "--json", "--model", str(path), "--target", json.dumps(TARGET)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["journal_committed"] == journaled > 0
    assert sum(r["trials"] for r in out["tasks"]) == journaled
    assert (work_dir / DB_RECORDS).read_text() == ""  # committed to the tool's copy only


def test_the_cli_says_what_it_lacks(tmp_path, capsys):
    with pytest.raises(SystemExit):
        tt.main([str(tmp_path)])
    assert "give --model/--target" in capsys.readouterr().err
