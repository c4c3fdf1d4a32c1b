"""Where an operator's data lives between calls, and at what bandwidth it arrives from there: the share
the units' private caches still hold (``resident_share``), the shared level that holds the rest, and the
split of a shared level's bandwidth between the active units; with it, whether an operator is memory-bound
and what a compute-bound kernel loses to its slowest unit."""
from __future__ import annotations

import math

from roller.device.spec import Device, MemoryLevel
from roller.plan.expr import Expr


# device.model.resident_full (the spec's model: section; docs/cost-constants.md): The share of an operator's bytes
# the units' outermost private caches still hold at its next call falls from all to none as its bytes grow from
# device.model.resident_full to device.model.resident_none times those caches' capacity (all units' together); the rest comes from the first
# shared level that holds it all.


def tensor_bytes(expr: Expr) -> int:
    """Bytes of all the operator's tensors (inputs and output)."""
    return sum(math.prod(t.shape) * t.elem_bytes for t in expr.tensors)


def memory_bound(expr: Expr, device: Device) -> bool:
    """Whether the operator does fewer flops per byte of its tensors than the device's cores can per byte
    from where its data lives between calls (:func:`source_bandwidth`)."""
    peak = device.units.peak(expr.compute_dtype) * device.units.count
    return expr.flops / tensor_bytes(expr) < peak / source_bandwidth(expr, device)


# device.model.balance_min_seconds (the spec's model: section; docs/cost-constants.md): Kernels predicted shorter
# than this keep TVM's fixed split of the parallel grid (codegen/balance.py): a take of the balanced grid costs tens
# of nanoseconds, and its lock's cache line moves between the cores.


def balances(expr: Expr, seconds: float, device: Device) -> bool:
    """Whether the kernel of a plan predicted to run ``seconds`` (before ``imbalance_seconds``) balances its
    grid across the units (codegen/balance.py): compute-bound operators predicted at least
    device.model.balance_min_seconds. Memory-bound ones keep the fixed split, their time being their data's."""
    return seconds >= device.model.balance_min_seconds and not memory_bound(expr, device)


def imbalance_seconds(expr: Expr, tile_seconds: float, waves: int, device: Device, balanced: bool) -> float:
    """Seconds a compute-bound kernel waits for its slowest unit (``units.speed_spread``): a fixed split
    waits for that unit's whole share, ``waves`` top tiles; a balanced grid (the plan's ``balanced``, decided
    by ``choices.balanced_grid`` from ``balances``) for about one tile, the others stealing the rest of its
    share (docs/design-notes.md#residency-imbalance_seconds). Memory-bound kernels are not charged: a core slowed
    by a co-tenant on its host core loses issue slots, not its share of the bandwidth (not measured; they
    keep the fixed split either way, so the charge would only scale every plan of theirs alike)."""
    spread = device.units.speed_spread
    if not spread:
        return 0.0
    if balanced:
        return spread * tile_seconds
    return 0.0 if memory_bound(expr, device) else spread * tile_seconds * waves


def private_fill(expr: Expr, device: Device) -> float:
    """The operator's bytes over all the units' outermost private caches together (0 without any)."""
    private = device.private_levels
    return tensor_bytes(expr) / (private[-1].capacity_bytes * device.units.count) if private else 0.0


def resident_share(expr: Expr, device: Device) -> float:
    """The share of the operator's bytes a CPU's units find in their outermost private caches at its next
    call (a kernel called again on the same tensors, or on the output of the one before finds them there:
    400 KB of rows summed at 141 GB/s, more than twice the 60 GB/s of the shared L3), from 1 up to
    device.model.resident_full of those caches' capacity down to 0 from device.model.resident_none; 0 where the private levels are
    scratchpads that keep nothing between calls (``MemoryLevel.keeps_data``)."""
    if not device.private_levels or not device.private_levels[-1].keeps_data:
        return 0.0
    return min(1.0, max(0.0, (device.model.resident_none - private_fill(expr, device)) / (device.model.resident_none - device.model.resident_full)))


def shared_source(expr: Expr, device: Device) -> MemoryLevel:
    """The first shared level whose usable capacity holds all the operator's tensors (else the last)."""
    total = tensor_bytes(expr)
    shared = device.shared_levels
    return next((lv for lv in shared if total <= lv.usable_bytes), shared[-1])


def data_source(expr: Expr, device: Device) -> MemoryLevel:
    """The level most of the operator's data lives in between calls: the units' outermost private cache
    while it holds at least half of it (:func:`resident_share`), else :func:`shared_source`."""
    return device.private_levels[-1] if resident_share(expr, device) >= 0.5 else shared_source(expr, device)


def source_bandwidth(expr: Expr, device: Device, units: int | None = None) -> float:
    """GB/s the operator's data arrives at from where it lives between calls: what each of ``units``
    active units draws (None: all the units together), the private caches' share of the bytes
    (:func:`resident_share`) at their bandwidth and the rest at :func:`shared_source`'s."""
    def bandwidth(level: MemoryLevel) -> float:
        return level.total_bandwidth_gbps if units is None else unit_bandwidth(level, units)

    share, shared = resident_share(expr, device), shared_source(expr, device)
    if share <= 0:
        return bandwidth(shared)
    return 1.0 / (share / bandwidth(device.private_levels[-1]) + (1.0 - share) / bandwidth(shared))


def unit_bandwidth(level: MemoryLevel, units: int) -> float:
    """GB/s one of ``units`` active units draws from ``level`` (a shared level's total split between them)."""
    if level.shared:
        return min(level.bandwidth_gbps, level.total_bandwidth_gbps / units)
    return level.bandwidth_gbps
