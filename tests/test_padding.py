"""Padding overhanging tiles (roller.targets.cpu.padding): every kernel is checked against numpy; padded
kernels must have no predicate left in the main computation."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from roller.plan.choices import estimated, held_grid

from roller.tir import ops
from roller.builder.api import analyze as api_analyze
from roller.targets import build, schedule
from roller.targets.cpu.padding import pad_to_tiles, padded_extents
from roller.targets import construct
from roller.device.load import load_device
from roller.errors import BuildError
from roller.plan.rprogram import RProgram
from roller.plan.tails import overhangs, tail_options
from roller.plan.rtile import default_vector_axis
from roller.device.spec import family_model

CPU_MODEL = family_model("cpu")  # the model figures every CPU spec has by default

LEVELS = ("reg", "L1", "L2")


@pytest.fixture(scope="module")
def device():
    return load_device("x86-avx512", calibrated=False)


def program(expr, reg, l1, l2, packed=(), pad=None, padded=True):
    """An RProgram whose tiles are given as tuples in the Expr's axis order; its overhanging axes are
    padded where roller.plan.tails allows it (``padded=False``: predicated)."""
    names = [a.name for a in expr.axes]
    tiles = tuple(dict(zip(names, t)) for t in (reg, l1, l2))
    pads, preds = tail_options(expr, tiles, default_vector_axis(expr), 16)[-1 if padded else 0]
    return RProgram(levels=LEVELS, tiles=tiles, grid={}, units=2, waves=1, vector_axis=default_vector_axis(expr),
                    packed=tuple(packed), storage_pad=dict(pad or {}), padded=pads, predicated=preds,
                    held_grid=held_grid(expr, tiles, default_vector_axis(expr), 16, preds))


def run(func, expr, prog, device, ins, ref, tol=1e-4):
    """Builds the plan through roller.targets.build and compares its output with ``ref``."""
    import tvm

    ex = build(func, expr, prog, device)
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.full(ref.shape, np.nan, "float32"), dev)
    ex["main"](*[tvm.runtime.tensor(a, dev) for a in ins], out)
    np.testing.assert_allclose(out.numpy(), ref, rtol=tol, atol=tol, err_msg=prog.describe())


def op_case(op, shape):
    spec = ops.OPS[op]
    full = ops.validate_shape(op, shape)
    expr, func = api_analyze(spec.make(full))
    ins = spec.inputs(full, "float32", np.random.default_rng(0))
    return func, expr, ins, spec.reference([a.astype("float64") for a in ins], full)


def main_block_predicated(sch, block: str) -> bool:
    """Whether a block named ``block`` or ``block_update`` / ``block_init`` carries a T.where."""
    chunks = sch.mod.script().split("with T.sblock(")
    mine = [c for c in chunks if c.startswith((f'"{block}"', f'"{block}_update"', f'"{block}_init"'))]
    assert mine, f"no block {block!r} in the schedule"
    return any("T.where" in c for c in mine)


def test_padded_extents_round_up_to_clamped_top_tiles():
    from policy_exprs import matmul

    expr = matmul(1000, 5, 3)
    prog = program(expr, (8, 16, 1), (72, 16, 2), (72, 48, 2))
    assert prog.padded == ("i", "k") and prog.predicated == ()
    # i: 1000 -> 14 tiles of 72; j: the tiles clamp to the extent (5); k: 3 -> 2 tiles of 2
    assert padded_extents(expr, prog, 16) == {"i": 1008, "j": 5, "k": 4}
    assert program(expr, (8, 16, 1), (72, 16, 2), (72, 48, 2), padded=False).predicated == ("i", "k")


@pytest.mark.build
@pytest.mark.parametrize("op,shape", [
    ("matmul", dict(M=1000, N=1000, K=1000)),
    ("matmul", dict(M=1025, N=1021, K=1019)),
    ("matmul", dict(M=127, N=131, K=137)),
    ("matmul", dict(M=13, N=1000, K=97)),
    ("batch_matmul", dict(B=2, M=127, N=131, K=137)),
    ("batch_matmul", dict(B=3, M=67, N=1000, K=61)),
])
def test_constructed_overhanging_plans_are_right_padded_and_predicated(device, op, shape):
    """The constructed plans, and the first overhanging one with its other tail choice, are right."""
    from roller.plan.tails import scalar_tail_tiles

    func, expr, ins, ref = op_case(op, shape)
    plans = list(construct(expr, device, topk=2).programs)
    over = next((p for p in plans if p.padded or p.predicated), None)
    assert over is not None, f"{op} {shape}: no constructed plan overhangs, the case tests nothing"
    options = tail_options(expr, over.tiles, over.vector_axis, 16)
    every = overhangs(expr, over.tiles, over.vector_axis, 16)
    # every overhanging axis of these einsums can be padded; mixed plans pad some, predicate the rest, except
    # that a vector axis whose bound would leave scalar tail tiles is only padded (tails.scalar_tail_tiles)
    assert (every, ()) in options
    if scalar_tail_tiles(expr, over.tiles, over.vector_axis, 16):
        assert all(over.vector_axis not in preds for _, preds in options)
    else:
        assert ((), every) in options
    assert all(set(pads) | set(preds) == set(every) and not set(pads) & set(preds) for pads, preds in options)
    for pads, preds in options:
        # the held grid loop and the balancing follow the tails (roller.plan.choices.held_grid, estimated)
        variant = replace(over, padded=pads, predicated=preds, balanced=False,
                          held_grid=held_grid(expr, over.tiles, over.vector_axis, 16, preds))
        plans.append(estimated(expr, variant, device)[0])
    for p in plans:
        run(func, expr, p, device, ins, ref)


@pytest.mark.build
@pytest.mark.parametrize("shape,tiles", [
    # extents smaller than a vector (16 lanes) and than the tiles; m and k overhang
    (dict(M=5, N=7, K=3), ((2, 4, 1), (4, 4, 2), (4, 8, 2))),
    (dict(M=31, N=17, K=29), ((8, 16, 1), (16, 16, 8), (32, 32, 16))),
])
def test_small_extents_pad_without_predicates(device, shape, tiles):
    func, expr, ins, ref = op_case("matmul", shape)
    prog = program(expr, *tiles, packed=("B",), pad={"B": 16})
    assert prog.padded
    padded = pad_to_tiles(func, expr, prog, 16)
    assert padded.program.packed == ("B_pad",)
    assert padded.program.storage_pad == {"B_pad": 16}
    run(func, expr, prog, device, ins, ref)


@pytest.mark.build
def test_padded_main_block_has_no_predicate(device):
    func, expr, ins, ref = op_case("matmul", dict(M=1000, N=1000, K=1000))
    prog = program(expr, (8, 48, 1), (72, 48, 16), (72, 336, 336))
    padded = pad_to_tiles(func, expr, prog, 16)
    assert padded.extents == {"m": 1008, "n": 1008, "k": 1008}
    assert {t.name for t in padded.expr.inputs} == {"A_pad", "B_pad"}
    assert padded.expr.output.shape == (1008, 1008)
    assert padded.root_copies == {"A_pad", "B_pad"}  # plain inputs, not packed: padded once at root
    # the same plan predicated carries bounds in its innermost loops: the check below can fail
    predicated = program(expr, (8, 48, 1), (72, 48, 16), (72, 336, 336), padded=False)
    assert main_block_predicated(schedule(func, expr, predicated, device), expr.block)
    assert not main_block_predicated(schedule(func, expr, prog, device), expr.block)
    run(func, expr, prog, device, ins, ref)
    run(func, expr, predicated, device, ins, ref)


@pytest.mark.build
@pytest.mark.parametrize("shape,tiles", [
    # axes n, h, w, k | r, s, c: h, w, k and c overhang; the window h + r is re-indexed, then padded
    (dict(N=1, H=7, W=7, C=5, K=19, R=3, S=3, pad=1),
     ((1, 1, 2, 16, 1, 1, 1), (1, 2, 4, 16, 3, 1, 4), (1, 4, 4, 16, 3, 3, 4))),
    (dict(N=2, H=17, W=17, C=127, K=131, R=3, S=3, stride=2, pad=0),
     ((1, 2, 1, 32, 1, 1, 1), (1, 4, 2, 32, 3, 1, 16), (1, 4, 4, 64, 3, 3, 32))),
])
def test_conv2d_pads_through_a_reindexed_window(device, shape, tiles):
    func, expr, ins, ref = op_case("conv2d", shape)
    prog = program(expr, *tiles)
    assert prog.padded and padded_extents(expr, prog, 16) != expr.extents
    padded = pad_to_tiles(func, expr, prog, 16)
    window = next(t for t in padded.expr.inputs if t.name.startswith("pad_temp") or t.name.startswith("data"))
    assert all(len(dim) == 1 for dim in window.index)  # one plain dimension per axis after reindex
    assert not main_block_predicated(schedule(func, expr, prog, device), expr.block)
    run(func, expr, prog, device, ins, ref, tol=1e-3)
    run(func, expr, program(expr, *tiles, padded=False), device, ins, ref, tol=1e-3)


@pytest.mark.build
def test_epilogue_is_kept_through_the_crop(device):
    """matmul + bias + ReLU: the epilogue reads the cropped output; the crop takes it in."""
    from tvm import te, tirx

    M, N, K = 50, 37, 29
    A = te.placeholder((M, K), "float32", name="A")
    B = te.placeholder((K, N), "float32", name="B")
    bias = te.placeholder((N,), "float32", name="bias")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda m, n: te.sum(A[m, k] * B[k, n], axis=k), name="C")
    D = te.compute((M, N), lambda m, n: te.max(C[m, n] + bias[n], tirx.const(0, "float32")), name="D")
    expr, func = api_analyze(te.create_prim_func([A, B, bias, D]))
    prog = program(expr, (8, 16, 1), (16, 32, 8), (32, 32, 16), packed=("B",))
    assert prog.padded
    rng = np.random.default_rng(1)
    ins = [rng.uniform(-1, 1, s).astype("float32") for s in ((M, K), (K, N), (N,))]
    ref = np.maximum(ins[0].astype("float64") @ ins[1] + ins[2], 0)
    run(func, expr, prog, device, ins, ref)


@pytest.mark.build
def test_max_reduction_does_not_pad_its_reduce_axis(device):
    """Zero padding of k would add max(.., 0) terms: the policy predicates k, and codegen refuses a
    plan that pads it anyway."""
    from tvm import te

    M, N, K = 20, 33, 7
    A = te.placeholder((M, K), "float32", name="A")
    B = te.placeholder((K, N), "float32", name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda m, n: te.max(A[m, k] * B[k, n], axis=k), name="C")
    expr, func = api_analyze(te.create_prim_func([A, B, C]))
    assert expr.zero_pad_axes == ()
    prog = program(expr, (4, 16, 1), (8, 16, 4), (8, 32, 4))
    assert "k" not in prog.padded and "k" in prog.predicated  # the vector axis n may be padded
    with pytest.raises(BuildError, match="zero padding would change the result"):
        pad_to_tiles(func, expr, replace(prog, padded=prog.padded + prog.predicated, predicated=()), 16)
    rng = np.random.default_rng(2)
    ins = [rng.uniform(-1, -0.5, (M, K)).astype("float32"), rng.uniform(0.5, 1, (K, N)).astype("float32")]
    ref = (ins[0][:, :, None].astype("float64") * ins[1][None]).max(axis=1)  # all negative: a 0 would win
    run(func, expr, prog, device, ins, ref)


def test_streaming_and_fused_plans_are_not_padded(device):
    """A row sum reads each input element once (padding would copy it all); add_relu's axes are fused."""
    func, expr, _, _ = op_case("reduce_sum", dict(M=127, N=1021))
    assert expr.zero_pad_axes == ("n",)
    tiles = tuple(dict(zip(("m", "n"), t)) for t in ((1, 16), (16, 256), (16, 1024)))
    assert tail_options(expr, tiles, "n", 16) == [((), ("m", "n"))]
    func, expr, _, _ = op_case("add_relu", dict(M=7, N=129))
    assert len(expr.axes) == 1 and len(expr.axes[0].parts) == 2
    (axis,) = expr.axes
    assert tail_options(expr, ({axis.name: 16}, {axis.name: 64}, {axis.name: 256}), axis.name, 16) == [((), (axis.name,))]


