"""Target families, one package each (``cpu``, ``cuda``): the only place that knows which kinds of device
exist. ``target_of(device)`` returns the family's :class:`Target`; a new family is a new package with a
``TARGET`` and one line here."""
from __future__ import annotations

from roller.errors import BuildError
from roller.targets import cpu, cuda
from roller.targets.base import Target

TARGETS: dict[str, Target] = {t.kind: t for t in (cpu.TARGET, cuda.TARGET)}


def target_of(device) -> Target:
    """The target family that builds for ``device`` (by its spec's ``kind``)."""
    try:
        return TARGETS[device.kind]
    except KeyError:
        raise BuildError(f"device {device.name!r} is of kind {device.kind!r}: roller generates code for "
                         f"{', '.join(TARGETS)} only") from None


def construct(expr, device, topk: int = 10, constants: frozenset[str] = frozenset()):
    """The ranked top-``topk`` plans for ``expr`` on ``device`` by its target family's rules (policy only)."""
    return target_of(device).construct(expr, device, topk, constants)


def schedule(func, expr, program, device, notes: list[str] | None = None):
    """The ``tvm.s_tir.Schedule`` of ``func`` that follows ``program`` on ``device`` (its target family's code
    generator); schedule steps that did not apply are appended to ``notes``."""
    return target_of(device).schedule(func, expr, program, device, notes)


def build(func, expr, program, device, notes: list[str] | None = None):
    """Schedules ``func`` by ``program`` for ``device`` and compiles it; returns the ``tvm.compile`` Executable
    (``ex["main"]``, ``ex.mod``). Sets TVM's thread count to the device's cores first (before its pool starts)."""
    from roller.tir.compile import compile_for, set_threads, target_for

    set_threads(device.units.count)
    sch = schedule(func, expr, program, device, notes)
    return compile_for(sch.mod, target_for(device))


__all__ = ["TARGETS", "Target", "build", "construct", "schedule", "target_of"]
