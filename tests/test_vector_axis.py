"""The vector axis is a plan choice (roller.plan.rtile.vector_candidates, ranked by the model): the cases where
a fixed 'most bytes' rule picked a reduction with a tiny register tile, pinned, and built against numpy."""
import dataclasses

import numpy as np
import pytest

from roller.plan.choices import estimate_tiles
from roller.tir import ops
from roller.builder.api import analyze, build_op
from roller.targets import construct
from roller.device.load import load_device
from roller.plan.rtile import LevelRules, exact_axes, footprint, gathers, layout_expr, transposes, vector_candidates
from roller.plan.tails import partial_sums, rolled_reduce_axes

from policy_exprs import conv2d_nhwc, cpu, matmul, reduce_rows

DEV = cpu()


def op_expr(op, shape, **options):
    spec = ops.OPS[op].with_options(**options)
    return analyze(spec.make(shape))[0]


def test_candidates_skip_axes_that_gather():
    # matmul: k indexes B outside its contiguous dimension (a gather); n is contiguous in B and C
    assert vector_candidates(matmul(64, 64, 64)) == ("j",)
    assert gathers(matmul(64, 64, 64), "k") and not gathers(matmul(64, 64, 64), "j")
    # NHWC conv: c is contiguous in the input but strided in the weight [R, S, C, K]
    assert vector_candidates(conv2d_nhwc(1, 28, 28, 64, 32, 3, 3, stride=2)) == ("k",)
    # a row sum: the reduced axis is contiguous in the input; the rows (spatial) only with A packed
    # transposed, which the model ranks below for this shape
    assert vector_candidates(reduce_rows(4096, 7)) == ("k", "i")
    assert transposes(reduce_rows(4096, 7), "i") == ("A",)
    assert construct(reduce_rows(4096, 7), DEV, topk=1).programs[0].vector_axis == "k"


def test_transposed_layout_makes_a_spatial_axis_contiguous():
    """matmul nt (B is [N, K]): vectorizing n packs B transposed, so the plan reads B as [K, N]."""
    e = op_expr("matmul", dict(M=128, N=3072, K=768), layout="nt")
    assert set(vector_candidates(e)) == {"n", "k"} and transposes(e, "n") == ("B",)
    laid = layout_expr(e, "n")
    b = next(t for t in laid.inputs if t.name == "B")
    assert b.packed_order == (1, 0) and b.shape == (768, 3072) and b.innermost_axes() == ("n",)
    assert layout_expr(laid, "n") == laid  # idempotent
    best = construct(e, DEV, topk=1).programs[0]
    assert best.vector_axis == "n" and best.layouts == {"B": (1, 0)} and "B" in best.packed


def test_partial_sums_count_a_vector_per_output_element():
    """Along a reduced vector axis every output element of the register tile holds lanes partial sums."""
    e = reduce_rows(64, 256)
    reg = {"i": 4, "k": 32}
    rules = LevelRules.of(DEV, 0, e, "k")
    assert footprint(e, reg, rules) == 4 * 32 * 4 + 4 * 16 * 4  # input region + 4 accumulator vectors
    assert partial_sums(e, reg, "k", 16)
    assert not partial_sums(e, {"i": 4, "k": 7}, "k", 16)  # less than a vector: scalar


def test_bmm_with_m_greater_than_n_vectorizes_n():
    """A[b, m, k] outweighs the output when M > N; the plan still vectorizes n with a real register tile."""
    e = op_expr("batch_matmul", dict(B=8, M=256, N=64, K=256))
    best = construct(e, DEV, topk=3).programs[0]
    assert best.vector_axis == "n"
    assert best.tiles[0]["n"] % 16 == 0 and best.tiles[0]["m"] * best.tiles[0]["n"] // 16 >= 4


def test_nhwc_conv_with_c_greater_than_k_vectorizes_k():
    e = op_expr("conv2d", dict(N=1, H=57, W=57, C=64, K=32, R=3, S=3, stride=2))
    best = construct(e, DEV, topk=3).programs[0]
    assert best.vector_axis == "k" and best.tiles[0]["k"] % 16 == 0


def test_row_sum_vectorizes_the_reduced_axis_with_partial_sums():
    e = op_expr("reduce_sum", dict(M=512, N=1024))
    best = construct(e, DEV, topk=3).programs[0]
    assert best.vector_axis == "n" and best.partial_sums


