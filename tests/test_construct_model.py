"""The micro model on synthetic devices (no TVM): its terms (memory traffic and where data lives between
calls, packed copies and their padding, short strided rows and prefetch streams, accumulators and their
tiles, repeating stages, constants read from memory), calibrated figures, and how it ranks plans.

Construction and the contract every plan keeps: tests/test_construct.py."""
import dataclasses
import math

import pytest

from policy_exprs import acc, conv2d_nhwc, cpu, elementwise, matmul, reduce_rows
from roller.plan.construct import construct
from roller.plan.expr import REDUCE, SPATIAL, Axis, Expr
from roller.plan.choices import estimate_tiles
from roller.plan.cost import launch_seconds, tile_overhead
from roller.plan.rtile import LevelRules, compute_lanes, default_vector_axis, tile_counts
from roller.device.spec import family_model

CPU_MODEL = family_model("cpu")  # the model figures every CPU spec has by default

DEV = cpu()


def test_model_by_hand_memory_bound_elementwise():
    e = elementwise(1 << 20)
    tiles = [{"a0": 16}, {"a0": 1024}, {"a0": 65536}]
    est = estimate_tiles(e, tiles, DEV)
    # 16 top tiles over 4 units: 4 waves. The 12 MiB fit L3 (16 MiB): its bandwidth per unit is
    # min(40, 80 / 4) = 20 GB/s; L2 is filled with 12 MiB, a sixteenth per tile; each tile also costs the
    # model's fixed overhead; the kernel, that of starting its parallel loop.
    assert (est.tiles, est.units, est.waves) == (16, 4, 4)
    assert est.traffic_bytes["L2"] == 3 * 4 * (1 << 20)
    assert est.seconds == pytest.approx(4 * ((12 * 2 ** 20 / 20e9) / 16 + tile_overhead(DEV)) + launch_seconds(DEV, 4))
    assert launch_seconds(DEV, 1) == 0.0 < launch_seconds(DEV, 4)


def test_calibrated_figures_change_the_prediction():
    e = matmul(1024, 1024, 1024)  # 12 MiB: in L3 between calls (3 MiB would stay in the 4 units' L2)
    tiles = list(construct(e, DEV, topk=1).programs[0].tiles)
    fast = DEV.with_calibration({"peak_gflops": {"float32": 200.0}})
    before, after = estimate_tiles(e, tiles, DEV), estimate_tiles(e, tiles, fast)
    assert after.compute_seconds == pytest.approx(before.compute_seconds / 2)
    assert after.seconds < before.seconds
    slow_l3 = DEV.with_calibration({"bandwidth_gbps": {"L3": {"unit": 1.0, "total": 1.0}}})
    assert estimate_tiles(e, tiles, slow_l3).seconds > before.seconds


def test_accumulator_efficiency_counts_independent_vectors():
    from roller.plan.cost import accumulator_efficiency
    spec_dev = cpu(units={"count": 4, "vector_bytes": 64, "peak_gflops": {"float32": 100.0},
                          "accumulators_for_peak": 8})
    e = matmul(256, 256, 256)
    assert accumulator_efficiency(e, {"i": 1, "j": 16, "k": 1}, spec_dev, "j") == 1 / 8  # one zmm accumulator
    assert accumulator_efficiency(e, {"i": 2, "j": 32, "k": 4}, spec_dev, "j") == 4 / 8
    assert accumulator_efficiency(e, {"i": 4, "j": 64, "k": 1}, spec_dev, "j") == 1.0
    # a row sum vectorized along the reduced axis keeps one vector accumulator per output row
    r = reduce_rows(64, 1024)
    assert default_vector_axis(r) == "k"
    assert accumulator_efficiency(r, {"i": 2, "k": 16}, spec_dev, "k") == 2 / 8
    assert accumulator_efficiency(e, {"i": 1, "j": 16, "k": 1}, DEV, "j") == 1.0  # spec without the field
    slow = estimate_tiles(e, [{"i": 1, "j": 16, "k": 1}, {"i": 16, "j": 64, "k": 64}, {"i": 64, "j": 128, "k": 256}], spec_dev)
    fast = estimate_tiles(e, [{"i": 4, "j": 64, "k": 1}, {"i": 16, "j": 64, "k": 64}, {"i": 64, "j": 128, "k": 256}], spec_dev)
    assert slow.compute_seconds == pytest.approx(8 * fast.compute_seconds)


