"""Validate an uploaded ONNX model before it enters the registry.

:func:`validate_onnx_bytes` (and :func:`validate_onnx_file`, which bounds
memory by checking the size before reading) either returns a
:class:`ValidatedModel` (the parsed model with a symbolic batch dimension set
to 1, its inputs and outputs, Horus graph features and the TVM tuning tasks it
will produce) or raises :class:`~core.onnx_models.errors.OnnxValidationError`
with a machine ``code`` and a message that says what is wrong and how to fix
it. The checks run cheapest first, so a bad upload is refused before any
expensive work:

1. file name ends in ``.onnx``                       -> ``bad_extension``
2. size within the cap, not empty                    -> ``too_large``, ``empty``
3. bytes parse as an ONNX ModelProto                 -> ``not_protobuf``, ``truncated``
4. no tensor refers to external data files           -> ``external_data``
5. every input has a static shape (the batch dim may
   be symbolic: it is set to 1); every dim in 1..max -> ``missing_input_shape``,
                                                        ``absurd_dimension``
6. ``onnx.checker`` (structure, types, op schemas)   -> ``checker_failed``
7. strict shape inference (with 6, what
   ``check_model(full_check=True)`` runs)            -> ``shape_inference_failed``
   every tensor (inputs, intermediates, outputs)
   has at most ``max_tensor_elements`` elements      -> ``tensor_too_large``
8. every op has a converter in TVM's Relax ONNX
   frontend                                          -> ``unsupported_op``
9. all intermediate tensors together within
   ``max_activation_bytes``                          -> ``too_much_activation_memory``
   cost (FLOPs + bytes the data-movement ops copy)
   within ``max_gflops`` G-op equivalents            -> ``too_many_flops``
10. TVM imports the model and, with a
    ``task_counter``, names its tuning tasks
    (only with ``count_tasks=True``)                 -> ``tvm_import_failed``

Nothing here imports Django. TVM is imported lazily: with ``count_tasks=False``
only TVM's ONNX converter table is read (or, where TVM is not installed, a
snapshot of it taken from TVM 0.27), so the fast path needs no TVM compiler.
"""

from __future__ import annotations

import io
import logging
import math
import os
from dataclasses import dataclass, field
from collections.abc import Callable, Iterable
from typing import Any, BinaryIO

import onnx
from onnx import TensorProto, helper

from .errors import OnnxValidationError
from .features import GraphFeatures, _skeleton, compute_features

__all__ = [
    "DEFAULT_TARGET",
    "TaskCounter",
    "ValidatedModel",
    "check_upload_basics",
    "validate_onnx_bytes",
    "validate_onnx_file",
    "validate_onnx_model",
    "validate_upload_in_child",
    "supported_ops",
    "unsupported_ops",
]

log = logging.getLogger(__name__)

#: Names the tuning tasks of a model for a target. The caller passes one (the platform's comes from the
#: tuning engine, named in settings.ONNX_TASK_COUNTER), so this package imports no other engine.
TaskCounter = Callable[[onnx.ModelProto, dict], Iterable[str]]

#: Target used to count tuning tasks when none is given (TVM 0.27 dict form).
DEFAULT_TARGET: dict[str, Any] = {"kind": "llvm", "num-cores": 2}

_MB = 1024 * 1024
_GB = 1024 * _MB

#: Default caps (the platform passes its settings ONNX_MAX_TENSOR_ELEMENTS and
#: ONNX_MAX_ACTIVATION_BYTES): 2**28 elements is 1 GiB of float32 in one tensor;
#: 8 GiB for every intermediate tensor together (ResNet-18 needs ~25 MB, a BERT-base
#: layer at sequence 128 ~20 MB).
DEFAULT_MAX_TENSOR_ELEMENTS = 2**28
DEFAULT_MAX_ACTIVATION_BYTES = 8 * _GB
_READ_CHUNK = 4 * _MB

