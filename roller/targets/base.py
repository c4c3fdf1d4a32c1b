"""What a target family gives the layers above it: one object per family, found by the device's kind."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Target:
    """One target family.

    - ``kind``: the device kind it serves (a spec's ``kind``).
    - ``construct(expr, device, topk, constants)``: the ranked plans (a ``roller.plan.construct.Construction``).
    - ``schedule(func, expr, program, device, notes)``: the ``tvm.s_tir.Schedule`` that executes a plan.
    - ``calibrate(device, quick, progress)``: the device's calibration dict, measured by its microbenchmarks.
    - ``build_offline``: None where kernels are built, checked and timed here (the builder's worker farm);
      otherwise ``(func, expr, device, topk, labels, check, profile) -> result``, the family's own build path
      (a GPU's plans compiled offline, checked against its limits, timed only where the GPU is present).
    """

    kind: str
    construct: Callable[..., Any]
    schedule: Callable[..., Any]
    calibrate: Callable[..., dict]
    build_offline: Callable[..., Any] | None = None

    @property
    def offline(self) -> bool:
        """Whether this family's kernels are compiled offline (nothing is timed without the device)."""
        return self.build_offline is not None
