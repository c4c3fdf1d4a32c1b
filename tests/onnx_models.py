"""Small ONNX models built in code with ``onnx.helper`` (random weights, nothing downloaded), for the
Relax tests and benchmarks: CNNs, transformer blocks, and the blocks of real architectures (MBConv
with squeeze-and-excitation, grouped and channel-shuffle convolutions)."""
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


def conv_chain(size: int = 12, channels: int = 16, seed: int = 0):
    """Two 3x3 convolutions in a row, no activation between (NCHW, float32): quantized, the second one's
    input has a nonzero zero point, so its padding holds that zero point (roller.models.qdq)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    c = channels
    inits = [_init("w0", rng.normal(0, 0.2, (c, c, 3, 3))), _init("b0", rng.normal(0, 0.1, c)),
             _init("w1", rng.normal(0, 0.2, (c, c, 3, 3))), _init("b1", rng.normal(0, 0.1, c))]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c0", "w1", "b1"], ["y"], pads=[1, 1, 1, 1])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, size, size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, size, size])
    return _model(nodes, [x], [y], inits, "conv_chain")


def transformer_block(seq: int = 16, dim: int = 32, heads: int = 2, hidden: int = 64, seed: int = 0,
                      batch: int = 1):
    """One pre-norm transformer encoder block on [batch, seq, dim] (see :func:`transformer_encoder`)."""
    return transformer_encoder(1, seq, dim, heads, hidden, seed, name="transformer_block", batch=batch)


def transformer_encoder(layers: int = 1, seq: int = 16, dim: int = 32, heads: int = 2, hidden: int = 64,
                        seed: int = 0, name: str = "transformer_encoder", batch: int = 1):
    """``layers`` pre-norm transformer encoder blocks on [batch, seq, dim]: LayerNorm, QKV projections,
    attention (scaled QK^T, softmax, V), output projection, residual add, LayerNorm, MLP with GELU (erf
    form), residual add (float32). BERT-base is layers=12, seq=128, dim=768, heads=12, hidden=3072."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    hd = dim // heads
    inits = [_init("scale", np.array(hd ** -0.5)), _init("half", np.array(0.5)), _init("one", np.array(1.0)),
             _init("rsqrt2", np.array(2 ** -0.5)),
             numpy_helper.from_array(np.array([batch, seq, heads, hd], np.int64), "split_shape"),
             numpy_helper.from_array(np.array([batch, seq, dim], np.int64), "merge_shape")]
    nodes = []
    x = "x"
    for n in range(layers):
        p = f"l{n}_"
        inits += _block_weights(rng, p, dim, hidden, [("q", dim), ("k", dim), ("v", dim)])
        nodes.append(helper.make_node("LayerNormalization", [x, p + "ln1_g", p + "ln1_b"], [p + "h"], axis=-1,
                                      epsilon=1e-5))
        for t in "qkv":
            nodes += [helper.make_node("MatMul", [p + "h", p + f"w{t}"], [p + f"{t}0"]),
                      helper.make_node("Add", [p + f"{t}0", p + f"b{t}"], [p + f"{t}1"]),
                      helper.make_node("Reshape", [p + f"{t}1", "split_shape"], [p + f"{t}2"]),
                      helper.make_node("Transpose", [p + f"{t}2"], [p + f"{t}3"],
                                       perm=[0, 2, 3, 1] if t == "k" else [0, 2, 1, 3])]
        out = "y" if n == layers - 1 else p + "out"
        nodes += _attention_mlp(p, x, p + "k3", p + "v3", out, [
            helper.make_node("Mul", [p + "m1", "rsqrt2"], [p + "g0"]),
            helper.make_node("Erf", [p + "g0"], [p + "g1"]),
            helper.make_node("Add", [p + "g1", "one"], [p + "g2"]),
            helper.make_node("Mul", [p + "m1", p + "g2"], [p + "g3"]),
            helper.make_node("Mul", [p + "g3", "half"], [p + "g4"])])
        x = out
    xi = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, dim])
    yo = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, dim])
    return _model(nodes, [xi], [yo], inits, name)


