"""A task whose search had nothing new to measure (its space ran out) is known as exhausted with
Trimmer off too, across calls, and a record-cache entry published from it says its search converged
(a one-schedule reshape was published as "not converged" when the run had no Trimmer state)."""

from tuning.engine.search.callbacks import StreamingMeasureCallback
from tuning.engine.search.engine_state import EngineState
from tuning.engine.workdir import load_exhausted, save_exhausted
from tuning.engine.events import TaskInfo


def test_an_empty_batch_marks_its_task_exhausted_without_trimmer():
    state = EngineState(None, [TaskInfo(0, "matmul", 1.0, 1.0), TaskInfo(1, "reshape", 0.0, 1.0)])
    assert state.trimmer is None
    # what TVM's join hands the callback (its Python side) when the task's search had nothing new
    StreamingMeasureCallback(state)._inst.apply(None, 1, [], [], [])
    assert state.exhausted == {1}


def test_exhausted_tasks_survive_a_resumed_call(tmp_path):
    save_exhausted(str(tmp_path), {1})
    save_exhausted(str(tmp_path), set())  # a later call that exhausted nothing keeps the earlier call's
    save_exhausted(str(tmp_path), {3})
    assert load_exhausted(str(tmp_path)) == {1, 3}
    (tmp_path / "exhausted_tasks.json").write_text("{not json")
    assert load_exhausted(str(tmp_path)) == set()  # unreadable: nothing claimed converged
