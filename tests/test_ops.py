"""roller.tir.ops: shape parsing/validation, numpy references, and the unscheduled PrimFuncs against them."""
import itertools
import math

import numpy as np
import pytest

from roller.tir import ops
from roller.errors import InvalidShapeError
from roller.measure.verify import fill_sentinel


def run_unscheduled(spec, shape, dtype="float32", seed=0):
    """Builds the op's unscheduled PrimFunc with TVM, runs it, returns (output, reference)."""
    import tvm

    func = spec.make(shape, dtype)
    ex = tvm.compile(func, "llvm")
    arrays = spec.inputs(shape, dtype, np.random.default_rng(seed))
    dev = tvm.cpu()
    out = tvm.runtime.tensor(fill_sentinel(np.empty(spec.output_shape(shape), spec.out_dtype(dtype))), dev)
    ex["main"](*[tvm.runtime.tensor(a, dev) for a in arrays], out)
    return out.numpy(), spec.reference(arrays, shape)


# ------------------------------------------------------------------ parsing and validation

def test_parse_shape_basic_and_defaults():
    assert ops.parse_shape("matmul", "M=1024,N=1024,K=1024") == {"M": 1024, "N": 1024, "K": 1024}
    assert ops.parse_shape("matmul", " m = 3 , n=5,K=7 ,") == {"M": 3, "N": 5, "K": 7}
    conv = ops.parse_shape("conv2d", "N=1,H=56,W=56,C=64,K=64,R=3,S=3,pad=1")
    assert conv == {"N": 1, "H": 56, "W": 56, "C": 64, "K": 64, "R": 3, "S": 3, "stride": 1, "pad": 1, "dilation": 1,
                    "groups": 1}
    assert ops.parse_shape("depthwise_conv2d", "N=1,H=7,W=7,C=5,R=3,S=3") == {
        "N": 1, "H": 7, "W": 7, "C": 5, "R": 3, "S": 3, "stride": 1, "pad": 0, "dilation": 1}
    assert ops.parse_shape("pool2d", "n=2,h=7,w=7,c=5,r=2,s=2,stride=2") == {
        "N": 2, "H": 7, "W": 7, "C": 5, "R": 2, "S": 2, "stride": 2, "pad": 0}
    assert ops.parse_shape("batch_matmul", "B=2,M=3,N=4,K=5")["B"] == 2
    assert ops.parse_shape("reduce_sum", "M=1,N=1") == {"M": 1, "N": 1}
    assert ops.parse_shape("add_relu", "M=17,N=33") == {"M": 17, "N": 33}


