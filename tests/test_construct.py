"""Construction on synthetic devices (no TVM): the contract every plan keeps (alignment, nesting,
capacity, waves), plans for irregular and memory-bound shapes, epsilon, scale-up of register and L1 tiles,
one-unit plans, and construct(topk=1) giving top-10's first.

The micro model's terms and how it ranks plans: tests/test_construct_model.py."""
import dataclasses
import math

import pytest

from policy_exprs import acc, conv2d_nhwc, cpu, elementwise, matmul, reduce_rows
from roller.plan.construct import EPSILON_STEPS, TWO_VECTOR_WASTE, construct, enumerate_programs
from roller.plan.expr import REDUCE, SPATIAL, Axis, Expr, fuse_axes
from roller.plan.cost import TIE, launch_seconds, tile_overhead
from roller.plan.panels import panel_capacity
from roller.plan.rprogram import RProgram
from roller.plan.rtile import (ODD_EXTENT_EPSILON, UNALIGNED_EXTENT_EPSILON, LevelRules, axis_epsilon, axis_step,
                               compute_lanes, footprint, level_footprints, padding_waste, streamed_axes, round_up, tile_counts)
from roller.plan.choices import serial_tail
from roller.plan.tails import tiling_extents

DEV = cpu()


def alignment_problems(expr, prog: RProgram, dev=DEV) -> list[tuple]:
    """(level, axis, size, step) of every tile size that breaks the alignment rules of roller.plan.rtile.

    Along an axis of extent E, a level's tile size is allowed when it is the full extent (or, on the
    vector axis, the extent rounded up to whole vectors: roller.plan.tails.tiling_extents), or when it is a
    multiple of the level's alignment step (rtile.axis_step: SIMD lanes on the vector axis at level 0,
    cache lines along contiguous axes above) whose padding waste over the tiled extent is at most the
    plan's epsilon (rtile.next_aligned: a tile may overhang, or leave a ragged last tile, only that much;
    rtile.axis_epsilon raises the bound along extents with no small divisor or no aligned divisor).
    A register tile two vectors wide may pad the vector axis by up to construct.TWO_VECTOR_WASTE, and the
    levels above it then tile the vector axis as padded to it.
    """
    lanes = compute_lanes(expr, dev)
    extents = tiling_extents(expr, prog.vector_axis, lanes)
    va = prog.vector_axis
    bad = []
    for i, tile in enumerate(prog.tiles):
        rules = LevelRules.of(dev, i, expr, prog.vector_axis)
        for a in expr.axes:
            size, step = tile[a.name], axis_step(expr, a.name, rules)
            extent = round_up(extents[a.name], prog.tiles[0][a.name]) if i and a.name == va else extents[a.name]
            if size in (a.extent, extents[a.name], extent):
                continue
            if (i == 0 and a.name == va and size == 2 * lanes
                    and padding_waste(extent, size) <= TWO_VECTOR_WASTE + 1e-12):
                continue
            lower = prog.tiles[i - 1][a.name] if i else 1
            eps = axis_epsilon(extent, prog.epsilon, math.lcm(step, lower))
            if size % step or padding_waste(extent, size) > eps + 1e-12:
                bad.append((prog.levels[i], a.name, size, step))
    return bad


