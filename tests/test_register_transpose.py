"""Transposed packs in registers (roller.targets.cpu.transpose): the butterfly transposes, whole blocks of a
linear layer's [N, K] weight are shuffled, an overhanging tile's copy stays scattered, and the model
counts the two apart. Every kernel is checked against numpy."""
import dataclasses

import numpy as np
import pytest

from roller.plan.choices import estimate_tiles
from roller.tir import ops
from roller.builder.api import analyze
from roller.targets import schedule
from roller.targets.cpu import transpose
from roller.targets import construct
from roller.device.load import load_device
from roller.plan.rtile import layout_expr
from roller.plan.tails import transposed_elements

from kernel_check import check_plan  # tests/ is on sys.path under pytest

DEV = load_device("x86-avx512")


@pytest.mark.parametrize("lanes", [2, 4, 8, 16])
def test_butterfly_transposes_a_square_block(lanes):
    rows = [[(r, c) for c in range(lanes)] for r in range(lanes)]

    def shuffle(a, b, idx):
        both = a + b
        return [both[i] for i in idx]

    cols = transpose.butterfly(rows, lanes, shuffle)
    assert cols == [[(r, c) for r in range(lanes)] for c in range(lanes)]


def _nt_matmul(shape):
    spec = ops.OPS["matmul"].with_options(layout="nt")
    full = spec.full_shape(shape)
    expr, func = analyze(spec.make(full))
    arrays = spec.inputs(full, "float32", np.random.default_rng(3))
    return spec, full, expr, func, arrays


def _check(spec, full, expr, func, program, arrays):
    check_plan(spec, full, expr, func, program, DEV, arrays)


def test_whole_blocks_of_a_transposed_pack_are_shuffled():
    spec, full, expr, func, arrays = _nt_matmul(dict(M=64, N=256, K=512))
    program = construct(expr, DEV, topk=1).programs[0]
    assert program.layouts == {"B": (1, 0)}  # B [N, K] packed as [K, N] to vectorize n
    assert program.register_transposes == ("B",)  # the plan's field (tails.register_transposes)
    scattered, shuffled = transposed_elements(layout_expr(expr, "n"), program.tiles[-1], program.register_transposes)
    assert scattered == 0 and shuffled > 0
    script = schedule(func, expr, program, DEV).mod.script()
    assert script.count("Shuffle") == 16 * 4  # 16 rows, 4 stages of one block
    assert transpose.ANNOTATION not in script
    _check(spec, full, expr, func, program, arrays)


def test_an_overhanging_pack_stays_scattered_and_right():
    spec, full, expr, func, arrays = _nt_matmul(dict(M=8, N=40, K=48))
    program = construct(expr, DEV, topk=1).programs[0]
    assert program.layouts == {"B": (1, 0)}
    assert program.register_transposes == ()
    scattered, shuffled = transposed_elements(layout_expr(expr, "n"), program.tiles[-1], program.register_transposes)
    assert scattered > 0 and shuffled == 0
    script = schedule(func, expr, program, DEV).mod.script()
    assert "Shuffle" not in script and transpose.ANNOTATION not in script
    _check(spec, full, expr, func, program, arrays)


def test_a_plan_without_register_transposes_leaves_the_scattered_copy():
    spec, full, expr, func, arrays = _nt_matmul(dict(M=64, N=256, K=512))
    program = dataclasses.replace(construct(expr, DEV, topk=1).programs[0], register_transposes=())
    assert "Shuffle" not in schedule(func, expr, program, DEV).mod.script()
    _check(spec, full, expr, func, program, arrays)


def test_model_charges_register_transposes_at_their_own_rate(monkeypatch):
    from roller.plan import cost as model

    spec, full, expr, func, arrays = _nt_matmul(dict(M=64, N=256, K=512))
    tiles = [{"m": 4, "n": 32, "k": 1}, {"m": 16, "n": 32, "k": 64}, {"m": 32, "n": 128, "k": 512}]
    laid = layout_expr(expr, "n")
    monkeypatch.setattr(model, "imbalance_seconds", lambda *a: 0.0)  # a share of the tile's time: not this term
    with_copy = estimate_tiles(laid, tiles, DEV, "n")
    cycles = DEV.model.register_transpose_cycles
    free = dataclasses.replace(DEV, model=dataclasses.replace(DEV.model, register_transpose_cycles=0.0,
                                                              transpose_cycles=0.0))
    without = estimate_tiles(laid, tiles, free, "n")
    per_tile = 128 * 512 * cycles * model.cycle_seconds(DEV)  # the top tile's [K, N] block of B, whole 16 x 16s
    assert with_copy.seconds - without.seconds == pytest.approx(with_copy.waves * per_tile, rel=1e-6)