def _block_weights(rng, p: str, dim: int, hidden: int, projections, out_gain: float = 1.0) -> list:
    """A pre-norm block's initializers, prefixed ``p``: two LayerNorms, the input projections
    ``projections`` ((name, columns): ``w<name>`` [dim, columns] and ``b<name>``), the output projection
    ``wo``, the MLP's ``w1`` / ``w2`` (``out_gain`` scales wo and w2, keeping deep residual sums O(1))."""
    def mat(r, c, gain=1.0):
        return rng.normal(0, r ** -0.5, (r, c)) * gain

    out = [_init(p + "ln1_g", rng.uniform(0.5, 1.5, dim)), _init(p + "ln1_b", rng.normal(0, 0.1, dim)),
           _init(p + "ln2_g", rng.uniform(0.5, 1.5, dim)), _init(p + "ln2_b", rng.normal(0, 0.1, dim))]
    for name, cols in projections:
        out += [_init(p + f"w{name}", mat(dim, cols)), _init(p + f"b{name}", rng.normal(0, 0.1, cols))]
    return out + [_init(p + "wo", mat(dim, dim, out_gain)), _init(p + "bo", rng.normal(0, 0.1, dim)),
                  _init(p + "w1", mat(dim, hidden)), _init(p + "b1", rng.normal(0, 0.1, hidden)),
                  _init(p + "w2", mat(hidden, dim, out_gain)), _init(p + "b2", rng.normal(0, 0.1, dim))]


