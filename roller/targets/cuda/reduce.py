"""Block-level reductions on a GPU: the threads of a block share rows, for operators whose rows are long and few.

The GPU's default plan (``roller.targets.cuda.construct``) gives each thread whole output elements and runs their
reductions serially; a row sum over 100 rows of 3001 then has 100 threads in all, on a few SMs. Here a block
is ``S`` rows (along the innermost spatial axis) by ``R`` threads (whole warps) along the reduction: each
thread sums a strided share of its row in a register (``R`` threads read ``R`` neighbouring elements at each
step: coalesced), then the ``R`` partial sums are combined across threads (warp shuffles, and shared memory
between warps: TVM lowers a reduction loop bound to ``threadIdx.x`` so) and one thread writes the result.

Policy only (plain arithmetic). Offered where:

- there is one reduction axis and it is the contiguous axis of every input that it indexes (else the threads
  of a warp would read down a column: uncoalesced);
- rows are few: the output has fewer elements than the GPU holds resident threads, so the per-element plans
  cannot fill it;
- rows are long: at least two warps' worth of elements.

A plan's tiles: thread tile 1 along every axis; block tile ``S`` along the innermost spatial axis with an
extent over 1 (1 along the others) and ``R`` along the reduction (a step of the block: ``R`` elements, one a
thread); the plan's ``GpuPlan`` of kind ``BLOCK_REDUCTION`` with ``BlockReduction(threads=R, rows=S)`` tells code
generation to bind the reduction to the threads.
Inputs are not staged in shared memory (each element is read once). The model: the block's global traffic at
its SM's share of the bandwidth, as far as its resident warps keep enough loads in flight to hide the latency
(``load_efficiency``), its flops at the SM's rate, plus the cross-thread combine (a shuffle step per halving
of ``R``, and a barrier where ``R`` spans several warps).
"""
from __future__ import annotations

import math
from typing import Mapping

from roller.device.spec import Device
from roller.plan.expr import REDUCE, Expr
from roller.plan.gpuplan import BlockReduction
from roller.targets.cuda.cost import GpuEstimate, latency_efficiency
from roller.targets.cuda.rules import GpuLevelRules, SHARED_ALIGN_BYTES, occupancy, waves
from roller.plan.cost import Estimate, cycle_seconds, data_source
from roller.plan.rtile import ceil_div, round_up, tile_counts, traffic

MAX_ROWS_PER_BLOCK = 8  # rows a block takes at most (S): more leaves too few blocks for few rows
# The model's figures from the spec's ``model:`` section (hwspecs/families/gpu.yaml): shuffle_cycles (one
# dependent step of the cross-thread combine), reduce_registers (a thread's registers: ptxas reported 16-24
# on sm_80; tests/test_gpu_reduce.py checks the build with ptxas's count), and for latency hiding (Little's
# law: an SM streams at its share of the bandwidth only with bandwidth x latency in flight) loads_in_flight
# (a thread's strided loads in flight) and l2_latency_cycles / dram_latency_cycles.


def reduce_axis(expr: Expr, device: Device) -> str | None:
    """The reduction axis a block-level reduction would spread over threads, or None where it is not offered
    (see module doc)."""
    reduces = [a for a in expr.axes if a.kind == REDUCE]
    if len(reduces) != 1 or device.gpu is None:
        return None
    r = reduces[0]
    for t in expr.inputs:
        if r.name in t.axes and (r.name not in t.innermost_axes() or len(t.index[-1]) != 1):
            return None
    warp = device.units.warp_threads
    resident = device.units.count * device.gpu.max_threads_per_sm
    if math.prod(expr.output.shape) >= resident or r.extent < 2 * warp:
        return None
    return r.name


def _row_axis(expr: Expr) -> str | None:
    """The spatial axis a block's rows run along: the innermost one with an extent over 1."""
    spatial = [a for a in expr.axes if a.kind != REDUCE and a.extent > 1]
    return spatial[-1].name if spatial else None


def block_reduction_tiles(expr: Expr, device: Device) -> list[tuple[dict[str, int], dict[str, int], BlockReduction]]:
    """(thread tile, block tile, its BlockReduction(R, S)) of every block-level reduction plan offered: R whole
    warps up to the row's length and the block's thread limit, S rows a block in powers of two (see module doc)."""
    r = reduce_axis(expr, device)
    if r is None:
        return []
    warp, limit = device.units.warp_threads, device.gpu.max_threads_per_block
    row = _row_axis(expr)
    rows_max = min(MAX_ROWS_PER_BLOCK, expr.axis(row).extent) if row else 1
    thread = {a.name: 1 for a in expr.axes}
    out = []
    R = warp
    while R <= min(limit, round_up(expr.axis(r).extent, warp)):
        S = 1
        while S <= rows_max and S * R <= limit:
            block = {**thread, r: R, **({row: S} if row else {})}
            out.append((thread, block, BlockReduction(threads=R, rows=S)))
            S *= 2
        R *= 2
    return out