def test_mixed_tails_pad_the_vector_axis_and_predicate_the_outer_bounds():
    """A conv whose channels (84) overhang both the vector axis k and the reduce axis c: besides padding
    both (which re-indexes the window per tile) a plan may pad k only and bound the c loop."""
    from policy_exprs import conv2d_nhwc

    expr = conv2d_nhwc(1, 42, 42, 84, 84, 3, 3)
    tiles = [dict(n=1, h=7, w=1, k=32, r=3, s=1, c=1), dict(n=1, h=42, w=1, k=32, r=3, s=1, c=16),
             dict(n=1, h=42, w=7, k=96, r=3, s=1, c=96)]
    options = tail_options(expr, tiles, "k", 16)
    assert (("k", "c"), ()) in options and ((), ("k", "c")) in options and (("k",), ("c",)) in options
    # a register tile that overhangs its axis (h 9 into 71) is padded with the vector axis in one option
    expr = conv2d_nhwc(1, 71, 71, 36, 36, 1, 1)
    tiles = [dict(n=1, h=9, w=1, k=48, r=1, s=1, c=1), dict(n=1, h=18, w=1, k=48, r=1, s=1, c=36),
             dict(n=1, h=72, w=18, k=48, r=1, s=1, c=36)]
    options = tail_options(expr, tiles, "k", 16)
    assert (("h", "k"), ("w",)) in options and (("k",), ("h", "w")) in options