def _attention_mlp(p: str, x: str, kt: str, v: str, out: str, gelu: list) -> list:
    """The nodes of a pre-norm block after its Q, K^T and V heads (``p + "q3"``, ``kt``, ``v``): scaled
    scores, softmax, .V, heads merged, output projection, residual from ``x``, LayerNorm, MLP in (``p +
    "m1"``), ``gelu`` (nodes from ``p + "m1"`` to ``p + "g4"``), MLP out, residual into ``out``."""
    from onnx import helper

    return [
        helper.make_node("MatMul", [p + "q3", kt], [p + "s0"]),
        helper.make_node("Mul", [p + "s0", "scale"], [p + "s1"]),
        helper.make_node("Softmax", [p + "s1"], [p + "p"], axis=-1),
        helper.make_node("MatMul", [p + "p", v], [p + "o0"]),
        helper.make_node("Transpose", [p + "o0"], [p + "o1"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", [p + "o1", "merge_shape"], [p + "o2"]),
        helper.make_node("MatMul", [p + "o2", p + "wo"], [p + "o3"]),
        helper.make_node("Add", [p + "o3", p + "bo"], [p + "o4"]),
        helper.make_node("Add", [x, p + "o4"], [p + "r1"]),
        helper.make_node("LayerNormalization", [p + "r1", p + "ln2_g", p + "ln2_b"], [p + "h2"], axis=-1,
                         epsilon=1e-5),
        helper.make_node("MatMul", [p + "h2", p + "w1"], [p + "m0"]),
        helper.make_node("Add", [p + "m0", p + "b1"], [p + "m1"]),
        *gelu,
        helper.make_node("MatMul", [p + "g4", p + "w2"], [p + "m2"]),
        helper.make_node("Add", [p + "m2", p + "b2"], [p + "m3"]),
        helper.make_node("Add", [p + "r1", p + "m3"], [out]),
    ]


def resnet50(batch: int = 1, size: int = 224, classes: int = 1000, width: int = 64, seed: int = 0):
    """A ResNet-50 v1.5 (torchvision's layout: 7x7/2 stem, 3x3/2 max pool, bottlenecks [3, 4, 6, 3] with
    the stride on the 3x3 conv, global average pool, FC) with batch norm folded into the convolutions, as
    an eval-mode export gives; random weights (each residual branch's last conv scaled down so that the
    activations stay O(1) through 16 residual adds). ``width`` scales the channels (64 is the real net)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    count = [0]

    def conv(x, cin, cout, k, stride=1, relu=True, gain=1.0):
        i = count[0]
        count[0] += 1
        w = rng.normal(0, gain * (2.0 / (cin * k * k)) ** 0.5, (cout, cin, k, k))
        inits.extend([_init(f"w{i}", w), _init(f"b{i}", rng.normal(0, 0.05, cout))])
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], kernel_shape=[k, k],
                                      strides=[stride, stride], pads=[k // 2] * 4))
        if not relu:
            return f"c{i}"
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        return f"r{i}"

    x = conv("x", 3, width, 7, 2)
    nodes.append(helper.make_node("MaxPool", [x], ["pool"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
    x, cin = "pool", width
    for stage, blocks in enumerate([3, 4, 6, 3]):
        mid = width * 2 ** stage
        for b in range(blocks):
            stride = 2 if b == 0 and stage > 0 else 1
            h = conv(x, cin, mid, 1)
            h = conv(h, mid, mid, 3, stride)
            h = conv(h, mid, mid * 4, 1, relu=False, gain=0.2)
            skip = conv(x, cin, mid * 4, 1, stride, relu=False) if b == 0 else x
            n = len(nodes)
            nodes += [helper.make_node("Add", [h, skip], [f"a{n}"]), helper.make_node("Relu", [f"a{n}"], [f"o{n}"])]
            x, cin = f"o{n}", mid * 4
    inits += [_init("wf", rng.normal(0, cin ** -0.5, (classes, cin))), _init("bf", rng.normal(0, 0.05, classes))]
    nodes += [helper.make_node("GlobalAveragePool", [x], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
              helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1)]
    xi = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, size, size])
    yo = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, classes])
    return _model(nodes, [xi], [yo], inits, "resnet50")


def mobilenet_v2(batch: int = 1, size: int = 224, classes: int = 1000, width: float = 1.0, seed: int = 0):
    """A MobileNetV2 (torchvision's layout: 3x3/2 stem, inverted residual blocks (1x1 expand, 3x3
    depthwise, 1x1 project, residual add where shapes allow), 1x1 conv to 1280, global average pool, FC)
    with batch norm folded into the convolutions and ReLU6 as Clip(0, 6); random weights (each block's
    projection scaled down so that the residual sums stay O(1)). ``width`` scales the channels."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    inits = [_init("zero", np.array(0.0)), _init("six", np.array(6.0))]
    nodes = []
    count = [0]

    def conv(x, cin, cout, k, stride=1, groups=1, relu6=True, gain=1.0):
        i = count[0]
        count[0] += 1
        w = rng.normal(0, gain * (2.0 / (cin // groups * k * k)) ** 0.5, (cout, cin // groups, k, k))
        inits.extend([_init(f"w{i}", w), _init(f"b{i}", rng.normal(0, 0.05, cout))])
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], kernel_shape=[k, k],
                                      strides=[stride, stride], pads=[k // 2] * 4, group=groups))
        if not relu6:
            return f"c{i}"
        nodes.append(helper.make_node("Clip", [f"c{i}", "zero", "six"], [f"r{i}"]))
        return f"r{i}"

    def ch(c):
        return max(8, int(c * width + 4) // 8 * 8)  # torchvision's _make_divisible(c * width, 8)

    x, cin = conv("x", 3, ch(32), 3, 2), ch(32)
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)]:
        cout = ch(c)
        for b in range(n):
            stride = s if b == 0 else 1
            h = conv(x, cin, cin * t, 1) if t != 1 else x
            h = conv(h, cin * t, cin * t, 3, stride, groups=cin * t)
            h = conv(h, cin * t, cout, 1, relu6=False, gain=0.3)
            if stride == 1 and cin == cout:
                nodes.append(helper.make_node("Add", [h, x], [f"a{len(nodes)}"]))
                h = f"a{len(nodes) - 1}"
            x, cin = h, cout
    x = conv(x, cin, 1280, 1)
    inits += [_init("wf", rng.normal(0, 1280 ** -0.5, (classes, 1280))), _init("bf", rng.normal(0, 0.05, classes))]
    nodes += [helper.make_node("GlobalAveragePool", [x], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
              helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1)]
    xi = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, size, size])
    yo = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, classes])
    return _model(nodes, [xi], [yo], inits, "mobilenet_v2")