def test_gemv_with_a_linear_layer_weight_vectorizes_the_reduction():
    """matmul nt at M=1 (B is [N, K]): a transposed copy of B would move as many bytes as the whole
    GEMV, so the model picks dot-product lanes along k, which read B as stored."""
    e = op_expr("matmul", dict(M=1, N=1000, K=1280), layout="nt")
    best = construct(e, DEV, topk=3).programs[0]
    assert best.vector_axis == "k" and best.partial_sums


def test_fc_layer_at_a_small_batch_reads_the_weight_as_stored():
    """matmul nt, M=32, N=1000, K=2048: vectorizing n needs a transposed copy of the whole 8 MB weight,
    which the model charges at its element rate (it ran 1.8 ms against 0.9 ms for dot products)."""
    e = op_expr("matmul", dict(M=32, N=1000, K=2048), layout="nt")
    best = construct(e, DEV, topk=3).programs[0]
    assert best.vector_axis == "k" and best.partial_sums and not best.layouts


def test_model_charges_transposed_packs_and_folds_serially(monkeypatch):
    """The copy into a transposed pack and the fold of partial-sum lanes run before / after the tile's
    compute, not under it: each adds its cycles to every top tile. (N = 248: the last top tile overhangs,
    so the copy is scattered, not transposed in registers.)"""
    from roller.plan import cost as model

    e = op_expr("matmul", dict(M=64, N=248, K=512), layout="nt")
    laid = layout_expr(e, "n")
    tiles = [{"m": 4, "n": 32, "k": 1}, {"m": 16, "n": 32, "k": 64}, {"m": 32, "n": 128, "k": 512}]
    with_copy = estimate_tiles(laid, tiles, DEV, "n")
    cycles = DEV.model.transpose_cycles
    without = estimate_tiles(laid, tiles, dataclasses.replace(DEV, model=dataclasses.replace(DEV.model, transpose_cycles=0.0)), "n")
    per_tile = 128 * 512 * cycles * model.cycle_seconds(DEV)  # the top tile's [K, N] region of B, once
    assert with_copy.seconds - without.seconds == pytest.approx(with_copy.waves * per_tile, rel=1e-6)

    tiles = [{"m": 2, "n": 2, "k": 16}, {"m": 4, "n": 8, "k": 128}, {"m": 32, "n": 64, "k": 512}]
    folded = estimate_tiles(e, tiles, DEV, "k")
    cycles = DEV.model.fold_cycles
    unfolded = estimate_tiles(e, tiles, dataclasses.replace(DEV, model=dataclasses.replace(DEV.model, fold_cycles=0.0)), "k")
    per_tile = 32 * 64 * 16 * cycles * model.cycle_seconds(DEV)  # every output's 16 lanes
    assert folded.seconds - unfolded.seconds == pytest.approx(folded.waves * per_tile, rel=1e-6)


def test_model_charges_padding_copies_per_element_serially():
    """A convolution's zero-padding stage copied per top tile costs its elements before the tile's compute:
    whole vectors where its rows are (96 channels), one by one where not (84), whatever the traffic."""
    from roller.plan import cost as model

    for channels, cycles in ((84, DEV.model.stage_copy_cycles), (96, DEV.model.stage_vector_copy_cycles)):
        e = op_expr("conv2d", dict(N=1, H=42, W=42, C=channels, K=channels, R=3, S=3, pad=1))
        assert e.staged == ("pad_temp",)
        top = {"n": 1, "h": 42, "w": 42, "k": 16, "r": 3, "s": 3, "c": channels}
        window = 44 * 44 * channels  # the padded input, whole, for every top tile of 16 output channels
        assert model.stage_copy_seconds(e, top, DEV, ["pad_temp"]) == pytest.approx(
            window * cycles * model.cycle_seconds(DEV))
        assert model.stage_copy_seconds(e, top, DEV, []) == 0.0  # inlined, or folded into a pack


def test_partial_sums_take_lanes_at_every_level():
    """The code keeps the partial sums in a buffer over the whole top tile: lanes per output element."""
    e = reduce_rows(64, 256)
    tile = {"i": 16, "k": 64}
    rules = LevelRules.of(DEV, 1, e, "k")
    line = rules.level.transaction_bytes
    assert footprint(e, tile, rules) == 16 * 64 * 4 + 16 * max(line, 16 * 4)


