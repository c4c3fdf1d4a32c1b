"""GPU code for a block-level reduction plan (``roller.targets.cuda.reduce``): the threads of a block share rows.

Loop structure for spatial axes s (rows, ``S`` a block) and the reduction axis k (``R`` threads)::

    [s_g fused: blockIdx.x] [s_t fused: threadIdx.y] [k_i: threadIdx.x] k_o
     a block per S rows       a row per threadIdx.y    R threads a row   the thread's strided share

Element ``k_o * R + k_i`` goes to thread ``k_i``: at each step the R threads read R neighbouring elements
(coalesced). Binding a reduction loop to ``threadIdx.x`` makes TVM's lowering (LowerCrossThreadReduction)
keep each thread's partial sum in a register and combine the R of them across threads: warp shuffles and a
shared-memory staging between warps in CUDA, a shared-memory tree in the OpenCL twin (no shuffles there).
Overhanging tiles are predicated by the splits' bounds. Epilogues run as their own kernels.
"""
from __future__ import annotations

import math

from roller.device.spec import Device
from roller.errors import BuildError
from roller.plan.expr import REDUCE, Expr
from roller.plan.gpuplan import GpuKind
from roller.plan.rprogram import RProgram
from roller.tir.schedutil import fuse_axes, main_block


def schedule_block_reduction(sch, expr: Expr, program: RProgram, device: Device, notes: list[str], bind_root) -> None:
    """Schedules the main block of ``sch`` as ``program``'s block-level reduction (see module doc); ``bind_root``
    puts a stage at root as its own kernel (the CUDA generator's)."""
    block = main_block(sch, expr)
    loops = fuse_axes(sch, block, expr)
    _, tile = program.tiles
    shape = program.gpu.reduction
    if program.gpu.kind is not GpuKind.BLOCK_REDUCTION or shape is None:
        raise BuildError(f"{expr.name}: a GPU plan of kind {program.gpu.kind.value} is not a block-level reduction")
    if program.packed:
        raise BuildError(f"{expr.name}: a block-level reduction stages nothing in shared memory; the plan packs "
                         f"{list(program.packed)}")
    R = shape.threads
    grids, rows, reduce_loops = [], [], []
    for ax in expr.axes:
        if ax.kind == REDUCE:
            if tile[ax.name] != R:
                raise BuildError(f"{expr.name}: a block-level reduction's block tile along {ax.name} is its "
                                 f"{R} threads, the plan has {tile[ax.name]}")
            ko, ki = sch.split(loops[ax.name], [math.ceil(ax.extent / R), R])
            reduce_loops = [ki, ko]
        else:
            g, t = sch.split(loops[ax.name], [math.ceil(ax.extent / tile[ax.name]), tile[ax.name]])
            grids.append(g)
            rows.append(t)
    if not reduce_loops:
        raise BuildError(f"{expr.name}: a block-level reduction plan needs a reduction axis")
    sch.reorder(*grids, *rows, *reduce_loops)
    bx = sch.fuse(*grids) if len(grids) > 1 else grids[0]
    ty = sch.fuse(*rows) if len(rows) > 1 else rows[0]
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(reduce_loops[0], "threadIdx.x")
    rows = int(sch.get(ty).extent)
    if rows != shape.rows:
        raise BuildError(f"{expr.name}: the schedule has {rows} rows a block, the plan {shape.rows}")
    threads = rows * R
    if threads != program.gpu.threads:
        raise BuildError(f"{expr.name}: the schedule has {threads} threads a block, the plan {program.gpu.threads}")
    for c in sch.get_consumers(block):
        notes.append(f"{sch.get(c).name_hint} runs as its own kernel")
        bind_root(sch, c)
