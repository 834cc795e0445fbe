"""Imported records are search seeds only: the engine builds and measures them itself before they
count, so an imported latency (1e-9 s) never becomes the run's best; final re-measures are reported
for charging."""

import json
import os

import pytest

from tuning.engine.workdir import open_json_db
from tuning.engine.events import ListSink
from tuning.engine.workdir import DB_RECORDS, IMPORTED_DONE_DIR, has_imported, write_imported
from tuning.engine.config import TuningConfig
from tuning.engine.session import run_tuning
from tuning.engine.testing import matmul_primfunc, tuning_database
from tuning.engine.measuring.timer import EvaluatorConfig

pytestmark = pytest.mark.slow

FAST = EvaluatorConfig(number=3, repeat=1, min_repeat_ms=20)


def test_imported_one_nanosecond_is_measured_by_the_platform_not_believed(tmp_path, cpu_target):
    model = matmul_primfunc(64)
    wl, rec = tuning_database(model, cpu_target, run_secs=(1e-9,), n_records=2)
    write_imported(str(tmp_path), rec.decode().strip().splitlines())  # task 0: [0, record] lines
    sink = ListSink()
    cfg = TuningConfig(target=cpu_target, max_trials=4, trials_per_round=2, work_dir=str(tmp_path), seed=1,
                       search_population=16, genetic_num_iters=1, evaluator=FAST)
    s = run_tuning(model, cfg, sink)
    assert s.status == "succeeded"
    # both imported candidates were measured here, as trials of the run (and charged as such)
    imported = [r for r in sink.records if r.round_index == 0]
    assert len(imported) == 2 and all(r.worker and r.run_secs for r in imported)
    assert all(min(r.run_secs) > 1e-7 for r in sink.records)
    assert s.best_latency_s > 1e-7 and s.tasks[0].best_latency_s > 1e-7
    assert len(sink.records) == 4  # imports spend the budget: 2 imported + 2 searched
    db = open_json_db(str(tmp_path))
    assert all(min(float(x) for x in r.run_secs) > 1e-7 for r in db.get_all_tuning_records())
    assert not has_imported(str(tmp_path)) and os.path.isdir(tmp_path / IMPORTED_DONE_DIR)
    # final re-measures (DOPpler) are reported to the sink, one per candidate built again
    assert len(sink.serial_remeasures) == len(s.final_remeasure) >= 1
    final = [json.loads(x) for x in (tmp_path / "final" / DB_RECORDS).read_text().splitlines()]
    assert all(min(r[1][1]) > 1e-7 for r in final)
