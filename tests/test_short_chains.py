"""The model's terms for short reductions and sliding windows (no TVM): register tiles whose accumulation
chains overlap in the out-of-order window (``units.reorder_window``), the input rows consecutive top
tiles share (``model.halo_bytes``), and L1 tiles that walk slices of a pixel's channels
(``model.sliced_row_seconds``)."""
import pytest

from policy_exprs import acc, conv2d_nhwc, cpu, matmul, spec_error
from roller.plan.choices import estimate_tiles
from roller.plan.expr import REDUCE, SPATIAL, Axis, Expr
from roller.plan.cost import (accumulation_chain, accumulator_efficiency, cycle_seconds,
                              halo_bytes, sliced_row_seconds, top_step_axis)
from roller.plan.rtile import LevelRules, tensor_footprint, tile_counts
from roller.device.spec import family_model

CPU_MODEL = family_model("cpu")  # the model figures every CPU spec has by default

UNITS = {"count": 2, "vector_bytes": 64, "peak_gflops": {"float32": 100.0}, "accumulators_for_peak": 10}
OVERLAP = cpu(units={**UNITS, "reorder_window": 64})
ALONE = cpu(units=UNITS)
STREAMS = cpu(units={**UNITS, "prefetch_streams": 32})


def max_pool(H, W, C, R, S, stride):
    """A pool shaped as the analysis gives it: output [H, W, C] over window axes r, s of an input already
    padded (a depthwise conv without weights: one input, flops one a point)."""
    P, Q = (H - 1) * stride + R, (W - 1) * stride + S
    axes = (Axis("n", 1, SPATIAL), Axis("h", H, SPATIAL), Axis("w", W, SPATIAL), Axis("c", C, SPATIAL),
            Axis("r", R, REDUCE), Axis("s", S, REDUCE))
    x = acc("X", (1, P, Q, C), {"n": 1}, {"h": stride, "r": 1}, {"w": stride, "s": 1}, {"c": 1})
    y = acc("Y", (1, H, W, C), {"n": 1}, {"h": 1}, {"w": 1}, {"c": 1})
    return Expr("pool", axes, (x,), y, flops_per_point=1)


def test_a_short_chain_overlaps_with_the_next_tiles():
    pool = max_pool(83, 83, 48, 3, 3, 2)
    reg = {"n": 1, "h": 1, "w": 1, "c": 16, "r": 3, "s": 3}  # one accumulator vector, nine maxima
    assert accumulator_efficiency(pool, reg, ALONE, "c") == pytest.approx(1 / 10)
    assert accumulator_efficiency(pool, reg, OVERLAP, "c") == pytest.approx(64 / 9 / 10)
    assert accumulator_efficiency(pool, reg, OVERLAP, "c", chain=3) == 1.0
    # a GEMM's chain is its whole reduction (512 FMAs): no overlap, the accumulators alone count
    mm = matmul(256, 256, 512)
    assert accumulator_efficiency(mm, {"i": 1, "j": 32, "k": 1}, OVERLAP, "j") == pytest.approx(2 / 10)


def test_the_chain_is_the_reduction_of_the_accumulators_parent():
    mm = matmul(256, 256, 512)
    reg = {"i": 4, "j": 32, "k": 1}
    whole = [reg, {"i": 16, "j": 64, "k": 512}, {"i": 64, "j": 128, "k": 512}]
    assert accumulation_chain(mm, whole, "j", 16) == 512
    # the L1 tile holds several register tiles and splits the reduction: the accumulators go back to
    # memory after each 64-long chunk
    split = [reg, {"i": 16, "j": 64, "k": 64}, {"i": 64, "j": 128, "k": 512}]
    assert accumulation_chain(mm, split, "j", 16) == 64
    # a faster register tile where the chain is short: the estimate's compute follows the chain
    pool = max_pool(83, 83, 48, 3, 3, 2)
    tiles = [{"n": 1, "h": 1, "w": 1, "c": 16, "r": 1, "s": 1}, {"n": 1, "h": 1, "w": 1, "c": 16, "r": 3, "s": 3},
             {"n": 1, "h": 1, "w": 83, "c": 48, "r": 3, "s": 3}]
    assert accumulation_chain(pool, tiles, "c", 16) == 9
    alone, overlap = estimate_tiles(pool, tiles, ALONE, "c"), estimate_tiles(pool, tiles, OVERLAP, "c")
    assert alone.compute_seconds == pytest.approx(overlap.compute_seconds * 64 / 9)


