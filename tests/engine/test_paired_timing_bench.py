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


def test_an_exec_mode_ablation_reaches_the_products_build_and_restores_it(monkeypatch):
    import onnx
    from tvm import relax

    from tests.tuning.onnx_builders import tiny_dense
    from tuning.engine.compile.pipeline import compile_model
    from tuning.engine.compile.targets import resolve_cpu_target

    seen = []
    build = relax.build

    def recording_build(*args, **kwargs):
        seen.append(kwargs.get("exec_mode", "bytecode"))
        return build(*args, **kwargs)

    monkeypatch.setattr(relax, "build", recording_build)
    model = onnx.load_from_string(tiny_dense())
    with paired_timing.vm_exec_mode("compiled"):
        compile_model(model, resolve_cpu_target(num_cores=1))
    assert relax.build is recording_build  # restored
    with paired_timing.vm_exec_mode(None):
        compile_model(model, resolve_cpu_target(num_cores=1))
    assert seen == ["compiled", "bytecode"]  # the product's compile built with the ablation's mode, then its own


def test_each_later_mode_is_paired_with_the_first_modes_build_of_the_same_job():
    samples = {"onnxruntime": [1.0, 9.0, 1.0], "r18[bytecode]": [2.0, 20.0, 2.0], "r18[compiled]": [1.8, 19.0, 2.2],
               "mb2[bytecode]": [1.0, 1.0, 1.0], "mb2[compiled]": [1.0, 1.0, 1.0]}
    ratios = paired_timing.against_first_mode(samples, ["r18", "mb2"], ["bytecode", "compiled"])
    assert ratios == pytest.approx({"r18[compiled]": 0.95, "mb2[compiled]": 1.0})
    assert paired_timing.against_first_mode(samples, ["r18"], ["bytecode"]) == {}
