"""Through the executor (``manage.py tune``, in-process): a successful run publishes its serially
re-measured records; the next run of a model sharing its workloads looks them up, is seeded, and its
lookups, verdicts and savings are stored and served (opt-outs: test_services.py)."""
from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command

from recordcache.models import CacheEntry, CacheLookup
from tuning.models import TuningRun

from .cachedata import opt_in

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def _tune(model) -> TuningRun:
    out = io.StringIO()
    call_command("tune", str(model.pk), "--trials", "8", "--trials-per-round", "8", "--threads", "1",
                 "--target", '{"kind": "llvm", "num-cores": 1}', "--population", "16", "--seed", "1", "--json",
                 "--no-progress", stdout=out, stderr=io.StringIO())
    run = TuningRun.objects.get(pk=json.loads(out.getvalue())["run"])
    assert run.status == "succeeded", run.error
    return run


def test_a_run_publishes_and_the_next_one_is_seeded_and_served(model_a, user_owner, api_owner):
    opt_in(model_a.team)  # publishing is opt-in
    first = _tune(model_a)
    entries = CacheEntry.objects.filter(source_run=first)
    assert entries.exists() and all(e.status == "trusted" and e.run_secs and e.latency_s > 1e-7 for e in entries)
    # keyed by the run's canonical target, the graph-pass pipeline that made its tasks and its timing (a CPU
    # run: cold)
    assert first.pipeline_key and first.evaluator["regime"] == "cold"
    assert {e.target_key for e in entries} == {f"{first.target_key}|pipeline={first.pipeline_key}|timing=cold"}
    second = _tune(model_a)
    lookups = list(CacheLookup.objects.filter(run=second).order_by("task_index"))
    assert lookups and any(c.hit for c in lookups)
    assert all(c.source_run_id == first.pk and c.verification in ("verified", "stale") for c in lookups if c.hit)
    body = api_owner.get(f"/api/runs/{second.pk}/record-cache/").json()
    assert len(body["tasks"]) == len(lookups) and body["savings"]["basis"].startswith("estimated")
    assert all(t["source_run"] == first.pk for t in body["tasks"] if t["hit"])  # the team's own run: named
    # the cost models the runs saved and the cache handed on are data only (XGBoost JSON, plain arrays)
    from recordcache.adapters import run_work_dir
    from recordcache.models import CostModelFile
    from tuning.engine.records.cost_model_file import check_cost_model_file

    assert check_cost_model_file(CostModelFile.objects.get().file.path) > 0
    assert check_cost_model_file(str(run_work_dir(first.pk) / "cost_model.xgb")) > 0

