"""roller.models.qdq's Relax rewrites, each against the module it rewrites, run by TVM's default build: the
integer convolution of a QDQ pair, quantizers as plain arithmetic (exactly TVM's legalization), and the
transposes around a pad cancelled after ConvertLayout."""
from __future__ import annotations

import numpy as np
import pytest

from roller.models.qdq import int8_products, pads_in_the_permuted_layout, quantizers_as_arithmetic


def _run(mod, *args):
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    return out.numpy()


def _ops(mod) -> list[str]:
    """The operators main calls, in order."""
    from tvm import relax

    names = []
    relax.analysis.post_order_visit(mod["main"], lambda e: names.append(e.op.name) if isinstance(e, relax.Call)
                                    and hasattr(e.op, "name") else None)
    return names


def _module(build, *params):
    """A module whose main takes ``params`` ((name, shape, dtype)) and returns ``build(bb, *vars)``."""
    from tvm import relax

    bb = relax.BlockBuilder()
    xs = [relax.Var(n, relax.TensorType(s, d)) for n, s, d in params]
    with bb.function("main", xs):
        with bb.dataflow():
            out = bb.emit_output(build(bb, *xs))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("axis_values", [False, True])
def test_quantizers_as_arithmetic_are_tvms_legalization_exactly(axis_values):
    """quantize then dequantize with constant parameters (one, or one per channel), rewritten into round,
    clip and casts, the dequantize on quantize's float value: bit for bit TVM's legalization, on values on
    and beside the rounding boundaries and clipped both ways."""
    import tvm
    from tvm import relax

    rng = np.random.default_rng(0)
    c = 6
    scale = rng.uniform(0.01, 0.05, c).astype(np.float32) if axis_values else np.float32(0.02)
    zero = rng.integers(0, 255, c).astype(np.uint8) if axis_values else np.uint8(131)
    x = rng.normal(0, 3, (2, c, 5, 7)).astype(np.float32)
    x.reshape(-1)[:40] = ((np.arange(40) - 20 + 0.5) * 0.02).astype(np.float32)  # half steps: ties to round
    x.reshape(-1)[40:44] = [1e6, -1e6, 0.0, -0.0]  # clipped both ways

    def build(bb, v):
        q = bb.emit(relax.op.quantize(v, relax.const(scale), relax.const(zero), axis=1, out_dtype="uint8"))
        d = bb.emit(relax.op.dequantize(q, relax.const(scale), relax.const(zero), axis=1, out_dtype="float32"))
        return relax.Tuple([q, d])

    mod = _module(build, ("x", x.shape, "float32"))
    rewritten, count = quantizers_as_arithmetic(mod)
    assert count == 2 and not {"relax.quantize", "relax.dequantize"} & set(_ops(rewritten))
    # the dequantize reads quantize's float value, not its uint8 cast back: one cast (to the uint8 output)
    assert _ops(rewritten).count("relax.astype") == 1, _ops(rewritten)

    def run(m):
        vm = relax.VirtualMachine(tvm.compile(m, "llvm"), tvm.cpu())
        return [o.numpy() for o in vm["main"](tvm.runtime.tensor(x))]

    (q0, d0), (q1, d1) = run(mod), run(rewritten)
    assert q1.dtype == np.uint8
    np.testing.assert_array_equal(q1, q0)
    np.testing.assert_array_equal(d1, d0)


def test_a_dequantized_int32_bias_folds_to_a_constant():
    """A QDQ graph's biases are int32 constants dequantized per channel: folded with numpy here, exactly TVM's
    arithmetic (left to FoldConstant, EfficientNet-B0's 23 took 6.4 of its 10.8 s of legalization)."""
    from tvm import relax

    bias = np.array([-70000, 3, 0, 123456], np.int32)
    scale = np.array([1e-4, 0.5, 2.0, 3e-3], np.float32)

    def build(bb, v):
        b = bb.emit(relax.op.dequantize(relax.const(bias), relax.const(scale), relax.const(np.int32(0)), axis=0))
        return relax.op.add(v, b)

    mod = _module(build, ("x", (2, 4), "float32"))
    rewritten, count = quantizers_as_arithmetic(mod)
    assert count == 1 and "relax.dequantize" not in _ops(rewritten)
    x = np.zeros((2, 4), np.float32)
    np.testing.assert_array_equal(_run(rewritten, x), _run(mod, x))


def test_a_quantizer_with_a_computed_scale_is_left_alone():
    from tvm import relax

    def build(bb, v, s):
        return relax.op.quantize(v, s, relax.const(np.uint8(3)), axis=0, out_dtype="uint8")

    mod = _module(build, ("x", (4,), "float32"), ("s", (), "float32"))
    assert quantizers_as_arithmetic(mod)[1] == 0