def gpt2_decoder(layers: int = 1, past: int = 32, dim: int = 768, heads: int = 12, seed: int = 0,
                 name: str = "gpt2_decoder", batch: int = 1):
    """``layers`` GPT-2 decoder blocks for one new token (decode, sequence 1) attending over a KV cache of
    ``past`` earlier tokens plus itself: LayerNorm, the fused QKV projection (dim -> 3 dim, Split), the new
    key and value appended to the cache (Concat), scaled q.K^T, softmax, .V, output projection, residual,
    LayerNorm, MLP (dim -> 4 dim, GELU in GPT-2's tanh form, -> dim), residual (float32). Inputs: ``x``
    [batch, 1, dim] and per layer ``past_k{n}`` / ``past_v{n}`` [batch, heads, past, dim / heads]; output ``y``
    (``batch`` sequences decoded at once, each over its own cache)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    hd, hidden = dim // heads, 4 * dim
    inits = [_init("scale", np.array(hd ** -0.5)), _init("half", np.array(0.5)), _init("one", np.array(1.0)),
             _init("c0", np.array((2 / np.pi) ** 0.5)), _init("c1", np.array(0.044715)),
             numpy_helper.from_array(np.array([dim] * 3, np.int64), "qkv_split"),
             numpy_helper.from_array(np.array([batch, 1, heads, hd], np.int64), "split_shape"),
             numpy_helper.from_array(np.array([batch, 1, dim], np.int64), "merge_shape")]
    nodes, inputs = [], []
    x = "x"
    for n in range(layers):
        p = f"l{n}_"
        inits += _block_weights(rng, p, dim, hidden, [("qkv", 3 * dim)], out_gain=0.3)
        inputs += [helper.make_tensor_value_info(f"past_{t}{n}", TensorProto.FLOAT, [batch, heads, past, hd])
                   for t in "kv"]
        nodes += [
            helper.make_node("LayerNormalization", [x, p + "ln1_g", p + "ln1_b"], [p + "h"], axis=-1, epsilon=1e-5),
            helper.make_node("MatMul", [p + "h", p + "wqkv"], [p + "qkv0"]),
            helper.make_node("Add", [p + "qkv0", p + "bqkv"], [p + "qkv"]),
            helper.make_node("Split", [p + "qkv", "qkv_split"], [p + "q1", p + "k1", p + "v1"], axis=-1),
        ]
        for t in "qkv":
            nodes += [helper.make_node("Reshape", [p + f"{t}1", "split_shape"], [p + f"{t}2"]),
                      helper.make_node("Transpose", [p + f"{t}2"], [p + f"{t}3"], perm=[0, 2, 1, 3])]
        out = "y" if n == layers - 1 else p + "out"
        nodes += [
            helper.make_node("Concat", [f"past_k{n}", p + "k3"], [p + "k4"], axis=2),
            helper.make_node("Concat", [f"past_v{n}", p + "v3"], [p + "v4"], axis=2),
            helper.make_node("Transpose", [p + "k4"], [p + "k5"], perm=[0, 1, 3, 2]),
        ]
        # GELU, tanh form: 0.5 m (1 + tanh(sqrt(2 / pi) (m + 0.044715 m^3)))
        nodes += _attention_mlp(p, x, p + "k5", p + "v4", out, [
            helper.make_node("Mul", [p + "m1", p + "m1"], [p + "ga"]),
            helper.make_node("Mul", [p + "ga", p + "m1"], [p + "gb"]),
            helper.make_node("Mul", [p + "gb", "c1"], [p + "gc"]),
            helper.make_node("Add", [p + "m1", p + "gc"], [p + "gd"]),
            helper.make_node("Mul", [p + "gd", "c0"], [p + "ge"]),
            helper.make_node("Tanh", [p + "ge"], [p + "g1"]),
            helper.make_node("Add", [p + "g1", "one"], [p + "g2"]),
            helper.make_node("Mul", [p + "m1", p + "g2"], [p + "g3"]),
            helper.make_node("Mul", [p + "g3", "half"], [p + "g4"])])
        x = out
    xi = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 1, dim])
    yo = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 1, dim])
    return _model(nodes, [xi] + inputs, [yo], inits, name)


def chunk_shuffle(channels: int = 8, size: int = 4, seed: int = 0):
    """ShuffleNet v2's unit as PyTorch's TorchScript exporter writes it: ``x.chunk(2, dim=1)`` becomes two
    Slices whose bounds come from Shape -> Gather -> Add -> Div -> Mul, the second half goes through a
    1x1 conv + ReLU, the halves are concatenated and channel-shuffled (Reshape to 5-d, Transpose,
    Reshape back). TVM's importer leaves the Slices' shapes unknown and the reshape after the Concat
    then fails to legalize (``emit_te now only supports Tensor that has ShapeExpr shape``)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    c, half = channels, channels // 2
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    inits = [_init("w0", rng.normal(0, 0.3, (c, c, 1, 1))), _init("w1", rng.normal(0, 0.3, (half, half, 1, 1))),
             i64("axis", [1]), i64("zero", [0]), i64("one", [1]), i64("two", [2]),
             i64("shape5", [1, 2, half, size, size]), i64("shape4", [1, c, size, size])]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"]),
        helper.make_node("Shape", ["c0"], ["s"]),
        helper.make_node("Gather", ["s", "axis"], ["n"], axis=0),
        helper.make_node("Add", ["n", "one"], ["n1"]),
        helper.make_node("Div", ["n1", "two"], ["step"]),
        helper.make_node("Mul", ["step", "one"], ["mid"]),
        helper.make_node("Mul", ["step", "two"], ["end"]),
        helper.make_node("Slice", ["c0", "zero", "mid", "axis"], ["a"]),
        helper.make_node("Slice", ["c0", "mid", "end", "axis"], ["b"]),
        helper.make_node("Conv", ["b", "w1"], ["cb"]),
        helper.make_node("Relu", ["cb"], ["rb"]),
        helper.make_node("Concat", ["a", "rb"], ["cat"], axis=1),
        helper.make_node("Reshape", ["cat", "shape5"], ["r5"]),
        helper.make_node("Transpose", ["r5"], ["t5"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t5", "shape4"], ["y"]),
    ]
    xi = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, size, size])
    yo = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, size, size])
    return _model(nodes, [xi], [yo], inits, "chunk_shuffle")


