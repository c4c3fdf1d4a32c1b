"""Fused functions through Relax one kind at a time, against numpy (convolutions with their epilogues,
matmul + GELU, softmax, norms, reductions, pooling, transposes, several outputs), and profiling in
models: the profiled plan used (with its weight prepacked), which functions are profiled within a budget,
call counts, scalar tensor parameters, weights planned from memory when they outgrow the caches."""
from __future__ import annotations

import math

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import roller  # noqa: E402
from roller.models import frontend
from roller.tir.compile import target_for  # noqa: E402

import onnx_models  # noqa: E402  (tests/ is on sys.path under pytest)
from relax_helpers import _graph  # noqa: E402

pytestmark = pytest.mark.build


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


def _case_gelu_tanh(rng):
    # GPT-2's GELU: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))); Pow by 3 becomes x * x * x (a pow call per
    # lane ran 1.9 ms on 128 x 3072 values), so no function is named after power
    x = rng.normal(size=(4, 96)) * 2
    nodes = [helper.make_node("Pow", ["x", "three"], ["x3"]), helper.make_node("Mul", ["x3", "c"], ["a"]),
             helper.make_node("Add", ["x", "a"], ["b"]), helper.make_node("Mul", ["b", "k"], ["d"]),
             helper.make_node("Tanh", ["d"], ["t"]), helper.make_node("Add", ["t", "one"], ["e"]),
             helper.make_node("Mul", ["x", "e"], ["f"]), helper.make_node("Mul", ["f", "half"], ["y"])]
    consts = [("three", np.array(3.0)), ("c", np.array(0.044715)), ("k", np.array(math.sqrt(2 / math.pi))),
              ("one", np.array(1.0)), ("half", np.array(0.5))]
    ref = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return _graph(nodes, {"x": x.shape}, x.shape, consts), {"x": x}, ref, "multiply", "roller"


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
         _case_rms_norm, _case_mean_then_normalize, _case_relu6, _case_gelu_tanh, _case_reduce_mean, _case_max_pool, _case_batch_norm_relu, _case_transpose, _case_reshape_transpose]


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


def test_hardswish_and_hardsigmoid_after_conv_are_its_epilogue(device):
    """MobileNetV3's HardSwish and HardSigmoid import as Relax's clip, which the NHWC layout conversion
    wrapped in two transposes (26 functions of their own at batch 8, 2.8 of 19.8 ms); as maximum then
    minimum they are the convolution's epilogue. HardSwish's division by 6 is a multiplication by 1 / 6
    (no vector division in the kernel)."""
    rng = np.random.default_rng(5)
    x, w, b = rng.normal(size=(1, 8, 10, 10)), rng.normal(size=(16, 8, 3, 3)), rng.normal(size=16)
    conv = helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1])
    ref = _conv_ref(x, w, b, 1)
    for node, want in [(helper.make_node("HardSwish", ["c"], ["y"]), ref * np.clip(ref + 3, 0, 6) / 6),
                       (helper.make_node("HardSigmoid", ["c"], ["y"], alpha=0.2, beta=0.5),
                        np.clip(0.2 * ref + 0.5, 0, 1))]:
        model = _graph([conv, node], {"x": x.shape}, ref.shape, [("w", w), ("b", b)])
        cm = roller.compile_model(model, device)
        np.testing.assert_allclose(cm.run({"x": x.astype(np.float32)})[0], want, rtol=1e-4, atol=1e-4)
        names = [r.name for r in cm.report]
        fused = [n for n in names if "conv2d" in n]
        assert len(fused) == 1 and "maximum" in fused[0] and "minimum" in fused[0], names
        assert not any("clip" in n for n in names) and sum("transpose" in n for n in names) <= 2, names
        assert not any("divide" in n for n in names), names


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
                                     target_for(device))
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


def test_division_by_a_constant_is_a_multiplication_by_its_reciprocal(device):
    """x / c with c a constant (per channel here) runs as x * (1 / c), within an ulp or two of the
    division; a constant with a zero keeps its division (and its infinities)."""
    x = np.random.default_rng(3).normal(size=(4, 6, 8)).astype(np.float32)
    for c, rewritten in [(np.array([2, 3, 0.5, 7, -6, 1e-3, 9, 11], np.float32), True),
                         (np.array([2, 3, 0, 7, -6, 1e-3, 9, 11], np.float32), False)]:
        model = _graph([helper.make_node("Div", ["x", "c"], ["y"])], {"x": x.shape}, x.shape, [("c", c)])
        cm = roller.compile_model(model, device, cache=False)
        with np.errstate(divide="ignore"):
            want = x / c
        np.testing.assert_allclose(cm.run({"x": x})[0], want, rtol=1e-6, atol=0)
        names = [r.name for r in cm.report]
        assert any("divide" in n for n in names) != rewritten, names


def test_gelu_between_reshapes_is_the_matmuls_epilogue(device):
    """An exported MLP: Gemm on [tokens, width], Reshape to [1, tokens, width] for GELU (x * 0.5 * (1 +
    erf(x / sqrt 2))), Reshape back for the next MatMul. The reshapes sink below GELU and cancel, so GELU
    is the first matmul's epilogue (no function of its own), and the output is numpy's."""
    rng = np.random.default_rng(7)
    tokens, width, hidden = 10, 16, 32
    x = rng.normal(size=(tokens, width)).astype(np.float32)
    w1, b1 = rng.normal(size=(width, hidden)) * 0.3, rng.normal(size=hidden)
    w2 = rng.normal(size=(hidden, width)) * 0.3
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
             helper.make_node("Reshape", ["h", "s3"], ["h3"]),
             helper.make_node("Div", ["h3", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["h3", "e1"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["g"]),
             helper.make_node("Reshape", ["g", "s2"], ["g2"]), helper.make_node("MatMul", ["g2", "w2"], ["y"])]
    inits = [("w1", w1), ("b1", b1), ("w2", w2), ("sqrt2", np.array(math.sqrt(2.0))), ("one", np.array(1.0)),
             ("half", np.array(0.5))]
    model = _graph(nodes, {"x": x.shape}, (tokens, width), inits)
    model.graph.initializer.extend([numpy_helper.from_array(np.array([1, tokens, hidden], np.int64), "s3"),
                                    numpy_helper.from_array(np.array([tokens, hidden], np.int64), "s2")])
    cm = roller.compile_model(model, device, cache=False)
    h = x.astype(np.float64) @ w1 + b1
    gelu = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2.0)))
    np.testing.assert_allclose(cm.run({"x": x})[0], gelu @ w2, rtol=1e-4, atol=1e-4)
    names = [r.name for r in cm.report]
    erf = [n for n in names if "erf" in n]
    assert len(erf) == 1 and "matmul" in erf[0] and "reshape" not in erf[0], names


def test_power_by_three_becomes_products(device):
    """No function computes pow: the frontend's Pow by 3 is x * x * x before legalization."""
    model, feeds, ref, _, _ = _case_gelu_tanh(np.random.default_rng(2))
    cm = roller.compile_model(model, device, cache=False)
    np.testing.assert_allclose(cm.run({k: v.astype(np.float32) for k, v in feeds.items()})[0], ref, rtol=1e-4, atol=1e-4)
    assert not any("power" in r.name for r in cm.report), [r.name for r in cm.report]
