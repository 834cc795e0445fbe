"""Features, synthetic profiles and the utilization predictor."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from scheduling.horus.features import (
    DEFAULT_ZOO_FEATURES_PATH,
    FEATURE_COLUMNS,
    ZOO_BATCH_SIZES,
    ZooFeatureTable,
    feature_matrix,
    feature_vector,
    zoo_feature_table,
)
from scheduling.horus.predictor import PREDICTOR_COLUMNS, TrainedPredictor, UtilizationPredictor, rmsle
from scheduling.horus.profiles import (
    SYNTHETIC_SOURCE,
    ProfileFormatError,
    ProfileTable,
    gpu_spec,
    load_profiles,
    roofline_profile,
    save_profiles,
)

ROOT = Path(__file__).resolve().parents[2]


def feats(**kw):
    base = dict(total_flops=2e9, param_count=1e6, activation_bytes=4e6, conv_count=3, linear_count=1,
                activation_count=4, other_count=5, batch_size=8)
    base.update(kw)
    return base


def test_feature_vector_columns():
    v = feature_vector(feats())
    assert v.shape == (len(FEATURE_COLUMNS),) == (10,)
    assert FEATURE_COLUMNS[:4] == ("log10_total_flops", "log10_param_count", "log10_activation_bytes", "log2_batch_size")
    assert v[0] == pytest.approx(math.log10(1 + 2e9))
    assert v[3] == pytest.approx(3.0)
    assert list(v[4:8]) == [3, 1, 4, 5]
    assert v[8] == pytest.approx(math.log10(1 + 2e9 / 8))
    assert feature_matrix([feats(), feats(batch_size=16)]).shape == (2, 10)


def test_feature_vector_rejects_bad_input():
    with pytest.raises(KeyError, match="param_count"):
        feature_vector({k: v for k, v in feats().items() if k != "param_count"})
    with pytest.raises(ValueError):
        feature_vector(feats(conv_count=-1))
    with pytest.raises(ValueError):
        feature_vector(feats(batch_size=0))


def test_zoo_table_cached_and_roundtrips(tmp_path):
    t = zoo_feature_table()  # the shipped cache: no ONNX graph is built
    assert DEFAULT_ZOO_FEATURES_PATH.exists()
    assert len(t.models) >= 6
    for m in t.models:
        assert t.batch_sizes(m) == list(ZOO_BATCH_SIZES)
        f1, f8 = t.get(m, 1), t.get(m, 8)
        assert f8["total_flops"] > f1["total_flops"] and f8["param_count"] == f1["param_count"]
    p = tmp_path / "z.json"
    t.save(p)
    assert ZooFeatureTable.load(p).get("resnet18", 4) == t.get("resnet18", 4)


def test_features_match_core_extractor():
    pytest.importorskip("onnx")
    zoo = pytest.importorskip("core.onnx_models.zoo")
    from scheduling.horus.features import features_of_model

    f = features_of_model(zoo.build_model("small_cnn"), batch_size=4)
    assert f == zoo_feature_table().get("small_cnn", 4)


def test_roofline_rises_with_batch_and_saturates():
    t = zoo_feature_table()
    v100 = gpu_spec("V100")
    utils = [roofline_profile(t.get("resnet18", b), v100)[0] for b in ZOO_BATCH_SIZES]
    mems = [roofline_profile(t.get("resnet18", b), v100)[1] for b in ZOO_BATCH_SIZES]
    assert utils == sorted(utils) and utils[-1] <= 100 and utils[-1] - utils[-2] < 1
    assert mems == sorted(mems)
    # slower GPU, same job: busier
    assert roofline_profile(t.get("vgg11", 16), gpu_spec("T4"))[0] > roofline_profile(t.get("vgg11", 16), v100)[0]


def test_seed_profiles_are_labelled_synthetic(tmp_path):
    recs = load_profiles()
    assert len(recs) > 150
    assert {r.source for r in recs} == {SYNTHETIC_SOURCE}
    assert all(r.peak_mem_mb <= gpu_spec(r.gpu_model).mem_mb for r in recs)
    body = json.loads((ROOT / "data/profiles/seed_profiles.json").read_text())
    assert body["meta"]["synthetic"] is True
    save_profiles(recs[:3], tmp_path / "p.json")
    assert load_profiles(tmp_path / "p.json") == recs[:3]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": 1, "records": [{"model": "x"}]}))
    with pytest.raises(ProfileFormatError, match="record 0: missing field 'batch_size'"):
        load_profiles(bad)
    rec = recs[0].to_dict()
    rec["gpu_util_pct"] = 140
    bad.write_text(json.dumps([rec]))
    with pytest.raises(ProfileFormatError, match="out of range"):
        load_profiles(bad)
    s = ProfileTable(recs, "V100").summary()
    assert 0 < s["util_pct"]["median"] < 100


@pytest.fixture(scope="module")
def trained():
    return UtilizationPredictor(n_estimators=120).train(load_profiles(), k_folds=5, seed=0)


def test_grouped_kfold_holds_out_whole_models(trained):
    m = trained.metrics
    held = [x for f in m["per_fold"] for x in f["held_out"]]
    assert sorted(held) == sorted({r.model for r in load_profiles()})  # each model held out exactly once
    assert m["grouped_by"] == "model" and m["k_folds"] == 5
    for target, keys in (("util", ("rmsle", "mae_pct")), ("mem", ("rmsle", "mae_mb"))):
        for k in keys:
            assert math.isfinite(m[target][k]) and m[target][k] >= 0
    # unseen models are harder than the training fit
    assert m["util"]["rmsle"] > m["train"]["util_rmsle"]
    assert trained.n_records == len(load_profiles())
    assert len(trained.cv_predictions) == trained.n_records


def test_ungrouped_kfold_and_input_checks():
    recs = load_profiles()
    t = UtilizationPredictor(n_estimators=60).train(recs, k_folds=4, group_by_model=False)
    assert t.metrics["grouped_by"] == "record" and t.metrics["k_folds"] == 4
    with pytest.raises(ValueError, match="at least 2 models"):
        UtilizationPredictor().train([r for r in recs if r.model == "resnet18"])
    with pytest.raises(ValueError):
        UtilizationPredictor().train(recs[:1])


def test_predict_save_load(trained, tmp_path):
    rec = next(r for r in load_profiles() if r.model == "resnet18" and r.batch_size == 32 and r.gpu_model == "V100")
    u, m = trained.predict(rec.features, gpu_model="V100")
    assert 0 <= u <= 100 and m > 0
    assert abs(math.log1p(u) - math.log1p(rec.gpu_util_pct)) < 0.3  # seen model: close to its profile
    p = tmp_path / "pred.json"
    trained.save(p)
    body = json.loads(p.read_text())
    assert body["version"] == 1 and body["feature_columns"] == list(PREDICTOR_COLUMNS)
    assert {"metrics", "n_records", "trained_at"} <= set(body)
    again = TrainedPredictor.load(p)
    assert again.predict(rec.features, gpu_model="V100") == pytest.approx((u, m))
    assert again.metrics == json.loads(json.dumps(trained.metrics))


def test_rmsle():
    assert rmsle(np.array([1.0, 3.0]), np.array([1.0, 3.0])) == 0
    assert rmsle(np.array([math.e - 1]), np.array([0.0])) == pytest.approx(1.0)


def test_no_django_in_horus():
    for p in (ROOT / "scheduling" / "horus").glob("*.py"):
        src = p.read_text()
        assert "import django" not in src and "from django" not in src, p.name
