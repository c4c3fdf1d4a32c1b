"""Checking a kernel's output against a reference: the tolerances by dtype, a sentinel-filled output buffer
(a kernel that skips an element cannot pass), and the arguments a function expects. Shared by every target's
profiling and by calibration."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from roller.errors import BuildError


# (rtol, atol) of the numerics check, by output dtype; np.testing.assert_allclose semantics.
TOLERANCE = {
    "float64": (1e-7, 1e-7), "float32": (1e-3, 1e-3), "float16": (1e-2, 1e-2), "bfloat16": (2e-2, 2e-2),
}


def _output_params(func, n_inputs: int):
    params = list(func.params)
    if len(params) <= n_inputs:
        raise BuildError(f"the function has {len(params)} parameters but {n_inputs} inputs were given: "
                         f"pass one array per input parameter, in order")
    return [(tuple(int(d) for d in p.shape), str(p.dtype)) for p in params[n_inputs:]]


def check_inputs(func, inputs: Sequence[np.ndarray]) -> tuple[tuple[int, ...], str]:
    """(shape, dtype) of ``func``'s one output; BuildError unless ``inputs`` match its input parameters."""
    outs = _output_params(func, len(inputs))
    if len(outs) != 1:
        raise BuildError(f"profile: expected one output parameter after the {len(inputs)} inputs, got {len(outs)}")
    for p, a in zip(func.params, inputs):
        want = (tuple(int(d) for d in p.shape), str(p.dtype))
        if (tuple(np.shape(a)), str(np.asarray(a).dtype)) != want:
            raise BuildError(f"profile: input {p.name} must be an array of shape {want[0]} and dtype {want[1]}, "
                             f"got shape {tuple(np.shape(a))} and dtype {np.asarray(a).dtype}")
    return outs[0]


def fill_sentinel(arr: np.ndarray) -> np.ndarray:
    """An output buffer that no correct kernel leaves unchanged (so stale results cannot pass)."""
    if np.issubdtype(arr.dtype, np.floating):
        arr.fill(np.nan)
    else:
        arr.fill(np.iinfo(arr.dtype).min if np.issubdtype(arr.dtype, np.integer) else 0)
    return arr


def scaled_atol(reference: np.ndarray, atol: float) -> float:
    """``atol`` for a reference whose largest magnitude is below 1, scaled down by it: an absolute
    tolerance of 1e-3 passed a softmax over 197 columns (outputs ~0.005) that summed 11 columns too many
    (5% off). References reaching 1 or more, all zeros, or not floating point keep ``atol``."""
    if not np.issubdtype(reference.dtype, np.floating):
        return atol
    finite = np.abs(reference[np.isfinite(reference)])
    scale = float(finite.max()) if finite.size else 0.0
    return atol * scale if 0.0 < scale < 1.0 else atol


def wrong_result(got: np.ndarray, reference: np.ndarray, rtol: float, atol: float) -> str | None:
    """Why ``got`` is not ``reference`` within the tolerances (one line), or None when it is; ``atol`` is
    scaled to a reference below 1 in magnitude (:func:`scaled_atol`)."""
    atol = scaled_atol(reference, atol)
    if np.allclose(got, reference, rtol=rtol, atol=atol, equal_nan=False):
        return None
    bad = ~np.isclose(got, reference, rtol=rtol, atol=atol)
    return (f"wrong result: {int(bad.sum())} of {bad.size} elements differ beyond rtol={rtol} "
            f"atol={atol:.3g} (max abs error {np.nanmax(np.abs(got - reference)):.3g})")
