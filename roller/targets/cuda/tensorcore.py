"""Tensor-core plans for matmuls on a GPU (sm_80 and later): fp16 inputs, fp32 (or fp16) accumulators in
16 x 16 x 16 WMMA fragments.

Policy only (plain arithmetic). Offered where the operator has two fp16 inputs indexed by plain axes (no
windows), one reduction axis and an fp16 or fp32 output, and the spec names a float16 tensor-core peak on an
sm_80+ architecture. A plan is a warp tile (``frags_m`` x ``frags_n`` fragments, the level-0 tile: a warp's
fragments in registers) and a block tile of ``warps_m`` x ``warps_n`` warp tiles by ``frags_k`` fragments of
reduction (the level-1 tile, staged in shared memory); ``RProgram.gpu.tensor_core`` (a ``TensorCoreLayout``) holds those factors
for ``roller.targets.cuda.schedule_tensorcore``. The operator is padded to whole block tiles (a tile may overhang an
axis by at most ``MAX_WASTE`` of it).

The model: the block's flops at the SM's tensor-core peak (scaled by the resident warps like SIMT code),
the fragments its warps load from shared memory at the SM's shared-memory bandwidth, its global traffic at
its SM's share of the bandwidth, a barrier pair per reduction step. Registers and shared memory are
estimated from the fragments and the staged tiles (``tc_registers``, ``tc_shared_bytes``); ptxas gives the
real register count at build time (dynamic shared memory is not in its report). Some factor sets make a
TVM 0.27 lowering pass fail (an internal dtype check in the shared-memory rewrite); the build drops such a
candidate with TVM's message, like any candidate over a limit.
"""
from __future__ import annotations

import math
from typing import Mapping

from roller.device.spec import Device
from roller.plan.expr import REDUCE, Expr
from roller.plan.gpuplan import TensorCoreLayout
from roller.targets.cuda.cost import GpuEstimate, latency_efficiency
from roller.targets.cuda.rules import GpuLevelRules, occupancy, waves
from roller.plan.cost import Estimate, cycle_seconds, data_source
from roller.plan.rtile import ceil_div, round_up, tile_counts, traffic

FRAG = 16
ROW_PAD = 8          # halves of padding per staged row (the code's storage_align: 16 B against bank conflicts)
OUT_PAD = 4          # accumulator elements of padding per row of the output staged in shared memory
TC_COPY_LANES = 4    # fp16 elements a thread copies at once into shared memory (8 bytes)
# The reduction is not software-pipelined: with dlight's pipeline annotations TVM 0.27's InjectSoftwarePipeline
# failed on most of the factors offered here (82 of 105 on a 512 x 512 x 256 matmul), without them 21 did.
PIPELINE_STAGES = 1
MAX_WASTE = 0.25     # a block tile may overhang an axis by at most this share of its extent
WARP_SHAPES = ((1, 2), (2, 1), (2, 2), (2, 4), (4, 2))
FRAG_SHAPES = ((1, 1), (1, 2), (2, 1), (2, 2), (2, 4), (4, 2), (4, 4))
FRAGS_K = (1, 2, 4)
# 32-bit registers a thread spends besides its fragments (addresses, loop counters); an assumption the
# build checks against ptxas (a 4 x 4 warp tile with fp32 accumulators used 255 and spilled on sm_80).
TC_REGISTER_OVERHEAD = 32


def _arch_number(device: Device) -> int:
    arch = str(device.target.get("arch", ""))
    return int(arch[3:]) if arch.startswith("sm_") and arch[3:].isdigit() else 0


def tensorcore_axes(expr: Expr, device: Device) -> tuple[str, str, str] | None:
    """(i, j, k): the output's row and column axes and the reduction axis, where a tensor-core plan is
    offered (see module doc); else None."""
    if _arch_number(device) < 80 or "float16" not in device.units.tensor_peak_gflops:
        return None
    reduces = [a.name for a in expr.axes if a.kind == REDUCE]
    if (len(expr.inputs) != 2 or len(reduces) != 1 or any(t.dtype != "float16" for t in expr.inputs)
            or expr.output.dtype not in ("float16", "float32") or len(expr.output.index) < 2):
        return None
    if any(len(dim) != 1 or dim[0][1] != 1 for t in expr.tensors for dim in t.index):
        return None
    i, j = expr.output.index[-2][0][0], expr.output.index[-1][0][0]
    return i, j, reduces[0]


