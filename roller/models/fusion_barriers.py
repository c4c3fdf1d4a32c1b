"""Where TVM's FuseOps would fuse a broadcast onto a convolution or matmul whose output it widens, keep it
apart.

Squeeze-and-excitation computes a per-channel gate (global pool, 1x1 convs, sigmoid: a [N, 1, 1, C]
tensor) and multiplies the feature map by it. FuseOps fuses that multiply into the gate's convolution as
an epilogue, so the fused function reads the convolution's output broadcast over H and W: not an
elementwise epilogue, which roller's rule declines (EfficientNet-B0: 10 of its functions went to
``dlight.Reduction``). This pass marks such a multiply ``kInjective`` on a copy of its PrimFunc, so FuseOps
leaves it outside the convolution's group: the gate is a small roller kernel, the multiply a broadcast of
its own (onnxruntime runs it as its own Mul node too).

A pad of such a function's output (a QDQ convolution's input padded with its zero point, roller.models.qdq)
is kept apart too (marked ``kOpaque``): fused, it made the producer's function write a padded layout,
which roller's rule declines (EfficientNet-B0's QDQ graph: 10 functions); apart it is a copy of uint8s.

A broadcast whose *small* operand is not computed from a convolution or matmul (an attention mask, a bias,
a layer norm's mean: TVM marks reductions kOutEWiseFusable too, and the row-wise rule fuses those whole)
is left alone: it is an epilogue input roller reads directly.
"""
from __future__ import annotations

import math

from roller.models.relax_rewrite import mutate_functions, static_dims

# TVM's relay/relax OpPatternKind values (include/tvm/relax/op_attr_types.h)
ELEMWISE, BROADCAST, INJECTIVE, OUT_EWISE_FUSABLE, OPAQUE = 0, 1, 2, 4, 8
# How many elementwise/broadcast producers back from the multiply the convolution may be (bias, SiLU's
# negative/exp/add/divide, a Clip's two extrema; in a QDQ graph a quantize and a dequantize after each,
# ~10 more)
_CHAIN_DEPTH = 30


def _elements(ty) -> int | None:
    """Elements of a static tensor type (a Relax var's or call's ``ty``), else None."""
    dims = static_dims(ty)
    return None if dims is None else math.prod(dims)


def keep_widening_broadcasts_apart(mod, _ctx=None):
    """The module pass (run after AnnotateTIROpPattern, before FuseOps); returns the rewritten module."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    call_tir = tvm.ir.Op.get("relax.call_tir")

    def pattern(gv) -> int | None:
        func = mod[gv] if isinstance(gv, tvm.ir.GlobalVar) and gv in mod.functions else None
        if not isinstance(func, tvm.tirx.PrimFunc) or func.attrs is None or "op_pattern" not in func.attrs:
            return None
        return int(func.attrs["op_pattern"])

    @mutator
    class _Apart(PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)
            self.copies: dict = {}
            self.seen: dict = {}  # (var, depth) -> from_fusable's answer: DAGs of elementwise calls share producers

        def producer(self, arg):
            """The call_tir computing ``arg``, or None."""
            if not isinstance(arg, relax.Var):
                return None
            value = self.lookup_binding(arg)
            ok = isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.same_as(call_tir)
            return value if ok else None

        def from_fusable(self, arg, depth: int) -> bool:
            """True when ``arg`` is computed by a kOutEWiseFusable call of two or more tensors (a convolution,
            a matmul: not a reduction of one) through at most ``depth`` elementwise/broadcast calls."""
            key = (arg, depth)
            if key not in self.seen:
                self.seen[key] = self._from_fusable(arg, depth)
            return self.seen[key]

        def _from_fusable(self, arg, depth: int) -> bool:
            call = self.producer(arg)
            if call is None or depth < 0:
                return False
            kind = pattern(call.args[0])
            if kind == OUT_EWISE_FUSABLE:  # a convolution or matmul reads two tensors; a mean (layer norm's,
                return len(call.args[1].fields) >= 2  # which the row-wise rule fuses whole) reads one
            if kind is None or kind > BROADCAST:
                return False
            return any(self.from_fusable(a, depth - 1) for a in call.args[1].fields)

        def apart(self, call, kind: int):
            """``call`` on a copy of its PrimFunc marked ``kind``."""
            gv = call.args[0]
            if (gv, kind) not in self.copies:
                apart = mod[gv].with_attr("op_pattern", kind)
                self.copies[gv, kind] = self.builder_.add_func(apart, f"{gv.name_hint}_apart")
            return relax.Call(call.op, [self.copies[gv, kind], *call.args[1:]], call.attrs, call.ty_args)

        def visit_call_(self, call):
            call = super().visit_call_(call)
            kind = pattern(call.args[0]) if isinstance(call.op, tvm.ir.Op) and call.op.same_as(call_tir) else None
            out = _elements(call.ty)
            small = [a for a in call.args[1].fields if isinstance(a, relax.Var) and out is not None
                     and (n := _elements(a.ty)) is not None and n < out] if kind is not None else []
            if kind == INJECTIVE and len(call.args[1].fields) == 1 and small \
                    and self.from_fusable(small[0], _CHAIN_DEPTH):
                return self.apart(call, OPAQUE)  # a pad (one input, more elements out)
            if kind is None or kind > BROADCAST:  # (TVM marks a per-channel multiply kElemWise too)
                return call
            if not any(self.from_fusable(a, _CHAIN_DEPTH) for a in small):
                return call
            return self.apart(call, INJECTIVE)

    return mutate_functions(_Apart(mod), mod)
