"""Give ONNX Clip back to Relax as ``maximum``/``minimum`` ops, so data layout conversion sees through it.

Django-free. TVM's ONNX importer lowers Clip (ReLU6 in every MobileNet) straight to TIR
(``bb.emit_te(topi.maximum, x, lo)``, then ``topi.minimum``): ``call_tir`` of two PrimFuncs,
opaque to ``ConvertLayout``, which then keeps them in the layout the graph came in and wraps
each in a transpose pair (NHWC -> NCHW -> max -> min -> NHWC). On mobilenet_v2 that was 13
tuning tasks and 39 % of the tuned estimate. ``R.maximum(x, scalar)`` is the same computation
(LegalizeOps lowers it to the same TE), and ConvertLayout lets an elementwise op with a 0-d
operand follow its input's layout, so after this pass the clip fuses into the NHWC conv before it.

Only a ``call_tir`` whose PrimFunc is exactly ``out[i] = max(a[i], b)`` (or ``min``), ``b`` a 0-d
tensor or a number, ``out`` shaped like ``a``, is rewritten; anything else is left as it is.
"""

from __future__ import annotations

__all__ = ["lift_clip_to_relax_ops", "scalar_clamp_op"]

_MAX_LOOP_DEPTH = 16


def scalar_clamp_op(prim_func) -> tuple[str, float | None] | None:
    """``(op, bound)`` when ``prim_func`` computes ``out[i] = max/min(a[i], b)`` (op ``"maximum"`` or
    ``"minimum"``) with one store under its loops and blocks, ``b`` either a 0-d buffer (``bound`` None:
    Clip from opset 11 on, bounds as inputs) or a number (``bound``: Clip before opset 11, bounds as
    attributes); ``None`` otherwise."""
    from tvm import tirx

    node = prim_func.body
    for _ in range(_MAX_LOOP_DEPTH):
        if isinstance(node, tirx.For):
            node = node.body
        elif type(node).__name__ == "SBlockRealize":
            if not _is_true(node.predicate):
                return None
            node = node.block.body
        else:
            break
    if not isinstance(node, tirx.BufferStore):
        return None
    value = node.value
    op = "maximum" if isinstance(value, tirx.Max) else "minimum" if isinstance(value, tirx.Min) else None
    if op is None:
        return None
    tensor, scalar = value.a, value.b
    if not _is_load(tensor) or len(tensor.indices) != len(node.indices):
        return None
    if not all(a.same_as(b) for a, b in zip(tensor.indices, node.indices, strict=True)):
        return None
    if _is_load(scalar) and len(scalar.indices) == 0:
        return op, None
    if isinstance(scalar, (tirx.FloatImm, tirx.IntImm)):
        return op, float(scalar.value)
    return None


def _is_load(expr) -> bool:
    # a buffer read (TVM 0.27 calls it TensorLoad; BufferLoad before)
    return type(expr).__name__ in ("TensorLoad", "BufferLoad")


def _is_true(predicate) -> bool:
    return predicate is None or getattr(predicate, "value", None) == 1


def lift_clip_to_relax_ops():
    """A module pass: every ``call_tir`` of a scalar clamp PrimFunc (:func:`scalar_clamp_op`) becomes
    ``R.maximum``/``R.minimum``; PrimFuncs no longer called are dropped."""
    from tvm import ir, relax, tirx
    from tvm.relax import expr_functor

    call_tir_op = ir.Op.get("relax.call_tir")

    @expr_functor.mutator
    class _Lifter(expr_functor.PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)
            self.mod_ = mod

        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not (call.op.same_as(call_tir_op) and isinstance(call.args[0], ir.GlobalVar)):
                return call
            callee = self.mod_[call.args[0]]
            clamp = scalar_clamp_op(callee) if isinstance(callee, tirx.PrimFunc) else None
            args = call.args[1].fields if isinstance(call.args[1], relax.Tuple) else ()
            if clamp is None or len(call.args) != 2 or not args or not _same_tensor_type(args[0], call):
                return call
            op, bound = clamp
            if bound is None and len(args) == 2 and _ndim(args[1]) == 0:
                scalar = args[1]
            elif bound is not None and len(args) == 1:
                scalar = relax.const(bound, call.ty.dtype)
            else:
                return call
            return getattr(relax.op, op)(args[0], scalar)

    @ir.transform.module_pass(opt_level=0, name="LiftClipToRelaxOps")
    def _pass(mod, _ctx):
        lifter = _Lifter(mod)
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                lifter.builder_.update_func(gvar, lifter.visit_expr(func))
        return relax.transform.DeadCodeElimination()(lifter.builder_.finalize())

    return _pass


def _ndim(expr) -> int:
    return int(getattr(expr.ty, "ndim", -1))


def _same_tensor_type(tensor, call) -> bool:
    import tvm_ffi

    a, b = tensor.ty, call.ty
    return (
        a.dtype == b.dtype
        and a.shape is not None
        and b.shape is not None
        and tvm_ffi.structural_equal(a.shape, b.shape)
    )
