"""CPU code generation: every kernel built here is checked against the numpy reference of roller.tir.ops.

RPrograms are hand-written (not constructed) so these tests pin the codegen contract, independent of the
policy: fused axes, tiles that overhang or exceed the extents, packed and unpacked inputs, padding stages.
"""
import dataclasses
import math
import re

import numpy as np
import pytest

from roller.tir import ops
from roller.tir.analysis import analyze
from roller.targets import build, schedule
from roller.targets.cpu.schedule import clamp_tiles
from roller.device.load import load_device
from roller.errors import BuildError
from roller.plan.expr import fuse_axes
from roller.measure.verify import fill_sentinel
from roller.plan.rprogram import RProgram
from roller.plan.rtile import default_vector_axis

LEVELS = ("reg", "L1", "L2")


@pytest.fixture(scope="module")
def device():
    return load_device("x86-avx512", calibrated=False)


def program(expr, reg, l1, l2, packed=(), pad=None, units=2):
    """An RProgram whose tiles are given as tuples in the Expr's axis order."""
    names = [a.name for a in expr.axes]
    tiles = tuple(dict(zip(names, t)) for t in (reg, l1, l2))
    return RProgram(levels=LEVELS, tiles=tiles, grid={}, units=units, waves=1, vector_axis=default_vector_axis(expr),
                    packed=tuple(packed), storage_pad=dict(pad or {}))


def analysed(op, shape, fuse=False):
    spec = ops.OPS[op]
    an = analyze(spec.make(shape))
    expr = fuse_axes(an.expr) if fuse else an.expr
    return spec, an.func, expr


def check(op, shape, device, prog_fn, fuse=False):
    """Builds ``prog_fn(expr)`` and compares the kernel's output with numpy."""
    import tvm

    spec, func, expr = analysed(op, shape, fuse)
    prog = prog_fn(expr)
    ex = build(func, expr, prog, device)
    ins = spec.inputs(shape)
    ref = spec.reference(ins, shape)
    dev = tvm.cpu()
    out = tvm.runtime.tensor(fill_sentinel(np.empty(ref.shape, ref.dtype)), dev)  # unwritten elements fail
    ex["main"](*[tvm.runtime.tensor(a, dev) for a in ins], out)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)
    return expr, prog


def test_clamp_tiles_keeps_multiples():
    assert clamp_tiles(1024, [8, 64, 256]) == (8, 64, 256)
    assert clamp_tiles(100, [8, 64, 128]) == (8, 64, 128)
    assert clamp_tiles(5, [16, 32, 64]) == (5, 5, 5)
    assert clamp_tiles(20, [8, 16, 64]) == (8, 16, 32)
    assert clamp_tiles(1, [4, 8, 8]) == (1, 1, 1)


def test_rejects_program_without_every_axis(device):
    _, func, expr = analysed("matmul", dict(M=16, N=16, K=16))
    bad = RProgram(levels=LEVELS, tiles=({"m": 1}, {"m": 1}, {"m": 1}), grid={}, units=2, waves=1)
    with pytest.raises(BuildError, match="no tile size for axis"):
        schedule(func, expr, bad, device)


def test_rejects_non_nested_tiles(device):
    _, func, expr = analysed("matmul", dict(M=16, N=16, K=16))
    with pytest.raises(BuildError, match="multiple"):
        schedule(func, expr, program(expr, (4, 16, 1), (6, 16, 4), (12, 16, 8)), device)


def test_non_cpu_device_is_a_clear_error(device):
    import dataclasses
    _, func, expr = analysed("matmul", dict(M=16, N=16, K=16))
    gpu = dataclasses.replace(device, kind="gpu", name="fake-gpu")
    with pytest.raises(BuildError, match="'gpu'"):
        schedule(func, expr, program(expr, (1, 16, 1), (4, 16, 4), (8, 16, 16)), gpu)


def test_schedule_structure_matmul(device):
    """Grid fused and parallel, reg tile vectorized on the output's contiguous axis, B packed and padded."""
    _, func, expr = analysed("matmul", dict(M=256, N=256, K=256))
    sch = schedule(func, expr, program(expr, (8, 32, 1), (32, 64, 64), (64, 128, 128), packed=("B",),
                                       pad={"B": 16}), device)
    text = sch.mod.script()
    assert "T.parallel(8)" in text          # (256/64) * (256/128) top tiles
    assert "T.vectorized(16)" in text       # 16 float32 lanes of AVX-512
    assert "B_global" in text and "C_global" in text  # the packed B, the accumulator tile
    assert "T.unroll(8)" in text            # the 8 rows of the reg tile


@pytest.mark.build
@pytest.mark.parametrize("shape,tiles,packed,pad", [
    (dict(M=128, N=128, K=128), ((8, 32, 1), (32, 64, 64), (64, 128, 128)), ("B",), {"B": 16}),
    (dict(M=128, N=128, K=128), ((4, 16, 2), (16, 32, 16), (32, 64, 64)), ("A", "B"), {}),
    (dict(M=50, N=70, K=33), ((8, 32, 1), (16, 64, 16), (32, 64, 32)), ("B",), {"B": 16}),  # overhang
    (dict(M=1, N=1025, K=7), ((8, 32, 1), (16, 64, 8), (32, 128, 16)), (), {}),            # extents < tile
    (dict(M=97, N=13, K=1025), ((7, 13, 1), (49, 13, 80), (49, 13, 1040)), ("A",), {}),
])
def test_matmul_numerics(device, shape, tiles, packed, pad):
    check("matmul", shape, device, lambda e: program(e, *tiles, packed=packed, pad=pad))


@pytest.mark.build
@pytest.mark.parametrize("shape,tiles", [
    (dict(B=3, M=17, N=33, K=19), ((1, 4, 16, 1), (1, 8, 32, 8), (1, 16, 64, 16))),
    (dict(B=2, M=64, N=64, K=64), ((1, 8, 32, 1), (1, 32, 64, 32), (2, 64, 64, 64))),
])
def test_batch_matmul_numerics(device, shape, tiles):
    check("batch_matmul", shape, device, lambda e: program(e, *tiles, packed=("W",)))


