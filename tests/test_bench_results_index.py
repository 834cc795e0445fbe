"""bench/results/ is tracked with an index (docs/decisions/0002-bench-results-tracked.md): every result file
is listed in bench/results/INDEX.md, every listed file exists, and each is matched to the script that wrote it."""
from __future__ import annotations

import re

from bench import results_index

LISTED = re.compile(r"^\| \[([^\]]+)\]\(([^)]+)\) \| ([^|]+) \|", re.MULTILINE)


def _listed() -> dict[str, str]:
    text = results_index.INDEX.read_text(encoding="utf-8")
    return {target: script.strip() for _name, target, script in LISTED.findall(text)}


def test_the_index_lists_exactly_the_result_files():
    present = {p.relative_to(results_index.RESULTS).as_posix() for p in results_index.result_files()}
    listed = set(_listed())
    assert not present - listed, f"not in INDEX.md (run bench/results_index.py): {sorted(present - listed)}"
    assert not listed - present, f"listed in INDEX.md but gone: {sorted(listed - present)}"


def test_each_result_names_an_existing_bench_script():
    for name, script in _listed().items():
        assert (results_index.ROOT / "bench" / script).is_file(), f"{name}: no bench script {script!r}"


def test_scratch_results_are_neither_listed_nor_kept(tmp_path, monkeypatch):
    results = tmp_path / "results"
    (results / "scratch").mkdir(parents=True)
    (results / "scratch" / "try.json").write_text("{}")
    (results / "doppler_replay_kept.json").write_text('{"machine": {"cpu": "Test CPU", "cores": 4, '
                                                      '"date": "2026-12-05T10:00:00Z", "commit": "abc1234"}}')
    monkeypatch.setattr(results_index, "RESULTS", results)
    monkeypatch.setattr(results_index, "INDEX", results / "INDEX.md")
    rows = [line for line in results_index.render().splitlines() if line.startswith("| [")]
    assert rows == ["| [doppler_replay_kept.json](doppler_replay_kept.json) | doppler_replay.py | Test CPU, 4 cores "
                    "| 2026-12-05 | abc1234 |"]
    gitignore = (results_index.ROOT / ".gitignore").read_text().split()
    assert "/bench/results/scratch/" in gitignore and "/bench/results/" not in gitignore


def test_a_result_that_records_the_cpu_family_names_it_in_the_index():
    """lscpu's model name can be one for two CPU generations (Zen 3 and Zen 4 VMs both read "AMD EPYC");
    a result that recorded family and model (bench/common.py machine_info) shows them."""
    from bench.common import machine_info

    info = machine_info()
    assert "cpu_id" in info and isinstance(info["caches"], dict)
    machine = {"cpu": "AMD EPYC", "cores": 2, "cpu_id": "family 25 model 1"}
    assert results_index.host_of({"machine": machine}) == "AMD EPYC (family 25 model 1), 2 cores"
    assert results_index.host_of({"machine": {"cpu": "AMD EPYC", "cores": 2}}) == "AMD EPYC, 2 cores"
