"""Padding overhanging tiles (roller.codegen.padding): every kernel is checked against numpy; padded
kernels must have no predicate left in the main computation."""
from __future__ import annotations

import numpy as np
import pytest

from roller import ops
from roller.api import analyze as api_analyze
from roller.codegen import build, schedule
from roller.codegen.cpu import schedule_cpu
from roller.codegen.padding import pad_to_tiles, padded_extents
from roller.construct import construct
from roller.device import load_device
from roller.rprogram import RProgram

LEVELS = ("reg", "L1", "L2")


@pytest.fixture(scope="module")
def device():
    return load_device("x86-avx512", calibrated=False)


def program(expr, reg, l1, l2, packed=(), pad=None):
    """An RProgram whose tiles are given as tuples in the Expr's axis order."""
    names = [a.name for a in expr.axes]
    tiles = tuple(dict(zip(names, t)) for t in (reg, l1, l2))
    return RProgram(levels=LEVELS, tiles=tiles, grid={}, units=2, waves=1, vector_axis=expr.vector_axis,
                    packed=tuple(packed), storage_pad=dict(pad or {}))


def run(func, expr, prog, device, ins, ref, tol=1e-4):
    """Builds the plan through roller.codegen.build and compares its output with ``ref``."""
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
    # i: 1000 -> 14 tiles of 72; j: the tiles clamp to the extent (5); k: 3 -> 2 tiles of 2
    assert padded_extents(expr, prog) == {"i": 1008, "j": 5, "k": 4}


@pytest.mark.build
@pytest.mark.parametrize("op,shape", [
    ("matmul", dict(M=1000, N=1000, K=1000)),
    ("matmul", dict(M=1025, N=1021, K=1019)),
    ("matmul", dict(M=127, N=131, K=137)),
    ("matmul", dict(M=13, N=1000, K=97)),
    ("batch_matmul", dict(B=2, M=127, N=131, K=137)),
    ("batch_matmul", dict(B=3, M=67, N=1000, K=61)),
])
def test_constructed_overhanging_plans_are_padded_and_right(device, op, shape):
    func, expr, ins, ref = op_case(op, shape)
    plans = construct(expr, device, topk=2).programs
    padded = [p for p in plans if pad_to_tiles(func, expr, p) is not None]
    assert padded, f"{op} {shape}: no constructed plan overhangs, the case tests nothing"
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
    padded = pad_to_tiles(func, expr, prog)
    assert padded is not None and padded.program.packed == ("B_pad",)
    assert padded.program.storage_pad == {"B_pad": 16}
    run(func, expr, prog, device, ins, ref)


@pytest.mark.build
def test_padded_main_block_has_no_predicate(device):
    func, expr, ins, ref = op_case("matmul", dict(M=1000, N=1000, K=1000))
    prog = program(expr, (8, 48, 1), (72, 48, 16), (72, 336, 336))
    padded = pad_to_tiles(func, expr, prog)
    assert padded is not None
    assert padded.extents == {"m": 1008, "n": 1008, "k": 1008}
    assert {t.name for t in padded.expr.inputs} == {"A_pad", "B_pad"}
    assert padded.expr.output.shape == (1008, 1008)
    # the same plan unpadded predicates its innermost loops: the check below can fail
    assert main_block_predicated(schedule_cpu(func, expr, prog, device), expr.block)
    assert not main_block_predicated(schedule(func, expr, prog, device), expr.block)
    run(func, expr, prog, device, ins, ref)


@pytest.mark.build
@pytest.mark.parametrize("shape,tiles", [
    # axes n, h, w, k | r, s, c: k (and c) overhang; pad_einsum rejects h + r, so predicates stay
    (dict(N=1, H=7, W=7, C=5, K=19, R=3, S=3, pad=1),
     ((1, 1, 2, 16, 1, 1, 1), (1, 2, 4, 16, 3, 1, 4), (1, 4, 4, 16, 3, 3, 4))),
    (dict(N=2, H=17, W=17, C=127, K=131, R=3, S=3, pad=0), None),
])
def test_conv2d_falls_back_to_predicates(device, shape, tiles):
    func, expr, ins, ref = op_case("conv2d", shape)
    plans = [program(expr, *tiles)] if tiles else construct(expr, device, topk=1).programs
    for p in plans:
        assert padded_extents(expr, p) != expr.extents  # the plan overhangs
        assert pad_to_tiles(func, expr, p) is None
        run(func, expr, p, device, ins, ref, tol=1e-3)


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
    assert pad_to_tiles(func, expr, prog) is not None
    rng = np.random.default_rng(1)
    ins = [rng.uniform(-1, 1, s).astype("float32") for s in ((M, K), (K, N), (N,))]
    ref = np.maximum(ins[0].astype("float64") @ ins[1] + ins[2], 0)
    run(func, expr, prog, device, ins, ref)


@pytest.mark.build
def test_max_reduction_does_not_pad_its_reduce_axis(device):
    """Zero padding of k would add max(.., 0) terms: the plan keeps its predicates."""
    from tvm import te

    M, N, K = 20, 33, 7
    A = te.placeholder((M, K), "float32", name="A")
    B = te.placeholder((K, N), "float32", name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda m, n: te.max(A[m, k] * B[k, n], axis=k), name="C")
    expr, func = api_analyze(te.create_prim_func([A, B, C]))
    prog = program(expr, (4, 16, 1), (8, 16, 4), (8, 32, 4))
    assert pad_to_tiles(func, expr, prog) is None
    rng = np.random.default_rng(2)
    ins = [rng.uniform(-1, -0.5, (M, K)).astype("float32"), rng.uniform(0.5, 1, (K, N)).astype("float32")]
    ref = (ins[0][:, :, None].astype("float64") * ins[1][None]).max(axis=1)  # all negative: a 0 would win
    run(func, expr, prog, device, ins, ref)


def test_streaming_and_fused_plans_are_not_padded(device):
    """A row sum reads each input element once (padding would copy it all); add_relu's axes are fused."""
    func, expr, _, _ = op_case("reduce_sum", dict(M=127, N=1021))
    prog = program(expr, (1, 16), (16, 256), (16, 1024))
    assert padded_extents(expr, prog) == {"m": 128, "n": 1024}
    assert pad_to_tiles(func, expr, prog) is None
    func, expr, _, _ = op_case("add_relu", dict(M=7, N=129))
    assert len(expr.axes) == 1 and len(expr.axes[0].parts) == 2
    (axis,) = expr.axes
    prog = RProgram(levels=LEVELS, tiles=({axis.name: 16}, {axis.name: 64}, {axis.name: 256}), grid={},
                    units=2, waves=1)
    assert pad_to_tiles(func, expr, prog) is None
