"""bench/tuning_time.py --report: saved runs' DOP auto vs DOP 1 pairs summarized over all their seeds."""

import json

import pytest

from bench import tuning_time


def _pair(workload: str, seed: int, wall_ratio: float, latency_ratio: float) -> dict:
    """One saved pair with the fields ``_remeasure_parallel`` computes (DOP 1 measuring half its 100 s run)."""
    measure_ratio = 0.6
    return {
        "workload": workload, "seed": seed, "threads": 1,
        "dop1": {"wall_s": 100.0, "final_dop": 1, "phase_secs": {"measure_rounds": 50.0}, "dop_history": []},
        "dop_auto": {"wall_s": 100.0 * wall_ratio, "final_dop": 2, "phase_secs": {"measure_rounds": 30.0},
                     "dop_history": [{"dop": 2, "dop_after": 2, "n_sampled": 4, "mean_error": 0.05}]},
        "wall_ratio": wall_ratio, "latency_ratio": latency_ratio, "measure_phase_ratio": measure_ratio,
        "wall_ratio_mechanism": 1 - 0.5 * (1 - measure_ratio), "measure_at_dop_ratio": 0.52,
        "serial_sample_ratio": 0.08, "serial_ratio_by_reason": {"probe": 0.03, "sample": 0.05},
        "error_at_final_dop": 0.05, "wall_ratio_floor": {"floor": 0.75, "amdahl": 0.75, "cpu": 0.7},
        "busy_cores": {"dop1": 1.4, "dop_auto": 1.8},
    }


def _saved(path, seeds_walls: dict[int, float]) -> str:
    pairs = [_pair(w, seed, wall, 1.0) for seed, wall in seeds_walls.items() for w in ("matmul512", "conv3x3_resnet")]
    path.write_text(json.dumps({"benchmark": "tuning_time", "overall": {}, "parallel": pairs}))
    return str(path)


def test_report_pools_the_seeds_of_several_saved_runs(tmp_path, capsys):
    first = _saved(tmp_path / "a.json", {1: 0.9, 2: 0.7})
    second = _saved(tmp_path / "b.json", {3: 0.8, 4: 0.95, 5: 0.6})
    out = tmp_path / "all.json"
    assert tuning_time.main(["--report", f"{first},{second}", "--json", str(out)]) == 0
    overall = json.loads(out.read_text())["overall"]
    assert overall["parallel_seeds"] == [1, 2, 3, 4, 5]
    # the median of each seed's geomean over its two workloads, as one run over five seeds reports it
    assert overall["parallel_wall_ratio"] == pytest.approx(0.8)
    assert overall["parallel_wall_ratio_mechanism"] == pytest.approx(0.8)
    assert overall["parallel_final_dop"] == 2
    assert "seed   5" in capsys.readouterr().out


def test_report_refuses_a_seed_two_runs_hold_and_a_file_without_pairs(tmp_path, capsys):
    first = _saved(tmp_path / "a.json", {1: 0.9})
    again = _saved(tmp_path / "b.json", {1: 0.7})
    assert tuning_time.main(["--report", f"{first},{again}"]) == 2
    assert "seed 1 is in both" in capsys.readouterr().err
    other = tmp_path / "c.json"
    other.write_text(json.dumps({"benchmark": "doppler_replay", "rows": []}))
    assert tuning_time.main(["--report", str(other)]) == 2
    assert "holds no parallel pairs" in capsys.readouterr().err
    assert tuning_time.main(["--report", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_shared_candidates_says_how_far_two_runs_searched_alike():
    a = {"candidates": ["k1", "k2", "k3", "k4"]}
    assert tuning_time.shared_candidates(a, {"candidates": ["k4", "k3", "k2", "k1"]}) == 1.0
    assert tuning_time.shared_candidates(a, {"candidates": ["k1", "k2", "x", "y", "z"]}) == 2 / 5
    assert tuning_time.shared_candidates(a, {}) is None  # a run saved before candidates were kept


def test_search_threads_one_pairs_the_sides_and_zero_is_tvms_default():
    assert tuning_time._search_threads({"search_threads": 1}) == 1
    assert tuning_time._search_threads({"search_threads": 0}) == "physical"
    assert tuning_time._search_threads({}) == "physical"  # specs of the other benchmarks
