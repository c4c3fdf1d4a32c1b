"""The micro performance model on a GPU: the paper's memory time per level and compute time, per block,
with the blocks spread over the SMs.

A plan has a thread tile (registers) and a block tile (shared memory, ``roller.targets.cuda.rules``). One block
costs max(compute, shared-memory time, global-memory time) at its SM's rates, plus a barrier pair per
step of its reduction: its flops at the SM's peak, the operands its threads read from shared memory
(the traffic into registers) at the SM's 32 banks x 4 B per clock, and the sectors it moves from global
memory (the traffic into shared memory, its output written once) at the SM's share of the bandwidth of
the level the operator's data lives in (L2 when it fits, else DRAM). The busiest SM runs
ceil(blocks / SMs) blocks; an SM whose resident warps are too few to hide latency (``latency_efficiency``)
runs them slower. A fixed launch cost is added per kernel.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from roller.device.spec import Device
from roller.plan.expr import Expr
from roller.plan.gpuplan import BlockModel
from roller.targets.cuda.rules import (GpuLevelRules, Occupancy, occupancy, shared_bytes, thread_registers,
                                       threads_per_block, waves)
from roller.plan.cost import Estimate, cycle_seconds, data_source
from roller.plan.rtile import ceil_div, footprint, round_up, tile_counts, traffic

# The model's assumed figures (no GPU measured them yet) come from the spec's ``model:`` section
# (hwspecs/families/gpu.yaml): device.model.warps_for_peak (resident warps an SM needs to keep its pipes
# busy), sync_cycles (one reduction step's two barriers) and launch_seconds (a kernel launch's fixed cost).


@dataclass(frozen=True)
class GpuEstimate:
    """The model's prediction for one GPU plan: the common Estimate, and the block's resources as the
    model sees them (threads, registers per thread estimated from the thread tile, shared bytes, occupancy)."""

    estimate: Estimate
    threads: int
    registers: int
    shared_bytes: int
    occupancy: Occupancy
    reduction_steps: int

    def block_model(self) -> BlockModel:
        """The block as the model sees it, as the plan records it (``GpuPlan.model``)."""
        return BlockModel(registers=self.registers, shared_bytes=self.shared_bytes,
                          blocks_per_sm=self.occupancy.blocks_per_sm, warps_per_sm=self.occupancy.warps_per_sm,
                          limited_by=self.occupancy.limited_by, reduction_steps=self.reduction_steps)


def latency_efficiency(warps_per_sm: int, device: Device) -> float:
    """Fraction of the SM's peak that ``warps_per_sm`` resident warps reach (``model.warps_for_peak`` for all
    of it)."""
    return min(1.0, warps_per_sm / device.model.warps_for_peak)


def estimate(expr: Expr, tiles: Sequence[Mapping[str, int]], device: Device) -> GpuEstimate:
    """Predicts the plan whose thread tile is ``tiles[0]`` and block tile ``tiles[1]`` (see module doc).
    A block that does not fit an SM (occupancy 0) is predicted infinitely slow."""
    thread, block = tiles
    levels = device.private_levels
    threads = threads_per_block(expr, thread, block)
    regs = thread_registers(expr, thread)
    smem = shared_bytes(expr, block, device)
    occ = occupancy(device, threads, regs, smem)
    total, blocks = tile_counts(expr, block)
    steps = total // blocks  # reduction steps of one block
    sms = min(device.units.count, blocks)
    per_sm = ceil_div(blocks, device.units.count)
    resident = max(1, min(occ.blocks_per_sm, per_sm)) * ceil_div(threads, device.units.warp_threads)
    rate = device.units.peak(expr.dtype) * 1e9 * latency_efficiency(resident, device)

    padded_points = math.prod(round_up(a.extent, block[a.name]) for a in expr.axes)
    flops_block = padded_points * expr.flops_per_point / blocks
    rules = [GpuLevelRules.of(device, i, expr) for i in range(2)]
    q_reg = traffic(expr, thread, rules[0])          # shared memory -> registers, the whole operator
    q_smem = traffic(expr, block, rules[1])          # global -> shared memory (+ the output written once)
    source = data_source(expr, device)
    global_bw = min(source.bandwidth_gbps, source.total_bandwidth_gbps / sms) * 1e9
    compute = flops_block / rate
    mem = {levels[0].name: q_reg / blocks / (levels[1].bandwidth_gbps * 1e9),
           levels[1].name: q_smem / blocks / global_bw}
    per_block = max([compute, *mem.values()]) + steps * device.model.sync_cycles * cycle_seconds(device)
    seconds = per_block * per_sm + device.model.launch_seconds if occ.blocks_per_sm else math.inf
    foot = {levels[0].name: footprint(expr, thread, rules[0]), levels[1].name: smem}
    est = Estimate(seconds=seconds, compute_seconds=compute * per_sm,
                   memory_seconds={k: v * per_sm for k, v in mem.items()},
                   traffic_bytes={levels[0].name: q_reg, levels[1].name: q_smem}, footprint_bytes=foot,
                   tiles=blocks, units=sms, waves=waves(blocks, device, occ.blocks_per_sm))
    return GpuEstimate(est, threads, regs, smem, occ, steps)

