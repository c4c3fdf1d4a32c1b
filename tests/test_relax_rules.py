"""The rule chain that schedules a model's fused functions (roller.models.relax_pass.ScheduleModule,
roller.models.rules): roller first for every function its analysis accepts, functions scheduled once,
the generic fallback, verify, rules that keep no state, the reasons a rule declined in the report, and
the row-wise rule for functions with several reductions (roller.plan.rows, roller.targets.cpu.rows)."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import helper  # noqa: E402

import roller  # noqa: E402
from roller.models import frontend
from roller.tir.compile import target_for  # noqa: E402
from roller.models.relax_pass import ScheduleModule, is_scheduled  # noqa: E402
from roller.models.rules import Declined, GenericRule, RollerRule, RowWiseRule, Scheduled  # noqa: E402
from roller.plan.rows import lane_tree  # noqa: E402

import onnx_models  # noqa: E402  (tests/ is on sys.path under pytest)
from relax_helpers import _graph  # noqa: E402

pytestmark = pytest.mark.build


# ---------------------------------------------------------------------------------------------
# The rule chain and its report

def test_roller_schedules_every_function_it_accepts(device):
    """The rule chain never hands a function roller's analysis accepts to a fallback, and every function
    comes out marked scheduled."""
    from roller.errors import RollerError

    model = onnx_models.small_cnn(size=16)
    specs = frontend.onnx_inputs(model)
    mod = frontend.legalize_and_fuse(frontend.import_onnx(model, specs), target_for(device))
    sched = ScheduleModule(device)
    out = sched(mod)
    by = {r.name: r for r in sched.report}
    import tvm
    prims = {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert set(by) == set(prims)
    for name, func in prims.items():
        try:
            roller.analyze(func)
            accepted = True
        except RollerError:
            accepted = False
        assert (by[name].scheduled_by == "roller") == accepted, (name, by[name])
        assert is_scheduled(out[name]), name
        assert not is_scheduled(mod[name]), "the pass must not change its input module"


def test_identical_functions_are_scheduled_once(device):
    import tvm

    model = _graph([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": (8, 32)}, (8, 16),
                   [("w", np.ones((32, 16)))])
    mod = frontend.legalize_and_fuse(frontend.import_onnx(model, frontend.onnx_inputs(model)),
                                     target_for(device))
    name = next(gv.name_hint for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc))
    mod[tvm.ir.GlobalVar("zz_copy")] = mod[name]
    # (with prepacking a function is the same only with the same constant parameters: the copy has no call)
    sched = ScheduleModule(device, prepack=False)
    out = sched(mod)
    rep = {r.name: r for r in sched.report}
    assert rep[name].scheduled_by == "roller" and rep[name].reused is None
    assert rep["zz_copy"].reused == name and rep["zz_copy"].scheduled_by == "roller"
    import tvm_ffi
    assert tvm_ffi.structural_equal(out[name], out["zz_copy"])
    profiled = ScheduleModule(device, profile=True, topk=2, prepack=False)
    out = profiled(mod)
    rep = {r.name: r for r in profiled.report}
    assert rep[name].profiled and rep["zz_copy"].profiled == f"as {name}", rep
    assert tvm_ffi.structural_equal(out[name], out["zz_copy"])


# ---------------------------------------------------------------------------------------------
# The generic fallback

def test_generic_rule_parallel_and_vectorized(device):
    """A symbolic-shape function roller declines still gets parallel outer loops and a vector loop."""
    import tvm
    from tvm import te

    n = te.var("n", "int64")
    a = te.placeholder((64, n), name="a")
    b = te.compute((n, 64), lambda i, j: a[j, i] * 2.0, name="b")  # a transpose: injective, gathers
    func = te.create_prim_func([a, b])
    out = GenericRule().apply(func, device)
    assert isinstance(out, Scheduled), out
    sch = out.schedule
    text = sch.mod["main"].script()
    assert "T.parallel" in text and "T.vectorized" in text, text
    ex = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}), "llvm")
    x = np.random.default_rng(0).normal(size=(64, 5)).astype(np.float32)
    y = tvm.runtime.empty((5, 64), "float32", tvm.cpu())
    ex["main"](tvm.runtime.tensor(x, tvm.cpu()), y)
    np.testing.assert_allclose(y.numpy(), x.T * 2)


def test_verify_declines_a_wrong_schedule(device):
    """With verify, a rule whose schedule computes something else is declined and the next rule runs."""
    import tvm
    from tvm import te

    from roller.models.rules import Rule

    a = te.placeholder((16, 64), name="a")
    right = te.create_prim_func([a, te.compute((16, 64), lambda i, j: a[i, j] + 1.0, name="b")])
    wrong = te.create_prim_func([a, te.compute((16, 64), lambda i, j: a[i, j] + 2.0, name="b")])

    class Wrong(Rule):
        name = "wrong"

        def apply(self, func, dev, constants=frozenset()):
            return Scheduled(tvm.s_tir.Schedule(wrong))

    mod = tvm.IRModule({"f": right})
    sched = ScheduleModule(device, rules=[Wrong(), GenericRule()], verify=True)
    out = sched(mod)
    (rep,) = sched.report
    assert rep.scheduled_by == "generic" and "wrong result" in rep.declined["wrong"], rep
    assert is_scheduled(out["f"])
    ex = tvm.compile(tvm.IRModule({"main": out["f"].with_attr("global_symbol", "main")}), "llvm")
    x = np.random.default_rng(0).normal(size=(16, 64)).astype(np.float32)
    y = tvm.runtime.empty((16, 64), "float32", tvm.cpu())
    ex["main"](tvm.runtime.tensor(x, tvm.cpu()), y)
    np.testing.assert_allclose(y.numpy(), x + 1, rtol=1e-6)
    unchecked = ScheduleModule(device, rules=[Wrong(), GenericRule()])
    unchecked(mod)
    assert unchecked.report[0].scheduled_by == "wrong"  # what verify is for


def test_verify_passes_roller_schedules(device):
    model = onnx_models.small_cnn(size=16)
    cm = roller.compile_model(model, device, verify=True)
    assert all(r.scheduled_by == "roller" for r in cm.report), [(r.name, r.declined) for r in cm.report]
    assert frontend.check_against_onnxruntime(cm, model, time_it=False)["matches"]


def test_roller_rule_declines_with_reason(device):
    from tvm import te

    n = te.var("n", "int64")
    a = te.placeholder((n, 64), name="a")
    b = te.compute((n, 64), lambda i, j: a[i, j] + 1.0, name="b")
    out = RollerRule().apply(te.create_prim_func([a, b]), device)
    assert isinstance(out, Declined) and "symbolic" in out.reason, out


def test_rules_keep_no_state_and_the_pass_reports_why_a_rule_declined(device):
    """A rule returns its result (Scheduled / Declined) and writes nothing on itself, so one instance can
    serve several functions (and threads); the driver, a tvm.transform module pass, puts a declining
    rule's reason in the function's report."""
    import copy

    import tvm
    from tvm import te

    from roller.models.rules import DlightRule

    a = te.placeholder((16, 64), name="a")
    k = te.reduce_axis((0, 64), name="k")
    w = te.placeholder((64, 32), name="w")
    mm = te.create_prim_func([a, w, te.compute((16, 32), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k), name="c")])
    n = te.var("n", "int64")
    s = te.placeholder((n, 64), name="s")
    symbolic = te.create_prim_func([s, te.compute((n, 64), lambda i, j: s[i, j] + 1.0, name="t")])
    rules = [RollerRule(), DlightRule("GEMV"), DlightRule("Reduction"), GenericRule()]
    before = [copy.copy(vars(r)) for r in rules]
    first = rules[0].apply(mm, device)
    assert isinstance(first, Scheduled) and first.plan and "tiles" in first.plan, first
    # the report's plan says how the grid covers the operator and what the kernel prefetches
    top = list(first.plan["tiles"].values())[-1]
    assert all(first.plan["grid"].get(a, 1) * top[a] >= n for a, n in first.plan["axes"].items()), first.plan
    assert isinstance(first.plan["balanced"], bool) and isinstance(first.plan["prefetched"], list)
    declined = rules[0].apply(symbolic, device)
    assert isinstance(declined, Declined) and "symbolic" in declined.reason
    assert isinstance(rules[3].apply(symbolic, device), Scheduled)
    assert [vars(r) for r in rules] == before  # nothing written on the rules
    again = rules[0].apply(mm, device)  # the same result after another function
    assert again.plan == first.plan and again.notes == first.notes and again.prepacked == first.prepacked

    sched = ScheduleModule(device, rules=rules)
    p = sched.as_pass()
    assert isinstance(p, tvm.transform.ModulePass) and p.info.name == "roller.ScheduleModule"
    out = p(tvm.IRModule({"mm": mm, "sym": symbolic}))
    assert is_scheduled(out["mm"]) and is_scheduled(out["sym"])
    by = {r.name: r for r in sched.report}
    assert by["mm"].scheduled_by == "roller" and by["sym"].scheduled_by == "generic"
    assert "symbolic" in by["sym"].declined["roller"] and by["sym"].reason == by["sym"].declined["roller"]
    assert [vars(r) for r in rules] == before


# ---------------------------------------------------------------------------------------------
# Row-wise functions with several reductions (roller.plan.rows, roller.targets.cpu.rows)

def _fused(model, device):
    import tvm

    mod = frontend.legalize_and_fuse(frontend.import_onnx(model, frontend.onnx_inputs(model)),
                                     target_for(device))
    return {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}


def test_row_wise_schedule_is_parallel_vectorized_and_keeps_rows_in_cache(device):
    """Softmax over 8 x 64: rows parallel, vector partial sums for max and sum (rfactor) in one vector a
    row on the stack (no workspace allocation a row), exp kept in a buffer computed at the row loop (one
    row of it after compaction), x - max inlined, the division by the sum a multiplication by its
    reciprocal."""
    model = _graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], {"x": (8, 64)}, (8, 64))
    (func,) = _fused(model, device).values()
    out = RowWiseRule().apply(func, device)
    assert isinstance(out, Scheduled), out
    sch, plan = out.schedule, out.plan
    assert plan["parallel"] and plan["row_axes"] == 1 and plan["rows"] == 8 and plan["cols"] == 64
    assert set(plan["vector_reductions"]) == {"T_softmax_maxelem", "T_softmax_expsum"}
    assert plan["reduction_lanes"] == device.units.lanes("float32")
    assert plan["inlined"] == ["T_softmax_delta"] and "T_fast_exp" in plan["blocks"]
    assert plan["blocks_exprs"]["T_fast_exp"]["flops_per_point"] > 10
    text = sch.mod["main"].script()
    assert "T.parallel" in text and "T.vectorized" in text and "T.float32(1.0) /" in text
    # the exp buffer shrinks to one row once lowering compacts it: every block runs at the row loop
    from tvm.s_tir import transform as st

    compact = st.CompactBufferAllocation()(st.ConvertBlocksToOpaque()(
        st.PlanAndUpdateBufferAllocationLocation()(sch.mod)))["main"].script()
    alloc = next(ln for ln in compact.splitlines() if "T_fast_exp = T.sblock_alloc_buffer" in ln)
    assert "((1, 64))" in alloc, alloc  # not 8 x 64 (indices narrowed to int32 by the analysis)
    lanes = device.units.lanes("float32")
    # each reduction's partial sums: one vector, then the tree summing them across the lanes (halves)
    partial = sorted(ln.split("sblock_alloc_buffer(")[1].split(")")[0] for ln in compact.splitlines()
                     if "_rf" in ln and "sblock_alloc_buffer" in ln)
    tree = (lanes,) + lane_tree(lanes)
    assert partial == sorted(f"(1, {n}" for n in tree for _ in range(2)), partial
    import tvm

    asm = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}),
                      target_for(device)).mod.inspect_source("asm")
    assert "TVMBackendAllocWorkspace@" not in asm  # a "local" buffer was allocated a row


def test_row_plan_reduction_lanes():
    from roller.plan.rows import reduction_lanes

    assert reduction_lanes(768, 16) == (16, 768)
    assert reduction_lanes(77, 16) == (11, 77)   # 7 x 11: no padding
    assert reduction_lanes(97, 16) == (16, 112)  # prime: padded to whole vectors
    assert reduction_lanes(10, 16) == (10, 10)   # shorter than a vector: the whole row
    assert lane_tree(16) == (8, 4, 2) and lane_tree(8) == (4, 2) and lane_tree(11) == () and lane_tree(2) == ()


@pytest.mark.parametrize("cols", [197, 53])
def test_a_prime_row_reduces_in_whole_vectors_over_its_padding(device, cols):
    """Softmax over rows of a prime length (ViT's 197 tokens; Swin's 49-token windows are padded alike
    on 16 lanes, but 7 divides them on 8, so 53 here to be padded on both): both reductions
    keep vector partial sums over the row padded to whole vectors (the padding lanes the identity, -max
    and 0), the loop over the vectors split so that its whole vectors load without a bound, and the
    result is numpy's softmax."""
    import tvm

    rows = 6
    model = _graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], {"x": (rows, cols)}, (rows, cols))
    (func,) = _fused(model, device).values()
    out = RowWiseRule().apply(func, device)
    assert isinstance(out, Scheduled), out
    lanes = device.units.lanes("float32")
    assert set(out.plan["vector_reductions"]) == {"T_softmax_maxelem", "T_softmax_expsum"}, out.notes
    assert out.plan["reduction_lanes"] == lanes and out.plan["reduction_cols"] == -(-cols // lanes) * lanes
    assert not out.notes
    f = out.schedule.mod["main"].with_attr("global_symbol", "main")
    from roller.tir.compile import compile_for

    lib = compile_for(tvm.IRModule({"main": f}), target_for(device))
    # inputs whose exp underflows unless the max is theirs: a padding lane that won the max (or added to
    # the sum) would show
    x = np.random.default_rng(0).normal(-150.0, 4.0, (rows, cols)).astype("float32")
    y = tvm.runtime.tensor(np.zeros((rows, cols), "float32"))
    lib["main"](tvm.runtime.tensor(x), y)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y.numpy(), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    # whole vectors read the input as vectors: no lane-by-lane loads at clamped indices
    ll = lib.mod.inspect_source("ll")
    assert f"extractelement <{lanes} x i32>" not in ll and f"llvm.smin.v{lanes}i32" not in ll


def test_a_row_over_several_loops_with_no_divisor_runs_scalar_and_right(device):
    """x - mean(x over two axes) with rows of 2 x 17 = 34 columns: no divisor between half a vector and one
    (8 or 16 lanes), and padding extends one reduction loop only, so the mean's sum runs scalar (the plan
    and the note say so); the result is numpy's."""
    import tvm

    from roller.tir.compile import compile_for

    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], keepdims=1, axes=[1, 2]),
             helper.make_node("Sub", ["x", "m"], ["y"])]
    model = _graph(nodes, {"x": (3, 2, 17)}, (3, 2, 17))
    (func,) = _fused(model, device).values()
    out = RowWiseRule().apply(func, device)
    assert isinstance(out, Scheduled), out
    assert out.plan["cols"] == 34 and out.plan["vector_reductions"] == [] and out.plan["reduction_cols"] == 34
    assert any("runs scalar" in n for n in out.notes), out.notes
    lib = compile_for(tvm.IRModule({"main": out.schedule.mod["main"].with_attr("global_symbol", "main")}),
                      target_for(device))
    x = np.random.default_rng(1).normal(size=(3, 2, 17)).astype("float32")
    y = tvm.runtime.tensor(np.zeros_like(x))
    lib["main"](tvm.runtime.tensor(x), y)
    np.testing.assert_allclose(y.numpy(), x - x.mean(axis=(1, 2), keepdims=True), rtol=1e-5, atol=1e-6)


def test_row_wise_rule_declines_other_functions_with_reasons(device):
    import tvm
    from tvm import te

    a = te.placeholder((8, 16, 4), name="a")
    k = te.reduce_axis((0, 16), name="k")
    s = te.compute((8, 4), lambda i, j: te.sum(a[i, k, j], axis=k), name="s")  # reduces a middle axis
    m = te.compute((8, 4), lambda i, j: te.max(a[i, k, j], axis=k), name="m")
    out = te.compute((8, 16, 4), lambda i, n, j: a[i, n, j] - s[i, j] * m[i, j], name="out")
    func = te.create_prim_func([a, out])
    got = RowWiseRule().apply(func, device)
    assert isinstance(got, Declined) and "row" in got.reason, got
    # declined by both of roller's rules: the report keeps both reasons
    sched = ScheduleModule(device, prepack=False)
    sched(tvm.IRModule({"f": func}))
    (rep,) = sched.report
    assert rep.scheduled_by != "roller" and {"roller", "roller-rows"} <= set(rep.declined), rep
    assert rep.declined["roller"] in rep.reason and f"roller-rows: {got.reason}" in rep.reason, rep.reason
