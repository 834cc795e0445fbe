"""DOPpler's final serial re-measure is done once per run and charged once: a call that resumes a run
whose search was finished (its executor died in the final stage or during the final compile) reuses the
persisted rows instead of building and timing them again, and charges them only if the sink never took
the charge."""

import pytest

from tuning.engine.events import ListSink
from tuning.engine.workdir import FINAL_ROWS, load_final_rows
from tuning.engine.config import TuningConfig
from tuning.engine.session import run_tuning
from tuning.engine.testing import matmul_primfunc
from tuning.engine.measuring.timer import EvaluatorConfig

pytestmark = pytest.mark.slow


class SinkThatDiesAtTheCharge(ListSink):
    """The platform's store went away just when the final re-measure was to be charged."""

    def on_serial_remeasure(self, updates):
        raise RuntimeError("database unreachable")


def _cfg(cpu_target, work_dir):
    return TuningConfig(target=cpu_target, max_trials=8, trials_per_round=8, search_population=64,
                        genetic_num_iters=2, evaluator=EvaluatorConfig(number=3, repeat=1, min_repeat_ms=20),
                        seed=1, work_dir=str(work_dir))


def test_final_remeasure_is_reused_by_a_resumed_call_and_charged_once(tmp_path, cpu_target):
    model = matmul_primfunc(64)
    first = SinkThatDiesAtTheCharge()
    s1 = run_tuning(model, _cfg(cpu_target, tmp_path), first)
    assert s1.status == "succeeded" and s1.final_remeasure
    assert load_final_rows(str(tmp_path))["charged"] is False  # measured, not charged

    second = ListSink()  # the recovered run's engine
    s2 = run_tuning(model, _cfg(cpu_target, tmp_path), second)
    assert s2.trials_requested == 0 and second.records == []  # the budget was spent
    assert s2.final_remeasure == s1.final_remeasure  # the same rows: not built and timed again
    assert second.serial_remeasures == [(r["task_index"], r["candidate_key"], r["serial_latency_s"])
                                        for r in s1.final_remeasure]  # charged now, once
    assert load_final_rows(str(tmp_path))["charged"] is True

    third = ListSink()
    s3 = run_tuning(model, _cfg(cpu_target, tmp_path), third)
    assert s3.final_remeasure == s1.final_remeasure and third.serial_remeasures == []  # never twice
    assert (tmp_path / FINAL_ROWS).exists()
