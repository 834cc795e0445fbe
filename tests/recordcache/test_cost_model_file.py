"""The record cache's transferred cost model is data only: XGBoost's JSON model and plain numpy arrays in an
uncompressed tar read in memory (``tuning.engine.records.cost_model_file``, ``common.archive``). A file that holds a
pickle anywhere (TVM's own format, an object array, a pickle under an expected name) is refused unread: the
pickles below create a marker file when unpickled, and the marker never appears."""
from __future__ import annotations

import io
import logging
import os
import pickle
import tarfile

import numpy as np
import pytest

from common.archive import ArchiveError, read_tar_members
from tuning.engine.records import cost_model_file as cmf
from tuning.engine.records import publish
from tuning.engine.search.loop import _cost_model, load_cost_model, train_when_needed

pytest.importorskip("xgboost")

from tvm.s_tir import meta_schedule as ms  # noqa: E402
from tvm.s_tir.meta_schedule.cost_model.xgb_model import FeatureGroup  # noqa: E402


class CreatesMarker:
    """Unpickling this opens (creates) ``path``: the proof that a loader unpickled it."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _trained_model(n: int = 12, seed: int = 0):
    cm = train_when_needed(ms.cost_model.XGBModel(num_tuning_cores=1, tree_method="auto", num_warmup_samples=10))
    inst, rng = cm._inst, np.random.default_rng(seed)
    for g, k in enumerate((n // 2, n - n // 2)):
        feats = [rng.random((int(rng.integers(1, 4)), 164)).astype("float32") for _ in range(k)]
        inst.data[f"{g:016x}"] = FeatureGroup(group_hash=f"{g:016x}", features=feats,
                                               costs=rng.random(k).astype("float32"))
        inst.data_size += k
    xs = [f for grp in inst.data.values() for f in grp.features]
    inst._train(xs=xs, ys=rng.random(len(xs)).astype("float32"))
    return cm


def _tar(path, members: dict[str, bytes], mode: str = "w:") -> str:
    with tarfile.open(path, mode) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return str(path)


def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


# --------------------------------------------------------------------------- the format
def test_a_trained_model_round_trips_as_xgboost_json_and_plain_arrays(tmp_path):
    cm = _trained_model()
    path = str(tmp_path / "cost_model.xgb")
    cm.save(path)  # what search() calls at a run's end
    members = read_tar_members(path, allowed=None, max_member_bytes=1 << 26, max_total_bytes=1 << 27)
    assert set(members) == {"model.json", "data.npz"}
    assert members["model.json"].lstrip().startswith(b"{")  # XGBoost's JSON model format
    with np.load(io.BytesIO(members["data.npz"]), allow_pickle=False) as npz:
        assert all(npz[name].dtype.kind in "Uif" for name in npz.files)
    assert cmf.check_cost_model_file(path) == 12

    loaded = train_when_needed(ms.cost_model.XGBModel(num_tuning_cores=1))
    load_cost_model(loaded, path)
    a, b = cm._inst, loaded._inst
    assert b.data_size == 12 and list(b.data) == list(a.data)
    for h in a.data:
        assert np.array_equal(a.data[h].costs, b.data[h].costs)
        assert all(np.array_equal(x, y) for x, y in zip(a.data[h].features, b.data[h].features))
    import xgboost as xgb

    probe = xgb.DMatrix(np.random.default_rng(9).random((5, 164)).astype("float32"))
    assert np.allclose(a.booster.predict(probe), b.booster.predict(probe))


def test_a_model_in_its_warm_up_saves_without_a_booster(tmp_path):
    cm = train_when_needed(ms.cost_model.XGBModel(num_tuning_cores=1))
    path = str(tmp_path / "cm.xgb")
    cm.save(path)
    assert set(read_tar_members(path, allowed=None, max_member_bytes=1 << 20, max_total_bytes=1 << 20)) == {"data.npz"}
    loaded = train_when_needed(ms.cost_model.XGBModel(num_tuning_cores=1))
    load_cost_model(loaded, path)
    assert loaded._inst.booster is None and loaded._inst.data_size == 0


# --------------------------------------------------------------------------- pickles are refused unread
def _tvm_format_with_payload(tmp_path, marker) -> str:
    """What TVM's XGBModel.save writes (gzipped tar: model.bin, data.npy as a pickled object array), with
    the pickle carrying a payload."""
    from tvm.support.tar import tar

    src = tmp_path / "tvm-src"
    src.mkdir()
    np.save(src / "data.npy", np.array([("0" * 16, [np.zeros((1, 164))], CreatesMarker(marker))], dtype=object),
            allow_pickle=True)
    path = str(tmp_path / "old.xgb")
    tar(path, [str(src / "data.npy")])
    return path


def test_the_payload_is_live_stock_tvm_would_run_it(tmp_path):
    """Control: TVM's own loader (np.load with allow_pickle=True) runs the payload of this very file."""
    marker = tmp_path / "pwned-control"
    path = _tvm_format_with_payload(tmp_path, marker)
    with pytest.raises(Exception):  # noqa: B017 - the payload's "costs" is a file object; TVM fails after it ran
        ms.cost_model.XGBModel(num_tuning_cores=1).load(path)
    assert marker.exists()


