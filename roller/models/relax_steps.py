"""The Relax steps around scheduling: input specs of a Relax module, legalizing and fusing it into PrimFuncs,
building the scheduled module, random inputs. Shared by the frontend, the pass and the per-function cache."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from roller.errors import ModelError
from roller.models.fusion_barriers import keep_widening_broadcasts_apart
from roller.models.legalize import legalize_map
from roller.models.qdq import int8_products, pads_in_the_permuted_layout, quantizers_as_arithmetic
from roller.models.quantized import narrow_integer_matmuls
from roller.models.relax_rewrite import mutate_functions, static_dims


def relax_inputs(mod) -> dict[str, tuple[tuple[int, ...], str]]:
    """The static (shape, dtype) of each parameter of ``mod["main"]`` (a Relax function)."""
    from tvm import relax, tirx

    main = mod["main"]
    out = {}
    for p in main.params:
        ty = p.ty
        shape = getattr(ty, "shape", None)
        dims = getattr(shape, "values", None)
        if not isinstance(ty, relax.TensorType) or dims is None:
            raise ModelError(f"parameter {p.name} of main is not a tensor with a known shape")
        if not all(isinstance(d, tirx.IntImm) for d in dims):
            raise ModelError(f"parameter {p.name} of main has a symbolic shape {list(dims)}: bind it first "
                             f"(relax.transform.BindSymbolicVars)")
        out[str(p.name)] = (tuple(int(d) for d in dims), str(ty.dtype))
    return out


def legalize_and_fuse(mod, target, layout: str = "NHWC", fast_math: bool = True,
                      integer_convolutions: bool = False):
    """TVM's CPU dispatch + legalize passes, then view-only reshapes turned into runtime reshapes.

    With ``layout="NHWC"`` convolutions are first converted to NHWC activations and HWIO weights
    (``relax.transform.ConvertLayout``; the layout propagates through elementwise operators and pools,
    and the weights' transposes fold into constants), so that output channels are contiguous for the
    vector lanes; ``"NCHW"`` keeps the frontend's layout. ``fast_math`` replaces erf, exp, tanh and
    softmax by TVM's vectorizable approximations (``relax.transform.FastMathTransform``: fast_erf is
    within 2e-7 of erf and ran 4096 values in 1 us against 27-37 us, which dominated a GELU MLP), and
    sigmoid by 1 / (1 + exp(-x)) first so that its exp becomes fast_exp, and a power by a small whole
    constant by products (:func:`_vectorizable_math`). Quantized graphs: integer matmuls read their 8-bit
    operands (``roller.models.quantized``); with ``integer_convolutions`` (a device whose vectors have
    dot-product lanes: on others a one-lane int32 multiply-add runs slower than float32's FMA) a QDQ
    convolution becomes an int32 convolution of its 8-bit operands, and quantizers with constant parameters
    plain arithmetic in any case (``roller.models.qdq``)."""
    import tvm
    from tvm import relax
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    if layout not in ("NHWC", "NCHW"):
        raise ModelError(f"layout {layout!r}: use NHWC or NCHW")
    convert = [relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "HWIO"]}),
               tvm.transform.module_pass(pads_in_the_permuted_layout, opt_level=0, name="roller.PadsPermuted")
               ] if layout == "NHWC" else []
    fast = ([tvm.transform.module_pass(_vectorizable_math, opt_level=0, name="roller.VectorizableMath"),
             relax.transform.FastMathTransform()] if fast_math else [])
    sink = [tvm.transform.module_pass(_sink_reshapes, opt_level=0, name="roller.SinkReshapes")]
    fold = [tvm.transform.module_pass(_fold_layout_constants, opt_level=0, name="roller.FoldLayoutConstants")]
    # folded before the layout conversion too: a Clip's bounds must be constants for its kernels to become
    # Relax operators that the conversion sees through (see _layout_folder)
    # cpu.legalize_passes(target) with roller's legalizations (roller.models.legalize) and
    # roller.models.fusion_barriers before FuseOps
    apart = tvm.transform.module_pass(keep_widening_broadcasts_apart, opt_level=0,
                                      name="roller.KeepWideningBroadcastsApart")
    legalize = [relax.transform.LegalizeOps(legalize_map()), relax.transform.AnnotateTIROpPattern(),
                relax.transform.FoldConstant(), apart, relax.transform.FuseOps(), relax.transform.FuseTIR()]
    passes = (fold + convert + fold + sink + fast + cpu.library_dispatch_passes(target) + legalize
              + [relax.transform.RewriteDataflowReshape(), relax.transform.DeadCodeElimination()])
    mod, _ = narrow_integer_matmuls(mod)
    if integer_convolutions:
        mod, _ = int8_products(mod)
    mod, _ = quantizers_as_arithmetic(mod)
    with target:
        return tvm.transform.Sequential(passes)(mod)


# Elementwise Relax operators folded with numpy when all their arguments are constants: the ONNX
# frontend's Clip (ReLU6) tests its constant bounds with isnan and where, 70 scalar kernels that TVM's
# FoldConstant built and ran one by one (MobileNetV2's legalization: 6.9 s).
_NUMPY_ELEMENTWISE = {"relax.isnan": np.isnan, "relax.where": np.where, "relax.add": np.add,
                      "relax.subtract": np.subtract, "relax.multiply": np.multiply, "relax.divide": np.divide,
                      "relax.maximum": np.maximum, "relax.minimum": np.minimum, "relax.negative": np.negative,
                      "relax.sqrt": np.sqrt, "relax.logical_not": np.logical_not,
                      # Gather's negative-index fix-up, where(i < 0, i + n, i): ViT's 37 ``less`` kernels
                      # cost 5 s of FoldConstant
                      "relax.less": np.less, "relax.less_equal": np.less_equal, "relax.greater": np.greater,
                      "relax.greater_equal": np.greater_equal, "relax.equal": np.equal,
                      "relax.not_equal": np.not_equal, "relax.logical_and": np.logical_and,
                      "relax.logical_or": np.logical_or}


def _extremum_kind(func) -> str | None:
    """"maximum" / "minimum" when ``func`` is a TE elementwise max / min of a tensor and a 0-d bound (how
    the ONNX frontend emits Clip: ``emit_te(topi.maximum, x, lo)``), else None."""
    import tvm
    from tvm import tirx

    if len(func.params) != 3 or len(func.params[1].shape) != 0:
        return None
    sch = tvm.s_tir.Schedule(func)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    body = sch.get(blocks[0]).body if len(blocks) == 1 else None
    if not isinstance(body, tirx.BufferStore):
        return None
    value, kinds = body.value, {tirx.Max: "maximum", tirx.Min: "minimum"}
    if type(value) not in kinds or not all(isinstance(x, tvm.ir.expr.TensorLoad) for x in (value.a, value.b)):
        return None
    return kinds[type(value)]


def _layout_folder():
    """A Relax mutator folding ``permute_dims`` / ``reshape`` of constants, and elementwise operators of
    constants (:data:`_NUMPY_ELEMENTWISE`), with numpy; and turning the ONNX frontend's Clip kernels (a
    ``call_tir`` of a TE max / min with a constant bound, :func:`_extremum_kind`) into Relax's
    ``maximum`` / ``minimum``: ConvertLayout cannot see into a ``call_tir`` and wrapped each in two
    transposes, so MobileNetV2's ReLU6 ran as 35 functions of their own instead of conv epilogues. Relax's own
    ``clip`` (HardSwish, HardSigmoid) becomes ``maximum`` / ``minimum`` too: ConvertLayout wrapped it alike
    (MobileNetV3 at batch 8: 2.8 of its 19.8 ms in 26 such functions)."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class _Fold(PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)
            self.mod = mod

        def constant(self, arg):
            if isinstance(arg, relax.Var):
                arg = self.lookup_binding(arg)
            return arg.value.numpy() if isinstance(arg, tvm.ir.expr.Constant) else None

        def extremum(self, call):
            """relax.op.maximum / minimum for a Clip kernel's call_tir, else None."""
            gv, args = call.args[0], call.args[1]
            func = self.mod[gv] if isinstance(gv, tvm.ir.GlobalVar) and gv in self.mod.functions else None
            if not isinstance(func, tvm.tirx.PrimFunc) or not isinstance(args, relax.Tuple) or len(args) != 2:
                return None
            bound = self.constant(args[1])
            kind = _extremum_kind(func) if bound is not None else None
            if kind is None:
                return None
            return getattr(relax.op, kind)(args[0], relax.const(bound, str(bound.dtype)))

        def fold_index_op(self, call, name):
            """A static shape as a tensor, and a Gather of constants (PyTorch's index arithmetic: ViT's
            class-token gather built 148 kernels in FoldConstant, 4 s), with numpy; else ``call``."""
            if name == "relax.shape_to_tensor":
                arg = call.args[0]  # a ShapeExpr, or a shape_of's var whose type holds the static shape
                dims = getattr(arg, "values", None) or getattr(getattr(arg, "ty", None), "values", None)
                if dims is None or not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
                    return call
                return relax.const(np.array([int(d) for d in dims], "int64"), "int64")
            data, index = self.constant(call.args[0]), self.constant(call.args[1])
            axis = call.attrs.axis
            if data is None or index is None or index.size and (index.min() < 0 or index.max() >= (
                    data.size if axis is None else data.shape[int(axis)])):
                return call  # (out-of-range indices keep the operator's own mode)
            out = np.take(data, index, axis=None if axis is None else int(axis))
            return relax.const(np.asarray(out, order="C"), str(data.dtype))

        def clip(self, call):
            """maximum then minimum for a Relax clip with constant bounds (the ONNX frontend's HardSwish and
            HardSigmoid), else ``call``."""
            x, lo, hi = call.args
            dtype = getattr(x.ty, "dtype", None)
            bounds = [getattr(b, "value", None) for b in (lo, hi)]
            if dtype is None or not all(isinstance(b, (int, float)) for b in bounds):
                return call
            low = relax.op.maximum(x, relax.const(np.array(bounds[0], str(dtype)), str(dtype)))
            return relax.op.minimum(low, relax.const(np.array(bounds[1], str(dtype)), str(dtype)))

        def visit_call_(self, call):
            call = super().visit_call_(call)
            name = call.op.name if isinstance(call.op, tvm.ir.Op) else ""
            if name == "relax.clip":
                return self.clip(call)
            if name == "relax.call_tir":
                op = self.extremum(call)
                return call if op is None else op
            if name in _NUMPY_ELEMENTWISE:
                args = [self.constant(a) for a in call.args]
                dtype = getattr(call.ty, "dtype", None)  # the normalized call's tensor type
                if any(a is None for a in args) or dtype is None:
                    return call
                out = np.asarray(_NUMPY_ELEMENTWISE[name](*args)).astype(str(dtype))
                return relax.const(out, str(dtype))
            if name in ("relax.shape_to_tensor", "relax.take"):
                return self.fold_index_op(call, name)
            if name not in ("relax.permute_dims", "relax.reshape"):
                return call
            data = self.constant(call.args[0])
            if data is None:
                return call
            if name == "relax.permute_dims":
                axes = call.attrs.axes
                out = np.transpose(data, None if axes is None else [int(a) for a in axes])
            else:
                dims = getattr(call.args[1], "values", None)  # a ShapeExpr
                if dims is None or not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
                    return call
                out = data.reshape([int(d) for d in dims])
            return relax.const(np.asarray(out, order="C"), str(data.dtype))

    return _Fold