def check_invariants(expr, prog: RProgram, dev=DEV):
    """Every plan obeys the contract codegen relies on."""
    assert prog.levels == tuple(lv.name for lv in dev.private_levels)
    held = level_footprints(expr, list(prog.tiles), dev, prog.vector_axis)  # a panel's L1 tile as it is held
    for i, tile in enumerate(prog.tiles):
        assert set(tile) == {a.name for a in expr.axes}
        rules = LevelRules.of(dev, i, expr, prog.vector_axis)
        room = panel_capacity(dev) if i == 1 and streamed_axes(expr, list(prog.tiles)) else rules.capacity
        assert held[i] <= room, (i, tile)
        if i:
            for a, s in tile.items():
                assert s % prog.tiles[i - 1][a] == 0 or s == expr.axis(a).extent, ("nesting", i, a)
    bad = alignment_problems(expr, prog, dev)
    assert not bad, f"misaligned tile sizes (level, axis, size, step) at epsilon {prog.epsilon}: {bad}"
    assert set(prog.grid) == {a.name for a in expr.spatial_axes}  # reductions never split over units
    assert prog.units == min(dev.units.count, math.prod(prog.grid.values()))
    tiles = math.prod(prog.grid.values())
    alone = serial_tail(expr, prog, compute_lanes(expr, dev))
    # a parallel grid loop split at its last top tile runs that tile alone after the others
    assert prog.waves == (math.ceil((tiles - 1) / dev.units.count) + 1 if alone
                          else math.ceil(tiles / dev.units.count))
    assert prog.predicted_seconds > 0
    for lv in dev.private_levels:  # reported footprints (packed copies included) fit every level
        room = panel_capacity(dev) if lv is dev.private_levels[1] and streamed_axes(expr, list(prog.tiles)) \
            else lv.usable_bytes  # a panel (roller.plan.panels) holds more of L1: its streamed input passes through
        assert prog.footprint_bytes[lv.name] <= room, (lv.name, prog.footprint_bytes)


def with_tile(prog: RProgram, level: int, **sizes) -> RProgram:
    """``prog`` with some sizes of one level's tile replaced."""
    tiles = [dict(t) for t in prog.tiles]
    tiles[level].update(sizes)
    return dataclasses.replace(prog, tiles=tuple(tiles))


def test_misaligned_plans_are_caught():
    """The alignment check fails on a register tile that is not whole vectors, on a tile that is not whole
    cache lines along a contiguous axis, and on a tile that overhangs by more than the plan's epsilon."""
    e = matmul(1024, 1024, 1024)
    prog = construct(e, DEV, topk=1).programs[0]
    check_invariants(e, prog)
    va = prog.vector_axis
    assert va == "j" and prog.epsilon == 0.0 and prog.tiles[0][va] % 16 == 0
    # 8 lanes of a 16-lane vector (the upper levels still nest: multiples of 8)
    bad = with_tile(prog, 0, **{va: 8})
    assert alignment_problems(e, bad) == [("reg", va, 8, 16)]
    with pytest.raises(AssertionError, match="misaligned"):
        check_invariants(e, bad)
    # 24 floats along k at L1: k is A's contiguous axis, 24 is not whole 64-byte lines (16 floats)
    assert 24 % prog.tiles[0]["k"] == 0
    assert ("L1", "k", 24, 16) in alignment_problems(e, with_tile(prog, 1, k=24))
    # a top tile of 768 rows covers 1024 in two tiles with 50% padding, over epsilon 0
    over = with_tile(prog, 2, i=768)
    assert ("L2", "i", 768, 1) in alignment_problems(e, over)
    assert not alignment_problems(e, dataclasses.replace(over, epsilon=0.5))
    # the same sizes on the full extent are fine: an axis of 24 may be tiled by 24
    small = matmul(64, 64, 24)
    for p in construct(small, DEV, topk=4).programs:
        check_invariants(small, p)


def test_matmul_1024_plans_are_aligned_nested_and_ranked():
    e = matmul(1024, 1024, 1024)
    c = construct(e, DEV, topk=10)
    assert len(c.programs) == 10 and c.epsilon == 0.0  # enough plans without padding
    for p in c.programs:
        check_invariants(e, p)
        assert p.units == DEV.units.count
    # ranked by model.rank: fastest first, up to its tie ratio (near-ties go to less memory time)
    times = [p.predicted_seconds for p in c.programs]
    assert all(t <= later * TIE for i, t in enumerate(times) for later in times[i + 1:])
    best = c.programs[0]
    # register tile: whole vectors along j, several accumulator rows, reduction step 1
    assert best.tiles[0]["j"] % 16 == 0 and best.tiles[0]["i"] >= 4 and best.tiles[0]["k"] == 1
    assert "B" in best.packed  # B's rows are strided in the top tile and re-read by every row block
    # compute bound at 100 GFLOP/s per unit over 4 units, plus the fixed cost of each wave's top tile (with
    # the workspace allocation of its accumulator tile and the accumulators moved through memory between
    # reduction chunks) and of starting the parallel loop
    from roller.plan.cost import accumulator_seconds, workspace_seconds
    tiles = math.prod(best.grid.values())
    per_tile = (tile_overhead(DEV) + workspace_seconds(e, best.tiles, DEV, best.vector_axis) / tiles
                + accumulator_seconds(e, best, DEV) / tiles)
    assert best.predicted_seconds == pytest.approx(2 * 1024 ** 3 / (100e9 * 4) + best.waves * per_tile
                                                   + launch_seconds(DEV, 4), rel=1e-6)


