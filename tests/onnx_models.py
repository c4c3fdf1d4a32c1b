"""Small ONNX models built in code with ``onnx.helper`` (random weights, nothing downloaded), for the
Relax tests and benchmarks: a CNN and a transformer block."""
from __future__ import annotations

import numpy as np


def _init(name: str, array: np.ndarray):
    from onnx import numpy_helper

    return numpy_helper.from_array(np.asarray(array, dtype=np.float32), name)


def _model(nodes, inputs, outputs, inits, name: str, opset: int = 17):
    from onnx import helper

    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="roller-tests")
    model.ir_version = 8
    return model


def small_cnn(batch: int = 1, size: int = 32, channels: int = 16, classes: int = 10, seed: int = 0):
    """conv 3x3 + BatchNorm + ReLU, max pool, a residual block (conv + ReLU, conv + add + ReLU),
    a strided conv, global average pool, flatten, a Gemm classifier (NCHW, float32)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    c = channels
    w = lambda *s: rng.normal(0, (2.0 / np.prod(s[1:])) ** 0.5, s)  # noqa: E731  (He init keeps values O(1))
    inits = [
        _init("w0", w(c, 3, 3, 3)), _init("b0", rng.normal(0, 0.1, c)),
        _init("bn_s", rng.uniform(0.5, 1.5, c)), _init("bn_b", rng.normal(0, 0.1, c)),
        _init("bn_m", rng.normal(0, 0.1, c)), _init("bn_v", rng.uniform(0.5, 1.5, c)),
        _init("w1", w(c, c, 3, 3)), _init("b1", rng.normal(0, 0.1, c)),
        _init("w2", w(c, c, 3, 3)), _init("b2", rng.normal(0, 0.1, c)),
        _init("w3", w(2 * c, c, 3, 3)), _init("b3", rng.normal(0, 0.1, 2 * c)),
        _init("wf", rng.normal(0, 0.1, (classes, 2 * c))), _init("bf", rng.normal(0, 0.1, classes)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c0", "bn_s", "bn_b", "bn_m", "bn_v"], ["n0"]),
        helper.make_node("Relu", ["n0"], ["r0"]),
        helper.make_node("MaxPool", ["r0"], ["p0"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "p0"], ["a2"]),
        helper.make_node("Relu", ["a2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c3"], ["r3"]),
        helper.make_node("GlobalAveragePool", ["r3"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, size, size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, classes])
    return _model(nodes, [x], [y], inits, "small_cnn")


def transformer_block(seq: int = 16, dim: int = 32, heads: int = 2, hidden: int = 64, seed: int = 0):
    """One pre-norm transformer encoder block on [1, seq, dim]: LayerNorm, QKV projections, attention
    (scaled QK^T, softmax, V), output projection, residual add, LayerNorm, MLP with GELU (erf form),
    residual add (float32)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    hd = dim // heads
    mat = lambda r, c: rng.normal(0, r ** -0.5, (r, c))  # noqa: E731
    inits = [
        _init("ln1_g", rng.uniform(0.5, 1.5, dim)), _init("ln1_b", rng.normal(0, 0.1, dim)),
        _init("ln2_g", rng.uniform(0.5, 1.5, dim)), _init("ln2_b", rng.normal(0, 0.1, dim)),
        _init("wq", mat(dim, dim)), _init("bq", rng.normal(0, 0.1, dim)),
        _init("wk", mat(dim, dim)), _init("bk", rng.normal(0, 0.1, dim)),
        _init("wv", mat(dim, dim)), _init("bv", rng.normal(0, 0.1, dim)),
        _init("wo", mat(dim, dim)), _init("bo", rng.normal(0, 0.1, dim)),
        _init("w1", mat(dim, hidden)), _init("b1", rng.normal(0, 0.1, hidden)),
        _init("w2", mat(hidden, dim)), _init("b2", rng.normal(0, 0.1, dim)),
        _init("scale", np.array(hd ** -0.5)), _init("half", np.array(0.5)), _init("one", np.array(1.0)),
        _init("rsqrt2", np.array(2 ** -0.5)),
    ]
    from onnx import numpy_helper
    inits += [numpy_helper.from_array(np.array([1, seq, heads, hd], np.int64), "split_shape"),
              numpy_helper.from_array(np.array([1, seq, dim], np.int64), "merge_shape")]
    nodes = [helper.make_node("LayerNormalization", ["x", "ln1_g", "ln1_b"], ["h"], axis=-1, epsilon=1e-5)]
    for t in "qkv":
        nodes += [helper.make_node("MatMul", ["h", f"w{t}"], [f"{t}0"]),
                  helper.make_node("Add", [f"{t}0", f"b{t}"], [f"{t}1"]),
                  helper.make_node("Reshape", [f"{t}1", "split_shape"], [f"{t}2"]),
                  helper.make_node("Transpose", [f"{t}2"], [f"{t}3"],
                                   perm=[0, 2, 3, 1] if t == "k" else [0, 2, 1, 3])]
    nodes += [
        helper.make_node("MatMul", ["q3", "k3"], ["s0"]),
        helper.make_node("Mul", ["s0", "scale"], ["s1"]),
        helper.make_node("Softmax", ["s1"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v3"], ["o0"]),
        helper.make_node("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["o1", "merge_shape"], ["o2"]),
        helper.make_node("MatMul", ["o2", "wo"], ["o3"]),
        helper.make_node("Add", ["o3", "bo"], ["o4"]),
        helper.make_node("Add", ["x", "o4"], ["r1"]),
        helper.make_node("LayerNormalization", ["r1", "ln2_g", "ln2_b"], ["h2"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["h2", "w1"], ["m0"]),
        helper.make_node("Add", ["m0", "b1"], ["m1"]),
        helper.make_node("Mul", ["m1", "rsqrt2"], ["g0"]),
        helper.make_node("Erf", ["g0"], ["g1"]),
        helper.make_node("Add", ["g1", "one"], ["g2"]),
        helper.make_node("Mul", ["m1", "g2"], ["g3"]),
        helper.make_node("Mul", ["g3", "half"], ["g4"]),
        helper.make_node("MatMul", ["g4", "w2"], ["m2"]),
        helper.make_node("Add", ["m2", "b2"], ["m3"]),
        helper.make_node("Add", ["r1", "m3"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, dim])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, dim])
    return _model(nodes, [x], [y], inits, "transformer_block")
