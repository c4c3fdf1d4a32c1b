"""The plan's code-generation fields (RProgram.balanced, prefetched, register_transposes, held_grid): construction
decides them (roller.plan.choices), the model charges what they say, code generation executes them, and raises
with the reason where it cannot. Kernels built are checked against numpy."""
import dataclasses

import pytest

from roller.builder.api import analyze
from roller.device.load import load_device
from roller.errors import BuildError
from roller.plan.choices import estimated, plan_choices
from roller.plan.cost import estimate
from roller.plan.rprogram import RProgram
from roller.targets import construct, schedule
from roller.tir import ops

from kernel_check import check_plan  # tests/ is on sys.path under pytest

DEV = load_device("x86-avx512", calibrated=False)


def _case(op, shape, **options):
    spec = ops.OPS[op].with_options(**options) if options else ops.OPS[op]
    full = spec.full_shape(shape)
    expr, func = analyze(spec.make(full))
    return spec, full, expr, func


def _check(spec, full, expr, func, program):
    check_plan(spec, full, expr, func, program, DEV)


def test_fields_are_part_of_the_key_and_round_trip():
    _, _, expr, _ = _case("matmul", dict(M=64, N=256, K=512), layout="nt")
    p = construct(expr, DEV, topk=1).programs[0]
    for change in (dict(balanced=not p.balanced), dict(prefetched=("B",)), dict(register_transposes=()),
                   dict(held_grid="m")):
        q = dataclasses.replace(p, **change)
        assert q.key != p.key
        assert RProgram.from_dict(q.to_dict()) == q


def test_the_model_reads_balanced_and_register_transposes():
    """The model charges what the plan says: a balanced grid waits about one top tile for the slowest unit,
    a fixed split its whole share (waves tiles); a pack in registers costs register_transpose_cycles."""
    _, _, expr, _ = _case("matmul", dict(M=512, N=512, K=512), layout="nt")
    plan, est = estimated(expr, plan_choices(expr, [{"m": 4, "n": 32, "k": 1}, {"m": 32, "n": 128, "k": 512},
                                                    {"m": 32, "n": 128, "k": 512}], DEV, "n"), DEV)
    assert est.waves > 1
    fixed = estimate(expr, dataclasses.replace(plan, balanced=False), DEV)
    balanced = estimate(expr, dataclasses.replace(plan, balanced=True), DEV)
    spread = DEV.units.speed_spread
    assert fixed.seconds - balanced.seconds == pytest.approx(spread * fixed.tile_seconds * (fixed.waves - 1), rel=1e-9)
    assert plan.register_transposes == ("B",)
    scattered = estimate(expr, dataclasses.replace(plan, register_transposes=()), DEV)
    assert (scattered.seconds > estimate(expr, plan, DEV).seconds) == (
        DEV.model.transpose_cycles > DEV.model.register_transpose_cycles)


@pytest.mark.build
def test_register_transposes_that_cannot_be_followed_raise():
    """An overhanging tile's transposed copy is predicated: the plan keeps it scattered, and a plan that says
    registers is refused with the reason."""
    spec, full, expr, func = _case("matmul", dict(M=8, N=40, K=48), layout="nt")
    program = construct(expr, DEV, topk=1).programs[0]
    assert program.layouts == {"B": (1, 0)} and program.register_transposes == ()
    with pytest.raises(BuildError, match="registers"):
        schedule(func, expr, dataclasses.replace(program, register_transposes=("B",)), DEV)
    _check(spec, full, expr, func, program)


@pytest.mark.build
def test_prefetch_the_plan_cannot_carry_raises():
    """A plan that prefetches an input it does not prepack, or whose top tile has no loop to carry the
    prefetch, is refused with the reason."""
    spec, full, expr, func = _case("matmul", dict(M=64, N=256, K=512), layout="nt")
    program = construct(expr, DEV, topk=1).programs[0]
    assert program.prefetched == ()
    with pytest.raises(BuildError, match="does not prepack"):
        schedule(func, expr, dataclasses.replace(program, prefetched=("B",)), DEV)


@pytest.mark.build
def test_held_grid_loop_is_a_serial_loop_of_its_own():
    """A predicated vector axis's grid loop is held out of the fused parallel grid loop where the plan says so
    (fused where it does not: the bound then stays on the vector loop, which TVM cannot vectorize: that plan
    does not build). A plan holding an axis without a grid loop raises."""
    spec, full, expr, func = _case("conv2d", dict(N=1, H=14, W=14, C=32, K=42, R=1, S=1))
    tiles = [{"n": 1, "h": 1, "w": 7, "k": 16, "c": 1, "r": 1, "s": 1},
             {"n": 1, "h": 2, "w": 14, "k": 16, "c": 32, "r": 1, "s": 1},
             {"n": 1, "h": 2, "w": 14, "k": 16, "c": 32, "r": 1, "s": 1}]
    plan, _ = estimated(expr, plan_choices(expr, tiles, DEV, "k", padded=()), DEV)
    assert "k" in plan.predicated and plan.held_grid == "k"
    text = schedule(func, expr, plan, DEV).mod.script()
    assert "T.parallel(7" in text  # the h grid alone over the cores, k's 3 top tiles a loop below it
    _check(spec, full, expr, func, plan)
    fused = dataclasses.replace(plan, held_grid=None)
    assert "T.parallel(21" in schedule(func, expr, fused, DEV).mod.script()
    with pytest.raises(BuildError, match="holds the grid loop"):
        schedule(func, expr, dataclasses.replace(plan, held_grid="h"), DEV)


