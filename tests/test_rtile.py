"""rTile arithmetic on hand-computed cases (no TVM)."""
import pytest

from policy_exprs import conv2d_nhwc, cpu, elementwise, matmul, reduce_rows
from roller.plan.expr import fuse_axes
from roller.plan.rtile import (LevelRules, aligned_sizes, axis_step, footprint, next_aligned, padding_waste,
                               tensor_footprint,
                               reuse_score, tile_counts, traffic)

DEV = cpu()


def rules(expr, level):
    return LevelRules.of(DEV, level, expr)


def test_paper_matmul_tile_reads_4x2_of_A_and_2x4_of_B():
    e = matmul(8, 8, 8)
    tile = {"i": 4, "j": 4, "k": 2}
    A, B = e.inputs
    assert A.region(tile) == (4, 2)
    assert B.region(tile) == (2, 4)
    assert e.output.region(tile) == (4, 4)


def test_matmul_footprint_and_traffic_by_hand():
    e = matmul(8, 8, 8)
    tile = {"i": 4, "j": 4, "k": 2}
    # level 0 counts raw bytes: A 4x2, B 2x4, C 4x4 floats
    assert footprint(e, tile, rules(e, 0)) == (8 + 8 + 16) * 4
    # L1 rounds every row to a 64 B line: A 4 rows, B 2 rows, C 4 rows
    assert footprint(e, tile, rules(e, 1)) == (4 + 2 + 4) * 64
    # 2*2*4 = 16 tiles load A and B; 4 spatial tiles write C once
    assert tile_counts(e, tile) == (16, 4)
    assert traffic(e, tile, rules(e, 1)) == (4 + 2) * 64 * 16 + 4 * 64 * 4
    # a parent tile with k=4 splits the reduction in 2 chunks: C is read back and written again once
    assert traffic(e, tile, rules(e, 1), parent={"i": 8, "j": 8, "k": 4}) == (4 + 2) * 64 * 16 + 4 * 64 * 4 * 3


def test_level0_moves_broadcast_elements_as_whole_loads():
    e = matmul(64, 64, 64)
    tile = {"i": 4, "j": 32, "k": 1}
    r = rules(e, 0)
    # A (rows along k, not the vector axis j): 4 broadcasts of one float, each a 64 B load;
    # B: one row of 32 floats = two vector loads; C: 4 rows of two vectors
    assert traffic(e, tile, r) == (4 * 64 + 2 * 64) * (16 * 2 * 64) + 4 * 128 * (16 * 2)


def test_conv_window_region_footprint_and_traffic():
    e = conv2d_nhwc(1, 8, 8, 8, 16, 3, 3)
    tile = {"n": 1, "h": 4, "w": 4, "k": 16, "r": 3, "s": 3, "c": 8}
    X, Wt = e.inputs
    assert X.region(tile) == (1, 6, 6, 8)  # (4-1)*1 + (3-1)*1 + 1 = 6
    assert Wt.region(tile) == (3, 3, 8, 16)
    assert footprint(e, tile, rules(e, 0)) == (288 + 1152 + 256) * 4
    # L1: X has 36 rows of 8 floats (one line each), W 72 rows of 16 floats, Y 16 rows of 16 floats
    assert footprint(e, tile, rules(e, 1)) == (36 + 72 + 16) * 64
    assert tile_counts(e, tile) == (4, 4)
    assert traffic(e, tile, rules(e, 1)) == (36 + 72) * 64 * 4 + 16 * 64 * 4


@pytest.mark.parametrize("stride,dilation,expected", [(1, 1, 6), (2, 1, 9), (2, 2, 11), (1, 2, 8)])
def test_sliding_window_extent(stride, dilation, expected):
    e = conv2d_nhwc(1, 8, 8, 4, 4, 3, 3, stride=stride, dilation=dilation)
    tile = {"n": 1, "h": 4, "w": 1, "k": 1, "r": 3, "s": 1, "c": 1}
    assert e.inputs[0].region(tile)[1] == expected  # (t-1)*stride + (r-1)*dilation + 1


def test_region_is_clipped_to_the_tensor():
    e = matmul(3, 5, 7)
    assert e.inputs[0].region({"i": 16, "j": 16, "k": 16}) == (3, 7)


