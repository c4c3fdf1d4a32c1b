"""Symbolic dimensions served by bucketed kernels: the bucket policy's bounds, padded and cropped
results against numpy, dimensions that padding would change served exactly, clear errors."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from roller.serve.buckets import BucketPolicy
from roller.errors import RollerError


def test_bucket_policy_bounds_kernels_and_padding():
    pol = BucketPolicy()
    assert [pol.bucket(n) for n in (1, 2, 3, 5, 8, 9, 17, 64, 65, 129, 257, 512)] == \
           [1, 2, 4, 8, 8, 16, 24, 64, 72, 144, 288, 512]
    assert len(pol.buckets(1, 512)) == 35  # instead of 512 kernels
    assert len(BucketPolicy(epsilon=0.25).buckets(1, 512)) < 35
    for bad in (dict(epsilon=0), dict(epsilon=1.5), dict(align=0)):
        with pytest.raises(RollerError, match="epsilon must be in"):
            BucketPolicy(**bad)
    with pytest.raises(RollerError, match="at least 1"):
        pol.bucket(0)


@given(st.integers(1, 100_000), st.sampled_from([0.0625, 0.125, 0.25, 0.5]), st.sampled_from([1, 4, 8, 16]))
def test_a_bucket_holds_its_value_and_pads_within_bounds(n, eps, align):
    pol = BucketPolicy(epsilon=eps, align=align)
    b = pol.bucket(n)
    assert b >= n and pol.bucket(b) == b  # buckets are fixed points: no chain of re-bucketing
    if n > align:
        assert b % align == 0 and (b - n < align or (b - n) / n <= eps)


@pytest.mark.build
def test_dynamic_matmul_padded_results_match_numpy():
    from tvm import te

    from roller.serve.jit import JIT

    n = te.var("n")
    a = te.placeholder((n, 32), name="A")
    b = te.placeholder((32, 24), name="B")
    k = te.reduce_axis((0, 32), name="k")
    c = te.compute((n, 24), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    jit = JIT(background=0)
    dyn = jit.dynamic([a, b, c])
    assert dyn.exact == ()
    rng = np.random.default_rng(2)
    bw = rng.uniform(-1, 1, (32, 24)).astype("float32")
    for m in (1, 3, 13, 70, 71, 72):
        aw = rng.uniform(-1, 1, (m, 32)).astype("float32")
        out = dyn(aw, bw)
        assert out.shape == (m, 24)
        np.testing.assert_allclose(out, aw @ bw, rtol=1e-4, atol=1e-4)
    assert dyn.kernels() == len({dyn.policy.bucket(m) for m in (1, 3, 13, 70, 71, 72)}) == 4
    import tvm
    np.testing.assert_allclose(dyn(aw, tvm.runtime.tensor(bw)), aw @ bw, rtol=1e-4, atol=1e-4)  # a kept weight
    np.testing.assert_allclose(dyn(tvm.runtime.tensor(aw), bw), aw @ bw, rtol=1e-4, atol=1e-4)  # padded from TVM
    with pytest.raises(RollerError, match=r"input B dimension 0 must be 32, got 31"):
        dyn(aw, bw[:31])
    with pytest.raises(RollerError, match="2 inputs expected"):
        dyn(aw)
    with pytest.raises(RollerError, match="no symbolic dimension"):
        jit.dynamic(_static())


def _static():
    from tvm import te
    x = te.placeholder((4, 4), name="X")
    return te.create_prim_func([x, te.compute((4, 4), lambda i, j: x[i, j] + 1, name="Y")])


@pytest.mark.build
def test_a_dimension_padding_would_change_is_served_exactly():
    from tvm import te

    from roller.serve.jit import JIT

    n = te.var("n")
    r = te.reduce_axis((0, n), name="r")
    x = te.placeholder((n, 16), name="X")
    s = te.compute((16,), lambda j: te.sum(x[r, j], axis=r), name="S")
    mean = te.compute((16,), lambda j: s[j] / n.astype("float32"), name="M")
    y = te.placeholder((n, 16), name="Y")
    total = te.compute((16,), lambda j: te.sum(y[r, j], axis=r), name="T")
    jit = JIT(background=0)
    dmean, dsum = jit.dynamic([x, mean]), jit.dynamic([y, total])
    assert dmean.exact == ("n",) and dsum.exact == ()  # a mean divides by n: zeros would dilute it
    rng = np.random.default_rng(4)
    for m in (5, 37):
        v = rng.uniform(-1, 1, (m, 16)).astype("float32")
        np.testing.assert_allclose(dmean(v), v.mean(0), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(dsum(v), v.sum(0), rtol=1e-4, atol=1e-4)
    assert dmean.buckets({"n": 37}) == {"n": 37} and dsum.buckets({"n": 37}) == {"n": 40}
