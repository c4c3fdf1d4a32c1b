"""GPU code for a tensor-core matmul plan (``roller.targets.cuda.tensorcore``): fp16 inputs, 16 x 16 x 16 WMMA fragments.

The plan sets the block tile (``bm`` x ``bn`` x ``bk``), the warps of a block (``warps_m`` x ``warps_n``) and each
warp's tile in fragments (``frags_m`` x ``frags_n``); the schedule follows TVM dlight's ``MatmulTensorization``
recipe with those factors instead of its fixed ones: the operator normalized to C[b, i, j] += A[b, i, k] ·
B[b, j, k] (``reindex`` + ``transform_layout``), padded to whole block tiles (``pad_einsum``), the 16 x 16 x 16
inner loops blockized, inputs staged in shared memory by cooperative 8-byte copies (rows padded against bank
conflicts), fragments loaded from shared memory, multiplied and accumulated on the tensor cores, and the
accumulators stored through shared memory to the output (fp32 accumulators where the output is fp32, fp16
where it is fp16). Unlike dlight, the reduction is not software-pipelined (see ``gpu_tensorcore.PIPELINE_STAGES``).

No numbers can be checked here: OpenCL has no tensor-core instructions and no GPU is reachable, so the tests
compile the kernels (NVRTC, ptxas) and look for the ``wmma.mma`` instructions; nothing more.
"""
from __future__ import annotations

from roller.device.spec import Device
from roller.errors import BuildError
from roller.plan.expr import Expr
from roller.plan.gpuplan import GpuKind
from roller.plan.rprogram import RProgram

WARP = 32


def schedule_tensorcore(sch, expr: Expr, program: RProgram, device: Device, notes: list[str]) -> None:
    """Schedules the main block of ``sch`` as ``program``'s tensor-core plan (see module doc). BuildError when a
    step does not apply (the operator is not a matmul TVM can normalize, or an intrinsic does not match)."""
    from tvm.s_tir.dlight.gpu.matmul import get_index_map
    from tvm.s_tir.schedule.schedule import ScheduleError
    from tvm.s_tir.tensor_intrin.cuda import get_wmma_intrin_group

    from roller.targets.cuda.tensorcore import FRAG, OUT_PAD, ROW_PAD, TC_COPY_LANES
    from roller.tir.schedutil import main_block

    tc = program.gpu.tensor_core
    if program.gpu.kind is not GpuKind.TENSOR_CORE or tc is None:
        raise BuildError(f"{expr.name}: a GPU plan of kind {program.gpu.kind.value} is not a tensor-core plan")
    wm, wn, fm, fn, kf = tc.warps_m, tc.warps_n, tc.frags_m, tc.frags_n, tc.frags_k
    _check_block_tile(expr, program, device, tc)
    out_dtype = str(expr.output.dtype)
    try:
        block = main_block(sch, expr)
        reindex_a = sch.reindex(block, ("read", 0))
        reindex_b = sch.reindex(block, ("read", 1))
        reindex_c = sch.reindex(block, ("write", 0))
        maps = get_index_map(sch.get(block))
        if maps is None:
            raise BuildError(f"{expr.name}: TVM cannot normalize it to a batched matmul; no tensor-core plan")
        matmul_map, a_map, b_map, c_map = maps
        sch.transform_layout(reindex_a, ("write", 0), a_map)
        sch.transform_layout(reindex_b, ("write", 0), b_map)
        sch.transform_layout(reindex_c, ("read", 0), c_map)
        sch.transform_block_layout(block, matmul_map)
        sch.pad_einsum(block, [1, FRAG * wm * fm, FRAG * wn * fn, FRAG * kf])

        batch, i, j, k = sch.get_loops(block)
        i, i_inner = sch.split(i, factors=[None, FRAG])
        j, j_inner = sch.split(j, factors=[None, FRAG])
        k, k_inner = sch.split(k, factors=[None, FRAG])
        sch.reorder(i, j, k, i_inner, j_inner, k_inner)
        inner = block
        outer = sch.blockize(i_inner)
        i0, i1, i2, i3 = sch.split(i, factors=[None, 1, wm, fm])
        j0, j1, j2, j3 = sch.split(j, factors=[1, None, wn, fn])
        k0, k1 = sch.split(k, [None, kf])
        sch.reorder(i0, j0, i1, j1, j2, i2, k0, k1, i3, j3)
        sch.bind(batch, "blockIdx.z")
        sch.bind(sch.fuse(i0, j0), "blockIdx.x")
        sch.bind(sch.fuse(i1, j1), "blockIdx.y")
        warps = sch.fuse(j2, i2)
        sch.bind(warps, "threadIdx.y")

        def to_shared(idx):
            copy = sch.cache_read(outer, idx, "shared.dyn")
            sch.compute_at(copy, k0)
            fused = sch.fuse(*sch.get_loops(copy)[-2:])
            _, ty, tx, vec = sch.split(fused, factors=[None, wm * wn, WARP, TC_COPY_LANES])
            sch.bind(tx, "threadIdx.x")
            sch.bind(ty, "threadIdx.y")
            sch.vectorize(vec)
            sch.storage_align(copy, 0, axis=-2, factor=16, offset=ROW_PAD)
            return copy

        for copy in (to_shared(0), to_shared(1)):
            for p in sch.get_producers(copy):  # the reindex stages read in place
                sch.compute_inline(p)
        frag_a = sch.cache_read(outer, 0, "wmma.matrix_a")
        frag_b = sch.cache_read(outer, 1, "wmma.matrix_b")
        sch.compute_at(frag_a, k1)
        sch.compute_at(frag_b, k1)
        staged = sch.cache_write(outer, 0, "shared.dyn")
        sch.storage_align(staged, 0, -2, 16, OUT_PAD)
        store = sch.cache_write(outer, 0, "wmma.accumulator")
        sch.reverse_compute_at(store, warps)
        sch.reverse_compute_at(staged, warps)
        si, sj = sch.get_loops(store)[-2:]
        si0, si1 = sch.split(si, factors=[None, FRAG])
        sj0, sj1 = sch.split(sj, factors=[None, FRAG])
        sch.reorder(si0, sj0, si1, sj1)
        init = sch.get_child_blocks(sch.decompose_reduction(outer, k0))[0]

        acc = "float32" if out_dtype == "float32" else "float16"
        intrin = get_wmma_intrin_group(load_scope="shared.dyn", store_scope="shared.dyn", in_dtype="float16",
                                       out_dtype=acc, trans_b=True)
        for frag, name in ((frag_a, "load_a"), (frag_b, "load_b")):
            fi, fj = sch.get_loops(frag)[-2:]
            fi0, fi1 = sch.split(fi, factors=[None, FRAG])
            fj0, fj1 = sch.split(fj, factors=[None, FRAG])
            sch.reorder(fi0, fj0, fi1, fj1)
            sch.unroll(fi0)
            sch.unroll(fj0)
            sch.tensorize(fi1, intrin[name])
        sch.tensorize(sch.get_loops(init)[-2], intrin["init"])
        sch.tensorize(sch.get_loops(store)[-2], intrin["store"])
        sch.tensorize(sch.get_loops(inner)[-3], intrin["compute"])
        for c in sch.get_consumers(staged):  # the padding crop (and elementwise epilogues) join the write-back
            sch.reverse_compute_inline(c)
        fused = sch.fuse(*sch.get_loops(staged)[-2:])
        _, tx, vec = sch.split(fused, factors=[None, WARP, TC_COPY_LANES])
        sch.bind(tx, "threadIdx.x")
        sch.vectorize(vec)
    except ScheduleError as e:
        raise BuildError(f"{expr.name}: a tensor-core schedule step does not apply: "
                         f"{(str(e).splitlines() or [''])[0]}") from None