@pytest.mark.build
@pytest.mark.parametrize("shape,tiles,packed", [
    # axes n, h, w, k | r, s, c
    (dict(N=1, H=14, W=14, C=16, K=32, R=3, S=3, pad=1),
     ((1, 1, 4, 32, 1, 1, 1), (1, 1, 8, 32, 3, 1, 16), (1, 7, 8, 32, 3, 3, 16)), ("pad_temp", "weight")),
    (dict(N=2, H=7, W=9, C=5, K=3, R=3, S=2, pad=1, stride=2),
     ((1, 1, 2, 3, 1, 1, 1), (1, 2, 4, 3, 3, 2, 5), (2, 4, 4, 3, 3, 2, 5)), ()),
    (dict(N=1, H=9, W=9, C=8, K=16, R=1, S=1, pad=0),
     ((1, 1, 1, 16, 1, 1, 4), (1, 3, 3, 16, 1, 1, 8), (1, 9, 3, 16, 1, 1, 8)), ("data",)),
])
def test_conv2d_numerics(device, shape, tiles, packed):
    check("conv2d", shape, device, lambda e: program(e, *tiles, packed=packed))


@pytest.mark.build
def test_a_weight_whose_rows_spread_over_the_cache_sets_is_read_in_place(device):
    """The constructor's first plan for a 1x1 conv whose weight rows lie 21 lines apart (336 channels) reads
    the weight in place (``rtile.rows_spread``; it was packed per top tile): no copy of it in the kernel, and
    the output matches numpy."""
    from roller.targets import construct

    shape = dict(N=1, H=11, W=11, C=672, K=336, R=1, S=1, pad=0)
    _, _, expr = analysed("conv2d", shape)
    first = construct(expr, device, topk=1).programs[0]
    assert "weight" not in first.packed
    _, prog = check("conv2d", shape, device, lambda e: first)
    assert "weight_global" not in schedule(analysed("conv2d", shape)[1], expr, prog, device).mod.script()


@pytest.mark.build
@pytest.mark.parametrize("shape,tiles", [
    (dict(M=1025, N=129), ((16, 1), (16, 32), (64, 128))),
    (dict(M=1, N=7), ((16, 1), (16, 4), (16, 8))),
    (dict(M=64, N=256), ((16, 4), (32, 64), (32, 256))),
    (dict(M=64, N=7), ((1, 7), (16, 7), (32, 7))),      # one-row write-back at the L1 loop: not vectorized
    (dict(M=70, N=1000), ((8, 32), (16, 256), (32, 512))),  # rfactor, 2 vectors per reg row, overhang
])
def test_reduce_sum_numerics(device, shape, tiles):
    check("reduce_sum", shape, device, lambda e: program(e, *tiles))


@pytest.mark.build
@pytest.mark.parametrize("shape,tiles,fuse", [
    (dict(M=17, N=11), ((16,), (64,), (128,)), True),        # one fused axis m_n = 187, overhanging
    (dict(M=64, N=1000), ((32,), (1024,), (4096,)), True),
    (dict(M=33, N=65), ((1, 16), (2, 32), (8, 64)), False),
])
def test_add_relu_numerics(device, shape, tiles, fuse):
    expr, _ = check("add_relu", shape, device, lambda e: program(e, *tiles), fuse=fuse)
    assert len(expr.axes) == len(tiles[0])


def test_elementwise_and_reduction_are_parallel_and_vectorized(device):
    for op, shape, tiles, fuse in [("add_relu", dict(M=64, N=1024), ((32,), (1024,), (4096,)), True),
                                   ("reduce_sum", dict(M=1024, N=256), ((16, 4), (32, 64), (64, 256)), False),
                                   ("batch_matmul", dict(B=4, M=64, N=64, K=64),
                                    ((1, 8, 32, 1), (1, 32, 64, 32), (1, 64, 64, 64)), False)]:
        _, func, expr = analysed(op, shape, fuse)
        text = schedule(func, expr, program(expr, *tiles), device).mod.script()
        assert "T.parallel(" in text and "T.vectorized(16)" in text, op


# --- a reduce vector axis (a row sum's n): vector partial sums through rfactor, with constructed plans

def constructed(op, shape, device, topk, dtype="float32"):
    """(spec, normalized func, fused Expr, top-``topk`` plans) as ``roller build`` gets them."""
    from roller.builder.api import analyze as api_analyze
    from roller.targets import construct

    spec = ops.OPS[op]
    expr, func = api_analyze(spec.make(shape, dtype))
    return spec, func, expr, construct(expr, device, topk=topk).programs


def run_against_numpy(spec, func, expr, prog, device, shape, dtype="float32"):
    """Builds one plan, runs it on the spec's inputs and checks it at the profiler's tolerances."""
    import tvm
    from roller.measure.verify import TOLERANCE

    ex = build(func, expr, prog, device)
    ins = spec.inputs(shape, dtype)
    ref = spec.reference(ins, shape)
    out_dtype = spec.out_dtype(dtype)
    dev = tvm.cpu()
    out = tvm.runtime.tensor(fill_sentinel(np.empty(ref.shape, out_dtype)), dev)  # unwritten elements fail
    ex["main"](*[tvm.runtime.tensor(a, dev) for a in ins], out)
    rtol, atol = TOLERANCE.get(out_dtype, (0.0, 0.0))
    np.testing.assert_allclose(out.numpy(), ref.astype(out_dtype), rtol=rtol, atol=atol,
                               err_msg=f"{expr.name} {shape} {dtype}: {prog.describe()}")
    return ex


