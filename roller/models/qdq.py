"""Statically quantized (QDQ) graphs as integer convolutions and plain arithmetic.

onnxruntime's ``quantize_static(..., quant_format=QDQ)`` writes every quantized convolution as
``Conv(DequantizeLinear(xq, sx, zx), DequantizeLinear(wq, sw, 0))``: as imported, the convolution computes in
float32 on dequantized copies. Three rewrites make it an 8-bit kernel in the channels-last layout:

- :func:`int8_products` (before the layout conversion) rewrites it, exactly up to float rounding, as

      (sx * sw) * float(conv_int32(pad(xq, zx), wq) - zx * sum(wq))

  where the padding holds the zero point (so that padded taps add nothing after the zero-point term;
  with ``zx = 0`` the convolution's own zero padding does), ``sum(wq)`` is each output channel's weight
  sum and ``sx * sw`` one scale a channel: the convolution reads uint8 x int8 and accumulates in int32,
  its rescale and what follows (bias, the next QuantizeLinear) are its epilogue. Input channels are
  padded to whole dot steps (an image's 3 channels to 4, zero weights), so that VNNI's 4-deep lanes
  (``roller.plan.dot``) run every convolution. A ``MatMul`` / ``Gemm`` of the same operands (a classifier,
  a statically quantized transformer's projections) becomes ``(sx * sw) * float(matmul_int32(xq, wq) -
  zx * colsum(wq))`` alike, a Gemm's transposed weight stored [K, N].
- :func:`quantizers_as_arithmetic` writes the QuantizeLinear / DequantizeLinear left whose scale and zero
  point are constants as the elementwise operators TVM's own legalization computes (round, clip, cast):
  ConvertLayout has no layout rule for ``quantize`` / ``dequantize`` and would keep each between two
  transposes in the frontend's layout.
- :func:`pads_in_the_permuted_layout` (after the layout conversion) moves a transpose above a ``pad``,
  which has no layout rule either, so that the transposes around it meet and cancel.
"""
from __future__ import annotations

import numpy as np

from roller.models.relax_rewrite import bound, mutate_functions, op_name, rewrite_counted, static_dims
from roller.plan.dot import DOT_DEPTH


def _constant(mutator, expr) -> np.ndarray | None:
    import tvm

    expr = bound(mutator, expr)
    return expr.value.numpy() if isinstance(expr, tvm.ir.expr.Constant) else None


def _along(values: np.ndarray, axis: int, rank: int) -> np.ndarray:
    """A quantization parameter (a scalar, or one value per index of ``axis``) shaped to broadcast over a
    tensor of ``rank`` dimensions. A scalar too is a tensor of ``rank`` ones, not 0-d: TVM's legalization
    writes a 0-d constant into the kernel as a literal, so every QDQ step (its own scale) was a function of
    its own; a tensor is a parameter, and functions that differ in their scales only are built once."""
    shape = [1] * rank
    if values.size == 1:
        return values.reshape(shape)
    shape[axis % rank] = values.size
    return values.reshape(shape)