def test_row_sum_of_few_rows_spreads_over_the_units():
    """reduce_sum 100 x 3001: the 100 sums (0.03% of the bytes) do not set the alignment of the rows, so
    the rows split over the units (aligned to the output's cache lines, the plan was 16 or all 100 rows:
    one core, 16 us against PyTorch's 13 us; two cores: 10 us)."""
    e = op_expr("reduce_sum", dict(M=100, N=3001))
    best = construct(e, DEV, topk=3).programs[0]
    assert best.units == DEV.units.count


@pytest.mark.build
@pytest.mark.parametrize("op,shape,options", [
    ("batch_matmul", dict(B=2, M=96, N=24, K=40), {}),
    ("conv2d", dict(N=1, H=23, W=23, C=40, K=24, R=3, S=3, stride=2), {}),
    ("reduce_sum", dict(M=37, N=300), {}),
    ("conv2d", dict(N=1, H=19, W=19, C=36, K=36, R=1, S=1), {}),
    ("matmul", dict(M=40, N=70, K=33), {"layout": "nt"}),
])
def test_chosen_plans_build_and_match_numpy(op, shape, options):
    """The top plans for each case build, vectorize what they planned, and match numpy."""
    res = build_op(op, shape, device=load_device("host"), topk=3, **options)
    assert all(c["verified"] for c in res.report["candidates"])
    spec = ops.OPS[op].with_options(**options)
    full = ops.validate_shape(op, shape)
    ins = spec.inputs(full, "float32", np.random.default_rng(7))
    ref = spec.reference(ins, full)
    import tvm

    out = tvm.runtime.tensor(np.full(ref.shape, np.nan, "float32"))
    res.module["main"](*[tvm.runtime.tensor(a) for a in ins], out)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-4)
    assert res.program.vector_axis in vector_candidates(res.expr)
    assert not res.report["candidates"][res.report["chosen"]]["notes"]


@pytest.mark.build
@pytest.mark.parametrize("op,shape", [
    # found by test_properties: a grouped conv's vector axis j overhanging its group (wrong results, then
    # a refused pad), and a predicated, unrolled register loop under a fused grid loop (build failure)
    ("conv2d", dict(N=1, H=1, W=1, C=2, K=34, R=1, S=1, groups=2)),
    ("conv2d", dict(N=1, H=1, W=1, C=2, K=72, R=1, S=1, groups=2)),
    ("batch_matmul", dict(B=3, M=97, N=3, K=97)),
])
def test_regressions_from_the_property_tests(op, shape):
    res = build_op(op, shape, device=load_device("host"), topk=4)
    assert all(c["verified"] for c in res.report["candidates"]), res.report["candidates"]


def test_grouped_output_axes_never_overhang():
    e = op_expr("conv2d", dict(N=1, H=5, W=5, C=4, K=68, R=1, S=1, groups=2))
    assert exact_axes(e) == {"g", "j"}
    for p in construct(e, DEV, topk=10).programs:
        assert not set(p.padded + p.predicated) & {"g", "j"}


def test_copy_bytes_charge_the_functions_own_padding_stage():
    """A padded convolution's pad_temp stage runs per top tile over the tile's window region: read and
    written once per tile (depthwise 3x3 on 56x56x144: the stage took ~40% of the kernel's time)."""
    from roller.plan.tails import copy_bytes

    e = op_expr("depthwise_conv2d", dict(N=1, H=56, W=56, C=144, R=3, S=3, pad=1))
    assert e.staged == ("pad_temp",)
    top = {"n": 1, "h": 56, "w": 4, "c": 144, "r": 3, "s": 3}
    tiles = 14  # 56 / 4 along w
    assert copy_bytes(e, top, (), ()) == 2 * 58 * 6 * 144 * 4 * tiles


def test_copy_bytes_charge_packing_the_same_region_again():
    """A plain pack of B is not charged the first time, but the top tiles along m (which does not index
    B) copy the same region again: ViT's 197 x 3072 x 768 fc1 with top tiles of 100 rows packed all of
    B twice, and its first plan ran 6.6 ms against 5.3 ms for 200-row tiles."""
    from roller.plan.tails import copy_bytes

    e = op_expr("matmul", dict(M=197, N=3072, K=768))
    b = next(t for t in e.inputs if t.name == "B")
    once = copy_bytes(e, {"m": 200, "n": 64, "k": 256}, (), ("B",))
    twice = copy_bytes(e, {"m": 100, "n": 64, "k": 256}, (), ("B",))
    assert once == 0
    assert twice == 2 * 256 * 64 * b.elem_bytes * (2 * 48 * 3 - 48 * 3)  # one more copy of each B region