@pytest.mark.parametrize("op, text, fragment", [
    ("gemm", "M=1", "unknown operator 'gemm': use one of matmul, batch_matmul, conv2d"),
    ("matmul", "M=4,N=4", "missing shape key(s) K"),
    ("matmul", "M=4,N=4,K=4,Q=1", "unknown shape key(s) Q"),
    ("matmul", "M=4,N=4,K=1.5", "K='1.5' is not an integer"),
    ("matmul", "M=4,N=four,K=4", "N='four' is not an integer"),
    ("matmul", "M=0,N=4,K=4", "M=0 must be >= 1"),
    ("matmul", "M=4,N=-3,K=4", "N=-3 must be >= 1"),
    ("matmul", "M=4,M=5,N=4,K=4", "key M is given twice"),
    ("matmul", "M=4,N,K=4", "cannot parse 'N'"),
    ("matmul", "M=4;N=4,K=4", "M='4;N=4' is not an integer"),
    ("matmul", "M=4,N=4,K=3000000000", "K=3000000000 is too large"),
    ("matmul", "M=65536,N=65536,K=1", "more than 2147483647"),
    ("batch_matmul", "B=64,M=16384,N=16384,K=1", "more than 2147483647"),
    ("matmul", "M=40000,N=40000,K=40000", "GiB together, more than 16 GiB"),
    ("conv2d", "N=1,H=4,W=4,C=3,K=8,R=7,S=3", "kernel R=7, S=3 (dilation 1) does not fit"),
    ("conv2d", "N=1,H=8,W=8,C=3,K=8,R=3,S=3,dilation=4", "does not fit the padded input"),
    ("conv2d", "N=1,H=8,W=8,C=3,K=8,R=3,S=3,stride=0", "stride=0 must be >= 1"),
    ("conv2d", "N=1,H=8,W=8,C=3,K=8,R=3,S=3,pad=-1", "pad=-1 must be >= 0"),
    ("conv2d", "N=1,H=8,W=8,C=6,K=8,R=3,S=3,groups=4", "C=6 is not divisible by groups=4"),
    ("conv2d", "N=1,H=8,W=8,C=6,K=8,R=3,S=3,groups=3", "K=8 is not divisible by groups=3"),
    ("conv2d", "N=1,H=8,W=8,C=6,K=6,R=3,S=3,groups=0", "groups=0 must be >= 1"),
    ("depthwise_conv2d", "N=1,H=8,W=8,C=3,R=3,S=3,K=3", "unknown shape key(s) K"),
    ("depthwise_conv2d", "N=1,H=2,W=8,C=3,R=3,S=3", "depthwise_conv2d: the kernel R=3, S=3 (dilation 1) does not fit"),
    ("depthwise_conv2d", "N=1,H=8,W=8,C=3,R=3,S=3,dilation=0", "dilation=0 must be >= 1"),
    ("pool2d", "N=1,H=8,W=8,C=3,R=2,S=2,dilation=2", "unknown shape key(s) dilation"),
    ("pool2d", "N=1,H=8,W=8,C=3,R=9,S=2", "pool2d: the kernel R=9, S=2 (dilation 1) does not fit"),
    ("pool2d", "N=1,H=8,W=8,C=3,R=3,S=3,pad=2", "pad=2 is more than half the window R=3, S=3"),
    ("pool2d", "N=1,H=8,W=8,C=3,R=4,S=1,pad=1", "pad=1 is more than half the window R=4, S=1"),
])
def test_parse_shape_errors_name_key_and_rule(op, text, fragment):
    with pytest.raises(InvalidShapeError) as err:
        ops.parse_shape(op, text)
    assert fragment in str(err.value)


@pytest.mark.parametrize("op, options, fragment", [
    ("matmul", {"kind": "max"}, "matmul has no option 'kind' (an option of pool2d); matmul takes layout (nn|nt, "
                                "default nn)"),
    ("conv2d", {"layout": "nt"}, "conv2d has no option 'layout' (an option of matmul); conv2d takes no options"),
    ("pool2d", {"mode": "max"}, "pool2d has no option 'mode' (no operator takes it); pool2d takes kind (max|avg"),
    ("pool2d", {"kind": "min"}, "pool2d: kind='min' is not allowed: use one of max, avg"),
    ("pool2d", {"kind": "MAX"}, "kind='MAX' is not allowed"),
    ("matmul", {"layout": "tn"}, "matmul: layout='tn' is not allowed: use one of nn, nt"),
    ("matmul", {"layout": 1}, "layout=1 is not allowed"),
])
def test_option_errors_name_option_and_allowed_values(op, options, fragment):
    with pytest.raises(InvalidShapeError) as err:
        ops.OPS[op].with_options(**options)
    assert fragment in str(err.value)


def test_options_default_first_and_chosen():
    pool = ops.OPS["pool2d"]
    assert pool.option_values == {"kind": "max"} and ops.OPS["conv2d"].option_values == {}
    avg = pool.with_options(kind="avg")
    assert avg.option_values == {"kind": "avg"} and pool.option_values == {"kind": "max"}  # a copy, not a change
    assert avg.with_options().option_values == {"kind": "avg"}
    assert ops.OPS["matmul"].with_options(layout="nt").input_shapes({"M": 2, "N": 3, "K": 5}) == [(2, 5), (3, 5)]
    assert ops.OPS["matmul"].input_shapes({"M": 2, "N": 3, "K": 5}) == [(2, 5), (5, 3)]
    assert ops.option_names() == {"layout": ("matmul",), "kind": ("pool2d",)}