@pytest.mark.build
@pytest.mark.parametrize("M", [1, 3, 64])
@pytest.mark.parametrize("N", [1, 7, 15, 16, 17, 1025])
def test_reduce_sum_vector_reduce_axis_numerics(device, M, N):
    """Every constructed plan is right, whether it vectorizes n (rfactor applies for N >= a vector and more
    than one to sum, overhangs for 17 and 1025, or the scalar path for N < 16, N == 16) or the rows m
    (A packed transposed); from a vector of N on, the model picks n first."""
    shape = dict(M=M, N=N)
    spec, func, expr, progs = constructed("reduce_sum", shape, device, topk=3)
    if N >= 16:
        assert progs[0].vector_axis == "n"
    for prog in progs:
        run_against_numpy(spec, func, expr, prog, device, shape)


@pytest.mark.build
@pytest.mark.parametrize("dtype,shape", [("int8", dict(M=5, N=300)), ("float64", dict(M=9, N=77)),
                                         ("float16", dict(M=4, N=200))])
def test_reduce_sum_vector_reduce_axis_other_dtypes(device, dtype, shape):
    """Lanes follow the input dtype (64 int8 lanes accumulate in int32, 8 float64 lanes)."""
    spec, func, expr, progs = constructed("reduce_sum", shape, device, topk=2, dtype=dtype)
    for prog in progs:
        run_against_numpy(spec, func, expr, prog, device, shape, dtype)


@pytest.mark.build
@pytest.mark.parametrize("shape", [dict(M=256, N=4096), dict(M=512, N=1025)])
def test_row_sum_partial_sums_are_vectors(device, shape):
    """The row sum's reduce axis becomes a vector of partial sums: one lanes-wide vector per reg-tile row,
    updated with lanes-wide adds in the generated LLVM IR (also when the tile overhangs N: the predicated
    last iterations are split off); the grid stays parallel over rows. (Rows that fit the cores' own
    caches, 64 x 1025, may run on one core: the model then weighs the parallel loop's start against
    L2 bandwidth, see model.data_source.)"""
    spec, func, expr, progs = constructed("reduce_sum", shape, device, topk=1)
    prog = progs[0]
    assert prog.vector_axis == "n" and prog.tiles[0]["n"] % 16 == 0
    text = schedule(func, expr, prog, device).mod.script()
    assert "B_rf" in text
    assert "T.parallel(" in text and "T.vectorized(16)" in text
    ex = run_against_numpy(spec, func, expr, prog, device, shape)
    assert "fadd <16 x float>" in ex.mod.inspect_source("ll")


def test_reduce_vector_axis_narrower_than_a_vector_stays_scalar(device):
    """A reg tile of 4 along the reduce vector axis cannot fill a vector: no rfactor, the scalar path."""
    _, func, expr = analysed("reduce_sum", dict(M=64, N=256))
    assert default_vector_axis(expr) == "n"
    text = schedule(func, expr, program(expr, (16, 4), (32, 64), (32, 256)), device).mod.script()
    assert "B_rf" not in text and "B_global" in text


@pytest.mark.build
def test_small_accumulator_tile_is_a_stack_array(device):
    """A register-tile accumulator under 1 KiB (a depthwise conv's 7 x 16 outputs) is a stack array that
    LLVM keeps in registers, not a TVMBackendAllocWorkspace buffer behind an opaque pointer (the "local"
    scope went through the workspace whatever its size; the kernel ran 1.3-1.5x slower)."""
    shape = dict(N=1, H=16, W=16, C=32, R=3, S=3)  # no padding stage: the accumulator is the only buffer
    spec, func, expr = analysed("depthwise_conv2d", shape)
    ex = run_against_numpy(spec, func, expr, program(expr, (1, 7, 1, 16, 3, 1), (1, 7, 7, 16, 3, 3),
                                                     (1, 14, 14, 16, 3, 3)), device, shape)
    assert "TVMBackendAllocWorkspace" not in ex.mod.inspect_source("ll")


@pytest.mark.build
@pytest.mark.parametrize("op,shape,tiles", [
    ("conv2d", dict(N=1, H=8, W=4, C=24, K=48, R=1, S=1),   # the whole reduction per register tile
     ((1, 8, 1, 48, 1, 1, 1), (1, 8, 1, 48, 1, 1, 24), (1, 8, 2, 48, 1, 1, 24))),
    ("conv2d", dict(N=1, H=8, W=4, C=24, K=48, R=1, S=1),   # the same, 768 B: a stack array
     ((1, 4, 1, 48, 1, 1, 1), (1, 8, 1, 48, 1, 1, 24), (1, 8, 2, 48, 1, 1, 24))),
    ("conv2d", dict(N=1, H=8, W=4, C=24, K=48, R=1, S=1),   # split across L1 tiles: the L1 tile's
     ((1, 4, 1, 48, 1, 1, 1), (1, 8, 1, 48, 1, 1, 8), (1, 8, 2, 48, 1, 1, 24))),
    ("matmul", dict(M=64, N=64, K=256), ((8, 32, 1), (16, 32, 32), (32, 64, 128))),  # across top tiles
])
def test_accumulator_buffer_is_the_tile_the_policy_names(device, op, shape, tiles):
    """tails.accumulator_tile (what the model charges) names the buffer code generation allocates: a
    workspace allocation of its size when it is 1 KiB or more, none when it is a stack array (these plans
    pack nothing and have no padding stage: the accumulator is the only buffer)."""
    import re

    from roller.plan.tails import STACK_ARRAY_BYTES, accumulator_tile
    spec, func, expr = analysed(op, shape)
    prog = program(expr, *tiles)
    acc = accumulator_tile(expr, prog.tiles, prog.vector_axis, 16)
    nbytes = math.prod(expr.output.region(acc)) * 4
    ex = run_against_numpy(spec, func, expr, prog, device, shape)
    sizes = [int(n) for n in re.findall(r"call ptr %\w+\(i32 1, i32 %dev_id, i64 (\d+)", ex.mod.inspect_source("ll"))]
    assert sizes == ([nbytes] if nbytes >= STACK_ARRAY_BYTES else []), (acc, nbytes, sizes)