def test_rank_ties_near_predictions_and_prefers_less_memory_time():
    from roller.plan.cost import rank
    plans = [("tight", 0.999, {"reg": 0.9, "L1": 0.1}), ("slack", 1.000, {"reg": 0.5, "L1": 0.2}),
             ("slow", 1.10, {"reg": 0.1}), ("fast", 0.90, {"reg": 2.0})]
    order = rank(plans, lambda p: p[1], lambda p: p[2])
    # 0.90 is clearly fastest; 0.999 and 1.000 tie (within 2%) and the one with less memory time goes first
    assert [p[0] for p in order] == ["fast", "slack", "tight", "slow"]
    # equal in both (register tiles of 1 and 3 vectors, all else the same): the fewer register-tile runs first
    same = [("one", 1.0, {"reg": 0.5}, 6889 * 6), ("three", 1.0, {"reg": 0.5}, 6889 * 2)]
    assert [p[0] for p in rank(same, lambda p: p[1], lambda p: p[2])] == ["one", "three"]  # none given: as listed
    assert [p[0] for p in rank(same, lambda p: p[1], lambda p: p[2], lambda p: p[3])] == ["three", "one"]


def test_packed_copy_counts_twice_at_the_top_level_with_its_padding():
    from roller.plan.rtile import packing, packing_bytes
    e = matmul(1024, 1024, 1024)
    tiles = [{"i": 4, "j": 64, "k": 1}, {"i": 32, "j": 64, "k": 32}, {"i": 256, "j": 256, "k": 256}]
    # B's top region (256 x 256) has rows 1 KiB apart = 16 lines, a stride sharing a factor with the 64 L1
    # sets, while the L1 tile reads 64 of each row's 256 floats: pad one line (16 floats) per row
    assert packing(e, tiles, DEV) == (("B",), {"B": 16})
    assert packing_bytes(e, tiles, DEV) == 256 * 1024 + 256 * 16 * 4
    for p in construct(e, DEV, topk=10).programs:  # every plan fits its top level with the copy
        assert p.footprint_bytes["L2"] <= DEV.level("L2").usable_bytes


def test_rows_that_spread_over_the_cache_sets_are_read_in_place_not_packed():
    """A 1x1 conv's weight of 2016 x 336 has rows 21 lines apart: every set of the L1 holds a share of a
    column, and packing it per top tile only adds the copy (1050-1190 us against 760 read in place on a
    Zen 4). Rows 16 lines apart (256 columns) map a column onto 4 of the 64 sets, and rows 4000 bytes
    apart (a 1000-column B) start mid-line: those are still packed."""
    from roller.plan.rtile import packing, rows_spread
    dev = cpu()
    tiles = [dict(n=1, h=6, w=1, k=48, r=1, s=1, c=1), dict(n=1, h=6, w=1, k=48, r=1, s=1, c=64),
             dict(n=1, h=12, w=11, k=48, r=1, s=1, c=512)]
    spread = conv2d_nhwc(1, 11, 11, 2016, 336, 1, 1)
    rules = LevelRules.of(dev, 1, spread, "k")
    assert rows_spread(next(t for t in spread.inputs if t.name == "Wt"), rules)
    assert "Wt" not in packing(spread, tiles, dev, "k")[0]
    conflicting = conv2d_nhwc(1, 11, 11, 2016, 256, 1, 1)
    assert "Wt" in packing(conflicting, [dict(t, k=min(t["k"], 32)) for t in tiles], dev, "k")[0]
    unaligned = matmul(1000, 1000, 1000)
    mm = [{"i": 8, "j": 48, "k": 1}, {"i": 8, "j": 48, "k": 16}, {"i": 200, "j": 48, "k": 336}]
    assert not rows_spread(next(t for t in unaligned.inputs if t.name == "B"), LevelRules.of(dev, 1, unaligned, "j"))
    assert "B" in packing(unaligned, mm, dev, "j")[0]


def test_staged_window_rows_are_padded_against_cache_set_conflicts():
    """A padding stage copied per top tile gets the packed copies' set padding: a 3x3 conv on 14x14x256
    whose top tile stages 16 x 16 pixels x 128 channels (rows 8 KiB apart) while its L1 tile reads 16
    channels of each pixel pads every pixel by one line; a tile reading whole pixels pads nothing; a
    stage read in place (inlined) has no copy to pad."""
    from roller.plan.rtile import packing
    e = dataclasses.replace(conv2d_nhwc(1, 14, 14, 256, 256, 3, 3), staged=("X",), inlinable=("X",))
    part = [{"n": 1, "h": 14, "w": 1, "k": 16, "r": 3, "s": 1, "c": 1},
            {"n": 1, "h": 14, "w": 2, "k": 16, "r": 3, "s": 3, "c": 16},
            {"n": 1, "h": 14, "w": 14, "k": 64, "r": 3, "s": 3, "c": 128}]
    assert packing(e, part, DEV)[1]["X"] == 16
    whole = [dict(t, c=128) for t in part]
    assert "X" not in packing(e, whole, DEV)[1]
    assert "X" not in packing(e, part, DEV, inlined=("X",))[1]