def _check_block_tile(expr: Expr, program: RProgram, device: Device, tc) -> None:
    """BuildError unless the plan's block tile, threads, copy lanes and row padding are what this schedule
    generates for its fragment layout ``tc`` (the schedule follows the layout; a plan that says otherwise
    cannot be honoured)."""
    from roller.targets.cuda.tensorcore import FRAG, ROW_PAD, TC_COPY_LANES, tensorcore_axes

    axes = tensorcore_axes(expr, device)
    if axes is None:
        raise BuildError(f"{expr.name}: a tensor-core plan, but the operator is not an fp16 matmul the device "
                         f"{device.name!r} runs on tensor cores")
    i, j, k = axes
    block = program.tiles[-1]
    want = {i: FRAG * tc.warps_m * tc.frags_m, j: FRAG * tc.warps_n * tc.frags_n, k: FRAG * tc.frags_k}
    got = {a: block.get(a) for a in want}
    if got != want:
        raise BuildError(f"{expr.name}: the tensor-core layout {tc} makes block tiles {want}, the plan has {got}")
    if program.gpu.threads != WARP * tc.warps_m * tc.warps_n:
        raise BuildError(f"{expr.name}: the tensor-core layout has {WARP * tc.warps_m * tc.warps_n} threads a "
                         f"block, the plan {program.gpu.threads}")
    inputs = [t.name for t in expr.inputs]
    lanes = {n: program.gpu.copy_lanes.get(n) for n in inputs}
    if any(v != TC_COPY_LANES for v in lanes.values()):
        raise BuildError(f"{expr.name}: the tensor-core schedule copies {TC_COPY_LANES} halves a load, the plan "
                         f"asks for {lanes}")
    pads = {n: program.storage_pad.get(n) for n in inputs}
    if any(v != ROW_PAD for v in pads.values()):
        raise BuildError(f"{expr.name}: the tensor-core schedule pads staged rows by {ROW_PAD} halves, the plan "
                         f"by {pads}")
