"""A model zoo of real architectures, built in code with ``onnx.helper``.

No downloads and no torch: every model is assembled node by node with seeded
random weights (He-normal for convolutions and linears, identity-like
BatchNorm statistics), so tests, demos and benchmarks can have ResNet-18 or a
BERT layer on a machine with no network. The graphs are the published
architectures (layer for layer, channel for channel); only the weights are
random. All models use opset 17, IR version 8, ``producer_name="dlopt-zoo"``,
a batch dimension that can be set at build time, and no hard-coded batch
anywhere else in the graph (reshapes use 0 to copy a dimension), so
:func:`~core.onnx_models.features.compute_features` can rebatch them.

Every model passes ``onnx.checker.check_model(full_check=True)``, runs under
onnxruntime, and imports into TVM Relax (tests/core/test_onnx_models.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, overload

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "ZOO",
    "ZooEntry",
    "build_model",
    "list_models",
    "OPSET",
    "PRODUCER",
    "small_cnn",
    "resnet18",
    "mobilenet_v2",
    "vgg11",
    "bert_encoder",
    "lstm_lm",
]

OPSET = 17
IR_VERSION = 8  # the IR version that goes with opset 17: widest runtime support
PRODUCER = "dlopt-zoo"


class _Graph:
    """Tiny graph-building helper: unique names, seeded weights, common layers."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._used: dict[str, int] = {}
        self._consts: dict[tuple, str] = {}

    def name(self, prefix: str) -> str:
        n = self._used.get(prefix, 0)
        self._used[prefix] = n + 1
        return f"{prefix}_{n}"

    def init(self, array: np.ndarray, prefix: str) -> str:
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def const(self, value, dtype=np.float32) -> str:
        """A shared constant initializer (scalars, shapes, axes)."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            self._consts[key] = self.init(arr, "const")
        return self._consts[key]

    def he(self, shape: Sequence[int], fan_in: int, prefix: str, gain: float = 2.0) -> str:
        std = math.sqrt(gain / fan_in)
        return self.init((self.rng.standard_normal(shape) * std).astype(np.float32), prefix)

    def small(self, shape: Sequence[int], prefix: str, scale: float = 0.02) -> str:
        return self.init((self.rng.standard_normal(shape) * scale).astype(np.float32), prefix)

    @overload
    def node(self, op: str, inputs: Sequence[str], n_out: Literal[1] = 1, **attrs) -> str: ...

    @overload
    def node(self, op: str, inputs: Sequence[str], n_out: int, **attrs) -> list[str]: ...

    def node(self, op: str, inputs: Sequence[str], n_out: int = 1, **attrs) -> str | list[str]:
        """One node; its output's name, or the list of them when ``n_out`` > 1."""
        base = self.name(op.lower())
        outs = [base] if n_out == 1 else [f"{base}_o{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=base, **attrs))
        return outs[0] if n_out == 1 else outs

    # -- layers ---------------------------------------------------------------
    def conv(self, x, cin, cout, k, *, stride=1, pad=None, group=1, bias=False) -> str:
        pad = k // 2 if pad is None else pad
        w = self.he((cout, cin // group, k, k), fan_in=(cin // group) * k * k, prefix="conv_w")
        ins = [x, w]
        if bias:
            ins.append(self.small((cout,), "conv_b"))
        return self.node("Conv", ins, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=group)

    def bn(self, x, c) -> str:
        # Inference-form BatchNorm; gamma near 1 and beta near 0 so activations
        # stay in a sane range through deep stacks with random weights.
        gamma = self.init((1.0 + 0.05 * self.rng.standard_normal(c)).astype(np.float32), "bn_gamma")
        beta = self.init((0.05 * self.rng.standard_normal(c)).astype(np.float32), "bn_beta")
        mean = self.init(np.zeros(c, np.float32), "bn_mean")
        var = self.init(np.ones(c, np.float32), "bn_var")
        return self.node("BatchNormalization", [x, gamma, beta, mean, var], epsilon=1e-5, momentum=0.9)

    def relu(self, x) -> str:
        return self.node("Relu", [x])

    def relu6(self, x) -> str:
        return self.node("Clip", [x, self.const(0.0), self.const(6.0)])

    def gemm(self, x, fin, fout) -> str:
        """PyTorch-style Linear on a 2-D input: W is [out, in], transB=1."""
        w = self.he((fout, fin), fan_in=fin, prefix="fc_w", gain=1.0)
        b = self.small((fout,), "fc_b")
        return self.node("Gemm", [x, w, b], transB=1)

    def linear(self, x, fin, fout) -> str:
        """Linear on an N-D input: MatMul by [in, out] then Add bias (BERT style)."""
        w = self.he((fin, fout), fan_in=fin, prefix="linear_w", gain=1.0)
        b = self.small((fout,), "linear_b")
        return self.node("Add", [self.node("MatMul", [x, w]), b])

    def model(self, name: str, doc: str, inputs, outputs) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, initializer=self.inits)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name=PRODUCER,
            producer_version="1",
            doc_string=doc,
        )
        model.ir_version = IR_VERSION
        return model


def _image_input(batch: int, size: int = 224) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, size, size])