def test_tvm_pickled_format_is_refused_without_unpickling(tmp_path):
    marker = tmp_path / "pwned"
    path = _tvm_format_with_payload(tmp_path, marker)
    cm = train_when_needed(ms.cost_model.XGBModel(num_tuning_cores=1))
    with pytest.raises(cmf.CostModelFileError, match="old-format"):
        load_cost_model(cm, path)
    with pytest.raises(cmf.CostModelFileError):
        cmf.check_cost_model_file(path)
    assert not marker.exists() and cm._inst.data_size == 0


def test_an_uncompressed_tar_with_a_pickled_data_npy_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    buf = io.BytesIO()
    np.save(buf, np.array([CreatesMarker(marker)], dtype=object), allow_pickle=True)
    path = _tar(tmp_path / "cm.xgb", {"data.npy": buf.getvalue()})
    with pytest.raises(cmf.CostModelFileError, match="unexpected archive member 'data.npy'"):
        cmf.check_cost_model_file(path)
    assert not marker.exists()


@pytest.mark.parametrize("case", ["object_array_in_npz", "pickle_named_data_npz", "pickle_named_model_json",
                                  "npy_not_npz"])
def test_a_pickle_under_an_expected_name_is_refused_unread(tmp_path, case):
    marker = tmp_path / "pwned"
    payload = pickle.dumps(CreatesMarker(marker))
    good = io.BytesIO()
    np.savez(good, format=np.array(cmf.FORMAT), group_hashes=np.array([], dtype="<U64"),
             group_sizes=np.zeros(0, np.int64), feature_rows=np.zeros(0, np.int64),
             features=np.zeros((0, 0), np.float32), costs=np.zeros(0, np.float32))
    if case == "object_array_in_npz":
        members = {"data.npz": _npz(format=np.array(cmf.FORMAT), group_hashes=np.array([], dtype="<U64"),
                                    group_sizes=np.zeros(0, np.int64), feature_rows=np.zeros(0, np.int64),
                                    features=np.array([CreatesMarker(marker)], dtype=object),
                                    costs=np.zeros(0, np.float32))}
        why = "object array"
    elif case == "pickle_named_data_npz":
        members, why = {"data.npz": payload}, "not an npz"
    elif case == "pickle_named_model_json":
        members, why = {"data.npz": good.getvalue(), "model.json": payload}, "model.json"
    else:
        npy = io.BytesIO()
        np.save(npy, np.array([CreatesMarker(marker)], dtype=object), allow_pickle=True)
        members, why = {"data.npz": npy.getvalue()}, "not an npz"
    path = _tar(tmp_path / "cm.xgb", members)
    with pytest.raises(cmf.CostModelFileError, match=why):
        cmf.check_cost_model_file(path)
    cm = train_when_needed(ms.cost_model.XGBModel(num_tuning_cores=1))
    with pytest.raises(cmf.CostModelFileError):
        load_cost_model(cm, path)
    assert not marker.exists()


def test_an_npy_header_declaring_more_data_than_it_holds_is_refused(tmp_path):
    """numpy allocates an array's declared shape before reading it: a tiny member may not claim 4 TiB."""
    import zipfile

    arrays = {"format": np.array(cmf.FORMAT), "group_hashes": np.array([], dtype="<U64"),
              "group_sizes": np.zeros(0, np.int64), "feature_rows": np.zeros(0, np.int64),
              "features": np.zeros((0, 0), np.float32)}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, a in arrays.items():
            npy = io.BytesIO()
            np.save(npy, a, allow_pickle=False)
            zf.writestr(f"{name}.npy", npy.getvalue())
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (1 << 40,)})
        zf.writestr("costs.npy", header.getvalue() + b"\0" * 16)
    path = _tar(tmp_path / "cm.xgb", {"data.npz": buf.getvalue()})
    with pytest.raises(cmf.CostModelFileError, match="declares more data than it holds"):
        cmf.check_cost_model_file(path)


