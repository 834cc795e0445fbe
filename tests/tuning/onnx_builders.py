"""Tiny ONNX models for the isolation and recovery tests, built with onnx.helper."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def hostile_gather() -> bytes:
    """`Gather(x[16], Neg(const -2^40))`: valid ONNX; the compiled model reads x[2^40] and segfaults."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    c = numpy_helper.from_array(np.array(-2**40, dtype=np.int64), "c")
    nodes = [helper.make_node("Neg", ["c"], ["idx"]), helper.make_node("Gather", ["x", "idx"], ["y"], axis=0)]
    graph = helper.make_graph(nodes, "hostile", [x], [y], initializer=[c])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def tiny_dense() -> bytes:
    """relu(x[1,16] @ W[16,16]): one small tuning task."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 16)).astype("float32"), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [x], [y], initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