def test_options_change_dtype_rules():
    shape = {"N": 1, "H": 4, "W": 4, "C": 3, "R": 2, "S": 2}
    assert ops.validate_shape(ops.OPS["pool2d"], shape, "int8")["R"] == 2  # max keeps int8
    assert ops.OPS["pool2d"].out_dtype("int8") == "int8"
    with pytest.raises(InvalidShapeError, match="kind=avg needs a floating-point dtype"):
        ops.parse_shape(ops.OPS["pool2d"].with_options(kind="avg"), "N=1,H=4,W=4,C=3,R=2,S=2", "int8")
    with pytest.raises(InvalidShapeError, match="kind=avg needs a floating-point dtype"):
        ops.pool2d(1, 4, 4, 3, 2, 2, dtype="int8", kind="avg")
    with pytest.raises(InvalidShapeError, match="kind='sum' is not allowed"):
        ops.pool2d(1, 4, 4, 3, 2, 2, kind="sum")
    with pytest.raises(InvalidShapeError, match="layout='tt' is not allowed"):
        ops.matmul(4, 4, 4, layout="tt")


def test_conv_kernel_fits_with_padding():
    shape = ops.parse_shape("conv2d", "N=1,H=4,W=4,C=3,K=8,R=7,S=3,pad=2")
    assert ops.OPS["conv2d"].output_shape(shape) == (1, 2, 6, 8)


@pytest.mark.parametrize("dtype, fragment", [
    ("float8", "unknown dtype 'float8'"),
    ("bfloat16", "dtype bfloat16 is not supported"),
    ("int32", "dtype int32 is not supported"),
])
def test_validate_shape_dtype_errors(dtype, fragment):
    with pytest.raises(InvalidShapeError, match=fragment):
        ops.validate_shape("matmul", {"M": 4, "N": 4, "K": 4}, dtype)


def test_validate_shape_value_types():
    assert ops.validate_shape("matmul", {"M": np.int64(4), "N": 4, "K": 4}) == {"M": 4, "N": 4, "K": 4}
    for bad in (True, 4.0, "4", None):
        with pytest.raises(InvalidShapeError, match="must be an integer"):
            ops.validate_shape("matmul", {"M": bad, "N": 4, "K": 4})
    # the dtype changes the byte budget: three 9e8-element tensors are 20 GiB in float64, 5 GiB in float16
    big = {"M": 30000, "N": 30000, "K": 30000}
    assert ops.validate_shape("matmul", big, "float16") == big
    with pytest.raises(InvalidShapeError, match="20.1 GiB together"):
        ops.validate_shape("matmul", big, "float64")


def test_plain_functions_validate():
    with pytest.raises(InvalidShapeError, match="M=0"):
        ops.matmul(0, 4, 4)
    with pytest.raises(InvalidShapeError, match="does not fit"):
        ops.conv2d_nhwc(1, 2, 2, 3, 4, 3, 3)
    with pytest.raises(InvalidShapeError, match="dtype"):
        ops.add_relu(4, 4, dtype="bfloat16")


# ------------------------------------------------------------------ spec methods

def test_flops_and_output_shapes():
    o = ops.OPS
    assert o["matmul"].flops({"M": 3, "N": 5, "K": 7}) == 2 * 3 * 5 * 7
    assert o["batch_matmul"].flops({"B": 2, "M": 3, "N": 5, "K": 7}) == 2 * 2 * 3 * 5 * 7
    conv = {"N": 2, "H": 9, "W": 7, "C": 3, "K": 5, "R": 3, "S": 2, "stride": 2, "pad": 1}
    assert o["conv2d"].output_shape(conv) == (2, 5, 4, 5)
    assert o["conv2d"].flops(conv) == 2 * 2 * 5 * 4 * 5 * 3 * 2 * 3
    assert o["reduce_sum"].output_shape({"M": 7, "N": 13}) == (7,)
    assert o["reduce_sum"].flops({"M": 7, "N": 13}) == 91
    assert o["add_relu"].flops({"M": 7, "N": 13}) == 182
    assert o["matmul"].out_dtype("int8") == "int32" and o["add_relu"].out_dtype("int8") == "int8"
    grouped = dict(conv, C=6, K=9, groups=3)
    assert o["conv2d"].input_shapes(grouped) == [(2, 9, 7, 6), (3, 2, 2, 9)]
    assert o["conv2d"].flops(grouped) == 2 * 2 * 5 * 4 * 9 * 3 * 2 * 2
    dw = {"N": 2, "H": 9, "W": 7, "C": 3, "R": 3, "S": 2, "stride": 2, "pad": 1, "dilation": 2}
    assert o["depthwise_conv2d"].input_shapes(dw) == [(2, 9, 7, 3), (3, 2, 3)]
    assert o["depthwise_conv2d"].output_shape(dw) == (2, 4, 4, 3)  # (9+2-4-1)//2+1, (7+2-2-1)//2+1
    assert o["depthwise_conv2d"].flops(dw) == 2 * 2 * 4 * 4 * 3 * 3 * 2
    pool = {"N": 2, "H": 9, "W": 7, "C": 3, "R": 3, "S": 2, "stride": 2, "pad": 1}
    assert o["pool2d"].output_shape(pool) == (2, 5, 4, 3)
    assert o["pool2d"].flops(pool) == 2 * 5 * 4 * 3 * 3 * 2
    assert o["pool2d"].with_options(kind="avg").flops(pool) == 2 * 5 * 4 * 3 * (3 * 2 + 1)