@pytest.mark.parametrize("shape", [(1023, 1021, 1025), (17, 13, 5), (1, 1, 1), (1, 4096, 7), (3, 3, 1 << 16)])
def test_irregular_matmul_shapes_get_plans(shape):
    e = matmul(*shape)
    c = construct(e, DEV, topk=4)
    assert c.programs
    for p in c.programs:
        check_invariants(e, p)


@pytest.mark.parametrize("expr", [conv2d_nhwc(1, 71, 71, 36, 36, 1, 1), conv2d_nhwc(1, 28, 28, 64, 64, 3, 3, stride=2),
                                  matmul(1, 1000, 1280), matmul(1000, 1000, 1000), reduce_rows(4096, 7),
                                  fuse_axes(elementwise(100, 3001)), elementwise(7, 36)],
                         ids=lambda e: f"{e.name}-" + "x".join(str(a.extent) for a in e.axes))
def test_irregular_and_memory_bound_plans_are_aligned(expr):
    c = construct(expr, DEV, topk=10)
    assert c.programs
    for p in c.programs:
        check_invariants(expr, p)


def test_epsilon_grows_only_when_too_few_plans():
    # 1018 = 2 x 509: no size in whole cache lines divides it, so along a line-aligned axis
    # rtile.axis_epsilon allows UNALIGNED_EXTENT_EPSILON, and a prime such as 1021 ODD_EXTENT_EPSILON, at
    # any epsilon; elsewhere the bound starts at 0 and grows only when too few plans exist
    assert axis_epsilon(1021, 0.0) == ODD_EXTENT_EPSILON and axis_epsilon(1018, 0.0) == 0.0
    assert axis_epsilon(1018, 0.0, 16) == UNALIGNED_EXTENT_EPSILON and axis_epsilon(1024, 0.0, 16) == 0.0
    c = construct(matmul(1018, 1018, 1018), DEV, topk=500)  # more than the 342 plans at epsilon 0
    assert c.epsilon > 0 and c.epsilon in EPSILON_STEPS
    assert construct(matmul(512, 512, 512), DEV, topk=4).epsilon == 0.0


def test_small_operator_shrinks_to_use_every_unit():
    e = matmul(64, 64, 64)
    c = construct(e, DEV, topk=5)
    assert c.programs[0].units == DEV.units.count
    assert tile_counts(e, c.programs[0].top)[1] >= DEV.units.count


def test_conv_reduce_elementwise_plans():
    for e in (conv2d_nhwc(1, 56, 56, 64, 64, 3, 3), reduce_rows(4096, 4096), fuse_axes(elementwise(17, 11, 3)),
              reduce_rows(7, 1)):
        c = construct(e, DEV, topk=3)
        for p in c.programs:
            check_invariants(e, p)


def test_rprogram_round_trips_through_dict():
    p = construct(matmul(256, 256, 256), DEV, topk=1).programs[0]
    q = RProgram.from_dict(p.to_dict())
    assert q == p and q.key == p.key


