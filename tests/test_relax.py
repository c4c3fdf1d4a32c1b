"""Whole models through Relax (roller.models.relax_pass, roller.models.frontend, `roller compile`): outputs against
onnxruntime and numpy, which rule scheduled each fused function, bad models and inputs."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import roller  # noqa: E402
from roller import cli
from roller.models import frontend
from roller.tir import compile as tvmutil  # noqa: E402,F401  (roller.tvmutil.target_for below)
from roller.models.relax_pass import ScheduleModule, is_scheduled  # noqa: E402
from roller.models.rules import Declined, GenericRule, RollerRule, RowWiseRule, Scheduled  # noqa: E402

import onnx_models  # noqa: E402  (tests/ is on sys.path under pytest)

pytestmark = pytest.mark.build


@pytest.fixture(scope="module")
def device():
    return roller.load_device()


def _graph(nodes, inputs, output_shape, inits=(), opset=17):
    """A one-output ONNX model over float32 inputs {name: shape} (opset 23 and above: IR version 10)."""
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(output_shape))
    inits = [numpy_helper.from_array(np.asarray(a, np.float32), n) for n, a in inits]
    model = helper.make_model(helper.make_graph(nodes, "g", ins, [out], initializer=inits),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset >= 23 else 8
    return model


def _scheduled_by(cm) -> dict[str, str]:
    return {r.name: r.scheduled_by for r in cm.report}


# ---------------------------------------------------------------------------------------------
# Whole models against onnxruntime

@pytest.fixture(scope="module")
def cnn(device):
    model = onnx_models.small_cnn()
    return model, roller.compile_model(model, device)


@pytest.fixture(scope="module")
def transformer(device):
    model = onnx_models.transformer_block()
    return model, roller.compile_model(model, device)


def test_small_cnn_matches_onnxruntime(cnn):
    model, cm = cnn
    check = frontend.check_against_onnxruntime(cm, model, time_it=False)
    assert check["matches"], check
    assert check["max_abs_error"] < 1e-3
    by = _scheduled_by(cm)
    assert "none" not in by.values()
    convs = [n for n in by if "conv2d" in n]
    assert len(convs) == 4 and all(by[n] == "roller" for n in convs), by
    # pooling, global mean, the classifier and the batch norm + ReLU go through roller too
    assert by["max_pool2d"] == by["mean"] == "roller", by
    assert all(by[n] == "roller" for n in by if "matmul" in n or "batch_norm" in n), by


def test_transformer_block_matches_onnxruntime(transformer):
    model, cm = transformer
    check = frontend.check_against_onnxruntime(cm, model, time_it=False)
    assert check["matches"], check
    by = _scheduled_by(cm)
    assert "none" not in by.values()
    assert all(by[n] == "roller" for n in by if "matmul" in n), by  # QKV, scores, GELU MLP, residuals
    assert by["fast_softmax"] == by["layer_norm"] == "roller", by  # several reductions, row by row
    gelu = next(r for r in cm.report if "erf" in r.name)
    assert gelu.plan and gelu.plan["tiles"], gelu


def test_small_cnn_in_the_models_nchw_layout(device):
    model = onnx_models.small_cnn(size=16)
    cm = roller.compile_model(model, device, layout="NCHW")
    assert frontend.check_against_onnxruntime(cm, model, time_it=False)["matches"]
    by = _scheduled_by(cm)
    assert all(by[n] == "roller" for n in by if "conv2d" in n) and not any("transpose" in n for n in by), by


def test_exact_math_matches_onnxruntime(device):
    model = onnx_models.transformer_block()
    cm = roller.compile_model(model, device, fast_math=False)
    assert frontend.check_against_onnxruntime(cm, model, time_it=False)["matches"]
    names = [r.name for r in cm.report]
    assert "softmax" in names and any("_erf_" in n for n in names) and not any("fast" in n for n in names), names


def test_relax_module_input(device):
    """A Relax IRModule (what from_exported_program gives) compiles like an ONNX model."""
    model = onnx_models.small_cnn(size=16)
    mod = frontend.import_onnx(model, frontend.onnx_inputs(model))
    cm = roller.compile_model(mod, device, name="cnn_relax")
    assert cm.inputs == {"x": ((1, 3, 16, 16), "float32")}
    feeds = cm.random_inputs()
    reference = frontend.onnxruntime_session(model, 1).run(None, feeds)
    assert frontend.compare(cm.run(feeds), reference)["matches"]
    with pytest.raises(roller.ModelError, match="--input only with an ONNX model"):
        roller.compile_model(mod, device, inputs={"x": (1, 3, 16, 16)})


def test_other_seed_still_matches(transformer):
    model, cm = transformer
    assert frontend.check_against_onnxruntime(cm, model, seed=7, time_it=False)["matches"]


def test_roller_schedules_every_function_it_accepts(device):
    """The rule chain never hands a function roller's analysis accepts to a fallback, and every function
    comes out marked scheduled."""
    from roller.errors import RollerError

    model = onnx_models.small_cnn(size=16)
    specs = frontend.onnx_inputs(model)
    mod = frontend.legalize_and_fuse(frontend.import_onnx(model, specs), roller.tir.compile.target_for(device))
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
                                     roller.tir.compile.target_for(device))
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
# One kind of fused function at a time, against numpy

def _conv_ref(x, w, b, pad):
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, w.shape[2:], axis=(2, 3))  # n c h w r s
    return np.einsum("nchwrs,kcrs->nkhw", win, w) + b[None, :, None, None]


_erf = np.vectorize(math.erf)


def _case_conv_bias_relu(rng):
    x, w, b = rng.normal(size=(1, 8, 10, 10)), rng.normal(size=(12, 8, 3, 3)), rng.normal(size=12)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    return _graph(nodes, {"x": x.shape}, (1, 12, 10, 10), [("w", w), ("b", b)]), {"x": x}, \
        np.maximum(_conv_ref(x, w, b, 1), 0), "conv2d", "roller"


def _case_conv_residual(rng):
    x, w, b = rng.normal(size=(1, 8, 6, 6)), rng.normal(size=(8, 8, 3, 3)), rng.normal(size=8)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    return _graph(nodes, {"x": x.shape}, x.shape, [("w", w), ("b", b)]), {"x": x}, \
        np.maximum(_conv_ref(x, w, b, 1) + x, 0), "conv2d", "roller"


def _case_matmul_bias_gelu(rng):
    x, w, b = rng.normal(size=(1, 12, 24)), rng.normal(size=(24, 40)) / 5, rng.normal(size=40)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Mul", ["a", "r2"], ["g0"]), helper.make_node("Erf", ["g0"], ["g1"]),
             helper.make_node("Add", ["g1", "one"], ["g2"]), helper.make_node("Mul", ["a", "g2"], ["g3"]),
             helper.make_node("Mul", ["g3", "half"], ["y"])]
    h = x @ w + b
    return _graph(nodes, {"x": x.shape}, (1, 12, 40),
                  [("w", w), ("b", b), ("r2", np.array(2 ** -0.5)), ("one", np.array(1.0)), ("half", np.array(0.5))]), \
        {"x": x}, 0.5 * h * (1 + _erf(h / 2 ** 0.5)), "matmul", "roller"


def _softmax_case(shape, rule="roller"):
    def case(rng):
        x = rng.normal(size=shape) * 3
        e = np.exp(x - x.max(-1, keepdims=True))
        return _graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], {"x": x.shape}, x.shape), {"x": x}, \
            e / e.sum(-1, keepdims=True), "softmax", rule
    case.__name__ = "_case_softmax_" + "x".join(map(str, shape))
    return case


def _layer_norm_ref(x, g, b):
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * g + b


def _case_layer_norm(rng):
    x, g, b = rng.normal(size=(1, 10, 48)), rng.uniform(0.5, 1.5, 48), rng.normal(size=48)
    return _graph([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)],
                  {"x": x.shape}, x.shape, [("g", g), ("b", b)]), {"x": x}, _layer_norm_ref(x, g, b), "layer_norm", \
        "roller"


def _case_layer_norm_one_row(rng):
    x, g, b = rng.normal(size=(1, 1, 200)), rng.uniform(0.5, 1.5, 200), rng.normal(size=200)
    return _graph([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)],
                  {"x": x.shape}, x.shape, [("g", g), ("b", b)]), {"x": x}, _layer_norm_ref(x, g, b), "layer_norm", \
        "roller"


def _case_rms_norm(rng):
    x, g = rng.normal(size=(2, 5, 64)), rng.uniform(0.5, 1.5, 64)
    return _graph([helper.make_node("RMSNormalization", ["x", "g"], ["y"], axis=-1, epsilon=1e-5)],
                  {"x": x.shape}, x.shape, [("g", g)], opset=23), {"x": x}, \
        x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * g, "rms_norm", "roller"


def _case_mean_then_normalize(rng):
    # layer norm as older exporters write it: ReduceMean, Sub, Mul, ReduceMean, Add, Sqrt, Div
    x = rng.normal(size=(1, 6, 48))
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1), helper.make_node("Sub", ["x", "m"], ["d"]),
             helper.make_node("Mul", ["d", "d"], ["d2"]), helper.make_node("ReduceMean", ["d2", "axes"], ["v"], keepdims=1),
             helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["s"]),
             helper.make_node("Div", ["d", "s"], ["y"])]
    model = _graph(nodes, {"x": x.shape}, x.shape, [("eps", np.array(1e-5))], opset=18)
    model.graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), "axes"))
    return model, {"x": x}, _layer_norm_ref(x, 1.0, 0.0), "mean_subtract", "roller"


def _case_relu6(rng):
    # MobileNetV2's activation: Clip with constant bounds, which the frontend folds with numpy
    x = rng.normal(size=(1, 8, 6, 6)) * 5
    nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["y"])]
    return _graph(nodes, {"x": x.shape}, x.shape, [("lo", np.array(0.0)), ("hi", np.array(6.0))]), {"x": x}, \
        np.clip(x, 0, 6), "minimum", "roller"


def _case_reduce_mean(rng):
    x = rng.normal(size=(1, 16, 7, 7))
    return _graph([helper.make_node("GlobalAveragePool", ["x"], ["y"])], {"x": x.shape}, (1, 16, 1, 1)), {"x": x}, \
        x.mean((2, 3), keepdims=True), "mean", "roller"


def _case_max_pool(rng):
    x = rng.normal(size=(1, 8, 12, 12))
    return _graph([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])], {"x": x.shape},
                  (1, 8, 6, 6)), {"x": x}, x.reshape(1, 8, 6, 2, 6, 2).max((3, 5)), "max_pool", "roller"


def _case_batch_norm_relu(rng):
    x = rng.normal(size=(1, 8, 5, 5))
    s, b, m, v = rng.uniform(0.5, 1.5, 8), rng.normal(size=8), rng.normal(size=8), rng.uniform(0.5, 1.5, 8)
    c = lambda a: a[None, :, None, None]  # noqa: E731
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    ref = np.maximum((x - c(m)) / np.sqrt(c(v) + 1e-5) * c(s) + c(b), 0)
    return _graph(nodes, {"x": x.shape}, x.shape, [("s", s), ("b", b), ("m", m), ("v", v)]), {"x": x}, ref, \
        "batch_norm", "roller"


def _case_transpose(rng):
    x = rng.normal(size=(2, 12, 20))
    return _graph([helper.make_node("Transpose", ["x"], ["y"], perm=[2, 0, 1])], {"x": x.shape}, (20, 2, 12)), \
        {"x": x}, x.transpose(2, 0, 1), "transpose", "roller"


def _case_reshape_transpose(rng):
    # the attention head merge: [1, h, s, d] -> [1, s, h, d] -> [1, s, h*d]; the reshape's index divides
    x = rng.normal(size=(1, 2, 6, 8))
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]), helper.make_node("Reshape", ["t", "shape"], ["y"])]
    model = _graph(nodes, {"x": x.shape}, (1, 6, 16))
    model.graph.initializer.append(numpy_helper.from_array(np.array([1, 6, 16], np.int64), "shape"))
    return model, {"x": x}, x.transpose(0, 2, 1, 3).reshape(1, 6, 16), "transpose", "generic"


# softmax rows of 32: roller's row plan; rows of 77 end in a partial vector: roller's too (partial sums of
# 11 lanes, the last vector of the elementwise blocks split off);
# one row of 1000: roller's (one row in partial sums of 10 lanes)
CASES = [_case_conv_bias_relu, _case_conv_residual, _case_matmul_bias_gelu, _softmax_case((2, 6, 32)),
         _softmax_case((1, 3, 7, 77)), _softmax_case((1, 1000)), _case_layer_norm, _case_layer_norm_one_row,
         _case_rms_norm, _case_mean_then_normalize, _case_relu6, _case_reduce_mean, _case_max_pool, _case_batch_norm_relu, _case_transpose, _case_reshape_transpose]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__[6:] for c in CASES])
def test_fused_function_against_numpy(case, device):
    model, feeds, ref, fname, rule = case(np.random.default_rng(1))
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    cm = roller.compile_model(model, device)
    (out,) = cm.run(feeds)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    main = [r for r in cm.report if fname in r.name]
    assert len(main) == 1, cm.report
    assert main[0].scheduled_by == rule, main[0]
    assert all(r.scheduled_by != "none" for r in cm.report)


def test_clip_after_conv_is_the_convs_epilogue(device):
    """MobileNetV2's ReLU6 (Clip with constant bounds) fuses into the NHWC convolution: no transposes
    around it and no function of its own; a Clip with only a lower bound too; a bound that is an input
    (not a constant) stays a kernel of its own and is still right."""
    rng = np.random.default_rng(3)
    x, w, b = rng.normal(size=(1, 8, 10, 10)), rng.normal(size=(16, 8, 3, 3)), rng.normal(size=16)
    conv = helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1])
    ref = _conv_ref(x, w, b, 1)
    for clip, bounds, want in [(helper.make_node("Clip", ["c", "lo", "hi"], ["y"]), [("lo", np.array(0.0)),
                                                                                  ("hi", np.array(6.0))], np.clip(ref, 0, 6)),
                               (helper.make_node("Clip", ["c", "lo"], ["y"]), [("lo", np.array(0.5))], np.maximum(ref, 0.5))]:
        model = _graph([conv, clip], {"x": x.shape}, ref.shape, [("w", w), ("b", b)] + bounds)
        cm = roller.compile_model(model, device)
        np.testing.assert_allclose(cm.run({"x": x.astype(np.float32)})[0], want, rtol=1e-4, atol=1e-4)
        names = [r.name for r in cm.report]
        fused = [n for n in names if "conv2d" in n]
        assert len(fused) == 1 and "maximum" in fused[0] and (len(bounds) == 1 or "minimum" in fused[0]), names
        assert not any("maximum" in n for n in names if n not in fused), names
    model = _graph([conv, helper.make_node("Clip", ["c", "lo"], ["y"])], {"x": x.shape, "lo": ()}, ref.shape,
                   [("w", w), ("b", b)])
    cm = roller.compile_model(model, device)
    out = cm.run({"x": x.astype(np.float32), "lo": np.array(0.25, np.float32)})[0]
    np.testing.assert_allclose(out, np.maximum(ref, 0.25), rtol=1e-4, atol=1e-4)


def test_multi_output_function(device):
    """Split gives one function with two outputs: roller declines it (one output per operator), a
    fallback schedules it, both outputs are right."""
    x = np.random.default_rng(4).normal(size=(2, 10, 32)).astype(np.float32)
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 10, 16]) for n in ("y0", "y1")]
    split = numpy_helper.from_array(np.array([16, 16], np.int64), "split")
    model = helper.make_model(helper.make_graph([helper.make_node("Split", ["x", "split"], ["y0", "y1"], axis=2)],
                                                "g", ins, outs, initializer=[split]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    cm = roller.compile_model(model, device)
    y0, y1 = cm.run({"x": x})
    np.testing.assert_array_equal(y0, x[..., :16])
    np.testing.assert_array_equal(y1, x[..., 16:])
    (rep,) = [r for r in cm.report if "split" in r.name]
    assert rep.scheduled_by not in ("roller", "none") and "output" in rep.reason, rep


def test_profiled_plan_is_used_and_correct(device):
    rng = np.random.default_rng(2)
    x, w = rng.normal(size=(16, 64)).astype(np.float32), rng.normal(size=(64, 48))
    model = _graph([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": x.shape}, (16, 48), [("w", w)])
    cm = roller.compile_model(model, device, profile=True, topk=2)
    (out,) = cm.run({"x": x})
    np.testing.assert_allclose(out, x @ w.astype(np.float32), rtol=1e-4, atol=1e-4)
    assert [r.scheduled_by for r in cm.report] == ["roller"]
    (rep,) = cm.report
    assert rep.profiled.startswith("top-") and rep.prepacked, rep  # the profiled plan takes its weight packed


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


def test_shape_chains_are_folded_before_import(device):
    """A channel split whose Slice bounds come from Shape -> Gather -> Div (PyTorch's chunk) failed to
    legalize unfolded; folded by onnxruntime first it compiles, matches, and the report says so."""
    from roller.models.relax_steps import legalize_and_fuse

    model = onnx_models.chunk_shuffle()
    specs = frontend.onnx_inputs(model)
    with pytest.raises(AssertionError, match="ShapeExpr"):  # TVM's importer alone: the reason for the fold
        legalize_and_fuse(frontend.import_onnx(model, specs), tvmutil.target_for(device), "NHWC", True)
    cm = roller.compile_model(model, device)
    assert cm.folded and "folded by onnxruntime" in cm.folded and "0 shape nodes left" in cm.folded
    assert cm.to_dict()["graph_folded"] == cm.folded
    assert frontend.check_against_onnxruntime(cm, model, time_it=False)["matches"]


def test_scalar_constant_of_shape_is_folded(device):
    """ConstantOfShape of an empty shape (a scalar: GPT-2's exported mask) fails in TVM's converter;
    folded first, the model compiles and matches."""
    shape = numpy_helper.from_array(np.zeros((0,), np.int64), "empty")
    value = numpy_helper.from_array(np.array([2.5], np.float32), "value")
    nodes = [helper.make_node("ConstantOfShape", ["empty"], ["c"], value=value),
             helper.make_node("Mul", ["x", "c"], ["y"])]
    model = _graph(nodes, {"x": (2, 8)}, (2, 8))
    model.graph.initializer.append(shape)
    specs = frontend.onnx_inputs(model)
    with pytest.raises(roller.errors.ModelError, match="ConstantOfShape"):  # TVM's converter alone
        frontend.import_onnx(model, specs)
    cm = roller.compile_model(model, device)
    assert "ConstantOfShape 1" in cm.folded
    assert frontend.check_against_onnxruntime(cm, model, time_it=False)["matches"]


def test_graphs_without_shape_nodes_are_imported_as_they_are(cnn, device):
    model, cm = cnn
    assert cm.folded is None
    assert frontend.fold_shapes(model, frontend.onnx_inputs(model)) == (model, None)


def test_symbolic_input_is_folded_at_the_given_shape(device):
    """fold_shapes sets the shapes being compiled for before folding: a Shape of a symbolic input folds."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["r"]),
             helper.make_node("Relu", ["r"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folded, note = frontend.fold_shapes(model, {"x": ((3, 8), "float32")})
    assert "0 shape nodes left" in note
    assert [d.dim_value for d in folded.graph.input[0].type.tensor_type.shape.dim] == [3, 8]
    cm = roller.compile_model(model, device, inputs={"x": (3, 8)})
    assert frontend.check_against_onnxruntime(cm, model, time_it=False)["matches"]


# ---------------------------------------------------------------------------------------------
# roller compile: the command line

def _relu_model(shape=("N", 8)):
    return _graph([helper.make_node("Relu", ["x"], ["y"])], {"x": shape}, shape)


def test_cli_json_and_library(tmp_path, capsys):
    import tvm
    from tvm import relax

    path = tmp_path / "cnn.onnx"
    onnx.save(onnx_models.small_cnn(size=16, channels=8), str(path))
    rc = cli.main(["compile", str(path), "--no-profile", "--json", "--out", str(tmp_path / "out")])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0
    for key in ("model", "device", "compile_seconds", "latency_seconds", "onnxruntime_latency_seconds",
                "onnxruntime_over_roller", "max_abs_error", "max_rel_error", "matches", "functions"):
        assert key in report, key
    assert report["matches"] is True and report["latency_seconds"] > 0 and report["onnxruntime_latency_seconds"] > 0
    assert all({"name", "scheduled_by", "seconds"} <= set(f) for f in report["functions"])
    assert any(f["scheduled_by"] == "roller" for f in report["functions"])
    # the saved library runs in a VirtualMachine and gives onnxruntime's answer
    lib = tvm.runtime.load_module(report["saved"]["library"])
    vm = relax.VirtualMachine(lib, tvm.cpu())
    x = np.random.default_rng(3).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)
    ours = vm["main"](tvm.runtime.tensor(x, tvm.cpu())).numpy()
    import onnxruntime as ort
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-3, atol=1e-3)


def test_cli_symbolic_input_given(tmp_path, capsys):
    path = tmp_path / "relu.onnx"
    onnx.save(_relu_model(), str(path))
    assert cli.main(["compile", str(path), "--input", "x=3x8", "--no-profile"]) == 0
    out = capsys.readouterr().out
    assert "matches onnxruntime" in out and "yes" in out
    assert "x faster" in out or "x slower" in out  # which engine was faster, by how much


def _bad_models(tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not a protobuf \x00\xff\x17")
    dft = tmp_path / "dft.onnx"
    onnx.save(_graph([helper.make_node("DFT", ["x"], ["y"])], {"x": (1, 4, 2)}, (1, 4, 2)), str(dft))
    relu = tmp_path / "relu.onnx"
    onnx.save(_relu_model(), str(relu))
    return {
        "does not parse": ([str(junk)], "not a readable ONNX model"),
        "missing file": ([str(tmp_path / "none.onnx")], "no such file"),
        "unsupported operator": ([str(dft)], "DFT"),
        "symbolic, no --input": ([str(relu)], "--input x="),
        "unknown input name": ([str(relu), "--input", "z=2x8"], "no input named 'z'"),
        "wrong shape": ([str(relu), "--input", "x=2x9"], "does not fit"),
        "wrong rank": ([str(relu), "--input", "x=2x8x1"], "does not fit"),
        "malformed --input": ([str(relu), "--input", "x=2by8"], "expected NAME=DIMxDIMx"),
    }


@pytest.mark.parametrize("what", ["does not parse", "missing file", "unsupported operator", "symbolic, no --input",
                                  "unknown input name", "wrong shape", "wrong rank", "malformed --input"])
def test_cli_bad_input_one_line(what, tmp_path, capsys):
    argv, expected = _bad_models(tmp_path)[what]
    rc = cli.main(["compile", *argv, "--no-profile"])
    err = capsys.readouterr().err
    assert rc != 0
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("roller: error:"), err
    assert expected in lines[0] and "Traceback" not in err


def test_cli_importer_failure_is_one_line_naming_the_node(tmp_path, capsys):
    """A graph TVM's importer raises on (not an OpError): one line naming the ONNX node, nothing on stdout."""
    bad = tmp_path / "matmul.onnx"
    # a 1x8 input times a 5x3 weight: the shapes disagree, which TVM's MatMul converter raises on
    onnx.save(_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")], {"x": (1, 8)}, (1, 3),
                     inits=[("w", np.ones((5, 3)))]), str(bad))
    rc = cli.main(["compile", str(bad), "--no-profile", "--json"])
    out, err = capsys.readouterr()
    assert rc != 0 and out == ""
    lines = [ln for ln in err.splitlines() if ln.strip() and "Warning" not in ln]
    assert len(lines) == 1 and lines[0].startswith("roller: error: TVM's ONNX importer failed at ONNX node "
                                                   "MatMul 'proj'"), err
    assert "internal error" not in err and "Traceback" not in err


def test_cli_legalization_failure_is_one_line_naming_the_operator(tmp_path, capsys, monkeypatch):
    """The channel split unfolded (as without onnxruntime's folding) fails in TVM's legalization of a
    reshape: a ModelError naming it, not 'roller: internal error'."""
    path = tmp_path / "shuffle.onnx"
    onnx.save(onnx_models.chunk_shuffle(), str(path))
    monkeypatch.setattr(frontend, "fold_shapes", lambda proto, inputs: (proto, None))
    rc = cli.main(["compile", str(path), "--no-profile"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and "Warning" not in ln]
    assert rc != 0 and len(lines) == 1, err
    assert lines[0].startswith("roller: error: legalizing and fusing the model") and "reshape" in lines[0], err
    assert "internal error" not in err


# ---------------------------------------------------------------------------------------------
# Row-wise functions with several reductions (roller.plan.rows, roller.targets.cpu.rows)

def _fused(model, device):
    import tvm

    mod = frontend.legalize_and_fuse(frontend.import_onnx(model, frontend.onnx_inputs(model)),
                                     roller.tir.compile.target_for(device))
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
    assert "((T.int64(1), T.int64(64)))" in alloc, alloc  # not 8 x 64
    lanes = device.units.lanes("float32")
    partial = [ln for ln in compact.splitlines() if "_rf = T.sblock_alloc_buffer" in ln]
    assert len(partial) == 2 and all(f"((T.int64(1), T.int64({lanes})))" in ln for ln in partial), partial
    import tvm

    asm = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}),
                      tvmutil.target_for(device)).mod.inspect_source("asm")
    assert "TVMBackendAllocWorkspace@" not in asm  # a "local" buffer was allocated a row