# --------------------------------------------------------------------------- hostile archives
@pytest.mark.parametrize("member", ["../escape", "/tmp/absolute-escape", "sub/../../escape", "link", "hardlink",
                                    "device", "data.npz/"])
def test_a_tar_with_an_escaping_link_or_device_member_is_refused(tmp_path, member):
    inner = tmp_path / "inner"
    inner.mkdir()
    path = str(inner / "cm.xgb")
    with tarfile.open(path, "w:") as tf:
        info = tarfile.TarInfo(member)
        if member == "link":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        elif member == "hardlink":
            info.type, info.linkname = tarfile.LNKTYPE, "../escape"
        elif member == "device":
            info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
        elif member.endswith("/"):
            info.type = tarfile.DIRTYPE
        else:
            info.size = 4
        tf.addfile(info, io.BytesIO(b"evil") if info.isreg() else None)
    with pytest.raises(ArchiveError):
        read_tar_members(path, allowed=None, max_member_bytes=1 << 20, max_total_bytes=1 << 20)
    with pytest.raises(cmf.CostModelFileError):
        cmf.check_cost_model_file(path)
    assert not (tmp_path / "escape").exists() and not os.path.exists("/tmp/absolute-escape")
    assert sorted(os.listdir(inner)) == ["cm.xgb"]  # nothing was extracted anywhere


def test_archive_size_bounds_and_duplicates(tmp_path):
    path = _tar(tmp_path / "a.tar", {"data.npz": b"x" * 2000})
    with pytest.raises(ArchiveError, match="more than 1000"):
        read_tar_members(path, allowed=None, max_member_bytes=1000, max_total_bytes=10_000)
    path = _tar(tmp_path / "b.tar", {"a": b"x" * 600, "b": b"x" * 600})
    with pytest.raises(ArchiveError, match="add up to more than 1000"):
        read_tar_members(path, allowed=None, max_member_bytes=1000, max_total_bytes=1000)
    with pytest.raises(ArchiveError, match="the archive is"):
        read_tar_members(path, allowed=None, max_member_bytes=1000, max_total_bytes=1000, max_archive_bytes=100)
    with tarfile.open(tmp_path / "c.tar", "w:") as tf:
        for _ in range(2):
            info = tarfile.TarInfo("data.npz")
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(ArchiveError, match="twice"):
        read_tar_members(tmp_path / "c.tar", allowed=None, max_member_bytes=10, max_total_bytes=10)
    gz = _tar(tmp_path / "d.tar.gz", {"data.npz": b"x"}, mode="w:gz")
    with pytest.raises(ArchiveError, match="not an uncompressed tar"):
        read_tar_members(gz, allowed=None, max_member_bytes=10, max_total_bytes=10)


# --------------------------------------------------------------------------- the run goes on without it
def test_a_refused_cache_model_is_skipped_and_the_run_tunes_without_it(tmp_path, caplog):
    marker = tmp_path / "pwned"
    old = _tvm_format_with_payload(tmp_path, marker)
    work = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="tuning.engine.records.publish"):
        assert not publish.place_cost_model(str(work), old)
    assert "skipped" in caplog.text and "old-format" in caplog.text
    assert not (work / "cost_model.xgb").exists() and os.listdir(work) == []

    good = str(tmp_path / "good.xgb")
    _trained_model().save(good)
    assert publish.place_cost_model(str(work), good)
    assert (work / "cost_model.xgb").read_bytes() == open(good, "rb").read()
    assert not marker.exists()


def test_a_runs_own_pickled_model_does_not_load_the_search_starts_fresh(tmp_path, caplog):
    """A resumed run whose work dir holds a file in TVM's format (or a planted one): warned, never loaded."""
    marker = tmp_path / "pwned"
    path = _tvm_format_with_payload(tmp_path, marker)
    with caplog.at_level(logging.WARNING, logger="tuning.engine.search.loop"):
        cm = _cost_model(path, resumed=True)
    assert "refused" in caplog.text and cm._inst.data_size == 0 and not marker.exists()