def test_construction_offers_two_vector_register_tiles_and_reduction_chunks_of_one_register_tile():
    """The growths reach register tiles one vector or four wide; a two-vector tile over many pixels (7 x 2
    vectors on a 14x14x256 -> 1024 1x1 conv: 607 us against 715 for 2 x 2 x 4, one thread) is offered too,
    as is an L1 tile that holds one register tile and a chunk of its reduction, and the model ranks that
    pair first for this conv."""
    from roller.plan.construct import scale_up
    from roller.device.load import load_device
    from roller.plan.tails import stack_array

    dev = load_device("x86-avx512", calibrated=False)
    e = conv2d_nhwc(1, 14, 14, 256, 1024, 1, 1)
    lanes = compute_lanes(e, dev)
    regs = scale_up(e, dev, 0, [], 0.0, vector_axis="k")
    two = [t for t in regs if t["k"] == 2 * lanes and t["h"] * t["w"] > 2]
    assert two and all(stack_array(e, t) for t in two), regs
    l1 = scale_up(e, dev, 1, [two[0]], 0.0, vector_axis="k")
    spatial = [a.name for a in e.spatial_axes]
    assert any(all(t[a] == two[0][a] for a in spatial) and t["c"] > 1 for t in l1), l1
    first = construct(e, dev, topk=1).programs[0]
    assert first.tiles[0]["k"] == 2 * lanes and first.tiles[0]["h"] * first.tiles[0]["w"] == 7
    assert all(first.tiles[1][a] == first.tiles[0][a] for a in spatial)