# Op types TVM 0.27.0's Relax ONNX frontend converts (keys of
# tvm.relax.frontend.onnx.onnx_frontend._get_convert_map()), used only where
# TVM cannot be imported; a test checks it still equals the live table.
_TVM_SUPPORTED_OPS_SNAPSHOT = frozenset(
    {
        "Abs",
        "Acos",
        "Acosh",
        "Add",
        "AffineGrid",
        "AllClassNMS",
        "And",
        "ArgMax",
        "ArgMin",
        "Asin",
        "Asinh",
        "Atan",
        "Atanh",
        "Attention",
        "AveragePool",
        "BatchNormalization",
        "BiasGelu",
        "BitShift",
        "BitwiseAnd",
        "BitwiseNot",
        "BitwiseOr",
        "BitwiseXor",
        "Cast",
        "CastLike",
        "Ceil",
        "Clip",
        "Compress",
        "Concat",
        "ConcatFromSequence",
        "Constant",
        "ConstantOfShape",
        "Conv",
        "ConvTranspose",
        "Cos",
        "Cosh",
        "CumSum",
        "DepthToSpace",
        "DequantizeLinear",
        "Div",
        "Dropout",
        "DynamicQuantizeLinear",
        "Einsum",
        "Elu",
        "EmbedLayerNormalization",
        "Equal",
        "Erf",
        "Exp",
        "Expand",
        "EyeLike",
        "FastGelu",
        "Flatten",
        "Floor",
        "Gather",
        "GatherElements",
        "GatherND",
        "Gelu",
        "Gemm",
        "GlobalAveragePool",
        "GlobalLpPool",
        "GlobalMaxPool",
        "Greater",
        "GreaterOrEqual",
        "GridSample",
        "GroupNormalization",
        "HardSigmoid",
        "HardSwish",
        "Hardmax",
        "Identity",
        "InstanceNormalization",
        "IsInf",
        "IsNaN",
        "LRN",
        "LayerNormalization",
        "LeakyRelu",
        "Less",
        "LessOrEqual",
        "Log",
        "LogSoftmax",
        "LpPool",
        "MatMul",
        "MatMulInteger",
        "MatMulInteger16",
        "Max",
        "MaxPool",
        "MaxRoiPool",
        "MaxUnpool",
        "Mean",
        "MeanVarianceNormalization",
        "Min",
        "Mish",
        "Mod",
        "Mul",
        "Neg",
        "NonMaxSuppression",
        "NonZero",
        "Not",
        "OneHot",
        "Optional",
        "OptionalGetElement",
        "OptionalHasElement",
        "Or",
        "PRelu",
        "Pad",
        "Pow",
        "QuantizeLinear",
        "RMSNormalization",
        "Range",
        "Reciprocal",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceMax",
        "ReduceMean",
        "ReduceMin",
        "ReduceProd",
        "ReduceSum",
        "ReduceSumSquare",
        "Relu",
        "Reshape",
        "Resize",
        "RoiAlign",
        "Round",
        "Scatter",
        "ScatterElements",
        "ScatterND",
        "Selu",
        "SequenceAt",
        "SequenceConstruct",
        "SequenceEmpty",
        "SequenceErase",
        "SequenceInsert",
        "SequenceLength",
        "Shape",
        "Shrink",
        "Sigmoid",
        "Sign",
        "Sin",
        "Sinh",
        "Size",
        "SkipLayerNormalization",
        "Slice",
        "Softmax",
        "Softplus",
        "Softsign",
        "SpaceToDepth",
        "Split",
        "SplitToSequence",
        "Sqrt",
        "Squeeze",
        "Sub",
        "Sum",
        "Tan",
        "Tanh",
        "ThresholdedRelu",
        "Tile",
        "TopK",
        "Transpose",
        "Trilu",
        "Unique",
        "Unsqueeze",
        "Upsample",
        "Where",
        "Xor",
    }
)
# Ops the frontend handles outside its converter table (see ONNXGraphImporter).
_TVM_DIRECT_OPS = frozenset({"Constant", "If"})


