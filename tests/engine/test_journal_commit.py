"""Results the engine streamed (its journal) but TVM's join never committed reach TVM's database also
when no later call on the work dir comes (issue 40: a run cancelled while its engine was stopped kept an
empty TVM database next to 9 stored results): ``session.commit_journal`` commits them, only those the
caller names when it names some, and never next to a live engine."""

import json

import pytest

from tuning.engine.compile.pipeline import make_target
from tuning.engine.compile.workloads import collect_tasks
from tuning.engine.events import candidate_key, canonical_trace_text
from tuning.engine.process.lifeline import WorkDirBusy, lock_work_dir
from tuning.engine.session import commit_journal, database_records
from tuning.engine.testing import design_space_database, tiny_cnn_onnx
from tuning.engine.workdir import STREAM_JOURNAL, journal_settled, journal_size, save_journal_settled


def write_journal(work_dir, model, target, task_index: int, n: int) -> list[tuple[int, str]]:
    """A journal of ``n`` streamed results of one task (MetaSchedule's own design-space traces), as the
    engine's StreamJournal writes it; returns their (task index, candidate key)."""
    name = collect_tasks(model, make_target(target))[task_index].name
    _, records = design_space_database(model, target, task_index=task_index, n_records=n)
    keys, lines = [], []
    for raw in records.decode().splitlines():
        body = json.loads(raw)[1]
        keys.append((task_index, candidate_key(name, canonical_trace_text(body[0]))))
        lines.append(json.dumps({"round": 0, "task": task_index, "record": body}) + "\n")
    with open(work_dir / STREAM_JOURNAL, "a") as f:
        f.write("".join(lines))
    return keys


def _in_tvm(work_dir, model, target) -> list[tuple[int, str]]:
    return [(r.task_index, r.candidate_key) for r in database_records(str(work_dir), model, target)]


def test_commit_journal_commits_only_what_it_is_told_once(tmp_path, cpu_target):
    model = tiny_cnn_onnx()
    assert commit_journal(str(tmp_path), model, cpu_target) == 0  # no journal: nothing, no TVM database
    keys = write_journal(tmp_path, model, cpu_target, task_index=0, n=3)
    assert len(set(keys)) == 3
    assert commit_journal(str(tmp_path), model, cpu_target, only=set(keys[:2])) == 2  # the stored ones
    assert sorted(_in_tvm(tmp_path, model, cpu_target)) == sorted(keys[:2])
    assert commit_journal(str(tmp_path), model, cpu_target, only=set(keys[:2])) == 0  # never twice
    assert commit_journal(str(tmp_path), model, cpu_target) == 1  # all: the last one too
    in_tvm = _in_tvm(tmp_path, model, cpu_target)
    assert sorted(in_tvm) == sorted(keys) and len(in_tvm) == len(set(in_tvm))


def test_commit_journal_never_writes_next_to_a_live_engine(tmp_path, cpu_target):
    model = tiny_cnn_onnx()
    write_journal(tmp_path, model, cpu_target, task_index=0, n=1)
    with lock_work_dir(str(tmp_path)):  # an engine works in the directory
        with pytest.raises(WorkDirBusy):
            commit_journal(str(tmp_path), model, cpu_target, wait_s=0.2)
    assert not (tmp_path / "database_tuning_record.json").exists()


def test_the_settled_marker_covers_the_journal_as_it_was_and_the_results_then_stored(tmp_path):
    """No TVM: a sweep reads it for every recently ended run."""
    assert journal_settled(str(tmp_path), stored=5)  # no journal: nothing to commit
    (tmp_path / STREAM_JOURNAL).write_text('{"round": 0}\n')
    assert not journal_settled(str(tmp_path), stored=0)  # a journal nobody settled
    save_journal_settled(str(tmp_path), journal_size(str(tmp_path)), 2)
    assert journal_settled(str(tmp_path), stored=2)
    assert not journal_settled(str(tmp_path), stored=3)  # a result stored since
    with open(tmp_path / STREAM_JOURNAL, "a") as f:
        f.write('{"round": 1}\n')
    assert not journal_settled(str(tmp_path), stored=2)  # the journal grew since
    save_journal_settled(str(tmp_path), journal_size(str(tmp_path)), None)  # the engine's clean end: all
    assert journal_settled(str(tmp_path), stored=99)
