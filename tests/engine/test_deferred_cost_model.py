"""search.train_when_needed: XGBModel's trainings before its warm-up are never used, so they wait for
the first prediction that uses a booster; save in the warm-up writes the data untrained, and
search.load_cost_model reads such a file back (TVM's own loader loses its data)."""

import numpy as np
import pytest

from tuning.engine.search.loop import load_cost_model, train_when_needed

pytest.importorskip("xgboost")

from tvm.s_tir.meta_schedule.cost_model.xgb_model import FeatureGroup  # noqa: E402


def _model():
    from tvm.s_tir import meta_schedule as ms

    cm = ms.cost_model.XGBModel(num_tuning_cores=1, tree_method="auto", num_warmup_samples=10)
    # predict's feature extraction needs a tune context: stand in for it (this test is about when the
    # booster is trained, not about features)
    cm._inst.predict = lambda context, candidates: np.zeros(len(candidates))
    return train_when_needed(cm)


def _data(n: int, rng):
    return [rng.random((2, 164)).astype("float32") for _ in range(n)], rng.random(n).astype("float32")


def _update(cm, n, rng):
    """What XGBModel.update does with n new results, minus feature extraction: the data grows, then
    it trains on all of it."""
    inst = cm._inst
    feats, costs = _data(n, rng)
    inst.data[f"group{len(inst.data)}"] = FeatureGroup(group_hash=f"group{len(inst.data)}", features=feats,
                                                        costs=costs)
    inst.data_size += n
    inst._train(*_data(inst.data_size, rng))


def test_training_below_the_warm_up_waits_and_save_keeps_the_data_untrained(tmp_path):
    rng = np.random.default_rng(0)
    cm = _model()
    inst = cm._inst
    _update(cm, 6, rng)
    assert inst.booster is None and cm.pending_training()
    inst.predict(None, [1, 2])  # (what C++ calls); still in the warm-up: stock predicts at random, nothing to train for
    assert inst.booster is None and cm.pending_training()
    path = str(tmp_path / "cost_model.xgb")
    inst.save(path)
    assert inst.booster is None  # saving trained nothing: no booster is used before the warm-up ends

    resumed = _model()
    load_cost_model(resumed, path)
    r = resumed._inst
    assert r.booster is None and r.data_size == 6 and list(r.data) == ["group0"]
    assert np.array_equal(r.data["group0"].costs, inst.data["group0"].costs)
    _update(resumed, 5, rng)  # 11 >= the warm-up of 10: trains at once, on the loaded data too
    assert r.booster is not None and not resumed.pending_training()


def test_a_trained_model_saves_and_loads_with_its_booster(tmp_path):
    rng = np.random.default_rng(3)
    cm = _model()
    _update(cm, 12, rng)
    assert cm._inst.booster is not None
    path = str(tmp_path / "cost_model.xgb")
    cm._inst.save(path)
    loaded = _model()
    load_cost_model(loaded, path)
    assert loaded._inst.booster is not None and loaded._inst.data_size == 12


def test_the_first_prediction_past_the_warm_up_trains_on_the_pending_data():
    rng = np.random.default_rng(1)
    cm = _model()
    inst = cm._inst
    inst.data_size = 8
    inst._train(*_data(8, rng))
    assert inst.booster is None
    inst.data_size = 12  # stock's adaptive training skipped the next update's training (12 - 8 < 8 / 5 fails)
    inst.predict(None, [1])
    assert inst.booster is not None and not cm.pending_training()


def test_past_the_warm_up_it_trains_at_once_like_stock():
    rng = np.random.default_rng(2)
    cm = _model()
    inst = cm._inst
    inst.data_size = 12
    inst._train(*_data(12, rng))
    assert inst.booster is not None and not cm.pending_training()
