"""bench/paired_timing.py: what it refuses before compiling anything, and how it pairs the samples."""

import pytest

from bench import paired_timing


@pytest.mark.parametrize("argv, message", [
    (["{tmp}", "--rounds", "2"], "--rounds must be at least 4"),
    (["{tmp}/absent"], "not a directory"),
    (["{tmp}", "--rounds", "many"], "invalid int value"),
    (["{tmp}", "--vm-exec-modes", "compiled,jit"], "--vm-exec-modes: unknown jit"),
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


def test_rounds_rotate_the_order_and_the_verdict_is_the_median_per_round_ratio():
    order = []
    drift = iter([1.0, 1.0, 3.0, 3.0, 5.0, 5.0, 7.0, 7.0])  # the host slows down between rounds

    def side(name, scale):
        def sample():
            order.append(name)
            return scale * next(drift)
        return sample

    samples = paired_timing.interleave({"onnxruntime": side("ort", 1.0), "tvm": side("tvm", 0.9)}, rounds=4)
    assert order == ["ort", "tvm", "tvm", "ort", "ort", "tvm", "tvm", "ort"]
    summary = paired_timing.summarize(samples)
    # the blocks' medians move with the drift; every paired round says 0.9
    assert summary["tvm"]["vs_onnxruntime_paired"] == pytest.approx(0.9)
    assert summary["onnxruntime"]["vs_onnxruntime_paired"] == pytest.approx(1.0)
    assert summary["tvm"]["median_ms"] == pytest.approx(0.9 * 4.0 * 1e3)


def test_an_exec_mode_ablation_builds_with_that_mode_and_restores_the_products_build():
    from tvm import relax

    product_build = relax.build
    with paired_timing.vm_exec_mode("compiled"):
        assert relax.build is not product_build and relax.build.keywords == {"exec_mode": "compiled"}
    assert relax.build is product_build
    with paired_timing.vm_exec_mode(None):
        assert relax.build is product_build