def _int8_product_mutator():
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class _Int8Product(PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)
            self.rewritten = 0

        def dequantized(self, expr):
            """(data, scale, zero point, axis) of ``dequantize(data, scale, zero point)`` with constant
            parameters, else None."""
            expr = bound(self, expr)
            if op_name(expr) != "relax.dequantize" or str(expr.attrs.out_dtype) != "float32":
                return None
            scale, zero = _constant(self, expr.args[1]), _constant(self, expr.args[2])
            if scale is None or zero is None:
                return None
            return expr.args[0], scale, zero, int(expr.attrs.axis)

        def weight(self, expr):
            """(int8 constant [K, N], scale, zero point) of a matmul's dequantized constant weight, read as
            stored ([K, N], scales along N) or through a transpose (a Gemm's [N, K]), else None."""
            expr = bound(self, expr)
            axes = getattr(expr.attrs, "axes", None) if op_name(expr) == "relax.permute_dims" else None
            dims = static_dims(expr.args[0].ty) if op_name(expr) == "relax.permute_dims" else None
            # a 2-D transpose: axes [1, 0], or none given (reversed)
            transposed = dims is not None and len(dims) == 2 and (axes is None or [int(a) for a in axes] == [1, 0])
            w = self.dequantized(expr.args[0] if transposed else expr)
            if w is None:
                return None
            wq_expr, sw, zw, axis = w
            wq = _constant(self, wq_expr)
            if wq is None or wq.dtype != np.int8 or wq.ndim != 2 or np.any(zw != 0):
                return None
            if sw.size > 1 and axis % 2 != (0 if transposed else 1):  # scales along the output's columns only
                return None
            return (wq.T if transposed else wq), sw, axis

        def matmul(self, call):
            """``matmul(dequantize(xq), dequantize(wq))`` with a uint8 activation and a constant int8 weight as
            ``(sx * sw) * float(matmul_int32(xq, wq) - zx * colsum(wq))``; else the call as it is."""
            x = self.dequantized(call.args[0])
            w = self.weight(call.args[1]) if x is not None else None
            if w is None:
                return call
            xq, sx, zx, _ = x
            wq, sw, _ = w
            if str(getattr(xq.ty, "dtype", "")) != "uint8" or sx.size != 1 or zx.size != 1:
                return call
            bb = self.builder_
            acc = bb.emit(relax.op.matmul(xq, relax.const(np.ascontiguousarray(wq)), out_dtype="int32"))
            zero = int(zx.reshape(()))
            if zero:
                sums = wq.astype(np.int64).sum(axis=0) * zero
                acc = bb.emit(relax.op.subtract(acc, relax.const(sums.astype(np.int32))))
            scale = (np.float32(sx.reshape(())) * sw.astype(np.float32).reshape(-1)).astype(np.float32)
            scale = np.broadcast_to(scale, (wq.shape[1],)).copy()
            self.rewritten += 1
            return relax.op.multiply(bb.emit(relax.op.astype(acc, "float32")), relax.const(scale))

        def visit_call_(self, call):
            call = super().visit_call_(call)
            if op_name(call) == "relax.matmul" and str(call.attrs.out_dtype) in ("", "float32", "None"):
                return self.matmul(call)
            if op_name(call) != "relax.nn.conv2d":
                return call
            attrs = call.attrs
            if (str(attrs.data_layout), str(attrs.kernel_layout)) != ("NCHW", "OIHW") or int(attrs.groups) != 1 \
                    or str(attrs.out_layout) != "NCHW":
                return call
            x, w = self.dequantized(call.args[0]), self.dequantized(call.args[1])
            if x is None or w is None:
                return call
            xq, sx, zx, _ = x
            wq_expr, sw, zw, waxis = w
            wq = _constant(self, wq_expr)
            dims = static_dims(call.ty)
            if wq is None or wq.dtype != np.int8 or str(getattr(xq.ty, "dtype", "")) != "uint8" \
                    or sx.size != 1 or zx.size != 1 or np.any(zw != 0) or dims is None:
                return call
            out_channels = wq.shape[0]
            if sw.size not in (1, out_channels) or (sw.size > 1 and waxis % 4 != 0):
                return call
            bb = self.builder_
            zero = int(zx.reshape(()))
            padding = [int(p) for p in attrs.padding]  # top, left, bottom, right
            widths = [0, 0, 0, -wq.shape[1] % DOT_DEPTH, 0, 0, 0, 0]  # input channels in whole dot steps
            if zero and any(padding):  # pad with the zero point: padded taps then cancel in the term below
                top, left, bottom, right = padding
                widths[4:], padding = [top, bottom, left, right], [0, 0, 0, 0]
            if any(widths):
                xq = bb.emit(relax.op.nn.pad(xq, widths, pad_value=float(zero)))
                wq = np.pad(wq, ((0, 0), (0, widths[3]), (0, 0), (0, 0)))  # zero weights for added channels
            acc = bb.emit(relax.op.nn.conv2d(xq, relax.const(wq), strides=attrs.strides, padding=padding,
                                             dilation=attrs.dilation, data_layout="NCHW", kernel_layout="OIHW",
                                             out_dtype="int32"))
            if zero:
                sums = wq.astype(np.int64).sum(axis=(1, 2, 3)) * zero
                acc = bb.emit(relax.op.subtract(acc, relax.const(sums.astype(np.int32).reshape(1, -1, 1, 1))))
            scale = (np.float32(sx.reshape(())) * sw.astype(np.float32).reshape(-1)).astype(np.float32)
            scale = scale.reshape(1, -1, 1, 1)  # a tensor even where one scale (see _along)
            self.rewritten += 1
            return relax.op.multiply(bb.emit(relax.op.astype(acc, "float32")), relax.const(scale))

    return _Int8Product


