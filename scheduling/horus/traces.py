"""Trace parsing (Alibaba GPU 2023, Philly) and workload assignment.

Parsers take a path (``.csv`` or ``.csv.gz``) or a file-like object (text or
binary, e.g. a Django ``UploadedFile``) and return :class:`Job` /
:class:`~.cluster.NodeSpec` lists. A malformed row raises
:class:`TraceFormatError` naming the file, the 1-based line and the column.

Formats (header row required, extra columns ignored):

* Alibaba ``openb_node_list_*.csv``: ``sn, cpu_milli, memory_mib, gpu, model``
* Alibaba ``openb_pod_list_*.csv``: ``name, cpu_milli, memory_mib, num_gpu,
  gpu_milli`` (``gpu_spec`` optional: the GPU models a pod accepts,
  ``|``-separated, empty = any) and, for replay, ``creation_time,
  deletion_time`` (seconds; ``scheduled_time`` optional). Duration = deletion
  - (scheduled or creation). CPU-only pods (``num_gpu`` 0) are kept: FGD's
  workload and the fill method count them.
* Philly (Pollux artifact): ``timestamp, duration, num_gpus`` (``gpu_time``,
  ``cluster`` optional); timestamps ``YYYY-MM-DD HH:MM:SS``, made relative to
  the earliest job.

Neither trace says which model a job trains. :func:`assign_workloads` gives
each job a zoo model and batch size by a stated, seeded mapping; the job's
TRUE utilization/memory come from the profile table (what the simulator
runs), its PREDICTED ones from the predictor (what policies see).
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, UTC
from pathlib import Path
from typing import IO, Any

import numpy as np

from .cluster import MILLI, ClusterSpec, NodeSpec
from .features import DATA_DIR
from .profiles import ProfileTable, gpu_spec

__all__ = [
    "Job",
    "Node",
    "TraceFormatError",
    "TraceTooLarge",
    "TraceData",
    "decode_trace",
    "check_upload",
    "trace_summary",
    "load_alibaba_nodes",
    "load_alibaba_pods",
    "load_philly",
    "parse_trace",
    "alibaba_cluster",
    "assign_workloads",
    "time_slice",
    "compress_time",
    "cap_durations",
    "predictions_from",
    "with_gpu_types",
    "with_cpu_pods",
    "DEFAULT_TRACE_DIR",
    "ALIBABA_NODES_PATH",
    "ALIBABA_PODS_PATH",
    "ALIBABA_POD_LISTS",
    "PHILLY_PATH",
]

Node = NodeSpec
DEFAULT_TRACE_DIR = DATA_DIR / "traces"
ALIBABA_NODES_PATH = DEFAULT_TRACE_DIR / "alibaba-gpu-2023" / "openb_node_list_gpu_node.csv"
ALIBABA_PODS_PATH = DEFAULT_TRACE_DIR / "alibaba-gpu-2023" / "openb_pod_list_default.csv"
#: the ATC'23 artifact's pod lists shipped here: trace name -> file (its workload name is the file's stem).
#: gpushare40/100 re-draw the GPU-sharing pods' shares (40 %/100 % of GPU pods share a GPU), multigpu20
#: makes 20 % of GPU pods multi-GPU; multigpu20 has no timestamps (fill method only)
ALIBABA_POD_LISTS = {
    "alibaba": ALIBABA_PODS_PATH,
    "alibaba_gpushare40": DEFAULT_TRACE_DIR / "alibaba-gpu-2023" / "openb_pod_list_gpushare40.csv",
    "alibaba_gpushare100": DEFAULT_TRACE_DIR / "alibaba-gpu-2023" / "openb_pod_list_gpushare100.csv",
    "alibaba_multigpu20": DEFAULT_TRACE_DIR / "alibaba-gpu-2023" / "openb_pod_list_multigpu20.csv",
}
PHILLY_PATH = DEFAULT_TRACE_DIR / "philly" / "philly.csv.gz"


class TraceFormatError(ValueError):
    """A trace file is malformed. ``file``, ``line`` (1-based, header = 1) and
    ``column`` say where."""

    def __init__(self, file: str, line: int | None, column: str | None, message: str):
        self.file, self.line, self.column, self.message = file, line, column, message
        where = file
        if line is not None:
            where += f", line {line}"
        if column is not None:
            where += f", column {column!r}"
        super().__init__(f"{where}: {message}")


@dataclass(slots=True)
class Job:
    """A trace job. ``true_*`` are what the simulator runs; ``pred_*`` what
    policies see (None until :func:`assign_workloads`)."""

    job_id: str
    submit_time: float
    duration_s: float
    num_gpus: int
    gpu_milli: int = MILLI
    cpu_milli: int = 0
    ram_mib: int = 0
    single_node: bool = False
    model: str | None = None
    batch_size: int | None = None
    true_util_pct: float | None = None
    true_mem_mb: float | None = None
    pred_util_pct: float | None = None
    pred_mem_mb: float | None = None
    source: str = ""
    line: int = 0
    #: the GPU model ``true_util_pct`` holds for (None: every model); on another the simulator
    #: rescales it (:func:`.profiles.util_on_gpu`)
    util_gpu_model: str | None = None
    #: True when the trace itself gave ``true_util_pct`` (Philly ``gpu_util``): kept by assign_workloads
    util_from_trace: bool = False
    #: GPU models the job may run on, ``|``-separated (Alibaba ``gpu_spec``); "" = any
    gpu_type: str = ""

    @property
    def gpu_request(self) -> float:
        """GPUs requested (fractional for GPU-sharing pods)."""
        return self.num_gpus * min(self.gpu_milli, MILLI) / MILLI

    @property
    def run_util_pct(self) -> float:
        """``true_util_pct``, which a simulation runs; a job without it cannot be simulated."""
        return _truth(self.true_util_pct, "true_util_pct", self.job_id)

    @property
    def run_mem_mb(self) -> float:
        """``true_mem_mb``, which a simulation runs; a job without it cannot be simulated."""
        return _truth(self.true_mem_mb, "true_mem_mb", self.job_id)


def _truth(value: float | None, field: str, job_id: str) -> float:
    if value is None:
        raise ValueError(f"job {job_id} has no {field}: assign_workloads sets it before a simulation")
    return float(value)


class TraceTooLarge(TraceFormatError):
    """A trace (or what its gzip data inflates to) is over the byte limit."""


# --------------------------------------------------------------------------- reading

#: What a trace may be read to, in bytes, where the caller names no limit (shipped and local files;
#: uploads pass the platform's SCHEDULING_MAX_TRACE_BYTES).
DEFAULT_MAX_TRACE_BYTES = 512 * 1024 * 1024

#: Magic numbers of compressed containers: gzip is undone once; any of these inside it, or any but
#: gzip outside, is refused (compression is undone exactly once, with a bound).
_COMPRESSED_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip"),
    (b"PK\x03\x04", "zip"),
    (b"PK\x05\x06", "zip"),
    (b"PK\x07\x08", "zip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"7z\xbc\xaf\x27\x1c", "7z"),
    (b"\x04\x22\x4d\x18", "lz4"),
)


def _compression(data: bytes) -> str | None:
    return next((kind for magic, kind in _COMPRESSED_MAGIC if data.startswith(magic)), None)


def _gunzip_bounded(data: bytes, *, limit: int, name: str) -> bytes:
    """Inflate gzip data (all members), refusing it as soon as it passes ``limit`` bytes or is corrupt."""
    out, rest = bytearray(), data
    while rest:
        d = zlib.decompressobj(wbits=31)
        try:
            while not d.eof:  # 1 MB of output at a time
                chunk = d.decompress(rest, 2**20)
                rest = d.unconsumed_tail
                if not chunk and not rest:
                    break  # input exhausted before the end of the stream
                out += chunk
                if len(out) > limit:
                    raise TraceTooLarge(
                        name,
                        None,
                        None,
                        f"the gzip data inflates to more than {limit / 2**20:.0f} MB, the trace size limit",
                    )
        except zlib.error as exc:
            raise TraceFormatError(name, None, None, f"corrupt gzip data ({exc})") from None
        if not d.eof:
            raise TraceFormatError(name, None, None, "the gzip data is cut short (incomplete upload or copy)")
        rest = d.unused_data.lstrip(b"\0")
    return bytes(out)


def decode_trace(data: bytes | str, *, name: str, max_bytes: int = DEFAULT_MAX_TRACE_BYTES) -> str:
    """A trace file's text: gzip inflated exactly once, bounded by ``max_bytes``; refused (TraceFormatError,
    TraceTooLarge) when it is over the limit, compressed inside its gzip or by anything but gzip, holds
    binary content (NUL bytes) or is not UTF-8. The parsers read only what this returns, so nothing is
    ever inflated twice."""
    if isinstance(data, str):
        return data
    if len(data) > max_bytes:
        raise TraceTooLarge(name, None, None, f"the file is over the {max_bytes / 2**20:.0f} MB trace size limit")
    outer = _compression(data)
    if outer == "gzip":
        data = _gunzip_bounded(data, limit=max_bytes, name=name)
        inner = _compression(data)
        if inner is not None:
            raise TraceFormatError(
                name,
                None,
                None,
                f"the gzip data holds {inner}-compressed content; a trace is "
                "compressed at most once: gzip the CSV itself, once",
            )
    elif outer is not None:
        raise TraceFormatError(
            name, None, None, f"the file is {outer}-compressed; only gzip (.gz) or plain CSV text is accepted"
        )
    nul = data.find(b"\0")
    if nul >= 0:
        raise TraceFormatError(name, None, None, f"binary content (a NUL byte at byte {nul}): a trace is CSV text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise TraceFormatError(name, None, None, f"not UTF-8 text (byte {e.start})") from None


def _open_rows(source: str | os.PathLike[str] | IO[Any], name: str | None) -> tuple[Iterator[list[str]], str, Any]:
    """CSV row iterator over a path or file-like object (text, or bytes decoded by :func:`decode_trace`)."""
    if isinstance(source, (str, os.PathLike)):
        p = Path(source)
        display = name or p.name
        try:
            with open(p, "rb") as raw:
                data = raw.read(DEFAULT_MAX_TRACE_BYTES + 1)
        except OSError as e:
            raise TraceFormatError(display, None, None, f"cannot open: {e.strerror}") from None
    else:
        display = name or getattr(source, "name", None) or "<upload>"
        display = os.path.basename(str(display))
        data = source.read()
    text = decode_trace(data, name=display)
    return csv.reader(io.StringIO(text, newline="")), display, None


def _header(rows: Iterator[list[str]], file: str, required: Sequence[str]) -> dict[str, int]:
    try:
        header = next(rows)
    except StopIteration:
        raise TraceFormatError(file, 1, None, "empty file (no header row)") from None
    except csv.Error as e:
        raise TraceFormatError(file, 1, None, f"bad CSV: {e}") from None
    cols = {h.strip(): i for i, h in enumerate(header)}
    missing = [c for c in required if c not in cols]
    if missing:
        raise TraceFormatError(
            file,
            1,
            missing[0],
            f"header lacks required column(s) {', '.join(missing)}; has {', '.join(cols) or 'none'}",
        )
    return cols


def _iter_records(rows: Iterator[list[str]], file: str, ncols: int) -> Iterator[tuple[int, list[str]]]:
    line = 1
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except csv.Error as e:
            raise TraceFormatError(file, line + 1, None, f"bad CSV: {e}") from None
        line += 1
        if not row or all(not c.strip() for c in row):
            continue  # blank line
        if len(row) < ncols:
            raise TraceFormatError(file, line, None, f"expected {ncols} fields, got {len(row)}")
        yield line, row


def _int(
    row: list[str],
    cols: Mapping[str, int],
    col: str,
    file: str,
    line: int,
    *,
    lo: int | None = 0,
    hi: int | None = None,
    default: int | None = None,
) -> int:
    s = row[cols[col]].strip() if col in cols else ""
    if s == "" and default is not None:
        return default
    try:
        v = float(s)
        if not math.isfinite(v) or v != int(v):
            raise ValueError
        v = int(v)
    except ValueError:
        raise TraceFormatError(file, line, col, f"expected an integer, got {s!r}") from None
    if lo is not None and v < lo:
        raise TraceFormatError(file, line, col, f"must be >= {lo}, got {v}")
    if hi is not None and v > hi:
        raise TraceFormatError(file, line, col, f"must be <= {hi}, got {v}")
    return v


def _float(row: list[str], cols: Mapping[str, int], col: str, file: str, line: int, *, lo: float | None = 0.0) -> float:
    s = row[cols[col]].strip()
    try:
        v = float(s)
        if not math.isfinite(v):
            raise ValueError
    except ValueError:
        raise TraceFormatError(file, line, col, f"expected a number, got {s!r}") from None
    if lo is not None and v < lo:
        raise TraceFormatError(file, line, col, f"must be >= {lo:g}, got {v:g}")
    return v


def load_alibaba_nodes(
    source: str | os.PathLike[str] | IO[Any] = ALIBABA_NODES_PATH, *, name: str | None = None, gpu_only: bool = True
) -> list[NodeSpec]:
    """Nodes of an Alibaba ``openb_node_list_*.csv``; GPU memory from
    :data:`~.profiles.GPU_SPECS` by model name (G2/G3 assumed, see there)."""
    rows, file, _ = _open_rows(source, name)
    cols = _header(rows, file, ("sn", "cpu_milli", "memory_mib", "gpu", "model"))
    out: list[NodeSpec] = []
    seen: set[str] = set()
    for line, row in _iter_records(rows, file, len(cols)):
        sn = row[cols["sn"]].strip()
        if not sn:
            raise TraceFormatError(file, line, "sn", "empty node name")
        if sn in seen:
            raise TraceFormatError(file, line, "sn", f"duplicate node {sn!r}")
        seen.add(sn)
        cpu = _int(row, cols, "cpu_milli", file, line, lo=1)
        ram = _int(row, cols, "memory_mib", file, line, lo=1)
        ngpu = _int(row, cols, "gpu", file, line, lo=0, hi=64)
        model = row[cols["model"]].strip()
        if ngpu > 0 and not model:
            raise TraceFormatError(file, line, "model", f"node has {ngpu} GPUs but no GPU model")
        if ngpu == 0 and gpu_only:
            continue
        out.append(NodeSpec(sn, ngpu, model or "none", gpu_spec(model).mem_mb if ngpu else 0.0, cpu, ram))
    if not out:
        raise TraceFormatError(file, None, None, "no GPU nodes")
    return out


def alibaba_cluster(nodes: Sequence[NodeSpec] | None = None, *, name: str = "alibaba-2023") -> ClusterSpec:
    """The Alibaba-2023 GPU cluster (GPU sharing by ``gpu_milli`` enforced)."""
    nodes = list(nodes) if nodes is not None else load_alibaba_nodes()
    return ClusterSpec(
        tuple(nodes),
        name,
        enforce_milli=True,
        note="Alibaba cluster-trace-gpu-v2023 GPU nodes; G2/G3 memory assumed 32 GB",
    )


def load_alibaba_pods(
    source: str | os.PathLike[str] | IO[Any] = ALIBABA_PODS_PATH,
    *,
    name: str | None = None,
    gpu_only: bool = False,
    require_times: bool = True,
) -> list[Job]:
    """Pods of an Alibaba ``openb_pod_list_*.csv`` as jobs (one node each), CPU-only pods included.

    ``gpu_only`` drops CPU-only pods (``num_gpu == 0``). ``gpu_spec`` becomes
    :attr:`Job.gpu_type` (checked against :data:`GPU_SPEC_NAME`). With
    ``require_times`` (replay) creation/deletion times must be present; the
    fill method does not need them (``require_times=False``: times default 0)."""
    rows, file, _ = _open_rows(source, name)
    req = ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"]
    if require_times:
        req += ["creation_time", "deletion_time"]
    cols = _header(rows, file, req)
    out: list[Job] = []
    seen: set[str] = set()
    for line, row in _iter_records(rows, file, len(cols)):
        pod = row[cols["name"]].strip()
        if not pod:
            raise TraceFormatError(file, line, "name", "empty pod name")
        if pod in seen:
            raise TraceFormatError(file, line, "name", f"duplicate pod {pod!r}")
        seen.add(pod)
        cpu = _int(row, cols, "cpu_milli", file, line)
        ram = _int(row, cols, "memory_mib", file, line)
        ngpu = _int(row, cols, "num_gpu", file, line, lo=0, hi=64)
        milli = _int(row, cols, "gpu_milli", file, line, lo=0, hi=MILLI)
        if ngpu > 0 and milli == 0:
            raise TraceFormatError(file, line, "gpu_milli", f"pod requests {ngpu} GPU(s) with gpu_milli 0")
        if ngpu > 1 and milli != MILLI:
            raise TraceFormatError(
                file, line, "gpu_milli", f"multi-GPU pod must request whole GPUs (1000), got {milli}"
            )
        if ngpu == 0 and gpu_only:
            continue
        spec = _gpu_spec(row, cols, file, line) if ngpu else ""
        if require_times or "creation_time" in cols:
            created = _int(row, cols, "creation_time", file, line, default=0 if not require_times else None)
            deleted = _int(row, cols, "deletion_time", file, line, default=created if not require_times else None)
            sched = (
                _int(row, cols, "scheduled_time", file, line, default=created) if "scheduled_time" in cols else created
            )
            if deleted < created:
                raise TraceFormatError(file, line, "deletion_time", f"deleted ({deleted}) before created ({created})")
            start = sched if sched >= created else created
            duration = float(max(1, deleted - min(max(start, created), deleted)))
        else:
            created, duration = 0, 1.0
        out.append(
            Job(
                pod,
                float(created),
                duration,
                ngpu,
                milli if ngpu else 0,
                cpu,
                ram,
                single_node=True,
                source=file,
                line=line,
                gpu_type=spec,
            )
        )
    return out


#: what one GPU model name in ``gpu_spec`` may look like (``V100M16``, ``A10``, ``G2``)
GPU_SPEC_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")


def _gpu_spec(row: list[str], cols: Mapping[str, int], file: str, line: int) -> str:
    """A pod's ``gpu_spec`` cell as ``"A|B"`` (sorted, no duplicates), "" when absent or empty."""
    raw = row[cols["gpu_spec"]].strip() if "gpu_spec" in cols else ""
    if not raw:
        return ""
    names = [n.strip() for n in raw.split("|")]
    bad = next((n for n in names if not GPU_SPEC_NAME.fullmatch(n)), None)
    if bad is not None:
        raise TraceFormatError(file, line, "gpu_spec", f"expected GPU model names separated by '|', got {raw!r}")
    return "|".join(sorted(set(names)))


