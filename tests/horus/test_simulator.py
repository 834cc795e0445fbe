"""Simulator invariants and small exact cases."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from scheduling.horus.cluster import ClusterSpec, PlacementError
from scheduling.horus.policies import POLICIES, FifoExclusive, Horus, PlacementPolicy, make_policy
from scheduling.horus.simulator import (
    INTERFERENCE_MODELS,
    Interference,
    InterferenceModel,
    SharingPenalty,
    make_interference,
    simulate,
    simulate_fill,
)

from .helpers import job, random_jobs


SPEC = ClusterSpec.uniform(2, 4, gpu_mem_mb=16384.0)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_invariants_every_policy(name):
    jobs = random_jobs(300, 1)
    r = simulate(jobs, SPEC, make_policy(name), seed=3, record_jobs=True, check_invariants=True)
    assert r.n_jobs == 300 and r.dropped_jobs == 0 and r.unschedulable_jobs == 0
    sub, st, fin, dur = (np.array(r.jobs[k]) for k in ("submit", "start", "finish", "duration"))
    assert not np.isnan(fin).any()  # every job finishes
    assert (st >= sub - 1e-9).all() and (fin >= st + dur * (1 - 1e-9)).all()  # monotone times, no speed-up
    assert r.peak_mem_frac <= 1.0 + 1e-9  # no GPU ever over its memory
    assert r.makespan_s == pytest.approx(fin.max() - sub.min())
    assert 0 <= r.util_mean_pct <= 100 and 0 <= r.util_busy_pct <= 100
    json.dumps(r.to_dict())  # JSON-serialisable


def test_deterministic_per_seed():
    jobs = random_jobs(200, 2)
    for name in ("random_fit", "horus_migrate"):
        a = simulate(jobs, SPEC, make_policy(name), seed=5, predictor_error=0.3).to_dict()
        b = simulate(jobs, SPEC, make_policy(name), seed=5, predictor_error=0.3).to_dict()
        a.pop("wall_s"), b.pop("wall_s")
        assert a == b
    c = simulate(jobs, SPEC, make_policy("random_fit"), seed=6, predictor_error=0.3).to_dict()
    c.pop("wall_s")
    assert c != a or True  # different seeds may differ; same seed must not


def test_exclusive_queue_exact_times():
    spec = ClusterSpec.uniform(1, 1)
    jobs = [job("a", 0, 100), job("b", 10, 50), job("c", 20, 10)]
    r = simulate(jobs, spec, FifoExclusive(), record_jobs=True)
    assert r.jobs["start"] == [0, 100, 150]
    assert r.jobs["finish"] == [100, 150, 160]
    assert r.makespan_s == 160
    assert r.mean_wait_s == pytest.approx((0 + 90 + 130) / 3)
    assert r.util_mean_pct == pytest.approx(50.0)


def test_sharing_costs_20_percent():
    """The old flat model, named (it is no longer the default): +20 % while sharing."""
    spec = ClusterSpec.uniform(1, 1)
    jobs = [job("a", 0, 100, util=40), job("b", 0, 100, util=40)]
    r = simulate(jobs, spec, Horus(), record_jobs=True, interference=make_interference("share_penalty"))
    assert r.jobs["finish"] == pytest.approx([120, 120])
    assert r.shared_gpu_time_frac == pytest.approx(1.0)


def test_default_is_fitted_and_old_models_are_named_sensitivities():
    """The default is the fitted, work-conserving model; Horus's +20 % (``share_penalty``) and its
    time-shared variant (``capped``) give their old figures when named."""
    spec = ClusterSpec.uniform(1, 1)
    jobs = [job("a", 0, 100, util=80), job("b", 0, 100, util=80)]
    default = simulate(jobs, spec, Horus(), record_jobs=True)
    assert default.params["interference"]["model"] == "fitted"
    assert min(default.jobs["finish"]) >= 160 - 1e-9  # 2 x 80 % of work cannot finish before 1.6x
    assert default.util_mean_pct <= 100.0 + 1e-9
    paper = simulate(jobs, spec, Horus(), record_jobs=True, interference=make_interference("share_penalty"))
    assert paper.jobs["finish"] == pytest.approx([120, 120])
    capped = simulate(jobs, spec, Horus(), interference=Interference(oversub_exponent=1.0), record_jobs=True)
    assert capped.jobs["finish"] == pytest.approx([192, 192])  # 1.2 x 160/100
    assert capped.oversub_gpu_time_frac == pytest.approx(1.0)


def test_rates_change_when_a_neighbour_leaves():
    spec = ClusterSpec.uniform(1, 1)
    jobs = [job("a", 0, 60, util=40), job("b", 0, 120, util=40)]
    r = simulate(jobs, spec, Horus(), record_jobs=True, interference=make_interference("share_penalty"))
    # together at 1/1.2 until a finishes at 72 (60 units done by both), b then alone: 60 left
    assert r.jobs["finish"] == pytest.approx([72, 132])


def test_oom_is_caught_and_job_still_runs():
    spec = ClusterSpec.uniform(1, 1, gpu_mem_mb=16384.0)
    # b's memory is badly under-predicted: co-located with a it would not fit
    jobs = [job("a", 0, 1000, util=10, mem=9000), job("b", 1, 100, util=10, mem=9000, pred_mem=1000)]
    r = simulate(jobs, spec, Horus(), record_jobs=True, check_invariants=True, oom_penalty_s=30)
    assert r.oom_events == 1
    assert r.peak_mem_frac <= 1.0
    assert r.jobs["start"][1] == 1000  # retried, then waited for a (now known to need 9000 MB)
    assert not math.isnan(r.jobs["finish"][1])


def test_migration_happens_and_jobs_finish():
    spec = ClusterSpec.uniform(1, 2)
    # a and b predicted light but truly heavy, so Horus packs them on GPU 1; x's departure frees GPU 0
    # after telemetry has sampled them (60 s after they start)
    jobs = [job("x", 0, 200, util=10), job("a", 1, 5000, util=70, pred_util=20), job("b", 2, 5000, util=70, pred_util=20)]
    pol = make_policy("horus_migrate", min_runtime_s=0, admit_util_pct=None)
    r = simulate(jobs, spec, pol, record_jobs=True, check_invariants=True)
    assert r.migrations == 1
    assert not any(math.isnan(f) for f in r.jobs["finish"])
    # after the move both run alone: done well before 2 x 5000 x 1.2 x 1.4
    assert max(r.jobs["finish"]) < 5000 + 200 + 60 + 60 * 1.68 + 10


def test_bad_policy_is_rejected():
    class TwoForOne(PlacementPolicy):
        name = "bad"

        def place(self, job, cluster, now):
            return [0, 1]

    with pytest.raises(PlacementError, match="needs 1 GPUs"):
        simulate([job("a", 0, 10)], ClusterSpec.uniform(1, 2), TwoForOne())


def test_jobs_too_big_are_dropped_and_unplaceable_ones_do_not_hang():
    spec = ClusterSpec.uniform(1, 2)
    jobs = [job("a", 0, 10, num_gpus=4), job("b", 0, 10, mem=20000), job("c", 0, 10)]
    r = simulate(jobs, spec, FifoExclusive())
    assert r.dropped_jobs == 2 and r.n_jobs == 1

    class Never(PlacementPolicy):
        name = "never"

        def place(self, job, cluster, now):
            return None

    r = simulate([job("a", 0, 10), job("b", 5, 10)], spec, Never())
    assert r.unschedulable_jobs == 2


def test_backfill_lets_small_jobs_pass():
    spec = ClusterSpec.uniform(1, 2)
    jobs = [job("a", 0, 100), job("big", 1, 10, num_gpus=2), job("small", 2, 10)]
    strict = simulate(jobs, spec, FifoExclusive(), record_jobs=True)
    bf = simulate(jobs, spec, FifoExclusive(), record_jobs=True, backfill=4)
    assert strict.jobs["start"][2] == 110  # behind the 2-GPU job
    assert bf.jobs["start"][2] == 2


def test_predictor_error_changes_predictions_only():
    jobs = random_jobs(150, 4)
    a = simulate(jobs, SPEC, FifoExclusive(), predictor_error=0.0)
    b = simulate(jobs, SPEC, FifoExclusive(), predictor_error=1.0)
    assert a.makespan_s == b.makespan_s  # FIFO exclusive ignores predictions
    assert b.params["predictor_error"] == 1.0


def test_timeseries_downsampled():
    r = simulate(random_jobs(300, 5), SPEC, Horus(), timeseries_points=50)
    ts = r.timeseries
    assert len(ts["t_s"]) == 50 and len(ts["util_pct"]) == 50
    assert all(0 <= u <= 100 + 1e-9 for u in ts["util_pct"])
    assert np.average(ts["util_pct"]) == pytest.approx(r.util_mean_pct, rel=1e-6)


def test_fill_method(milli_spec):
    pods = [job(f"p{i}", 0, 1, util=float(u), mem=1000, milli=m, single_node=True)
            for i, (u, m) in enumerate([(20, 250), (40, 500), (80, 1000), (10, 100)])]
    for name in POLICIES:
        r = simulate_fill(pods, milli_spec, make_policy(name), seed=1, checkpoints=5)
        assert 0 < r.allocated_share <= 1.0
        assert r.placed + r.failed == r.submitted
        arrived = [c["arrived_share"] for c in r.curve]
        assert arrived == sorted(arrived) and len(r.curve) == 5
        json.dumps(r.to_dict())
    fifo = simulate_fill(pods, milli_spec, make_policy("fifo_exclusive"), seed=1)
    fgd = simulate_fill(pods, milli_spec, make_policy("fgd"), seed=1)
    assert fgd.allocated_share > fifo.allocated_share  # sharing beats one pod per GPU


class TimeSharing:
    """A work-conserving toy model: a GPU's jobs share it in proportion to their demand, so a GPU never
    delivers more than one GPU of standalone work (what a fitted model plugs in like)."""

    name = "time_sharing"

    def __init__(self):
        self.loads = []

    def slowdowns(self, load):
        self.loads.append(load)
        return [max(1.0, load.demand_pct / 100.0)] * len(load.job_ids)

    def describe(self):
        return {"model": self.name}


def test_interference_model_is_pluggable():
    spec = ClusterSpec.uniform(1, 1)
    jobs = [job("a", 0, 100, util=80), job("b", 0, 100, util=80)]
    model = TimeSharing()
    r = simulate(jobs, spec, Horus(), interference=model, record_jobs=True)
    assert r.jobs["finish"] == pytest.approx([160, 160])  # 2 x 80 % of work at 100 %: 1.6x, no sharing tax
    assert r.params["interference"] == {"model": "time_sharing"}
    shared = [ld for ld in model.loads if len(ld.job_ids) == 2]
    assert shared and shared[0].utils_pct == (80.0, 80.0) and shared[0].demand_pct == 160.0
    assert shared[0].gpu_model == "V100" and shared[0].mem_cap_mb == 16384.0


def test_named_interference_models():
    assert set(INTERFERENCE_MODELS) >= {"fitted", "share_penalty", "capped"}
    assert make_interference("share_penalty") == Interference() == SharingPenalty()
    assert make_interference("capped").describe() == {
        "model": "capped", "kind": "sensitivity (not physical, not work-conserving)", "share_penalty": 0.2,
        "util_slope": 0.0, "oversub_exponent": 1.0}
    fitted = make_interference("fitted").describe()
    assert fitted["model"] == "fitted" and fitted["kind"].startswith("physical") and "Gavel" in fitted["fitted_to"]
    assert isinstance(SharingPenalty(), InterferenceModel)
    assert isinstance(make_interference("fitted"), InterferenceModel)
    with pytest.raises(KeyError, match="unknown interference"):
        make_interference("nope")
