"""roller.tir.analysis: PrimFunc -> Expr (axes, affine accesses, flops), normalization, unsupported cases."""
import numpy as np
import pytest

import tvm
from tvm import te, tirx

from roller.tir import ops
from roller.tir.analysis import Analysis, analyze
from roller.errors import UnsupportedExpressionError
from roller.plan.expr import REDUCE, SPATIAL, fuse_axes
from roller.measure.verify import fill_sentinel
from roller.plan.rtile import default_vector_axis


def axes_of(expr):
    return [(a.name, a.extent, a.kind) for a in expr.axes]


def tensor(expr, name):
    return next(t for t in expr.tensors if t.name == name)


def run(func, arrays, out_shape, out_dtype="float32"):
    """Builds ``func`` unscheduled and runs it on ``arrays``."""
    ex = tvm.compile(func, "llvm")
    dev = tvm.cpu()
    out = tvm.runtime.tensor(fill_sentinel(np.empty(out_shape, out_dtype)), dev)
    ex["main"](*[tvm.runtime.tensor(a, dev) for a in arrays], out)
    return out.numpy()


# ------------------------------------------------------------------ the operators

@pytest.mark.parametrize("M, N, K", [(1024, 1024, 1024), (17, 1025, 1), (1, 1, 1), (13, 7, 31)])
def test_matmul(M, N, K):
    a = analyze(ops.matmul(M, N, K))
    e = a.expr
    assert isinstance(a, Analysis) and isinstance(a.func, tirx.PrimFunc)
    assert axes_of(e) == [("m", M, SPATIAL), ("n", N, SPATIAL), ("k", K, REDUCE)]
    assert [t.name for t in e.inputs] == ["A", "B"] and e.output.name == "C"
    assert tensor(e, "A").index == ((("m", 1),), (("k", 1),)) and tensor(e, "A").shape == (M, K)
    assert tensor(e, "B").index == ((("k", 1),), (("n", 1),))
    assert e.output.index == ((("m", 1),), (("n", 1),)) and e.output.dtype == "float32"
    assert e.flops_per_point == 2 and e.flops == ops.OPS["matmul"].flops({"M": M, "N": N, "K": K})
    assert e.block == "C" and e.epilogue == () and a.epilogue_block is None and a.accumulator == "C"
    # the default vector axis: n (k would gather from B, which no transposed copy fixes for a reduction)
    assert default_vector_axis(e) == "n"
    assert a.iter_vars == (("m", "v_m"), ("n", "v_n"), ("k", "v_k"))


def test_matmul_int8_accumulates_in_int32():
    e = analyze(ops.matmul(8, 16, 4, "int8")).expr
    assert e.in_dtype == "int8" and e.dtype == "int32" and e.flops_per_point == 2  # casts are not flops


@pytest.mark.parametrize("B, M, N, K", [(2, 3, 5, 7), (1, 1025, 1, 3), (12, 128, 64, 64)])
def test_batch_matmul(B, M, N, K):
    e = analyze(ops.batch_matmul(B, M, N, K)).expr
    assert axes_of(e) == [("b", B, SPATIAL), ("m", M, SPATIAL), ("n", N, SPATIAL), ("k", K, REDUCE)]
    assert tensor(e, "A").index == ((("b", 1),), (("m", 1),), (("k", 1),))
    assert tensor(e, "W").index == ((("b", 1),), (("k", 1),), (("n", 1),))
    assert e.output.shape == (B, M, N) and e.flops_per_point == 2