def test_axis_steps_follow_simd_width_and_transaction_length():
    e = matmul(1024, 1024, 1024)
    # level 0: the vector axis (output's contiguous j) moves in 16 float32 lanes, others by 1
    assert [axis_step(e, a, rules(e, 0)) for a in "ijk"] == [1, 16, 1]
    # L1: j (contiguous in B and C) and k (contiguous in A) move in 64 B lines = 16 floats
    assert [axis_step(e, a, rules(e, 1)) for a in "ijk"] == [1, 16, 16]
    e16 = matmul(64, 64, 64, dtype="float16")
    assert axis_step(e16, "j", rules(e16, 0)) == 32


def test_padding_waste_and_epsilon():
    assert padding_waste(1000, 16) == pytest.approx(8 / 1000)
    assert padding_waste(1024, 16) == 0
    # epsilon 0: only sizes that divide the extent, plus the extent itself
    assert aligned_sizes(1000, 8, 1, 0.0) == [8, 40, 200, 1000]
    assert aligned_sizes(1024, 16, 1, 0.0) == [16, 32, 64, 128, 256, 512, 1024]
    # epsilon 2.4%: 8 (1000), 16 (1008), 24 (1008), 32 (1024) waste <= 24/1000; 48 (1008) too; 56 (1008)...
    sizes = aligned_sizes(1000, 8, 1, 0.024)
    assert sizes[:4] == [8, 16, 24, 32] and all(padding_waste(1000, s) <= 0.024 for s in sizes)
    # no multiple of 16 divides 1000: at least UNALIGNED_EXTENT_EPSILON (5%) of waste is always allowed,
    # 16 (1008) and 80 (1040, 4%) but not 96 (1056, 5.6%)
    sizes = aligned_sizes(1000, 16, 1, 0.0)
    assert sizes[:5] == [16, 32, 48, 64, 80] and 96 not in sizes
    assert all(padding_waste(1000, s) <= 0.05 for s in sizes)


def test_next_aligned_nests_in_the_lower_tile_and_stops_at_the_extent():
    assert next_aligned(1024, 32, 16, 32, 0.0) == 64
    assert next_aligned(24, 16, 16, 8, 0.4) == 24  # the exact extent comes before the overhanging 32
    assert next_aligned(17, 16, 16, 1, 1.0) == 17
    assert next_aligned(17, 17, 16, 1, 1.0) is None
    assert next_aligned(5, 0, 16, 1, 0.0) == 5  # smaller than a vector: the whole extent
    assert next_aligned(1 << 24, 1024, 16, 1, 0.0, limit=2048) == 2048
    assert next_aligned(1 << 24, 2048, 16, 1, 0.0, limit=2048) is None


def test_reuse_score_prefers_the_axis_that_saves_traffic():
    e = matmul(1024, 1024, 1024)
    r = rules(e, 1)
    t = {"i": 16, "j": 16, "k": 16}
    grow_i = reuse_score(e, t, {**t, "i": 32}, r)
    grow_k = reuse_score(e, t, {**t, "k": 32}, r)
    assert grow_i > 0
    assert grow_k == 0  # with no parent, a longer reduction saves no traffic at this level


def test_axis_fusion_of_17_11_3():
    e = fuse_axes(elementwise(17, 11, 3))
    assert [(a.extent, a.parts) for a in e.axes] == [(561, (("a0", 17), ("a1", 11), ("a2", 3)))]
    assert all(t.shape == (561,) for t in e.tensors)


def test_axis_fusion_keeps_matmul_and_fuses_only_what_all_tensors_agree_on():
    assert [a.name for a in fuse_axes(matmul(17, 11, 3)).axes] == ["i", "j", "k"]
    from roller.plan.expr import REDUCE, SPATIAL, Axis, Expr
    from policy_exprs import acc
    # sum over the last two axes: k1, k2 fuse (adjacent in A, absent from S); i stays
    e = Expr("r", (Axis("i", 4, SPATIAL), Axis("k1", 5, REDUCE), Axis("k2", 6, REDUCE)),
             (acc("A", (4, 5, 6), {"i": 1}, {"k1": 1}, {"k2": 1}),), acc("S", (4,), {"i": 1}), flops_per_point=1)
    f = fuse_axes(e)
    assert [(a.name, a.extent, a.kind) for a in f.axes] == [("i", 4, SPATIAL), ("k1_k2", 30, REDUCE)]
    assert f.inputs[0].shape == (4, 30)
    assert fuse_axes(reduce_rows(4, 5)).axes == reduce_rows(4, 5).axes  # spatial and reduce never fuse