def test_row_plan_reduction_lanes():
    from roller.plan.rows import reduction_lanes

    assert reduction_lanes(768, 16) == 16
    assert reduction_lanes(77, 16) == 11  # 7 x 11: no partial vector, whose predicate compute_at would drop
    assert reduction_lanes(97, 16) == 1   # prime: the reduction runs scalar
    assert reduction_lanes(10, 16) == 10  # shorter than a vector: the whole row


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


# ---------------------------------------------------------------------------------------------
# PyTorch: torch.export -> Relax -> roller (skipped where torch is not importable: CI does not install it)

def test_torch_export_path(device):
    torch = pytest.importorskip("torch", reason="torch is not installed (optional: the torch.export path)")
    from tvm.relax.frontend.torch import from_exported_program

    class Net(torch.nn.Module):
        """conv + ReLU, global pool, layer norm, linear, softmax: convs, row-wise and matmul functions."""

        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
            self.norm = torch.nn.LayerNorm(16)
            self.fc = torch.nn.Linear(16, 10)

        def forward(self, x):
            h = torch.relu(self.conv(x)).mean((2, 3))
            return torch.softmax(self.fc(self.norm(h)), -1)

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(1, 3, 12, 12)
    with torch.no_grad():
        want = net(x).numpy()
        mod = from_exported_program(torch.export.export(net, (x,)))
    cm = roller.compile_model(mod, device, name="torch_net")
    (got,) = cm.run({name: x.numpy() for name in cm.inputs})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    by = _scheduled_by(cm)
    assert "none" not in by.values()
    assert any("conv2d" in n and r == "roller" for n, r in by.items()), by
    assert any("softmax" in n and r == "roller" for n, r in by.items()), by