def test_cpu_builds_turn_off_tir_cse_and_keep_the_callers_options():
    """CPU targets compile without TVM's TIR CSE (tvmutil.CPU_PASS_CONFIG); an option the caller set in its
    own PassContext stays as set, and a non-CPU target gets the caller's context unchanged."""
    import tvm

    from roller.tir.compile import GPU_ONLY_PASSES, pass_context

    cpu = tvm.target.Target("llvm")
    assert dict(pass_context(cpu).config)["tirx.disable_cse_tir"]
    assert set(GPU_ONLY_PASSES) <= set(pass_context(cpu).disabled_pass)  # passes with nothing to do on a CPU
    with tvm.transform.PassContext(opt_level=3, config={"tirx.disable_cse_tir": False}):
        ctx = pass_context(cpu)
        assert ctx.opt_level == 3 and not dict(ctx.config)["tirx.disable_cse_tir"]
    gpu = tvm.target.Target({"kind": "cuda", "arch": "sm_80"}, host={"kind": "llvm"})
    assert "tirx.disable_cse_tir" not in dict(pass_context(gpu).config)
    assert not set(GPU_ONLY_PASSES) & set(pass_context(gpu).disabled_pass)


@pytest.mark.build
def test_register_tile_rows_are_addressed_without_vector_index_arithmetic(device):
    """A depthwise conv whose register tile spans 8 output rows (10 window rows) of an input it reads in
    place (the padding stage inlined), with the parallel grid over those rows: with TVM's TIR CSE every
    row's index was an int32 let plus a constant that LLVM sign-extended on its own, in vector registers
    (extractelement of i64 vectors: one per row), and the kernel ran 48 us against 35 for the same plan
    built without it (2 threads, 112x112x32). build() leaves the CSE to LLVM: fewer such extractions
    than window rows (the write-back's stores may keep one group of 4)."""
    import re

    import tvm
    from roller.tir.compile import target_for

    shape = dict(N=1, H=112, W=112, C=32, R=3, S=3, pad=1)
    spec, func, expr = analysed("depthwise_conv2d", shape)
    prog = dataclasses.replace(program(expr, (1, 8, 1, 16, 3, 1), (1, 8, 16, 16, 3, 3), (1, 8, 112, 32, 3, 3)),
                               inlined=("pad_temp",))
    ex = run_against_numpy(spec, func, expr, prog, device, shape)

    def extractions(ll):
        return len(re.findall(r"extractelement <\d+ x i64>", ll))
    with tvm.transform.PassContext(config={"tirx.disable_cse_tir": False}):
        with_cse = tvm.compile(schedule(func, expr, prog, device).mod, target_for(device)).mod.inspect_source("ll")
    assert extractions(with_cse) >= 10  # the effect this guards against, on this TVM
    assert extractions(ex.mod.inspect_source("ll")) < 10


@pytest.mark.build
def test_window_reduce_loop_stays_rolled_where_unrolling_would_spill(device):
    """A stem-like conv (stride 2, 7x7, register tile w16 x k16 x s7) keeps its s loop rolled
    (roller.plan.tails.rolled_reduce_axes) and matches numpy; the register loops over w stay unrolled."""
    shape = dict(N=1, H=40, W=40, C=3, K=16, R=7, S=7, stride=2, pad=3)
    tiles = ((1, 1, 16, 16, 1, 7, 1), (1, 1, 16, 16, 1, 7, 3), (1, 4, 16, 16, 7, 7, 3))
    expr, prog = check("conv2d", shape, device, lambda e: program(e, *tiles))
    sch = schedule(analysed("conv2d", shape)[1], expr, prog, device)
    kinds = {str(sch.get(lp).loop_var.name): int(sch.get(lp).kind) for lp in sch.get_loops(sch.get_sblock("conv_update"))}
    import tvm
    assert kinds["s"] == int(tvm.tirx.ForKind.SERIAL), kinds
    assert any(k == int(tvm.tirx.ForKind.UNROLLED) for name, k in kinds.items() if name.startswith("w")), kinds


# --- the function's own zero padding: copied per top tile, or inlined (RProgram.inlined), a plan choice

def test_padding_stage_is_a_plan_choice_the_model_charges(device):
    """Construction offers both ways to run a padding stage; the model charges the copy to the staged plan
    and a bounds check per load to the inlined one, so a memory-bound stride-2 depthwise conv reads in
    place while a compute-bound 3x3 conv keeps its copy (both measured so, see model.INLINE_CHECK_CYCLES)."""
    from roller.plan.choices import estimate_tiles
    from roller.plan.tails import copy_bytes, inline_options

    dw_spec, _, dw, dw_progs = constructed("depthwise_conv2d", dict(N=1, H=112, W=112, C=96, R=3, S=3, stride=2,
                                                                     pad=1), device, topk=3)
    top = dw_progs[0]
    assert inline_options(dw, top.tiles, top.vector_axis, 16, ()) == [(), ("pad_temp",)]
    staged = estimate_tiles(dw, top.tiles, device, top.vector_axis, top.padded, ())
    inlined = estimate_tiles(dw, top.tiles, device, top.vector_axis, top.padded, ("pad_temp",))
    assert copy_bytes(dw, top.tiles[-1], (), top.packed, ("pad_temp",)) < copy_bytes(dw, top.tiles[-1], (), top.packed)
    # its window is read in vectors along the channels: one check per window row, not charged
    assert inlined.compute_seconds == staged.compute_seconds and inlined.seconds < staged.seconds
    assert top.inlined == ("pad_temp",)
    _, _, conv, conv_progs = constructed("conv2d", dict(N=1, H=56, W=56, C=64, K=64, R=3, S=3, pad=1), device, 3)
    first = conv_progs[0]
    assert first.inlined == ()
    # its window is broadcast element by element along the output channels: each load is checked
    assert (estimate_tiles(conv, first.tiles, device, first.vector_axis, first.padded, ("pad_temp",)).compute_seconds
            > estimate_tiles(conv, first.tiles, device, first.vector_axis, first.padded, ()).compute_seconds)
    # no padding stage, nothing to inline
    _, _, mm, mm_progs = constructed("matmul", dict(M=8, N=8, K=8), device, 1)
    assert inline_options(mm, mm_progs[0].tiles, mm_progs[0].vector_axis, 16, ()) == [()]