def test_the_model_reads_partial_sums_held_grid_and_prefetched():
    """partial_sums: the compute rate (a reduced vector axis without them runs scalar) and the fold; held_grid:
    the vector tail split off (scalar lanes without the held loop) and the waves of the held loop at
    model.held_grid_wave_share; prefetched: nothing (it hides latency, the model charges bandwidth)."""
    _, _, rows, _ = _case("reduce_sum", dict(M=64, N=4096))
    plan, _ = estimated(rows, plan_choices(rows, [{"m": 4, "n": 64}, {"m": 4, "n": 4096}, {"m": 8, "n": 4096}],
                                           DEV, "n"), DEV)
    assert plan.partial_sums
    scalar = estimate(rows, dataclasses.replace(plan, partial_sums=False), DEV)
    assert scalar.compute_seconds > estimate(rows, plan, DEV).compute_seconds
    _, _, conv, _ = _case("conv2d", dict(N=1, H=14, W=14, C=32, K=42, R=1, S=1))
    tiles = [{"n": 1, "h": 1, "w": 7, "k": 16, "c": 1, "r": 1, "s": 1},
             {"n": 1, "h": 2, "w": 14, "k": 16, "c": 32, "r": 1, "s": 1},
             {"n": 1, "h": 2, "w": 14, "k": 32, "c": 32, "r": 1, "s": 1}]  # k: a tile loop below its grid
    held, _ = estimated(conv, plan_choices(conv, tiles, DEV, "k", padded=()), DEV)
    assert held.held_grid == "k"
    fused = estimate(conv, dataclasses.replace(held, held_grid=None), DEV)
    assert fused.compute_seconds > estimate(conv, held, DEV).compute_seconds  # the 10-lane tail runs scalar
    whole = dataclasses.replace(DEV, model=dataclasses.replace(DEV.model, held_grid_wave_share=1.0))
    est = estimate(conv, held, whole)  # 7 x 2 top tiles: 7 parallel iterations of 2 on 2 units, 8 waves not 7
    assert est.waves == 7 and est.base_seconds == pytest.approx(
        estimate(conv, held, DEV).base_seconds + est.tile_seconds, rel=1e-9)
    assert estimate(conv, held, DEV).seconds == estimate(conv, dataclasses.replace(held, prefetched=("W",)), DEV).seconds


@pytest.mark.build
def test_partial_sums_code_generation_cannot_keep_raise():
    """partial_sums is executed or refused: on a spatial vector axis, on a register tile of one element along
    the reduced one, and where TVM's rfactor refuses the loop (here a spatial loop handed to it)."""
    import tvm

    from roller.targets.cpu.schedule import _rfactor
    spec, full, expr, func = _case("matmul", dict(M=64, N=256, K=512), layout="nt")
    program = construct(expr, DEV, topk=1).programs[0]
    assert not program.partial_sums and expr.axis(program.vector_axis).kind != "reduce"
    with pytest.raises(BuildError, match="partial sums, but its vector axis .* is not reduced"):
        schedule(func, expr, dataclasses.replace(program, partial_sums=True), DEV)
    _, _, pool, pfunc = _case("pool2d", dict(N=1, H=8, W=8, C=16, R=3, S=3), kind="max")
    one = plan_choices(pool, [{a.name: 1 for a in pool.axes}] * 3, DEV, "s", padded=())
    with pytest.raises(BuildError, match="no lane loop to rfactor"):
        schedule(pfunc, pool, dataclasses.replace(one, partial_sums=True), DEV)
    sch = tvm.s_tir.Schedule(func)
    spatial = sch.get_loops(sch.get_sblock(expr.block))[0]
    with pytest.raises(BuildError, match="keeps vector partial sums, but rfactor does not apply to its reduction"):
        _rfactor(sch, spatial, 2, expr.name)


@pytest.mark.build
def test_epilogue_and_crop_are_placed_as_the_plan_says_without_notes():
    """The epilogue of an unpadded plan is inlined into the write-back and a padded plan's crop (with the
    epilogue inlined into it) runs per top tile: decided by the plan, no notes; both match numpy."""
    spec, full, expr, func = _case("pool2d", dict(N=1, H=8, W=8, C=42, R=3, S=3), kind="avg")
    assert expr.epilogue  # the division by R * S
    for padded in ((), ("c",)):
        tiles = [{"n": 1, "h": 1, "w": 2, "c": 16, "r": 1, "s": 1},
                 {"n": 1, "h": 1, "w": 6, "c": 16, "r": 3, "s": 3},
                 {"n": 1, "h": 2, "w": 6, "c": 32, "r": 3, "s": 3}]
        plan, _ = estimated(expr, plan_choices(expr, tiles, DEV, "c", padded=padded), DEV)
        notes = []
        schedule(func, expr, plan, DEV, notes)
        assert notes == [] and plan.padded == padded
        _check(spec, full, expr, func, plan)
