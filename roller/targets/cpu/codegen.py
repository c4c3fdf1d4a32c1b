"""CPU code generation: an RProgram becomes a TVM schedule (padding to whole tiles where the plan pads, the
register and cache tiles, load balancing of the parallel grid where the plan is worth it)."""
from __future__ import annotations

from roller.device.spec import Device
from roller.plan.expr import Expr
from roller.plan.rprogram import RProgram


def schedule(func, expr: Expr, program: RProgram, device: Device, notes: list[str] | None = None):
    """The ``tvm.s_tir.Schedule`` of ``func`` that follows ``program`` on ``device``.

    Where the plan pads (``program.padded``), the main block is first padded to whole tiles
    (``padding.pad_to_tiles``): the schedule then computes zero-padded copies of the inputs and crops
    the output instead of predicating the inner loops. Each core walks its own share of the parallel grid and
    steals from the others' when done (``balance.balance_grid``) where the plan is compute-bound and
    predicted to run long enough for it to pay (``balance.worth_balancing``). Optional steps that did not apply are appended
    to ``notes``.
    """
    from roller.plan.rtile import compute_lanes
    from roller.targets.cpu.balance import balance_grid, worth_balancing
    from roller.targets.cpu.schedule import schedule_cpu
    from roller.targets.cpu.padding import pad_to_tiles
    from roller.tir.tirtree import with_main

    root = frozenset()
    if program.padded:
        padded = pad_to_tiles(func, expr, program, compute_lanes(expr, device))
        func, expr, program, root = padded.func, padded.expr, padded.program, padded.root_copies
    sch = schedule_cpu(func, expr, program, device, root, notes)
    if not worth_balancing(expr, program, device):
        return sch
    return with_main(sch, balance_grid(sch.mod["main"], device.units.count))