def test_padding_is_not_read_in_place_where_every_register_tile_reads_some():
    """Inlined padding runs unchecked in the register tiles inside the borders (targets.cpu.inline_pad); where
    no register tile is inside (a column of all 7 output rows of a 3x3/2 conv on 14x14, its window's 3 rows
    in the tile) every load stays checked, and the stage is copied instead. Tiles of 4 rows on 28 output rows
    have interior positions; without the widths nothing changes."""
    from roller.plan.tails import every_tile_reads_padding, inline_options
    e = dataclasses.replace(conv2d_nhwc(1, 7, 7, 512, 512, 3, 3, stride=2), staged=("X",),
                            inlinable=("X",), pad_widths=(("X", ((0, 0), (1, 1), (1, 1), (0, 0))),))
    x = next(t for t in e.inputs if t.name == "X")
    column = {"n": 1, "h": 7, "w": 1, "k": 32, "r": 3, "s": 1, "c": 1}
    tiles = [column, dict(column, c=32), dict(column, w=7, s=3, c=128)]
    assert every_tile_reads_padding(e, x, column)
    assert inline_options(e, tiles, "k", 16, ()) == [()]
    row = {"n": 1, "h": 1, "w": 7, "k": 32, "r": 1, "s": 3, "c": 1}  # the whole row: col -1 in every tile
    assert every_tile_reads_padding(e, x, row)
    big = dataclasses.replace(conv2d_nhwc(1, 28, 28, 128, 128, 3, 3, stride=2), staged=("X",),
                              inlinable=("X",), pad_widths=(("X", ((0, 0), (1, 0), (1, 0), (0, 0))),))
    four = {"n": 1, "h": 4, "w": 1, "k": 64, "r": 1, "s": 1, "c": 1}
    assert not every_tile_reads_padding(big, next(t for t in big.inputs if t.name == "X"), four)
    assert inline_options(big, [four, dict(four, c=32), dict(four, w=28, r=3, s=3, c=64)], "k", 16, ()) \
        == [(), ("X",)]
    unknown = dataclasses.replace(e, pad_widths=())
    assert not every_tile_reads_padding(unknown, x, column)
    assert inline_options(unknown, tiles, "k", 16, ()) == [(), ("X",)]


def test_short_strided_rows_cost_the_calibrated_efficiency():
    """A top tile taking part of each row of an input streams it at the calibrated small-transfer
    efficiency (64 B rows of a 384 B row: 42% on the calibrated machine) for the bytes that come from
    beyond the private caches; whole rows and scalars cost nothing more; without a calibration, or with
    the data in the L2s, nothing is charged."""
    from roller.device.load import load_device
    from roller.plan.expr import Axis, Expr, TensorAccess
    from roller.plan.cost import resident_share, short_row_bytes
    from roller.plan.rtile import LevelRules

    plain = load_device("x86-avx512", calibrated=False)
    sweep = {"small_transfer": {"stride_bytes": 256, "rows": [{"bytes": 64, "efficiency": 0.5},
                                                              {"bytes": 128, "efficiency": 0.8}]}}
    dev = plain.with_calibration(sweep)
    assert dev.run_efficiency(64) == 0.5 and dev.run_efficiency(96) == pytest.approx(0.65)
    assert dev.run_efficiency(192) == pytest.approx(0.9) and dev.run_efficiency(4096) == 1.0
    assert plain.run_efficiency(64) == 1.0
    def copy(rows):
        return Expr("copy", (Axis("i", rows, "spatial"), Axis("j", 96, "spatial")),
                    (TensorAccess("A", (rows, 96), "float32", ((("i", 1),), (("j", 1),))),
                     TensorAccess("s", (), "float32", ())),
                    TensorAccess("B", (rows, 96), "float32", ((("i", 1),), (("j", 1),))), flops_per_point=1)

    e = copy(64 * 256)  # 12.6 MB: from memory
    assert resident_share(e, dev) == 0
    top = LevelRules.of(dev, len(dev.private_levels) - 1, e, "j")
    strided = short_row_bytes(e, {"i": 64, "j": 16}, top, dev)
    assert strided == pytest.approx(64 * 64 * 6 * 256 * (1 / 0.5 - 1))  # 64 rows of 64 B a tile, 1536 tiles, at 50%
    assert short_row_bytes(e, {"i": 8, "j": 96}, top, dev) == 0.0
    assert short_row_bytes(e, {"i": 64, "j": 16}, top, plain) == 0.0
    small = copy(64)  # 49 KB: the L2s hold it, its lines come whole
    assert resident_share(small, dev) == 1
    assert short_row_bytes(small, {"i": 64, "j": 16}, LevelRules.of(dev, len(dev.private_levels) - 1, small, "j"),
                           dev) == 0.0