def test_a_residual_epilogue_streams_at_the_write_back():
    """A fused residual (an input shaped like the output, no reduction axis) is read once per output point
    at the write-back: it holds no register-tile space and moves once per spatial tile, so the register
    tile is the one without it. A bias takes no register either (it is loaded at the write-back, when the
    reduction's operands have left the registers), but above the registers it counts unless the output's
    other axes have extent 1 (a GEMV) (rtile.epilogue_inputs, rtile.footprint)."""
    import dataclasses

    from policy_exprs import acc
    from roller.targets import construct
    from roller.plan.rtile import epilogue_inputs, tile_counts, traffic

    base = matmul(128, 768, 768)
    residual = dataclasses.replace(base, inputs=base.inputs + (acc("R", (128, 768), {"i": 1}, {"j": 1}),))
    bias = dataclasses.replace(base, inputs=base.inputs + (acc("b", (768,), {"j": 1}),))
    assert epilogue_inputs(residual) == {"R"} and epilogue_inputs(bias) == frozenset()
    assert epilogue_inputs(base) == epilogue_inputs(elementwise(64, 64)) == frozenset()
    gemv = matmul(1, 1000, 1280)  # a classifier: its bias is one value per output point
    gemv = dataclasses.replace(gemv, inputs=gemv.inputs + (acc("b", (1000,), {"j": 1}),))
    assert epilogue_inputs(gemv) == {"b"}
    device = cpu()
    first = lambda e: construct(e, device, 1).programs[0].tiles[0]  # noqa: E731
    assert first(residual) == first(base)
    rules = LevelRules.of(device, 0, residual)
    tile = {"i": 4, "j": 64, "k": 4}
    assert footprint(residual, tile, rules) == footprint(base, tile, rules) == footprint(bias, tile, rules)
    l1 = LevelRules.of(device, 1, residual)  # above the registers a bias is held with its tile
    assert footprint(residual, tile, l1) == footprint(base, tile, l1) < footprint(bias, tile, l1)
    spatial = tile_counts(residual, tile)[1]
    assert traffic(residual, tile, rules) - traffic(base, tile, rules) == 4 * 64 * 4 * spatial


def test_a_one_element_epilogue_input_holds_no_register_tile_space():
    """A QDQ graph's scale as a [1, 1] tensor (one element, indexed by an axis of extent 1 at most) is read by
    the write-back like a residual: an epilogue input. Counted in the register tile, eight of them made the
    model predict a QDQ convolution 2x slower and halve its vector tile (AVX2: 72.6 against 50.2 ms a model)."""
    import dataclasses

    from policy_exprs import acc
    from roller.plan.rtile import epilogue_inputs

    base = matmul(128, 768, 768)
    scale = dataclasses.replace(base, inputs=base.inputs + (acc("s", (1, 1), {}, {}),))
    assert epilogue_inputs(scale) == {"s"}
    rules = LevelRules.of(cpu(), 0, scale)
    tile = {"i": 4, "j": 64, "k": 4}
    assert footprint(scale, tile, rules) == footprint(base, tile, rules)


def test_registers_load_the_elements_a_strided_tile_reads_not_their_span():
    """A stride-2 convolution's register tile of 7 output pixels broadcasts 7 input pixels, not the 13 its
    input region spans (the span made a 1-pixel x 4-vector tile look cheaper than 7 pixels x 1 vector on
    AVX2: the 1x1/2 conv 14x14 1024 -> 2048 ran 2341 us against 1236). Caches keep the span."""
    e = conv2d_nhwc(1, 7, 7, 64, 32, 1, 1, stride=2)
    x = e.inputs[0]
    tile = {"n": 1, "h": 1, "w": 7, "k": 8, "r": 1, "s": 1, "c": 1}
    assert x.region(tile) == (1, 1, 13, 1) and x.region(tile, distinct=True) == (1, 1, 7, 1)
    reg, l1 = rules(e, 0), rules(e, 1)
    assert tensor_footprint(x, tile, reg, moved=True) == 7 * reg.level.transaction_bytes  # one broadcast each
    assert tensor_footprint(x, {**tile, "c": 16}, l1) == 13 * l1.level.transaction_bytes
    # a window whose smaller step bridges the stride reads its whole span; one that does not, separate runs
    w3 = conv2d_nhwc(1, 7, 7, 64, 32, 3, 3, stride=2).inputs[0]
    win = {"n": 1, "h": 2, "w": 4, "k": 8, "r": 3, "s": 1, "c": 1}
    assert w3.region(win, distinct=True) == (1, 5, 4, 1)
    dil = conv2d_nhwc(1, 7, 7, 64, 32, 3, 3, dilation=2).inputs[0]
    assert dil.region({"n": 1, "h": 1, "w": 2, "k": 8, "r": 3, "s": 3, "c": 1}, distinct=True) == (1, 3, 6, 1)
