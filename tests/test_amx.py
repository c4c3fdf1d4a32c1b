"""u8 x s8 -> s32 matmuls on AMX tiles (roller.plan.dot.amx_register_tiles, roller.targets.cpu.amx): where the
device's target has AMX and the weight is a constant, plans may take a register tile of 16-row int32 tiles
over a 64-deep multiple of the reduction, the model charges the matrix unit's peak; every kernel equals
numpy's int32 product exactly; elsewhere (no AMX, rows or columns not whole tiles, K not whole 64-deep steps)
the VNNI or one-lane path stays."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from roller.device.host import cpu_flags
from roller.device.load import load_device
from roller.errors import BuildError
from roller.plan.choices import estimated, plan_choices
from roller.plan.dot import AMX_DEPTH, DOT_DEPTH, AmxLayout, amx_efficiency, amx_layout, has_amx, is_amx_tile
from roller.plan.rprogram import RProgram
from roller.targets import construct
from test_vnni import _check_conv, _conv, _matmul, _operands, _run, _with_mattr

needs_amx = pytest.mark.skipif(not {"amx_tile", "amx_int8"} <= cpu_flags(),
                               reason="this host has no AMX (amx_tile, amx_int8): tile kernels cannot run here")
AMX_MATTR = ["+avx512vnni", "+amx-tile", "+amx-int8"]


def _amx_spec():
    return _with_mattr(load_device("x86-avx512"), AMX_MATTR)


def test_amx_follows_the_target_and_the_operands():
    amx = _amx_spec()
    assert has_amx(amx) and not has_amx(load_device("x86-avx512"))
    assert not has_amx(_with_mattr(load_device("x86-avx512"), ["+avx512vnni", "+amx-tile"]))  # no int8 unit
    assert amx_layout(_matmul(128, 768, 768)[0], amx, "j") == AmxLayout("i", 1, 16, 64)
    assert amx_layout(_matmul(64, 256, 96, transposed=True)[0], amx, "j") == AmxLayout("i", 1, 16, 64)
    # smaller tiles where the axes have no 16 rows or 64 bytes: 20 rows in tiles of 10, K = 96 in steps of 48
    assert amx_layout(_matmul(20, 96, 64)[0], amx, "j") == AmxLayout("i", 1, 10, 48)
    assert amx_layout(_matmul(32, 128, 40)[0], amx, "j") is None    # columns no whole tiles of 16
    assert amx_layout(_matmul(1, 128, 64)[0], amx, "j") is None     # one row: VNNI's lanes (tiles of 4 rows at least)
    assert amx_layout(_matmul(32, 8, 64)[0], amx, "j") is None      # 8 deep: steps of 16 at least
    assert amx_layout(_matmul(32, 128, 64, a_dtype="int8")[0], amx, "j") is None  # s8 x s8: tdpbusd is u8 x s8
    # a convolution's rows run along the output's width, its window's other axes loop above the tile
    assert amx_layout(_conv(1, 14, 64, 64, 3, 1, 1)[0], amx, "ff") == AmxLayout("xx", 1, 14, 64)
    assert amx_layout(_conv(1, 15, 128, 32, 3, 2, 0)[0], amx, "ff") == AmxLayout("xx", 2, 7, 64)
    assert amx_layout(_conv(1, 14, 64, 64, 3, 1, 1)[0], load_device("x86-avx512"), "ff") is None


def test_plans_run_amx_tiles_at_the_matrix_units_peak():
    amx = _amx_spec()
    expr, _ = _matmul(128, 768, 768)
    first = construct(expr, amx, 3, frozenset({"B"})).programs[0]
    reg = first.tiles[0]
    assert first.amx and first.dot_depth == DOT_DEPTH and first.prepacked == ("B",)
    assert reg["i"] in (16, 32) and reg["j"] in (16, 32) and reg["k"] % AMX_DEPTH == 0
    assert RProgram.from_dict(first.to_dict()).key == first.key
    assert not construct(expr, amx, 1).programs[0].amx  # a weight that is no constant: no [K/4, N, 4] layout
    # the same tiles without AMX run VNNI's dot lanes; the model charges the matrix unit's int8 peak for AMX
    vnni = _with_mattr(load_device("x86-avx512"), ["+avx512vnni"])
    plain = plan_choices(expr, first.tiles, vnni, "j", (), (), frozenset({"B"}))
    assert not plain.amx and plain.dot_depth == DOT_DEPTH
    lanes_est = estimated(expr, plain, vnni)[1]
    ratio = amx.units.tensor_peak_gflops["int8"] * amx_efficiency(expr, amx, "j", reg) / amx.units.peak("int8")
    assert lanes_est.compute_seconds / first.compute_seconds == pytest.approx(ratio, rel=0.01)
    assert 0.3 < amx_efficiency(expr, amx, "j", reg) <= 1


def test_amx_efficiency_follows_the_tiles_and_their_steps():
    """Fuller tiles, more accumulator tiles and more steps per register tile each run nearer the peak
    (roller.plan.dot: partial tdpbusd and the accumulators' loads and stores, measured on Sapphire Rapids)."""
    amx = _amx_spec()
    expr, _ = _matmul(128, 1024, 64)
    eff = {(r, c, k): amx_efficiency(expr, amx, "j", {"i": r, "j": c, "k": k})
           for r in (16, 32) for c in (16, 32) for k in (64, 256, 1024)}
    assert eff[32, 32, 64] > eff[16, 16, 64] and eff[32, 32, 1024] > eff[32, 32, 256] > eff[32, 32, 64]
    assert eff[32, 32, 1024] == pytest.approx(1024 / 64 / (1024 / 64 + 1))
    short = _matmul(56, 1024, 64)[0]  # rows in tiles of 14: each tdpbusd makes 14 / 16 of a full one's products
    assert amx_layout(short, amx, "j").tile_rows == 14
    assert amx_efficiency(short, amx, "j", {"i": 28, "j": 32, "k": 1024}) < eff[32, 32, 1024]


def test_amx_tiles_are_decided_by_the_register_tile():
    amx = _amx_spec()
    expr, _ = _matmul(128, 768, 768)
    base = {"i": 32, "j": 32, "k": 128}
    assert is_amx_tile(expr, amx, "j", base)
    assert not is_amx_tile(expr, amx, "j", {**base, "i": 8})   # rows no whole tile
    assert not is_amx_tile(expr, amx, "j", {**base, "k": 96})  # no whole 64-deep steps
    assert not is_amx_tile(expr, amx, "j", {**base, "i": 64, "j": 64})  # 16 accumulator tiles: the file has 8


@needs_amx
@pytest.mark.parametrize("m,k,n,transposed,extreme", [
    (128, 768, 768, False, False),
    (32, 128, 64, False, True),      # the largest products: every 64-deep step at -64 * 255 * 128
    (64, 256, 96, True, False),      # a linear layer's [N, K] weight; 96 columns, tiles of 32 or 16
    (16, 64, 16, False, False),      # one tile of each
])
def test_amx_kernel_is_exact(device, m, k, n, transposed, extreme):
    assert has_amx(device)
    expr, norm = _matmul(m, k, n, transposed=transposed)
    program = construct(expr, device, 1, frozenset({"B"})).programs[0]
    assert program.amx
    a, b = _operands(m, k, n, np.random.default_rng(m + k + n), transposed, extreme)
    got, ex = _run(expr, norm, program, device, a, b)
    np.testing.assert_array_equal(got, a.astype(np.int64) @ (b.T if transposed else b).astype(np.int64))
    asm = ex.mod.inspect_source("asm")
    assert "tdpbusd" in asm and "ldtilecfg" in asm


@needs_amx
@pytest.mark.parametrize("n,size,c,o,k,stride,pad", [
    (1, 14, 64, 64, 3, 1, 1),     # a 3x3 convolution behind its zero padding: rows of 14
    (1, 15, 128, 32, 3, 2, 0),    # strided: rows 2 pixels apart, tiles of 7
    (2, 8, 96, 48, 1, 1, 0),      # 1x1, a batch of two; 96 channels in steps of 48
    (1, 7, 256, 64, 1, 1, 0),     # a 7x7 map: tiles of 7 rows
])
def test_amx_convolution_is_exact(device, n, size, c, o, k, stride, pad):
    expr, norm = _conv(n, size, c, o, k, stride, pad)
    assert amx_layout(expr, device, "ff") is not None
    programs = construct(expr, device, 10, frozenset({"B"})).programs
    program = next(p for p in programs if p.amx)
    _check_conv(expr, norm, program, device, (n, size, c, o, k, stride, pad), "tdpbusd")


@needs_amx
def test_amx_accumulators_carry_across_reduction_chunks(device):
    """A register tile over part of the reduction: its accumulator tiles are stored and loaded again for
    each further chunk, and the sum stays exact."""
    expr, norm = _matmul(64, 512, 64)
    tiles = [{"i": 32, "j": 32, "k": 64}, {"i": 32, "j": 64, "k": 128}, {"i": 64, "j": 64, "k": 256}]
    program = plan_choices(expr, tiles, device, "j", (), (), frozenset({"B"}))
    assert program.amx
    a, b = _operands(64, 512, 64, np.random.default_rng(5))
    np.testing.assert_array_equal(_run(expr, norm, program, device, a, b)[0], a.astype(np.int64) @ b)


@needs_amx
def test_without_amx_the_same_device_runs_vnni_lanes(device):
    vnni = _with_mattr(device, [f for f in device.target.get("mattr", ()) if "amx" not in f])
    expr, norm = _matmul(32, 128, 64)
    program = construct(expr, vnni, 1, frozenset({"B"})).programs[0]
    assert not program.amx and program.dot_depth == DOT_DEPTH
    a, b = _operands(32, 128, 64, np.random.default_rng(6))
    got, ex = _run(expr, norm, program, vnni, a, b)
    np.testing.assert_array_equal(got, a.astype(np.int64) @ b)
    assert "tdpbusd" not in ex.mod.inspect_source("asm")


def test_a_tile_the_registers_cannot_hold_is_an_error():
    from roller.targets.cpu.amx import register_amx

    with pytest.raises(BuildError, match="tile registers"):
        register_amx(64, 64, 64)  # 16 accumulator tiles
    with pytest.raises(BuildError, match="steps of up to 64"):
        register_amx(32, 32, 96)  # no whole steps of 64
    with pytest.raises(BuildError, match="tile registers"):
        register_amx(32, 32, 96, step=96)


def test_an_amx_plan_the_expression_cannot_take_is_an_error():
    """A plan that says AMX for tiles the code cannot tensorize (rows of 8) fails to build with a BuildError
    naming the tile, never a wrong kernel."""
    amx = _amx_spec()
    expr, norm = _matmul(32, 128, 64)
    program = plan_choices(expr, [{"i": 8, "j": 32, "k": 64}, {"i": 32, "j": 64, "k": 128},
                                  {"i": 32, "j": 64, "k": 128}], amx, "j", (), (), frozenset({"B"}))
    assert not program.amx
    from roller.targets import schedule

    with pytest.raises(BuildError, match="AMX"):
        schedule(norm, expr, dataclasses.replace(program, amx=True), amx)


def _tile_config_probes(device):
    """Two tiny kernels run on the calling thread: one loads a tile configuration (64 bytes), one stores the
    thread's current one."""
    import tvm
    from tvm.script import tirx as T

    from roller.tir.compile import compile_for, target_for

    @T.prim_func(s_tir=True)
    def load(cfg: T.Buffer((64,), "uint8")):
        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.ldtilecfg", T.address_of(cfg[0])))

    @T.prim_func(s_tir=True)
    def store(cfg: T.Buffer((64,), "uint8")):
        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.sttilecfg", T.address_of(cfg[0])))

    target = target_for(device)
    return compile_for(tvm.IRModule({"main": load}), target)["main"], \
        compile_for(tvm.IRModule({"main": store}), target)["main"]


@needs_amx
@pytest.mark.parametrize("configured", [True, False])
def test_the_calling_threads_tile_configuration_is_restored(device, configured):
    """Other libraries' AMX kernels (onnxruntime's) keep their tile configuration on the program's thread
    across calls; a roller kernel saves it and loads it back (or releases the tiles where there was none):
    onnxruntime stopped on an illegal instruction after a roller kernel had left its own."""
    import tvm

    load, store = _tile_config_probes(device)
    theirs = np.zeros(64, np.uint8)
    if configured:
        theirs[0] = 1                     # palette 1: tile 0 of 8 rows x 32 bytes, the rest unused
        theirs[16] = 32
        theirs[48] = 8
        load(tvm.runtime.tensor(theirs))  # a "library" configures the calling thread
    expr, norm = _matmul(32, 128, 64)
    program = construct(expr, device, 1, frozenset({"B"})).programs[0]
    assert program.amx
    a, b = _operands(32, 128, 64, np.random.default_rng(7))
    np.testing.assert_array_equal(_run(expr, norm, program, device, a, b)[0], a.astype(np.int64) @ b)
    after = tvm.runtime.tensor(np.full(64, 255, np.uint8))
    store(after)
    np.testing.assert_array_equal(after.numpy(), theirs)
    if configured:
        load(tvm.runtime.tensor(np.zeros(64, np.uint8)))  # release the tiles again


def test_the_hosts_matrix_peak_scales_with_its_clock_like_its_other_peaks():
    from roller.device.host import host_device

    host, spec = host_device(), load_device("x86-avx512")
    if "avx512f" not in cpu_flags():
        pytest.skip("the host is described from the AVX2 spec")
    ratio = host.units.peak_gflops["float32"] / spec.units.peak_gflops["float32"]
    assert host.units.tensor_peak_gflops["int8"] == pytest.approx(spec.units.tensor_peak_gflops["int8"] * ratio)
