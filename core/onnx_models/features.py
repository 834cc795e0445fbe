"""Computation-graph features of an ONNX model, as Horus (IEEE TPDS 2022) uses them.

Horus predicts a job's GPU utilization and memory from static graph features
with no online profiling: total FLOPs, parameter count, counts of convolution,
linear/embedding, activation and other layers, and the batch size. This module
computes those features from an ``onnx.ModelProto`` at any batch size.

Conventions (stated so the numbers can be checked by hand):

* **FLOPs**: one multiply-add is 2 FLOPs. Conv/ConvTranspose/Gemm/MatMul count
  2 x MACs, plus 1 FLOP per output element for a bias (Conv/ConvTranspose
  ``B``, Gemm ``C``). Elementwise ops (Add, Mul, Relu, Sigmoid, Erf, Clip...)
  count 1 FLOP per output element (n-1 for variadic Sum/Max/Min/Mean).
  Pooling counts the window size per output element (global pooling: 1 per
  input element). Softmax/LogSoftmax 3 per element (exp, sum, divide);
  BatchNormalization 2 (inference form: scale and shift); LayerNormalization,
  GroupNormalization, InstanceNormalization and MeanVarianceNormalization 5
  (mean, centre, variance, normalise, affine); reductions 1 per input element.
  LSTM/GRU/RNN are unrolled per time step and direction: gate matmuls
  (2 x MACs), biases, and the cell's elementwise work (LSTM 9H, GRU 7H, RNN 1H
  per batch row). Data movement (Reshape, Transpose, Concat, Gather, Slice,
  Pad...) is 0 FLOPs. An op whose shapes shape inference could not resolve counts 0.
* **Bytes moved**: what the data-movement ops (Transpose, Concat, Gather*,
  Slice, Pad, Expand, Tile, Split, Scatter*, DepthToSpace, ...) copy:
  2 x their output bytes (each element read once, written once). Reshape,
  Flatten, Squeeze, Unsqueeze and Identity change only metadata (no copy) and
  count 0. Validation adds these bytes to the FLOPs in its cost estimate, so a
  model of nothing but huge copies is not "free".
* **Parameters**: elements of floating-point tensors of rank >= 1 held in
  initializers or Constant nodes. Rank-0 scalars (Clip bounds, the 0.5 in a
  GELU, a 1/sqrt(d) scale) are hyper-parameters, not weights. Integer
  initializers (shapes, axes, indices) are not parameters, and neither are
  BatchNormalization running mean/variance
  (inputs 3 and 4): like PyTorch, they are buffers. So ResNet-18 counts
  11,689,512 as torchvision does.
* **Activation bytes**: the summed size of every tensor a node produces
  (graph outputs included, Constant-node outputs excluded), from shape
  inference. It is the memory of all intermediate values if none were freed,
  i.e. an upper bound for inference and a proxy for what training keeps for
  the backward pass. Tensors with unresolved dimensions count 0.
* **Layer counts**: each node falls in one class: ``conv`` (Conv,
  ConvTranspose, ConvInteger, QLinearConv, DeformConv), ``linear`` (Gemm,
  MatMul, MatMulInteger, QLinearMatMul, Einsum, a Gather whose data is a 2-D
  floating-point weight, i.e. an embedding lookup, and LSTM/GRU/RNN), ``activation``
  (Relu, Sigmoid, Tanh, Gelu, Erf, Softmax, Clip, LeakyRelu, HardSwish...), or
  ``other``. Recurrent cells count once per time step per direction, as Horus
  unrolls them. Constant and Identity nodes carry no computation and are in no
  class (they still appear in ``op_histogram``, which is the raw node count).
  Only the top-level graph is walked (If/Loop bodies are not).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

__all__ = [
    "DATA_MOVEMENT_OPS",
    "GraphFeatures",
    "compute_features",
    "features_at_batch_in_child",
    "layer_class",
]


#: Ops that copy data without arithmetic (counted in ``bytes_moved``).
DATA_MOVEMENT_OPS = frozenset(
    {
        "Transpose",
        "Concat",
        "Gather",
        "GatherElements",
        "GatherND",
        "Slice",
        "Pad",
        "Expand",
        "Tile",
        "Split",
        "DepthToSpace",
        "SpaceToDepth",
        "Scatter",
        "ScatterElements",
        "ScatterND",
        "Compress",
        "ReverseSequence",
        "ConcatFromSequence",
        "SplitToSequence",
        "OneHot",
        "ConstantOfShape",
        "Trilu",
        "Unique",
        "NonZero",
        "TopK",
        "Col2Im",
        "CenterCropPad",
    }
)

CONV_OPS = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "DeformConv"})
RECURRENT_OPS = frozenset({"LSTM", "GRU", "RNN"})
LINEAR_OPS = frozenset({"Gemm", "MatMul", "MatMulInteger", "QLinearMatMul", "Einsum"}) | RECURRENT_OPS
ACTIVATION_OPS = frozenset(
    {
        "Relu",
        "Sigmoid",
        "Tanh",
        "Gelu",
        "FastGelu",
        "BiasGelu",
        "Erf",
        "Softmax",
        "LogSoftmax",
        "Hardmax",
        "Clip",
        "LeakyRelu",
        "PRelu",
        "Elu",
        "Selu",
        "Celu",
        "HardSigmoid",
        "HardSwish",
        "Softplus",
        "Softsign",
        "Mish",
        "ThresholdedRelu",
        "Shrink",
    }
)
# Nodes that compute nothing: left out of the layer classes.
NON_COMPUTE_OPS = frozenset({"Constant", "Identity"})

_ELEMENTWISE_OPS = frozenset(
    {
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "Mod",
        "Neg",
        "Abs",
        "Reciprocal",
        "Sqrt",
        "Exp",
        "Log",
        "Sin",
        "Cos",
        "Tan",
        "Asin",
        "Acos",
        "Atan",
        "Sinh",
        "Cosh",
        "Asinh",
        "Acosh",
        "Atanh",
        "Floor",
        "Ceil",
        "Round",
        "Sign",
        "Erf",
        "Relu",
        "Sigmoid",
        "Tanh",
        "Gelu",
        "FastGelu",
        "BiasGelu",
        "Clip",
        "LeakyRelu",
        "PRelu",
        "Elu",
        "Selu",
        "Celu",
        "HardSigmoid",
        "HardSwish",
        "Softplus",
        "Softsign",
        "Mish",
        "ThresholdedRelu",
        "Shrink",
        "Equal",
        "Less",
        "Greater",
        "LessOrEqual",
        "GreaterOrEqual",
        "And",
        "Or",
        "Xor",
        "Not",
        "Where",
        "BitShift",
        "BitwiseAnd",
        "BitwiseOr",
        "BitwiseXor",
        "BitwiseNot",
        "IsNaN",
        "IsInf",
        "Dropout",
        "Cast",
        "CastLike",
        "QuantizeLinear",
        "DequantizeLinear",
        "Resize",
        "Upsample",
        "CumSum",
    }
)
_VARIADIC_OPS = frozenset({"Sum", "Max", "Min", "Mean"})
_WINDOW_POOL_OPS = frozenset({"MaxPool", "AveragePool", "LpPool"})
_GLOBAL_POOL_OPS = frozenset({"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"})
_REDUCE_OPS = frozenset(
    {
        "ReduceSum",
        "ReduceMean",
        "ReduceMax",
        "ReduceMin",
        "ReduceProd",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceSumSquare",
        "ArgMax",
        "ArgMin",
    }
)
_PER_ELEMENT_COST = {
    "Softmax": 3,
    "LogSoftmax": 3,
    "Hardmax": 1,
    "BatchNormalization": 2,
    "LayerNormalization": 5,
    "GroupNormalization": 5,
    "InstanceNormalization": 5,
    "MeanVarianceNormalization": 5,
    "RMSNormalization": 4,
    "SkipLayerNormalization": 6,
    "LRN": 3,
}
_FLOAT_TYPES = frozenset(
    {
        TensorProto.FLOAT,
        TensorProto.FLOAT16,
        TensorProto.DOUBLE,
        TensorProto.BFLOAT16,
    }
    | {
        getattr(TensorProto, n)
        for n in ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ")
        if hasattr(TensorProto, n)
    }
)


def layer_class(op_type: str) -> str | None:
    """The Horus layer class of an op type: ``conv``, ``linear``, ``activation``,
    ``other``, or None for nodes that compute nothing (Constant, Identity).

    A Gather is ``other`` here; :func:`compute_features` promotes it to
    ``linear`` when it reads a 2-D weight (an embedding lookup).
    """
    if op_type in NON_COMPUTE_OPS:
        return None
    if op_type in CONV_OPS:
        return "conv"
    if op_type in LINEAR_OPS:
        return "linear"
    if op_type in ACTIVATION_OPS:
        return "activation"
    return "other"


@dataclass(frozen=True)
class GraphFeatures:
    """Static features of a model at one batch size (see the module docstring
    for how each is counted)."""

    total_flops: int
    param_count: int
    activation_bytes: int
    conv_count: int
    linear_count: int
    activation_count: int
    other_count: int
    op_histogram: dict[str, int] = field(default_factory=dict)
    batch_size: int = 1
    bytes_moved: int = 0

    def __hash__(self) -> int:  # the dict field would make the generated hash fail
        return hash(
            (
                self.total_flops,
                self.param_count,
                self.activation_bytes,
                self.batch_size,
                tuple(sorted(self.op_histogram.items())),
            )
        )

    @property
    def gflops(self) -> float:
        return self.total_flops / 1e9

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (plain ints, a sorted op histogram)."""
        d = asdict(self)
        d["op_histogram"] = {k: int(v) for k, v in sorted(self.op_histogram.items())}
        return {k: (int(v) if isinstance(v, (int, np.integer)) else v) for k, v in d.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GraphFeatures:
        """Inverse of :meth:`to_dict`; unknown keys are ignored (forward compatible)."""
        names = {f for f in cls.__dataclass_fields__}
        kwargs = {k: v for k, v in data.items() if k in names}
        kwargs["op_histogram"] = {str(k): int(v) for k, v in dict(kwargs.get("op_histogram", {})).items()}
        for k in names - {"op_histogram"}:
            if k in kwargs:
                kwargs[k] = int(kwargs[k])
        return cls(**kwargs)


# --------------------------------------------------------------------------- shapes

_Shape = tuple  # of int | None (None: unknown dimension)


def _type_shape(vi_type: onnx.TypeProto) -> tuple[_Shape | None, int]:
    if not vi_type.HasField("tensor_type"):
        return None, 0
    tt = vi_type.tensor_type
    if not tt.HasField("shape"):
        return None, tt.elem_type
    dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tt.shape.dim)
    return dims, tt.elem_type


