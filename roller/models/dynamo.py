"""PyTorch without ONNX: a TorchDynamo backend that compiles each captured graph with roller.

    import torch, roller.models.dynamo           # the import registers the backend name "roller" too
    fast = torch.compile(model, backend="roller")  # or roller.models.dynamo.compile(model, example_inputs)
    y = fast(x)                                  # torch tensors in, torch tensors out

Dynamo hands :func:`roller_backend` each FX graph it captures with example inputs. The graph is imported
with TVM's ``from_fx`` at the example inputs' shapes and dtypes, its weights (the module's parameters and
buffers, which Dynamo passes as graph inputs) bound as constants, compiled by
:func:`roller.models.frontend.compile_model` (through the kernel cache by default), and run by the Relax VM.

- An eval batch norm after a convolution with constant weights is folded into its weight and bias before
  import (as the ONNX exporter does; else Relax fuses it apart from the convolution: ResNet-50 ran 44 fused
  functions instead of 29, about 10% slower).
- Weights are frozen at compile time: for inference. Changing a parameter in place afterwards is not seen
  (compile again); the returned callable ignores the weight arguments Dynamo passes.
- Inputs and outputs are torch CPU tensors, exchanged through DLPack without copies. An input is copied
  (once per call) only where TVM's DLPack import refuses it: non-contiguous, or data not 64-byte aligned (a
  view at an offset). Outputs are the VM's own tensors, shared with torch, not copied.
- Graphs it cannot handle run eagerly (``gm.forward``) with one ``warnings.warn`` naming the reason: an op
  ``from_fx`` does not import, symbolic shapes (Dynamo's recompile with ``dynamic`` shapes; static shapes
  only for now), non-CPU or non-tensor inputs, or a failure to compile.

torch is imported inside the functions only: roller does not depend on it (``pip install 'roller[torch]'``).
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence

BACKEND_NAME = "roller"
_ALIGNMENT = 64  # tvm.runtime.from_dlpack's required alignment (bytes)


class _Unsupported(Exception):
    """A graph this backend does not compile (the reason is the message)."""


def _is_weight(node, value) -> bool:
    """Whether a placeholder Dynamo lifted is a module parameter or buffer (bound as a constant)."""
    import torch

    if isinstance(value, torch.nn.Parameter):
        return True
    arg = node.meta.get("grapharg")
    name = arg.source.name if arg is not None and arg.source is not None else ""
    name = name() if callable(name) else str(name)
    return "._parameters[" in name or "._buffers[" in name


def _freeze_weights(gm, example_inputs):
    """A copy of ``gm`` whose weight placeholders are attributes (get_attr, which from_fx binds as
    constants); returns (the copy, the positions of the remaining inputs)."""
    import copy

    import torch

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise _Unsupported(f"{len(placeholders)} graph inputs against {len(example_inputs)} example inputs")
    graph = copy.deepcopy(gm.graph)
    frozen = torch.fx.GraphModule(gm, graph)
    nodes = [n for n in graph.nodes if n.op == "placeholder"]
    first = next(n for n in graph.nodes if n.op != "placeholder")
    keep = []
    for i, (node, orig, value) in enumerate(zip(nodes, placeholders, example_inputs)):
        if not isinstance(value, torch.Tensor):
            raise _Unsupported(f"input {orig.name} is a {type(value).__name__}, not a tensor: symbolic "
                               "shapes (Dynamo marks sizes dynamic when it recompiles; static shapes only: "
                               "torch.compile(..., dynamic=False))")
        if value.device.type != "cpu":
            raise _Unsupported(f"input {orig.name} is on {value.device}; roller's backend runs on the CPU")
        if _is_weight(orig, value):
            attr = f"_roller_weight_{i}"
            frozen.register_buffer(attr, value.detach())
            with graph.inserting_before(first):
                get = graph.get_attr(attr)
            node.replace_all_uses_with(get)
            graph.erase_node(node)
        else:
            keep.append(i)
    frozen.recompile()
    return frozen, keep


def _attr(gm, node):
    """The tensor a get_attr node names in ``gm`` (None for anything else: a weight computed at run time)."""
    if getattr(node, "op", None) != "get_attr":
        return None
    return getattr(gm, node.target)


def _fold_batch_norms(gm) -> int:
    """Folds each eval-mode ``batch_norm`` whose input is a ``conv2d`` (read by nothing else) with constant
    weights into that convolution's weight and bias, in place; returns how many.

    Why: from_fx imports the batch norm as its own op, which Relax's fusion leaves outside the convolution's
    function (a conv2d function, then a batch_norm(+add+relu) function: one more pass over every activation;
    torchvision's ResNet-50 had 44 fused functions, its ONNX export, where the exporter folds them, 29). Folded:
    w' = w * s per output channel, b' = (b - mean) * s + beta, with s = gamma / sqrt(var + eps)."""
    import torch

    names = ["input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps"]
    folded = 0
    for bn in list(gm.graph.nodes):
        if bn.op != "call_function" or bn.target is not torch.nn.functional.batch_norm:
            continue
        arg = {"weight": None, "bias": None, "training": False, "eps": 1e-5, **dict(zip(names, bn.args)), **bn.kwargs}
        conv = arg["input"]
        if (arg["training"] or getattr(conv, "op", None) != "call_function"
                or conv.target not in (torch.conv2d, torch.nn.functional.conv2d) or len(conv.users) != 1
                or conv.kwargs or len(conv.args) < 2):
            continue
        w, mean, var = _attr(gm, conv.args[1]), _attr(gm, arg["running_mean"]), _attr(gm, arg["running_var"])
        b = _attr(gm, conv.args[2]) if len(conv.args) > 2 and conv.args[2] is not None else None
        gamma = _attr(gm, arg["weight"]) if arg["weight"] is not None else None
        beta = _attr(gm, arg["bias"]) if arg["bias"] is not None else None
        if (w is None or mean is None or var is None or (b is None and len(conv.args) > 2 and conv.args[2] is not None)
                or (gamma is None and arg["weight"] is not None) or (beta is None and arg["bias"] is not None)):
            continue  # a weight that is not a constant
        scale = torch.rsqrt(var.double() + float(arg["eps"]))
        if gamma is not None:
            scale = scale * gamma.double()
        bias = ((b.double() if b is not None else torch.zeros_like(mean, dtype=torch.float64)) - mean.double()) * scale
        if beta is not None:
            bias = bias + beta.double()
        w_name, b_name = f"_roller_folded_w{folded}", f"_roller_folded_b{folded}"
        gm.register_buffer(w_name, (w.double() * scale.reshape(-1, *[1] * (w.dim() - 1))).to(w.dtype))
        gm.register_buffer(b_name, bias.to(w.dtype))
        with gm.graph.inserting_before(conv):
            w_node, b_node = gm.graph.get_attr(w_name), gm.graph.get_attr(b_name)
        args = list(conv.args) + [None] * (3 - len(conv.args))
        args[1], args[2] = w_node, b_node
        conv.args = tuple(args)
        bn.replace_all_uses_with(conv)
        gm.graph.erase_node(bn)
        folded += 1
    if folded:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return folded


def _batch_norm(node, importer):
    """``torch.nn.functional.batch_norm`` in eval mode (running statistics), which TVM 0.27's from_fx lacks
    (Dynamo's graphs call it rather than the nn.BatchNorm2d module from_fx knows)."""
    from tvm import relax

    names = ["input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps"]
    defaults = {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5}
    arg = {**defaults, **dict(zip(names, node.args)), **node.kwargs}
    if arg["training"]:
        raise ValueError("batch_norm in training mode (batch statistics) is not supported: call model.eval()")
    x = importer.env[arg["input"]]
    mean, var = importer.env[arg["running_mean"]], importer.env[arg["running_var"]]
    channels = (importer.shape_of(x)[1],)
    dtype = x.ty.dtype
    weight = importer.env[arg["weight"]] if arg["weight"] is not None else relax.op.ones(channels, dtype)
    bias = importer.env[arg["bias"]] if arg["bias"] is not None else relax.op.zeros(channels, dtype)
    out = importer.block_builder.emit(relax.op.nn.batch_norm(x, weight, bias, mean, var, axis=1,
                                                             epsilon=float(arg["eps"]), training=False))
    return importer.block_builder.emit(relax.TupleGetItem(out, 0))


def _hardtanh(node, importer):
    """``torch.nn.functional.hardtanh`` (nn.ReLU6 is hardtanh(x, 0, 6)) with its bounds read from the positional
    arguments too: TVM 0.27's from_fx reads them from keywords only, so Dynamo's ``hardtanh(x, 0.0, 6.0, False)``
    became clip(x, -1, 1) (MobileNetV2's outputs off by 34x their scale)."""
    from tvm import relax

    arg = {"min_val": -1.0, "max_val": 1.0, **dict(zip(["input", "min_val", "max_val"], node.args)), **node.kwargs}
    x = importer.env[arg["input"]]
    dtype = str(x.ty.dtype)
    # maximum then minimum, not relax.clip: ConvertLayout sees through these two (as the ONNX path's Clip
    # becomes), so ReLU6 stays a convolution's epilogue in NHWC instead of a function between two transposes
    low = importer.block_builder.emit(relax.op.maximum(x, relax.const(float(arg["min_val"]), dtype)))
    return importer.block_builder.emit(relax.op.minimum(low, relax.const(float(arg["max_val"]), dtype)))


def _to_tvm(t):
    """A torch CPU tensor as a TVM tensor sharing its memory; copied only where DLPack import refuses it."""
    import torch
    import tvm

    t = t.detach()
    if not t.is_contiguous() or t.data_ptr() % _ALIGNMENT:
        t = t.clone(memory_format=torch.contiguous_format)  # a fresh, aligned allocation
    return tvm.runtime.from_dlpack(t)


def _to_torch(result) -> list:
    import torch

    if hasattr(result, "__dlpack__"):
        return [torch.from_dlpack(result)]
    if isinstance(result, torch.Tensor):
        return [result]
    return [x for r in result for x in _to_torch(r)]


def _compile_graph(gm, example_inputs, options: dict) -> Callable:
    try:
        from tvm.relax.frontend.torch import from_fx
    except ImportError as e:  # pragma: no cover (TVM without its torch frontend)
        raise _Unsupported(f"TVM's torch frontend does not import: {e}") from e

    from roller.models.frontend import compile_model

    frozen, keep = _freeze_weights(gm, example_inputs)
    _fold_batch_norms(frozen)
    input_info = []
    for i in keep:
        t = example_inputs[i]
        if any(not isinstance(s, int) for s in t.shape):
            raise _Unsupported("symbolic shapes (static shapes only)")
        input_info.append((tuple(t.shape), str(t.dtype).removeprefix("torch.")))
    try:
        mod = from_fx(frozen, input_info, custom_convert_map={"batch_norm": _batch_norm, "hardtanh": _hardtanh})
    except Exception as e:
        raise _Unsupported(f"TVM's from_fx does not import the graph: {type(e).__name__}: {e}") from e
    try:
        cm = compile_model(mod, **{"name": "torch_graph", **options})
    except Exception as e:
        raise _Unsupported(f"compiling failed: {type(e).__name__}: {e}") from e
    main = cm.vm()["main"]
    n_out = sum(1 for _ in _outputs(gm))

    def run(*args):
        out = _to_torch(main(*[_to_tvm(args[i]) for i in keep]))
        if len(out) != n_out:  # pragma: no cover (a nested output structure this version does not rebuild)
            raise RuntimeError(f"roller: {len(out)} outputs against the graph's {n_out}")
        return tuple(out)

    run.compiled_model = cm  # the report, the seconds
    return run


def _outputs(gm):
    """The graph's output values (Dynamo's graphs return a flat tuple)."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    args = out.args[0]
    return args if isinstance(args, (tuple, list)) else (args,)


def roller_backend(gm, example_inputs: Sequence[Any], options: dict | None = None) -> Callable:
    """The TorchDynamo backend: ``torch.compile(model, backend=roller_backend)`` (or ``backend="roller"``).

    Returns a callable running ``gm`` compiled by roller (see the module's docstring), or ``gm.forward``
    with one warning naming the reason where the graph cannot be imported or compiled. ``options`` (what
    ``torch.compile(..., options={...})`` passes) go to :func:`roller.models.frontend.compile_model`.
    """
    import torch

    outs = list(_outputs(gm))
    if any(not isinstance(o, torch.fx.Node) for o in outs):
        reason = "the graph returns non-tensor values"
    else:
        try:
            return _compile_graph(gm, list(example_inputs), dict(options or {}))
        except _Unsupported as e:
            reason = str(e)
    first = reason.splitlines()[0] if reason else "unknown"
    warnings.warn(f"roller: running this graph eagerly: {first}", RuntimeWarning, stacklevel=2)
    return gm.forward


def register() -> None:
    """Registers the backend name "roller" with Dynamo (the package's entry point does it for an
    installed roller; this covers a source checkout on PYTHONPATH). Idempotent."""
    from torch._dynamo import list_backends, register_backend

    if BACKEND_NAME not in list_backends(exclude_tags=()):
        register_backend(roller_backend, name=BACKEND_NAME)


def compile(model, example_inputs: Sequence[Any] | None = None, **options) -> Callable:  # noqa: A001
    """``torch.compile(model, backend="roller", dynamic=False)``: static shapes, one compile per new input
    shape. With ``example_inputs`` the model is compiled (called once) here rather than at its first call.
    ``options`` go to :func:`roller.models.frontend.compile_model` (e.g. ``device``, ``cache``)."""
    import torch

    register()
    compiled = torch.compile(model, backend=BACKEND_NAME, dynamic=False, options=options or None)
    if example_inputs is not None:
        with torch.no_grad():
            compiled(*example_inputs)
    return compiled