@pytest.mark.parametrize("stride, pad, dilation", [(1, 0, 1), (1, 1, 1), (2, 1, 1), (2, 0, 3), (3, 2, 2)])
def test_conv2d_sliding_window(stride, pad, dilation):
    shape = dict(N=2, H=17, W=13, C=3, K=5, R=3, S=2, stride=stride, pad=pad, dilation=dilation)
    a = analyze(ops.OPS["conv2d"].make(shape))
    e = a.expr
    _, oh, ow, _ = ops.OPS["conv2d"].output_shape(shape)
    assert axes_of(e) == [("n", 2, SPATIAL), ("h", oh, SPATIAL), ("w", ow, SPATIAL), ("k", 5, SPATIAL),
                          ("r", 3, REDUCE), ("s", 2, REDUCE), ("c", 3, REDUCE)]
    src = "pad_temp" if pad else "data"
    data = e.inputs[0]
    assert data.name == src and data.shape == (2, 17 + 2 * pad, 13 + 2 * pad, 3)
    assert data.index == ((("n", 1),), (("h", stride), ("r", dilation)), (("w", stride), ("s", dilation)), (("c", 1),))
    assert tensor(e, "weight").index == ((("r", 1),), (("s", 1),), (("c", 1),), (("k", 1),))
    assert e.output.name == "conv" and e.output.shape == (2, oh, ow, 5)
    assert e.flops == ops.OPS["conv2d"].flops(shape)
    # the padding stays its own block; without padding there is none
    assert a.producer_blocks == (("pad_temp",) if pad else ())
    assert e.staged == (("pad_temp",) if pad else ())  # the model charges the stage's copy per top tile
    assert e.inlinable == e.staged  # zero padding, no gather: a plan may read the tensor in place instead
    # the padding's widths, before and after each dimension of the padded tensor
    assert e.pad_widths == ((("pad_temp", ((0, 0), (pad, pad), (pad, pad), (0, 0))),) if pad else ())
    blocks = [b for b in ("pad_temp", "conv") if b in a.func.script()]
    assert blocks == (["pad_temp", "conv"] if pad else ["conv"])
    # the sliding-window region of an output tile: (t-1)*stride + (r-1)*dilation + 1
    assert data.region({"n": 1, "h": 4, "w": 2, "k": 1, "r": 3, "s": 2, "c": 3})[1:3] == \
        (min(3 * stride + 2 * dilation + 1, 17 + 2 * pad), min(stride + dilation + 1, 13 + 2 * pad))


@pytest.mark.parametrize("groups, repeats", [(32, (("group_rep", 4),)), (8, ()), (1, ())])
def test_grouped_conv_names_its_repeating_stage(groups, repeats):
    """A group of fewer than ops.GROUP_REPLICATE_BELOW output channels reads a stage that copies each input
    channel for the group's K/groups channels: the Expr says so (the model charges its read at the input's
    size); wider groups and plain convolutions have none (a padding stage is a plain copy)."""
    shape = dict(N=1, H=6, W=5, C=128, K=128, R=3, S=3, pad=1, groups=groups)
    e = analyze(ops.OPS["conv2d"].make(shape)).expr
    assert e.repeats == repeats
    assert e.repeat(e.inputs[0].name) == (4 if repeats else 1)


@pytest.mark.parametrize("M, N", [(7, 13), (1, 1025), (1024, 1)])
def test_reduce_sum(M, N):
    e = analyze(ops.reduce_sum(M, N)).expr
    assert axes_of(e) == [("m", M, SPATIAL), ("n", N, REDUCE)]
    assert [t.name for t in e.inputs] == ["A"]  # the accumulator B is the output, not an input
    assert e.output.index == ((("m", 1),),) and e.flops_per_point == 1
    assert e.flops == ops.OPS["reduce_sum"].flops({"M": M, "N": N})


@pytest.mark.parametrize("M, N", [(17, 33), (1, 1), (1025, 3)])
def test_add_relu_inlines_one_stage(M, N):
    a = analyze(ops.add_relu(M, N))
    e = a.expr
    assert axes_of(e) == [("m", M, SPATIAL), ("n", N, SPATIAL)]
    assert [t.name for t in e.inputs] == ["A", "B"] and e.output.name == "C"
    assert e.flops_per_point == 2 and e.epilogue == ("T_add",) and a.inlined == ("T_add",)
    assert e.block == "C" and "T_add" not in a.func.script()


