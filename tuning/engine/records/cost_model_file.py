"""The platform's own file format for MetaSchedule's XGBoost cost model: data only, never a pickle.

TVM's ``XGBModel.save`` writes a gzipped tar holding ``model.bin`` and ``data.npy``, the latter a numpy
*object* array that ``XGBModel.load`` reads with ``np.load(..., allow_pickle=True)``: loading one unpickles
whatever it holds. The record cache hands one team's trained model to every other team's runs, so that
format would turn any write to the file into code execution in other teams' runs. This module replaces
both directions:

- :func:`save_xgb_model` writes an uncompressed tar of two members: ``model.json``, the booster in
  XGBoost's own JSON model format (absent while the model is in its warm-up and has no booster), and
  ``data.npz``, the training data as plain numeric and string arrays (``np.savez``; no object array).
- :func:`load_xgb_model` reads it back without extracting anything to disk (``common.archive``: regular
  members from an allow-list, size-bounded), loads the arrays with ``allow_pickle=False`` and checks
  their dtypes and shapes, and hands the JSON to XGBoost's own parser. Anything else, TVM's old format
  included, raises :class:`CostModelFileError` before a byte of it is interpreted as code.
- :func:`data_only` makes an ``XGBModel``'s own ``save``/``load`` these two.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections import OrderedDict

import numpy as np

from common.archive import ArchiveError, read_tar_members
from common.jsonsafe import loads_finite

__all__ = [
    "FORMAT",
    "CostModelFileError",
    "save_xgb_model",
    "load_xgb_model",
    "read_cost_model_file",
    "check_cost_model_file",
    "data_only",
]

FORMAT = "dlopt-xgb-cost-model/1"
MODEL_MEMBER, DATA_MEMBER = "model.json", "data.npz"
DATA_ARRAYS = {"format", "group_hashes", "group_sizes", "feature_rows", "features", "costs"}
MAX_MEMBER_BYTES = 512 * 1024 * 1024
MAX_FILE_BYTES = 1024 * 1024 * 1024
MAX_GROUP_HASH = 64  # MetaSchedule's shash2hex: a hex string


class CostModelFileError(ValueError):
    """A cost-model file refused: not the platform's data-only format (TVM's pickled one included)."""


def _tar_bytes(members: dict[str, bytes]) -> bytes:
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:", format=tarfile.PAX_FORMAT) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def save_xgb_model(inst, path: str) -> None:
    """Write ``inst`` (TVM's ``XGBModel``, the Python instance: ``cost_model._inst``) at ``path`` in the
    platform's format, atomically (a reader never sees half a file)."""
    groups = list(inst.data.values())
    feats = [np.asarray(f, dtype=np.float32) for g in groups for f in g.features]
    width = feats[0].shape[1] if feats and feats[0].ndim == 2 else 0
    arrays = {
        "format": np.array(FORMAT),
        "group_hashes": np.array([str(g.group_hash) for g in groups], dtype=f"<U{MAX_GROUP_HASH}"),
        "group_sizes": np.array([len(g.features) for g in groups], dtype=np.int64),
        "feature_rows": np.array([f.shape[0] for f in feats], dtype=np.int64),
        "features": (
            np.concatenate([f.reshape(-1, width) for f in feats], axis=0)
            if feats
            else np.zeros((0, 0), dtype=np.float32)
        ),
        "costs": (
            np.concatenate([np.asarray(g.costs, dtype=np.float32).ravel() for g in groups])
            if groups
            else np.zeros(0, dtype=np.float32)
        ),
    }
    data = io.BytesIO()
    np.savez(data, allow_pickle=False, **arrays)
    members = {DATA_MEMBER: data.getvalue()}
    if getattr(inst, "booster", None) is not None:
        members[MODEL_MEMBER] = bytes(inst.booster.save_raw(raw_format="json"))
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".cost-model-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_tar_bytes(members))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _array(npz, name: str, kind: str, ndim: int) -> np.ndarray:
    a = npz[name]  # allow_pickle=False: an object array raises ValueError here, never unpickles
    if a.dtype.kind != kind or a.ndim != ndim:
        raise CostModelFileError(f"cost model array {name!r} is {a.dtype}/{a.ndim}-d, not kind {kind!r}/{ndim}-d")
    return a


def _check_npz(blob: bytes) -> None:
    """Before numpy reads ``data.npz``: a zip of exactly the expected arrays, stored (not compressed, so no
    member expands beyond the file), each a plain ``.npy`` whose header declares no object dtype (what
    would be a pickle) and no more data than the member holds (numpy allocates the declared shape first)."""
    import zipfile

    try:
        zf = zipfile.ZipFile(io.BytesIO(blob))
        infos = zf.infolist()
    except (zipfile.BadZipFile, ValueError, EOFError) as exc:
        raise CostModelFileError(f"{DATA_MEMBER} is not an npz archive ({exc})") from None
    names = [i.filename for i in infos]
    if sorted(names) != sorted(f"{a}.npy" for a in DATA_ARRAYS):
        raise CostModelFileError(f"{DATA_MEMBER} holds {sorted(names)[:10]}, not {sorted(DATA_ARRAYS)}")
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED or info.file_size > MAX_MEMBER_BYTES:
            raise CostModelFileError(f"{DATA_MEMBER}: {info.filename} is compressed or too large")
        try:
            with zf.open(info) as f:
                version = np.lib.format.read_magic(f)
                read_header = {
                    (1, 0): np.lib.format.read_array_header_1_0,
                    (2, 0): np.lib.format.read_array_header_2_0,
                }.get(version)
                if read_header is None:
                    raise ValueError(f"npy version {version}")
                shape, _, dtype = read_header(f)  # the header only: a Python literal, parsed as one
        except (ValueError, OSError, EOFError, SyntaxError, zipfile.BadZipFile) as exc:
            raise CostModelFileError(f"{DATA_MEMBER}: {info.filename} is not a plain .npy array ({exc})") from None
        if dtype.hasobject:
            raise CostModelFileError(f"{DATA_MEMBER}: {info.filename} is an object array (a pickle): refused unread")
        if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize > info.file_size:
            raise CostModelFileError(f"{DATA_MEMBER}: {info.filename} declares more data than it holds")


def read_cost_model_file(path: str) -> tuple[OrderedDict, int, bytes | None]:
    """The file's training data (``group hash -> (features list, costs)``), its number of records, and the
    booster's XGBoost JSON (None in the warm-up). Raises :class:`CostModelFileError`; never unpickles."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError as exc:
        raise CostModelFileError(f"cost model unreadable: {exc}") from None
    if head == b"\x1f\x8b":
        raise CostModelFileError(
            "an old-format cost model (TVM's gzipped tar with a pickled data.npy): refused "
            "unread; the next run that publishes to this key writes a data-only one"
        )
    try:
        members = read_tar_members(
            path,
            allowed={MODEL_MEMBER, DATA_MEMBER},
            max_member_bytes=MAX_MEMBER_BYTES,
            max_total_bytes=MAX_FILE_BYTES,
            max_archive_bytes=MAX_FILE_BYTES + (1 << 20),
        )
    except ArchiveError as exc:
        raise CostModelFileError(f"not a data-only cost model: {exc}") from None
    if DATA_MEMBER not in members:
        raise CostModelFileError(f"not a data-only cost model: no {DATA_MEMBER}")
    _check_npz(members[DATA_MEMBER])
    try:
        with np.load(io.BytesIO(members[DATA_MEMBER]), allow_pickle=False) as npz:
            fmt = _array(npz, "format", "U", 0)
            if str(fmt) != FORMAT:
                raise CostModelFileError(f"unknown cost model format {str(fmt)[:80]!r}")
            hashes = _array(npz, "group_hashes", "U", 1)
            sizes = _array(npz, "group_sizes", "i", 1)
            rows = _array(npz, "feature_rows", "i", 1)
            features = _array(npz, "features", "f", 2)
            costs = _array(npz, "costs", "f", 1)
    except CostModelFileError:
        raise
    except (ValueError, OSError, EOFError, KeyError) as exc:  # pickled or damaged arrays land here
        raise CostModelFileError(f"{DATA_MEMBER} refused: {exc}") from None
    n = int(sizes.sum()) if sizes.size else 0
    if (
        len(hashes) != len(sizes)
        or len(set(hashes.tolist())) != len(hashes)
        or (sizes < 0).any()
        or (rows < 0).any()
        or len(rows) != n
        or len(costs) != n
        or int(rows.sum()) != features.shape[0]
    ):
        raise CostModelFileError("cost model arrays do not agree (groups, candidates, feature rows, costs)")
    if not np.isfinite(features).all() or not np.isfinite(costs).all():
        raise CostModelFileError("cost model data holds a non-finite number")
    data: OrderedDict = OrderedDict()
    cand, row = 0, 0
    for h, k in zip(hashes.tolist(), sizes.tolist()):
        group = []
        for r in rows[cand : cand + k].tolist():
            group.append(features[row : row + r].copy())
            row += r
        data[h] = (group, costs[cand : cand + k].copy())
        cand += k
    return data, n, members.get(MODEL_MEMBER)


def _booster(model_json: bytes):
    import xgboost as xgb

    try:
        json_text = model_json.decode("utf-8")
        booster = xgb.Booster()
        booster.load_model(bytearray(json_text.encode("utf-8")))  # XGBoost's own JSON model parser
    except (UnicodeDecodeError, xgb.core.XGBoostError) as exc:
        raise CostModelFileError(f"{MODEL_MEMBER} is not an XGBoost JSON model: {str(exc)[:300]}") from None
    return booster


def check_cost_model_file(path: str) -> int:
    """Whether ``path`` is in the platform's data-only format: its number of records, or
    :class:`CostModelFileError`. Plain Python (a web or Celery process may call it): the archive, the
    arrays, and ``model.json`` as strict JSON; XGBoost parses the booster only where a run loads it."""
    _, n, model_json = read_cost_model_file(path)
    if model_json is not None:
        try:
            body = loads_finite(model_json.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise CostModelFileError(f"{MODEL_MEMBER} is not JSON: {str(exc)[:200]}") from None
        if not (isinstance(body, dict) and isinstance(body.get("learner"), dict)):
            raise CostModelFileError(f"{MODEL_MEMBER} is not an XGBoost JSON model (no learner)")
    return n


def load_xgb_model(inst, path: str) -> None:
    """Load the platform-format file at ``path`` into ``inst`` (TVM's ``XGBModel`` instance): its data, and
    its booster when the file has one (a model saved in its warm-up has none and trains when it leaves it).
    Raises :class:`CostModelFileError` and leaves ``inst`` untouched on a refused file."""
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import FeatureGroup

    raw, n, model_json = read_cost_model_file(path)
    booster = _booster(model_json) if model_json is not None else None
    data: OrderedDict = OrderedDict()
    for h, (features, costs) in raw.items():
        if features:
            data[h] = FeatureGroup(group_hash=h, features=features, costs=costs)
    inst.data, inst.data_size, inst.booster = data, n, booster


def data_only(cost_model):
    """Make an ``XGBModel``'s ``save``/``load`` (what ``cost_model.save(path)`` calls) the platform's
    data-only ones; apply it before ``search.train_when_needed``, which wraps the ``save`` it finds.
    Returns the model."""
    inst = cost_model._inst
    inst.save = lambda path: save_xgb_model(inst, path)
    inst.load = lambda path: load_xgb_model(inst, path)
    return cost_model
