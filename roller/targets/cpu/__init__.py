"""The CPU target (x86 with SIMD): plans from the plan layer's cache-hierarchy rules, code generation with TVM
schedule primitives, LLVM builds, calibration microbenchmarks."""
from __future__ import annotations

from roller.targets.base import Target


def _construct(expr, device, topk: int = 10, constants: frozenset[str] = frozenset()):
    from roller.plan.construct import construct

    return construct(expr, device, topk, constants)


def _schedule(func, expr, program, device, notes=None):
    from roller.targets.cpu.codegen import schedule

    return schedule(func, expr, program, device, notes)


def _calibrate(device, quick: bool = False, progress: bool = True) -> dict:
    from roller.targets.cpu.calibrate import run_calibration

    return run_calibration(device, quick=quick, progress=progress)


TARGET = Target(kind="cpu", construct=_construct, schedule=_schedule, calibrate=_calibrate)