# ---------------------------------------------------------------------------------------------
# Profiling a whole model: which functions, within a budget

def test_profiling_goes_by_predicted_share_within_budget(device):
    from roller.models.relax_pass import MIN_PROFILE_SHARE

    model = onnx_models.transformer_encoder(2)  # functions called twice, identical ones reused
    cm = roller.compile_model(model, device, profile=True, topk=3, profile_budget=None)
    assert frontend.check_against_onnxruntime(cm, model, time_it=False)["matches"]
    mine = [r for r in cm.report if r.scheduled_by == "roller"]
    assert mine and all(r.profiled for r in mine), [(r.name, r.profiled) for r in mine]
    assert any(r.profiled.startswith("top-") for r in mine), [(r.name, r.profiled) for r in mine]
    for r in mine:
        if "of the model's predicted time" in r.profiled:
            share = float(r.profiled.split("not profiled: ")[1].split("%")[0]) / 100
            assert share < MIN_PROFILE_SHARE, r.profiled
    # no time at all: every function keeps the model's first plan, and says why
    cm0 = roller.compile_model(model, device, profile=True, topk=3, profile_budget=0.0)
    mine0 = [r for r in cm0.report if r.scheduled_by == "roller"]
    assert any("budget" in r.profiled for r in mine0) and not any(r.profiled.startswith("top-") for r in mine0)
    assert frontend.check_against_onnxruntime(cm0, model, time_it=False)["matches"]


