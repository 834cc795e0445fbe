"""bench/estimate_checkpoint.py: a finished job's records replayed to a checkpoint, the model compiled from
what was committed by then, and the checkpoint's gap carried to the end, on hand-made databases of tiny_cnn."""

import json

import pytest

from bench import estimate_checkpoint as ec
from bench import tuned_tasks as tt
from tuning.engine.compile import passes as gp
from tuning.engine.compile.pipeline import make_target
from tuning.engine.compile.workloads import collect_tasks
from tuning.engine.testing import tiny_cnn_onnx
from tuning.engine.workdir import open_json_db, records_in_commit_order

TARGET = {"kind": "llvm", "num-cores": 2}


@pytest.fixture(scope="module", autouse=True)
def v1_pipeline():
    with gp.use_passes(gp.SHIPPED_V1):
        yield


@pytest.fixture(scope="module")
def tiny_tasks(v1_pipeline):
    return collect_tasks(tiny_cnn_onnx(), make_target(TARGET))


def _commit(work_dir, task, latencies):
    """One record of ``task`` per latency (s; None: a failed run), each its own trace of the default
    schedule (an annotation apart), committed in this order."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.schedule import Schedule

    db = open_json_db(str(work_dir))
    workload = db.commit_workload(task.mod)
    for k, latency in enumerate(latencies):
        sch = Schedule(task.mod)
        sch.annotate(sch.get_sblock("root"), "test.order", f"{latency}-{k}")
        db.commit_tuning_record(ms.database.TuningRecord(
            sch.trace, workload, run_secs=[1e10 if latency is None else latency], target=make_target(TARGET),
            args_info=ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])))


@pytest.mark.parametrize("text, expected", [
    ("first_round", ["first_round"]),
    ("first_round, 0.25,0.5", ["first_round", 0.25, 0.5]),
])
def test_checkpoints_are_the_first_round_or_fractions(text, expected):
    assert ec.parse_at(text) == expected


@pytest.mark.parametrize("text", ["0", "1", "1.5", "-0.2", "last_round"])
def test_a_checkpoint_outside_the_run_is_refused(text):
    with pytest.raises(ValueError):
        ec.parse_at(text)


def test_the_first_round_ends_at_the_record_that_gives_the_last_task_a_valid_one(tmp_path, tiny_tasks):
    n = len(tiny_tasks)
    _commit(tmp_path, tiny_tasks[0], [3e-6, 2e-6])
    _commit(tmp_path, tiny_tasks[1], [None])  # a failed run is no record of a latency
    for task in tiny_tasks[1:]:
        _commit(tmp_path, task, [5e-6])
    _commit(tmp_path, tiny_tasks[0], [1e-6])
    records = records_in_commit_order(str(tmp_path), tiny_tasks)
    assert len(records) == n + 3
    assert ec.first_round_end(records, n) == n + 2
    assert ec.first_round_end(records[: n + 1], n) is None
    best = ec.best_by_task(records[: n + 2])
    assert best[0] == pytest.approx(2e-6) and best[1] == pytest.approx(5e-6)  # not yet the later 1 us
    assert ec.best_by_task(records)[0] == pytest.approx(1e-6)


@pytest.mark.slow
def test_each_checkpoint_compiles_what_was_committed_by_then_and_carries_its_gap(tmp_path, tiny_tasks, capsys):
    """Made-up latencies, real builds: the checkpoints' estimates are the made-up sums by then, their
    compiled latencies measured, and the end's estimate carried by the checkpoint's offset and ratio."""
    n = len(tiny_tasks)
    _commit(tmp_path, tiny_tasks[0], [40e-6])
    for task in tiny_tasks[1:]:
        _commit(tmp_path, task, [20e-6])
    for task in tiny_tasks:  # a second round, faster
        _commit(tmp_path, task, [10e-6])
    model = tmp_path / "tiny.onnx"
    model.write_bytes(tiny_cnn_onnx().SerializeToString())
    tt.write_job(str(tmp_path), model=str(model), target=TARGET, passes=list(gp.SHIPPED_V1), threads=2)
    out = tmp_path / "result.json"
    assert ec.main([str(tmp_path), "--at", "first_round,0.25,0.75", "--rounds", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    (job,) = result["jobs"]
    weights = [float(t.weight) for t in tiny_tasks]
    first, quarter, late = job["checkpoints"]
    assert first["records"] == n
    assert first["estimate_s"] == pytest.approx(40e-6 * weights[0] + 20e-6 * sum(weights[1:]))
    assert "skipped" in quarter  # a quarter of the records leaves tasks without one
    assert late["records"] == round(0.75 * 2 * n)
    end = job["end"]
    assert end["records"] == 2 * n and end["estimate_s"] == pytest.approx(10e-6 * sum(weights))
    for p in (first, late, end):
        assert p["compiled_s"] > 0 and len(p["compiled_samples_s"]) == 1
        assert p["compile_s"] > 0 and p["timing_s_a_round"] > 0  # what a checkpoint would cost a run
    assert first["added_estimate_s"] == pytest.approx(end["estimate_s"] + first["compiled_s"] - first["estimate_s"])
    assert first["scaled_estimate_s"] == pytest.approx(end["estimate_s"] * first["compiled_s"] / first["estimate_s"])
    assert first["added_gap"] == pytest.approx(abs(end["compiled_s"] - first["added_estimate_s"]) / end["compiled_s"])
    assert job["end_gap"] == pytest.approx(abs(end["compiled_s"] - end["estimate_s"]) / end["compiled_s"])
    overall = result["overall"]
    assert overall["estimate_vs_compiled"] == job["end_gap"]
    assert overall["estimate_vs_compiled_added_at_first_round"] == first["added_gap"]
    assert "estimate_vs_compiled_added_at_0.25" not in overall  # skipped: no figure
    assert "skipped" in capsys.readouterr().out
