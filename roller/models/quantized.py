"""Integer matmuls of quantized graphs on their 8-bit operands.

TVM's ONNX importer turns ``MatMulInteger(a, b, a_zero_point, b_zero_point)`` (what onnxruntime's
``quantize_dynamic`` writes) into ``matmul(astype(a, int32) - za, astype(b, int32) - zb, out_dtype=int32)``:
both operands are widened to int32 tensors first, so the kernel reads 4 bytes per element and the
activation is copied once more, widened, before every matmul. With ``b`` a constant this pass rewrites it,
exactly (int32 arithmetic), as

    matmul(a, b', out_dtype=int32) - za * colsum(b'),    b' = b - zb folded into the constant

where ``b'`` stays 8-bit (int8 when every ``b - zb`` fits in it, else uint8) and ``colsum(b')`` (its sums
over the reduction axis) is a constant: the matmul's PrimFunc then reads uint8 / int8 and accumulates in
int32, and the zero-point term is an elementwise epilogue that fuses into it. A matmul the rewrite does not
fit (a non-constant ``b``, a ``b - zb`` fitting no 8-bit type) is left as the importer wrote it, correct
and widened.
"""
from __future__ import annotations

import numpy as np

from roller.models.relax_rewrite import bound, op_name, rewrite_counted

EIGHT_BIT = ("uint8", "int8")


def _narrowest(values: np.ndarray) -> str | None:
    """The 8-bit dtype holding every value (int8 first: VNNI's u8 x s8 form), else None."""
    lo, hi = int(values.min(initial=0)), int(values.max(initial=0))
    if -128 <= lo and hi <= 127:
        return "int8"
    if 0 <= lo and hi <= 255:
        return "uint8"
    return None


def _integer_matmul_mutator():
    """The Relax mutator class of :func:`narrow_integer_matmuls` (made on first use: TVM is imported lazily)."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class _Narrow(PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)
            self.rewritten = 0

        def constant(self, expr):
            expr = bound(self, expr)
            if isinstance(expr, tvm.ir.expr.Constant):
                return expr.value.numpy()
            if op_name(expr) == "relax.astype":  # a constant widened (the importer's astype(zero point, int32))
                inner = self.constant(expr.args[0])
                return None if inner is None else inner.astype(str(expr.attrs.dtype))
            if op_name(expr) == "relax.expand_dims":  # a per-column zero point [N] made [1, N]
                inner = self.constant(expr.args[0])
                return None if inner is None else np.expand_dims(inner, tuple(int(a) for a in expr.attrs.axis))
            return None

        def widened(self, expr):
            """(the 8-bit tensor, its zero point or None) when ``expr`` is ``astype(x8, int32) [- z]``, else None."""
            expr = bound(self, expr)
            zero = None
            if op_name(expr) == "relax.subtract":
                expr, zero = bound(self, expr.args[0]), expr.args[1]
            if op_name(expr) != "relax.astype" or str(expr.attrs.dtype) != "int32":
                return None
            x = expr.args[0]
            if str(getattr(x.ty, "dtype", "")) not in EIGHT_BIT:
                return None
            return x, zero

        def visit_call_(self, call):
            call = super().visit_call_(call)
            if op_name(call) != "relax.matmul" or str(call.attrs.out_dtype) != "int32":
                return call
            lhs, rhs = self.widened(call.args[0]), self.widened(call.args[1])
            if lhs is None or rhs is None:
                return call
            b = self.constant(rhs[0])
            zb = np.zeros((), "int64") if rhs[1] is None else self.constant(rhs[1])
            if b is None or zb is None or b.ndim != 2:
                return call
            shifted = b.astype(np.int64) - zb.astype(np.int64)  # zb: scalar, [1, N] (per column)
            dtype = _narrowest(shifted)
            if dtype is None or shifted.shape != b.shape:
                return call
            bb = self.builder_
            out = relax.op.matmul(lhs[0], relax.const(shifted.astype(dtype)), out_dtype="int32")
            if lhs[1] is not None:  # sum_k (a - za)(b') = sum_k a b' - za * sum_k b'
                colsum = relax.const(shifted.sum(axis=0).astype(np.int32))
                out = relax.op.subtract(bb.emit(out), bb.emit(relax.op.multiply(lhs[1], colsum)))
            self.rewritten += 1
            # the last call is returned, not emitted: a binding of a variable to another stops FuseOps there
            return out

    return _Narrow


def narrow_integer_matmuls(mod):
    """``(mod, count)``: ``mod`` with every int32 matmul of widened 8-bit operands and a constant right-hand
    side rewritten on the 8-bit operands (see the module's docstring), and how many were; unused
    bindings left behind are removed."""
    return rewrite_counted(_integer_matmul_mutator()(mod), mod)