def test_inputs_order_range_and_determinism():
    spec = ops.OPS["conv2d"]
    shape = {"N": 1, "H": 6, "W": 5, "C": 3, "K": 4, "R": 3, "S": 3}
    a = spec.inputs(shape, "float32", np.random.default_rng(7))
    b = spec.inputs(shape, "float32", np.random.default_rng(7))
    assert [x.shape for x in a] == [(1, 6, 5, 3), (3, 3, 3, 4)]
    assert all(x.dtype == np.float32 for x in a)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    for x in a:  # multiples of 1/8 in [-1, 1]: float32 sums stay exact
        assert np.abs(x).max() <= 1 and np.array_equal(x * 8, np.round(x * 8))
    i8 = ops.OPS["matmul"].inputs({"M": 4, "N": 4, "K": 4}, "int8")
    assert all(x.dtype == np.int8 and np.abs(x).max() <= 3 for x in i8)


def test_reference_computes_wide_then_casts():
    spec = ops.OPS["matmul"]
    a = np.array([[1e8, 1.0, -1e8]], dtype=np.float32)
    b = np.ones((3, 1), dtype=np.float32)
    out = spec.reference([a, b], {"M": 1, "N": 1, "K": 3})
    assert out.dtype == np.float32 and out[0, 0] == 1.0  # float32 accumulation would lose the 1.0
    i8 = np.full((1, 64), 100, dtype=np.int8)
    assert spec.reference([i8, np.ones((64, 1), np.int8)], {"M": 1, "N": 1, "K": 64})[0, 0] == 6400


def naive_conv(data, weight, stride, pad, dilation):
    """The convolution straight from its definition (loops), to check the vectorized reference."""
    n_, h_, w_, c_ = data.shape
    r_, s_, _, k_ = weight.shape
    oh = (h_ + 2 * pad - dilation * (r_ - 1) - 1) // stride + 1
    ow = (w_ + 2 * pad - dilation * (s_ - 1) - 1) // stride + 1
    out = np.zeros((n_, oh, ow, k_))
    for n, y, x, k, r, s, c in itertools.product(range(n_), range(oh), range(ow), range(k_), range(r_), range(s_),
                                                 range(c_)):
        hy, wx = y * stride + r * dilation - pad, x * stride + s * dilation - pad
        if 0 <= hy < h_ and 0 <= wx < w_:
            out[n, y, x, k] += data[n, hy, wx, c] * weight[r, s, c, k]
    return out


def naive_window_op(data, r_, s_, stride, pad, dilation, combine, out_channels, fill=0.0):
    """``combine(values)`` over each window, from the definition: ``values[r, s]`` is the padded input
    pixel [N, C] the kernel offset (r, s) meets (``fill`` outside the input)."""
    n_, h_, w_, c_ = data.shape
    oh = (h_ + 2 * pad - dilation * (r_ - 1) - 1) // stride + 1
    ow = (w_ + 2 * pad - dilation * (s_ - 1) - 1) // stride + 1
    out = np.zeros((n_, oh, ow, out_channels))
    for y, x in itertools.product(range(oh), range(ow)):
        values = np.full((r_, s_, n_, c_), fill)
        for r, s in itertools.product(range(r_), range(s_)):
            hy, wx = y * stride + r * dilation - pad, x * stride + s * dilation - pad
            if 0 <= hy < h_ and 0 <= wx < w_:
                values[r, s] = data[:, hy, wx, :]
        out[:, y, x, :] = combine(values)
    return out