def _numel(shape: _Shape | None) -> int | None:
    if shape is None or any(d is None for d in shape):
        return None
    return int(math.prod(shape))


def _itemsize(elem_type: int) -> int:
    try:
        return int(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize)
    except Exception:  # string, undefined, or exotic types: no fixed size
        return 0


def _is_repeated(fd) -> bool:
    # protobuf >= 6 has ``is_repeated``; older releases only ``label``.
    if hasattr(fd, "is_repeated"):
        return bool(fd.is_repeated)
    return fd.label == fd.LABEL_REPEATED


def _copy_field(dst, fd, value) -> None:
    if _is_repeated(fd):
        getattr(dst, fd.name).extend(value)
    elif fd.message_type is not None:
        getattr(dst, fd.name).CopyFrom(value)
    else:
        setattr(dst, fd.name, value)


def _skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose large floating-point initializers keep their
    name, type and dims but not their data. Shape inference only needs the
    data of small (shape/axes) tensors, so this keeps a large model from being
    copied, and serialised again by the inference pass, in full."""
    m = onnx.ModelProto()
    for fd, value in model.ListFields():
        if fd.name != "graph":
            _copy_field(m, fd, value)
    if not model.HasField("graph"):
        return m
    for fd, value in model.graph.ListFields():
        if fd.name != "initializer":
            _copy_field(m.graph, fd, value)
    for t in model.graph.initializer:
        nt = m.graph.initializer.add()
        if t.data_type in _FLOAT_TYPES and math.prod(t.dims) > 64:
            nt.name = t.name
            nt.data_type = t.data_type
            nt.dims.extend(t.dims)
        else:
            nt.CopyFrom(t)
    return m


def _set_leading_dim(value_infos, batch_size: int) -> None:
    for vi in value_infos:
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            continue
        dims = vi.type.tensor_type.shape.dim
        if len(dims) >= 1:
            dims[0].Clear()
            dims[0].dim_value = batch_size


def _leading_dim_symbolic(model: onnx.ModelProto) -> bool:
    init_names = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in init_names:
            continue
        shape, _ = _type_shape(vi.type)
        if shape and shape[0] is None:
            return True
    return False


def _detect_batch_size(model: onnx.ModelProto) -> int:
    init_names = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in init_names:
            continue
        shape, _ = _type_shape(vi.type)
        if shape and shape[0] is not None:
            return int(shape[0])
    return 1


def _prepare(model: onnx.ModelProto, batch_size: int | None) -> tuple[onnx.ModelProto, int]:
    """Copy, rebatch if asked, and run shape inference. Returns (inferred, batch)."""
    m = _skeleton(model)
    if batch_size is None and _leading_dim_symbolic(m):
        batch_size = 1  # a symbolic batch dim is taken as 1, as validation does
    if batch_size is not None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        init_names = {t.name for t in m.graph.initializer}
        _set_leading_dim([vi for vi in m.graph.input if vi.name not in init_names], batch_size)
        # Shapes recorded at the old batch size would contradict the new ones:
        # drop them (outputs keep their type) and let inference recompute them.
        for vi in m.graph.output:
            if vi.type.HasField("tensor_type"):
                vi.type.tensor_type.ClearField("shape")
        del m.graph.value_info[:]
    if batch_size is None:
        inferred = onnx.shape_inference.infer_shapes(m, data_prop=True)
        return inferred, _detect_batch_size(model)
    try:
        # Strict: a graph that hard-codes its batch fails loudly rather than
        # yielding silently wrong (zero) FLOPs at the new batch.
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True, data_prop=True)
    except Exception as exc:
        raise ValueError(
            f"cannot compute features at batch size {batch_size}: shape inference fails once the "
            f"inputs' leading dimension is changed ({exc}). The graph probably hard-codes its batch "
            "(e.g. a Reshape to a constant [1, -1]); use Flatten or a 0 in the Reshape shape."
        ) from exc
    return inferred, batch_size


# --------------------------------------------------------------------------- FLOPs


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _recurrent_dims(node, shapes) -> tuple[int, int, int, int, int] | None:
    """(steps, directions, batch, input_size, hidden) of an LSTM/GRU/RNN node."""
    x = shapes.get(node.input[0], (None, 0))[0]
    hidden = _attr(node, "hidden_size")
    if x is None or len(x) != 3 or hidden is None:
        return None
    if _attr(node, "layout", 0) == 1:
        batch, steps, in_size = x
    else:
        steps, batch, in_size = x
    if None in (steps, batch, in_size):
        return None
    directions = 2 if _attr(node, "direction", b"forward") in (b"bidirectional", "bidirectional") else 1
    return int(steps), directions, int(batch), int(in_size), int(hidden)


def _node_flops(node: onnx.NodeProto, shapes: dict[str, tuple[_Shape | None, int]]) -> int:
    op = node.op_type

    def shape(i: int, outputs: bool = False) -> _Shape | None:
        names = node.output if outputs else node.input
        if i >= len(names) or not names[i]:
            return None
        return shapes.get(names[i], (None, 0))[0]

    def has_input(i: int) -> bool:
        return i < len(node.input) and bool(node.input[i])

    out = shape(0, outputs=True)
    out_n = _numel(out)

    if op == "Conv" or op == "ConvInteger" or op == "QLinearConv":
        w = shape(3 if op == "QLinearConv" else 1)
        wn = _numel(w)
        if out_n is None or wn is None or not w:
            return 0
        macs_per_out = wn // w[0]  # (C_in / group) * prod(kernel)
        bias = out_n if (op == "Conv" and has_input(2)) else 0
        return 2 * out_n * macs_per_out + bias
    if op == "ConvTranspose":
        x, w = shape(0), shape(1)
        xn, wn = _numel(x), _numel(w)
        if xn is None or wn is None or not w:
            return 0
        # Every input element is scattered through (C_out / group) * prod(kernel) weights.
        macs = xn * (wn // w[0])
        return 2 * macs + ((out_n or 0) if has_input(2) else 0)
    if op == "Gemm":
        a = shape(0)
        if out_n is None or a is None or len(a) != 2 or None in a:
            return 0
        k = a[0] if _attr(node, "transA", 0) else a[1]
        return 2 * out_n * k + (out_n if has_input(2) else 0)
    if op in ("MatMul", "MatMulInteger", "QLinearMatMul"):
        a = shape(0)
        if out_n is None or not a or a[-1] is None:
            return 0
        return 2 * out_n * int(a[-1])
    if op == "Einsum":
        return _einsum_flops(node, shapes)
    if op in RECURRENT_OPS:
        dims = _recurrent_dims(node, shapes)
        if dims is None:
            return 0
        steps, dirs, b, i, h = dims
        gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
        cell_elementwise = {"LSTM": 9, "GRU": 7, "RNN": 1}[op]
        per_step = 2 * b * gates * h * (i + h)  # input and recurrent gate matmuls
        if has_input(3):
            per_step += 2 * b * gates * h  # input and recurrent biases
        per_step += cell_elementwise * b * h
        return steps * dirs * per_step
    if op in _VARIADIC_OPS:
        return (max(len(node.input), 2) - 1) * (out_n or 0)
    if op in _ELEMENTWISE_OPS:
        return out_n or 0
    if op in _WINDOW_POOL_OPS:
        kernel = _attr(node, "kernel_shape")
        if out_n is None or not kernel:
            return 0
        return out_n * int(math.prod(kernel))
    if op in _GLOBAL_POOL_OPS or op in _REDUCE_OPS:
        return _numel(shape(0)) or 0
    if op in _PER_ELEMENT_COST:
        return _PER_ELEMENT_COST[op] * (_numel(shape(0)) or 0)
    return 0  # data movement, shape plumbing, or unknown: no arithmetic counted


def _einsum_flops(node, shapes) -> int:
    """2 x the product of every index's extent (the naive loop nest)."""
    eq = _attr(node, "equation")
    if isinstance(eq, bytes):
        eq = eq.decode()
    if not eq or "..." in eq:
        return 0
    lhs = eq.replace(" ", "").split("->")[0].split(",")
    extent: dict[str, int] = {}
    for term, name in zip(lhs, node.input):
        s = shapes.get(name, (None, 0))[0]
        if s is None or len(s) != len(term) or None in s:
            return 0
        extent.update(zip(term, s))
    return 2 * int(math.prod(extent.values())) if extent else 0