_EPOCH = datetime(1970, 1, 1)


def _philly_time(s: str, file: str, line: int) -> float:
    """Seconds since 1970 of a naive timestamp, independent of the local timezone."""
    try:
        dt = datetime.fromisoformat(s.strip())
        if dt.tzinfo is not None:
            dt = dt.astimezone(UTC).replace(tzinfo=None)
        return (dt - _EPOCH).total_seconds()
    except ValueError:
        raise TraceFormatError(file, line, "timestamp", f"expected 'YYYY-MM-DD HH:MM:SS', got {s!r}") from None


def load_philly(source: str | os.PathLike[str] | IO[Any] = PHILLY_PATH, *, name: str | None = None) -> list[Job]:
    """Jobs of the Philly trace (Pollux's ``philly.csv``), submit times relative
    to the earliest job, in submit order (ties: file order). Multi-GPU jobs may
    span nodes (the trace has no placement). An optional ``gpu_util`` column is
    the job's TRUE standalone utilization in % (0 < u <= 100; an empty cell: not
    known, the assumed distribution applies), used instead of the profiles'."""
    rows, file, _ = _open_rows(source, name)
    cols = _header(rows, file, ("timestamp", "duration", "num_gpus"))
    raw: list[tuple[float, float, int, int, float | None]] = []
    for line, row in _iter_records(rows, file, len(cols)):
        ts = _philly_time(row[cols["timestamp"]], file, line)
        dur = _float(row, cols, "duration", file, line)
        ng = _int(row, cols, "num_gpus", file, line, lo=1, hi=4096)
        raw.append((ts, dur, ng, line, _philly_util(row, cols, file, line)))
    if not raw:
        raise TraceFormatError(file, None, None, "no jobs")
    t0 = min(r[0] for r in raw)
    raw.sort(key=lambda r: (r[0], r[3]))
    return [
        Job(
            f"philly-{line - 1}",
            ts - t0,
            max(1.0, dur),
            ng,
            MILLI,
            source=file,
            line=line,
            true_util_pct=util,
            util_from_trace=util is not None,
        )
        for ts, dur, ng, line, util in raw
    ]


