"""Canonical targets: the host CPU is named, keys are stable, foreign targets are refused."""

import json

import pytest

from tuning.engine.compile import targets as tg


def _other_cpu() -> str:
    """A CPU LLVM knows for this triple that is not this host's."""
    return "skylake-avx512" if tg.host_cpu() != "skylake-avx512" else "znver3"


def test_cpu_target_names_the_host_cpu():
    t = tg.resolve_cpu_target(num_cores=2)
    assert t["kind"] == "llvm"
    assert t["mcpu"] == tg.host_cpu() and t["mcpu"] not in ("", "generic")
    assert t["mtriple"] == tg.host_triple()
    assert t["num-cores"] == 2
    assert tg.resolve_cpu_target()["num-cores"] >= 1


def test_registered_cpu_accepted_unknown_cpu_refused():
    assert tg.resolve_cpu_target(num_cores=4, mcpu=_other_cpu())["mcpu"] == _other_cpu()
    with pytest.raises(ValueError, match="does not know the CPU"):
        tg.resolve_cpu_target(mcpu="no-such-cpu")


def test_canonical_key_is_stable():
    import tvm

    t = tg.resolve_cpu_target(num_cores=2)
    reordered = dict(reversed(list(t.items())))
    key = tg.canonical_key(t)
    assert key == tg.canonical_key(reordered) == tg.canonical_key(json.dumps(t)) == tg.canonical_key(tvm.target.Target(t))
    assert json.loads(key) == {"kind": "llvm", "mcpu": t["mcpu"], "mtriple": t["mtriple"], "num-cores": 2}
    assert tg.canonical_key(dict(t, mcpu=_other_cpu())) != key
    assert tg.canonical_key(dict(t, **{"num-cores": 1})) != key
    # the CUDA defaults the pipeline fills in do not change the key
    assert tg.canonical_key({"kind": "cuda", "arch": "sm_90"}) == tg.canonical_key(tg.resolve_cuda_target(arch="sm_90"))


def test_host_target_is_measurable_here():
    tg.check_measurable_here(tg.resolve_cpu_target(num_cores=1))
    tg.check_measurable_here({"kind": "llvm", "num-cores": 1})  # no mcpu: portable code


def test_other_cpu_refused():
    t = tg.resolve_cpu_target(num_cores=1, mcpu=_other_cpu())
    with pytest.raises(tg.TargetMismatch, match=_other_cpu()):
        tg.check_measurable_here(t)


def test_other_architecture_and_too_many_threads_refused():
    t = tg.resolve_cpu_target(num_cores=1)
    with pytest.raises(tg.TargetMismatch, match="aarch64"):
        tg.check_measurable_here(dict(t, mcpu="generic", mtriple="aarch64-unknown-linux-gnu"))
    with pytest.raises(tg.TargetMismatch, match="over-subscribe"):
        tg.check_measurable_here(dict(t, **{"num-cores": tg._available_cores() + 1}))
    with pytest.raises(tg.TargetRefused, match="num-cores"):  # beyond any machine: the schema refuses it
        tg.check_measurable_here(dict(t, **{"num-cores": 4096}))


def test_cuda_target_from_arch_and_refusal_without_gpu():
    assert tg.resolve_cuda_target(arch="sm_90") == {"kind": "cuda", "arch": "sm_90", "host": {"kind": "llvm"}}
    with pytest.raises(ValueError, match="sm_90"):
        tg.resolve_cuda_target(arch="90")
    here = tg.cuda_arch_of(0)
    if here is None:
        with pytest.raises(tg.TargetMismatch, match="no CUDA device"):
            tg.resolve_cuda_target()
        with pytest.raises(tg.TargetMismatch, match="no CUDA device"):
            tg.check_measurable_here({"kind": "cuda", "arch": "sm_90"})
    else:
        assert tg.resolve_cuda_target()["arch"] == here
        other = "sm_50" if here != "sm_50" else "sm_90"
        with pytest.raises(tg.TargetMismatch, match=other):
            tg.check_measurable_here({"kind": "cuda", "arch": other})


def test_result_identity_is_target_and_pipeline():
    from tuning.engine.compile import passes as gp

    t = tg.resolve_cpu_target(num_cores=2)
    identity = tg.result_identity(t)
    assert identity == tg.identity_of(tg.canonical_key(t), gp.pipeline_key())
    assert json.loads(identity) == {"target": tg.canonical_key(t), "pipeline": gp.pipeline_key()}
    # another pass list or another CPU is another result
    assert tg.result_identity(t, gp.pipeline_key(gp.NONE)) != identity
    with gp.use_passes(gp.NONE):
        assert tg.result_identity(t) != identity
    assert tg.result_identity(dict(t, mcpu=_other_cpu())) != identity


def test_a_resolved_run_target_names_its_pipeline():
    from tuning.engine.compile import passes as gp

    resolved = tg.resolve_run_target({"kind": "llvm"}, threads=1)
    assert resolved["target"]["mcpu"] == tg.host_cpu()
    assert resolved["pipeline_key"] == gp.pipeline_key()