def test_call_counts(device):
    from roller.models.constants import call_counts

    model = onnx_models.transformer_encoder(2)
    mod = frontend.legalize_and_fuse(frontend.import_onnx(model, frontend.onnx_inputs(model)),
                                     roller.tir.compile.target_for(device))
    counts = call_counts(mod)
    assert counts["layer_norm"] == 4, counts  # two per layer, one function
    assert counts["fast_softmax"] == 2, counts


def test_profiling_a_function_with_a_scalar_tensor_parameter(device):
    """ReLU6's bounds reach the fused function as 0-d tensors: profiling passes them as 0-d arrays."""
    from tvm import te

    a = te.placeholder((4, 64), name="a")
    lo = te.placeholder((), name="lo")
    out = te.compute((4, 64), lambda i, j: te.max(a[i, j], lo()), name="out")
    x = np.random.default_rng(5).normal(size=(4, 64)).astype(np.float32)
    bound = np.array(0.25, np.float32)
    res = roller.build(te.create_prim_func([a, lo, out]), device, topk=2, inputs=[x, bound], cache=False)
    import tvm
    y = tvm.runtime.empty((4, 64), "float32", tvm.cpu())
    res.module["main"](tvm.runtime.tensor(x, tvm.cpu()), tvm.runtime.tensor(bound, tvm.cpu()), y)
    np.testing.assert_array_equal(y.numpy(), np.maximum(x, bound))


