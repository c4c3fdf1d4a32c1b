"""GPU code generation: a GPU RProgram (``roller.targets.cuda.construct``) becomes TVM schedule primitives.

Loop structure for axes i, j (spatial) and k (reduce), thread tile (ti, tj, 1), block tile (bi, bj, bk)::

    [i_g j_g fused: blockIdx.x] [i_v: vthread.y] [j_v: vthread.x] [i_t j_t fused: threadIdx.x] k_o | k_i
     one block per block tile    a thread's tile, interleaved    one thread per thread tile   steps | the step

A thread's tile is strided by the block's threads along the plan's ``gpu.interleaved`` axes (TVM's
virtual threads: a warp's stores are coalesced and its shared-memory reads along a row hit distinct banks);
along other spatial axes it is contiguous (an unrolled inner loop). Its accumulators live in registers
(``cache_write`` to ``local`` at the thread loop: initialized before the reduction, written back once).
Every input is staged in shared memory per reduction step (``cache_read`` to ``shared`` at ``k_o``): the
block's threads copy it cooperatively, the copy's loops fused and split over ``threadIdx.x`` with the
plan's vector width innermost (``RProgram.gpu.copy_lanes``, aligned by construction; checked here),
its rows padded by the plan's bank padding (``storage_align``). Overhanging block tiles are predicated
(TVM's split bounds). A producer stage of the function (a convolution's zero padding) is folded into the
shared copy, else it runs at root as its own kernel over blocks and threads.

The plan's kind (``RProgram.gpu.kind``, ``roller.plan.gpuplan``) picks the code: ``TILES`` as above, ``BLOCK_REDUCTION``
(rows long and few) its own loop structure (``roller.targets.cuda.schedule_reduce``), ``TENSOR_CORE`` dlight's WMMA
recipe with the plan's fragment layout (``roller.targets.cuda.schedule_tensorcore``).

The same schedule compiles for CUDA (``target_for(device)``) and for OpenCL (``roller.targets.cuda.opencl``),
which runs on a CPU without a GPU to check the numbers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from roller.targets.cuda.toolchain import KernelResources
from roller.device.spec import Device
from roller.errors import BuildError
from roller.plan.expr import REDUCE, Expr
from roller.plan.gpuplan import GpuKind
from roller.plan.rprogram import RProgram
from roller.tir.schedutil import check_program, fuse_axes, main_block, producer_of, read_index, storage_pad, try_step
from roller.targets.cuda.launch import KernelLaunch, kernel_launches, lower

ROOT_THREADS = 256  # threads per block of a producer stage that runs as its own kernel


def schedule_cuda(func, expr: Expr, program: RProgram, device: Device, notes: list[str] | None = None):
    """Schedules ``func`` following the GPU ``program``; returns the ``tvm.s_tir.Schedule``.

    Raises BuildError when the program is not a GPU plan for this expression or a vector copy it asks for
    would be misaligned; TVM's ScheduleError passes through for a primitive that does not apply."""
    import tvm

    check_program(expr, program)
    if len(program.tiles) != 2 or program.gpu is None:
        raise BuildError(f"{expr.name}: device {device.name!r} is of kind 'gpu' but the plan is not a GPU plan "
                         f"(levels {list(program.levels)}, no block resources); construct it for this device")
    notes = notes if notes is not None else []
    thread, block_tile = program.tiles
    sch = tvm.s_tir.Schedule(func)
    kind = program.gpu.kind
    if kind is GpuKind.TENSOR_CORE:  # fp16 matmul on the tensor cores (roller.targets.cuda.tensorcore)
        from roller.targets.cuda.schedule_tensorcore import schedule_tensorcore

        schedule_tensorcore(sch, expr, program, device, notes)
        return sch
    if kind is GpuKind.BLOCK_REDUCTION:  # the threads of a block share rows (roller.targets.cuda.reduce)
        from roller.targets.cuda.schedule_reduce import schedule_block_reduction

        schedule_block_reduction(sch, expr, program, device, notes, _bind_root)
        return sch
    if kind is not GpuKind.TILES:
        raise BuildError(f"{expr.name}: no code generator for a GPU plan of kind {kind!r}")
    block = main_block(sch, expr)
    axis_loop = fuse_axes(sch, block, expr)

    interleaved = list(program.gpu.interleaved)
    if any(a not in thread or expr.axis(a).kind == REDUCE for a in interleaved):
        raise BuildError(f"{expr.name}: the plan interleaves {interleaved}, which are not all spatial axes "
                         f"of {[a.name for a in expr.axes]}")
    if len(interleaved) > 3:
        raise BuildError(f"{expr.name}: the plan interleaves {len(interleaved)} axes; TVM has 3 virtual thread axes")
    vthread = {a: f"vthread.{d}" for a, d in zip(reversed(interleaved), "xyz")}
    grids, vthreads, threads, inner, outer_r, inner_r = [], [], [], [], [], []
    for ax in expr.axes:
        t, b = thread[ax.name], block_tile[ax.name]
        if ax.kind == REDUCE:
            if t != 1:
                raise BuildError(f"{expr.name}: a GPU plan's thread tile runs the reduction one step at a time; "
                                 f"axis {ax.name} has {t}")
            ko, ki = sch.split(axis_loop[ax.name], [math.ceil(ax.extent / b), b])
            outer_r.append(ko)
            inner_r.append(ki)
        elif ax.name in vthread:  # a thread's elements strided by the block's threads along this axis
            g, v, th = sch.split(axis_loop[ax.name], [math.ceil(ax.extent / b), t, b // t])
            grids.append(g)
            vthreads.append((v, vthread[ax.name]))
            threads.append(th)
        else:
            g, th, i0 = sch.split(axis_loop[ax.name], [math.ceil(ax.extent / b), b // t, t])
            grids.append(g)
            threads.append(th)
            inner.append(i0)
    sch.reorder(*grids, *[v for v, _ in vthreads], *threads, *outer_r, *inner_r, *inner)
    for v, tag in vthreads:
        sch.bind(v, tag)
    bx = sch.fuse(*grids) if len(grids) > 1 else grids[0]
    tx = sch.fuse(*threads) if len(threads) > 1 else threads[0]
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    n_threads = int(sch.get(tx).extent)
    if n_threads != program.gpu.threads:
        raise BuildError(f"{expr.name}: the schedule has {n_threads} threads a block, the plan "
                         f"{program.gpu.threads}")

    consumers = list(sch.get_consumers(block))
    if outer_r:
        acc = sch.cache_write(block, 0, "local")
        for c in consumers:  # elementwise epilogues join the write-back
            try_step(None, "inline", sch.reverse_compute_inline, c)
        sch.reverse_compute_at(acc, tx)
    else:
        for c in consumers:
            try_step(None, "inline", sch.reverse_compute_inline, c)
    for c in sch.get_consumers(acc if outer_r else block):
        notes.append(f"{sch.get(c).name_hint} runs as its own kernel")
        _bind_root(sch, c)

    copy_lanes = program.gpu.copy_lanes
    unstaged = sorted(set(copy_lanes) - set(program.packed))
    if unstaged:
        raise BuildError(f"{expr.name}: the plan gives copy lanes to {unstaged}, which it does not stage in "
                         f"shared memory (packed: {list(program.packed)})")
    for t in expr.inputs:
        idx = read_index(sch, block, t.name)
        if idx is None or not outer_r or t.name not in program.packed:
            if t.name in program.packed:  # a reported fact: the plan's copy into shared memory does not happen
                why = "the kernel has no reduction step to stage it at" if idx is not None else "the main block does not read it"
                notes.append(f"{t.name} is read from global memory, not staged in shared memory: {why}")
            continue
        stage = producer_of(sch, block, t.name)
        shared = sch.cache_read(block, idx, "shared")
        sch.compute_at(shared, outer_r[-1])
        if stage is not None and not try_step(None, "inline", sch.compute_inline, stage):
            notes.append(f"{sch.get(stage).name_hint} runs as its own kernel")
            _bind_root(sch, stage)
        storage_pad(sch, shared, program.storage_pad.get(t.name, 0))
        _cooperative_copy(sch, shared, n_threads, copy_lanes.get(t.name, 1), t.name)

    for lp in inner:
        if int(sch.get(lp).extent) > 1:
            sch.unroll(lp)
    if inner_r:
        sch.annotate(inner_r[-1], "pragma_auto_unroll_max_step", 64)
        sch.annotate(inner_r[-1], "pragma_unroll_explicit", 1)
    if outer_r:
        sch.decompose_reduction(block, outer_r[0])
    return sch


def _cooperative_copy(sch, block, n_threads: int, lanes: int, name: str) -> None:
    """The copy ``block`` (global -> shared) spread over the block's threads: its loops fused, split into
    [rounds, threadIdx.x, lanes] with the ``lanes`` vector innermost. A vector whose row would not divide
    is a misaligned access: BuildError."""
    loops = sch.get_loops(block)
    # the copy's own loops follow the loops of the kernel it sits in (block, thread, reduction step)
    own = [lp for lp in loops if not _is_bound_or_outer(sch, lp, block)]
    row = int(sch.get(own[-1]).extent) if own else 1
    if lanes > 1 and row % lanes:
        raise BuildError(f"{name}: a {lanes}-element vector copy of rows of {row} elements would be misaligned")
    fused = sch.fuse(*own) if len(own) > 1 else own[0]
    total = int(sch.get(fused).extent)
    if lanes > 1:
        fused, vec = sch.split(fused, [None, lanes])
    _, tx = sch.split(fused, [None, n_threads]) if total // lanes > 1 else (None, fused)
    sch.bind(tx, "threadIdx.x")
    if lanes > 1:
        sch.vectorize(vec)


def _is_bound_or_outer(sch, loop, block) -> bool:
    """Whether ``loop`` encloses the copy from outside (a loop of the main nest): it is bound to a thread
    axis or encloses other blocks too."""
    if sch.get(loop).thread_binding is not None:
        return True
    return len(sch.get_child_blocks(loop)) > 1 or sch.get(sch.get_child_blocks(loop)[0]) != sch.get(block)


def _bind_root(sch, block) -> None:
    """A stage at root as its own kernel: its loops fused, ROOT_THREADS threads a block."""
    loops = sch.get_loops(block)
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    bx, tx = sch.split(fused, [None, ROOT_THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


@dataclass(frozen=True)
class CudaBuild:
    """A GPU plan compiled offline for the device's architecture: the CUDA source, PTX (NVRTC), cubin and
    per-kernel resources (ptxas), the host's kernel calls, and ``problems``: every device limit the
    kernels break (``resource_problems``); a candidate with problems is dropped."""

    arch: str
    source: str
    ptx: str
    cubin: bytes
    resources: tuple[KernelResources, ...]
    launches: tuple[KernelLaunch, ...]
    problems: tuple[str, ...]

    def main(self) -> KernelResources:
        """The resources of the main kernel (the one with the most registers)."""
        return max(self.resources, key=lambda r: (r.registers, r.shared_bytes))


def gpu_limits(device: Device, dynamic_shared: bool = False) -> dict[str, int]:
    """The per-block limits ``tvm.s_tir.analysis.verify_gpu_code`` checks, from the device's spec; a kernel
    with dynamic shared memory (the tensor-core plans) may use up to the opt-in limit (TVM's CUDA runtime
    raises the kernel's limit at launch)."""
    g = device.gpu
    return {"max_shared_memory_per_block": g.shared_per_block_optin if dynamic_shared else g.shared_per_block, "max_threads_per_block": g.max_threads_per_block,
            "max_thread_x": g.max_threads_per_block, "max_vector_bytes": 16}


def resource_problems(device: Device, program: RProgram, resources, verified: bool) -> list[str]:
    """Why the compiled kernels break the device's limits or the model's assumptions, one line each:
    TVM's GPU code check, registers over the per-thread limit, spills, and an occupancy (with ptxas's
    registers and shared memory) that runs fewer blocks of this kernel on an SM at once than the model
    counted (an SM never runs more than the blocks it gets)."""
    from roller.targets.cuda.rules import occupancy

    limits = gpu_limits(device, dynamic_shared=program.gpu is not None and program.gpu.kind is GpuKind.TENSOR_CORE)
    out = [] if verified else [f"verify_gpu_code: the kernel breaks the limits {limits}"]
    for r in resources:
        if r.registers > device.gpu.max_registers_per_thread:
            out.append(f"{r.kernel}: {r.registers} registers a thread, over {device.gpu.max_registers_per_thread}")
        if r.spills:
            out.append(f"{r.kernel}: spills {r.spill_store_bytes} B stored / {r.spill_load_bytes} B loaded")
    main = max(resources, key=lambda r: (r.registers, r.shared_bytes)) if resources else None
    if main is not None and program.gpu is not None:
        # the model counts the blocks an SM runs at once, at most the blocks it gets (roller.targets.cuda.cost)
        occ = occupancy(device, program.gpu.threads, main.registers, main.shared_bytes)
        per_sm = math.ceil(math.prod(program.grid.values()) / device.units.count)
        assumed = program.gpu.model.blocks_per_sm
        if occ.blocks_per_sm == 0 or min(occ.blocks_per_sm, per_sm) < min(assumed, per_sm):
            out.append(f"{main.kernel}: {occ.blocks_per_sm} blocks per SM with {main.registers} registers and "
                       f"{main.shared_bytes} B shared (limited by {occ.limited_by}); the model assumed "
                       f"{assumed} (of the {per_sm} each SM gets)")
    return out


def build_cuda(func, expr: Expr, program: RProgram, device: Device, notes: list[str] | None = None) -> CudaBuild:
    """Schedules ``func`` for the GPU ``program`` and compiles it offline (``roller.targets.cuda.toolchain``) for the
    device's ``target.arch``; needs the CUDA toolchain extra, no GPU."""
    import tvm

    from roller.targets.cuda import toolchain as cudatools
    from roller.tir.compile import target_for

    arch = str(device.target.get("arch", ""))
    sch = schedule_cuda(func, expr, program, device, notes)
    target = target_for(device)
    try:
        host, devices = lower(sch.mod, target)
        source = tvm.compile(sch.mod, target).mod.imports[0].inspect_source("")
    except tvm.error.InternalError as e:  # a lowering pass rejects this plan's schedule: this candidate only
        raise BuildError(f"{expr.name}: TVM could not lower the schedule: {(str(e).splitlines() or [''])[-1]}") from None
    limits = gpu_limits(device, dynamic_shared=program.gpu.kind is GpuKind.TENSOR_CORE)
    verified = all(tvm.s_tir.analysis.verify_gpu_code(f, limits)
                   for m in devices.values() for f in m.functions.values())
    ptx = cudatools.to_ptx(source, arch)
    cubin, resources = cudatools.assemble(ptx, arch)
    return CudaBuild(arch, source, ptx, cubin, tuple(resources), kernel_launches(host),
                     tuple(resource_problems(device, program, resources, verified)))
