"""The parallel grid balanced across the cores (roller.targets.cpu.balance: own shares, stolen from when a core
is done): every iteration runs exactly once, and codegen balances only compute-bound plans predicted
long enough."""
import dataclasses
import re

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from roller.plan.choices import estimate_tiles
from roller.tir import ops
from roller.tir.analysis import analyze
from roller.targets import schedule
from roller.errors import BuildError
from roller.targets.cpu.balance import balance_grid
from roller.plan.choices import balanced_grid
from roller.targets import construct
from roller.device.load import load_device
from roller.device.spec import family_model

MIN_SECONDS = family_model("cpu").balance_min_seconds
from roller.measure.verify import fill_sentinel
from roller.tir.compile import compile_for, target_for


@T.prim_func(s_tir=True)
def _scaled(A: T.Buffer((37, 8), "float32"), C: T.Buffer((37, 8), "float32")):
    T.func_attr({"tirx.noalias": True})
    for i in T.parallel(37):
        for j in range(8):
            with T.sblock("C"):
                vi, vj = T.axis.remap("SS", [i, j])
                C[vi, vj] = A[vi, vj] * T.float32(2.0) + T.Cast("float32", vi)


@T.prim_func(s_tir=True)
def _scaled64(A: T.Buffer((T.int64(37), T.int64(8)), "float32"), C: T.Buffer((T.int64(37), T.int64(8)), "float32")):
    T.func_attr({"tirx.noalias": True})
    for i in T.parallel(T.int64(37)):
        for j in range(T.int64(8)):
            with T.sblock("C"):
                vi, vj = T.axis.remap("SS", [i, j])
                C[vi, vj] = A[vi, vj] * T.float32(2.0) + T.Cast("float32", vi)


@T.prim_func(s_tir=True)
def _serial(A: T.Buffer((37, 8), "float32"), C: T.Buffer((37, 8), "float32")):
    T.func_attr({"tirx.noalias": True})
    for i, j in T.grid(37, 8):
        with T.sblock("C"):
            vi, vj = T.axis.remap("SS", [i, j])
            C[vi, vj] = A[vi, vj] * T.float32(2.0)


def _run(func, a):
    ex = compile_for(tvm.IRModule({"main": func}), target_for(load_device("x86-avx512", calibrated=False)))
    out = tvm.runtime.tensor(fill_sentinel(np.empty_like(a)))
    ex["main"](tvm.runtime.tensor(a), out)
    return ex, out


@pytest.mark.parametrize("units, func", [(2, _scaled), (3, _scaled), (5, _scaled), (2, _scaled64)])
def test_every_grid_iteration_runs_once_from_the_shares(units, func):
    # _scaled64: loop variables of int64, as in the functions Relax makes. With more tasks than the pool's
    # threads, the first tasks run before the others start and steal from their untouched shares
    balanced = balance_grid(func, units)
    text = balanced.script()
    assert "pthread_spin_lock" in text
    assert re.findall(r"T\.parallel\((?:T\.int64\()?(\d+)", text) == [str(units)]  # one task a core
    a = np.random.default_rng(0).standard_normal((37, 8)).astype("float32")
    want = a * 2 + np.arange(37, dtype="float32")[:, None]
    ex, out = _run(balanced, a)
    for _ in range(50):  # many calls: a lost or doubled chunk shows as a wrong or unwritten row
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
        out.copyfrom(fill_sentinel(np.empty_like(a)))
        ex["main"](tvm.runtime.tensor(a), out)


def test_nothing_to_balance_comes_back_unchanged():
    assert balance_grid(_serial, 2).same_as(_serial)
    assert balance_grid(_scaled, 1).same_as(_scaled)  # one core: nothing to balance
    assert balance_grid(_scaled, 40).same_as(_scaled)  # fewer iterations than cores


@T.prim_func(s_tir=True)
def _tail_split(A: T.Buffer((37, 8), "float32"), C: T.Buffer((37, 8), "float32")):
    T.func_attr({"tirx.noalias": True})
    for i in T.parallel(37, annotations={"pragma_loop_partition_hint": 1}):
        for j in range(8):
            with T.sblock("C"):
                vi, vj = T.axis.remap("SS", [i, j])
                C[vi, vj] = A[vi, vj] * T.float32(2.0)