def test_weights_that_outgrow_the_caches_are_planned_from_memory(device):
    """A model whose constants exceed what a unit finds in the caches (Device.largest_cached_bytes) is
    planned with its weights read from memory (Device.constants_level); a small one as before. The model
    built either way matches numpy."""
    import dataclasses

    from roller.models.frontend import import_onnx, legalize_and_fuse, onnx_inputs
    from roller.models.constants import constant_bytes, constants_device
    from roller.tir.compile import target_for

    rng = np.random.default_rng(3)
    x, w = rng.normal(size=(4, 256)).astype(np.float32), rng.normal(size=(256, 512)).astype(np.float32)
    model = _graph([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": x.shape}, (4, 512), [("w", w)])
    mod = legalize_and_fuse(import_onnx(model, onnx_inputs(model, None)), target_for(device))
    assert constant_bytes(mod) == w.nbytes
    assert constants_device(mod, device) is device  # 512 KB stay cached
    last = device.levels[-2]
    small = dataclasses.replace(device, calibration=None, levels=device.levels[:-2] + (
        dataclasses.replace(last, capacity_bytes=w.nbytes, usable_fraction=0.5), device.levels[-1]))
    assert small.largest_cached_bytes() == w.nbytes // 2
    cold = constants_device(mod, small)
    assert cold.constants_level == small.levels[-1].name
    cm = roller.compile_model(model, cold, cache=False)
    (out,) = cm.run({"x": x})
    np.testing.assert_allclose(out, x @ w, rtol=1e-4, atol=1e-4)