def test_a_predicated_vector_tail_costs_its_power_of_two_pieces_where_split_off_else_runs_scalar(device):
    """84 channels in tiles of 48 leave a 4-lane partial vector. Where the channels' grid loop is the whole
    parallel loop with tile loops below it, code generation cannot split that vector off (its bound is not
    constant) and it runs scalar (4 of 84 lanes at a lane's speed); elsewhere it is a vector loop of its
    own: one piece for 4 lanes, two (8 + 2) for 42 channels' 10."""
    from policy_exprs import elementwise
    from roller.plan.choices import estimate_tiles, plan_choices, serial_tail, vector_tail_split
    from roller.plan.tails import tail_compute_factor, vector_tail_split as tiles_split

    expr = elementwise(10, 84)

    def plan(tiles, padded=None):
        return plan_choices(expr, tiles, device, "a1", padded=padded)
    solo = [dict(a0=1, a1=16), dict(a0=1, a1=16), dict(a0=10, a1=48)]  # rows in one top tile
    assert not vector_tail_split(expr, plan(solo, ()), 16) and not tiles_split(expr, solo, "a1", 16)
    assert tail_compute_factor(expr, "a1", 16, ("a1",), False) == pytest.approx(1 + 4 / 84 * 15)
    assert tail_compute_factor(expr, "a1", 16, (), False) == 1.0
    assert not serial_tail(expr, plan(solo, ()), 16)  # the split goes to the tile loop below
    for tiles in ([dict(a0=1, a1=16), dict(a0=1, a1=16), dict(a0=2, a1=48)],  # rows have top tiles too
                  [dict(a0=1, a1=16), dict(a0=1, a1=16), dict(a0=10, a1=16)],  # no tile loop below the grid
                  [dict(a0=1, a1=16), dict(a0=1, a1=96), dict(a0=10, a1=96)]):  # one top tile covers the axis
        assert vector_tail_split(expr, plan(tiles, ()), 16) and tiles_split(expr, tiles, "a1", 16)
        assert tail_compute_factor(expr, "a1", 16, ("a1",), True) == 1.0
    # ...and that tile-less grid loop, the parallel loop itself, runs its last top tile alone: six top
    # tiles on two cores take four waves, not three
    alone = [dict(a0=1, a1=16), dict(a0=1, a1=16), dict(a0=10, a1=16)]
    assert serial_tail(expr, plan(alone, ()), 16) and not serial_tail(expr, plan(alone, ("a1",)), 16)
    assert estimate_tiles(expr, alone, device, "a1", padded=()).waves == 4
    assert estimate_tiles(expr, alone, device, "a1", padded=("a1",)).waves == 3
    narrow = elementwise(10, 42)
    assert tail_compute_factor(narrow, "a1", 16, ("a1",), True) == pytest.approx(1 + 1 / 3)