def _philly_util(row: list[str], cols: Mapping[str, int], file: str, line: int) -> float | None:
    """The optional ``gpu_util`` cell: a percentage in (0, 100], or None when the column or value is absent."""
    if "gpu_util" not in cols or not row[cols["gpu_util"]].strip():
        return None
    u = _float(row, cols, "gpu_util", file, line)
    if not 0.0 < u <= 100.0:
        raise TraceFormatError(file, line, "gpu_util", f"must be a percentage in (0, 100], got {u:g}")
    return u


@dataclass
class TraceData:
    kind: str  # "philly" | "alibaba_pods" | "alibaba_nodes"
    jobs: list[Job]
    nodes: list[NodeSpec]


def parse_trace(
    source: str | os.PathLike[str] | IO[Any], *, name: str | None = None, max_bytes: int = DEFAULT_MAX_TRACE_BYTES
) -> TraceData:
    """Parse an uploaded trace of any supported kind, detected from its header. The bytes are decoded
    once (:func:`decode_trace`, at most ``max_bytes``); the parsers read that text."""
    if isinstance(source, (str, os.PathLike)):
        name = name or Path(source).name
        with open(source, "rb") as fh:
            data = fh.read(max_bytes + 1)
    else:
        data = source.read(max_bytes + 1)
        name = name or os.path.basename(str(getattr(source, "name", "") or "<upload>"))
    text = decode_trace(data, name=name or "<upload>", max_bytes=max_bytes)
    first = text[:4096].splitlines()[0] if text else ""
    cols = {c.strip() for c in first.split(",")}
    if {"timestamp", "duration", "num_gpus"} <= cols:
        return TraceData("philly", load_philly(io.StringIO(text), name=name), [])
    if {"sn", "gpu", "model"} <= cols:
        return TraceData("alibaba_nodes", [], load_alibaba_nodes(io.StringIO(text), name=name))
    if {"name", "num_gpu", "gpu_milli"} <= cols:
        return TraceData(
            "alibaba_pods", load_alibaba_pods(io.StringIO(text), name=name, require_times="creation_time" in cols), []
        )
    raise TraceFormatError(
        name or "<upload>",
        1,
        None,
        "unknown trace format: expected a Philly header (timestamp,duration,num_gpus), "
        "an Alibaba pod list (name,...,num_gpu,gpu_milli) or node list (sn,...,gpu,model)",
    )


