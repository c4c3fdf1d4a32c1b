"""u8 x s8 -> s32 matmuls with VNNI dot-product lanes (roller.plan.dot, roller.targets.cpu.vnni): where the
device's target has VNNI and the weight is a constant, plans run the register tile with vpdpbusd (4 products
a lane) on the weight prepacked four deep, the model charges the int8 peak; every kernel equals numpy's int32
product exactly; elsewhere (no VNNI, no constant weight, K not a multiple of 4) the one-lane path stays."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from roller.builder.api import analyze
from roller.device.host import cpu_flags
from roller.device.load import load_device
from roller.plan.dot import AMX_FEATURES, DOT_DEPTH, dot_axis, dot_depth, has_vnni, target_features
from roller.plan.rprogram import RProgram
from roller.targets import construct

HOST_FLAGS = cpu_flags()
needs_vnni = pytest.mark.skipif("avx512_vnni" not in HOST_FLAGS or "avx512f" not in HOST_FLAGS,
                                reason="this host has no AVX-512 VNNI (avx512_vnni): vpdpbusd kernels cannot run here")
needs_avx_vnni = pytest.mark.skipif("avx_vnni" not in HOST_FLAGS,
                                    reason="this host has no AVX-VNNI (avx_vnni): 256-bit vpdpbusd cannot run here")


def _with_mattr(device, mattr):
    return dataclasses.replace(device, target={**{k: v for k, v in device.target.items() if k != "mattr"},
                                               **({"mattr": mattr} if mattr else {})})


def _vnni(device):
    """``device`` without AMX's features: the plans then run VNNI's dot lanes (tests/test_amx.py takes AMX)."""
    return _with_mattr(device, [f for f in target_features(device) if f not in AMX_FEATURES])


def _matmul(m: int, k: int, n: int, a_dtype: str = "uint8", transposed: bool = False):
    """``C[i, j] = sum_k int32(A[i, k]) * int32(B[k, j])`` (B stored [N, K] when ``transposed``)."""
    from tvm import te

    a = te.placeholder((m, k), a_dtype, "A")
    b = te.placeholder((n, k) if transposed else (k, n), "int8", "B")
    r = te.reduce_axis((0, k), "k")
    c = te.compute((m, n), lambda i, j: te.sum(
        a[i, r].astype("int32") * (b[j, r] if transposed else b[r, j]).astype("int32"), axis=r), "C")
    return analyze(te.create_prim_func([a, b, c]))


def _conv(n: int, size: int, c: int, o: int, k: int, stride: int, pad: int):
    """A uint8 NHWC activation convolved with an int8 HWIO weight, accumulating in int32 (TOPI's, with its
    padding stage where ``pad``)."""
    from tvm import te, topi

    x = te.placeholder((n, size, size, c), "uint8", "X")
    w = te.placeholder((k, k, c, o), "int8", "B")
    out = topi.nn.conv2d_nhwc(x, w, stride, pad, 1, out_dtype="int32")
    return analyze(te.create_prim_func([x, w, out]))


def _run(expr, norm, program, device, a, b):
    import tvm

    from roller.plan.prepack import program_layouts
    from roller.targets import build
    from roller.tir.layout import pack_constant

    layouts = program_layouts(expr, program, device)
    packed = pack_constant(layouts["B"], b) if "B" in layouts else b
    out = tvm.runtime.tensor(np.full(expr.output.shape, -7, np.int32))
    ex = build(norm, expr, program, device)
    ex["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(packed), out)
    return out.numpy(), ex


def _check_conv(expr, norm, program, device, shape, instruction: str):
    """Runs ``program``'s kernel for the convolution ``shape`` (n, size, c, o, k, stride, pad) on random uint8
    activations and int8 weights, checks it against numpy's int64 convolution exactly, and that its code uses
    ``instruction``."""
    from tvm.topi.testing import conv2d_nhwc_python

    n, size, c, o, k, stride, pad = shape
    rng = np.random.default_rng(c + o)
    a = rng.integers(0, 256, (n, size, size, c)).astype(np.uint8)
    b = rng.integers(-128, 128, (k, k, c, o)).astype(np.int8)
    got, ex = _run(expr, norm, program, device, a, b)
    np.testing.assert_array_equal(got, conv2d_nhwc_python(a.astype(np.int64), b.astype(np.int64), stride, pad))
    assert instruction in ex.mod.inspect_source("asm")


def _operands(m, k, n, rng, transposed=False, extreme=False):
    a = rng.integers(0, 256, (m, k)).astype(np.uint8)
    b = rng.integers(-128, 128, (n, k) if transposed else (k, n)).astype(np.int8)
    if extreme:  # the largest products, every lane's 4-deep sum at -4 * 255 * 128: no saturation (vpdpbusd)
        a[:], b[:] = 255, -128
    return a, b


def test_dot_depth_follows_the_targets_vnni_and_the_operands():
    avx512 = load_device("x86-avx512")
    expr, _ = _matmul(32, 64, 48)
    assert not has_vnni(avx512) and dot_depth(expr, avx512, "j") == 1  # the shipped spec names no feature
    vnni = _with_mattr(avx512, ["+avx512vnni"])
    assert has_vnni(vnni) and dot_depth(expr, vnni, "j") == DOT_DEPTH
    assert dot_depth(expr, vnni, "i") == 1  # lanes along the activation's rows: no broadcast of 4 bytes
    assert has_vnni(_with_mattr(avx512, "+avx2,+avx512vnni"))  # mattr as one string
    assert not has_vnni(_with_mattr(avx512, ["+avxvnni"]))  # AVX-VNNI is ymm only
    assert has_vnni(_with_mattr(load_device("x86-avx2"), ["+avxvnni"]))
    assert dot_depth(_matmul(32, 66, 48)[0], vnni, "j") == 1  # K not a multiple of 4
    assert dot_depth(_matmul(32, 64, 40)[0], vnni, "j") == 1  # N not whole vectors
    assert dot_depth(_matmul(32, 64, 48, a_dtype="int8")[0], vnni, "j") == 1  # s8 x s8: vpdpbusd is u8 x s8


def test_plans_run_dot_lanes_on_a_prepacked_weight_at_the_int8_peak():
    vnni = _with_mattr(load_device("x86-avx512"), ["+avx512vnni"])
    expr, _ = _matmul(128, 768, 768)
    first = construct(expr, vnni, 3, frozenset({"B"})).programs[0]
    assert first.dot_depth == DOT_DEPTH and first.prepacked == ("B",)
    assert first.tiles[0]["k"] % DOT_DEPTH == 0
    assert RProgram.from_dict(first.to_dict()).key == first.key
    assert construct(expr, vnni, 1).programs[0].dot_depth == 1  # a weight that is no constant: no [K/4, N, 4]
    plain = construct(expr, load_device("x86-avx512"), 1, frozenset({"B"})).programs[0]
    assert plain.dot_depth == 1
    # the model charges the int8 peak (4 multiply-adds a lane) where the plan runs dot-product lanes, the
    # int32 multiply-add peak where it does not
    ratio = vnni.units.peak("int8") / vnni.units.peak("int32")
    assert plain.compute_seconds / first.compute_seconds == pytest.approx(ratio, rel=0.3)


@needs_vnni
@pytest.mark.parametrize("m,k,n,transposed,extreme", [
    (24, 40, 48, False, False),
    (5, 36, 32, False, True),
    (64, 256, 96, True, False),       # a linear layer's [N, K] weight
    (128, 768, 256, False, False),
])
def test_vnni_kernel_is_exact(device, m, k, n, transposed, extreme):
    device = _vnni(device)
    assert has_vnni(device)
    expr, norm = _matmul(m, k, n, transposed=transposed)
    program = construct(expr, device, 1, frozenset({"B"})).programs[0]
    assert program.dot_depth == DOT_DEPTH
    a, b = _operands(m, k, n, np.random.default_rng(m + k + n), transposed, extreme)
    got, ex = _run(expr, norm, program, device, a, b)
    want = a.astype(np.int64) @ (b.T if transposed else b).astype(np.int64)
    np.testing.assert_array_equal(got, want)
    assert "vpdpbusd" in ex.mod.inspect_source("asm")


@needs_vnni
@pytest.mark.parametrize("n,size,c,o,k,stride,pad", [
    (1, 14, 64, 64, 3, 1, 1),     # a 3x3 convolution behind its zero padding
    (1, 9, 32, 48, 3, 2, 0),      # strided, no padding
    (2, 8, 128, 32, 1, 1, 0),     # 1x1, a batch of two
    (1, 7, 672, 112, 1, 1, 0),    # channels no cache line of bytes divides (672 = 10.5 x 64)
])
def test_vnni_convolution_is_exact(device, n, size, c, o, k, stride, pad):
    """Convolutions step along their input channels (the activation's contiguous axis) 4 deep, the window's
    other reduced axes in loops above: exactly numpy's int32 convolution, with vpdpbusd."""
    device = _vnni(device)
    expr, norm = _conv(n, size, c, o, k, stride, pad)
    assert dot_depth(expr, device, "ff") == DOT_DEPTH
    program = construct(expr, device, 1, frozenset({"B"})).programs[0]
    assert program.dot_depth == DOT_DEPTH and not program.inlined
    _check_conv(expr, norm, program, device, (n, size, c, o, k, stride, pad), "vpdpbusd")


def test_convolution_dot_lanes_need_whole_dot_steps_of_channels():
    """3 input channels (an image) take no 4-deep steps; the channels, not the window, are the dot axis."""
    vnni = _with_mattr(load_device("x86-avx512"), ["+avx512vnni"])
    assert dot_depth(_conv(1, 16, 3, 32, 3, 1, 1)[0], vnni, "ff") == 1
    expr = _conv(1, 16, 8, 32, 3, 1, 1)[0]
    assert dot_axis(expr, "ff") == "rc" and dot_depth(expr, vnni, "ff") == DOT_DEPTH
    first = construct(expr, vnni, 1, frozenset({"B"})).programs[0]
    assert first.dot_depth == DOT_DEPTH and first.tiles[0]["rc"] % DOT_DEPTH == 0


def test_dot_lanes_axes_never_overhang():
    """With dot-product lanes the vector and dot axes take divisors of their extents at every level: an
    overhanging tile (672 channels in tiles of 64 bytes) left the plan one lane a step, 186 us where the
    dot-lane plan runs 32 (docs/models.md, "QDQ convolutions")."""
    vnni = _with_mattr(load_device("x86-avx512"), ["+avx512vnni"])
    for c, o in [(672, 112), (112, 672)]:
        expr = _conv(1, 14, c, o, 1, 1, 0)[0]
        for plan in construct(expr, vnni, 5, frozenset({"B"})).programs:
            assert plan.dot_depth == DOT_DEPTH, plan
            assert all(c % t["rc"] == 0 and o % t["ff"] == 0 for t in plan.tiles), plan.tiles
            assert not {"rc", "ff"} & set(plan.padded + plan.predicated), plan


@pytest.mark.parametrize("m,k,n", [(7, 42, 48), (9, 64, 40)])
def test_shapes_vnni_cannot_take_keep_the_one_lane_path(device, m, k, n):
    """K not a multiple of 4 (42), N not whole vectors (40): no dot-product lanes, the result still exact."""
    expr, norm = _matmul(m, k, n)
    program = construct(expr, device, 1, frozenset({"B"})).programs[0]
    assert program.dot_depth == 1
    a, b = _operands(m, k, n, np.random.default_rng(1))
    np.testing.assert_array_equal(_run(expr, norm, program, device, a, b)[0], a.astype(np.int64) @ b)


def test_without_vnni_the_one_lane_kernel_is_exact(device):
    plain = _with_mattr(device, [])
    expr, norm = _matmul(16, 64, 32)
    program = construct(expr, plain, 1, frozenset({"B"})).programs[0]
    assert program.dot_depth == 1
    a, b = _operands(16, 64, 32, np.random.default_rng(2))
    np.testing.assert_array_equal(_run(expr, norm, program, plain, a, b)[0], a.astype(np.int64) @ b)


@needs_avx_vnni
def test_avx_vnni_256_bit_kernel_is_exact():
    avx2 = _with_mattr(load_device("x86-avx2"), ["+avxvnni"])
    expr, norm = _matmul(12, 64, 24)
    program = construct(expr, avx2, 1, frozenset({"B"})).programs[0]
    assert program.dot_depth == DOT_DEPTH
    a, b = _operands(12, 64, 24, np.random.default_rng(3))
    got, ex = _run(expr, norm, program, avx2, a, b)
    np.testing.assert_array_equal(got, a.astype(np.int64) @ b)
    assert "ymm" in ex.mod.inspect_source("asm") and "vpdpbusd" in ex.mod.inspect_source("asm")


def test_a_dot_depth_the_code_cannot_run_is_an_error():
    """The plan is the whole truth: dot-product lanes on a float matmul, or on a register tile that takes no
    whole dot steps, raise with the reason; the field is part of the plan's key."""
    from roller.errors import BuildError
    from roller.targets import schedule
    from roller.tir import ops

    vnni = _with_mattr(load_device("x86-avx512"), ["+avx512vnni"])
    expr, norm = analyze(ops.matmul(32, 64, 48))
    plan = construct(expr, vnni, 1, frozenset({"B"})).programs[0]
    wrong = dataclasses.replace(plan, dot_depth=DOT_DEPTH)
    assert wrong.key != plan.key
    with pytest.raises(BuildError, match="u8 x s8"):
        schedule(norm, expr, wrong, vnni)
    expr, norm = _matmul(32, 64, 48)
    plan = construct(expr, vnni, 1, frozenset({"B"})).programs[0]
    odd = dataclasses.replace(plan, tiles=({**plan.tiles[0], "k": 2},) + tuple(
        {**t, "k": max(2, t["k"])} for t in plan.tiles[1:]))
    with pytest.raises(BuildError, match="register tile takes 2"):
        schedule(norm, expr, odd, vnni)