def test_staged_rows_along_the_vector_axis_are_padded_to_whole_vectors():
    from roller.plan.expr import REDUCE, SPATIAL, Axis, Expr
    from roller.plan.rtile import packing
    from policy_exprs import acc
    # depthwise 5x5 on 83x83x42 (the padding stage read in place): a top tile over all 42 channels stages
    # rows of 42 floats; with 16 lanes they are padded to 48 so that every vector load starts on a line
    axes = (Axis("h", 83, SPATIAL), Axis("w", 83, SPATIAL), Axis("c", 42, SPATIAL),
            Axis("r", 5, REDUCE), Axis("s", 5, REDUCE))
    x = acc("X", (87, 87, 42), {"h": 1, "r": 1}, {"w": 1, "s": 1}, {"c": 1})
    wt = acc("Wt", (5, 5, 42), {"r": 1}, {"s": 1}, {"c": 1})
    e = Expr("dw", axes, (x, wt), acc("Y", (83, 83, 42), {"h": 1}, {"w": 1}, {"c": 1}), inlinable=("X",))
    lanes = compute_lanes(e, DEV)
    assert lanes == 16
    tile = lambda h, w, c: {"h": h, "w": w, "c": c, "r": 5, "s": 5}
    tiles = [tile(12, 1, 16), tile(12, 7, 16), tile(12, 84, 48)]
    assert packing(e, tiles, DEV, "c")[1].get("X") == 6
    assert "X" not in packing(e, tiles, DEV, "c", inlined=("X",))[1]  # read in place: no copy to pad
    assert "X" not in packing(e, tiles[:2] + [tile(12, 84, 16)], DEV, "c")[1]  # rows of one whole vector


def test_inputs_read_on_more_strided_streams_than_the_prefetcher_follows_wait_on_their_misses():
    from policy_exprs import cpu_spec
    from roller.device.spec import device_from_dict
    from roller.plan.cost import cycle_seconds, untracked_stream_seconds
    spec = cpu_spec()
    spec["units"] = dict(spec["units"], prefetch_streams=32, clock_ghz=2.0)
    dev = device_from_dict(spec, "test")
    e = conv2d_nhwc(1, 165, 165, 96, 48, 1, 1)  # 1x1: X is [1, 165, 165, 96], a pixel of 384 B
    top = lambda h, w, c: {"n": 1, "h": h, "w": w, "k": 48, "r": 1, "s": 1, "c": c}
    # a column of 165 pixels: 165 rows of 384 B, each on its own page; the prefetcher holds 32 of them
    lines = 165 * 384 // 64
    expected = lines * (1 - 32 / 165) * CPU_MODEL.untracked_line_cycles * cycle_seconds(dev)
    assert math.isclose(untracked_stream_seconds(e, top(165, 1, 96), dev), expected)
    assert untracked_stream_seconds(e, top(15, 1, 96), dev) == 0  # 15 streams: all followed
    assert untracked_stream_seconds(e, top(165, 11, 96), dev) == 0  # runs of 4224 B: picked up within one
    # runs of 1920 B still lose lines (measured: model.PREFETCH_RUN_BYTES)
    assert untracked_stream_seconds(e, top(165, 5, 96), dev) == pytest.approx(5 * expected)
    # the same top tile walked in L1 tiles one pixel wide and 16 of its 48 channels, channels innermost: the
    # kernel reads each row 384 B at a time (three L1 tiles over the same pixel, then the next pixel)
    narrow = dict(top(165, 1, 96), k=16)
    assert untracked_stream_seconds(e, top(165, 11, 96), dev, step=narrow) == pytest.approx(11 * expected)
    # walked along the rows (all 48 channels a tile), the next L1 tile continues each row: runs of 4224 B
    assert untracked_stream_seconds(e, top(165, 11, 96), dev, step=top(165, 1, 96)) == 0
    assert untracked_stream_seconds(e, top(165, 1, 96), dev, staged=("X",)) == 0  # a copy reads row by row
    assert untracked_stream_seconds(e, top(165, 1, 96), DEV) == 0  # a spec that does not say: no term