def test_a_reductions_epilogue_counts_its_operations():
    """A matmul's fused epilogue (scale, bias, ReLU: 3 operations a point) is counted apart from the
    reduction's flops, and the model charges it (roller.plan.overheads.epilogue_seconds)."""
    from roller.device.load import load_device
    from roller.plan.choices import estimated, plan_choices
    from roller.plan.overheads import epilogue_seconds

    a, b = te.placeholder((64, 32), name="A"), te.placeholder((32, 48), name="B")
    k = te.reduce_axis((0, 32), "k")
    c = te.compute((64, 48), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    d = te.compute((64, 48), lambda i, j: te.max(c[i, j] * 2.0 + 1.0, 0.0), name="D")
    e = analyze(te.create_prim_func([a, b, d])).expr
    assert e.flops_per_point == 2 and e.epilogue_ops == 3
    bare = analyze(te.create_prim_func([a, b, c])).expr
    assert bare.epilogue_ops == 0
    dev = load_device("x86-avx512")
    tiles = [{"i": 4, "j": 16, "k": 32}, {"i": 16, "j": 48, "k": 32}, {"i": 32, "j": 48, "k": 32}]
    with_epilogue = estimated(e, plan_choices(e, tiles, dev, "j"), dev)[1]
    without = estimated(bare, plan_choices(bare, tiles, dev, "j"), dev)[1]
    assert epilogue_seconds(e, dev) > 0 and with_epilogue.seconds > without.seconds
    assert with_epilogue.compute_seconds == without.compute_seconds  # charged apart: not under memory time


def test_a_repeated_subexpression_counts_once():
    """Flops as the compiler computes them: ``t = a * 2`` written three times is one multiplication
    (TVM's fast exp repeats its clamp a dozen times); distinct operations on the same operands all count."""
    a = te.placeholder((8, 16), name="a")
    twice = te.compute((8, 16), lambda i, j: a[i, j] * 2.0 + (a[i, j] * 2.0) * (a[i, j] * 2.0), name="c")
    assert analyze(te.create_prim_func([a, twice])).expr.flops_per_point == 3  # *, *, + (5 as written)
    other = te.compute((8, 16), lambda i, j: a[i, j] * 2.0 + a[i, j] * 3.0 + a[i, j] * 2.0, name="d")
    assert analyze(te.create_prim_func([a, other])).expr.flops_per_point == 4  # *2, *3, +, + (*2 once)


def test_fuse_axes_on_analysis():
    fused = fuse_axes(analyze(ops.add_relu(17, 33)).expr)
    assert [(a.extent, a.parts) for a in fused.axes] == [(561, (("m", 17), ("n", 33)))]
    assert fused.output.shape == (561,)
    mm = analyze(ops.matmul(17, 33, 5)).expr
    assert fuse_axes(mm).axes == mm.axes  # m and n never sit side by side in A and B


def test_every_op_flops_match_spec():
    for name, spec in ops.OPS.items():
        shape = {k: 3 for k in spec.shape_keys}
        e = analyze(spec.make(shape), name=name).expr
        assert e.name == name and e.flops == spec.flops(shape), name


# ------------------------------------------------------------------ normalization

def matmul_bias_relu(M, N, K):
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    bias = te.placeholder((N,), name="bias")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    D = te.compute((M, N), lambda i, j: C[i, j] + bias[j], name="D")
    E = te.compute((M, N), lambda i, j: te.max(D[i, j], tirx.const(0, "float32")), name="E")
    return [A, B, bias, E]


def test_fused_epilogue_matmul_bias_relu():
    a = analyze(matmul_bias_relu(9, 17, 5))  # a list of TE tensors is accepted too
    e = a.expr
    assert axes_of(e) == [("i", 9, SPATIAL), ("j", 17, SPATIAL), ("k", 5, REDUCE)]
    assert [t.name for t in e.inputs] == ["A", "B", "bias"]
    assert tensor(e, "bias").index == ((("j", 1),),)
    assert e.output.name == "E" and e.output.index == ((("i", 1),), (("j", 1),))
    assert e.flops_per_point == 2 and e.block == "C"
    # TVM cannot inline into a reduction: bias and ReLU merge into one epilogue block after C
    assert a.epilogue_block == "E" and a.accumulator == "C" and a.inlined == ("D",) and e.epilogue == ("D", "E")
    script = a.func.script()
    assert 'sblock("D")' not in script and "T.max(C[v_i, v_j] + bias[v_j]" in script
    # the normalized function computes the same thing
    rng = np.random.default_rng(0)
    arrays = [(rng.integers(-8, 9, size=s) / 8).astype("float32") for s in [(9, 5), (5, 17), (17,)]]
    out = run(a.func, arrays, (9, 17))
    np.testing.assert_array_equal(out, np.maximum(arrays[0] @ arrays[1] + arrays[2], 0))


def test_epilogue_over_a_merged_output_index():
    """A grouped convolution iterates g and j but writes channel g * 8 + j (roller.tir.ops.grouped_conv_func,
    also what the model frontend's legalization emits); its bias + ReLU epilogue reads that buffer plainly at
    channel k. Each epilogue axis stands for the index the main block writes: the bias is read at g * 8 + j
    and the output keeps the main block's layout."""
    from tvm import s_tir

    N, H, C, G = 1, 6, 16, 2
    cg = C // G
    data = te.placeholder((N, H, H, C), name="data")
    weight = te.placeholder((3, 3, cg, C), name="weight")
    bias = te.placeholder((C,), name="bias")
    r, s, c = te.reduce_axis((0, 3), name="r"), te.reduce_axis((0, 3), name="s"), te.reduce_axis((0, cg), name="c")
    conv = te.compute((N, H - 2, H - 2, G, cg), lambda n, h, w, g, j: te.sum(
        data[n, h + r, w + s, g * cg + c] * weight[r, s, c, g * cg + j], axis=[r, s, c]), name="conv")
    out = te.compute((N, H - 2, H - 2, C), lambda n, h, w, k: te.max(
        conv[n, h, w, k // cg, k % cg] + bias[k], tirx.const(0, "float32")), name="out")
    sch = s_tir.Schedule(te.create_prim_func([data, weight, bias, out]))
    sch.transform_layout(sch.get_sblock("conv"), ("write", 0), lambda n, h, w, g, j: (n, h, w, g * cg + j))
    a = analyze(sch.mod["main"])
    e = a.expr
    assert a.epilogue_block == "out" and e.block == "conv"
    assert tensor(e, "bias").index == ((("g", 8), ("j", 1)),)
    assert e.output.name == "out" and e.output.index[3] == (("g", 8), ("j", 1))
    rng = np.random.default_rng(0)
    arrays = [(rng.integers(-8, 9, size=sh) / 8).astype("float32") for sh in [(N, H, H, C), (3, 3, cg, C), (C,)]]
    got = run(a.func, arrays, (N, H - 2, H - 2, C))
    x, wt, b = arrays
    ref = np.zeros((N, H - 2, H - 2, C))
    for k in range(C):
        g = k // cg
        for dr in range(3):
            for ds in range(3):
                ref[..., k] += x[:, dr:dr + H - 2, ds:ds + H - 2, g * cg:(g + 1) * cg] @ wt[dr, ds, :, k]
    np.testing.assert_allclose(got, np.maximum(ref + b, 0), rtol=1e-6, atol=1e-6)


def test_producers_inlined_into_reduction():
    A = te.placeholder((8, 6), name="A")
    Bt = te.placeholder((5, 6), "float16", name="Bt")
    As = te.compute((8, 6), lambda i, j: A[i, j] * 2.0, name="A_scaled")
    Bc = te.compute((6, 5), lambda k, j: Bt[j, k].astype("float32"), name="B_cast")
    k = te.reduce_axis((0, 6), name="k")
    C = te.compute((8, 5), lambda i, j: te.sum(As[i, k] * Bc[k, j], axis=k), name="C")
    D = te.compute((8, 5), lambda i, j: C[i, j].astype("float16"), name="D")
    a = analyze([A, Bt, D])
    e = a.expr
    assert a.inlined == ("A_scaled", "B_cast") and a.epilogue_block == "D"
    assert [t.name for t in e.inputs] == ["A", "Bt"]
    assert tensor(e, "Bt").index == ((("j", 1),), (("k", 1),)) and tensor(e, "Bt").dtype == "float16"
    assert e.output.dtype == "float16" and e.flops_per_point == 3  # the inlined scale counts
    rng = np.random.default_rng(1)
    arrays = [(rng.integers(-8, 9, size=s) / 8).astype(d) for s, d in [((8, 6), "float32"), ((5, 6), "float16")]]
    out = run(a.func, arrays, (8, 5), "float16")
    ref = (2.0 * arrays[0].astype(np.float64)) @ arrays[1].astype(np.float64).T
    np.testing.assert_array_equal(out, ref.astype(np.float16))


def test_topi_conv_bias_relu_keeps_padding_and_epilogue():
    from tvm import topi

    data = te.placeholder((1, 14, 14, 16), name="data")
    w = te.placeholder((3, 3, 16, 32), name="w")
    b = te.placeholder((32,), name="b")
    y = topi.nn.relu(topi.add(topi.nn.conv2d_nhwc(data, w, 1, 1, 1), b))
    a = analyze(tvm.IRModule({"fused_conv": te.create_prim_func([data, w, b, y])}))
    assert a.producer_blocks == ("pad_temp",) and a.epilogue_block is not None
    assert [t.name for t in a.expr.inputs] == ["pad_temp", "w", "b"]
    assert [x.kind for x in a.expr.axes].count(REDUCE) == 3 and a.expr.flops_per_point == 2


@pytest.mark.build
@pytest.mark.parametrize("name, shape", [
    ("add_relu", {"M": 17, "N": 33}),
    ("conv2d", {"N": 1, "H": 7, "W": 6, "C": 3, "K": 4, "R": 3, "S": 3, "stride": 2, "pad": 1}),
    ("matmul", {"M": 5, "N": 7, "K": 3}),
])
def test_normalized_function_matches_reference(name, shape):
    spec = ops.OPS[name]
    arrays = spec.inputs(shape)
    out = run(analyze(spec.make(shape)).func, arrays, spec.output_shape(shape))
    np.testing.assert_array_equal(out, spec.reference(arrays, shape))


# ------------------------------------------------------------------ unsupported

def expect_unsupported(func, *fragments):
    with pytest.raises(UnsupportedExpressionError) as err:
        analyze(func)
    for f in fragments:
        assert f in str(err.value), str(err.value)


def test_softmax_two_reductions():
    A = te.placeholder((8, 6), name="A")
    k = te.reduce_axis((0, 6), name="k")
    mx = te.compute((8,), lambda i: te.max(A[i, k], axis=k), name="mx")
    ex = te.compute((8, 6), lambda i, j: te.exp(A[i, j] - mx[i]), name="ex")
    k2 = te.reduce_axis((0, 6), name="k2")
    sm = te.compute((8,), lambda i: te.sum(ex[i, k2], axis=k2), name="sm")
    out = te.compute((8, 6), lambda i, j: ex[i, j] / sm[i], name="out")
    expect_unsupported([A, out], "2 reduction blocks (mx, sm)", "one PrimFunc per reduction")


X = te.placeholder((64,), name="X")


@pytest.mark.parametrize("label, index, fragment", [
    ("square", lambda i: i * i, "v_i * v_i is not affine"),
    ("div", lambda i: i // 2, "v_i // 2 is not affine"),
    ("mod", lambda i: i % 3, "is not affine"),
])
def test_non_affine_index(label, index, fragment):
    Y = te.compute((8,), lambda i: X[index(i)], name="Y")
    expect_unsupported([X, Y], "block 'Y'", "buffer X dimension 0", fragment, "rewrite the operator")


def test_index_trivial_under_the_axis_range_is_simplified():
    """What inlined broadcasts and reshapes leave, (i + 0) % 8 and i // 8 over i < 8, is plainly i / 0."""
    X2 = te.placeholder((8, 4), name="X2")
    Y = te.compute((8, 4), lambda i, j: X2[(i + j * 0) % 8, j + i // 8] * 2.0, name="Y")
    found = analyze([X2, Y])
    assert tensor(found.expr, "X2").index == ((("i", 1),), (("j", 1),))
    x = np.random.default_rng(0).normal(size=(8, 4)).astype("float32")
    np.testing.assert_allclose(run(found.func, [x], (8, 4)), x * 2)


def test_gather():
    idx = te.placeholder((8,), "int32", name="idx")
    Y = te.compute((8,), lambda i: X[idx[i]], name="Y")
    expect_unsupported([X, idx, Y], "buffer X", "depends on loaded data (a gather)")


def test_symbolic_shape():
    n = te.var("n")
    S = te.placeholder((n, 4), name="S")
    T = te.compute((n, 4), lambda i, j: S[i, j] + 1.0, name="T")
    expect_unsupported([S, T], "buffer S has a symbolic shape", "specialize")


def test_transposed_epilogue():
    A = te.placeholder((8, 6), name="A")
    B = te.placeholder((6, 8), name="B")
    k = te.reduce_axis((0, 6), name="k")
    C = te.compute((8, 8), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    T = te.compute((8, 8), lambda i, j: C[j, i], name="T")
    expect_unsupported([A, B, T], "block 'T'", "elementwise epilogues only")


def test_same_buffer_two_patterns():
    A = te.placeholder((8, 6), name="A")
    k = te.reduce_axis((0, 6), name="k")
    C = te.compute((8, 8), lambda i, j: te.sum(A[i, k] * A[j, k], axis=k), name="C")
    expect_unsupported([A, C], "buffer A is read with two different access patterns")


def test_bad_inputs():
    expect_unsupported(3, "cannot analyse a int")
    f = ops.add_relu(4, 4)
    expect_unsupported(tvm.IRModule({"a": f, "b": f}), "holds 2 PrimFuncs (a, b)")
    A = te.placeholder((4,), name="A")
    Z = te.placeholder((4,), name="Z")
    two = [A, Z, te.compute((4,), lambda i: A[i] * 3.0, name="Y"), te.compute((4,), lambda i: Z[i] + 1.0, name="Y2")]
    expect_unsupported(two, "2 blocks write function outputs (Y, Y2)")


def test_opaque_call():
    Y = te.compute((8,), lambda i: tirx.call_extern("float32", "my_fn", X[i]), name="Y")
    expect_unsupported([X, Y], "block 'Y'", "opaque function")


def test_relax_fused_functions():
    """PrimFuncs as Relax's pipeline fuses them (the inference-server path)."""
    from tvm import relax
    from tvm.script import relax as R

    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((32, 64), "float32"))
    w = relax.Var("w", R.Tensor((64, 48), "float32"))
    b = relax.Var("b", R.Tensor((48,), "float32"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.add(relax.op.matmul(x, w), b)))
            out = bb.emit_output(relax.Tuple([y, bb.emit(relax.op.nn.softmax(y))]))
        bb.emit_func_output(out)
    mod = relax.get_pipeline("zero")(bb.get())
    prims = {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}
    a = analyze(prims["fused_matmul_add_relu"])
    assert [(x.extent, x.kind) for x in a.expr.axes] == [(32, SPATIAL), (48, SPATIAL), (64, REDUCE)]
    assert [t.name for t in a.expr.inputs] == ["x", "w", "b"] and a.epilogue_block is not None
    with pytest.raises(UnsupportedExpressionError, match="2 reduction blocks"):
        analyze(prims["softmax"])
    with pytest.raises(UnsupportedExpressionError, match="function 'softmax'"):
        analyze(tvm.IRModule({"softmax": prims["softmax"]}))


def test_no_block_and_opaque_block():
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def empty(A: T.Buffer((4,), "float32")):
        T.evaluate(0)

    @T.prim_func(s_tir=True)
    def opaque(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "float32")):
        with T.sblock("outer"):
            for i in range(4):
                B[i] = A[i] + T.float32(1)

    expect_unsupported(empty, "function 'empty'", "not a root block")
    expect_unsupported(opaque, "no computation block under the root block 'outer'")


def test_stencil_reads_merge_with_offsets_dropped():
    Y = te.compute((62,), lambda i: X[i] + X[i + 1] + X[i + 2], name="Y")
    e = analyze([X, Y]).expr
    assert [(t.name, t.index) for t in e.inputs] == [("X", ((("i", 1),),))] and e.flops_per_point == 2


def test_duplicate_iter_var_names_are_made_unique():
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def dup(A: T.Buffer((4, 6), "float32"), B: T.Buffer((4, 6), "float32")):
        for i, j in T.grid(4, 6):
            with T.sblock("B"):
                x = T.axis.spatial(4, i)
                v_x = T.axis.spatial(6, j)
                B[x, v_x] = A[x, v_x] * T.float32(2)

    a = analyze(dup)  # "v_x" loses its prefix and collides with "x"
    assert axes_of(a.expr) == [("x", 4, SPATIAL), ("x_1", 6, SPATIAL)]
    assert a.iter_vars == (("x", "x"), ("x_1", "v_x"))
    assert a.expr.output.index == ((("x", 1),), (("x_1", 1),))


def test_int64_indices_are_narrowed_to_int32():
    """Relax legalizes with int64 shapes; the analysis hands code generation the function in int32
    indices (with int64 ones LLVM kept a padded tile's tail predicates inside its vector loops: 25x
    slower), but leaves a function that reads int64 data (a gather's indices) as it is."""
    import tvm
    from tvm import te

    from roller.tir.analysis import analyze
    from roller.tir.normalize import _narrow_indices

    i64 = lambda *v: tuple(tvm.tirx.IntImm("int64", x) for x in v)  # noqa: E731
    a, b = te.placeholder(i64(12, 197, 64), "float32", "a"), te.placeholder(i64(12, 64, 197), "float32", "b")
    k = te.reduce_axis(i64(0, 64), "k")
    c = te.compute(i64(12, 197, 197), lambda i, m, n: te.sum(a[i, m, k] * b[i, k, n], axis=k), "matmul")
    func = analyze(te.create_prim_func([a, b, c])).func
    assert all(str(d.ty) == "int32" for buf in func.params for d in buf.shape), func.params
    table, idx = te.placeholder(i64(4, 8), "float32", "t"), te.placeholder(i64(3), "int64", "idx")
    g = te.compute(i64(3, 8), lambda i, j: table[idx[i], j] * 2.0, "gather")
    kept = te.create_prim_func([table, idx, g])
    assert _narrow_indices(kept).same_as(kept)