def test_a_gemm_is_offered_the_register_tile_with_the_most_accumulators_and_a_convolution_is_not():
    """BERT's FFN at batch 8 (1024 x 3072 x 768): the growths end at 4 rows x 4 vectors (16 accumulators); the
    tile of 8 rows x 3 vectors (24, the most the 30 usable zmm registers hold beside a row of B and a
    broadcast) is offered too and ranked first (it ran 1.10x the 4 x 4 plan, docs/operator-suite.md). A 1x1
    convolution's rows are pixels along h and w: it gets no such tile (there the plans above it lost)."""
    from roller.plan.construct import scale_up
    from roller.device.load import load_device

    dev = load_device("x86-avx512", calibrated=False)
    e = matmul(1024, 3072, 768)
    lanes = compute_lanes(e, dev)
    regs = scale_up(e, dev, 0, [], 0.0)
    accumulators = {(t["i"], t["j"] // lanes) for t in regs}
    assert (4, 4) in accumulators and (8, 3) in accumulators, regs
    assert max(i * v for i, v in accumulators) == 24
    first = construct(e, dev, topk=1).programs[0]
    assert (first.tiles[0]["i"], first.tiles[0]["j"]) == (8, 48)

    conv = conv2d_nhwc(1, 11, 11, 672, 672, 1, 1)
    regs = scale_up(conv, dev, 0, [], 0.0, vector_axis="k")
    assert max(t["h"] * t["w"] * t["k"] // lanes for t in regs) <= 16, regs


@pytest.mark.parametrize("expr", [fuse_axes(elementwise(100, 3001)), elementwise(100, 3001), matmul(1000, 1000, 1000),
                                  reduce_rows(100, 3001), conv2d_nhwc(1, 71, 71, 36, 36, 1, 1)],
                         ids=["add_relu_fused", "add_relu", "matmul_1000", "rowsum", "conv1x1_71"])
def test_top1_is_the_first_of_top10(expr):
    """Without profiling, roller builds construct(topk=1)'s plan: it must be the plan top-10 ranks first
    (epsilon grows to the same pool of plans whatever topk asks, construct.RANK_POOL)."""
    one, ten = construct(expr, DEV, topk=1), construct(expr, DEV, topk=10)
    assert len(one.programs) == 1 and one.epsilon == ten.epsilon
    assert one.programs[0].key == ten.programs[0].key


def test_an_operator_small_enough_runs_on_one_unit_where_the_thread_pool_would_cost_more():
    """Construction offers the whole operator on one unit when its tensors fit a unit's last private level,
    and the model weighs it against spreading: 2 x 4096 elements (96 KB) take less than the pool's start and
    join on one unit; 2 x 16384 (384 KB) are worth four units. Larger operators get no one-unit plan."""
    small = construct(elementwise(2, 4096), DEV).programs
    assert small[0].units == 1 and small[0].grid == {"a0": 1, "a1": 1}
    spread = next(p for p in small if p.units > 1)
    assert spread.predicted_seconds >= small[0].predicted_seconds + launch_seconds(DEV, spread.units) / 2

    mid = enumerate_programs(elementwise(2, 16384), DEV, 0.0)  # every plan, ranked
    assert mid[0].units == DEV.units.count
    assert any(p.units == 1 for p in mid)  # offered, and ranked behind

    large = enumerate_programs(elementwise(2, 65536), DEV, 0.0)  # 1.5 MB: over the L2's 1 MiB
    assert all(p.units == DEV.units.count for p in large)


def test_the_avx512_register_budget_admits_six_by_four_vector_gemm_tiles_not_fourteen_window_rows():
    """hwspecs/x86-avx512.yaml's register level (usable_fraction 0.9): 6 rows x 4 vectors of accumulators
    with their operands fit (they ran 1.04-1.08x faster than 4 x 4); a depthwise tile of 14 rows with its
    window outside (14 accumulators, 14 input vectors, a weight) does not (it ran 0.78x)."""
    from roller.device.load import load_device

    dev = load_device("x86-avx512", calibrated=False)
    gemm = matmul(384, 3072, 768)
    rules = LevelRules.of(dev, 0, gemm, "j")
    assert footprint(gemm, dict(i=6, j=64, k=1), rules) <= rules.capacity
    # a 5x5 depthwise on 83x83x42, input already padded: X[h + r, w + s, c] * Wt[r, s, c]
    axes = (Axis("h", 83, SPATIAL), Axis("w", 83, SPATIAL), Axis("c", 42, SPATIAL), Axis("r", 5, REDUCE),
            Axis("s", 5, REDUCE))
    dw = Expr("depthwise", axes, (acc("X", (87, 87, 42), {"h": 1, "r": 1}, {"w": 1, "s": 1}, {"c": 1}),
                                  acc("Wt", (5, 5, 42), {"r": 1}, {"s": 1}, {"c": 1})),
              acc("Y", (83, 83, 42), {"h": 1}, {"w": 1}, {"c": 1}), zero_pad_axes=("r", "s"))
    rules = LevelRules.of(dev, 0, dw, "c")
    assert footprint(dw, dict(h=14, w=1, c=16, r=1, s=1), rules) > rules.capacity
    assert footprint(dw, dict(h=7, w=1, c=16, r=5, s=1), rules) <= rules.capacity  # the window inside fits


def test_register_tiles_that_leave_l1_no_room_give_way_to_ones_that_do():
    """With the x86-avx2 spec's register budget (15 of 16 ymm registers), every register tile the growths of a
    3x3 convolution on 42x42x84 end at holds three window rows, and beside them no L1 tile can hold the whole
    84-deep reduction (84 channels are no whole number of cache lines: at epsilon 0 only all of them): those
    picks give way to the last tiles on their growths that leave L1 room, and the plan keeps epsilon 0 (it
    grew to 0.1 and ran 0.37x without)."""
    from roller.device.load import load_device

    dev = load_device("x86-avx2")
    e = conv2d_nhwc(1, 42, 42, 84, 84, 3, 3)
    best = construct(e, dev, topk=1).programs[0]
    assert best.epsilon == 0.0
    check_invariants(e, best, dev)


def test_a_prime_extent_grows_epsilon_until_padded_tiles_are_ranked():
    """197 rows (ViT's tokens) have no aligned tile but 1 and 197 below 10% padding, and a full pool used to
    stop epsilon short of it: ViT's attention ran one-row register tiles (706 us) where the model predicts
    6 rows 9x faster (196 us measured). Construction now ranks what epsilon 0.1 offers for such an axis."""
    from roller.plan.construct import EPSILON_ALWAYS

    e = matmul(197, 64, 197)
    first = construct(e, DEV, topk=1).programs[0]
    offered = min(p.predicted_seconds for eps in EPSILON_STEPS if eps <= EPSILON_ALWAYS
                  for p in enumerate_programs(e, DEV, eps, None, frozenset(), limit=10))
    assert first.predicted_seconds <= offered * TIE  # within a tie, rank() puts the least memory time first
    assert construct(matmul(196, 64, 196), DEV, topk=1).epsilon == 0.0  # small divisors: no detour