def _logits(shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info("logits", TensorProto.FLOAT, list(shape))


def _rename_output(g: _Graph, old: str, new: str = "logits") -> None:
    for n in g.nodes:
        for i, o in enumerate(n.output):
            if o == old:
                n.output[i] = new


# --------------------------------------------------------------------------- CNNs

SMALL_CNN_DOC = (
    "Tiny CNN for quick tuning: Conv(3->16,3x3)-ReLU-Conv(16->32,3x3)-ReLU-MaxPool(2)-"
    "Flatten-Gemm(8192->10) on 3x32x32 input. 87,018 parameters, about 11 MFLOPs."
)


def small_cnn(batch_size: int = 1, seed: int = 0, classes: int = 10) -> onnx.ModelProto:
    """``classes``: another head on the same convolutions (a fine-tuned copy; bench/record_cache.py)."""
    g = _Graph(seed)
    x = g.relu(g.conv("input", 3, 16, 3, bias=True))
    x = g.relu(g.conv(x, 16, 32, 3, bias=True))
    x = g.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    x = g.node("Flatten", [x], axis=1)
    _rename_output(g, g.gemm(x, 32 * 16 * 16, classes))
    return g.model("small_cnn", SMALL_CNN_DOC, [_image_input(batch_size, 32)], [_logits([batch_size, classes])])


RESNET18_DOC = (
    "ResNet-18 (He et al. 2016; torchvision layout): 7x7 stem, four stages of two "
    "BasicBlocks (64/128/256/512 channels), BatchNormalization nodes (not folded), "
    "1x1 strided projection shortcuts, global average pool, 1000-way Gemm; 3x224x224 "
    "input. 11,689,512 parameters (as torchvision), about 3.6 GFLOPs."
)


def resnet18(batch_size: int = 1, seed: int = 0) -> onnx.ModelProto:
    g = _Graph(seed)
    x = g.relu(g.bn(g.conv("input", 3, 64, 7, stride=2, pad=3), 64))
    x = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, cout in enumerate([64, 128, 256, 512]):
        for block in range(2):
            stride = 2 if (stage > 0 and block == 0) else 1
            y = g.relu(g.bn(g.conv(x, cin, cout, 3, stride=stride), cout))
            y = g.bn(g.conv(y, cout, cout, 3), cout)
            if stride != 1 or cin != cout:
                x = g.bn(g.conv(x, cin, cout, 1, stride=stride, pad=0), cout)
            x = g.relu(g.node("Add", [y, x]))
            cin = cout
    x = g.node("Flatten", [g.node("GlobalAveragePool", [x])], axis=1)
    _rename_output(g, g.gemm(x, 512, 1000))
    return g.model("resnet18", RESNET18_DOC, [_image_input(batch_size)], [_logits([batch_size, 1000])])


MOBILENET_V2_DOC = (
    "MobileNetV2 (Sandler et al. 2018; torchvision layout, width 1.0): 3x3 stem, 17 "
    "inverted-residual blocks (1x1 expand, 3x3 depthwise Conv with group=channels, 1x1 "
    "linear projection, residual when shapes match), ReLU6 as Clip(0, 6), 1x1 conv to "
    "1280, global average pool, 1000-way Gemm (dropout omitted: inference graph); "
    "3x224x224 input. 3,504,872 parameters (as torchvision), about 0.62 GFLOPs."
)


def mobilenet_v2(batch_size: int = 1, seed: int = 0) -> onnx.ModelProto:
    g = _Graph(seed)
    x = g.relu6(g.bn(g.conv("input", 3, 32, 3, stride=2), 32))
    cin = 32
    # (expansion t, output channels c, repeats n, first stride s), as in the paper.
    for t, c, n, s in [
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    ]:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = x
            if t != 1:
                y = g.relu6(g.bn(g.conv(y, cin, hidden, 1, pad=0), hidden))
            y = g.relu6(g.bn(g.conv(y, hidden, hidden, 3, stride=stride, group=hidden), hidden))
            y = g.bn(g.conv(y, hidden, c, 1, pad=0), c)
            x = g.node("Add", [x, y]) if (stride == 1 and cin == c) else y
            cin = c
    x = g.relu6(g.bn(g.conv(x, 320, 1280, 1, pad=0), 1280))
    x = g.node("Flatten", [g.node("GlobalAveragePool", [x])], axis=1)
    _rename_output(g, g.gemm(x, 1280, 1000))
    return g.model("mobilenet_v2", MOBILENET_V2_DOC, [_image_input(batch_size)], [_logits([batch_size, 1000])])


VGG11_DOC = (
    "VGG-11 (configuration A of Simonyan & Zisserman 2015), CIFAR-style: the full "
    "eight-conv VGG-11 trunk (64-M-128-M-256-256-M-512-512-M-512-512-M, 3x3 convs with "
    "bias, ReLU, no BatchNorm) on 3x32x32 input, with a 512-512-10 classifier instead of "
    "ImageNet's 25088-4096-4096-1000. 9,750,922 parameters, about 0.31 GFLOPs. The "
    "ImageNet model (224x224) has 132,863,336 parameters, 123.6 M of them in the "
    "classifier (a 530 MB float32 file): the convolutional trunk, which dominates "
    "compute and tuning, is identical."
)


def vgg11(batch_size: int = 1, seed: int = 0) -> onnx.ModelProto:
    g = _Graph(seed)
    x, cin = "input", 3
    layers: list[int | str] = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]
    for v in layers:
        if isinstance(v, str):  # "M": a max pool
            x = g.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
        else:
            x = g.relu(g.conv(x, cin, v, 3, bias=True))
            cin = v
    x = g.node("Flatten", [x], axis=1)  # 512 x 1 x 1 after five pools of a 32x32 input
    x = g.relu(g.gemm(x, 512, 512))
    x = g.relu(g.gemm(x, 512, 512))
    _rename_output(g, g.gemm(x, 512, 10))
    return g.model("vgg11", VGG11_DOC, [_image_input(batch_size, 32)], [_logits([batch_size, 10])])


