"""Property-based tests: every named operator (roller.tir.ops.OPS, iterated, so operators added later are
covered too) on random small shapes — sizes of 1, primes, odd channel counts, strides, padding, dilation,
groups and the operator's options — is built by construction (the model's top-1 plan, no profiling),
must come back verified, and its module must match the numpy reference again on fresh random inputs,
written into an output buffer filled with a sentinel (so an element the kernel skips fails).

Shapes come from hypothesis with ``derandomize=True`` (the same examples on every run). Cases that fail
because of a known bug outside the tests are listed in KNOWN_FAILURES, each with the bug's trigger (as
narrow as it is known) and its smallest failing case: the property skips the cases the trigger matches,
and test_known_failures runs each smallest case as xfail(strict=False), so a fix shows as XPASS.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import roller
from roller.tir import ops
from roller.errors import InvalidShapeError
from roller.measure.verify import TOLERANCE, fill_sentinel

pytestmark = pytest.mark.build

settings.register_profile(
    "roller-properties", max_examples=15, deadline=None, derandomize=True, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
PROFILE = settings.get_profile("roller-properties")

# Sizes: 1, small primes, powers of two and their neighbours, odd channel counts.
DIMS = (1, 2, 3, 5, 7, 13, 16, 17, 31, 33, 64, 97, 129)
BATCH = (1, 2, 3)
IMAGE_EXTRA = (0, 1, 2, 4, 6, 12)   # spatial size beyond the smallest that fits the window
CHANNELS = (1, 3, 4, 5, 8, 16, 17, 36)
KERNEL = (1, 2, 3, 5)
DTYPES = ("float32", "float32", "float64", "float16", "int8")


@dataclass(frozen=True)
class KnownFailure:
    """A bug outside the tests that some drawn cases hit: ``applies(op, shape, options, dtype)`` is the
    bug's trigger, as narrow as it is known; ``minimal`` the smallest failing case (op, shape, options,
    dtype), run by test_known_failures as xfail(strict=False)."""

    bug: str
    applies: Callable[[str, dict, dict, str], bool]
    minimal: tuple[str, dict, dict, str]


# Bugs these properties found and that were fixed (keep the cases as regressions in test_vector_axis.py):
# grouped conv2d writing past a group when its vector axis overhung (fixed by rtile.exact_axes), the same
# failing to pad (tails.can_pad: the output must be written at plain indices), and a predicated unrolled
# register loop in a fused grid (codegen no longer partitions register loops).
KNOWN_FAILURES: list[KnownFailure] = []


def known_bug(op: str, shape: dict, options: dict, dtype: str) -> str | None:
    for k in KNOWN_FAILURES:
        if k.applies(op, shape, options, dtype):
            return k.bug
    return None


@st.composite
def cases(draw, op: str):
    """(shape, options, dtype) for ``op``, valid by ``ops.validate_shape``.

    Operators with H and W keys are images (NHWC): N is the batch, C / K channels, R / S the window, H / W
    at least the window's extent; others are matrices and vectors of DIMS (B a batch). Optional keys
    (stride, pad, dilation, groups) and string options are drawn when the operator has them."""
    spec = ops.OPS[op]
    options = {k: draw(st.sampled_from(list(v)), label=k) for k, v in getattr(spec, "options", {}).items()}
    dtype = draw(st.sampled_from(DTYPES), label="dtype")
    keys = set(spec.shape_keys) | set(spec.optional_keys)
    image = {"H", "W"} <= keys
    shape: dict[str, int] = {}
    if image:
        for k in ("R", "S"):
            if k in keys:
                shape[k] = draw(st.sampled_from(KERNEL), label=k)
        window = min(shape.get("R", 1), shape.get("S", 1))
        if "stride" in keys:
            shape["stride"] = draw(st.sampled_from((1, 2, 3)), label="stride")
        if "dilation" in keys:
            shape["dilation"] = draw(st.sampled_from((1, 2)), label="dilation")
        if "pad" in keys:
            shape["pad"] = draw(st.integers(0, window // 2), label="pad")
        groups = draw(st.sampled_from((1, 2, 3)), label="groups") if "groups" in keys else 1
        if "groups" in keys:
            shape["groups"] = groups
        for hw, rs in (("H", "R"), ("W", "S")):
            reach = (shape.get(rs, 1) - 1) * shape.get("dilation", 1) + 1 - 2 * shape.get("pad", 0)
            shape[hw] = max(1, reach) + draw(st.sampled_from(IMAGE_EXTRA), label=hw)
        for k in ("C", "K"):
            if k in keys:
                shape[k] = groups * draw(st.sampled_from(CHANNELS), label=k)
        if "N" in keys:
            shape["N"] = draw(st.sampled_from(BATCH), label="N")
    for k in spec.shape_keys:
        if k not in shape:
            shape[k] = draw(st.sampled_from(BATCH if k == "B" else DIMS), label=k)
    try:
        checked = spec.with_options(**options) if options else spec
        ops.validate_shape(checked, shape, dtype)
    except InvalidShapeError:
        assume(False)
    return shape, options, dtype


def check_op(op: str, shape: dict, options: dict, dtype: str, seed: int = 7) -> None:
    """Builds the model's top-1 plan of ``op`` and checks it twice against numpy: in build_op (the
    profiler's check) and here on fresh inputs into a sentinel-filled output."""
    import tvm

    res = roller.build_op(op, shape, dtype=dtype, profile=False, **options)
    assert res.report["verified"], res.report
    spec = ops.OPS[op].with_options(**options) if options else ops.OPS[op]
    full = ops.validate_shape(spec, shape, dtype)
    arrays = spec.inputs(full, dtype, np.random.default_rng(seed))  # not the inputs build_op checked
    ref = spec.reference(arrays, full)
    dev = tvm.cpu()
    out = tvm.runtime.tensor(fill_sentinel(np.empty(ref.shape, ref.dtype)), dev)
    res.module["main"](*[tvm.runtime.tensor(a, dev) for a in arrays], out)
    rtol, atol = TOLERANCE.get(str(ref.dtype), (0.0, 0.0))
    np.testing.assert_allclose(out.numpy(), ref, rtol=rtol, atol=atol,
                               err_msg=f"{op} {full} {options} {dtype}: {res.program.describe()}")


@pytest.mark.parametrize("op", sorted(ops.OPS))
def test_every_operator_matches_numpy_on_random_shapes(op):
    @PROFILE
    @given(case=cases(op), seed=st.integers(0, 2**16))
    def prop(case, seed):
        shape, options, dtype = case
        assume(known_bug(op, shape, options, dtype) is None)  # each is run on its own below, as xfail
        check_op(op, shape, options, dtype, seed)

    prop()


@pytest.mark.parametrize("known", [pytest.param(k, marks=pytest.mark.xfail(strict=False, reason=k.bug),
                                                  id=f"{k.minimal[0]}-{k.minimal[3]}")
                                     for k in KNOWN_FAILURES])
def test_known_failures(known):
    """The smallest case of each known bug, checked like any other (XPASS once the bug is fixed: then
    remove its entry so the property covers those shapes again)."""
    op, shape, options, dtype = known.minimal
    assert known.applies(op, shape, options, dtype)
    check_op(op, shape, options, dtype)