def int8_products(mod):
    """``(mod, count)``: every NCHW ``conv2d`` and every 2-D-weight ``matmul`` (a Gemm's, through its
    transpose) of a dequantized uint8 activation (a scalar scale and zero point) and a dequantized constant
    int8 weight (zero points 0, one scale or one per output channel) rewritten as an int32 product of the
    8-bit tensors (see the module's docstring), and how many were. Grouped convolutions and other operand
    types keep the float product, correct."""
    return rewrite_counted(_int8_product_mutator()(mod), mod)


def _integer_uses(mod) -> set:
    """The variables of ``mod``'s Relax functions that some call other than a ``dequantize`` reads (a
    quantized activation an int8 convolution, or its padding, takes as it is)."""
    from tvm import relax
    from tvm.relax.expr_functor import PyExprVisitor, visitor

    @visitor
    class _Uses(PyExprVisitor):
        def __init__(self):
            super().__init__()
            self.used: set = set()

        def visit_call_(self, call):
            if op_name(call) != "relax.dequantize":
                self.used.update(a for a in call.args if isinstance(a, relax.Var))
            super().visit_call_(call)

    uses = _Uses()
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            uses.visit_expr(func)
    return uses.used


def _quantizer_mutator():
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    integer_range = {"uint8": (0, 255), "int8": (-128, 127)}

    @mutator
    class _Arithmetic(PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)
            self.rewritten = 0
            self.clipped: set = set()  # the float values (whole numbers in the type's range) quantize casts
            self.integers = _integer_uses(mod)  # quantized values read as integers: the float path would add
            self.original = None  # the variable the dequantize being rewritten reads, as in ``mod``

        def params(self, call):
            """(scale, zero point) shaped to broadcast over the data, when both are constants, else None."""
            dims = static_dims(call.args[0].ty)
            scale, zero = _constant(self, call.args[1]), _constant(self, call.args[2])
            if dims is None or scale is None or zero is None:
                return None
            axis, rank = int(call.attrs.axis), len(dims)
            if any(p.size not in (1, dims[axis % rank] if rank else 1) for p in (scale, zero)):
                return None
            return _along(scale, axis, rank), _along(zero, axis, rank)

        def quantize(self, call, scale, zero):
            """clip(round(x / scale) + zero, lo, hi) cast, as TVM's legalization computes it."""
            dtype = str(call.attrs.out_dtype)
            if dtype not in integer_range or str(call.args[0].ty.dtype) != "float32":
                return call
            bb, lo, hi = self.builder_, *integer_range[dtype]
            scaled = bb.emit(relax.op.round(bb.emit(relax.op.divide(call.args[0], relax.const(
                scale.astype(np.float32))))))
            shifted = bb.emit(relax.op.add(scaled, relax.const(zero.astype(np.float32))))
            clipped = bb.emit(relax.op.maximum(bb.emit(relax.op.minimum(shifted, relax.const(np.float32(hi)))),
                                               relax.const(np.float32(lo))))
            self.clipped.add(clipped)
            return relax.op.astype(clipped, dtype)

        def dequantize(self, call, scale, zero):
            """float(int32(x) - zero) * scale, as TVM's legalization computes it (folded for a constant x;
            from the float value itself where x is a quantize's cast)."""
            data = call.args[0]
            if str(call.attrs.out_dtype) != "float32" or str(data.ty.dtype) not in (*integer_range, "int32"):
                return call  # (int32: a QDQ graph's biases)
            scale, zero = scale.astype(np.float32), zero.astype(np.int32)
            value = _constant(self, data)
            if value is not None:
                return relax.const(((value.astype(np.int32) - zero).astype(np.float32) * scale).astype(np.float32))
            bb = self.builder_
            source = bound(self, data)
            if (op_name(source) == "relax.astype" and source.args[0] in self.clipped
                    and self.original not in self.integers):
                # dequantize(quantize(x)): the integer is the float value quantize cast, a whole number of
                # at most 8 bits, so its casts there and back are exact and left out. Not where the integers
                # are read too (an int8 convolution's input): the float value would then be stored beside
                # them, 4 bytes an element and a cast of its own (ResNet-50's residuals)
                shifted = bb.emit(relax.op.subtract(source.args[0], relax.const(zero.astype(np.float32))))
                return relax.op.multiply(shifted, relax.const(scale))
            shifted = bb.emit(relax.op.subtract(bb.emit(relax.op.astype(data, "int32")), relax.const(zero)))
            return relax.op.multiply(bb.emit(relax.op.astype(shifted, "float32")), relax.const(scale))

        def visit_call_(self, call):
            self.original = call.args[0] if call.args else None
            call = super().visit_call_(call)
            name = op_name(call)
            if name not in ("relax.quantize", "relax.dequantize"):
                return call
            params = self.params(call)
            if params is None:
                return call
            out = (self.quantize if name == "relax.quantize" else self.dequantize)(call, *params)
            self.rewritten += out is not call
            return out

    return _Arithmetic