def test_a_reductions_partial_vector_that_stays_in_every_top_tile_is_padded_not_predicated():
    """SqueezeNet's classifier, a 1x1 convolution 13x13x512 -> 1000 in 128-channel top tiles on 16 lanes: the
    channels' bound cannot be split off (their grid loop is the parallel loop, tile loops below it), so it
    stays in the update block, and the tiles it crosses run scalar code. It ran 927 us predicated against 519
    padded (the model: 424 and 421), 1810 against 481 in the model's fused
    function. Construction offers such a plan only padded; whole vectors (8 lanes) and a tail split off keep
    the predicated option."""
    from policy_exprs import conv2d_nhwc
    from roller.plan.tails import scalar_tail_tiles, tail_options

    expr = conv2d_nhwc(1, 13, 13, 512, 1000, 1, 1)
    t = lambda h, w, k, c: {"n": 1, "h": h, "w": w, "k": k, "r": 1, "s": 1, "c": c}
    tiles = [t(7, 1, 32, 1), t(7, 1, 32, 64), t(14, 13, 128, 512)]
    assert scalar_tail_tiles(expr, tiles, "k", 16)
    options = tail_options(expr, tiles, "k", 16)
    assert options and all("k" in padded and "k" not in predicated for padded, predicated in options)
    assert not scalar_tail_tiles(expr, tiles, "k", 8)  # 1000 channels are 125 whole 8-lane vectors
    assert any("k" in predicated for _, predicated in tail_options(expr, tiles, "k", 8))
    whole = [t(7, 1, 32, 1), t(7, 1, 32, 64), t(14, 13, 1024, 512)]  # one top tile: the tail is split off
    assert not scalar_tail_tiles(expr, whole, "k", 16)
    unchunked = [t(7, 1, 32, 512), t(7, 1, 32, 512), t(14, 13, 128, 512)]  # the register tile holds the reduction
    assert not scalar_tail_tiles(expr, unchunked, "k", 16)