def reduction_shared_bytes(rows: int, reduce_threads: int, device: Device) -> int:
    """Shared memory of the cross-thread combine: one word per warp per row (staging) and one per row (the
    result), each buffer SHARED_ALIGN_BYTES-aligned, as TVM's allreduce lowering allocates them."""
    warps = ceil_div(reduce_threads, device.units.warp_threads)
    if warps == 1:  # a single warp combines by shuffles alone, and still publishes each row's result
        return round_up(4 * rows, SHARED_ALIGN_BYTES)
    return round_up(4 * rows * warps, SHARED_ALIGN_BYTES) + round_up(4 * rows, SHARED_ALIGN_BYTES)


def load_efficiency(expr: Expr, source, warps: int, bandwidth: float, device: Device) -> float:
    """Share of ``bandwidth`` (bytes/s, one SM's) that ``warps`` resident warps reach: the bytes they have
    in flight (a warp's ``model.loads_in_flight`` loads of one element a thread) over bandwidth x latency."""
    cycles = device.model.dram_latency_cycles if source is device.levels[-1] else device.model.l2_latency_cycles
    latency = cycles * cycle_seconds(device)
    elem = min(t.elem_bytes for t in expr.inputs)
    in_flight = warps * device.units.warp_threads * elem * device.model.loads_in_flight
    return min(1.0, in_flight / (bandwidth * latency))


def estimate_block_reduction(expr: Expr, thread: Mapping[str, int], block: Mapping[str, int],
                             shape: BlockReduction, device: Device) -> GpuEstimate:
    """The model's prediction for a block-level reduction plan (see module doc)."""
    levels = device.private_levels
    rows, reduce_threads = shape.rows, shape.threads
    if rows != math.prod(block[a.name] for a in expr.axes if a.kind != REDUCE):
        raise ValueError(f"{expr.name}: a block-reduction of {rows} rows a block, but the block tile {dict(block)} "
                         f"has {math.prod(block[a.name] for a in expr.axes if a.kind != REDUCE)}")
    threads = rows * reduce_threads
    smem = reduction_shared_bytes(rows, reduce_threads, device)
    occ = occupancy(device, threads, device.model.reduce_registers, smem)
    total, blocks = tile_counts(expr, block)
    per_sm = ceil_div(blocks, device.units.count)
    sms = min(device.units.count, blocks)
    resident = max(1, min(occ.blocks_per_sm, per_sm)) * ceil_div(threads, device.units.warp_threads)
    rate = device.units.peak(expr.dtype) * 1e9 * latency_efficiency(resident, device)
    padded_points = math.prod(round_up(a.extent, block[a.name]) for a in expr.axes)
    compute = padded_points * expr.flops_per_point / blocks / rate
    q_global = traffic(expr, block, GpuLevelRules.of(device, 1, expr))  # every element once, in sectors
    source = data_source(expr, device)
    global_bw = min(source.bandwidth_gbps, source.total_bandwidth_gbps / sms) * 1e9
    mem = q_global / blocks / (global_bw * load_efficiency(expr, source, resident, global_bw, device))
    combine = math.ceil(math.log2(reduce_threads)) * device.model.shuffle_cycles
    if reduce_threads > device.units.warp_threads:
        combine += device.model.sync_cycles
    per_block = max(compute, mem) + combine * cycle_seconds(device)
    seconds = per_block * per_sm + device.model.launch_seconds if occ.blocks_per_sm else math.inf
    est = Estimate(seconds=seconds, compute_seconds=compute * per_sm,
                   memory_seconds={levels[0].name: 0.0, levels[1].name: mem * per_sm},
                   traffic_bytes={levels[0].name: 0, levels[1].name: q_global},
                   footprint_bytes={levels[0].name: 4, levels[1].name: smem},
                   tiles=blocks, units=sms, waves=waves(blocks, device, occ.blocks_per_sm))
    return GpuEstimate(est, threads, device.model.reduce_registers, smem, occ, total // blocks)
