"""Code generation: an RProgram becomes a TVM schedule, then a compiled kernel.

One module per device kind (``cpu``); nothing target-specific leaks into the policy.
"""
from __future__ import annotations

from ..device import Device
from ..errors import BuildError
from ..expr import Expr
from ..rprogram import RProgram

KINDS = ("cpu",)


def schedule(func, expr: Expr, program: RProgram, device: Device):
    """The ``tvm.s_tir.Schedule`` of ``func`` that follows ``program`` on ``device``.

    Where a top tile overhangs an axis, the main block is first padded to whole tiles
    (``padding.pad_to_tiles``): the schedule then computes zero-padded copies of the inputs and crops
    the output instead of predicating the inner loops. Functions it cannot pad keep the predicates.
    """
    if device.kind == "cpu":
        from .cpu import schedule_cpu
        from .padding import pad_to_tiles

        padded = pad_to_tiles(func, expr, program)
        if padded is not None:
            func, expr, program = padded.func, padded.expr, padded.program
        return schedule_cpu(func, expr, program, device)
    raise BuildError(f"device {device.name!r} is of kind {device.kind!r}: roller generates code for "
                     f"{', '.join(KINDS)} only; use a CPU device spec")


def build(func, expr: Expr, program: RProgram, device: Device):
    """Schedules and compiles ``func``; returns the ``tvm.compile`` Executable (``ex["main"]``, ``ex.mod``).

    Also sets TVM's thread count to the device's cores (before the runtime's pool starts).
    """
    import tvm

    from ..tvmutil import set_threads, target_for

    set_threads(device.units.count)
    sch = schedule(func, expr, program, device)
    return tvm.compile(sch.mod, target_for(device))