@pytest.mark.build
def test_a_multi_vector_register_tile_over_a_predicated_axis_reads_its_window_in_place(device):
    """Where code generation splits a predicated vector axis's partial vector off (tails.vector_tail_split),
    a register tile of several vectors may inline the padding stage: its whole vectors and the split-off
    partial one each keep one bounds check per window row. Where it cannot, the stage stays a copy (the
    partial vector left inside the unrolled tile would load lane by lane)."""
    from roller.builder.api import analyze as api_analyze
    from roller.targets import construct
    from roller.plan.tails import inline_options, vector_tail_split
    shape = dict(N=1, H=9, W=11, C=42, R=3, S=3, pad=1)
    spec = ops.OPS["pool2d"].with_options(kind="avg")
    expr, func = api_analyze(spec.make(shape))
    prog = construct(expr, device, topk=1).programs[0]
    one = {"n": 1, "h": 1, "w": 1, "c": 48, "r": 1, "s": 1}
    tiles = [one, dict(one, r=3, s=3), dict(one, w=11, r=3, s=3)]  # 3-vector register tiles, one row a top tile
    assert vector_tail_split(expr, tiles, "c", 16)  # one top tile over the channels
    assert inline_options(expr, tiles, "c", 16, ()) == [(), ("pad_temp",)]
    # 100 channels in 64-channel top tiles, the whole map in each: the channels' grid loop is the parallel
    # loop, with a loop of 2-vector tiles below it; the partial vector is not split off
    wide, _ = api_analyze(spec.make(dict(shape, C=100)))
    two = dict(one, c=32)
    unsplit = [two, dict(two, r=3, s=3), dict(two, h=9, w=11, c=64, r=3, s=3)]
    assert not vector_tail_split(wide, unsplit, "c", 16) and inline_options(wide, unsplit, "c", 16, ()) == [()]
    plan = dataclasses.replace(prog, tiles=tuple(tiles), vector_axis="c", padded=(), predicated=("c",),
                               inlined=("pad_temp",))
    run_against_numpy(spec, func, expr, plan, device, shape)


@pytest.mark.build
@pytest.mark.parametrize("op,shape", [
    ("depthwise_conv2d", dict(N=1, H=13, W=11, C=20, R=3, S=3, stride=2, pad=1)),
    ("depthwise_conv2d", dict(N=2, H=9, W=9, C=16, R=5, S=5, pad=2, dilation=2)),
    ("pool2d", dict(N=1, H=12, W=15, C=33, R=3, S=3, stride=2, pad=1)),
    ("conv2d", dict(N=1, H=10, W=10, C=8, K=24, R=3, S=3, pad=1)),
])
def test_inlined_and_staged_padding_numerics(device, op, shape):
    """Both ways of running the padding stage give numpy's result, at the borders too (unwritten or
    wrongly padded elements fail: the output starts as NaN)."""
    import dataclasses

    spec, func, expr, progs = constructed(op, shape, device, topk=1)
    prog = progs[0]
    for inlined in ((), ("pad_temp",)):
        run_against_numpy(spec, func, expr, dataclasses.replace(prog, inlined=inlined), device, shape)
    with pytest.raises(BuildError, match="inlines the stage"):
        build(func, expr, dataclasses.replace(prog, inlined=("weight",)), device)


