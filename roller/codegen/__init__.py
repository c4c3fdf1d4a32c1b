"""Code generation: an RProgram becomes a TVM schedule, then a compiled kernel.

One module per device kind (``cpu``, ``cuda`` for GPUs, with its ``opencl`` twin); nothing target-specific
leaks into the policy.
"""
from __future__ import annotations

from ..device import Device
from ..errors import BuildError
from ..expr import Expr
from ..rprogram import RProgram

KINDS = ("cpu", "gpu")


def schedule(func, expr: Expr, program: RProgram, device: Device, notes: list[str] | None = None):
    """The ``tvm.s_tir.Schedule`` of ``func`` that follows ``program`` on ``device``.

    Where the plan pads (``program.padded``), the main block is first padded to whole tiles
    (``padding.pad_to_tiles``): the schedule then computes zero-padded copies of the inputs and crops
    the output instead of predicating the inner loops. Each core walks its own share of the parallel grid and
    steals from the others' when done (``balance.balance_grid``) where the plan is compute-bound and
    predicted to run long enough for it to pay (``balance.worth_balancing``). Optional steps that did not apply are appended
    to ``notes``.
    """
    if device.kind == "cpu":
        from ..rtile import compute_lanes
        from .balance import balance_grid, worth_balancing
        from .cpu import schedule_cpu
        from .padding import pad_to_tiles
        from .tirtree import with_main

        root = frozenset()
        if program.padded:
            padded = pad_to_tiles(func, expr, program, compute_lanes(expr, device))
            func, expr, program, root = padded.func, padded.expr, padded.program, padded.root_copies
        sch = schedule_cpu(func, expr, program, device, root, notes)
        if not worth_balancing(expr, program, device):
            return sch
        return with_main(sch, balance_grid(sch.mod["main"], device.units.count))
    if device.kind == "gpu":
        from .cuda import schedule_cuda
        return schedule_cuda(func, expr, program, device, notes)
    raise BuildError(f"device {device.name!r} is of kind {device.kind!r}: roller generates code for "
                     f"{', '.join(KINDS)} only; use a CPU device spec")


def build(func, expr: Expr, program: RProgram, device: Device, notes: list[str] | None = None):
    """Schedules and compiles ``func``; returns the ``tvm.compile`` Executable (``ex["main"]``, ``ex.mod``).

    Also sets TVM's thread count to the device's cores (before the runtime's pool starts).
    """
    from ..tvmutil import compile_for, set_threads, target_for

    set_threads(device.units.count)
    sch = schedule(func, expr, program, device, notes)
    return compile_for(sch.mod, target_for(device))
