"""The level rules of a GPU: thread tiles in registers, block tiles in shared memory, blocks over SMs.

Policy only (plain arithmetic over the Expr and the Device, no compiler). A GPU plan has two tiles
(``roller.device.GPU_LEVELS``): the thread tile, one thread's accumulators and operand fragments in
registers, and the block tile, the inputs one thread block stages in shared memory per step of its
reduction. The block tile is a whole number of thread tiles along every axis; its spatial quotient is the
block's thread count, a whole number of warps. The rules here are what differs from a CPU:

- rows of a block tile are filled from global memory in whole sectors (coalesced, transaction-aligned
  loads: the block tile's contiguous extents step in sectors of the dtype), and held in shared memory
  with one bank of padding where the row stride would put a column in few banks and the warp reads down
  columns (``storage_pad_bytes``, the CPU's cache-set rule at the level it protects; ``bank_pad_elements``);
- the output tile stays in the threads' registers across the whole reduction: it takes no shared memory
  and is written to global memory once;
- how many blocks an SM holds at once (``occupancy``: registers, shared memory, threads, blocks) and the
  waves of blocks over the SMs (``waves``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from roller.device.spec import Device
from roller.plan.expr import REDUCE, Expr, TensorAccess
from roller.plan.rtile import LevelRules, ceil_div, round_up, tensor_footprint


@dataclass(frozen=True)
class GpuLevelRules(LevelRules):
    """LevelRules for a GPU's level ``index`` (0: a thread's registers, 1: a block's shared memory).

    Threads compute scalars (``lanes`` 1, no vector axis): warp alignment is a rule on the block's thread
    count (``warp_aligned``), not on a tile's extent. ``output`` names the output tensor, which the
    block level holds in registers, not shared memory."""

    output: str = ""
    column_read: frozenset[str] = frozenset()  # inputs whose tiles a warp reads down columns (bank_pad_elements)

    @classmethod
    def of(cls, device: Device, index: int, expr: Expr, vector_axis: str | None = None) -> "GpuLevelRules":
        # the threads of a warp differ in spatial axes: a tile whose rows run along reduction axes only is
        # read down its columns
        columns = frozenset(t.name for t in expr.inputs
                            if not any(expr.axis(a).kind != REDUCE for a in t.innermost_axes()))
        return cls(index, device.private_levels[index], 1, None, None, output=expr.output.name, column_read=columns)

    def row_bytes(self, t: TensorAccess, inner: int, moved: bool = False) -> int:
        """Bytes one row of a tensor tile takes (or, ``moved``, transfers) at this level.

        Registers hold and move elements. In shared memory an input row is held with its bank padding and
        moved in whole sectors; the output row takes no shared memory and is written in whole sectors."""
        raw = inner * t.elem_bytes
        if self.index == 0:
            return raw
        if moved:
            return round_up(raw, self.level.transaction_bytes)
        if t.name == self.output:
            return 0
        held = round_up(raw, self.level.bank_bytes or 1)
        return held + (self.storage_pad_bytes(held) if t.name in self.column_read else 0)


def bank_pad_elements(t: TensorAccess, block: Mapping[str, int], rules: GpuLevelRules) -> int:
    """Elements of padding per row of input ``t``'s block tile in shared memory (the bank rule).

    Only a tile whose rows run along reduction axes is padded: the threads of a warp differ in spatial
    axes, so they read such a tile down a column (A[m, k] in a matmul), where a row stride sharing a factor
    with the banks conflicts. A tile whose rows run along a spatial axis is read along its rows, where
    padding changes nothing (and would break the alignment of its vector copies)."""
    region = t.region(block)
    if len(region) < 2 or t.name not in rules.column_read:  # a single row, or read along its rows
        return 0
    raw = round_up(region[-1] * t.elem_bytes, rules.level.bank_bytes or 1)
    return rules.storage_pad_bytes(raw) // t.elem_bytes


def threads_per_block(expr: Expr, thread: Mapping[str, int], block: Mapping[str, int]) -> int:
    """Threads of a block: how many thread tiles its spatial extent holds (the reduction is each thread's)."""
    return math.prod(ceil_div(block[a.name], thread[a.name]) for a in expr.axes if a.kind != REDUCE)


VIRTUAL_THREAD_AXES = 3  # TVM binds vthread.x, .y, .z


def interleaved_axes(expr: Expr, thread: Mapping[str, int]) -> tuple[str, ...]:
    """The spatial axes along which a thread's tile is strided by the block's threads rather than contiguous
    (the innermost VIRTUAL_THREAD_AXES with a thread tile over 1, in axis order): then the threads of a warp
    store neighbouring output elements (coalesced) and read neighbouring words of a shared row (distinct
    banks) instead of elements a thread tile apart."""
    axes = [a.name for a in expr.axes if a.kind != REDUCE and thread[a.name] > 1]
    return tuple(axes[-VIRTUAL_THREAD_AXES:])


def warp_aligned(threads: int, device: Device) -> bool:
    """Whether a block of ``threads`` fills whole warps within the per-block limit."""
    warp = device.units.warp_threads or 1
    return threads % warp == 0 and threads <= device.gpu.max_threads_per_block


# The register estimate, fitted to ptxas (sm_80) on roller's own kernels for 4096^3 matmul plans with
# reduction steps of at most 32 (interleaved thread tiles; docs/design-notes.md#rules-register_estimate).
# nvcc unrolls the step and keeps about FRAGMENT_STEPS steps of operand fragments in flight beside the
# accumulators; REGISTER_OVERHEAD covers indices and addresses. A longer step uses more (208 for an 8x8 tile
# with a 64-long step): the build checks ptxas's count (roller.targets.cuda.schedule.resource_problems).
FRAGMENT_STEPS = 2
REGISTER_OVERHEAD = 8


def thread_registers(expr: Expr, thread: Mapping[str, int]) -> int:
    """32-bit registers one thread needs for its tile: the accumulators, FRAGMENT_STEPS operand fragments per
    input, and REGISTER_OVERHEAD; the model's estimate (ptxas gives the real count once compiled)."""
    words = {t.name: ceil_div(math.prod(t.region(thread)) * t.elem_bytes, 4) for t in expr.tensors}
    fragments = sum(words[t.name] for t in expr.inputs)
    return words[expr.output.name] + FRAGMENT_STEPS * fragments + REGISTER_OVERHEAD


SHARED_ALIGN_BYTES = 64  # TVM's code generators align every shared-memory buffer to 64 B (alignas(64))


def shared_bytes(expr: Expr, block: Mapping[str, int], device: Device) -> int:
    """Bytes of shared memory one block holds: its inputs' tiles with their bank padding, laid out in input
    order with each buffer starting SHARED_ALIGN_BYTES-aligned, as the generated code allocates them."""
    rules = GpuLevelRules.of(device, 1, expr)
    end = 0
    for t in expr.inputs:
        end = round_up(end, SHARED_ALIGN_BYTES) + tensor_footprint(t, block, rules)
    return end


@dataclass(frozen=True)
class Occupancy:
    """How many blocks of one kernel an SM holds at once, and which resource stops it holding more
    (``registers``, ``shared``, ``threads`` or ``blocks``); 0 blocks when one block does not fit."""

    blocks_per_sm: int
    warps_per_sm: int
    limited_by: str

    def to_dict(self) -> dict:
        return {"blocks_per_sm": self.blocks_per_sm, "warps_per_sm": self.warps_per_sm,
                "limited_by": self.limited_by}


def occupancy(device: Device, threads: int, registers: int, shared: int) -> Occupancy:
    """Blocks per SM for blocks of ``threads`` threads using ``registers`` per thread and ``shared`` bytes,
    as CUDA's occupancy calculator counts them: registers are allocated per warp in units of
    ``register_allocation_unit``; a block over any per-block limit gets 0."""
    g, warp = device.gpu, device.units.warp_threads
    warps = ceil_div(threads, warp)
    if (threads > g.max_threads_per_block or registers > g.max_registers_per_thread
            or shared > g.shared_per_block_optin):
        return Occupancy(0, 0, "threads" if threads > g.max_threads_per_block else
                         "registers" if registers > g.max_registers_per_thread else "shared")
    per_warp = round_up(registers * warp, g.register_allocation_unit)
    limits = {
        "registers": (g.registers_per_sm // per_warp) // warps,
        "shared": g.shared_per_sm // shared if shared else g.max_blocks_per_sm,
        "threads": g.max_warps_per_sm(warp) // warps,
        "blocks": g.max_blocks_per_sm,
    }
    limited_by = min(limits, key=lambda k: (limits[k], k != "blocks"))
    blocks = limits[limited_by]
    return Occupancy(blocks, blocks * warps, limited_by)


def waves(blocks: int, device: Device, blocks_per_sm: int) -> int:
    """Rounds of blocks the SMs run: each SM holds ``blocks_per_sm`` at once."""
    return ceil_div(blocks, device.units.count * max(1, blocks_per_sm))


def copy_lanes(t: TensorAccess, block: Mapping[str, int], pad: int = 0, max_bytes: int = 16) -> int:
    """Elements each thread moves per load in the cooperative copy of input ``t``'s block tile into shared
    memory: the widest vector (up to ``max_bytes``, CUDA's 128-bit loads) that divides the tile's row, the
    tensor's row and the padded row in shared memory (``pad`` elements), so that every vector access is
    aligned in global and in shared memory. A tile whose row is not indexed by one plain axis (a window)
    copies scalars."""
    region = t.region(block)
    if not region or len(t.index[-1]) != 1 or t.index[-1][0][1] != 1:
        return 1
    inner, row = region[-1], t.shape[-1]
    lanes = max(1, max_bytes // t.elem_bytes)
    while lanes > 1 and (inner % lanes or row % lanes or (inner + pad) % lanes):
        lanes //= 2
    return lanes