def mbconv_se(batch: int = 1, size: int = 16, channels: int = 16, expand: int = 4, seed: int = 0):
    """EfficientNet's MBConv block as torchvision exports it: 1x1 expand + SiLU (Sigmoid, Mul), 3x3
    depthwise + SiLU, squeeze-and-excitation (GlobalAveragePool, 1x1 conv + SiLU, 1x1 conv + Sigmoid, a Mul
    of the feature map by the per-channel gate), 1x1 project, residual add (NCHW, float32, bias on every
    conv as after batch-norm folding)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    c, e = channels, channels * expand
    s = max(1, c // 4)
    w = lambda *sh: rng.normal(0, (2.0 / np.prod(sh[1:])) ** 0.5, sh)  # noqa: E731
    b = lambda n: rng.normal(0, 0.1, n)  # noqa: E731
    inits = [_init("we", w(e, c, 1, 1)), _init("be", b(e)), _init("wd", w(e, 1, 3, 3)), _init("bd", b(e)),
             _init("ws", w(s, e, 1, 1)), _init("bs", b(s)), _init("wx", w(e, s, 1, 1)), _init("bx", b(e)),
             _init("wp", 0.3 * w(c, e, 1, 1)), _init("bp", b(c))]

    def silu(x, out):
        return [helper.make_node("Sigmoid", [x], [out + "_s"]), helper.make_node("Mul", [x, out + "_s"], [out])]

    nodes = [helper.make_node("Conv", ["x", "we", "be"], ["ce"]), *silu("ce", "he"),
             helper.make_node("Conv", ["he", "wd", "bd"], ["cd"], pads=[1, 1, 1, 1], group=e), *silu("cd", "hd"),
             helper.make_node("GlobalAveragePool", ["hd"], ["g"]),
             helper.make_node("Conv", ["g", "ws", "bs"], ["cs"]), *silu("cs", "hs"),
             helper.make_node("Conv", ["hs", "wx", "bx"], ["cx"]), helper.make_node("Sigmoid", ["cx"], ["gate"]),
             helper.make_node("Mul", ["hd", "gate"], ["se"]),
             helper.make_node("Conv", ["se", "wp", "bp"], ["cp"]), helper.make_node("Add", ["cp", "x"], ["y"])]
    xi = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, c, size, size])
    yo = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, c, size, size])
    return _model(nodes, [xi], [yo], inits, "mbconv_se")


def grouped_conv(channels: int = 48, groups: int = 6, size: int = 14, stride: int = 2, seed: int = 0):
    """RegNet's / ResNeXt's grouped 3x3 convolution (not depthwise: 8 input channels a group) + bias + ReLU,
    NCHW, float32."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    c, out = channels, (size + 2 - 3) // stride + 1
    inits = [_init("w", rng.normal(0, (2.0 / (9 * c // groups)) ** 0.5, (c, c // groups, 3, 3))),
             _init("b", rng.normal(0, 0.1, c))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[stride, stride],
                              group=groups), helper.make_node("Relu", ["c"], ["y"])]
    xi = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, size, size])
    yo = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, out, out])
    return _model(nodes, [xi], [yo], inits, "grouped_conv")


