"""One rule per kind of function (RollerRule: one main block; RowWiseRule: row-wise functions) and one
driver (ScheduleModule, a module pass) whether or not the kernel cache is on: the cache supplies a
per-function step (roller.models.function_cache.CachedStep), not a loop of its own."""
import numpy as np
import pytest

pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import roller  # noqa: E402
from roller.cache import store as kc  # noqa: E402
from roller.models import frontend  # noqa: E402
from roller.tir.compile import target_for  # noqa: E402
from roller.models.relax_pass import FunctionStep, ScheduleModule  # noqa: E402
from roller.models.rules import Declined, RollerRule, RowWiseRule, Scheduled, default_rules  # noqa: E402


def _model():
    """MatMul + bias (roller's one-block rule), then softmax (the row-wise rule): distinct functions."""
    w = np.random.default_rng(0).normal(size=(32, 24)).astype(np.float32)
    b = np.linspace(-1, 1, 24).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["z"]),
             helper.make_node("Softmax", ["z"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 24])],
                              initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_row_wise_function_is_scheduled_by_the_row_wise_rule(device):
    import tvm

    model = _model()
    mod = frontend.legalize_and_fuse(frontend.import_onnx(model, frontend.onnx_inputs(model)),
                                     target_for(device))
    (name, func) = next((gv.name_hint, f) for gv, f in mod.functions.items()
                        if isinstance(f, tvm.tirx.PrimFunc) and "softmax" in gv.name_hint)
    assert [type(r) for r in default_rules()[:2]] == [RollerRule, RowWiseRule]
    assert isinstance(RollerRule().apply(func, device), Declined)  # not one main block
    assert isinstance(RowWiseRule().apply(func, device), Scheduled)
    sched = ScheduleModule(device)
    sched(mod)
    rep = {r.name: r for r in sched.report}[name]
    assert (rep.scheduled_by, rep.rule) == ("roller", "roller-rows"), rep
    assert set(rep.declined) == {"roller"} and rep.reason is None, rep  # roller scheduled it
    assert rep.to_dict()["rule"] == "roller-rows" and "rows" in rep.plan
    others = [r for r in sched.report if r.name != name]
    assert others and all((r.scheduled_by, r.rule) == ("roller", "roller") for r in others), others


def test_cached_and_uncached_compiles_go_through_one_driver(device, tmp_path, monkeypatch):
    """Both compiles call the driver's per-function step once per function (the model has no identical
    functions), list the same functions with the same rules, and give the same outputs."""
    monkeypatch.setenv(kc.CACHE_ENV, str(tmp_path / "kc"))
    calls: list[tuple[str, str]] = []
    run_step = ScheduleModule.run_step

    def counted(self, name, func, constants=frozenset()):
        calls.append((type(self.step).__name__, name))
        return run_step(self, name, func, constants)

    monkeypatch.setattr(ScheduleModule, "run_step", counted)
    model = _model()
    plain = roller.compile_model(model, device, cache=False)
    cached = roller.compile_model(model, device, cache=True)
    assert not plain.calls_cache and cached.calls_cache
    names = [r.name for r in plain.report]
    assert names == [r.name for r in cached.report] and len(names) >= 2
    assert calls == [("FunctionStep", n) for n in names] + [("CachedStep", n) for n in names], calls
    assert [(r.scheduled_by, r.rule) for r in plain.report] == [(r.scheduled_by, r.rule) for r in cached.report]
    assert {r.cache for r in plain.report} == {None} and {r.cache for r in cached.report} == {"miss"}
    assert ("roller", "roller-rows") in [(r.scheduled_by, r.rule) for r in cached.report]
    feeds = plain.random_inputs(1)
    np.testing.assert_allclose(cached.run(feeds)[0], plain.run(feeds)[0], rtol=1e-5, atol=1e-6)


def test_the_driver_reuses_identical_functions_only_for_a_step_that_asks(device):
    """The default step gets each distinct function once; a step with reuse = False gets every one."""
    import tvm
    from tvm import te

    a = te.placeholder((8, 16), name="a")
    f = te.create_prim_func([a, te.compute((8, 16), lambda i, j: a[i, j] * 2.0, name="b")])
    mod = tvm.IRModule({"f": f, "g": f})
    seen = []

    class Every(FunctionStep):
        reuse = False

        def __call__(self, sched, name, func, constants):
            seen.append(name)
            return super().__call__(sched, name, func, constants)

    once = ScheduleModule(device, prepack=False)
    once(mod)
    assert [r.reused for r in once.report] == [None, "f"]
    every = ScheduleModule(device, prepack=False, step=Every())
    every(mod)
    assert seen == ["f", "g"] and [r.reused for r in every.report] == [None, None]
    assert [r.rule for r in every.report] == [r.rule for r in once.report]