def trace_summary(jobs: Sequence[Job]) -> dict[str, Any]:
    """What an uploaded trace's summary holds: job count, submit span, median duration, GPU counts, sharing jobs."""
    if not jobs:
        return {}
    dur = np.array([j.duration_s for j in jobs])
    sub = np.array([j.submit_time for j in jobs])
    gpus: dict[str, int] = {}
    for j in jobs:
        gpus[str(j.num_gpus)] = gpus.get(str(j.num_gpus), 0) + 1
    return {
        "jobs": len(jobs),
        "span_s": float(sub.max() - sub.min()),
        "median_duration_s": float(np.median(dur)),
        "num_gpus": dict(sorted(gpus.items(), key=lambda kv: int(kv[0]))),
        "sharing_jobs": sum(1 for j in jobs if 0 < j.gpu_milli < 1000),
        "gpu_request_per_pod": gpu_request_per_pod(jobs),
    }


def gpu_request_per_pod(jobs: Sequence[Job]) -> float:
    """Mean GPUs a pod of the list requests (``Job.gpu_request``; CPU-only pods count 0): sizes a fill's cost."""
    return float(sum(j.gpu_request for j in jobs) / len(jobs)) if jobs else 0.0


def check_upload(*, data: bytes, filename: str, max_bytes: int) -> dict[str, Any]:
    """What the platform's upload sandbox (``common.sandbox.run_in_child``) runs on an uploaded trace: decode
    once, parse every row, and answer JSON-safe data only: ``{"ok": True, "kind", "n_jobs", "summary"}`` or
    ``{"ok": False, "code" ("too_large" | "trace_malformed"), "message", "line", "column"}``."""
    try:
        parsed = parse_trace(io.BytesIO(data), name=filename, max_bytes=max_bytes)
    except TraceTooLarge as exc:
        return {"ok": False, "code": "too_large", "message": str(exc), "line": None, "column": None}
    except TraceFormatError as exc:
        return {"ok": False, "code": "trace_malformed", "message": str(exc), "line": exc.line, "column": exc.column}
    except (
        ValueError,
        OverflowError,
        OSError,
        EOFError,
        IndexError,
    ) as exc:  # hostile input the parser did not foresee
        return {
            "ok": False,
            "code": "trace_malformed",
            "message": f"{filename}: cannot be read as a trace ({exc}).",
            "line": None,
            "column": None,
        }
    return {
        "ok": True,
        "kind": parsed.kind,
        "n_jobs": len(parsed.jobs) or len(parsed.nodes),
        "summary": trace_summary(parsed.jobs),
    }