def test_units_that_split_the_outputs_contiguous_rows_inside_a_line_are_charged_the_shared_lines(device):
    """Where the parallel grid splits only the axis of the output's contiguous dimension, the boundary
    between the two units' shares falls inside a cache line of most rows when the rows are not whole lines
    (a depthwise 3x3 of stride 2 on 28x28x90 in 16-channel top tiles ran 21.1 us on two threads, 11.5 on
    one, 8.3 split over the rows): those lines move between the units. None when the rows are whole lines
    (96 channels), another axis is split too, or one unit runs it."""
    from policy_exprs import elementwise
    from roller.plan.cost import false_sharing_seconds

    odd, even = elementwise(196, 90), elementwise(196, 96)
    channels = dict(a0=196, a1=16)  # six top tiles of channels, every row in each
    # the boundary after tile 3 (48 channels, 192 bytes) in rows of 360 bytes: whole lines in 1 row of 8
    assert false_sharing_seconds(odd, channels, device, 2) == pytest.approx(196 * 7 / 8 * CPU_MODEL.false_sharing_seconds)
    assert false_sharing_seconds(even, channels, device, 2) == 0.0
    assert false_sharing_seconds(odd, dict(a0=98, a1=16), device, 2) == 0.0  # the rows are split too
    assert false_sharing_seconds(odd, channels, device, 1) == 0.0