@pytest.mark.parametrize("stride, pad, dilation", [(1, 0, 1), (2, 1, 1), (1, 2, 2), (3, 1, 2)])
def test_conv_reference_matches_definition(stride, pad, dilation):
    spec = ops.OPS["conv2d"]
    shape = {"N": 2, "H": 7, "W": 6, "C": 2, "K": 3, "R": 3, "S": 2, "stride": stride, "pad": pad, "dilation": dilation}
    arrays = spec.inputs(shape, "float64", np.random.default_rng(3))
    np.testing.assert_array_equal(spec.reference(arrays, shape), naive_conv(*arrays, stride, pad, dilation))


@pytest.mark.parametrize("groups, c, k", [(2, 4, 6), (3, 3, 3), (5, 5, 10)])
def test_grouped_conv_reference_matches_definition(groups, c, k):
    spec = ops.OPS["conv2d"]
    shape = {"N": 2, "H": 7, "W": 6, "C": c, "K": k, "R": 3, "S": 2, "stride": 2, "pad": 1, "groups": groups}
    data, weight = spec.inputs(shape, "float64", np.random.default_rng(3))
    cg, kg = c // groups, k // groups
    want = np.concatenate([naive_conv(data[..., g * cg:(g + 1) * cg], weight[..., g * kg:(g + 1) * kg], 2, 1, 1)
                           for g in range(groups)], axis=-1)  # each group is an ordinary convolution
    np.testing.assert_array_equal(spec.reference([data, weight], shape), want)


@pytest.mark.parametrize("stride, pad, dilation", [(1, 0, 1), (2, 1, 1), (1, 2, 2), (3, 1, 2)])
def test_depthwise_reference_matches_definition(stride, pad, dilation):
    spec = ops.OPS["depthwise_conv2d"]
    shape = {"N": 2, "H": 7, "W": 6, "C": 3, "R": 3, "S": 2, "stride": stride, "pad": pad, "dilation": dilation}
    data, weight = spec.inputs(shape, "float64", np.random.default_rng(3))
    want = naive_window_op(data, 3, 2, stride, pad, dilation,
                           lambda v: np.einsum("rsnc,rsc->nc", v, weight), out_channels=3)
    np.testing.assert_array_equal(spec.reference([data, weight], shape), want)


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("r, s, stride, pad", [(1, 1, 1, 0), (2, 2, 2, 0), (3, 3, 2, 1), (3, 2, 1, 1), (5, 3, 3, 1)])
def test_pool_reference_matches_definition(kind, r, s, stride, pad):
    spec = ops.OPS["pool2d"].with_options(kind=kind)
    shape = {"N": 2, "H": 7, "W": 6, "C": 3, "R": r, "S": s, "stride": stride, "pad": pad}
    (data,) = spec.inputs(shape, "float64", np.random.default_rng(3))
    data -= 2  # all negative: zero padding would win a max, and would be visible in an average
    if kind == "max":
        want = naive_window_op(data, r, s, stride, pad, 1, lambda v: v.max(axis=(0, 1)), 3, fill=-np.inf)
    else:  # count_include_pad: the padding counts in the divisor
        want = naive_window_op(data, r, s, stride, pad, 1, lambda v: v.sum(axis=(0, 1)) / (r * s), 3)
    np.testing.assert_allclose(spec.reference([data], shape), want, rtol=1e-15)
    assert np.isfinite(want).all() and (want < 0).all()


def test_pool_matches_torch_semantics_when_available():
    torch = pytest.importorskip("torch")
    shape = {"N": 2, "H": 7, "W": 6, "C": 3, "R": 3, "S": 3, "stride": 2, "pad": 1}
    (data,) = ops.OPS["pool2d"].inputs(shape, "float64", np.random.default_rng(3))
    x = torch.from_numpy(data - 2).permute(0, 3, 1, 2)
    for kind, fn in (("max", torch.nn.functional.max_pool2d), ("avg", torch.nn.functional.avg_pool2d)):
        want = fn(x, 3, stride=2, padding=1).permute(0, 2, 3, 1).numpy()
        got = ops.OPS["pool2d"].with_options(kind=kind).reference([data - 2], shape)
        np.testing.assert_allclose(got, want, rtol=1e-12)


