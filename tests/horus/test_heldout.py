"""Held-out evaluation: the observation model, the split interference fit, Tiresias LAS, slice selection
and the per-job metrics (scheduling/horus/{observation,heldout}.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scheduling.horus import simulator as hsim
from scheduling.horus.cluster import ClusterSpec
from scheduling.horus.heldout import (DEV_SLICE, HeldoutCell, finish_time_fairness, heldout_slices, job_metrics,
                                      run_cell, t_interval)
from scheduling.horus.interference import (FittedInterference, load_pairs, scaled_interference, split_pairs)
from scheduling.horus.observation import ObservationModel, device_share, observe, per_process_util
from scheduling.horus.policies import FifoExclusive, PlacementPolicy, TiresiasLAS
from scheduling.horus.replay import Replay, summarize
from scheduling.horus.usage_fgd import UsageFGD, job_speeds

from .helpers import job, random_jobs


# ------------------------------------------------------------------------------------------ observation
def test_per_process_sample_is_the_jobs_own_residency():
    model = ObservationModel(lag_s=0.0, level="process")
    assert observe(model, 40.0, [[40.0, 70.0]]) == 40.0
    assert per_process_util(50.0, 1.0) == 50.0
    assert per_process_util(50.0, 2.0) == pytest.approx(75.0)  # 1 - 0.5/2


def test_device_level_splits_the_capped_counter_evenly():
    model = ObservationModel(lag_s=0.0, level="device")
    assert device_share([30.0, 50.0]) == pytest.approx(40.0)
    assert device_share([60.0, 60.0, 60.0]) == pytest.approx(100.0 / 3)  # the counter stops at 100 %
    assert observe(model, 30.0, [[30.0, 50.0]]) == pytest.approx(40.0)
    # a job on two GPUs: the mean of its shares on each
    assert observe(model, 30.0, [[30.0, 50.0], [30.0]]) == pytest.approx(35.0)


def test_noise_is_scaled_and_clipped():
    model = ObservationModel(lag_s=0.0, noise_pct=5.0)
    assert observe(model, 40.0, [], noise_draw=1.0) == pytest.approx(45.0)
    assert observe(model, 2.0, [], noise_draw=-1.0) == 0.0
    assert observe(model, 98.0, [], noise_draw=1.0) == 100.0


@pytest.mark.parametrize("kwargs", [{"lag_s": -1.0}, {"noise_pct": -0.1}, {"level": "kernel"},
                                    {"lag_s": float("nan")}])
def test_bad_observation_model_is_refused(kwargs):
    with pytest.raises(ValueError):
        ObservationModel(**kwargs)


class _Recorder(PlacementPolicy):
    """Puts every job on GPU 0 and records what it saw of the jobs already there."""

    name = "recorder"
    shares_gpus = True

    def __init__(self):
        self.seen: list[tuple[float, tuple[float, ...]]] = []

    def place(self, job, cluster, now):
        self.seen.append((now, cluster.meas_utils_on(0)))
        return [0]


def _one_gpu() -> ClusterSpec:
    return ClusterSpec.uniform(1, 1, gpu_model="V100", gpu_mem_mb=32768.0)


def _observed(observation: ObservationModel, jobs, seed: int = 0) -> list[tuple[float, tuple[float, ...]]]:
    policy = _Recorder()
    Replay(jobs, _one_gpu(), policy, seed=seed, observation=observation, check_invariants=True).run()
    return policy.seen


def _three_jobs():
    return [job("a", 0.0, 5000.0, util=50.0, pred_util=20.0), job("b", 30.0, 5000.0, util=50.0),
            job("c", 200.0, 100.0, util=10.0)]


def test_lag_shows_the_prediction_until_the_first_sample():
    seen = _observed(ObservationModel(lag_s=60.0), _three_jobs())
    assert seen[1] == (30.0, (20.0,))  # b arrives before a's first sample: a's prediction
    # c arrives after the samples that followed b's arrival: a and b as per-process telemetry, slowed
    t, utils = seen[2]
    assert t == 200.0 and len(utils) == 2
    speeds = FittedInterference.from_data().speeds([0.5, 0.5], gpu_type="V100")
    assert utils == pytest.approx(tuple(per_process_util(50.0, 1.0 / s) for s in speeds))


def test_zero_lag_is_instant_truth_of_a_lone_job():
    seen = _observed(ObservationModel(lag_s=0.0), _three_jobs())
    assert seen[1] == (30.0, (50.0,))


def test_device_level_in_the_replay_gives_every_job_the_same_share():
    seen = _observed(ObservationModel(lag_s=0.0, level="device"), _three_jobs())
    _, utils = seen[2]
    speeds = FittedInterference.from_data().speeds([0.5, 0.5], gpu_type="V100")
    per_process = [per_process_util(50.0, 1.0 / s) for s in speeds]
    assert utils == pytest.approx((min(100.0, sum(per_process)) / 2,) * 2)


def test_noise_is_seeded():
    obs = ObservationModel(lag_s=0.0, noise_pct=5.0)
    first, again = _observed(obs, _three_jobs(), seed=3), _observed(obs, _three_jobs(), seed=3)
    assert first == again
    assert first[1][1] != (50.0,)  # the lone job's sample is noisy, not the truth


def test_replay_with_noisy_device_telemetry_keeps_invariants(small_spec):
    jobs = random_jobs(40, 5)
    res = summarize(Replay(jobs, small_spec, UsageFGD(), seed=1, check_invariants=True,
                           observation=ObservationModel(lag_s=30.0, noise_pct=10.0, level="device")).run(), wall_s=0.0)
    assert res.unschedulable_jobs + res.dropped_jobs < len(jobs)
    assert res.params["observation"] == {"lag_s": 30.0, "noise_pct": 10.0, "level": "device"}


# ------------------------------------------------------------------------------------------ split fit
def test_split_halves_are_disjoint_and_cover_the_pairs():
    pairs = load_pairs()["v100"]
    a, b = split_pairs(pairs, seed=0)
    rows_a = {(int(x), int(y)) for x, y in zip(a.a, a.b)}
    rows_b = {(int(x), int(y)) for x, y in zip(b.a, b.b)}
    assert rows_a.isdisjoint(rows_b)
    assert rows_a | rows_b == {(int(x), int(y)) for x, y in zip(pairs.a, pairs.b)}
    assert abs(len(rows_a) - len(rows_b)) <= 1
    a2, _ = split_pairs(pairs, seed=0)
    assert np.array_equal(a.a, a2.a) and np.array_equal(a.speeds, a2.speeds)  # deterministic
    a3, _ = split_pairs(pairs, seed=1)
    assert {(int(x), int(y)) for x, y in zip(a3.a, a3.b)} != rows_a


def test_policy_reads_its_own_model_not_the_simulators():
    shipped = FittedInterference.from_data()
    harsher = scaled_interference(shipped, 1.5)
    assert harsher.params["v100"].interference == pytest.approx(1.5 * shipped.params["v100"].interference)
    assert UsageFGD(interference=harsher).interference is harsher
    assert UsageFGD().interference.params == shipped.params
    assert job_speeds((60.0, 60.0), "V100", harsher)[0] < job_speeds((60.0, 60.0), "V100")[0]
    with pytest.raises(ValueError):
        scaled_interference(shipped, 0.0)


# ------------------------------------------------------------------------------------------ LAS
def _run(jobs, policy, **kw):
    return hsim.simulate(jobs, _one_gpu(), policy, record_jobs=True, check_invariants=True, **kw)


def test_las_demotes_and_preempts_in_attained_service_order():
    jobs = [job("a", 0.0, 10_000.0), job("b", 100.0, 500.0), job("c", 5000.0, 100.0)]
    res = _run(jobs, TiresiasLAS(threshold_gpu_s=3600.0), migration_cost_s=60.0)
    fin = dict(zip(res.jobs["id"], res.jobs["finish"]))
    start = dict(zip(res.jobs["id"], res.jobs["start"]))
    # b waits while a is in the high queue too (FIFO within a level); a drops at 3600 GPU-s and b preempts it
    assert start["b"] == pytest.approx(3600.0) and fin["b"] == pytest.approx(4100.0)
    # a resumes at 4100 (+60 s restore); c arrives at 5000 in the high queue and preempts a again
    assert start["c"] == pytest.approx(5000.0) and fin["c"] == pytest.approx(5100.0)
    remaining_at_5000 = 10_000.0 - 3600.0 + 60.0 - 900.0
    assert fin["a"] == pytest.approx(5100.0 + remaining_at_5000 + 60.0)
    assert res.preemptions == 2
    fifo = _run(jobs, FifoExclusive())
    assert dict(zip(fifo.jobs["id"], fifo.jobs["finish"]))["b"] == pytest.approx(10_500.0)


def test_las_counts_gpus_times_time_for_gangs():
    las = TiresiasLAS(threshold_gpu_s=3600.0)
    assert las.service_level(3599.0) == 0 and las.service_level(3600.0) == 1
    assert las.demotion_after(0.0, 4) == pytest.approx(900.0)
    assert las.demotion_after(4000.0, 1) is None


def test_las_replay_finishes_every_job_with_invariants(small_spec):
    jobs = random_jobs(60, 11)
    res = hsim.simulate(jobs, small_spec, TiresiasLAS(threshold_gpu_s=500.0), record_jobs=True, check_invariants=True)
    assert res.dropped_jobs == 0 and res.unschedulable_jobs == 0
    run = np.array(res.jobs["finish"]) - np.array(res.jobs["start"])
    assert np.all(run >= np.array(res.jobs["duration"]) - 1e-6)
    assert res.preemptions > 0


# ------------------------------------------------------------------------------------------ slices
def test_heldout_slices_are_fixed_disjoint_and_off_the_development_slice():
    got = heldout_slices(82_247, 10_000)
    assert got == [(20_000, 30_000), (40_000, 50_000), (60_000, 70_000)]
    assert got == heldout_slices(82_247, 10_000)
    for s, e in got:
        assert e <= DEV_SLICE[0] or s >= DEV_SLICE[1]
    with pytest.raises(ValueError, match="development"):
        heldout_slices(82_247, 1000, offsets=(5000, 40_000))
    with pytest.raises(ValueError, match="overlap"):
        heldout_slices(200_000, 25_000)
    with pytest.raises(ValueError, match="outside"):
        heldout_slices(65_000, 10_000)


def test_heldout_slices_pick_disjoint_jobs_of_the_trace():
    from scheduling.horus.experiments import ExperimentParams, _slice, build_cluster, load_jobs

    kind, jobs = load_jobs("philly")
    gpu_jobs = [j for j in jobs if j.num_gpus > 0]
    seen: set[str] = set()
    for s, e in [DEV_SLICE] + heldout_slices(len(gpu_jobs), 2000):
        p = ExperimentParams(jobs=e - s, start=s, gpus=64).validate(kind)
        ids = {j.job_id for j in _slice(gpu_jobs, p, build_cluster(kind, p))[0]}
        assert len(ids) == e - s and ids.isdisjoint(seen)
        seen |= ids


# ------------------------------------------------------------------------------------------ metrics
def _four_in_a_row():
    return [job(f"j{k}", 0.0, 100.0) for k in range(4)]


def test_jct_slowdown_percentiles_on_a_hand_made_replay():
    res = _run(_four_in_a_row(), FifoExclusive())
    m = job_metrics(res.jobs["submit"], res.jobs["start"], res.jobs["finish"], res.jobs["duration"], [1] * 4, 1)
    # FIFO on one GPU: finishes at 100, 200, 300, 400
    assert m["mean_jct_s"] == pytest.approx(250.0)
    assert m["p95_jct_s"] == pytest.approx(385.0)  # linear interpolation: 300 + 0.85 x 100
    assert m["p99_jct_s"] == pytest.approx(397.0)
    assert m["mean_slowdown"] == pytest.approx(2.5) and m["p95_slowdown"] == pytest.approx(3.85)
    assert m["mean_run_stretch"] == pytest.approx(1.0)
    assert m["p95_run_stretch"] == m["p99_run_stretch"] == pytest.approx(1.0)  # one at a time: no interference
    assert m["makespan_s"] == pytest.approx(400.0)


def test_run_stretch_tail_shows_the_jobs_slowed_by_sharing():
    from scheduling.horus.policies import make_policy

    # three jobs on one GPU: gandiva packs them and the two heavy ones slow each other
    jobs = [job("a", 0.0, 100.0, util=95.0), job("b", 0.0, 100.0, util=95.0), job("c", 0.0, 100.0, util=5.0)]
    res = _run(jobs, make_policy("gandiva"))
    m = job_metrics(res.jobs["submit"], res.jobs["start"], res.jobs["finish"], res.jobs["duration"], [1] * 3, 1)
    assert m["p99_run_stretch"] >= m["p95_run_stretch"] >= m["mean_run_stretch"] > 1.0


def test_finish_time_fairness_by_hand():
    # four one-GPU jobs of 100 s on one GPU, all submitted at 0, finishing at 100..400: the GPUs asked for
    # over one GPU are 4, 3, 2, 1 in the four 100 s steps
    rho = finish_time_fairness(np.zeros(4), np.array([100.0, 200.0, 300.0, 400.0]), np.full(4, 100.0),
                               np.ones(4), 1)
    assert rho == pytest.approx([100 / (100 * 4), 200 / (100 * 3.5), 300 / (100 * 3.0), 400 / (100 * 2.5)])
    # alone on a big cluster the factor is 1: rho is the slowdown
    assert finish_time_fairness(np.array([0.0]), np.array([150.0]), np.array([100.0]), np.array([2]), 8) \
        == pytest.approx([1.5])


def test_run_cell_reports_the_same_figures():
    shipped = FittedInterference.from_data()
    row = run_cell(_four_in_a_row(), _one_gpu(), HeldoutCell(0, 1, 1.0, "fifo_exclusive"), sim_model=shipped,
                   policy_model=shipped)
    assert row["mean_jct_s"] == pytest.approx(250.0) and row["share_ftf_over_1"] == pytest.approx(0.25)
    assert row["policy"] == "fifo_exclusive" and row["preemptions"] == 0
    las = run_cell(_four_in_a_row(), _one_gpu(), HeldoutCell(0, 1, 1.5, "las"), sim_model=shipped, policy_model=shipped)
    assert las["finished_jobs"] == 4


def test_t_interval():
    ci = t_interval([1.0, 2.0, 3.0])
    assert ci["mean"] == pytest.approx(2.0)
    assert ci["hi"] - ci["mean"] == pytest.approx(4.302653 / math.sqrt(3), rel=1e-5)
    assert t_interval([5.0])["lo"] is None and t_interval([])["mean"] is None