# --------------------------------------------------------------------------- shaping


def time_slice(jobs: Sequence[Job], start_s: float, span_s: float) -> list[Job]:
    """Jobs submitted in ``[start_s, start_s + span_s)``, re-based to start at 0."""
    sel = [j for j in jobs if start_s <= j.submit_time < start_s + span_s]
    return [replace(j, submit_time=j.submit_time - start_s) for j in sel]


def compress_time(jobs: Sequence[Job], factor: float) -> list[Job]:
    """Divide inter-arrival times by ``factor`` (durations unchanged): a
    ``factor``-times higher arrival rate on the same jobs."""
    if factor <= 0:
        raise ValueError("factor must be > 0")
    if not jobs:
        return []
    t0 = min(j.submit_time for j in jobs)
    return [replace(j, submit_time=(j.submit_time - t0) / factor) for j in jobs]


def cap_durations(jobs: Sequence[Job], max_s: float) -> list[Job]:
    """Cap every duration at ``max_s`` (e.g. pods censored at the trace end)."""
    return [replace(j, duration_s=min(j.duration_s, max_s)) if j.duration_s > max_s else j for j in jobs]


# --------------------------------------------------------------------------- Alibaba variants


def with_gpu_types(pods: Sequence[Job], share: float, nodes: Sequence[NodeSpec], *, seed: int = 0) -> list[Job]:
    """A variant of an Alibaba pod list in which ``share`` of the GPU pods ask for one GPU model (FGD's
    ``gpuspec`` workloads): the typed pods are drawn at random, each model in proportion to the
    cluster's GPUs of it (so every request can be met). Pods already typed keep their type."""
    if not 0 <= share <= 1:
        raise ValueError("share must be in [0, 1]")
    gpus: dict[str, int] = {}
    for n in nodes:
        if n.num_gpus:
            gpus[n.gpu_model] = gpus.get(n.gpu_model, 0) + n.num_gpus
    models = sorted(gpus)
    weights = np.array([gpus[m] for m in models], float)
    rng = np.random.default_rng([seed, 0x7E5])
    gpu_idx = [i for i, p in enumerate(pods) if p.num_gpus > 0 and not p.gpu_type]
    pick: np.ndarray | list[int] = (
        rng.choice(len(gpu_idx), size=int(round(share * len(gpu_idx))), replace=False) if gpu_idx else []
    )
    typed = {gpu_idx[int(i)]: models[int(rng.choice(len(models), p=weights / weights.sum()))] for i in pick}
    return [replace(p, gpu_type=typed[i]) if i in typed else p for i, p in enumerate(pods)]


