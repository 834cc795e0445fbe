"""A layout-rewritten candidate keeps its key through TVM's database file.

RewriteLayout (the ``layout_rewrite`` pass's weights marked layout-free) annotates the block it adds with
``True``; TVM's database file writes that bool as ``1`` and its replay keeps ``1``. Keyed on the raw
trace, every layout record re-read from disk (a resumed call, the platform's reconcile, the final
re-measure of a later call) had another key than the one the sink and the journal gave it: on a kept
resnet18 work dir 959 of 1,025 records (all the layout-rewritten ones). A resumed call's journal commit
then added them again and its skip-known check let the search measure them again."""

import json
import threading
from types import SimpleNamespace

import pytest

from tuning.engine.compile import passes as gp
from tuning.engine.compile.pipeline import make_target
from tuning.engine.compile.workloads import collect_tasks
from tuning.engine.events import ListSink, candidate_key, canonical_trace_text, trace_json
from tuning.engine.testing import database_trace_lines, tiny_cnn_onnx
from tuning.engine.workdir import (
    DB_RECORDS,
    STREAM_JOURNAL,
    StreamJournal,
    commit_streamed,
    open_json_db,
    records_by_task,
)


@pytest.fixture(scope="module")
def layout_candidate(cpu_target):
    """(tasks, conv task index, a MeasureCandidate of that task whose trace carries RewriteLayout's
    annotation and TransformLayout), under the layout passes."""
    from tvm.s_tir import meta_schedule as ms

    target = make_target(cpu_target)
    with gp.use_passes(gp.LAYOUT):
        tasks = collect_tasks(tiny_cnn_onnx(), target)
    i = next(k for k, t in enumerate(tasks) if "conv2d" in t.name)
    ctx = ms.TuneContext(mod=tasks[i].mod, target=target, space_generator="post-order-apply", num_threads=1).clone()
    sch = ctx.space_generator.generate_design_space(ctx.mod)[0]
    for postproc in ctx.space_generator.postprocs:
        assert postproc.apply(sch), type(postproc).__name__
    text = trace_json(sch.trace)
    assert "TransformLayout" in text and "layout_rewrite_preproc" in text  # the layout path, or no test
    return tasks, i, ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_prim_func(tasks[i].mod["main"]))


def _joined_and_journaled(work_dir, tasks, i, cand, target) -> None:
    """What a call leaves when TVM's join committed the candidate (its database file holds it) after the
    engine journaled it."""
    from tvm.s_tir import meta_schedule as ms

    StreamJournal(str(work_dir), [t.mod for t in tasks]).record([(i, 0, cand, [1e-3])])
    db = open_json_db(str(work_dir))
    workload = db.commit_workload(tasks[i].mod)
    db.commit_tuning_record(
        ms.database.TuningRecord(cand.sch.trace, workload, run_secs=[1e-3], target=target, args_info=cand.args_info)
    )


def _reread(work_dir, tasks) -> list[tuple[int, object]]:
    """The records of the work dir's database file, read by a fresh TVM database (a later call)."""
    return [(i, r) for i, recs in records_by_task(open_json_db(str(work_dir)), tasks).items() for r in recs]


def test_the_key_is_the_same_live_in_the_journal_and_read_back_from_tvms_file(
    layout_candidate, cpu_target, tmp_path
):
    tasks, i, cand = layout_candidate
    _joined_and_journaled(tmp_path, tasks, i, cand, make_target(cpu_target))
    live = candidate_key(tasks[i].name, cand.sch.trace)
    ((j, rec),) = _reread(tmp_path, tasks)
    assert j == i and "TransformLayout" in trace_json(rec.trace)
    assert candidate_key(tasks[i].name, rec.trace) == live
    (line,) = [json.loads(x) for x in (tmp_path / STREAM_JOURNAL).read_text().splitlines()]
    assert candidate_key(tasks[i].name, canonical_trace_text(line["record"][0])) == live


def test_a_resumed_calls_journal_commit_adds_no_duplicate(layout_candidate, cpu_target, tmp_path):
    tasks, i, cand = layout_candidate
    target = make_target(cpu_target)
    _joined_and_journaled(tmp_path, tasks, i, cand, target)
    assert commit_streamed(str(tmp_path), open_json_db(str(tmp_path)), tasks, target) == 0
    assert len((tmp_path / DB_RECORDS).read_text().splitlines()) == 1


def test_skip_known_drops_a_layout_candidate_the_database_file_holds(layout_candidate, cpu_target, tmp_path):
    """The resumed call's known keys are made from its database as read from disk (session._prepare);
    the search proposes the live trace again."""
    from tuning.engine.search.skip_known import SkipKnownSearch

    tasks, i, cand = layout_candidate
    _joined_and_journaled(tmp_path, tasks, i, cand, make_target(cpu_target))
    known = {candidate_key(tasks[j].name, r.trace) for j, r in _reread(tmp_path, tasks)}

    class ProposesTheKnownOne:
        def generate_measure_candidates(self):
            return [cand]

    state = SimpleNamespace(lock=threading.Lock(), known_keys=known, exhausted=set(), trimmer=None, sink_errors=[])
    search = SkipKnownSearch(ProposesTheKnownOne(), task_index=i, task_name=tasks[i].name, state=state)
    assert search.generate_measure_candidates() is None  # only known traces, every ask: nothing to measure


def _cfg(cpu_target, work_dir, max_trials):
    from tuning.engine.config import TuningConfig
    from tuning.engine.measuring.timer import EvaluatorConfig

    # four trials a round: the first call's budget reaches each of the six layout tasks (the convs included)
    return TuningConfig(target=cpu_target, max_trials=max_trials, trials_per_round=4, search_population=32,
                        genetic_num_iters=1, evaluator=EvaluatorConfig(number=2, repeat=1, min_repeat_ms=1),
                        seed=1, work_dir=str(work_dir), final_remeasure=False)



@pytest.mark.slow
def test_a_tuned_layout_run_keys_its_records_as_its_database_file_does_and_resumes_cleanly(cpu_target, tmp_path):
    from tuning.engine.session import run_tuning

    model = tiny_cnn_onnx()
    with gp.use_passes(gp.LAYOUT):
        tasks = collect_tasks(model, make_target(cpu_target))
        first = ListSink()
        s1 = run_tuning(model, _cfg(cpu_target, tmp_path, 24), first)
        assert s1.status == "succeeded" and first.records
        reread = _reread(tmp_path, tasks)
        assert any("TransformLayout" in trace_json(r.trace) for _, r in reread)  # layout records, or no test
        assert {(r.task_index, r.candidate_key) for r in first.records} == {
            (j, candidate_key(tasks[j].name, r.trace)) for j, r in reread
        }

        second = ListSink()  # a resumed call: its search proposes what the first measured again
        s2 = run_tuning(model, _cfg(cpu_target, tmp_path, 48), second)
    assert s2.status == "succeeded" and s2.n_duplicates == 0
    lines = database_trace_lines(tmp_path)
    assert len(lines) == len(set(lines)) == s2.n_total_records, "a record is in TVM's database twice"
    keys = [r.candidate_key for r in first.records + second.records]
    assert len(keys) == len(set(keys))