def tc_registers(frags_m: int, frags_n: int, frags_k: int, acc_bytes: int) -> int:
    """The model's registers a thread: its share of the warp's accumulator fragments (16 x 16 elements over
    32 threads), of the A and B fragments of a reduction step (PIPELINE_STAGES of them in flight), and
    TC_REGISTER_OVERHEAD."""
    acc = frags_m * frags_n * FRAG * FRAG * acc_bytes // 4 // 32
    operands = (frags_m + frags_n) * frags_k * FRAG * FRAG * 2 // 4 // 32 * PIPELINE_STAGES
    return acc + operands + TC_REGISTER_OVERHEAD


def tc_shared_bytes(bm: int, bn: int, bk: int, acc_bytes: int) -> int:
    """Shared memory of a block: the A and B tiles (rows padded by ROW_PAD, PIPELINE_STAGES buffers) and the
    accumulators staged on their way out (rows padded by OUT_PAD)."""
    return PIPELINE_STAGES * (bm + bn) * (bk + ROW_PAD) * 2 + bm * (bn + OUT_PAD) * acc_bytes


def tensorcore_tiles(expr: Expr, device: Device) -> list[tuple[dict[str, int], dict[str, int], TensorCoreLayout]]:
    """(warp tile, block tile, fragment layout) of every tensor-core plan offered (see module doc)."""
    axes = tensorcore_axes(expr, device)
    if axes is None:
        return []
    i, j, k = axes
    ext = {a.name: a.extent for a in expr.axes}
    out = []
    for fm, fn in FRAG_SHAPES:
        for wm, wn in WARP_SHAPES:
            for fk in FRAGS_K:
                block = {a: 1 for a in ext}
                block.update({i: FRAG * fm * wm, j: FRAG * fn * wn, k: FRAG * fk})
                if any((round_up(ext[a], block[a]) - ext[a]) > MAX_WASTE * ext[a] for a in (i, j, k)):
                    continue
                warp = {a: 1 for a in ext}
                warp.update({i: FRAG * fm, j: FRAG * fn, k: FRAG})
                out.append((warp, block, TensorCoreLayout(warps_m=wm, warps_n=wn, frags_m=fm, frags_n=fn,
                                                          frags_k=fk)))
    return out


def estimate_tensorcore(expr: Expr, warp: Mapping[str, int], block: Mapping[str, int], f: TensorCoreLayout,
                        device: Device) -> GpuEstimate:
    """The model's prediction for a tensor-core plan (see module doc)."""
    levels = device.private_levels
    acc_bytes = expr.output.elem_bytes
    i, j, k = tensorcore_axes(expr, device)
    threads = 32 * f.warps_m * f.warps_n
    regs = tc_registers(f.frags_m, f.frags_n, f.frags_k, acc_bytes)
    smem = tc_shared_bytes(block[i], block[j], block[k], acc_bytes)
    occ = occupancy(device, threads, regs, smem)  # shared memory up to the opt-in limit a block (dynamic)
    blocks_per_sm = occ.blocks_per_sm
    total, blocks = tile_counts(expr, block)
    steps = total // blocks
    per_sm = ceil_div(blocks, device.units.count)
    sms = min(device.units.count, blocks)
    resident = max(1, min(blocks_per_sm, per_sm)) * threads // 32
    rate = device.units.tensor_peak_gflops["float16"] * 1e9 * latency_efficiency(resident, device)
    padded = math.prod(round_up(a.extent, block[a.name]) for a in expr.axes)
    compute = padded * expr.flops_per_point / blocks / rate
    # fragments from shared memory: per reduction fragment, each warp loads frags_m A and frags_n B fragments
    q_frag = (blocks * steps * f.frags_k * f.warps_m * f.warps_n * (f.frags_m + f.frags_n)
              * FRAG * FRAG * 2)
    q_global = traffic(expr, block, GpuLevelRules.of(device, 1, expr))
    source = data_source(expr, device)
    global_bw = min(source.bandwidth_gbps, source.total_bandwidth_gbps / sms) * 1e9
    mem = {levels[0].name: q_frag / blocks / (levels[1].bandwidth_gbps * 1e9),
           levels[1].name: q_global / blocks / global_bw}
    per_block = max([compute, *mem.values()]) + steps * device.model.sync_cycles * cycle_seconds(device)
    seconds = per_block * per_sm + device.model.launch_seconds if blocks_per_sm else math.inf
    est = Estimate(seconds=seconds, compute_seconds=compute * per_sm,
                   memory_seconds={lv: v * per_sm for lv, v in mem.items()},
                   traffic_bytes={levels[0].name: q_frag, levels[1].name: q_global},
                   footprint_bytes={levels[0].name: regs * 4 * 32, levels[1].name: smem},
                   tiles=blocks, units=sms, waves=waves(blocks, device, max(1, blocks_per_sm)))
    return GpuEstimate(est, threads, regs, smem, occ, steps)
