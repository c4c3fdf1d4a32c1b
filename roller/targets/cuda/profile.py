"""Top-K profiling of GPU plans on a ``roller.targets.cuda.runtime`` runtime: each candidate's output checked against
numpy, the verified ones timed with ``roller.builder.farm.time_finalists`` (screen, then alternated finalists), as
the CPU's profiling does. On TVM's CUDA runtime the timings rank the plans; on the OpenCL twin (the tests,
PoCL on a CPU) the same code runs, but the timings are the CPU's and say nothing about a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from roller.measure.verify import TOLERANCE, fill_sentinel, wrong_result
from roller.measure.finalists import time_finalists


@dataclass
class GpuTiming:
    """One candidate on the runtime: whether its output matched numpy (``error`` says how it did not) and its
    seconds a call (None when not verified)."""

    verified: bool
    error: str | None
    measured_seconds: float | None = None
    chosen: bool = False  # the candidate the timing chose (roller.builder.farm.time_finalists)


def profile_gpu(modules: Mapping[int, object], runtime, names: Sequence[str], inputs: Sequence[np.ndarray],
                reference: np.ndarray, rtol: float | None = None, atol: float | None = None) -> dict[int, GpuTiming]:
    """Runs each scheduled IRModule of ``modules`` (candidate index -> module) on ``runtime`` with ``inputs``
    (the function's input parameters, in order; ``names`` are all its parameters, the output last), checks the
    output against ``reference`` and times the verified ones. Tolerances default to ``profile.TOLERANCE``."""
    rt, at = TOLERANCE.get(str(reference.dtype), (0.0, 0.0))
    rtol, atol = (rt if rtol is None else rtol), (at if atol is None else atol)
    out = names[-1]
    arrays = dict(zip(names, inputs))
    out_init = fill_sentinel(np.empty(reference.shape, reference.dtype))  # a kernel that skips an element fails
    results: dict[int, GpuTiming] = {}
    timers = {}
    for i, mod in modules.items():
        kernel = runtime.compile(mod)
        got = runtime.run(kernel, {**arrays, out: out_init}, (out,))[out]
        error = wrong_result(got, reference, rtol, atol)
        results[i] = GpuTiming(verified=error is None, error=error)
        if error is None:
            timers[i] = runtime.timer(kernel, {**arrays, out: out_init})
    timing = time_finalists(timers)
    for i, seconds in timing.seconds.items():
        results[i].measured_seconds = seconds
    if timers:
        results[timing.best].chosen = True
    return results