@pytest.mark.build
@pytest.mark.parametrize("rows,cols,shape", [
    # a stride-2 3x3 conv in register tiles of 4 rows: most tiles read no padding
    (4, 1, dict(N=1, H=28, W=28, C=8, K=64, R=3, S=3, stride=2, pad=1)),
    # the register tile is a whole column of the 7x7 output: every tile reads a padded row, none runs unchecked
    (7, 1, dict(N=1, H=14, W=14, C=8, K=32, R=3, S=3, stride=2, pad=1)),
])
def test_register_tiles_inside_the_padding_run_without_bounds_checks(device, rows, cols, shape):
    """With its zero padding read in place, a convolution runs the register tile's reduction twice over: a copy
    without the checks where the tile reads no padding, the checked loops at the borders; both give numpy's
    result (the border tiles included: the output starts as NaN)."""
    from roller.targets.cpu.inline_pad import unswitched_padding

    spec, func, expr, progs = constructed("conv2d", shape, device, topk=1)
    reg = dict(progs[0].tiles[0], h=rows, w=cols, r=3, s=1, c=1, k=shape["K"] // 2)
    l1 = dict(reg, c=shape["C"])
    top = dict(l1, h=rows * (2 if rows < 7 else 1), w=expr.axis("w").extent, s=3)
    plan = dataclasses.replace(progs[0], tiles=(reg, l1, top)[:len(progs[0].tiles)], vector_axis="k", padded=(),
                               predicated=(), packed=(), inlined=("pad_temp",), storage_pad={})
    text = schedule(func, expr, plan, device).mod.script()
    checked = "T.if_then_else" in text
    if rows < 7:
        assert "_inside" in text and checked, text  # both copies
        inside = text[text.index("_inside"):]
        assert "T.if_then_else" not in inside[:inside.index("else:")], text  # the copy reads without checks
    else:
        assert "_inside" not in text and checked, text
    run_against_numpy(spec, func, expr, plan, device, shape)
    # a function without a block of that name, or without checks, is returned as it was
    assert unswitched_padding(func, "no_such_block", {"data"}).same_as(func)
    assert unswitched_padding(func, "conv", {"weight"}).same_as(func)


@pytest.mark.build
def test_a_tile_wider_than_a_short_vector_axis_runs_whole_vectors(device):
    """A register tile of 48 channels over 36 (the whole axis, not a whole number of vectors) and its
    write-back run 16-lane vectors, the last one predicated: vectorized whole, 84 channels of an average
    pool ran 16x slower. The kernel stays right at the tail."""
    from roller.builder.api import analyze as api_analyze
    from roller.targets import construct

    spec, shape = ops.OPS["pool2d"].with_options(kind="avg"), dict(N=1, H=6, W=5, C=36, R=3, S=3, pad=1)
    expr, func = api_analyze(spec.make(shape))
    first = construct(expr, device, topk=1).programs[0]
    prog = dataclasses.replace(first, tiles=tuple(dict(t, c=48) for t in first.tiles), predicated=("c",),
                               padded=())
    text = schedule(func, expr, prog, device).mod.script()
    assert "T.vectorized(16)" in text and "T.vectorized(36)" not in text, text
    assert "range(36)" not in text, text  # the write-back is not left scalar
    run_against_numpy(spec, func, expr, prog, device, shape)


@pytest.mark.build
@pytest.mark.parametrize("shape", [dict(N=1, H=10, W=9, C=32, K=32, R=3, S=3, pad=1, groups=8),   # 4 a group
                                   dict(N=1, H=7, W=6, C=12, K=18, R=3, S=3, pad=1, groups=6)])  # 2 in, 3 out
def test_group_replication_is_vectorized_in_runs_of_one_broadcast_element(device, shape):
    """group_rep's value repeats one input channel over the K/groups output channels of its group: the
    copy is vectorized in runs of that many lanes (roller.tir.ops.LANE_RUN), and the kernel stays right."""
    spec, func, expr, plans = constructed("conv2d", shape, device, topk=2)
    kg = shape["K"] // shape["groups"]
    for prog in plans:
        text = schedule(func, expr, prog, device).mod.script()
        copy = text[text.index('T.sblock("group_rep")') - 300:text.index('T.sblock("group_rep")')]
        assert f"T.vectorized({kg})" in copy, copy
        run_against_numpy(spec, func, expr, prog, device, shape)


@pytest.mark.build
def test_transposed_pack_goes_in_square_blocks(device):
    """B of an [N, K] linear layer packed transposed per top tile: 16 x 16 blocks (each source run of 16
    read for 16 rows at a time), not a run of every row of the tile at once; and the kernel stays right.
    (The blocks as the schedule leaves them: the plan without register transposes, which would shuffle them.)"""
    import dataclasses

    spec = ops.OPS["matmul"].with_options(layout="nt")
    shape = {"M": 40, "N": 96, "K": 64}
    from roller.builder.api import analyze as api_analyze
    from roller.targets import construct
    expr, func = api_analyze(spec.make(shape))
    prog = next(p for p in construct(expr, device, topk=5).programs if p.layouts.get("B"))
    prog = dataclasses.replace(prog, register_transposes=())
    text = schedule(func, expr, prog, device).mod.script()
    copy = text[:text.index('T.sblock("B_global")')].splitlines()[-3:]
    n_top = prog.tiles[-1]["n"]
    assert f"T.grid({n_top // 16}, {prog.tiles[-1]['k'] // 16}, 16)" in copy[0], copy  # rows in 16s
    assert "T.vectorized(16)" in copy[1], copy
    run_against_numpy(spec, func, expr, prog, device, shape)


@pytest.mark.build
def test_a_transpose_whose_runs_split_a_fused_axis_is_no_register_transpose(device):
    """NHWC -> NCHW of a 12 x 12 x 16 map: the Expr fuses H and W into one axis of 144 (whole 16-lane
    vectors), but the buffer's run is W's 12. The plan must not ask for 16 x 16 register blocks there (the
    code cannot make them: it was a BuildError, and the function went to TVM's generic schedule); it
    builds, and the output is numpy's."""
    import tvm
    from tvm import te, topi

    from roller.builder.api import analyze as api_analyze
    from roller.targets import construct

    x = te.placeholder((1, 12, 12, 16), "float32", "X")
    y = topi.transpose(x, (0, 3, 1, 2))
    expr, func = api_analyze(te.create_prim_func([x, y]))
    assert any(len(a.parts) > 1 for a in expr.axes), expr.axes  # the fused spatial axis
    for prog in construct(expr, device, topk=3).programs:
        assert not prog.register_transposes, prog
        ex = build(func, expr, prog, device)
        a = np.random.default_rng(0).normal(size=(1, 12, 12, 16)).astype(np.float32)
        out = tvm.runtime.tensor(fill_sentinel(np.empty((1, 16, 12, 12), np.float32)))
        ex["main"](tvm.runtime.tensor(a), out)
        np.testing.assert_array_equal(out.numpy(), a.transpose(0, 3, 1, 2))


@pytest.mark.build
def test_a_transpose_of_a_reshaped_tensor_is_no_register_transpose(device):
    """Attention's K: [1, 32, 64] reshaped to [1, 32, 4, 16] (4 heads) and transposed to [1, 4, 16, 32]. The
    source is indexed by no axis in its first dimension and by two (head x 16 + j) in its last: its copy has
    no loop of its own per dimension, so no register blocks (it was a BuildError, and the quantized
    encoder's K transposes went to TVM's generic schedule); the plans build and equal numpy's."""
    import tvm
    from tvm import te, topi

    from roller.builder.api import analyze as api_analyze
    from roller.targets import construct

    x = te.placeholder((1, 32, 64), "float32", "X")
    y = topi.transpose(topi.reshape(x, (1, 32, 4, 16)), (0, 2, 3, 1))
    expr, func = api_analyze(te.create_prim_func([x, y]))
    a = np.random.default_rng(1).normal(size=(1, 32, 64)).astype(np.float32)
    for prog in construct(expr, device, topk=3).programs:
        assert not prog.register_transposes, prog
        out = tvm.runtime.tensor(fill_sentinel(np.empty((1, 4, 16, 32), np.float32)))
        build(func, expr, prog, device)["main"](tvm.runtime.tensor(a), out)
        np.testing.assert_array_equal(out.numpy(), a.reshape(1, 32, 4, 16).transpose(0, 2, 3, 1))


@pytest.mark.build
def test_a_split_top_tile_reduction_zeroes_its_accumulator_in_buffer_order(device):
    """Where the top tile's reduction is split, its accumulator is the top tile's whole output region and
    the init zeroes it all: its loops go in the output's dimension order (rows, then the columns with the
    vector lanes innermost), not the register tile's order, in which LLVM unrolled thousands of short
    memsets (2.3-2.7 s of code generation for one ResNet-50 conv). The kernel stays right."""
    import re

    shape = dict(M=32, N=64, K=64)
    spec, func, expr, (first,) = constructed("matmul", shape, device, topk=1)
    tiles = ({"m": 4, "n": 32, "k": 1}, {"m": 4, "n": 32, "k": 16}, {"m": 32, "n": 64, "k": 16})
    prog = dataclasses.replace(first, tiles=tiles, grid={"m": 1, "n": 1}, packed=(), storage_pad=(),
                               layouts={}, prepacked=(), predicated=(), padded=())
    text = schedule(func, expr, prog, device).mod.script()
    headers = [ln.split(" in ")[0] for ln in text.splitlines() if ln.strip().startswith("for ") and "_init" in ln]
    axes = [name[0] for h in headers for name in re.findall(r"\w+_init", h)]
    assert axes.count("m") >= 2 and axes.count("n") >= 2, text  # the tile's loops of both axes
    assert axes == sorted(axes), text  # every m loop before every n loop
    run_against_numpy(spec, func, expr, prog, device, shape)


@pytest.mark.build
def test_a_predicated_vector_axis_runs_its_partial_vector_as_a_narrower_vector(device):
    """42 channels in 16-channel tiles leave a 10-lane partial vector. Left in the 16-lane loop with its
    bound, TVM emitted it scalar and LLVM regathered it into 8 + 2 lane pieces shuffled in and out of
    every accumulator (depthwise 5x5 on 83x83x42: 539 us against 358 one thread); split off as a vector
    loop of its own it is one 10-lane vector operation per accumulator. The kernel stays right."""
    shape = dict(N=1, H=13, W=13, C=42, R=5, S=5, pad=2)
    spec, func, expr = analysed("depthwise_conv2d", shape)
    prog = dataclasses.replace(program(expr, (1, 4, 1, 16, 1, 1), (1, 4, 7, 16, 5, 5), (1, 4, 7, 16, 5, 5)),
                               predicated=("h", "w", "c"))
    from roller.plan.choices import held_grid
    prog = dataclasses.replace(prog, held_grid=held_grid(expr, prog.tiles, prog.vector_axis, 16, prog.predicated))
    ex = run_against_numpy(spec, func, expr, prog, device, shape)
    ll = ex.mod.inspect_source("ll")
    assert "<10 x float>" in ll


@pytest.mark.build
def test_kernel_libraries_are_linked_by_ld_and_fall_back_to_the_compiler_driver(device, tmp_path, monkeypatch):
    """A kernel's library is linked by ld alone (TVM's g++ -shared: 40-70 ms a library, ld under 10); it
    loads and computes right. Anything ld cannot take (a source file, options) goes through TVM's own
    create_shared, and so does everything where ld fails."""
    import tvm
    from tvm.support import cc

    from roller.tir import compile as tvmutil

    shape = dict(M=33, N=40)
    spec, func, expr = analysed("add_relu", shape)
    prog = program(expr, (1, 16), (1, 16), (11, 48))
    ex = tvmutil.compile_for(schedule(func, expr, prog, device).mod, tvmutil.target_for(device))
    driver = []
    real = cc.create_shared
    monkeypatch.setattr(cc, "create_shared", lambda *a, **k: driver.append(a) or real(*a, **k))
    path = str(tmp_path / "k.so")
    tvmutil.export_library(ex, path)
    assert tvmutil._direct_linker() is not None and not driver  # this machine has ld: the driver is not run
    ins = spec.inputs(shape)
    out = tvm.runtime.tensor(np.zeros((33, 40), "float32"))
    tvm.runtime.load_module(path)["main"](*[tvm.runtime.tensor(a) for a in ins], out)
    np.testing.assert_allclose(out.numpy(), spec.reference(ins, shape), rtol=1e-6)
    src = tmp_path / "f.c"
    src.write_text("int roller_probe(void) { return 7; }\n")
    tvmutil._link_shared(str(tmp_path / "c.so"), [str(src)])
    assert len(driver) == 1 and (tmp_path / "c.so").exists()


@pytest.mark.build
def test_a_root_copy_splits_off_its_rows_partial_vector(device):
    """A padded copy made once at root vectorizes its rows; a row that ends in a partial vector (A's 40
    columns: 2 vectors and 8) has that vector split off at lowering (the partition hint), as a vector
    loop carrying the bound ran scalar: the prime matmul's A copy, 1.03-1.06x of the kernel."""
    from roller.tir.schedutil import PARTITION_HINT

    def plan(expr):
        prog = program(expr, (4, 16, 1), (4, 16, 8), (16, 48, 40), packed=("B",))
        return dataclasses.replace(prog, padded=("m", "n"), predicated=())

    expr, prog = check("matmul", {"M": 13, "N": 37, "K": 40}, device, plan)
    spec, func, _ = analysed("matmul", {"M": 13, "N": 37, "K": 40})
    text = schedule(func, expr, prog, device, []).mod.script()
    copy = text[text.index('T.sblock("A_pad")') - 400:text.index('T.sblock("A_pad")')]
    assert PARTITION_HINT in copy and "T.vectorized(16)" in copy


@pytest.mark.build
def test_a_two_vector_register_tile_over_an_odd_count_of_vectors_pads_the_last_one(device):
    """168 output channels are 11 vectors; construction offers register tiles two vectors wide (12
    vectors, construct.TWO_VECTOR_WASTE) and tiles the levels above over the padded 192. The kernel
    covers every channel and writes none past 168."""
    from roller.builder.api import analyze as api_analyze
    from roller.plan.construct import enumerate_programs

    spec, shape = ops.OPS["conv2d"], dict(N=1, H=6, W=7, C=168, K=168, R=1, S=1, stride=1, pad=0, dilation=1,
                                          groups=1)
    expr, func = api_analyze(spec.make(shape))
    plans = [p for p in enumerate_programs(expr, device, 0.0) if p.vector_axis == "k" and p.tiles[0]["k"] == 32]
    assert plans, "no two-vector register tile offered over 11 vectors"
    over = [p for p in plans if p.tiles[-1]["k"] > 168]
    assert over, "no plan tiles the levels above over the padded extent"
    run_against_numpy(spec, func, expr, over[0], device, shape)
    run_against_numpy(spec, func, expr, plans[0], device, shape)


def concatenation(device, count: int, shape: tuple[int, ...], sizes: tuple[int, int, int]):
    """(analysis, constructed first plan with the channels' tiles set to ``sizes``) of ``count`` inputs of
    ``shape`` concatenated along their last axis, and a check that runs a build of it exactly against numpy."""
    import tvm
    from tvm import te, topi

    from roller.targets import construct

    ins = [te.placeholder(shape, name=f"x{i}") for i in range(count)]
    an = analyze(te.create_prim_func([*ins, topi.concatenate(ins, axis=len(shape) - 1)]))
    first = construct(an.expr, device, topk=1).programs[0]
    channels = an.expr.axes[-1].name
    assert an.expr.axes[-1].extent == count * shape[-1] and first.vector_axis == channels
    prog = dataclasses.replace(first, tiles=tuple({**t, channels: size} for t, size in zip(first.tiles, sizes)))

    def run_exactly(ex):
        rng = np.random.default_rng(0)
        xs = [rng.standard_normal(shape).astype("float32") for _ in ins]
        out = tvm.runtime.tensor(fill_sentinel(np.empty((*shape[:-1], count * shape[-1]), "float32")))
        ex["main"](*[tvm.runtime.tensor(x) for x in xs], out)
        np.testing.assert_array_equal(out.numpy(), np.concatenate(xs, axis=-1))
    return an, prog, run_exactly


def test_a_concatenations_channel_loop_is_split_where_its_inputs_meet(device):
    """A concatenation selects its input by channel (``if_then_else(c < 256, a, b)``). With a partition hint on
    the channels' tile loop, lowering splits it where the inputs meet and each side copies whole vectors of
    one input (SqueezeNet's 27x27 of 256 + 256 channels, alone: 58 -> 23 us); the copy stays exact."""
    from roller.tir.schedutil import PARTITION_HINT

    an, prog, run_exactly = concatenation(device, 2, (1, 9, 9, 256), (16, 512, 512))  # a tile loop of 32
    assert PARTITION_HINT in schedule(an.func, an.expr, prog, device).mod.script()
    run_exactly(build(an.func, an.expr, prog, device))


def test_a_concatenations_register_tile_wider_than_an_input_copies_whole_vectors(device):
    """A register tile three vectors wide over inputs two vectors wide: its vector loop gets the partition hint
    too (not unrolled), so lowering splits it where the inputs meet and copies whole vectors. Unrolled, the
    selects stayed in every piece of the tile loop's partition, TVM copied the whole tile lane by lane and LLVM
    spent 0.2-0.5 s re-vectorizing each of DenseNet-121's concatenations (docs/models.md, "Compile time").
    The copy stays exact."""
    import tvm

    from roller.tir.compile import compile_for, target_for
    from roller.tir.schedutil import PARTITION_HINT

    lanes = device.units.vector_bytes // 4
    an, prog, run_exactly = concatenation(device, 3, (1, 5, 5, 2 * lanes), (3 * lanes, 6 * lanes, 6 * lanes))
    mod = schedule(an.func, an.expr, prog, device).mod
    vector_loop = re.search(r"for \w+ in T\.(\w+)\(3(, annotations=\{[^}]*\})?\):\s+for \w+ in T\.vectorized", mod.script())
    assert vector_loop and vector_loop.group(1) == "serial" and PARTITION_HINT in (vector_loop.group(2) or "")
    lowered: list[str] = []

    @tvm.instrument.pass_instrument
    class AfterVectorizing:
        def run_after_pass(self, mod, info):
            if info.name == "tirx.VectorizeLoop":
                lowered.append(mod.script())

    with tvm.transform.PassContext(instruments=[AfterVectorizing()]):
        ex = compile_for(tvm.IRModule({"main": mod["main"].with_attr("global_symbol", "main")}), target_for(device))
    assert lowered and "T.Ramp" in lowered[0]  # whole vectors copied (before: every lane through the selects)
    run_exactly(ex)


def test_a_register_loop_of_more_than_max_unroll_rows_is_not_unrolled(device):
    """A register tile of 113 rows of a 4-wide vector axis (a QDQ model's quantized input, 226 x 226 x 4 with
    its padding) unrolled into 113 copies of its quantization chain took 9-17 s to compile and ran 92 us;
    left a loop, 0.2 s and 60 us. Loops of up to MAX_UNROLL rows stay unrolled (a float transpose's 64 rows of
    3 channels ran 19 us unrolled against 25 in 14-row tiles). The result stays exact."""
    from roller.targets.cpu.schedule import MAX_UNROLL

    rows = MAX_UNROLL + 49  # 113
    expr, prog = check("add_relu", dict(M=2 * rows, N=4), device, lambda e: program(e, (rows, 4), (rows, 4),
                                                                                  (2 * rows, 4)))
    _, func, _ = analysed("add_relu", dict(M=2 * rows, N=4))
    text = schedule(func, expr, prog, device).mod.script()
    assert "T.unroll(" not in text and re.search(rf"for \w+(, \w+)* in T\.grid\([^)]*\b{rows}\)", text)
    expr, prog = check("add_relu", dict(M=2 * MAX_UNROLL, N=4), device,
                       lambda e: program(e, (MAX_UNROLL, 4), (MAX_UNROLL, 4), (2 * MAX_UNROLL, 4)))
    _, func, _ = analysed("add_relu", dict(M=2 * MAX_UNROLL, N=4))
    assert f"T.unroll({MAX_UNROLL})" in schedule(func, expr, prog, device).mod.script()