def test_register_tiles_whose_loads_read_runs_side_by_side_in_a_page_pay_for_their_lines():
    from policy_exprs import cpu_spec
    from roller.device.spec import device_from_dict
    from roller.plan.cost import broadcast_run, cycle_seconds, interleaved_run_seconds
    spec = cpu_spec()
    spec["units"] = dict(spec["units"], prefetch_streams=32, clock_ghz=2.0)
    dev = device_from_dict(spec, "test")

    def tiles(h, w, c, l1_c=None):
        t = lambda hh, ww, cc: {"n": 1, "h": hh, "w": ww, "k": 48, "r": 1, "s": 1, "c": cc}
        return [t(h, w, 1), t(h, w, l1_c or c), t(6, 60, c)]  # the same top tiles: 6 rows x 60 pixels

    e = conv2d_nhwc(1, 60, 60, 96, 48, 1, 1)  # a pixel of X is 384 B: a run of 6 lines
    x = e.inputs[0]
    # one pixel wide, six rows tall: each load continues its own row's run through the walk along w
    assert broadcast_run(e, x, tiles(6, 1, 96), x.shape)["w"] == 60
    assert broadcast_run(e, x, tiles(1, 6, 96), x.shape)["w"] == 1  # the next tile's run starts 6 pixels on
    assert interleaved_run_seconds(e, tiles(6, 1, 96), dev, "k") == 0
    # six pixels wide: six runs of 384 B side by side in one page, each load jumping to its next run
    assert broadcast_run(e, x, tiles(1, 6, 96), x.shape) == {"n": 1, "h": 1, "w": 1, "k": 1, "r": 1, "s": 1,
                                                              "c": 96}
    lines = 60 * 60 * 96 * 4 / 64
    one_by_six = lines * (1 - 1 / 6) * CPU_MODEL.interleaved_line_cycles * cycle_seconds(dev)
    assert interleaved_run_seconds(e, tiles(1, 6, 96), dev, "k") == pytest.approx(one_by_six)
    assert interleaved_run_seconds(e, tiles(3, 2, 96), dev, "k") == pytest.approx(one_by_six * 0.5 / (5 / 6))
    # the reduction split at L1 and resumed by the next L1 tile still reads each pixel in one run
    assert interleaved_run_seconds(e, tiles(1, 6, 96, l1_c=16), dev, "k") == pytest.approx(one_by_six)
    # 32 channels: whole rows of 2 lines side by side, one dense block swept whole (measured: no cost)
    assert interleaved_run_seconds(conv2d_nhwc(1, 60, 60, 32, 48, 1, 1), tiles(1, 6, 32), dev, "k") == 0
    assert interleaved_run_seconds(e, tiles(1, 6, 96), dev, "c") == 0  # X is not broadcast: the vector axis
    assert interleaved_run_seconds(e, tiles(1, 6, 96), DEV, "k") == 0  # a spec that does not say: no term
    # the model ranks the tall tile ahead of the wide one, all else the same
    est = lambda t: estimate_tiles(e, t, dev, "k").seconds
    assert est(tiles(6, 1, 96)) < est(tiles(1, 6, 96))


def test_data_that_fits_the_units_private_caches_lives_there_between_calls():
    from roller.plan.cost import data_source
    # DEV: 4 units with 1 MiB L2 (half usable); 16 MiB L3
    assert data_source(reduce_rows(128, 768), DEV).name == "L2"  # 393 KB: every unit's share fits its L2
    assert data_source(reduce_rows(1024, 1024), DEV).name == "L3"  # 4 MiB: over the L2s' usable 2 MiB
    assert data_source(reduce_rows(8192, 1024), DEV).name == "DRAM"  # 32 MiB: over L3's


def test_data_near_the_private_caches_capacity_comes_partly_from_them():
    """model.resident_share falls from all to none between model.resident_full and
    model.resident_none times the units'
    private capacity (DEV: 4 x 1 MiB L2); source_bandwidth weighs each level's time by its share."""
    from roller.plan.cost import (data_source, resident_share, source_bandwidth,
                                  tensor_bytes)
    from roller.device.load import load_device
    cap = 4 * 2**20
    small, mid, big = reduce_rows(256, 1024), reduce_rows(1024, 1024), reduce_rows(2048, 1024)
    assert tensor_bytes(small) <= CPU_MODEL.resident_full * cap and tensor_bytes(big) >= CPU_MODEL.resident_none * cap
    assert resident_share(small, DEV) == 1.0 and resident_share(big, DEV) == 0.0
    share = (CPU_MODEL.resident_none - tensor_bytes(mid) / cap) / (CPU_MODEL.resident_none - CPU_MODEL.resident_full)
    assert 0 < share < 1 and resident_share(mid, DEV) == pytest.approx(share)
    l2_total = DEV.level("L2").total_bandwidth_gbps
    assert source_bandwidth(small, DEV) == pytest.approx(l2_total)
    assert source_bandwidth(big, DEV) == 80.0  # L3's total (its 16 MiB hold the 8 MiB)
    assert source_bandwidth(mid, DEV) == pytest.approx(1 / (share / l2_total + (1 - share) / 80.0))
    # per unit, 4 active: L2 100 GB/s each, L3 80 / 4
    assert source_bandwidth(mid, DEV, 4) == pytest.approx(1 / (share / 100.0 + (1 - share) / 20.0))
    assert data_source(mid, DEV).name == ("L2" if share >= 0.5 else "L3")
    # the top level fills at the blend: its memory time is its traffic at each active unit's share
    from roller.plan.choices import estimate_tiles
    est = estimate_tiles(mid, [{"i": 1, "k": 16}, {"i": 4, "k": 1024}, {"i": 16, "k": 1024}], DEV)
    assert est.units == 4 and 0 < est.memory_seconds["L2"] == pytest.approx(
        est.traffic_bytes["L2"] / (source_bandwidth(mid, DEV, 4) * 1e9))
    assert resident_share(reduce_rows(16, 1024), load_device("a100")) == 0.0  # GPUs: no term


