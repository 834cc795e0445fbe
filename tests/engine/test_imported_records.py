"""The engine reads checked imported records as (index of one of its own tasks, trace) lines and pairs each
trace with its own task module: a line naming no task of the run, or not parsing on its task, costs that
line only (logged), never the run."""

import json

from tuning.engine.workdir import IMPORTED_DIR, IMPORTED_RECORDS, has_imported, imported_records, write_imported
from tuning.engine.testing import matmul_primfunc, tuning_database
from tuning.engine.compile.pipeline import make_target
from tuning.engine.compile.workloads import collect_tasks


def test_lines_pair_with_the_runs_own_tasks_and_bad_ones_are_skipped(tmp_path, cpu_target, caplog):
    model = matmul_primfunc(64)
    tasks = collect_tasks(model, make_target(cpu_target))
    _, rec = tuning_database(model, cpu_target, n_records=2)
    traces = [json.loads(x)[1][0] for x in rec.decode().splitlines()]
    lines = [json.dumps([0, [traces[0], None, None, None]]),
             json.dumps([1, [traces[1], None, None, None]]),  # the run has one task
             json.dumps([True, [traces[1], None, None, None]]),  # a bool is not an index
             json.dumps([-1, [traces[1], None, None, None]]),
             json.dumps([0, [[[["GetSBlock", [], ["no_such_block", "main"], ["b0"]]], []], None, None, None]]),
             '[0, [[[], []], NaN, null, null]]', "not json",
             json.dumps([0, [traces[1], None, None, None]])]
    write_imported(str(tmp_path), lines)
    assert has_imported(str(tmp_path)) and (tmp_path / IMPORTED_DIR / IMPORTED_RECORDS).exists()
    got = imported_records(str(tmp_path), tasks)
    assert list(got) == [0] and len(got[0]) == 2
    assert all(r.workload.mod.same_as(tasks[0].mod) for r in got[0])  # the engine's own module, no imported graph
    assert sum("imported record line" in m for m in caplog.messages) == 6
    assert imported_records(str(tmp_path / "none"), tasks) == {0: []}  # nothing imported: nothing to measure
