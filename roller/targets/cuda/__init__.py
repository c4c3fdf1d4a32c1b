"""The NVIDIA GPU target: level rules, cost model and construction for thread and block tiles, CUDA code
generation with its OpenCL twin, the offline toolchain, runtimes and calibration microbenchmarks."""
from __future__ import annotations

from roller.targets.base import Target


def _construct(expr, device, topk: int = 10, constants: frozenset[str] = frozenset()):
    from roller.plan.construct import construct
    from roller.targets.cuda import construct as rules

    return construct(expr, device, topk, constants, rules=rules)


def _schedule(func, expr, program, device, notes=None):
    from roller.targets.cuda.schedule import schedule_cuda

    return schedule_cuda(func, expr, program, device, notes)


def _calibrate(device, quick: bool = False, progress: bool = True) -> dict:
    from roller.targets.cuda.microbench import calibrate_gpu

    return calibrate_gpu(device, quick=quick)


def _build_offline(func, expr, device, topk: int, labels, check, profile: bool):
    from roller.targets.cuda.build import build_offline

    return build_offline(func, expr, device, topk, labels, check, profile)


TARGET = Target(kind="gpu", construct=_construct, schedule=_schedule, calibrate=_calibrate,
                build_offline=_build_offline)