# ------------------------------------------------------------------ unscheduled kernels against the references

CASES = [
    ("matmul", {"M": 7, "N": 13, "K": 5}),
    ("matmul", {"M": 1, "N": 1, "K": 1}),
    ("matmul", {"M": 3, "N": 17, "K": 1025}),
    ("batch_matmul", {"B": 3, "M": 5, "N": 11, "K": 7}),
    ("conv2d", {"N": 1, "H": 5, "W": 5, "C": 3, "K": 4, "R": 5, "S": 1}),
    ("conv2d", {"N": 2, "H": 9, "W": 7, "C": 3, "K": 5, "R": 3, "S": 2, "stride": 2, "pad": 1}),
    ("conv2d", {"N": 1, "H": 9, "W": 7, "C": 2, "K": 3, "R": 3, "S": 3, "pad": 2, "dilation": 2}),
    ("conv2d", {"N": 2, "H": 9, "W": 7, "C": 6, "K": 9, "R": 3, "S": 2, "stride": 2, "pad": 1, "groups": 3}),
    ("conv2d", {"N": 1, "H": 7, "W": 5, "C": 5, "K": 5, "R": 3, "S": 3, "pad": 2, "dilation": 2, "groups": 5}),
    ("conv2d", {"N": 1, "H": 6, "W": 5, "C": 4, "K": 16, "R": 3, "S": 3, "pad": 1, "groups": 2}),  # 8 a group: g, j
    ("depthwise_conv2d", {"N": 1, "H": 7, "W": 5, "C": 3, "R": 3, "S": 3, "pad": 1}),
    ("depthwise_conv2d", {"N": 2, "H": 11, "W": 13, "C": 7, "R": 3, "S": 2, "stride": 2, "pad": 1, "dilation": 2}),
    ("depthwise_conv2d", {"N": 1, "H": 1, "W": 1, "C": 1, "R": 1, "S": 1}),
    ("pool2d", {"N": 1, "H": 7, "W": 5, "C": 3, "R": 3, "S": 3, "pad": 1}),
    ("pool2d", {"N": 2, "H": 11, "W": 13, "C": 7, "R": 3, "S": 2, "stride": 2, "pad": 1}),
    ("pool2d", {"N": 1, "H": 1, "W": 1, "C": 1, "R": 1, "S": 1}),
    ("reduce_sum", {"M": 7, "N": 13}),
    ("reduce_sum", {"M": 1, "N": 1025}),
    ("add_relu", {"M": 17, "N": 33}),
]


def _variants() -> dict:
    """Every operator with each value of its options, by case id (matmul-nt, pool2d-avg, conv2d...)."""
    out = {}
    for name, spec in ops.OPS.items():
        choices = [(k, v) for k, values in spec.options.items() for v in values]
        out.update({f"{name}-{v}": spec.with_options(**{k: v}) for k, v in choices} or {name: spec})
    return out


VARIANTS = _variants()


@pytest.mark.build
@pytest.mark.parametrize("variant, shape", [(v, s) for v, spec in VARIANTS.items() for n, s in CASES if n == spec.name],
                         ids=lambda x: x if isinstance(x, str) else "x".join(map(str, x.values())))
def test_unscheduled_float32_matches_reference(variant, shape):
    spec = VARIANTS[variant]
    out, ref = run_unscheduled(spec, shape)
    assert out.dtype == ref.dtype == np.float32 and out.shape == ref.shape
    np.testing.assert_array_equal(out, ref)  # inputs are multiples of 1/8: the sums are exact
    assert np.count_nonzero(ref) > 0 or math.prod(out.shape) == 1


