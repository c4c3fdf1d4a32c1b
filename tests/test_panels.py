"""Panel tiles (roller.plan.panels): the first cache level's tile shaped as BLIS shapes a GEMM's, offered by
construction beside the grown tiles, packed where the panel re-reads its resident input, and built right."""
import dataclasses

import numpy as np
import pytest

from policy_exprs import conv2d_nhwc, cpu, elementwise, matmul
from roller.plan.construct import enumerate_programs
from roller.plan.panels import panel_capacity, panel_tiles, resident_input
from roller.plan.rtile import level_footprints, packing, panel_rereads, streamed_axes

DEV = cpu()


def test_the_resident_input_is_the_vector_rows_some_spatial_axis_does_not_index():
    assert resident_input(matmul(256, 512, 1024), "j") == "B"  # B[k, j] does not index i
    assert resident_input(matmul(256, 512, 1024), "i") == "A"  # vectors along i: A[i, k] is loaded as vectors
    assert resident_input(matmul(1, 512, 1024), "j") is None  # a GEMV: every spatial axis longer than 1 indexes B
    # a 1x1 convolution: r and s of extent 1; the weight (indexed by the vector axis k), not the larger input
    assert resident_input(conv2d_nhwc(1, 14, 14, 64, 64, 1, 1), "k") == "Wt"
    assert resident_input(conv2d_nhwc(1, 14, 14, 64, 64, 3, 3), "k") is None  # three reduced axes
    assert resident_input(elementwise(64, 64), "a1") is None  # nothing reduced


def test_a_panel_spans_the_l2_tile_along_the_streamed_axis_and_holds_a_chunk_of_the_resident_input():
    e = matmul(1024, 1024, 1024)
    plan = [{"i": 4, "j": 32, "k": 1}, {"i": 4, "j": 32, "k": 16}, {"i": 256, "j": 128, "k": 256}]
    panels = panel_tiles(e, DEV, plan, "j")
    assert panels, "a 1024^3 matmul has panels"
    chunks = []
    for tiles in panels:
        reg, l1, l2 = tiles
        assert reg == plan[0] and l2 == plan[2]  # only the L1 tile changes
        assert l1["i"] == l2["i"] and l1["j"] == reg["j"]
        assert l2["k"] % l1["k"] == 0 and l1["k"] % reg["k"] == 0  # nested
        assert streamed_axes(e, tiles) == {"i"}
        # held as a panel (B's chunk whole, A's and C's register-tile rows) it fits its share of L1
        assert level_footprints(e, tiles, DEV, "j")[1] <= panel_capacity(DEV)
        chunks.append(l1["k"])
    # the largest chunk that fits (twice as much would not: 32 KiB of B alone), and the largest of half that
    # (B 128 B a step, A 4 lines per 16 steps, C 4 x 2 lines; 24 KiB of the 32 KiB L1)
    assert sorted(chunks) == [64, 128]
    twice = [plan[0], {"i": 256, "j": 32, "k": 256}, plan[2]]
    assert level_footprints(e, twice, DEV, "j")[1] > panel_capacity(DEV)


def test_a_panel_packs_the_input_it_rereads_inside_l1():
    e = matmul(1024, 1024, 1024)
    reg, l2 = {"i": 4, "j": 32, "k": 1}, {"i": 256, "j": 128, "k": 256}
    panel = [reg, {"i": 256, "j": 32, "k": 128}, l2]
    grown = [reg, {"i": 4, "j": 32, "k": 128}, l2]
    b = next(t for t in e.inputs if t.name == "B")
    assert panel_rereads(e, b, panel) and not panel_rereads(e, b, grown)
    # no loop of the top tile's own re-reads B (its i is whole in the panel): the panel does, on rows 4 KiB apart
    # that the copy makes dense
    assert "B" in packing(e, panel, DEV, "j")[0]


def test_construction_offers_panels_for_gemms():
    e = matmul(1024, 1024, 1024)
    plans = enumerate_programs(e, DEV, 0.0)
    panels = [p for p in plans if p.tiles[1]["i"] == p.tiles[2]["i"] > p.tiles[0]["i"]
              and p.tiles[1]["j"] == p.tiles[0]["j"]]
    assert panels and all("B" in p.packed for p in panels)


@pytest.mark.build
def test_a_panel_plan_builds_and_matches_numpy():
    import roller
    from kernel_check import check_plan
    from roller.builder.api import analyze
    from roller.plan.construct import enumerate_programs as plans_of
    from roller.tir import ops

    device = roller.load_device()
    spec = ops.OPS["matmul"]
    full = spec.full_shape({"M": 256, "N": 512, "K": 384})
    expr, func = analyze(spec.make(full))
    panel = next(p for p in plans_of(expr, device, 0.0)
                 if p.tiles[1]["m"] == p.tiles[2]["m"] > p.tiles[0]["m"] and p.tiles[1]["n"] == p.tiles[0]["n"])
    check_plan(spec, full, expr, func, panel, device, [np.random.default_rng(5).standard_normal(s).astype("float32")
                                                      for s in ((256, 384), (384, 512))])
    packed = dataclasses.replace(panel, packed=("B",), storage_pad={"B": 16})  # the copy per top tile too
    check_plan(spec, full, expr, func, packed, device)


def test_no_panel_holds_a_constant_input():
    """A model's weight arrives prepacked in the plan's tiles; panels over it ran slower inside whole models
    (docs/operator-suite.md), so construction offers none there."""
    e = matmul(1024, 1024, 1024)
    plan = [{"i": 4, "j": 32, "k": 1}, {"i": 4, "j": 32, "k": 16}, {"i": 256, "j": 128, "k": 256}]
    assert panel_tiles(e, DEV, plan, "j") and not panel_tiles(e, DEV, plan, "j", frozenset({"B"}))