def quantized_dynamic(model, per_channel: bool = False, weight_type: str = "QInt8"):
    """``model`` through onnxruntime's ``quantize_dynamic``: each MatMul with a constant weight becomes
    DynamicQuantizeLinear (the activation to uint8, scale and zero point computed per call) + MatMulInteger
    (u8 x ``weight_type`` -> int32) + a float rescale; what CPU inference servers run for transformers."""
    import tempfile
    from pathlib import Path

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(prefix="roller-quant-") as tmp:
        src, dst = Path(tmp) / "model.onnx", Path(tmp) / "model_int8.onnx"
        onnx.save(model, str(src))
        quantize_dynamic(str(src), str(dst), per_channel=per_channel, weight_type=getattr(QuantType, weight_type))
        out = onnx.load(str(dst))
    out.graph.name = f"{model.graph.name}_int8"
    return out


def matmul_integer(w: np.ndarray, zb=None, za: bool = False, m: int = 24):
    """One MatMulInteger: a uint8 activation [1, m, K] (zero point 3 where ``za``) times the constant 8-bit
    weight ``w`` [K, N] (zero point ``zb``: None, a scalar or one per column) -> int32 [1, m, N]."""
    from onnx import TensorProto, helper, numpy_helper

    k, n = w.shape
    inits = [numpy_helper.from_array(w, "w")]
    ins = ["a", "w"]
    if za or zb is not None:
        inits.append(numpy_helper.from_array(np.array(3, np.uint8), "za"))
        ins.append("za" if za else "")
    if zb is not None:
        inits.append(numpy_helper.from_array(np.asarray(zb, w.dtype), "zb"))
        ins.append("zb")
    node = helper.make_node("MatMulInteger", ins, ["y"])
    graph = helper.make_graph([node], "mmi", [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [1, m, n])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def quantized_qdq(model, samples: int = 4, seed: int = 0, per_channel: bool = False):
    """``model`` through onnxruntime's ``quantize_static`` in the QDQ format (QuantizeLinear /
    DequantizeLinear pairs around each quantized operator: uint8 activations, int8 weights), calibrated
    on ``samples`` random inputs of the model's (static) input shapes."""
    import tempfile
    from pathlib import Path

    import onnx
    from onnx import helper
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(seed)
    inputs = {i.name: ([d.dim_value for d in i.type.tensor_type.shape.dim],
                       helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)) for i in model.graph.input}
    feeds = [{n: rng.uniform(-1, 1, s).astype(t) for n, (s, t) in inputs.items()} for _ in range(samples)]

    class _Reader(CalibrationDataReader):
        def __init__(self):
            self._it = iter(feeds)

        def get_next(self):
            return next(self._it, None)

    with tempfile.TemporaryDirectory(prefix="roller-quant-") as tmp:
        src, dst = Path(tmp) / "model.onnx", Path(tmp) / "model_qdq.onnx"
        onnx.save(model, str(src))
        quantize_static(str(src), str(dst), _Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        out = onnx.load(str(dst))
    out.graph.name = f"{model.graph.name}_qdq"
    return out
