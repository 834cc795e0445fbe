"""bench/paired_timing.py: what it refuses before compiling anything."""

import pytest

from bench import paired_timing


@pytest.mark.parametrize("argv, message", [
    (["{tmp}", "--rounds", "2"], "--rounds must be at least 4"),
    (["{tmp}/absent"], "not a directory"),
    (["{tmp}", "--rounds", "many"], "invalid int value"),
])
def test_bad_options_are_refused_with_a_message(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        paired_timing.main([a.format(tmp=tmp_path) for a in argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_a_directory_without_a_job_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        paired_timing.main([str(tmp_path)])
    assert exc.value.code == 2
    assert "bench_job.json" in capsys.readouterr().err
