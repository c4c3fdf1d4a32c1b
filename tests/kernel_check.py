"""Building one plan and checking its kernel against the operator's numpy reference: what the plan-field tests
share (not a test file)."""
import numpy as np

from roller.measure.verify import TOLERANCE
from roller.targets import build


def check_plan(spec, full, expr, func, program, device, arrays=None):
    """Builds ``program`` for ``device`` and compares its output (the buffer starts as NaN, so an element the
    kernel skips fails) with ``spec``'s reference on ``arrays`` (default: the spec's inputs, seed 3)."""
    import tvm

    if arrays is None:
        arrays = spec.inputs(full, "float32", np.random.default_rng(3))
    kernel = build(func, expr, program, device)["main"]
    ref = spec.reference(arrays, full)
    tensors = [tvm.runtime.tensor(a) for a in arrays] + [tvm.runtime.tensor(np.full(ref.shape, np.nan, "float32"))]
    kernel(*tensors)
    rtol, atol = TOLERANCE["float32"]
    np.testing.assert_allclose(tensors[-1].numpy(), ref, rtol=rtol, atol=atol)