# --------------------------------------------------------------------------- BERT

BERT_SEQ, BERT_HIDDEN, BERT_HEADS, BERT_FFN = 128, 768, 12, 3072
BERT_ENCODER_DOC = (
    "One BERT-base encoder layer (Devlin et al. 2019): input hidden states "
    "[batch, 128, 768]; 12-head self-attention (Q/K/V/output projections as MatMul+Add, "
    "scaled dot product, Softmax), residual + LayerNormalization (opset 17), "
    "feed-forward 768-3072-768 with exact GELU built from Erf, residual + "
    "LayerNormalization. No attention mask (all tokens attend). 7,087,872 parameters "
    "(as one HuggingFace BertLayer), about 1.9 GFLOPs."
)


def bert_encoder(batch_size: int = 1, seed: int = 0) -> onnx.ModelProto:
    g = _Graph(seed)
    s, h, nh, ffn = BERT_SEQ, BERT_HIDDEN, BERT_HEADS, BERT_FFN
    dh = h // nh
    x = "hidden_states"
    split_heads = g.const([0, 0, nh, dh], np.int64)  # 0 copies batch and seq dims
    merge_heads = g.const([0, 0, h], np.int64)

    def heads(t, perm):
        return g.node("Transpose", [g.node("Reshape", [t, split_heads])], perm=perm)

    q = heads(g.linear(x, h, h), [0, 2, 1, 3])  # [B, heads, S, dh]
    k = heads(g.linear(x, h, h), [0, 2, 3, 1])  # [B, heads, dh, S]
    v = heads(g.linear(x, h, h), [0, 2, 1, 3])
    scores = g.node("Mul", [g.node("MatMul", [q, k]), g.const(1.0 / math.sqrt(dh))])
    probs = g.node("Softmax", [scores], axis=-1)
    ctx = g.node("Transpose", [g.node("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    ctx = g.node("Reshape", [ctx, merge_heads])
    attn = g.linear(ctx, h, h)

    def layer_norm(t):
        gamma = g.init(np.ones(h, np.float32), "ln_gamma")
        beta = g.init(np.zeros(h, np.float32), "ln_beta")
        return g.node("LayerNormalization", [t, gamma, beta], axis=-1, epsilon=1e-12)

    x1 = layer_norm(g.node("Add", [attn, x]))
    up = g.linear(x1, h, ffn)
    # Exact GELU: 0.5 * x * (1 + erf(x / sqrt(2))) (the Gelu op needs opset 20).
    erf = g.node("Erf", [g.node("Div", [up, g.const(math.sqrt(2.0))])])
    gelu = g.node("Mul", [g.node("Mul", [up, g.node("Add", [erf, g.const(1.0)])]), g.const(0.5)])
    down = g.linear(gelu, ffn, h)
    _rename_output(g, layer_norm(g.node("Add", [down, x1])), "output")
    shape = [batch_size, s, h]
    return g.model(
        "bert_encoder",
        BERT_ENCODER_DOC,
        [helper.make_tensor_value_info("hidden_states", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, shape)],
    )


# --------------------------------------------------------------------------- LSTM LM

LSTM_VOCAB, LSTM_EMBED, LSTM_HIDDEN, LSTM_SEQ = 1000, 128, 256, 32
LSTM_LM_DOC = (
    "Small LSTM language model: token ids [batch, 32] (int64) -> embedding Gather "
    "(1000 x 128) -> one LSTM layer (hidden 256) unrolled over the 32 steps into "
    "MatMul/Add/Split/Sigmoid/Tanh/Mul nodes (TVM's Relax ONNX frontend has no LSTM "
    "converter; the input projection of all steps is one MatMul, as cuDNN does) -> "
    "linear 256 -> 1000 logits per step. 779,240 parameters (one combined gate bias; "
    "PyTorch's nn.LSTM keeps two, +1,024), about 0.05 GFLOPs. lstm_lm(recurrence='onnx') "
    "builds the same network with the ONNX LSTM op, numerically identical, for tools "
    "that handle it (onnxruntime; not TVM Relax)."
)


def lstm_lm(batch_size: int = 1, seed: int = 0, *, recurrence: str = "unrolled") -> onnx.ModelProto:
    """Embedding + LSTM + linear language model.

    ``recurrence="unrolled"`` (the zoo entry) writes the cell out per time step
    so TVM Relax can import it; ``recurrence="onnx"`` uses the ONNX ``LSTM`` op
    with the same weights (same outputs), which TVM Relax cannot import: a real
    model to test the unsupported-op path with, and the form Horus's
    per-time-step unrolling of recurrent cells is defined on.
    """
    if recurrence not in ("unrolled", "onnx"):
        raise ValueError("recurrence must be 'unrolled' or 'onnx'")
    g = _Graph(seed)
    v, e, h, t_len = LSTM_VOCAB, LSTM_EMBED, LSTM_HIDDEN, LSTM_SEQ
    rng = g.rng
    emb = g.init((rng.standard_normal((v, e)) * 0.1).astype(np.float32), "embedding")
    w = (rng.standard_normal((e, 4 * h)) / math.sqrt(e)).astype(np.float32)  # gates i, o, f, c
    r = (rng.standard_normal((h, 4 * h)) / math.sqrt(h)).astype(np.float32)
    b = (rng.standard_normal(4 * h) * 0.1).astype(np.float32)
    x = g.node("Gather", [emb, "input_ids"], axis=0)  # [B, T, E]

    if recurrence == "onnx":
        xt = g.node("Transpose", [x], perm=[1, 0, 2])  # LSTM layout 0: [T, B, E]
        w_n = g.init(w.T[None].copy(), "lstm_W")  # [1, 4H, E]
        r_n = g.init(r.T[None].copy(), "lstm_R")
        b_n = g.init(np.concatenate([b, np.zeros(4 * h, np.float32)])[None], "lstm_B")
        y = g.node("LSTM", [xt, w_n, r_n, b_n], n_out=1, hidden_size=h)  # [T, 1, B, H]
        y = g.node("Squeeze", [y, g.const([1], np.int64)])
        hs = g.node("Transpose", [y], perm=[1, 0, 2])  # [B, T, H]
    else:
        xw = g.node("Add", [g.node("MatMul", [x, g.init(w, "lstm_W")]), g.init(b, "lstm_B")])
        r_name = g.init(r, "lstm_R")
        split = g.const([h] * 4, np.int64)
        c_prev = h_prev = None
        steps = []
        for t in range(t_len):
            gates = g.node("Gather", [xw, g.const(t, np.int64)], axis=1)  # [B, 4H]
            if h_prev is not None:
                gates = g.node("Add", [gates, g.node("MatMul", [h_prev, r_name])])
            i, o, f, c = g.node("Split", [gates, split], n_out=4, axis=1)
            i, o, f, c = (g.node("Sigmoid", [i]), g.node("Sigmoid", [o]), g.node("Sigmoid", [f]), g.node("Tanh", [c]))
            ic = g.node("Mul", [i, c])
            # Zero initial state: the first step has no recurrent term and no f*C.
            c_prev = ic if c_prev is None else g.node("Add", [g.node("Mul", [f, c_prev]), ic])
            h_prev = g.node("Mul", [o, g.node("Tanh", [c_prev])])
            steps.append(g.node("Unsqueeze", [h_prev, g.const([1], np.int64)]))
        hs = g.node("Concat", steps, axis=1)  # [B, T, H]
    w_out = g.init((rng.standard_normal((h, v)) / math.sqrt(h)).astype(np.float32), "out_w")
    b_out = g.init(np.zeros(v, np.float32), "out_b")
    _rename_output(g, g.node("Add", [g.node("MatMul", [hs, w_out]), b_out]))
    name = "lstm_lm" if recurrence == "unrolled" else "lstm_lm_onnx_lstm"
    return g.model(
        name,
        LSTM_LM_DOC,
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [batch_size, t_len])],
        [_logits([batch_size, t_len, v])],
    )


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class ZooEntry:
    """A named zoo model. ``build(batch_size, seed)`` returns a fresh ModelProto."""

    name: str
    description: str
    builder: Callable[..., onnx.ModelProto]

    def build(self, batch_size: int = 1, seed: int = 0) -> onnx.ModelProto:
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        return self.builder(batch_size=int(batch_size), seed=int(seed))


ZOO: dict[str, ZooEntry] = {
    e.name: e
    for e in [
        ZooEntry("small_cnn", SMALL_CNN_DOC, small_cnn),
        ZooEntry("resnet18", RESNET18_DOC, resnet18),
        ZooEntry("mobilenet_v2", MOBILENET_V2_DOC, mobilenet_v2),
        ZooEntry("vgg11", VGG11_DOC, vgg11),
        ZooEntry("bert_encoder", BERT_ENCODER_DOC, bert_encoder),
        ZooEntry("lstm_lm", LSTM_LM_DOC, lstm_lm),
    ]
}


def list_models() -> list[str]:
    """Names of the zoo models, in registry order (smallest first-ish)."""
    return list(ZOO)


def build_model(name: str, *, batch_size: int = 1, seed: int = 0) -> onnx.ModelProto:
    """Build zoo model ``name``; ``KeyError`` listing the names if unknown."""
    try:
        entry = ZOO[name]
    except KeyError:
        raise KeyError(f"unknown zoo model {name!r}; choose one of {', '.join(ZOO)}") from None
    return entry.build(batch_size=batch_size, seed=seed)
