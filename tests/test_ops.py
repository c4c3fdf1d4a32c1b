"""roller.ops: shape parsing/validation, numpy references, and the unscheduled PrimFuncs against them."""
import itertools

import numpy as np
import pytest

from roller import ops
from roller.errors import InvalidShapeError


def run_unscheduled(spec, shape, dtype="float32", seed=0):
    """Builds the op's unscheduled PrimFunc with TVM, runs it, returns (output, reference)."""
    import tvm

    func = spec.make(shape, dtype)
    ex = tvm.compile(func, "llvm")
    arrays = spec.inputs(shape, dtype, np.random.default_rng(seed))
    dev = tvm.cpu()
    out = tvm.runtime.empty(spec.output_shape(shape), spec.out_dtype(dtype), dev)
    ex["main"](*[tvm.runtime.tensor(a, dev) for a in arrays], out)
    return out.numpy(), spec.reference(arrays, shape)


# ------------------------------------------------------------------ parsing and validation

def test_parse_shape_basic_and_defaults():
    assert ops.parse_shape("matmul", "M=1024,N=1024,K=1024") == {"M": 1024, "N": 1024, "K": 1024}
    assert ops.parse_shape("matmul", " m = 3 , n=5,K=7 ,") == {"M": 3, "N": 5, "K": 7}
    conv = ops.parse_shape("conv2d", "N=1,H=56,W=56,C=64,K=64,R=3,S=3,pad=1")
    assert conv == {"N": 1, "H": 56, "W": 56, "C": 64, "K": 64, "R": 3, "S": 3, "stride": 1, "pad": 1, "dilation": 1}
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
])
def test_parse_shape_errors_name_key_and_rule(op, text, fragment):
    with pytest.raises(InvalidShapeError) as err:
        ops.parse_shape(op, text)
    assert fragment in str(err.value)


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


@pytest.mark.parametrize("stride, pad, dilation", [(1, 0, 1), (2, 1, 1), (1, 2, 2), (3, 1, 2)])
def test_conv_reference_matches_definition(stride, pad, dilation):
    spec = ops.OPS["conv2d"]
    shape = {"N": 2, "H": 7, "W": 6, "C": 2, "K": 3, "R": 3, "S": 2, "stride": stride, "pad": pad, "dilation": dilation}
    arrays = spec.inputs(shape, "float64", np.random.default_rng(3))
    np.testing.assert_array_equal(spec.reference(arrays, shape), naive_conv(*arrays, stride, pad, dilation))


# ------------------------------------------------------------------ unscheduled kernels against the references

CASES = [
    ("matmul", {"M": 7, "N": 13, "K": 5}),
    ("matmul", {"M": 1, "N": 1, "K": 1}),
    ("matmul", {"M": 3, "N": 17, "K": 1025}),
    ("batch_matmul", {"B": 3, "M": 5, "N": 11, "K": 7}),
    ("conv2d", {"N": 1, "H": 5, "W": 5, "C": 3, "K": 4, "R": 5, "S": 1}),
    ("conv2d", {"N": 2, "H": 9, "W": 7, "C": 3, "K": 5, "R": 3, "S": 2, "stride": 2, "pad": 1}),
    ("conv2d", {"N": 1, "H": 9, "W": 7, "C": 2, "K": 3, "R": 3, "S": 3, "pad": 2, "dilation": 2}),
    ("reduce_sum", {"M": 7, "N": 13}),
    ("reduce_sum", {"M": 1, "N": 1025}),
    ("add_relu", {"M": 17, "N": 33}),
]


@pytest.mark.build
@pytest.mark.parametrize("name, shape", CASES)
def test_unscheduled_float32_matches_reference(name, shape):
    out, ref = run_unscheduled(ops.OPS[name], shape)
    assert out.dtype == ref.dtype == np.float32 and out.shape == ref.shape
    np.testing.assert_array_equal(out, ref)  # inputs are multiples of 1/8: the sums are exact
    assert np.count_nonzero(ref) > 0


@pytest.mark.build
@pytest.mark.parametrize("name", list(ops.OPS))
@pytest.mark.parametrize("dtype", ["float64", "float16", "int8"])
def test_unscheduled_other_dtypes_match_reference(name, dtype):
    shape = dict(next(s for n, s in CASES if n == name))
    out, ref = run_unscheduled(ops.OPS[name], shape, dtype)
    assert out.dtype == ref.dtype == np.dtype(ops.OPS[name].out_dtype(dtype))
    np.testing.assert_array_equal(out, ref)  # small shapes: exact in float16 too
