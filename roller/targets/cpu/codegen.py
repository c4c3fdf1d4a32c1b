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
    steals from the others' when done (``balance.balance_grid``) where the plan says so (``program.balanced``).
    Optional steps that did not apply are appended to ``notes``; a choice of the plan the code cannot follow
    raises BuildError (or TVM's ScheduleError).
    """
    from roller.plan.rtile import compute_lanes
    from roller.errors import BuildError
    from roller.targets.cpu.balance import balance_grid
    from roller.targets.cpu.schedule import schedule_cpu
    from roller.targets.cpu.padding import pad_to_tiles
    from roller.tir.tirtree import with_main

    root = frozenset()
    if program.padded:
        padded = pad_to_tiles(func, expr, program, compute_lanes(expr, device))
        func, expr, program, root = padded.func, padded.expr, padded.program, padded.root_copies
    sch = schedule_cpu(func, expr, program, device, root, notes)
    if not program.balanced:
        return sch
    func = sch.mod["main"]
    balanced = balance_grid(func, device.units.count)
    if balanced.same_as(func):
        raise BuildError(f"{expr.name}: the plan balances its parallel grid, but the kernel has no parallel loop of "
                         f"more than {device.units.count} iterations without a partition hint to balance")
    return with_main(sch, balanced)
