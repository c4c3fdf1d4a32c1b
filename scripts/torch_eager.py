"""An ONNX graph run node by node with PyTorch eager on the CPU: the PyTorch column of
scripts/bench_models.py, with the very weights and graph roller and onnxruntime run (the models are built
with onnx.helper, so there is no torch model to start from).

Only the operators of tests/onnx_models.py are mapped; another one raises KeyError naming it. Each node
becomes the torch function a PyTorch model would call (F.conv2d, F.layer_norm, torch.softmax...), in
NCHW as the graph has it, under ``torch.inference_mode``.
"""
from __future__ import annotations

import numpy as np


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _conv(torch, F, x, w, b=None, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1, **_):
    if pads[:2] != pads[2:]:
        raise KeyError("Conv with asymmetric pads")
    return F.conv2d(x, w, b, tuple(strides), tuple(pads[:2]), tuple(dilations), group)


def _gemm(torch, F, a, b, c=None, transA=0, transB=0, alpha=1.0, beta=1.0, **_):
    a = a.t() if transA else a
    y = alpha * (a @ (b.t() if transB else b))
    return y if c is None else y + beta * c


def _reshape(torch, F, x, shape, **_):
    dims = [int(d) if int(d) != 0 else x.shape[i] for i, d in enumerate(shape.tolist())]
    return x.reshape(dims)


OPS = {
    "Conv": _conv,
    "Gemm": _gemm,
    "Reshape": _reshape,
    "BatchNormalization": lambda torch, F, x, s, b, m, v, epsilon=1e-5, **_: F.batch_norm(x, m, v, s, b, False, 0.0,
                                                                                          epsilon),
    "Relu": lambda torch, F, x, **_: torch.relu(x),
    "Clip": lambda torch, F, x, lo=None, hi=None, **_: torch.clamp(x, lo, hi),
    "MaxPool": lambda torch, F, x, kernel_shape, strides=(1, 1), pads=(0, 0, 0, 0), **_: F.max_pool2d(
        x, tuple(kernel_shape), tuple(strides), tuple(pads[:2])),
    "GlobalAveragePool": lambda torch, F, x, **_: x.mean((2, 3), keepdim=True),
    "Flatten": lambda torch, F, x, axis=1, **_: torch.flatten(x, axis),
    "MatMul": lambda torch, F, a, b, **_: torch.matmul(a, b),
    "Add": lambda torch, F, a, b, **_: a + b,
    "Sub": lambda torch, F, a, b, **_: a - b,
    "Mul": lambda torch, F, a, b, **_: a * b,
    "Div": lambda torch, F, a, b, **_: a / b,
    "Erf": lambda torch, F, x, **_: torch.erf(x),
    "Tanh": lambda torch, F, x, **_: torch.tanh(x),
    "Sqrt": lambda torch, F, x, **_: torch.sqrt(x),
    "Softmax": lambda torch, F, x, axis=-1, **_: torch.softmax(x, axis),
    "Transpose": lambda torch, F, x, perm, **_: x.permute(*perm),
    "LayerNormalization": lambda torch, F, x, g, b=None, axis=-1, epsilon=1e-5, **_: F.layer_norm(
        x, x.shape[axis:], g, b, epsilon),
    "Split": lambda torch, F, x, split, axis=0, **_: torch.split(x, split.tolist(), axis),
    "Concat": lambda torch, F, *xs, axis, **_: torch.cat(xs, axis),
}


def torch_runner(proto, threads: int):
    """A callable ``run(feeds: dict name -> numpy) -> list of numpy outputs`` running ``proto`` with
    PyTorch eager on ``threads`` threads, and a ``timed(feeds, threads=threads)`` factory of a no-argument
    callable that runs it on inputs already converted (for timing), on that many threads."""
    import torch
    import torch.nn.functional as F
    from onnx import numpy_helper

    consts = {i.name: torch.from_numpy(np.array(numpy_helper.to_array(i))) for i in proto.graph.initializer}
    nodes = list(proto.graph.node)
    missing = sorted({n.op_type for n in nodes} - set(OPS))
    if missing:
        raise KeyError(f"no PyTorch mapping for ONNX operator(s) {', '.join(missing)}")
    outputs = [o.name for o in proto.graph.output]

    def forward(tensors: dict):
        env = dict(consts)
        env.update(tensors)
        for n in nodes:
            args = [env[i] if i else None for i in n.input]
            result = OPS[n.op_type](torch, F, *args, **_attrs(n))
            for name, value in zip(n.output, result if isinstance(result, (tuple, list)) else [result]):
                env[name] = value
        return [env[o] for o in outputs]

    def timed(feeds, threads: int = threads):
        tensors = {k: torch.from_numpy(np.asarray(v, order="C")) for k, v in feeds.items()}

        def run():
            torch.set_num_threads(threads)  # per call: two runners may time different counts in turn
            with torch.inference_mode():
                return forward(tensors)
        return run

    def run(feeds):
        return [t.numpy() for t in timed(feeds)()]

    run.timed = timed
    return run