def test_register_accumulators_stay_in_registers_through_levels_holding_one_register_tile():
    from roller.plan.cost import accumulator_parent
    e = conv2d_nhwc(1, 42, 42, 168, 168, 1, 1)
    t = lambda h, w, k, c: {"n": 1, "h": h, "w": w, "k": k, "r": 1, "s": 1, "c": c}
    reg = t(21, 1, 16, 1)
    one, seven, top = t(21, 1, 16, 16), t(21, 7, 16, 16), t(21, 21, 176, 176)
    # an L1 tile of one register tile: the accumulators live through its reduction chunks, up to the top
    assert accumulator_parent(e, [reg, one, top], 0) is top
    assert accumulator_parent(e, [reg, seven, top], 0) is seven  # 7 register tiles: back to memory per chunk
    assert accumulator_parent(e, [reg, one, t(21, 1, 16, 176)], 0) is None  # one register tile throughout
    assert accumulator_parent(e, [reg, seven, top], 1) is top and accumulator_parent(e, [reg, seven, top], 2) is None
    from roller.plan.choices import estimate_tiles
    # the model now tells them apart: the 7-tile plan reloads its accumulators 11 times
    assert estimate_tiles(e, [reg, one, top], DEV, "k").seconds < estimate_tiles(e, [reg, seven, top], DEV, "k").seconds


def test_the_accumulator_tile_is_where_code_generation_puts_it():
    from roller.plan.tails import accumulator_tile
    e = conv2d_nhwc(1, 56, 56, 24, 144, 1, 1)
    t = lambda h, w, k, c: {"n": 1, "h": h, "w": w, "k": k, "r": 1, "s": 1, "c": c}
    reg = t(8, 1, 48, 1)
    # the whole reduction (c = 24) in one L1 pass: the register tile's own buffer
    assert accumulator_tile(e, [reg, t(56, 1, 48, 24), t(56, 14, 144, 24)], "k", 16) == {"n": 1, "h": 8, "w": 1, "k": 48}
    # the reduction split across L1 tiles (3 chunks of 8): the L1 tile's, reloaded per chunk
    assert accumulator_tile(e, [reg, t(56, 1, 48, 8), t(56, 14, 144, 24)], "k", 16) == {"n": 1, "h": 56, "w": 1, "k": 48}
    # across top tiles (a matmul's long K): the top tile
    m = matmul(1000, 1000, 1000)
    tiles = [{"i": 8, "j": 48, "k": 1}, {"i": 40, "j": 48, "k": 48}, {"i": 200, "j": 144, "k": 336}]
    assert accumulator_tile(m, tiles, "j", 16) == {"i": 200, "j": 144}
    assert accumulator_tile(elementwise(64, 64), [{"a0": 1, "a1": 16}] * 3, "a1", 16) is None


def test_accumulator_tiles_too_large_for_a_stack_array_cost_their_allocations():
    from roller.plan.cost import cycle_seconds, workspace_seconds
    e = conv2d_nhwc(1, 56, 56, 24, 144, 1, 1)
    t = lambda h, k, c: {"n": 1, "h": h, "w": 1, "k": k, "r": 1, "s": 1, "c": c}
    l1, top = t(56, 48, 24), {**t(56, 144, 24), "w": 14}
    # 8 x 48 float32 accumulators (1.5 KiB) per register tile: 7 x 56 x 3 of them, each allocated
    expected = 7 * 56 * 3 * CPU_MODEL.workspace_tile_cycles * cycle_seconds(DEV)
    assert math.isclose(workspace_seconds(e, [t(8, 48, 1), l1, top], DEV, "k"), expected)
    assert workspace_seconds(e, [t(4, 48, 1), l1, top], DEV, "k") == 0  # 768 B: a stack array
    # construction offers the stack-sized register tile beside the greedy one, and the model takes it here
    prog = construct(e, DEV, topk=1).programs[0]
    assert math.prod(e.output.region(prog.tiles[0])) * 4 < 1024


def test_accumulators_moved_through_memory_are_charged_per_reduction_chunk():
    from roller.plan.cost import accumulator_seconds as charged, cycle_seconds
    from roller.plan.choices import plan_choices
    e = conv2d_nhwc(1, 56, 56, 64, 256, 1, 1)

    def accumulator_seconds(e, tiles, dev, va):  # the term reads the plan
        return charged(e, plan_choices(e, tiles, dev, va), dev)
    t = lambda h, w, k, c: {"n": 1, "h": h, "w": w, "k": k, "r": 1, "s": 1, "c": c}
    reg, top = t(4, 1, 64, 1), t(28, 14, 256, 64)
    # one L1 pass covers the reduction: the accumulators stay in registers
    assert accumulator_seconds(e, [reg, t(28, 1, 64, 64), top], DEV, "k") == 0
    # two chunks of 32 with 7 register tiles between them: zeroed, loaded and stored twice, copied out
    vectors = 56 * 56 * 256 // 16
    two = accumulator_seconds(e, [reg, t(28, 1, 64, 32), top], DEV, "k")
    assert two == pytest.approx(vectors * 5 * CPU_MODEL.accumulator_cycles * cycle_seconds(DEV))
    assert accumulator_seconds(e, [reg, t(28, 1, 64, 16), top], DEV, "k") > two
    # the model ranks the one-pass plan first (790 against 672 us measured, one thread)
    assert estimate_tiles(e, [reg, t(28, 1, 64, 64), top], DEV, "k").seconds < estimate_tiles(
        e, [reg, t(28, 1, 64, 32), top], DEV, "k").seconds
    # chunks of the top tile's reduction keep its whole output tile between them (28 x 14 x 256 floats,
    # 392 KiB: in L2, not L1): each move costs L1's bandwidth over L2's (200 / 100 GB/s on this spec)
    split_top = accumulator_seconds(e, [reg, t(28, 1, 64, 32), t(28, 14, 256, 32)], DEV, "k")
    assert split_top == pytest.approx(two * 2)