# --------------------------------------------------------------------------- main


def _subgraph_inputs(node: onnx.NodeProto) -> set[str]:
    """Every name the node's subgraphs (If, Loop, Scan bodies) read: those may come from the outer graph."""
    names: set[str] = set()
    for a in node.attribute:
        for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            for inner in sub.node:
                names.update(n for n in inner.input if n)
                names |= _subgraph_inputs(inner)
    return names


def _live_nodes(graph: onnx.GraphProto) -> tuple[list[onnx.NodeProto], set[str]]:
    """The nodes the graph's outputs depend on (graph order) and the names they read. A runtime never
    runs the others (onnxruntime and TVM drop them), so their FLOPs, layers and weights are no cost of
    the model: counted, a dead copy of a large network would make a small model look large to the
    predictor, and its measured profile would teach it that large networks are cheap."""
    needed = {o.name for o in graph.output}
    live = []
    for node in reversed(graph.node):  # ONNX nodes are topologically sorted (the checker insists)
        if any(o in needed for o in node.output if o):
            live.append(node)
            needed.update(n for n in node.input if n)
            needed |= _subgraph_inputs(node)
    return live[::-1], needed


def compute_features(model: onnx.ModelProto, *, batch_size: int | None = None) -> GraphFeatures:
    """Compute :class:`GraphFeatures` of ``model``.

    With ``batch_size``, the leading dimension of every graph input is
    rewritten to it and shape inference re-run, on a copy (output and
    intermediate shapes are dropped and re-inferred, so outputs follow the new
    batch and a non-batched output is not forced to it), so the features
    can be had at any batch size from one upload (Horus needs this). This
    assumes the leading dimension is the batch, and that the graph does not
    hard-code the batch elsewhere (e.g. a Reshape to a constant ``[1, -1]``):
    if it does, shape inference fails and ``ValueError`` is raised. Without it, the model's own batch (leading dim of the first input) is used;
    a symbolic batch dim is taken as 1. ``model`` is never modified.
    """
    inferred, batch = _prepare(model, batch_size)
    g = inferred.graph
    nodes, read = _live_nodes(g)

    shapes: dict[str, tuple[_Shape | None, int]] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        shapes[vi.name] = _type_shape(vi.type)
    for t in g.initializer:
        shapes[t.name] = (tuple(int(d) for d in t.dims), t.data_type)

    # Weights: floating-point, non-scalar initializers and Constant tensors.
    weights: dict[str, int] = {}
    for t in g.initializer:
        if t.data_type in _FLOAT_TYPES and len(t.dims) >= 1 and t.name in read:
            weights[t.name] = int(math.prod(t.dims))
    for node in nodes:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value" and a.t.data_type in _FLOAT_TYPES and len(a.t.dims) >= 1:
                    weights[node.output[0]] = int(math.prod(a.t.dims))
                    shapes.setdefault(node.output[0], (tuple(a.t.dims), a.t.data_type))
    buffers = {n.input[i] for n in nodes if n.op_type == "BatchNormalization" for i in (3, 4) if i < len(n.input)}
    param_count = sum(v for k, v in weights.items() if k not in buffers)

    histogram: Counter[str] = Counter()
    counts = Counter({"conv": 0, "linear": 0, "activation": 0, "other": 0})
    total_flops = 0
    activation_bytes = 0
    bytes_moved = 0
    for node in nodes:
        histogram[node.op_type] += 1
        total_flops += _node_flops(node, shapes)
        cls = layer_class(node.op_type)
        if node.op_type == "Gather" and node.input and node.input[0] in weights:
            data_shape = shapes.get(node.input[0], (None, 0))[0]
            if data_shape is not None and len(data_shape) == 2:
                cls = "linear"  # embedding lookup
        if cls is not None:
            n = 1
            if node.op_type in RECURRENT_OPS:
                dims = _recurrent_dims(node, shapes)
                n = dims[0] * dims[1] if dims else 1  # one cell per time step and direction
            counts[cls] += n
        if node.op_type != "Constant":
            for name in node.output:
                if not name:
                    continue
                s, et = shapes.get(name, (None, 0))
                numel = _numel(s)
                if numel is not None:
                    activation_bytes += numel * _itemsize(et)
                    if node.op_type in DATA_MOVEMENT_OPS:
                        bytes_moved += 2 * numel * _itemsize(et)

    return GraphFeatures(
        total_flops=int(total_flops),
        param_count=int(param_count),
        activation_bytes=int(activation_bytes),
        conv_count=counts["conv"],
        linear_count=counts["linear"],
        activation_count=counts["activation"],
        other_count=counts["other"],
        op_histogram=dict(sorted(histogram.items())),
        batch_size=int(batch),
        bytes_moved=int(bytes_moved),
    )


def features_at_batch_in_child(*, data: bytes, batch_size: int) -> dict[str, Any]:
    """What the upload sandbox (``common.sandbox.run_in_child``) runs to re-derive a stored model's features
    at another batch size: ``{"features": GraphFeatures.to_dict()}``, or ``{"refused": reason}`` when the
    graph hard-codes its batch (:func:`compute_features` raises ValueError)."""
    try:
        return {"features": compute_features(onnx.load_from_string(data), batch_size=batch_size).to_dict()}
    except ValueError as exc:
        return {"refused": str(exc)[:500]}