@dataclass
class ValidatedModel:
    """A model that passed validation.

    ``model`` is the parsed model with a symbolic batch dimension set to 1
    (otherwise as uploaded: no inferred shapes added). ``producer`` is the
    model's producer name and version, joined by a space (e.g. "pytorch 2.3.0"). ``inputs``/``outputs``
    are ``{"name", "shape", "dtype"}`` dicts; an output dimension shape
    inference could not resolve is -1. ``num_tuning_tasks`` is None when tasks
    were not counted (``count_tasks=False``, or no ``task_counter`` was given).
    """

    model: onnx.ModelProto | None  # None in a summary that came back from the sandbox (from_dict)
    opset: int
    ir_version: int
    producer: str
    inputs: list[dict]
    outputs: list[dict]
    batch_size: int
    features: GraphFeatures
    num_tuning_tasks: int | None = None
    task_names: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe summary (everything but the model itself)."""
        return {
            "opset": self.opset,
            "ir_version": self.ir_version,
            "producer": self.producer,
            "inputs": self.inputs,
            "outputs": self.outputs,
            "batch_size": self.batch_size,
            "features": self.features.to_dict(),
            "num_tuning_tasks": self.num_tuning_tasks,
            "task_names": list(self.task_names),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ValidatedModel:
        """The summary :meth:`to_dict` wrote (e.g. the sandboxed validator's answer), without the model."""
        return cls(
            model=None,
            opset=int(data["opset"]),
            ir_version=int(data["ir_version"]),
            producer=str(data["producer"]),
            inputs=list(data["inputs"]),
            outputs=list(data["outputs"]),
            batch_size=int(data["batch_size"]),
            features=GraphFeatures.from_dict(data["features"]),
            num_tuning_tasks=None if data.get("num_tuning_tasks") is None else int(data["num_tuning_tasks"]),
            task_names=[str(n) for n in data.get("task_names") or []],
        )


# --------------------------------------------------------------------------- public API


def validate_onnx_bytes(
    data: bytes,
    *,
    filename: str,
    max_bytes: int,
    max_gflops: float = 500.0,
    max_dim: int = 1_000_000,
    max_tensor_elements: int = DEFAULT_MAX_TENSOR_ELEMENTS,
    max_activation_bytes: int = DEFAULT_MAX_ACTIVATION_BYTES,
    count_tasks: bool = True,
    target: dict | None = None,
    task_counter: TaskCounter | None = None,
) -> ValidatedModel:
    """Validate the bytes of an uploaded ONNX file (see the module docstring for
    the checks, in order). Raises :class:`OnnxValidationError` on the first
    failure."""
    _check_filename(filename)
    _check_size(len(data), max_bytes)
    model = _parse(data)
    return _validate_parsed(
        model,
        max_gflops=max_gflops,
        max_dim=max_dim,
        count_tasks=count_tasks,
        target=target,
        task_counter=task_counter,
        max_tensor_elements=max_tensor_elements,
        max_activation_bytes=max_activation_bytes,
    )


def validate_onnx_file(
    path: str | os.PathLike | BinaryIO,
    *,
    max_bytes: int,
    filename: str | None = None,
    max_gflops: float = 500.0,
    max_dim: int = 1_000_000,
    max_tensor_elements: int = DEFAULT_MAX_TENSOR_ELEMENTS,
    max_activation_bytes: int = DEFAULT_MAX_ACTIVATION_BYTES,
    count_tasks: bool = True,
    target: dict | None = None,
    task_counter: TaskCounter | None = None,
) -> ValidatedModel:
    """Validate an ONNX file on disk, or a binary file object (e.g. a Django
    ``UploadedFile``), reading at most ``max_bytes + 1`` bytes: the size is
    checked from the file system (or the object's ``size``) before reading, and
    the read stops as soon as the cap is passed, so memory stays bounded even
    when the size was not known up front. ``filename`` overrides the name used
    for the extension check (default: the path's or object's name)."""
    if isinstance(path, (str, os.PathLike)):
        name = filename or os.path.basename(os.fspath(path))
        _check_filename(name)
        _check_size(os.stat(path).st_size, max_bytes)
        with open(path, "rb") as stream:
            data = _read_bounded(stream, max_bytes)
    else:
        fh = path
        name = filename or os.path.basename(str(getattr(fh, "name", "") or ""))
        _check_filename(name)
        size = getattr(fh, "size", None)
        if isinstance(size, int):
            _check_size(size, max_bytes)
        data = _read_bounded(fh, max_bytes)
    return validate_onnx_bytes(
        data,
        filename=name,
        max_bytes=max_bytes,
        max_gflops=max_gflops,
        max_dim=max_dim,
        max_tensor_elements=max_tensor_elements,
        max_activation_bytes=max_activation_bytes,
        count_tasks=count_tasks,
        target=target,
        task_counter=task_counter,
    )


def validate_onnx_model(
    model: onnx.ModelProto,
    *,
    max_gflops: float = 500.0,
    max_dim: int = 1_000_000,
    max_tensor_elements: int = DEFAULT_MAX_TENSOR_ELEMENTS,
    max_activation_bytes: int = DEFAULT_MAX_ACTIVATION_BYTES,
    count_tasks: bool = True,
    target: dict | None = None,
    task_counter: TaskCounter | None = None,
) -> ValidatedModel:
    """Checks 4-10 on an in-memory model (e.g. one built by the zoo). The
    model is copied, never modified."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return _validate_parsed(
        copy,
        max_gflops=max_gflops,
        max_dim=max_dim,
        count_tasks=count_tasks,
        target=target,
        task_counter=task_counter,
        max_tensor_elements=max_tensor_elements,
        max_activation_bytes=max_activation_bytes,
    )


def validate_upload_in_child(
    *,
    data: bytes,
    filename: str,
    max_bytes: int,
    max_gflops: float,
    max_tensor_elements: int,
    max_activation_bytes: int,
    count_tasks: bool,
    target: dict | None,
    task_counter: str | None,
) -> dict[str, Any]:
    """What the platform's upload sandbox (``common.sandbox.run_in_child``) runs: every check on the
    uploaded bytes, answered as JSON-safe data: ``{"ok": True, "validated": ValidatedModel.to_dict()}`` or
    ``{"ok": False, "code", "message"}``. ``task_counter`` is a dotted path ("package.module.function"),
    imported here in the child. A check that ran out of memory raises MemoryError (the sandbox reports
    the memory limit) instead of passing for a refusal of the model's content."""
    counter = None
    if task_counter:
        import importlib

        module, _, attr = task_counter.rpartition(".")
        counter = getattr(importlib.import_module(module), attr)
    try:
        validated = validate_onnx_bytes(
            data,
            filename=filename,
            max_bytes=max_bytes,
            max_gflops=max_gflops,
            max_tensor_elements=max_tensor_elements,
            max_activation_bytes=max_activation_bytes,
            count_tasks=count_tasks,
            target=target,
            task_counter=counter,
        )
    except OnnxValidationError as exc:
        cause = exc.__cause__
        if isinstance(cause, MemoryError) or "bad_alloc" in str(cause or ""):
            raise MemoryError(str(cause)) from None
        return {"ok": False, "code": exc.code, "message": exc.message}
    return {"ok": True, "validated": validated.to_dict()}


def check_upload_basics(*, filename: str, size: int, max_bytes: int) -> None:
    """Checks 1-2 only (name and size): what an upload gets before it is queued for validation."""
    _check_filename(filename)
    _check_size(size, max_bytes)


def supported_ops() -> frozenset[str]:
    """Op types TVM's Relax ONNX frontend can convert: the live converter table
    when TVM imports, else the TVM 0.27.0 snapshot bundled here."""
    try:
        from tvm.relax.frontend.onnx import onnx_frontend

        table = frozenset(onnx_frontend._get_convert_map())
    except Exception as exc:  # TVM absent or broken: fall back, loudly
        log.warning("TVM's ONNX converter table is unavailable (%s); using the 0.27 snapshot", exc)
        table = _TVM_SUPPORTED_OPS_SNAPSHOT
    return table | _TVM_DIRECT_OPS


def unsupported_ops(model: onnx.ModelProto) -> list[str]:
    """Sorted op types in ``model`` (subgraphs included) TVM cannot convert."""
    ok = supported_ops()
    return sorted({n.op_type for n in _iter_nodes(model.graph)} - ok)


# --------------------------------------------------------------------------- steps 1-3


def _check_filename(filename: str) -> None:
    name = (filename or "").strip()
    if not name.lower().endswith(".onnx"):
        shown = name or "(no name)"
        raise OnnxValidationError(
            "bad_extension",
            f"'{shown}' is not an .onnx file. Export the model to ONNX first "
            "(PyTorch: torch.onnx.export; TensorFlow/Keras: tf2onnx) and upload the .onnx file.",
        )


def _check_size(size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise OnnxValidationError(
            "too_large",
            f"The file is {size / _MB:.1f} MB; the upload cap is {max_bytes / _MB:.1f} MB. "
            "Upload a smaller model, or ask an administrator to raise the cap for your team.",
        )
    if size == 0:
        raise OnnxValidationError("empty", "The file is empty (0 bytes). Upload the exported .onnx file.")


def _read_bounded(fh: BinaryIO, max_bytes: int) -> bytes:
    buf = io.BytesIO()
    while True:
        chunk = fh.read(_READ_CHUNK)
        if not chunk:
            break
        buf.write(chunk)
        if buf.tell() > max_bytes:
            raise OnnxValidationError(
                "too_large",
                f"The file is larger than the upload cap of {max_bytes / _MB:.1f} MB. "
                "Upload a smaller model, or ask an administrator to raise the cap for your team.",
            )
    return buf.getvalue()


# ModelProto's top-level fields and their protobuf wire types (0 varint, 2 length-delimited).
_MODEL_WIRE_TYPES = {
    f.number: (0 if f.type in (f.TYPE_INT64, f.TYPE_INT32, f.TYPE_UINT64, f.TYPE_BOOL, f.TYPE_ENUM) else 2)
    for f in onnx.ModelProto.DESCRIPTOR.fields
}


def _read_varint(data: bytes, pos: int) -> tuple[int | None, int]:
    result = shift = 0
    while pos < len(data):
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            return None, -1  # over-long varint: corrupt
    return None, pos  # ran off the end


def _scan_model_fields(data: bytes) -> str:
    """Walk ModelProto's top-level fields without decoding them.

    Returns ``"truncated"`` when every field seen is a ModelProto field of the
    right wire type and the last one runs past the end of the data (a file cut
    short: a real model is almost all one long ``graph`` field, so a cut lands
    inside it), ``"corrupt"`` when something is not ModelProto wire format at
    all, and ``"ok"`` when the top level is intact (damage is deeper). The
    upb protobuf runtime reports all three as one "Wire format was corrupt"
    error, hence this scan.
    """
    pos, seen = 0, 0
    while pos < len(data):
        tag, pos = _read_varint(data, pos)
        if tag is None:
            return "truncated" if (pos >= len(data) and seen) else "corrupt"
        number, wire = tag >> 3, tag & 7
        if _MODEL_WIRE_TYPES.get(number) != wire:
            return "corrupt"
        if wire == 0:
            value, pos = _read_varint(data, pos)
            if value is None:
                return "truncated" if (pos >= len(data) and seen) else "corrupt"
        else:
            length, pos = _read_varint(data, pos)
            if length is None:
                return "truncated" if (pos >= len(data) and seen) else "corrupt"
            if pos + length > len(data):
                return "truncated" if (seen or number == 7) else "corrupt"
            pos += length
        seen += 1
    return "ok"


def _last_field_number(data: bytes) -> int | None:
    """Number of the last top-level field (call only when the scan says "ok")."""
    pos, last = 0, None
    while pos < len(data):
        tag, pos = _read_varint(data, pos)
        if tag is None:  # truncated after all: the fields read so far stand
            break
        last = tag >> 3
        if tag & 7 == 0:
            _, pos = _read_varint(data, pos)
        else:
            length, pos = _read_varint(data, pos)
            if length is None:
                break
            pos += length
    return last


def _sniff_format(data: bytes) -> str | None:
    """A hint for files that are some other model format."""
    head = data[:16]
    if head.startswith(b"PK\x03\x04"):
        return (
            "It is a ZIP archive, likely a PyTorch checkpoint (.pt/.pth) or a Keras .keras "
            "file: export it with torch.onnx.export or tf2onnx."
        )
    if head.startswith(b"\x89HDF"):
        return "It is an HDF5 file, likely a Keras .h5 model: convert it with tf2onnx."
    if data[4:8] == b"TFL3":
        return "It is a TensorFlow Lite flatbuffer: convert it with tf2onnx (--tflite)."
    if head[:1] == b"\x80" and len(head) > 1 and 2 <= head[1] <= 5:
        return "It is a Python pickle, likely a PyTorch state dict: export the model with torch.onnx.export."
    if head.startswith(b"GGUF"):
        return "It is a GGUF (llama.cpp) file, which is not ONNX."
    try:
        sample = data[:512].decode("utf-8")
        if sample and all(c.isprintable() or c.isspace() for c in sample):
            return "It looks like a text file (ONNX files are binary protobuf)."
    except UnicodeDecodeError:
        pass
    return None


def _parse(data: bytes) -> onnx.ModelProto:
    from google.protobuf.message import DecodeError

    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        hint = _sniff_format(data)
        if hint is None and _scan_model_fields(data) == "truncated":
            raise OnnxValidationError(
                "truncated",
                f"The file is an ONNX model cut short ({len(data) / _MB:.2f} MB arrived; a field "
                "runs past the end of the file). The upload or copy was incomplete: upload the "
                "whole file again.",
            ) from exc
        raise OnnxValidationError(
            "not_protobuf",
            "The file is not an ONNX model (it does not parse as an ONNX protobuf"
            + (f"). {hint}" if hint else "; it may be damaged). Upload the .onnx file your exporter wrote."),
        ) from exc
    # Protobuf decoding is permissive: some non-ONNX bytes decode "successfully".
    if not model.HasField("graph") or (model.ir_version == 0 and not model.opset_import):
        hint = _sniff_format(data)
        raise OnnxValidationError(
            "not_protobuf",
            "The file is not an ONNX model (no model graph found"
            + (f"). {hint}" if hint else "). Upload the .onnx file your exporter wrote."),
        )
    if not model.opset_import and _scan_model_fields(data) == "ok" and _last_field_number(data) == 7:
        # Serialisers write fields in number order: opset_import (8) follows the
        # graph (7), so a file that stops right after the graph was cut short.
        raise OnnxValidationError(
            "truncated",
            "The file is an ONNX model cut short: it ends right after the graph, without the "
            "opset list that follows it. The upload or copy was incomplete: upload the whole "
            "file again.",
        )
    if len(model.graph.node) == 0:
        raise OnnxValidationError("checker_failed", "The model's graph has no nodes: there is nothing to run or tune.")
    return model


# --------------------------------------------------------------------------- walking


def _iter_graphs(graph: onnx.GraphProto):
    """``graph`` and every subgraph (If/Loop/Scan bodies), depth first."""
    yield graph
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("g"):
                yield from _iter_graphs(a.g)
            for g in a.graphs:
                yield from _iter_graphs(g)


def _iter_nodes(graph: onnx.GraphProto):
    for g in _iter_graphs(graph):
        yield from g.node


def _iter_node_tensors(nodes):
    for node in nodes:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("sparse_tensor"):
                yield a.sparse_tensor.values
                yield a.sparse_tensor.indices
            for st in a.sparse_tensors:
                yield st.values
                yield st.indices


def _iter_tensors(model: onnx.ModelProto):
    """Every TensorProto in the model: initializers, Constant values and other
    tensor attributes, in subgraphs, functions and training info too."""
    graphs = [model.graph]
    for ti in model.training_info:
        graphs += [ti.initialization, ti.algorithm]
    for root in graphs:
        for g in _iter_graphs(root):
            yield from g.initializer
            for st in g.sparse_initializer:
                yield st.values
                yield st.indices
            yield from _iter_node_tensors(g.node)
    for fn in model.functions:
        yield from _iter_node_tensors(fn.node)


def _check_external_data(model: onnx.ModelProto) -> None:
    external = [
        t.name or "(unnamed)"
        for t in _iter_tensors(model)
        if t.data_location == TensorProto.EXTERNAL or len(t.external_data) > 0
    ]
    if external:
        shown = ", ".join(external[:5]) + (f" and {len(external) - 5} more" if len(external) > 5 else "")
        raise OnnxValidationError(
            "external_data",
            f"{len(external)} tensor(s) keep their data in external files ({shown}). External "
            "data files are never read here. Save the model as one self-contained file: "
            "onnx.save(onnx.load('model.onnx'), 'single.onnx', save_as_external_data=False) "
            "(possible for models under 2 GB).",
        )


# --------------------------------------------------------------------------- step 5


def _dtype_name(elem_type: int) -> str:
    try:
        return str(helper.tensor_dtype_to_np_dtype(elem_type).name)
    except Exception:
        return TensorProto.DataType.Name(elem_type).lower() if elem_type else "undefined"


def _dim_repr(d) -> str:
    if d.HasField("dim_value"):
        return str(d.dim_value)
    return d.dim_param or "?"


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer} | {t.values.name for t in model.graph.sparse_initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def _check_inputs(model: onnx.ModelProto, max_dim: int) -> None:
    """Fix a symbolic batch dim to 1; refuse other symbolic, missing or absurd dims."""
    missing: list[str] = []
    absurd: list[str] = []
    batch_params: set[str] = set()
    for vi in _graph_inputs(model):
        if not vi.type.HasField("tensor_type"):
            raise OnnxValidationError(
                "missing_input_shape",
                f"Input '{vi.name}' is not a tensor (it is a {vi.type.WhichOneof('value') or 'untyped'} "
                "value). Only tensor inputs with static shapes can be tuned.",
            )
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            missing.append(f"'{vi.name}' has no shape at all")
            continue
        dims = tt.shape.dim
        symbolic = []
        for i, d in enumerate(dims):
            if d.HasField("dim_value"):
                if d.dim_value <= 0 or d.dim_value > max_dim:
                    absurd.append(f"'{vi.name}' dimension {i} is {d.dim_value}")
            elif i == 0:
                if d.dim_param:
                    batch_params.add(d.dim_param)
                d.Clear()
                d.dim_value = 1  # the batch: tune at 1, features can be had at any batch
            else:
                symbolic.append(f"{i} ({d.dim_param or 'unknown'})")
        if symbolic:
            shape = "[" + ", ".join(_dim_repr(d) for d in dims) + "]"
            missing.append(f"'{vi.name}' {shape}: dimension(s) {', '.join(symbolic)}")
    if missing:
        raise OnnxValidationError(
            "missing_input_shape",
            "Input shapes must be static; only the first (batch) dimension may be symbolic, and it "
            "is set to 1. Not static: " + "; ".join(missing) + ". Re-export with fixed sizes "
            "(torch.onnx.export without dynamic_axes for those dimensions), or fix them with "
            "python -m onnxruntime.tools.make_dynamic_shape_fixed --dim_param NAME --dim_value N "
            "in.onnx out.onnx.",
        )
    if absurd:
        raise OnnxValidationError(
            "absurd_dimension",
            "Input dimensions must be between 1 and "
            f"{max_dim:,}: " + "; ".join(absurd) + ". Re-export the model with its real input size.",
        )
    # An output whose leading dim is the same symbolic batch now has batch 1 too.
    for vi in model.graph.output:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            dims = vi.type.tensor_type.shape.dim
            if dims and dims[0].dim_param and dims[0].dim_param in batch_params:
                dims[0].Clear()
                dims[0].dim_value = 1


def _io_dicts(values) -> list[dict]:
    out = []
    for vi in values:
        tt = vi.type.tensor_type
        shape = [int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in tt.shape.dim]
        out.append({"name": vi.name, "shape": shape, "dtype": _dtype_name(tt.elem_type)})
    return out


# --------------------------------------------------------------------------- steps 6-8


def _short(exc: BaseException, limit: int = 600) -> str:
    text = str(exc).strip() or type(exc).__name__
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_structure(model: onnx.ModelProto, max_dim: int) -> onnx.ModelProto:
    """Checker, then strict shape inference (together: full_check). Returns the
    model with inferred shapes."""
    try:
        onnx.checker.check_model(model)
    except Exception as exc:
        raise OnnxValidationError(
            "checker_failed",
            f"onnx.checker refused the model: {_short(exc)}. Re-export it with a current "
            "exporter, or run onnx.checker.check_model(model, full_check=True) locally to see "
            "the details.",
        ) from exc
    try:
        # On a copy without the big weights: inference serialises the whole model.
        inferred = onnx.shape_inference.infer_shapes(
            _skeleton(model), check_type=True, strict_mode=True, data_prop=True
        )
    except Exception as exc:
        raise OnnxValidationError(
            "shape_inference_failed",
            f"ONNX shape inference failed: {_short(exc)}. The graph's shapes or types are "
            "inconsistent; check the named node, or re-export the model.",
        ) from exc
    too_big = []
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        if vi.type.HasField("tensor_type"):
            for d in vi.type.tensor_type.shape.dim:
                if d.HasField("dim_value") and d.dim_value > max_dim:
                    too_big.append(f"'{vi.name}' has a dimension of {d.dim_value:,}")
                    break
    if too_big:
        raise OnnxValidationError(
            "absurd_dimension",
            f"Intermediate tensors are absurdly large (limit {max_dim:,} per dimension): "
            + "; ".join(too_big[:5])
            + ". Check the model's reshapes and input size.",
        )
    return inferred


def _check_tensor_elements(inferred: onnx.ModelProto, max_elements: int) -> None:
    """Refuse any input, intermediate or output tensor with more than ``max_elements``
    elements (shapes from inference; unresolved dimensions are not counted)."""
    g = inferred.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if not vi.type.HasField("tensor_type"):
            continue
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim if d.HasField("dim_value")]
        numel = math.prod(dims) if dims else 1
        if numel > max_elements:
            raise OnnxValidationError(
                "tensor_too_large",
                f"Tensor '{vi.name}' {list(dims)} has {numel:,} elements; the limit is "
                f"{max_elements:,} elements per tensor. Use a smaller input size or batch.",
            )


def _check_cost(features, *, max_gflops: float, max_activation_bytes: int) -> None:
    """All intermediate tensors together within the memory cap; arithmetic plus data
    movement (one byte copied counted as one operation) within the compute cap."""
    if features.activation_bytes > max_activation_bytes:
        raise OnnxValidationError(
            "too_much_activation_memory",
            f"The model's intermediate tensors take {features.activation_bytes / _GB:,.2f} GiB "
            f"together at batch {features.batch_size}; the limit is {max_activation_bytes / _GB:,.2f} GiB "
            "(ONNX_MAX_ACTIVATION_BYTES). Use a smaller input size or batch, or a smaller model.",
        )
    cost = features.total_flops + features.bytes_moved
    if cost > max_gflops * 1e9:
        raise OnnxValidationError(
            "too_many_flops",
            f"The model needs {features.total_flops / 1e9:,.1f} GFLOPs and copies "
            f"{features.bytes_moved / 1e9:,.1f} GB in data-movement ops (Transpose, Concat, Gather, ...) "
            f"per inference at batch {features.batch_size}: {cost / 1e9:,.1f} G operations; the limit "
            f"is {max_gflops:,.1f} G. Use a smaller input size or batch, or a smaller model.",
        )


def _check_ops(model: onnx.ModelProto) -> None:
    bad = unsupported_ops(model)
    if bad:
        counts = {op: 0 for op in bad}
        for n in _iter_nodes(model.graph):
            if n.op_type in counts:
                counts[n.op_type] += 1
        listing = ", ".join(f"{op} (x{c})" for op, c in counts.items())
        raise OnnxValidationError(
            "unsupported_op",
            f"TVM's ONNX importer has no converter for: {listing}. Replace these operators "
            "(e.g. export recurrent layers unrolled, or decompose custom ops into standard "
            "ones), or use a model without them.",
        )


def _opset(model: onnx.ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 0


# --------------------------------------------------------------------------- step 10


def _tuning_tasks(
    model: onnx.ModelProto, target: dict, task_counter: TaskCounter | None
) -> tuple[int | None, list[str]]:
    if task_counter is None:
        # No counter given (the caller has no tuning engine): still prove TVM imports the model.
        _import_into_relax(model)
        return None, []
    try:
        names = list(task_counter(model, target))
    except Exception as exc:
        _import_into_relax(model)  # tell an import failure from a later compilation-pass failure
        raise OnnxValidationError(
            "tvm_import_failed",
            f"TVM imported the model but could not extract its tuning tasks for target {target}: {_short(exc)}.",
        ) from exc
    return len(names), names


def _import_into_relax(model: onnx.ModelProto) -> None:
    try:
        from tvm.relax.frontend.onnx import from_onnx

        shapes = {i["name"]: i["shape"] for i in _io_dicts(_graph_inputs(model))}
        dtypes = {i["name"]: i["dtype"] for i in _io_dicts(_graph_inputs(model))}
        from_onnx(model, shape_dict=shapes, dtype_dict=dtypes, keep_params_in_input=False)
    except Exception as exc:
        raise _tvm_error(exc) from exc


def _tvm_error(exc: BaseException) -> OnnxValidationError:
    return OnnxValidationError(
        "tvm_import_failed",
        f"TVM could not import the model: {_short(exc)}. The model is valid ONNX but uses "
        "an operator variant, attribute or data type TVM's importer does not handle.",
    )


# --------------------------------------------------------------------------- driver


def _validate_parsed(
    model: onnx.ModelProto,
    *,
    max_gflops: float,
    max_dim: int,
    count_tasks: bool,
    target: dict | None,
    task_counter: TaskCounter | None = None,
    max_tensor_elements: int = DEFAULT_MAX_TENSOR_ELEMENTS,
    max_activation_bytes: int = DEFAULT_MAX_ACTIVATION_BYTES,
) -> ValidatedModel:
    try:
        return _run_checks(
            model,
            max_gflops=max_gflops,
            max_dim=max_dim,
            count_tasks=count_tasks,
            target=target,
            task_counter=task_counter,
            max_tensor_elements=max_tensor_elements,
            max_activation_bytes=max_activation_bytes,
        )
    except UnicodeDecodeError as exc:
        # upb decodes string fields lazily: a damaged name surfaces only when read.
        raise OnnxValidationError(
            "not_protobuf",
            "The file is damaged: a name or text field in it is not valid UTF-8. Upload the "
            ".onnx file your exporter wrote.",
        ) from exc


def _run_checks(
    model: onnx.ModelProto,
    *,
    max_gflops: float,
    max_dim: int,
    count_tasks: bool,
    target: dict | None,
    task_counter: TaskCounter | None,
    max_tensor_elements: int,
    max_activation_bytes: int,
) -> ValidatedModel:
    _check_external_data(model)
    _check_inputs(model, max_dim)
    inferred = _check_structure(model, max_dim)
    _check_tensor_elements(inferred, max_tensor_elements)
    _check_ops(model)
    features = compute_features(model)
    _check_cost(features, max_gflops=max_gflops, max_activation_bytes=max_activation_bytes)
    num_tasks: int | None = None
    names: list[str] = []
    if count_tasks:
        num_tasks, names = _tuning_tasks(model, dict(target or DEFAULT_TARGET), task_counter)
    inputs = _io_dicts(_graph_inputs(model))
    return ValidatedModel(
        model=model,
        opset=_opset(model),
        ir_version=int(model.ir_version),
        producer=" ".join(p for p in (model.producer_name, model.producer_version) if p),
        inputs=inputs,
        outputs=_io_dicts(inferred.graph.output),
        batch_size=features.batch_size,
        features=features,
        num_tuning_tasks=num_tasks,
        task_names=names,
    )