@pytest.mark.parametrize("zero,padding,channels", [(0, 1, 8), (117, 1, 8), (117, 0, 8), (0, 1, 3), (117, 1, 3)])
def test_int8_convolution_of_a_qdq_pair(zero, padding, channels):
    """conv(dequantize(x), dequantize(w)) as an int32 convolution of the 8-bit tensors, rescaled: the result
    within float rounding of the float convolution, padded with the zero point where it is not 0, and
    input channels padded to whole dot steps (3 to 4)."""
    from tvm import relax

    rng = np.random.default_rng(zero + padding + channels)
    x = rng.integers(0, 256, (1, channels, 9, 9)).astype(np.uint8)
    w = rng.integers(-127, 128, (16, channels, 3, 3)).astype(np.int8)
    sw = rng.uniform(0.001, 0.01, 16).astype(np.float32)  # one scale per output channel (axis 0)

    def build(bb, v):
        xd = bb.emit(relax.op.dequantize(v, relax.const(np.float32(0.03)), relax.const(np.uint8(zero)), axis=1))
        wd = bb.emit(relax.op.dequantize(relax.const(w), relax.const(sw), relax.const(np.int8(0)), axis=0))
        return relax.op.nn.conv2d(xd, wd, padding=padding)

    mod = _module(build, ("x", x.shape, "uint8"))
    rewritten, count = int8_products(mod)
    assert count == 1
    ops = _ops(rewritten)
    assert "relax.dequantize" not in ops and ("relax.nn.pad" in ops) == bool(zero and padding or channels % 4)
    conv = next(b.value for b in rewritten["main"].body.blocks[0].bindings
                if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.nn.conv2d")
    assert [str(a.ty.dtype) for a in conv.args] == ["uint8", "int8"] and str(conv.ty.dtype) == "int32"
    assert conv.args[1].ty.shape[1] == 4 * -(-channels // 4)
    want, got = _run(mod, x), _run(rewritten, x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("zero,transposed,per_column", [(0, True, True), (117, True, False), (117, False, True)])
def test_int8_matmul_of_a_qdq_pair(zero, transposed, per_column):
    """matmul(dequantize(x), dequantize(w)) (a Gemm's weight through its transpose, or a MatMul's as
    stored) as an int32 matmul of the 8-bit tensors, the zero point's column sums taken off, rescaled:
    within float rounding of the float matmul."""
    from tvm import relax

    rng = np.random.default_rng(zero + transposed)
    x = rng.integers(0, 256, (3, 64)).astype(np.uint8)
    w = rng.integers(-127, 128, (40, 64) if transposed else (64, 40)).astype(np.int8)
    sw = rng.uniform(0.001, 0.01, 40 if per_column else 1).astype(np.float32)

    def build(bb, v):
        xd = bb.emit(relax.op.dequantize(v, relax.const(np.float32(0.03)), relax.const(np.uint8(zero)), axis=1))
        wd = bb.emit(relax.op.dequantize(relax.const(w), relax.const(sw if per_column else sw[0]),
                                         relax.const(np.int8(0)), axis=0 if transposed else 1))
        return relax.op.matmul(xd, bb.emit(relax.op.permute_dims(wd, [1, 0])) if transposed else wd)

    mod = _module(build, ("x", x.shape, "uint8"))
    rewritten, count = int8_products(mod)
    assert count == 1
    mm = next(b.value for b in rewritten["main"].body.blocks[0].bindings
              if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.matmul")
    assert [str(a.ty.dtype) for a in mm.args] == ["uint8", "int8"] and str(mm.ty.dtype) == "int32"
    want, got = _run(mod, x), _run(rewritten, x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_float_matmuls_are_left_alone():
    """A float matmul (no dequantize), its weight through a transpose without axes (reversed, as Dynamo's
    graphs write it), passes through unchanged: the rewrite looks at the weight only behind a dequantize."""
    from tvm import relax

    w = np.random.default_rng(3).standard_normal((40, 64)).astype(np.float32)

    def build(bb, v):
        return relax.op.matmul(v, bb.emit(relax.op.permute_dims(relax.const(w))))

    mod = _module(build, ("x", (3, 64), "float32"))
    assert int8_products(mod)[1] == 0


def test_pads_join_the_permuted_layout():
    """After ConvertLayout a pad (no layout rule) sits between transposes to and from NCHW: the pass moves
    the transpose above it and the two transposes cancel, the result unchanged."""
    from tvm import relax

    x = np.random.default_rng(1).integers(0, 256, (1, 8, 6, 6)).astype(np.uint8)
    w = np.random.default_rng(2).integers(-5, 6, (8, 8, 3, 3)).astype(np.int8)

    def build(bb, v):
        c0 = bb.emit(relax.op.nn.conv2d(v, relax.const(w), out_dtype="int32"))
        low = bb.emit(relax.op.maximum(c0, relax.const(np.int32(0))))
        q = bb.emit(relax.op.astype(relax.op.minimum(low, relax.const(np.int32(255))), "uint8"))
        p = bb.emit(relax.op.nn.pad(q, [0, 0, 0, 0, 1, 1, 2, 0], pad_value=7.0))
        return relax.op.nn.conv2d(p, relax.const(w), out_dtype="int32")

    mod = _module(build, ("x", x.shape, "uint8"))
    converted = relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "HWIO"]})(mod)
    moved = pads_in_the_permuted_layout(converted)
    permutes = lambda m: [n for n in _ops(m) if n == "relax.permute_dims"]  # noqa: E731
    assert len(permutes(moved)) == len(permutes(converted)) - 2
    pad = next(b.value for b in moved["main"].body.blocks[0].bindings
               if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.nn.pad")
    assert [int(p) for p in pad.attrs.pad_width] == [0, 0, 1, 1, 2, 0, 0, 0]  # NHWC
    np.testing.assert_array_equal(_run(moved, x), _run(mod, x))
