"""search.train_when_needed: XGBModel's trainings before its warm-up are never used, so they wait for
the first prediction that uses a booster, or for save (a resumed run loads a trained model)."""

import numpy as np
import pytest

from tuning.engine.search import train_when_needed

pytest.importorskip("xgboost")


def _model():
    from tvm.s_tir import meta_schedule as ms

    cm = ms.cost_model.XGBModel(num_tuning_cores=1, tree_method="auto", num_warmup_samples=10)
    # predict's feature extraction needs a tune context: stand in for it (this test is about when the
    # booster is trained, not about features)
    cm._inst.predict = lambda context, candidates: np.zeros(len(candidates))
    return train_when_needed(cm)


def _data(n: int, rng):
    return [rng.random((2, 164)).astype("float32") for _ in range(n)], rng.random(n).astype("float32")


def test_training_below_the_warm_up_waits_then_save_trains(tmp_path):
    rng = np.random.default_rng(0)
    cm = _model()
    inst = cm._inst
    inst.data_size = 6
    inst._train(*_data(6, rng))
    assert inst.booster is None and cm.pending_training()
    inst.predict(None, [1, 2])  # (what C++ calls); still in the warm-up: stock predicts at random, nothing to train for
    assert inst.booster is None and cm.pending_training()
    inst.data = {}
    inst.save(str(tmp_path / "cost_model.tar"))
    assert inst.booster is not None and not cm.pending_training()


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
