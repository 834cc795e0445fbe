"""A call that resumes a run never measures again what the run's TVM database or its streamed journal
holds (issue 40: a resumed search proposed the traces an earlier call measured, and TVM committed each
a second time; a one-schedule task was measured once per call), and its budget is a hard cap."""

import json

import pytest

from tuning.engine.config import TuningConfig
from tuning.engine.events import ListSink
from tuning.engine.measuring.timer import EvaluatorConfig
from tuning.engine.search.skip_known import CallBudget, new_candidates
from tuning.engine.session import run_tuning
from tuning.engine.testing import database_trace_lines, tiny_cnn_onnx
from tuning.engine.workdir import DB_RECORDS, STREAM_JOURNAL, load_exhausted

RESHAPE = 1  # tiny_cnn's task 1: a reshape, whose design space is one schedule with no decisions


def test_known_and_repeated_candidates_are_dropped_in_order():
    assert new_candidates(["a", "b", "c", "d"], ["k1", "k2", "k1", "k3"], {"k2"}) == ["a", "d"]
    assert new_candidates(["a"], ["k1"], {"k1"}) == []


def test_the_call_budget_is_shared_and_never_overdrawn():
    budget = CallBudget(5)
    assert [budget.take(3), budget.take(3), budget.take(3)] == [3, 2, 0]
    assert budget.left == 0


def _cfg(cpu_target, work_dir, max_trials):
    return TuningConfig(target=cpu_target, max_trials=max_trials, trials_per_round=8, search_population=32,
                        genetic_num_iters=1, evaluator=EvaluatorConfig(number=2, repeat=1, min_repeat_ms=1),
                        seed=1, work_dir=str(work_dir), final_remeasure=False)



def _move_to_journal(work_dir, target, n: int) -> None:
    """What a killed call leaves: ``n`` of its results reported (journaled) but never committed by TVM.
    The database is written again without them, with TVM's own API."""
    from tvm.s_tir import meta_schedule as ms

    from tuning.engine.compile.pipeline import make_target
    from tuning.engine.compile.workloads import collect_tasks
    from tuning.engine.events import record_json
    from tuning.engine.workdir import DB_WORKLOAD, open_json_db, records_by_task

    tgt = make_target(target)
    tasks = collect_tasks(tiny_cnn_onnx(), tgt)
    records = [(i, r) for i, recs in records_by_task(open_json_db(str(work_dir)), tasks).items() for r in recs]
    records.sort(key=lambda x: x[0] == RESHAPE)  # the one-schedule task stays in the database
    (work_dir / DB_RECORDS).unlink()
    (work_dir / DB_WORKLOAD).unlink()
    db, journal = open_json_db(str(work_dir)), []
    for n_done, (i, rec) in enumerate(records):
        workload = db.commit_workload(tasks[i].mod)
        copy = ms.database.TuningRecord(rec.trace, workload, run_secs=rec.run_secs, target=tgt,
                                        args_info=rec.args_info)
        if n_done < n:
            journal.append(json.dumps({"round": 1, "task": i, "record": record_json(copy)}) + "\n")
        else:
            db.commit_tuning_record(copy)
    with open(work_dir / STREAM_JOURNAL, "a") as f:
        f.write("".join(journal))


@pytest.mark.slow
def test_a_resumed_call_measures_nothing_twice_and_stays_within_its_budget(tmp_path, cpu_target):
    model = tiny_cnn_onnx()
    first = ListSink()
    s1 = run_tuning(model, _cfg(cpu_target, tmp_path, 16), first)
    assert s1.status == "succeeded" and s1.n_total_records == 16
    assert s1.tasks[RESHAPE].n_records == 1
    _move_to_journal(tmp_path, cpu_target, 4)  # the database lags the journal, as after a kill before TVM's join

    second = ListSink()
    s2 = run_tuning(model, _cfg(cpu_target, tmp_path, 32), second)
    assert s2.status == "succeeded"
    assert s2.trials_requested == 16  # the journal's records count as spent
    lines = database_trace_lines(tmp_path)
    assert len(lines) == len(set(lines)), "a record is in TVM's database twice"
    assert len(lines) == s2.n_total_records <= 32  # a hard cap, not budget + a round
    assert len(second.records) == s2.n_total_records - 16 and s2.n_duplicates == 0  # nothing measured again
    keys = [r.candidate_key for r in first.records + second.records]
    assert len(keys) == len(set(keys))
    # the one-schedule task is done, not measured once per call
    assert s2.tasks[RESHAPE].n_records == 1
    assert RESHAPE in load_exhausted(str(tmp_path))


def test_candidates_the_filter_kept_but_the_call_dropped_are_told_to_trimmer():
    """Trimmer's filter counts what it keeps as sent; the candidates this wrapper then drops (measured
    already, or past the call's budget) are reported back, so generated = filtered + not sent + measured."""
    import threading
    from types import SimpleNamespace

    from tuning.engine.search.skip_known import SkipKnownSearch
    from tuning.engine.trimmer.hooks import TrimmerRuntime
    from tuning.engine.trimmer.rules import TrimmerConfig
    from tuning.engine.events import TaskInfo

    runtime = TrimmerRuntime(TrimmerConfig(), [TaskInfo(0, "t0", 1e6, 1.0)], max_trials=100)

    class FilterStandIn:  # the part of FilteredSearch the wrapper sees: a batch noted with the run's Trimmer
        def generate_measure_candidates(self):
            runtime.note_generated(0, 12, 8)  # 4 kept
            return [SimpleNamespace(sch=SimpleNamespace(trace=k)) for k in ("a", "b", "c", "d")]

    state = SimpleNamespace(lock=threading.Lock(), known_keys={"b"}, exhausted=set(), trimmer=runtime)
    search = SkipKnownSearch(FilterStandIn(), task_index=0, task_name="t0", state=state, budget=CallBudget(2),
                             key=lambda name, trace: trace)
    sent = search._inst.generate_measure_candidates()  # the Python side (the FFI wants real candidates)
    assert [c.sch.trace for c in sent] == ["a", "c"]  # "b" measured already, "d" over the budget
    assert runtime.observe_batch(0, [1e-3, 2e-3], round_index=0) == (12, 8, 2)
    assert runtime.budget.outstanding[0] == 0