@pytest.mark.build
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("dtype", ["float64", "float16", "int8"])
def test_unscheduled_other_dtypes_match_reference(variant, dtype):
    spec = VARIANTS[variant]
    if dtype == "int8" and spec.option_values.get("kind") == "avg":
        pytest.skip("avg pooling rejects int8 (test_options_change_dtype_rules)")
    shape = dict(next(s for n, s in CASES if n == spec.name))
    out, ref = run_unscheduled(spec, shape, dtype)
    assert out.dtype == ref.dtype == np.dtype(spec.out_dtype(dtype))
    np.testing.assert_array_equal(out, ref)  # small shapes: exact in float16 too (and the avg's one division)


@pytest.mark.build
def test_max_pool_padding_never_wins():
    """All-negative input: padding with 0 instead of the lowest value would show at the borders."""
    import tvm

    spec = ops.OPS["pool2d"]
    shape = {"N": 1, "H": 5, "W": 4, "C": 3, "R": 3, "S": 3, "stride": 2, "pad": 1}
    for dtype in ("float32", "int8"):
        data = -np.arange(1, 61).reshape(1, 5, 4, 3).astype(dtype)
        out = tvm.runtime.empty(spec.output_shape(shape), dtype, tvm.cpu())
        tvm.compile(spec.make(shape, dtype), "llvm")["main"](tvm.runtime.tensor(data, tvm.cpu()), out)
        np.testing.assert_array_equal(out.numpy(), spec.reference([data], shape))
        assert (out.numpy() < 0).all()


def test_new_ops_analyse_as_one_reduction_with_padding_and_epilogue():
    """The analysis takes each new operator as it is: padding kept as a producer, avg's division as the
    epilogue, a grouped convolution as affine accesses over a group axis."""
    from roller.tir.analysis import analyze

    pool = {"N": 1, "H": 7, "W": 5, "C": 3, "R": 3, "S": 3, "pad": 1}
    avg = analyze(ops.OPS["pool2d"].with_options(kind="avg").make(pool))
    assert (avg.expr.block, avg.epilogue_block, avg.producer_blocks) == ("pool_sum", "pool", ("pad_temp",))
    assert avg.expr.output.name == "pool" and avg.accumulator == "pool_sum"
    mx = analyze(ops.OPS["pool2d"].make(pool))
    assert (mx.expr.block, mx.epilogue_block, mx.producer_blocks) == ("pool", None, ("pad_temp",))
    assert [a.kind for a in mx.expr.axes] == ["spatial"] * 4 + ["reduce"] * 2
    grouped = analyze(ops.OPS["conv2d"].make({"N": 1, "H": 6, "W": 6, "C": 4, "K": 16, "R": 3, "S": 3, "groups": 2}))
    assert [a.name for a in grouped.expr.axes] == ["n", "h", "w", "g", "j", "r", "s", "c"]
    assert grouped.expr.output.shape == (1, 4, 4, 16) and grouped.expr.output.index[-1] == (("g", 8), ("j", 1))
    # fewer than ops.GROUP_REPLICATE_BELOW output channels a group: a kept gather stage gives every output
    # channel its group's inputs, and the convolution vectorizes over all of them
    narrow = analyze(ops.OPS["conv2d"].make({"N": 1, "H": 6, "W": 6, "C": 4, "K": 6, "R": 3, "S": 3, "pad": 1,
                                            "groups": 2}))
    assert narrow.producer_blocks == ("pad_temp", "group_rep") and narrow.expr.staged == ("group_rep",)
    assert narrow.expr.inlinable == ()  # a gather is never inlined (its index would not stay affine)
    assert [a.name for a in narrow.expr.axes] == ["n", "h", "w", "k", "r", "s", "c"]
    assert {t.name: t.shape for t in narrow.expr.inputs}["group_rep"] == (1, 8, 8, 2, 6)
    dw = analyze(ops.OPS["depthwise_conv2d"].make({"N": 1, "H": 6, "W": 6, "C": 5, "R": 3, "S": 3, "pad": 1}))
    assert dw.producer_blocks == ("pad_temp",) and [a.name for a in dw.expr.axes if a.kind == "reduce"] == ["r", "s"]
    nt = analyze(ops.OPS["matmul"].with_options(layout="nt").make({"M": 3, "N": 4, "K": 5}))
    assert {t.name: t.index for t in nt.expr.inputs}["B"] == ((("n", 1),), (("k", 1),))
