"""The whole Philly trace through the one experiment path (``horus.experiments.run_experiment``, as the
bench and the dashboard run it): every job completes and Horus beats one-job-per-GPU on the headline
setup (256 GPUs). Rewritten from a direct ``simulate`` call with a wall-time assertion: the simulator's
speed is printed by ``bench/scheduling.py`` (per policy), not asserted in a test."""

from __future__ import annotations

from scheduling.horus.experiments import reference_predictor, run_experiment
from scheduling.horus.profiles import load_profiles


def test_full_philly_trace_horus_vs_fifo():
    out = run_experiment(trace="philly", policies=["horus", "fifo_exclusive"], seed=0,
                         params={"jobs": 100_000, "gpus": 256}, profiles=load_profiles(),
                         predictor=reference_predictor())
    assert out["trace"]["jobs_used"] == 82247
    horus, fifo = out["policies"]["horus"], out["policies"]["fifo_exclusive"]
    for r in (horus, fifo):
        assert r["n_jobs"] == 82247 and r["dropped_jobs"] == 0 and r["unschedulable_jobs"] == 0
        assert r["peak_mem_frac"] <= 1.0
    assert horus["makespan_s"] < fifo["makespan_s"]
    assert horus["mean_wait_s"] < fifo["mean_wait_s"]
    assert horus["util_mean_pct"] > fifo["util_mean_pct"]