def grouped_conv_rep(N, H, W, K, R, S, cg, kg):
    """A grouped conv as roller.tir.ops writes it for few output channels a group: the input ``Rep`` is its
    stage group_rep ([N, P, Q, cg, K], each input channel copied for the kg output channels of its group),
    staged per top tile."""
    axes = (Axis("n", N, SPATIAL), Axis("h", H, SPATIAL), Axis("w", W, SPATIAL), Axis("k", K, SPATIAL),
            Axis("r", R, REDUCE), Axis("s", S, REDUCE), Axis("c", cg, REDUCE))
    rep = acc("Rep", (N, H + R - 1, W + S - 1, cg, K), {"n": 1}, {"h": 1, "r": 1}, {"w": 1, "s": 1}, {"c": 1},
              {"k": 1})
    w = acc("Wt", (R, S, cg, K), {"r": 1}, {"s": 1}, {"c": 1}, {"k": 1})
    y = acc("Y", (N, H, W, K), {"n": 1}, {"h": 1}, {"w": 1}, {"k": 1})
    return Expr("conv2d", axes, (rep, w), y, zero_pad_axes=("r", "s", "c"), staged=("Rep",),
                repeats=(("Rep", kg),))


def test_a_repeating_stage_reads_its_source_and_writes_at_its_element_rate():
    """group_rep writes each input element kg times: the top level's fill and the copy's read are charged
    at the input's size (1/kg of the region), the writes at CPU_MODEL.replicate_cycles an element, serial with the
    compute. ResNeXt's 3x3 conv on 56x56x128 in 32 groups of 4, its first plan on the 2-core host: 450 us
    predicted with the whole replica charged as traffic from L3, 237-250 us measured (2 threads), 285 now."""
    from roller.plan.cost import cycle_seconds, replicate_seconds
    from roller.plan.rtile import tensor_footprint

    e = grouped_conv_rep(1, 56, 56, 128, 3, 3, 4, 4)
    plain = dataclasses.replace(e, repeats=())  # the same stage taken as a plain copy (a padding stage)
    reg = {"n": 1, "h": 8, "w": 1, "k": 16, "r": 3, "s": 1, "c": 1}
    l1 = {"n": 1, "h": 8, "w": 4, "k": 16, "r": 3, "s": 3, "c": 4}
    top = {"n": 1, "h": 8, "w": 56, "k": 64, "r": 3, "s": 3, "c": 4}
    tiles = [reg, l1, top]
    rep, tiles_count = e.inputs[0], tile_counts(e, top)[0]
    region = math.prod(rep.region(top))
    assert region == 10 * 58 * 4 * 64
    fill = tensor_footprint(rep, top, LevelRules.of(DEV, 2, e, "k"), moved=True) * tiles_count
    est, est_plain = estimate_tiles(e, tiles, DEV, "k"), estimate_tiles(plain, tiles, DEV, "k")
    saved = fill * (1 - 1 / 4) + region * 4 * tiles_count * (2 - 1 / 4)  # fill; copy: read and write -> read
    assert est.traffic_bytes["L2"] == pytest.approx(est_plain.traffic_bytes["L2"] - saved)
    assert replicate_seconds(e, top, DEV) == pytest.approx(region * CPU_MODEL.replicate_cycles * cycle_seconds(DEV))
    assert replicate_seconds(plain, top, DEV) == 0.0
    assert est.seconds < est_plain.seconds


def test_constants_from_memory_cost_their_traffic_at_memorys_bandwidth():
    """With Device.constants_level set (a model whose weights outgrow the caches), the prepacked weight's
    traffic into the top level is charged at that level's bandwidth; other inputs and plans without
    prepacked constants are charged as before."""
    from roller.plan.choices import estimate_tiles

    e = matmul(256, 1024, 1024)
    cold = dataclasses.replace(DEV, constants_level="DRAM")
    prog = construct(e, DEV, topk=1, constants=frozenset({"B"})).programs[0]
    warm = estimate_tiles(e, prog.tiles, DEV, prog.vector_axis, prog.padded, prog.inlined, frozenset({"B"}))
    colder = estimate_tiles(e, prog.tiles, cold, prog.vector_axis, prog.padded, prog.inlined, frozenset({"B"}))
    top = DEV.private_levels[-1].name
    assert colder.memory_seconds[top] > warm.memory_seconds[top]
    assert colder.traffic_bytes == warm.traffic_bytes
    plain = estimate_tiles(e, prog.tiles, cold, prog.vector_axis, prog.padded, prog.inlined)
    assert plain.memory_seconds == estimate_tiles(e, prog.tiles, DEV, prog.vector_axis, prog.padded,
                                            prog.inlined).memory_seconds


