"""Results reach the sink as each measurement lands, not at TVM's join: the production scheduler,
runner wrapper, progress thread and callback on a tiny workload."""

import threading

import pytest

from tuning.engine.runners import plugins
from tuning.engine.events import ListSink
from tuning.engine.config import TuningConfig
from tuning.engine.session import run_tuning
from tuning.engine.testing import tiny_cnn_onnx
from tuning.engine.measuring.timer import EvaluatorConfig

pytestmark = pytest.mark.slow

GATE_WAIT_S = 300  # a guard against a hang, not a timing assertion


class _EventSink(ListSink):
    """Keeps the order of events; opens ``first_results`` when a task's records arrive."""

    def __init__(self):
        super().__init__()
        self.events: list[tuple[str, int]] = []
        self.first_results = threading.Event()

    def on_measurements(self, records):
        super().on_measurements(records)
        with self._lock:
            self.events.extend(("measured", r.task_index) for r in records)
        self.first_results.set()

    def on_round(self, info):
        super().on_round(info)
        with self._lock:
            self.events.append(("joined", info.task_index))


def _register_wrapped_builder(name, on_build):
    """Register builder ``name``: the persistent builder, with ``on_build(call_number, build_inputs)``
    called first on every batch (its non-None answer replaces the build)."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import PyBuilder

    calls = {"n": 0}

    @derived_object
    class WrappedBuilder(PyBuilder):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def build(self, build_inputs):
            calls["n"] += 1
            answer = on_build(calls["n"], build_inputs)
            return self.inner.build(build_inputs) if answer is None else answer

        def shutdown(self):
            self.inner.shutdown()

    plugins.register_builder(name)(lambda ctx: WrappedBuilder(plugins.make_builder("persistent", ctx)))
    return calls


@pytest.fixture
def gated_builder():
    """The persistent builder, except that the second batch (the next task of the first round robin,
    while nothing has been joined) is built only once the sink has results of the first."""
    seen = {"opened_before_second_build": None}
    gate = {"sink": None}

    def on_build(n, _inputs):
        if n == 2:
            seen["opened_before_second_build"] = gate["sink"].first_results.wait(GATE_WAIT_S)

    _register_wrapped_builder("gated-test", on_build)
    yield seen, gate
    plugins._BUILDERS.pop("gated-test", None)


def test_results_reach_the_sink_before_any_join(tmp_path, cpu_target, gated_builder):
    seen, gate = gated_builder
    sink = gate["sink"] = _EventSink()
    cfg = TuningConfig(target=cpu_target, max_trials=16, trials_per_round=8, work_dir=str(tmp_path),
                       search_population=32, genetic_num_iters=1, seed=1, builder="gated-test",
                       evaluator=EvaluatorConfig(number=2, repeat=1, min_repeat_ms=5), final_remeasure=False)
    s = run_tuning(tiny_cnn_onnx(), cfg, sink)
    assert s.status == "succeeded"
    # the first task's results arrived while the second task was being built: before any join
    assert seen["opened_before_second_build"] is True
    first_join = next(i for i, e in enumerate(sink.events) if e[0] == "joined")
    assert ("measured", 0) in sink.events[:first_join]
    # each candidate reported once, whichever path reported it
    keys = [r.candidate_key for r in sink.records]
    assert len(keys) == len(set(keys)) == s.n_measurements >= 16
    assert s.n_measurements + s.n_duplicates == sum(r.n_candidates for r in sink.rounds)
    assert all(r.round_index >= 0 for r in sink.records)
    # what was in flight went to the sink, and nothing is left in flight at the end
    assert any(p.builds_in_flight > 0 for p in sink.progress)
    assert any(p.measurements_in_flight > 0 for p in sink.progress)
    last = sink.progress[-1]
    assert (last.builds_in_flight, last.measurements_in_flight) == (0, 0)


def _tiny_cfg(tmp_path, cpu_target, **kw):
    base = dict(target=cpu_target, max_trials=16, trials_per_round=8, work_dir=str(tmp_path),
                search_population=32, genetic_num_iters=1, seed=1,
                evaluator=EvaluatorConfig(number=2, repeat=1, min_repeat_ms=5), final_remeasure=False)
    base.update(kw)
    return TuningConfig(**base)


def test_results_streamed_before_a_kill_are_in_the_resumed_database(tmp_path, cpu_target, gated_builder):
    """A worker killed between the sink hearing of results and TVM's join committing them: the resumed
    call must know them (its budget is not spent on them again) and number its rounds after theirs."""
    import os

    from tuning.engine.workdir import DB_RECORDS, ROUNDS_FILE, STREAM_JOURNAL, next_round_offset

    _, gate = gated_builder
    sink = gate["sink"] = _EventSink()
    assert run_tuning(tiny_cnn_onnx(), _tiny_cfg(tmp_path, cpu_target, builder="gated-test"), sink).status == "succeeded"
    streamed = {r.candidate_key for r in sink.records[:sink.events.index(next(e for e in sink.events if e[0] == "joined"))]}
    assert streamed  # the gate guarantees results before the first join
    assert (tmp_path / STREAM_JOURNAL).exists()

    # the kill: TVM's database and the saved round offset never got written
    (tmp_path / DB_RECORDS).write_text("")
    os.remove(tmp_path / ROUNDS_FILE)
    offset = next_round_offset(str(tmp_path))
    assert offset > max(r.round_index for r in sink.records if r.candidate_key in streamed)

    again = ListSink()
    s2 = run_tuning(tiny_cnn_onnx(), _tiny_cfg(tmp_path, cpu_target, max_trials=16 + 8), again)
    assert s2.status == "succeeded"
    assert not {r.candidate_key for r in again.records} & streamed  # nothing the platform holds is measured again
    assert len(again.records) <= 16 + 8 - len(streamed)  # the budget counts what was streamed
    assert min(r.round_index for r in again.rounds) >= offset  # no round number reused


@pytest.fixture
def failing_second_build():
    """The persistent builder, except that every candidate of the second batch fails to build."""
    from tvm.s_tir.meta_schedule.builder import BuilderResult

    def on_build(n, inputs):
        return [BuilderResult(None, "injected build failure") for _ in inputs] if n == 2 else None

    yield _register_wrapped_builder("failing-test", on_build)
    plugins._BUILDERS.pop("failing-test", None)


def test_a_batch_whose_builds_all_failed_gets_a_round_of_its_own(tmp_path, cpu_target, failing_second_build):
    """The runner numbers rounds; a batch it never saw (no build succeeded) must not reuse one of its
    numbers (the platform keeps one row per round number: the later would overwrite the earlier)."""
    sink = ListSink()
    s = run_tuning(tiny_cnn_onnx(), _tiny_cfg(tmp_path, cpu_target, max_trials=24, builder="failing-test"), sink)
    assert s.status == "succeeded" and failing_second_build["n"] >= 3
    numbers = [r.round_index for r in sink.rounds]
    assert len(numbers) == len(set(numbers))  # one report per round, none shared
    assert all(r.round_index in set(numbers) for r in sink.records)  # every record in a reported round
    failed = [r for r in sink.records if r.error and "injected" in r.error]
    (failed_round,) = {r.round_index for r in failed}  # the one batch, all in one round
    info = next(r for r in sink.rounds if r.round_index == failed_round)
    assert info.n_candidates == info.n_failures == len(failed)


@pytest.fixture
def watched_runner():
    """The pooled runner under another name, so a test can ask whether it is measuring."""
    held = {}

    def make(ctx):
        held["runner"] = plugins.make_runner("pooled", ctx)
        return held["runner"]

    plugins.register_runner("watched-test", parallel=True)(make)
    yield held
    plugins._RUNNERS.pop("watched-test", None)
    plugins._PARALLEL_RUNNERS.discard("watched-test")


def test_no_task_is_searched_while_the_cpu_pool_measures(tmp_path, cpu_target, watched_runner):
    """TVM searches a task while the batches sent before it measure; on CPU slots that span the cores the
    search runs on, those timings read up to twice too slow (session._pace). So every batch
    after the first reaches the builder (right after its search) with nothing measuring, though
    measuring a batch (8 x >= 150 ms) outlasts searching the next one here."""
    busy_at_build = []

    def on_build(n, _inputs):
        if n >= 2:
            busy_at_build.append(not watched_runner["runner"].wait_idle(timeout=0))

    _register_wrapped_builder("watch-test", on_build)
    try:
        cfg = _tiny_cfg(tmp_path, cpu_target, max_trials=24, builder="watch-test", runner="watched-test",
                        evaluator=EvaluatorConfig(number=1, repeat=1, min_repeat_ms=150))
        s = run_tuning(tiny_cnn_onnx(), cfg)
    finally:
        plugins._BUILDERS.pop("watch-test", None)
    assert s.status == "succeeded"
    assert len(busy_at_build) >= 2 and not any(busy_at_build)