def test_a_grid_loop_whose_tail_lowering_splits_off_is_not_balanced():
    """A predicated axis's grid loop carries a partition hint: lowering splits its last tile off, which
    the stealing loop would prevent (the bound would stay in every tile, a predicated vector loop running
    scalar); it keeps the fixed split."""
    assert balance_grid(_tail_split, 2).same_as(_tail_split)
    device = load_device("x86-avx512", calibrated=False)
    spec = ops.OPS["conv2d"]
    shape = spec.full_shape({"N": 1, "H": 6, "W": 6, "C": 8, "K": 42, "R": 1, "S": 1})
    an = analyze(spec.make(shape))
    first = construct(an.expr, device, topk=1).programs[0]
    reg = {**first.tiles[0], "h": 1, "w": 6, "k": 16, "c": 1}
    whole = {**first.tiles[0], "h": 6, "w": 6, "k": 16, "c": 8}  # three tiles of output channels, one partial
    plan = dataclasses.replace(first, tiles=(reg, whole, whole), predicated=("k",), padded=(),
                               predicted_seconds=MIN_SECONDS * 10)
    # compute-bound and long enough, but its grid loop carries the hint: the plan does not balance
    assert not balanced_grid(an.expr, plan, device, plan.predicted_seconds) and not plan.balanced
    with pytest.raises(BuildError, match="balances its parallel grid"):  # a plan that says so cannot be followed
        schedule(an.func, an.expr, dataclasses.replace(plan, balanced=True), device)
    func = schedule(an.func, an.expr, plan, device).mod["main"]
    assert "pthread_spin_lock" not in func.script()
    ins = spec.inputs(shape)
    ref = spec.reference(ins, shape)
    ex = compile_for(tvm.IRModule({"main": func}), target_for(device))
    out = tvm.runtime.tensor(fill_sentinel(np.empty(ref.shape, ref.dtype)))
    ex["main"](*[tvm.runtime.tensor(x) for x in ins], out)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_memory_bound_operators_keep_the_fixed_split():
    # each core's part of the tensors stays in its own L2 between calls only under the fixed split
    device = load_device("x86-avx512", calibrated=False)
    spec = ops.OPS["add_relu"]
    shape = spec.full_shape({"M": 100, "N": 3001})
    an = analyze(spec.make(shape))
    plan = dataclasses.replace(construct(an.expr, device, topk=1).programs[0], predicted_seconds=MIN_SECONDS * 10)
    assert not balanced_grid(an.expr, plan, device, plan.predicted_seconds) and not plan.balanced
    assert "pthread_spin_lock" not in schedule(an.func, an.expr, plan, device).mod["main"].script()


def test_codegen_balances_only_plans_predicted_long_enough():
    device = load_device("x86-avx512", calibrated=False)
    spec = ops.OPS["matmul"]
    shape = spec.full_shape({"M": 96, "N": 160, "K": 64})
    an = analyze(spec.make(shape))
    plan = construct(an.expr, device, topk=1).programs[0]
    ins = spec.inputs(shape)
    ref = spec.reference(ins, shape)
    for seconds, balanced in ((MIN_SECONDS * 2, True), (MIN_SECONDS / 2, False)):
        assert balanced_grid(an.expr, plan, device, seconds) == balanced  # a matmul: compute-bound
        prog = dataclasses.replace(plan, balanced=balanced)  # codegen follows the plan's field
        func = schedule(an.func, an.expr, prog, device).mod["main"]
        assert ("pthread_spin_lock" in func.script()) == balanced
        ex = compile_for(tvm.IRModule({"main": func}), target_for(device))
        out = tvm.runtime.tensor(fill_sentinel(np.empty(ref.shape, ref.dtype)))
        ex["main"](*[tvm.runtime.tensor(x) for x in ins], out)
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_model_charges_the_wait_for_the_slowest_core():
    """units.speed_spread: a fixed split waits for the slow core's whole share, a balanced grid for about
    one tile; so among compute-bound plans of equal work the one with more top tiles a core ranks first.
    Memory-bound plans are not charged."""
    from roller.plan import cost as model

    device = load_device("x86-avx512", calibrated=False)
    spread = device.units.speed_spread
    assert spread > 0
    even = dataclasses.replace(device, units=dataclasses.replace(device.units, speed_spread=0.0))

    def extra(expr, tiles, axis):
        """(seconds the spread adds, seconds a top tile takes, waves, balanced) of a plan."""
        flat, slow = estimate_tiles(expr, tiles, even, axis), estimate_tiles(expr, tiles, device, axis)
        per_tile = (flat.seconds - model.launch_seconds(even, flat.units)) / flat.waves
        return slow.seconds - flat.seconds, per_tile, flat.waves, model.balances(expr, flat.seconds, device)

    mm = analyze(ops.OPS["matmul"].make({"M": 256, "N": 256, "K": 256})).expr
    one = [{"m": 4, "n": 32, "k": 1}, {"m": 32, "n": 128, "k": 256}, {"m": 128, "n": 256, "k": 256}]
    eight = [{"m": 4, "n": 32, "k": 1}, {"m": 32, "n": 128, "k": 256}, {"m": 32, "n": 128, "k": 256}]  # 16 tiles
    for tiles, waves in ((one, 1), (eight, 8)):
        added, per_tile, got, balanced = extra(mm, tiles, "n")
        assert got == waves and balanced and added == pytest.approx(spread * per_tile, rel=1e-6)  # balanced: one tile
    assert estimate_tiles(mm, eight, device, "n").seconds < estimate_tiles(mm, one, device, "n").seconds

    short = [{"m": 4, "n": 32, "k": 1}, {"m": 8, "n": 32, "k": 64}, {"m": 8, "n": 32, "k": 64}]
    small = analyze(ops.OPS["matmul"].make({"M": 16, "N": 64, "K": 64})).expr  # compute-bound, under 50 us
    added, per_tile, waves, balanced = extra(small, short, "n")
    assert waves > 1 and not balanced and added == pytest.approx(spread * per_tile * waves, rel=1e-6)  # fixed split: the share

    add = analyze(ops.OPS["add_relu"].make({"M": 512, "N": 4096})).expr  # memory-bound: not charged
    assert extra(add, [{"m": 1, "n": 16}, {"m": 8, "n": 1024}, {"m": 32, "n": 4096}], "n")[0] == 0.0