def with_cpu_pods(pods: Sequence[Job], share: float, *, seed: int = 0) -> list[Job]:
    """A variant of an Alibaba pod list whose CPU-only pods are ``share`` of all pods (FGD's ``cpu``
    workloads): CPU-only pods are drawn (with replacement, renamed) from the list's own, or dropped."""
    if not 0 <= share < 1:
        raise ValueError("share must be in [0, 1)")
    gpu = [p for p in pods if p.num_gpus > 0]
    cpu = [p for p in pods if p.num_gpus == 0]
    want = int(round(share / (1 - share) * len(gpu)))
    if want and not cpu:
        raise ValueError("the pod list has no CPU-only pods to draw from")
    rng = np.random.default_rng([seed, 0xC9])
    drawn = (
        [
            replace(cpu[int(k)], job_id=f"{cpu[int(k)].job_id}~{i}")
            for i, k in enumerate(rng.integers(len(cpu), size=want))
        ]
        if want
        else []
    )
    return gpu + drawn


# --------------------------------------------------------------------------- workloads


def assign_workloads(
    jobs: Sequence[Job],
    table: ProfileTable,
    *,
    predictions: Mapping[tuple[str, int], tuple[float, float]] | None = None,
    seed: int = 0,
    mapping: str = "auto",
    ref_mem_mb: float | None = None,
) -> list[Job]:
    """Copies of ``jobs`` with model, batch size, TRUE util/memory (from
    ``table``) and PREDICTED util/memory (from ``predictions``, a
    ``{(model, batch): (util, mem)}`` map; None = oracle, prediction = truth).

    Mapping (seeded, one draw per job in list order):

    * ``"uniform"``: every (model, batch) configuration of ``table`` equally likely.
    * ``"request"``: for a GPU-sharing job (``gpu_milli < 1000``), uniform over
      the configurations that fit its request - utilization <= gpu_milli/10 %
      and memory <= gpu_milli/1000 of ``ref_mem_mb`` (default: the table's GPU)
      - falling back to the lowest-utilization configuration; whole-GPU jobs
      as ``"uniform"``.
    * ``"auto"``: ``"request"`` if any job shares a GPU, else ``"uniform"``.

    A job that already names a model and batch size in the table keeps them. A job whose trace gave
    its utilization (``util_from_trace``) keeps that as its TRUE utilization and gets the configuration
    whose profiled utilization is nearest to it (its memory and prediction come from that one).
    ``util_gpu_model`` is set to the table's GPU model: the model the utilizations hold for.
    """
    if mapping not in ("auto", "uniform", "request"):
        raise ValueError("mapping must be 'auto', 'uniform' or 'request'")
    if mapping == "auto":
        mapping = "request" if any(0 < j.gpu_milli < MILLI for j in jobs) else "uniform"
    rng = np.random.default_rng(seed)
    keys = table.keys
    utils = np.array([table.util[k] for k in keys])
    mems = np.array([table.mem[k] for k in keys])
    ref = ref_mem_mb if ref_mem_mb is not None else gpu_spec(table.gpu_model).mem_mb
    by_milli: dict[int, np.ndarray] = {}
    out: list[Job] = []
    draws = rng.random(len(jobs))
    lowest = int(np.argmin(utils))
    for j, r in zip(jobs, draws):
        if j.model is not None and j.batch_size is not None and (j.model, j.batch_size) in table.util:
            key = (j.model, j.batch_size)
        elif j.util_from_trace and j.true_util_pct is not None:
            key = keys[int(np.argmin(np.abs(utils - float(j.true_util_pct))))]
        else:
            if mapping == "request" and 0 < j.gpu_milli < MILLI:
                cand = by_milli.get(j.gpu_milli)
                if cand is None:
                    cand = np.flatnonzero((utils <= j.gpu_milli / 10.0) & (mems <= ref * j.gpu_milli / MILLI))
                    if len(cand) == 0:
                        cand = np.array([lowest])
                    by_milli[j.gpu_milli] = cand
                key = keys[int(cand[min(int(r * len(cand)), len(cand) - 1)])]
            else:
                key = keys[min(int(r * len(keys)), len(keys) - 1)]
        tu, tm = table.util[key], table.mem[key]
        if j.util_from_trace and j.true_util_pct is not None:
            tu = float(j.true_util_pct)
        if predictions is None:
            pu, pm = tu, tm
        else:
            pu, pm = predictions[key]
        out.append(
            replace(
                j,
                model=key[0],
                batch_size=key[1],
                true_util_pct=tu,
                true_mem_mb=tm,
                pred_util_pct=float(pu),
                pred_mem_mb=float(pm),
                util_gpu_model=table.gpu_model,
            )
        )
    return out


def predictions_from(
    predictor: Any, table: ProfileTable, *, out_of_fold: bool = True
) -> dict[tuple[str, int], tuple[float, float]]:
    """``{(model, batch): (util, mem)}`` for every configuration of ``table``
    from a :class:`~.predictor.TrainedPredictor`: its out-of-fold (held-out
    model) prediction when it has one and ``out_of_fold``, else a fresh
    prediction from the features."""
    out: dict[tuple[str, int], tuple[float, float]] = {}
    missing = []
    for key in table.keys:
        cv = predictor.cv_predictions.get((key[0], key[1], table.gpu_model)) if out_of_fold else None
        if cv is not None:
            out[key] = cv
        else:
            missing.append(key)
    if missing:
        u, m = predictor.predict_many([table.features[k] for k in missing], gpu_model=table.gpu_model)
        for k, uu, mm in zip(missing, u, m):
            out[k] = (float(uu), float(mm))
    return out