def test_constants_from_memory_cost_the_same_whether_or_not_the_plan_prepacks_them():
    """A constant the plan cannot prepack (it pads an axis of it: its padded copy is made per call) is evicted
    between calls all the same. Charged only to prepacked ones, MobileNetV3's classifier (1280 x 1000) took
    such a plan, which read its weight as stored: 335 us against 89 for a prepacked one (x86-avx2, 2
    threads). Its cold weight is charged from memory too."""
    from roller.plan.choices import plan_choices
    from roller.plan.cost import estimate

    e = matmul(1, 1000, 1280)
    cold = dataclasses.replace(DEV, constants_level="DRAM")
    tiles = [{"i": 1, "j": 40, "k": 1}, {"i": 1, "j": 80, "k": 40}, {"i": 1, "j": 80, "k": 640}]
    prog = plan_choices(e, tiles, DEV, "j", None, (), frozenset({"B"}))
    assert prog.padded == ("j",) and not prog.prepacked and prog.constants == ("B",)
    top = DEV.private_levels[-1].name
    assert estimate(e, prog, cold).memory_seconds[top] > estimate(e, prog, DEV).memory_seconds[top]
    plain = plan_choices(e, tiles, DEV, "j", None, ())
    assert not plain.constants and estimate(e, plain, cold).memory_seconds == estimate(e, plain, DEV).memory_seconds


def test_plans_that_split_the_reduction_over_several_register_tiles_rank_behind_unsplit_ones():
    """BERT's QK^T (12 x 128x128x64): 2 chunks of 32 over an L1 tile of 8 register tiles ran 139-147 us,
    16-deep chunks of one register tile (accumulators kept in registers) 127-136 us, two threads. At 0.5
    cycles a move the two tied and the memory tie-break took the split plan."""
    from roller.tir import ops
    from roller.builder.api import analyze
    from roller.plan.cost import accumulator_seconds as charged, rank
    from roller.plan.choices import plan_choices

    def accumulator_seconds(e, tiles, dev, va):  # the term reads the plan
        return charged(e, plan_choices(e, tiles, dev, va), dev)
    e = analyze(ops.OPS["batch_matmul"].make({"B": 12, "M": 128, "N": 128, "K": 64}))[0]
    dev = cpu(units={"count": 2, "vector_bytes": 64, "peak_gflops": {"float32": 150.0}})
    t = lambda m, n, k: {"b": 1, "m": m, "n": n, "k": k}
    reg, top = t(4, 64, 1), t(128, 128, 64)
    split, whole = [reg, t(32, 64, 32), top], [reg, t(4, 64, 16), top]
    assert accumulator_seconds(e, split, dev, "n") > 0 == accumulator_seconds(e, whole, dev, "n")
    est = {id(p): estimate_tiles(e, p, dev, "n") for p in (split, whole)}
    ranked = rank([split, whole], lambda p: est[id(p)].seconds, lambda p: est[id(p)].memory_seconds)
    assert ranked[0] is whole


def test_a_register_tile_that_loads_an_operand_per_fma_ranks_behind_one_that_reuses_its_loads(monkeypatch):
    """Same accumulators (14 vectors), same tiles above: 14 pixels x one vector loads 15 vectors a step
    for 14 FMAs, 7 x 2 vectors 9. Loads between FMAs reach ``model.register_load_share`` of the L1's stream
    bandwidth, so the first is load-bound (1x1 conv 42x42x168, one thread: 910-1151 us against 687-707);
    at the full stream bandwidth the model tied them while it packed the weight."""
    from roller.device.load import load_device

    dev = load_device("x86-avx512", calibrated=False)
    expr = conv2d_nhwc(1, 42, 42, 176, 176, 1, 1)

    def tiles(h, k):
        reg = dict(n=1, h=h, w=1, k=k, r=1, s=1, c=1)
        return [reg, dict(reg, c=176), dict(reg, h=14, w=42, k=32, c=176)]

    def ratio(dev=dev):
        narrow, wide = (estimate_tiles(expr, tiles(h, k), dev, "k", ()) for h, k in ((14, 16), (7, 32)))
        assert narrow.compute_seconds == pytest.approx(wide.compute_seconds)
        return narrow.seconds / wide.seconds

    assert ratio() > 1.25
    import dataclasses
    # at the full stream bandwidth most of the gap closes; what remains is the narrow tile's reads of
    # 64-byte slices of the weight's rows, which it reads in place (their 11-line stride spreads them
    # over the L1's sets: rtile.rows_spread)
    assert ratio(dataclasses.replace(dev, model=dataclasses.replace(dev.model, register_load_share=1.0))) < ratio() - 0.25