# Powers by a whole constant written as products: LLVM lowers tir's pow through a scalar libm call per
# lane (GPT-2's GELU, 0.5x(1 + tanh(c(x + 0.044715 x^3))), ran 1.9 ms on 128 x 3072 values)
_POWER_BY_PRODUCTS = (2.0, 3.0, 4.0)


def _vectorizable_math(mod, _ctx):
    """Rewrites what LLVM would compute lane by lane through libm, or at a division's rate, into what
    vectorizes at the rate of a multiply-add:

    - ``relax.sigmoid(x)`` as ``1 / (1 + exp(-x))``, whose exp FastMathTransform then turns into TVM's
      fast_exp (EfficientNet-B0's SiLU epilogues made its convolutions 3-8x slower than onnxruntime's;
      fast_exp clamps its argument to +-88.4, so large |x| still give 0 and 1);
    - ``relax.power(x, c)`` for c in :data:`_POWER_BY_PRODUCTS` as ``x * x (* x ...)``;
    - ``x / c`` for a float constant c as ``x * (1 / c)`` (HardSwish's ``/ 6``: a vector division costs
      several multiply-adds' issue slots, and LLVM keeps it where 1 / c is inexact; within an ulp or two
      of the division)."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    sigmoid, power = tvm.ir.Op.get("relax.sigmoid"), tvm.ir.Op.get("relax.power")
    divide = tvm.ir.Op.get("relax.divide")

    @mutator
    class _Rewrite(PyExprMutator):
        def constant(self, arg):
            """The value of a Relax constant argument (through its binding), else None."""
            if isinstance(arg, relax.Var):
                arg = self.lookup_binding(arg)
            return arg.value.numpy() if isinstance(arg, tvm.ir.expr.Constant) else None

        def exponent(self, arg):
            value = self.constant(arg)
            if value is None or value.size != 1:
                return None
            value = float(value.reshape(()))
            return int(value) if value in _POWER_BY_PRODUCTS else None

        def reciprocal(self, arg):
            """1 / c as a Relax constant for a float constant divisor c whose reciprocal is finite."""
            value = self.constant(arg)
            if value is None or value.dtype.kind != "f" or not np.all(value != 0):
                return None
            with np.errstate(over="ignore"):
                inverse = (1.0 / value.astype(np.float64)).astype(value.dtype)
            return relax.const(inverse, str(value.dtype)) if np.all(np.isfinite(inverse)) else None

        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not isinstance(call.op, tvm.ir.Op):
                return call
            if call.op.same_as(sigmoid):
                x = call.args[0]
                one = relax.const(1.0, str(call.ty.dtype))
                return relax.op.divide(one, relax.op.add(one, relax.op.exp(relax.op.negative(x))))
            if call.op.same_as(divide) and self.constant(call.args[0]) is None:
                inverse = self.reciprocal(call.args[1])
                return call if inverse is None else relax.op.multiply(call.args[0], inverse)
            if call.op.same_as(power) and str(call.ty.dtype).startswith("float"):
                n = self.exponent(call.args[1])
                if n is None or static_dims(call.ty) is None or static_dims(call.ty) != static_dims(call.args[0].ty):
                    return call  # (a power that broadcasts x keeps its own form)
                out = call.args[0]
                for _ in range(n - 1):
                    out = relax.op.multiply(out, call.args[0])
                return out
            return call

    return mutate_functions(_Rewrite(mod), mod)


# Elementwise Relax operators a reshape commutes with (over one tensor, the other operands scalars)
_UNARY_ELEMENTWISE = ("relax.erf", "relax.tanh", "relax.exp", "relax.negative", "relax.sigmoid", "relax.sqrt",
                      "relax.rsqrt", "relax.abs", "relax.nn.relu", "relax.nn.gelu", "relax.nn.silu")
_BINARY_ELEMENTWISE = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.power",
                       "relax.maximum", "relax.minimum")


def _sink_reshapes(mod, _ctx):
    """Moves a reshape below the elementwise operators that follow it, so that the reshapes on either side
    of them meet and cancel: an exported transformer's MLP runs ``Gemm`` on [tokens, width], reshapes to
    [1, tokens, width] for GELU and back for the next ``Gemm``, and the reshape kept GELU out of the first
    matmul's epilogue (ViT-B/16: a function of its own, 98 us a call, 12 calls). An operator moves when
    its one tensor operand is a reshape and the others are scalars (``x / c``, ``x + 1``), or when both
    operands are reshapes of tensors of one shape to one shape; a reshape of a reshape becomes one reshape,
    or none where it restores its source's shape."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    unary = {tvm.ir.Op.get(n) for n in _UNARY_ELEMENTWISE}
    binary = {tvm.ir.Op.get(n) for n in _BINARY_ELEMENTWISE}
    reshape = tvm.ir.Op.get("relax.reshape")

    @mutator
    class _Sink(PyExprMutator):
        def reshaped(self, arg):
            """The source of ``arg`` when it is bound to a reshape with a static shape, else None."""
            value = self.lookup_binding(arg) if isinstance(arg, relax.Var) else arg
            if isinstance(value, relax.Call) and value.op.same_as(reshape) \
                    and static_dims(value.args[0].ty) is not None:
                return value.args[0]
            return None

        def scalar(self, arg):
            """Whether ``arg`` is a 0-d constant (it broadcasts over any shape alike, keeping it)."""
            value = self.lookup_binding(arg) if isinstance(arg, relax.Var) else arg
            return isinstance(value, tvm.ir.expr.Constant) and len(value.value.shape) == 0

        def moved(self, call, args):
            """``call``'s operator on ``args`` (the reshapes' sources), reshaped to ``call``'s shape."""
            dims = static_dims(call.ty)
            if dims is None:
                return call
            inner = self.builder_.emit(relax.Call(call.op, args, call.attrs, call.ty_args))
            return relax.op.reshape(inner, dims)

        def visit_call_(self, call):
            call = super().visit_call_(call)
            op = call.op
            if not isinstance(op, tvm.ir.Op):
                return call
            if op.same_as(reshape):
                source = self.reshaped(call.args[0])
                if source is None:
                    return call
                dims = static_dims(call.ty)
                if dims is not None and dims == static_dims(source.ty):
                    return source
                return relax.op.reshape(source, call.args[1]) if dims is not None else call
            if op in unary and len(call.args) == 1:
                source = self.reshaped(call.args[0])
                return call if source is None else self.moved(call, [source])
            if op in binary and len(call.args) == 2:
                a, b = (self.reshaped(x) for x in call.args)
                if a is not None and b is None and self.scalar(call.args[1]):
                    return self.moved(call, [a, call.args[1]])
                if b is not None and a is None and self.scalar(call.args[0]):
                    return self.moved(call, [call.args[0], b])
                if a is not None and b is not None and static_dims(a.ty) == static_dims(b.ty):
                    return self.moved(call, [a, b])
            return call

    return mutate_functions(_Sink(mod), mod)