def test_consecutive_window_tiles_share_their_overlap():
    pool = max_pool(83, 83, 48, 3, 3, 2)
    top = {"n": 1, "h": 1, "w": 83, "c": 48, "r": 3, "s": 3}  # one output row: 3 input rows, 2 of them new
    rules = LevelRules.of(ALONE, 2, pool, "c")
    assert top_step_axis(pool, top, "c", ()) == "h"
    total = tile_counts(pool, top)[0]
    rows = tensor_footprint(pool.inputs[0], top, rules, moved=True) * total
    assert halo_bytes(pool, top, rules, "c", ()) == pytest.approx(rows / 3 * 82 / 83)
    # stride 1: two of three rows are the previous tile's
    pool1 = max_pool(83, 83, 48, 3, 3, 1)
    rows1 = tensor_footprint(pool1.inputs[0], top, rules, moved=True) * tile_counts(pool1, top)[0]
    assert halo_bytes(pool1, top, rules, "c", ()) == pytest.approx(rows1 * 2 / 3 * 82 / 83)
    # tiles as tall as the stride steps past the window: nothing shared
    assert halo_bytes(max_pool(83, 83, 48, 2, 2, 2), {**top, "r": 2, "s": 2}, rules, "c", ()) == 0.0


def test_only_windows_count_as_shared():
    conv = conv2d_nhwc(1, 28, 28, 64, 64, 3, 3)
    rules = LevelRules.of(ALONE, 2, conv, "k")
    # stepping along k (output channels): the input tile is the same, the weights new; neither is a halo
    top = {"n": 1, "h": 28, "w": 28, "k": 16, "r": 3, "s": 3, "c": 64}
    assert top_step_axis(conv, top, "k", ()) == "k"
    assert halo_bytes(conv, top, rules, "k", ()) == 0.0
    # stepping along w by 7 columns: 2 of the input's 9 columns are shared, the weights are not counted
    top = {"n": 1, "h": 28, "w": 7, "k": 64, "r": 3, "s": 3, "c": 64}
    x = conv.inputs[0]
    assert halo_bytes(conv, top, rules, "k", ()) == pytest.approx(
        tensor_footprint(x, top, rules, moved=True) * 2 / 9 * tile_counts(conv, top)[0] * 3 / 4)
    # a reduction split at the top level steps innermost: along c, nothing of X is shared
    top = {"n": 1, "h": 28, "w": 7, "k": 64, "r": 3, "s": 3, "c": 16}
    assert top_step_axis(conv, top, "k", ()) == "c"
    assert halo_bytes(conv, top, rules, "k", ()) == 0.0
    # a predicated vector axis's grid loop is held inside the fused spatial grid
    top = {"n": 1, "h": 28, "w": 7, "k": 32, "r": 3, "s": 3, "c": 64}
    assert top_step_axis(conv, top, "k", ("k",)) == "k"
    assert top_step_axis(conv, top, "k", ()) == "k"
    top = {"n": 1, "h": 14, "w": 28, "k": 32, "r": 3, "s": 3, "c": 64}
    assert top_step_axis(conv, top, "k", ()) == "k"
    assert top_step_axis(conv, {**top, "k": 64}, "k", ()) == "h"
    assert top_step_axis(conv, {**top, "k": 64, "h": 28}, "k", ()) is None


def test_a_spec_rejects_a_negative_window():
    msg = spec_error(lambda s: s["units"].update(reorder_window=-1))
    assert "reorder_window" in msg and "0 or more" in msg
    assert cpu().units.reorder_window == 0


def test_l1_tiles_walking_channel_slices_pay_per_line():
    pool = max_pool(83, 83, 96, 3, 3, 1)
    top = {"n": 1, "h": 1, "w": 83, "c": 96, "r": 3, "s": 3}
    reg = {"n": 1, "h": 1, "w": 1, "c": 16, "r": 1, "s": 1}
    wide = {"n": 1, "h": 1, "w": 83, "c": 16, "r": 3, "s": 3}    # a slice of 16 of 96 channels over 3 x 85 pixels
    whole = {"n": 1, "h": 1, "w": 83, "c": 96, "r": 3, "s": 3}   # every channel: whole runs
    pixel = {"n": 1, "h": 1, "w": 1, "c": 16, "r": 3, "s": 3}    # one pixel's 3x3 window: 9 rows a slice
    assert sliced_row_seconds(pool, [reg, whole, top], STREAMS, "c") == 0.0
    assert sliced_row_seconds(pool, [reg, pixel, top], STREAMS, "c") == 0.0  # 9 rows: the prefetcher follows
    lines = 83 * 6 * 3 * 85  # L1 tiles x one 64-byte line per pixel of the slice (rows of 16 floats)
    expect = lines * (1 - 1 / 6) * (1 - 32 / 255) * CPU_MODEL.sliced_line_cycles * cycle_seconds(STREAMS)
    assert sliced_row_seconds(pool, [reg, wide, top], STREAMS, "c") == pytest.approx(expect)
    # not where the input is packed, nor without a known prefetcher, nor along a reduced vector axis
    assert sliced_row_seconds(pool, [reg, wide, top], STREAMS, "c", packed=("X",)) == 0.0
    assert sliced_row_seconds(pool, [reg, wide, top], ALONE, "c") == 0.0
    # the estimate puts the sliced walk behind the whole one
    assert estimate_tiles(pool, [reg, wide, top], STREAMS, "c").seconds > estimate_tiles(pool, [reg, whole, top], STREAMS, "c").seconds