def quantizers_as_arithmetic(mod):
    """``(mod, count)``: each ``quantize`` / ``dequantize`` with constant parameters (a scalar, or one per
    index of its axis) written as the elementwise operators of TVM's legalization, whose layout
    ConvertLayout can convert; a dequantized constant folded with numpy."""
    return rewrite_counted(_quantizer_mutator()(mod), mod)


def pads_in_the_permuted_layout(mod, _ctx=None):
    """``permute_dims(pad(x))`` as ``pad(permute_dims(x))`` (the pad widths permuted alike), and two
    transposes in a row as one, or none where they restore the source: ConvertLayout keeps a ``pad``
    (it has no layout rule) in the frontend's layout between two transposes."""
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class _Hoist(PyExprMutator):
        def combined(self, x, axes):
            """``permute_dims(x, axes)``, one transpose with the one ``x`` is bound to (none if they cancel)."""
            source = bound(self, x)
            if op_name(source) == "relax.permute_dims" and source.attrs.axes is not None:
                inner = [int(a) for a in source.attrs.axes]
                x, axes = source.args[0], [inner[a] for a in axes]
            return x if axes == list(range(len(axes))) else relax.op.permute_dims(x, axes)

        def visit_call_(self, call):
            call = super().visit_call_(call)
            if op_name(call) != "relax.permute_dims" or call.attrs.axes is None:
                return call
            axes = [int(a) for a in call.attrs.axes]
            source = bound(self, call.args[0])
            if op_name(source) != "relax.nn.pad" or str(source.attrs.pad_mode) != "constant":
                return self.combined(call.args[0], axes)
            widths = [int(p) for p in source.attrs.pad_width]
            inner = self.combined(source.args[0], axes)
            if isinstance(inner, relax.Call):
                inner = self.builder_.emit(inner)
            return relax.op.nn.pad(inner, [w for a in axes for w in widths[2 * a:2 * a + 2]],
                                   pad_value=float(source.attrs.pad_value))

    return relax.transform.DeadCodeElimination()(mutate_functions(_Hoist(mod), mod))