def _fold_layout_constants(mod, _ctx):
    """Folds the weight transposes ConvertLayout inserts (and reshapes of constants) with numpy before
    legalization: TVM's FoldConstant builds and runs one unscheduled kernel per constant instead
    (ResNet-50: 7.1 s of a 25 s compile)."""

    return mutate_functions(_layout_folder()(mod), mod)


def build_module(mod, target):
    """``tvm.compile`` with the CPU pipeline's lowering and finalization passes (legalization and
    fusion were done before scheduling)."""
    import tvm
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    from roller.tir.compile import compile_for

    lower = tvm.transform.Sequential(cpu.dataflow_lower_passes(target) + cpu.finalize_passes(target))

    @tvm.transform.module_pass(opt_level=0, name="roller.LowerAndFinalize")
    def _pipeline(m, _ctx):
        with target:
            return lower(m)

    return compile_for(mod, target, relax_pipeline=_pipeline)


def random_arrays(specs: Mapping[str, tuple[tuple[int, ...], str]], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for n, (shape, dtype) in specs.items():
        if dtype == "bool":
            out[n] = rng.integers(0, 2, shape).astype(bool)
        elif np.issubdtype(np.dtype(dtype), np.floating):
            out[n] = rng.uniform(-1, 1, shape).astype(dtype)
        else:
            out[n] = rng.integers(0, 4, shape).astype(dtype)
    return out