def test_padded_copies_made_once_at_root_run_before_the_kernel_not_under_it():
    """A prime matmul (127 x 251 x 509) padded along m copies A whole at root, a parallel loop of its
    own before the kernel's. Charged as the top level's traffic, under the compute, that plan ranked
    first; the plan predicating m instead ran 1.11-1.34x faster (two threads)."""
    from roller.plan.cost import launch_seconds, source_bandwidth
    from roller.plan.tails import copy_bytes, root_copy_bytes

    e = op_expr("matmul", dict(M=127, N=251, K=509))
    a_bytes, b_bytes = 127 * 509 * 4, 509 * 251 * 4
    assert root_copy_bytes(e, ("m", "n"), ()) == 2 * (a_bytes + b_bytes)
    assert root_copy_bytes(e, ("m", "n"), ("B",)) == 2 * a_bytes  # a packed B is copied per top tile
    assert root_copy_bytes(e, ("m", "n"), ("B",), ("A",)) == 0  # a prepacked A arrives padded
    assert root_copy_bytes(e, ("n",), ("B",)) == 0  # m predicated: A is read in place
    t = lambda m, n, k: {"m": m, "n": n, "k": k}
    tiles = [t(4, 64, 1), t(4, 64, 64), t(128, 64, 512)]
    assert copy_bytes(e, tiles[-1], ("m", "n"), ("B",)) >= 2 * a_bytes
    predicated = estimate_tiles(e, tiles, DEV, "n", ("n",)).seconds
    padded = estimate_tiles(e, tiles, DEV, "n", ("m", "n")).seconds
    assert padded - predicated >= 2 * a_bytes / (source_bandwidth(e, DEV) * 1e9) + launch_seconds(DEV, 2)


def test_window_register_tiles_too_big_to_unroll_keep_the_reduce_loop_rolled():
    # the ResNet stem: w16 x k16 x s7, stride 2: 15 * 2 + 7 = 37 distinct broadcasts + 16 accumulators > 32
    stem = conv2d_nhwc(1, 112, 112, 64, 3, 7, 7, stride=2)
    reg = dict(n=1, h=1, w=16, k=16, r=1, s=7, c=1)
    assert rolled_reduce_axes(stem, reg, "k", 16, 32) == {"s"}
    # stride-2 3x3, h7 x k32 x r3: 15 broadcasts + 14 accumulators = 29 fit in 32: unrolled
    s2 = conv2d_nhwc(1, 28, 28, 64, 64, 3, 3, stride=2)
    assert not rolled_reduce_axes(s2, dict(n=1, h=7, w=1, k=32, r=3, s=1, c=1), "k", 16, 32)
    # no window shared by a spatial and a reduce axis of the tile (s = 1): nothing to roll
    assert not rolled_reduce_axes(stem, dict(reg, s=1), "k", 16, 32)


def test_construction_plans_no_register_tile_whose_window_would_spill():
    from roller.plan.tails import spills_window
    # 3x3 conv, h14 x k16 x r3: 16 window broadcasts + 14 accumulators = 30 fit; with two channels (c2) 32 + 14
    # do not, and LLVM unrolls the 3-step r loop that code generation rolls: 1.89 against 1.35 ms (one thread)
    conv = conv2d_nhwc(1, 56, 56, 64, 64, 3, 3)
    reg = dict(n=1, h=14, w=1, k=16, r=3, s=1, c=1)
    assert not spills_window(conv, reg, "k", 16, 32)
    assert spills_window(conv, dict(reg, c=2), "k", 16, 32)
    assert not spills_window(conv, dict(reg, r=1, c=2), "k", 16, 32)  # no window: one broadcast per row
    # every plan construction offers for the stem leaves nothing to roll
    stem = conv2d_nhwc(1, 112, 112, 3, 64, 7, 7, stride=2)
    dev = cpu()
    regs = dev.private_levels[0].capacity_bytes // dev.units.vector_bytes
    for p in construct(stem, dev, 10).programs:
        assert not rolled_reduce_axes(stem, p.tiles[0], p.vector_axis, 16, regs), p.tiles[0]
