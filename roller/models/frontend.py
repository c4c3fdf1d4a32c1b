"""Whole models: import (ONNX, or a Relax IRModule such as ``from_exported_program`` gives), legalize and
fuse with Relax, schedule every fused function (:mod:`roller.models.relax_pass`), build, run, and compare with
onnxruntime.

    import roller
    cm = roller.compile_model("model.onnx", inputs={"x": (1, 3, 224, 224)})
    outputs = cm.run(cm.random_inputs())        # numpy in, numpy out
    cm.report                                   # per fused function: which rule, seconds, why
    cm.export("out/")                           # a library relax.VirtualMachine loads

The Relax steps are TVM's CPU pipeline (``relax.backend.cpu_generic``) split in two: its dispatch and
legalize passes (LegalizeOps, AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR) run first, and
reshapes that only change the view become runtime reshapes (RewriteDataflowReshape) before scheduling so
that no copy kernel is scheduled for them; the scheduled module then goes through the pipeline's
lowering and finalization passes.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from roller.device.load import load_device
from roller.device.spec import Device
from roller.errors import ModelError
from roller.measure.timing import fastest_peer, paired_ratio, time_rounds
from roller.models.relax_pass import PROFILE_BUDGET_SECONDS
from roller.models.relax_steps import build_module, legalize_and_fuse, random_arrays, relax_inputs

# Model outputs against onnxruntime, per output: max|ours - theirs| <= tol * max|theirs|, tol by dtype (see
# compare). Looser than a single kernel's check (roller.measure.verify.TOLERANCE): a model chains dozens of
# reductions whose summation order differs from onnxruntime's.
MODEL_TOLERANCE = {"float64": 1e-6, "float32": 1e-3, "float16": 2e-2}
TOLERANCE_RULE = "max|ours - onnxruntime| <= tol * max|onnxruntime| per output (tol by dtype; other dtypes: equal)"
# Quantized graphs (an operator of QUANTIZED_OPERATORS): float outputs within 2% of the largest reference output,
# about 2.5 steps of an 8-bit quantizer spanning +-max|onnxruntime| (one step: 2/255 of it). The integer parts
# agree exactly on equal inputs (tests/test_quantized.py), but a float difference of ~1e-7 upstream (a layer
# norm's summation order) moves a value across a rounding boundary now and then, and one step of difference
# cascades through the layers after it: a 12-layer BERT-like encoder from quantize_dynamic ends 1.5% of its
# largest output apart, 3 layers 0.6%, 1 layer 2e-7 (docs/models.md, "Quantized graphs"). A wrong zero point or
# scale is off by far more. Integer outputs stay exact.
QUANTIZED_TOLERANCE = {"float64": 2e-2, "float32": 2e-2, "float16": 2e-2}
QUANTIZED_OPERATORS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
                                 "ConvInteger", "QLinearConv", "QLinearMatMul"})
# Timing (check_against_onnxruntime): ROUNDS rounds, each engine in turn in each round, each after a pause of
# SETTLE_SECONDS, then a warm-up of WARMUP_SECONDS (roller.measure.timing.warm_up), then one batch of calls of at
# least TARGET_BATCH_SECONDS; medians over the rounds, and the paired ratio. Fewer rounds (not fewer than
# MIN_ROUNDS) where ROUNDS would take over TIMING_BUDGET_SECONDS for a slow model.
ROUNDS = 5
TARGET_BATCH_SECONDS = 0.1
WARMUP_SECONDS = 0.2
MIN_ROUNDS = 3
TIMING_BUDGET_SECONDS = 6.0
# pause before each engine's turn: thread pools (onnxruntime's, TVM's) spin-wait after their last call and
# take the cores from whatever runs next (on 2 cores roller ran ~2x slower right after onnxruntime)
SETTLE_SECONDS = 0.1


@dataclass
class CompiledModel:
    """A model compiled for a device. ``report`` holds one :class:`roller.models.relax_pass.FunctionReport` per fused
    function; ``inputs`` maps each input name to (shape, dtype), in the model's order."""

    executable: Any
    device: Device
    name: str
    inputs: dict[str, tuple[tuple[int, ...], str]]
    report: list
    seconds: dict[str, float] = field(default_factory=dict)  # import, legalize, schedule, build, total
    module: Any = field(default=None, repr=False)  # the scheduled Relax IRModule, before lowering
    # True where ``executable`` calls kernels of the kernel cache by name (roller.models.function_cache): export then
    # compiles ``module`` (every scheduled function in place) into one self-contained library
    calls_cache: bool = False
    folded: str | None = None  # what fold_shapes did to the ONNX graph before import (None: nothing to fold)
    _vm: Any = field(default=None, repr=False)

    @property
    def compile_seconds(self) -> float:
        return self.seconds.get("total", 0.0)

    def vm(self):
        """The ``relax.VirtualMachine`` running the model on the CPU (made once; the thread count is the
        device's cores unless TVM_NUM_THREADS is set)."""
        if self._vm is None:
            import tvm
            from tvm import relax

            from roller.tir.compile import set_threads

            set_threads(self.device.units.count)
            self._vm = relax.VirtualMachine(self.executable, tvm.cpu())
        return self._vm

    def random_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Random arrays for the inputs: floats uniform in [-1, 1), integers in [0, 4), booleans."""
        return random_arrays(self.inputs, seed)

    def run_fn(self, inputs: Mapping[str, np.ndarray]) -> Callable[[], Any]:
        """A no-argument callable that runs the model once on ``inputs`` (already on the device)."""
        import tvm

        vm, dev = self.vm(), tvm.cpu()
        args = [tvm.runtime.tensor(np.asarray(inputs[n], order="C"), dev) for n in self.inputs]
        main = vm["main"]
        return lambda: main(*args)

    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The model's outputs (a list, in order) for ``inputs`` (name -> numpy array)."""
        missing = [n for n in self.inputs if n not in inputs]
        if missing:
            raise ModelError(f"{self.name}: no value for input(s) {', '.join(missing)}")
        return outputs_to_numpy(self.run_fn(inputs)())

    def export(self, directory: str | os.PathLike) -> dict[str, str]:
        """Writes ``<name>.so`` (load with ``tvm.runtime.load_module`` and run with
        ``relax.VirtualMachine(lib, tvm.cpu())``) and ``<name>.json`` (the report); returns their paths."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        lib = out / f"{self.name}.so"
        from roller.tir.compile import export_library, target_for
        ex = build_module(self.module, target_for(self.device)) if self.calls_cache else self.executable
        export_library(ex, str(lib))
        rep = out / f"{self.name}.json"
        rep.write_text(json.dumps(self.to_dict(), indent=2))
        return {"library": str(lib), "report": str(rep)}

    def to_dict(self) -> dict:
        return {"model": self.name, "device": self.device.name, "compile_seconds": self.compile_seconds,
                "phases": dict(self.seconds), "graph_folded": self.folded,
                "inputs": {n: {"shape": list(s), "dtype": d} for n, (s, d) in self.inputs.items()},
                "functions": [r.to_dict() for r in self.report]}


# ---------------------------------------------------------------------------------------------
# ONNX in

def load_onnx(model) -> Any:
    """An ``onnx.ModelProto`` from a path or a ModelProto, checked by ``onnx.checker``; ModelError if the
    file is missing or does not parse."""
    try:
        import onnx
    except ImportError:
        raise ModelError("reading ONNX models needs the onnx package: pip install 'roller[models]'") from None
    if isinstance(model, onnx.ModelProto):
        proto, where = model, model.graph.name or "model"
    else:
        path = Path(model)
        if not path.is_file():
            raise ModelError(f"{path}: no such file")
        try:
            proto = onnx.load(str(path))
        except Exception as e:  # protobuf's DecodeError and friends: the file is not an ONNX model
            raise ModelError(f"{path}: not a readable ONNX model ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else 'parse error'})") from None
        where = str(path)
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as e:
        raise ModelError(f"{where}: invalid ONNX model: {str(e).strip().splitlines()[0]}") from None
    return proto


def onnx_inputs(proto, shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, tuple[tuple[int, ...], str]]:
    """Each real input of the graph (initializers excluded) -> (static shape, dtype). ``shapes`` sets or
    overrides shapes by name; a dimension the model fixes must agree, a symbolic one must be given."""
    from onnx import helper

    shapes = {k: tuple(int(d) for d in v) for k, v in (shapes or {}).items()}
    inits = {i.name for i in proto.graph.initializer}
    real = [i for i in proto.graph.input if i.name not in inits]
    names = [i.name for i in real]
    unknown = [n for n in shapes if n not in names]
    if unknown:
        raise ModelError(f"the model has no input named {unknown[0]!r}; its inputs are "
                         f"{', '.join(_describe_input(i) for i in real)}")
    out = {}
    for i in real:
        tt = i.type.tensor_type
        dtype = str(np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)))
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if i.name in shapes:
            given = shapes[i.name]
            if len(given) != len(dims) or any(d is not None and d != g for d, g in zip(dims, given)):
                raise ModelError(f"--input {i.name}={'x'.join(map(str, given))} does not fit the model's input "
                                 f"{_describe_input(i)}")
            if any(g <= 0 for g in given):
                raise ModelError(f"--input {i.name}: dimensions must be positive, got {given}")
            out[i.name] = (given, dtype)
        elif any(d is None for d in dims):
            example = "x".join(str(d) if d is not None else "1" for d in dims)
            raise ModelError(f"input {_describe_input(i)} has symbolic dimensions: give its shape, "
                             f"e.g. --input {i.name}={example}")
        else:
            out[i.name] = (tuple(dims), dtype)
    return out


def _describe_input(i) -> str:
    dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in i.type.tensor_type.shape.dim]
    return f"{i.name} ({'x'.join(dims) or 'scalar'})"


# operators that compute with shapes: graphs exported from PyTorch compute reshape targets and masks from
# them (Shape -> Gather -> Unsqueeze -> Concat -> Reshape: channel shuffles, chunks, flattens;
# ConstantOfShape of an empty shape, a scalar, which TVM's converter cannot make: GPT-2's attention mask)
SHAPE_OPERATORS = frozenset({"Shape", "Size", "ConstantOfShape"})


def fold_shapes(proto, inputs: Mapping[str, tuple[tuple[int, ...], str]]):
    """``(proto, note)``: where the graph computes with shapes (a node of SHAPE_OPERATORS), the graph with the
    inputs' static shapes set and its constant subgraphs folded by onnxruntime's offline optimization at
    ORT_ENABLE_BASIC (constant folding and ONNX-only rewrites; no operator of onnxruntime's own), and a
    one-line note saying so; else ``(proto, None)`` unchanged. TVM's ONNX importer leaves some of those
    chains as tensors whose shape is not known at compile time, and legalizing the reshape that reads
    one then fails (``emit_te now only supports Tensor that has ShapeExpr shape``: torchvision's
    ShuffleNet); its ConstantOfShape converter fails on a scalar result (``broadcast_to expects the input
    shape to have the number of ndim at least``: GPT-2 from transformers). Without onnxruntime, or where it cannot optimize the graph, the graph is imported as it
    is and the note says why."""
    counts: dict[str, int] = {}
    for n in proto.graph.node:
        if n.op_type in SHAPE_OPERATORS and n.domain in ("", "ai.onnx"):
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
    if not counts:
        return proto, None
    what = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    try:
        import onnxruntime as ort
    except ImportError:
        return proto, f"graph not folded ({what} nodes): onnxruntime is not installed"
    import tempfile

    import onnx

    fixed = onnx.ModelProto()
    fixed.CopyFrom(proto)
    for i in fixed.graph.input:  # the shapes being compiled for, symbolic dimensions included
        if i.name in inputs:
            dims = i.type.tensor_type.shape.dim
            del dims[:]
            for d in inputs[i.name][0]:
                dims.add().dim_value = int(d)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.log_severity_level = 3
    with tempfile.TemporaryDirectory(prefix="roller-fold-") as tmp:
        opts.optimized_model_filepath = str(Path(tmp) / "folded.onnx")
        try:
            ort.InferenceSession(fixed.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            folded = onnx.load(opts.optimized_model_filepath)
        except Exception as e:  # onnxruntime refused the graph: TVM's importer may still take it
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            return proto, f"graph not folded ({what} nodes): onnxruntime: {first[:200]}"
    left = sum(n.op_type in SHAPE_OPERATORS for n in folded.graph.node)
    return folded, (f"graph folded by onnxruntime (ORT_ENABLE_BASIC) before import: {what} nodes, "
                    f"{len(proto.graph.node)} -> {len(folded.graph.node)} nodes, {left} shape nodes left")


def import_onnx(proto, inputs: Mapping[str, tuple[tuple[int, ...], str]]):
    """The Relax IRModule of an ONNX model (weights as constants); ModelError for an operator TVM's ONNX
    frontend does not import."""
    import tvm
    from tvm.relax.frontend.onnx import from_onnx

    import contextlib
    import io
    import sys

    printed = io.StringIO()  # the importer prints "Error converting operator ..." (to stdout: --json's) on failure
    try:
        with contextlib.redirect_stdout(printed):
            mod = from_onnx(proto, shape_dict={n: list(s) for n, (s, _) in inputs.items()},
                            dtype_dict={n: d for n, (_, d) in inputs.items()}, keep_params_in_input=False)
        if printed.getvalue():
            sys.stderr.write(printed.getvalue())
        return mod
    except tvm.error.OpError as e:  # OpNotImplemented / OpAttributeInvalid...: one line naming the operator
        raise ModelError(f"unsupported by TVM's ONNX frontend: {str(e).strip().splitlines()[-1]}") from None
    except Exception as e:  # any other failure of the importer: one line naming the node it was converting
        raise phase_error("TVM's ONNX importer", e) from e


def phase_error(phase: str, e: BaseException) -> ModelError:
    """A ModelError of one line for an exception TVM raised in ``phase`` (importing, legalizing, building a
    whole model): the ONNX node (operator and name) or the Relax operator being handled when it was raised,
    found in the traceback's frames, and the exception's type and first line. std::bad_alloc from TVM's C++
    comes as a MemoryError or a RuntimeError naming it."""
    where = []
    tb = e.__traceback__
    while tb is not None:  # innermost last: the last match is the most precise
        local = tb.tb_frame.f_locals
        node, call = local.get("node"), local.get("call")
        if hasattr(node, "op_type") and hasattr(node, "output"):
            where.append(f"ONNX node {node.op_type} {node.name or node.output[0]!r}")
        elif call is not None and hasattr(getattr(call, "op", None), "name"):
            where.append(f"Relax operator {call.op.name}")
        elif "legalize_ops" in tb.tb_frame.f_code.co_filename:  # frames rebuilt across TVM's C++: names only
            code = tb.tb_frame.f_code
            where.append(f"the legalization of a Relax operator ({Path(code.co_filename).stem}.{code.co_name})")
        tb = tb.tb_next
    text = str(e).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # TVM's C++ errors carry their own traceback first: the message is the last line
    first = lines[-1] if lines and lines[0].startswith("Traceback") else (lines[0] if lines else "")
    at = f" at {where[-1]}" if where else ""
    return ModelError(f"{phase} failed{at}: {type(e).__name__}: {first[:300]}")


# ---------------------------------------------------------------------------------------------
# Compile


def compile_model(model, device: Device | str | None = None, inputs: Mapping[str, Sequence[int]] | None = None,
                  profile: bool = False, topk: int = 10, name: str | None = None,
                  layout: str = "NHWC", fast_math: bool = True, verify: bool = False,
                  profile_budget: float | None = PROFILE_BUDGET_SECONDS, cache: bool = True,
                  prepack: bool = True) -> CompiledModel:
    """Compiles a whole model for ``device`` (default: this machine).

    ``model`` is an ONNX path or ModelProto, or a Relax IRModule (``from_exported_program``'s, with static
    shapes). ``inputs`` gives shapes by input name (required for symbolic dimensions). ``layout`` is the
    convolutions' activation layout (:func:`legalize_and_fuse`; NHWC ran a small CNN 2.4x faster than
    the frontend's NCHW: strided NCHW convolutions gather along the vector axis); ``fast_math`` uses
    TVM's approximations of erf, exp, tanh and softmax (see :func:`legalize_and_fuse`). Every fused function
    is scheduled by :class:`roller.models.relax_pass.ScheduleModule` (the one driver, with the kernel cache's
    per-function step or without); with ``profile`` roller's functions use the best
    of their top-``topk`` plans, timed, instead of the model's first plan, the largest predicted share of
    the model first until ``profile_budget`` seconds are spent (None: no limit); with ``verify`` each scheduled
    function is checked against TVM's unscheduled build of it first (a disagreeing one falls back).
    With ``prepack`` (the default) the constants (weights) a roller kernel reads are packed once, here, in
    its plan's tiles, and the kernel reads them packed (:mod:`roller.plan.prepack`), profiled plans too.

    Without ``profile`` and with ``cache`` (the default) every fused function comes from the persistent
    kernel cache, or is scheduled, compiled alone and stored there (:mod:`roller.models.function_cache`): a second
    process compiling the same model, or another model sharing functions, loads them instead. The
    report's ``cache`` says per function "hit" or "miss" (None on the other paths).
    """
    import tvm

    from roller.models.constants import constants_device
    from roller.models.relax_pass import ScheduleModule
    from roller.plan.dot import has_vnni
    from roller.tir.compile import target_for

    t0 = time.perf_counter()
    dev = device if isinstance(device, Device) else load_device(device)
    target = target_for(dev)
    seconds: dict[str, float] = {}
    if isinstance(model, tvm.IRModule):
        if inputs:
            raise ModelError("input shapes are part of a Relax module: give --input only with an ONNX model")
        mod, specs, label, folded = model, relax_inputs(model), name or "model", None
    else:
        proto = load_onnx(model)
        specs = onnx_inputs(proto, inputs)
        label = name or (Path(model).stem if not hasattr(model, "graph") else (proto.graph.name or "model"))
        proto, folded = fold_shapes(proto, specs)
        mod = import_onnx(proto, specs)
    seconds["import"] = time.perf_counter() - t0
    t = time.perf_counter()
    try:
        mod = legalize_and_fuse(mod, target, layout, fast_math, integer_convolutions=has_vnni(dev))
    except ModelError:
        raise
    except Exception as e:  # TVM's legalization or fusion: one line naming the operator, not a traceback
        raise phase_error("legalizing and fusing the model (TVM's Relax passes)", e) from e
    seconds["legalize"] = time.perf_counter() - t
    t = time.perf_counter()
    # planned for where the weights live between calls (memory, where they outgrow the caches)
    plan_dev = constants_device(mod, dev) if prepack else dev
    calls_cache = cache and not profile
    step = None
    if calls_cache:  # every function from the kernel cache or compiled alone into it: the cache's step
        from roller.models.function_cache import CachedStep
        step = CachedStep(plan_dev)
    # one driver either way (the module pass), with the rule chain or the cache's per-function step
    sched = ScheduleModule(plan_dev, profile=profile, topk=topk, verify=verify, profile_budget=profile_budget,
                           prepack=prepack, step=step)
    mod = sched.as_pass()(mod)
    report = sched.report
    seconds["schedule"] = time.perf_counter() - t
    t = time.perf_counter()
    ex = step.build(mod) if step is not None else build_module(mod, target)
    seconds["build"] = time.perf_counter() - t
    seconds["total"] = time.perf_counter() - t0
    return CompiledModel(executable=ex, device=dev, name=label, inputs=specs, report=report, seconds=seconds,
                         module=mod, calls_cache=calls_cache, folded=folded)


# ---------------------------------------------------------------------------------------------
# Run, compare, time


def outputs_to_numpy(result) -> list[np.ndarray]:
    """A VirtualMachine's result (a tensor or nested tuples of them) as a flat list of numpy arrays."""
    if hasattr(result, "numpy"):
        return [result.numpy()]
    return [x for r in result for x in outputs_to_numpy(r)]


def onnxruntime_session(proto, threads: int):
    """An onnxruntime CPU session with ``threads`` intra-op threads (the device's cores, as roller's),
    its other options at their defaults."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise ModelError("comparing with onnxruntime needs it: pip install 'roller[models]'") from None
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def is_quantized(proto) -> bool:
    """Whether an ONNX graph quantizes: a node of QUANTIZED_OPERATORS (its outputs are then compared at
    QUANTIZED_TOLERANCE)."""
    graph = getattr(proto, "graph", None)  # the tests' stand-ins for a model have none
    return any(n.op_type in QUANTIZED_OPERATORS for n in getattr(graph, "node", ()))


def tolerance_for(proto) -> Mapping[str, float]:
    """The tolerance its outputs are compared at (:func:`compare`): QUANTIZED_TOLERANCE for a quantized
    graph, else MODEL_TOLERANCE."""
    return QUANTIZED_TOLERANCE if is_quantized(proto) else MODEL_TOLERANCE


def compare(ours: Sequence[np.ndarray], reference: Sequence[np.ndarray],
            tolerance: Mapping[str, float] | None = None) -> dict:
    """Our outputs against the reference's: ``matches`` when every output is within ``tolerance`` (by
    dtype; default MODEL_TOLERANCE; :func:`tolerance_for` gives a graph's) of
    the reference at the reference's own scale (TOLERANCE_RULE): max|ours - reference| <= tol *
    max|reference|, tol by the reference's dtype (other dtypes, integers and booleans: equal). An
    absolute tolerance would pass anything where a network's outputs are tiny (random weights can give
    outputs ~1e-14, under any fixed atol). Also ``max_abs_error`` (the largest |ours - reference|) and
    ``max_rel_error``, the figure the rule bounds: over the outputs, the largest max|ours - reference| /
    max|reference| (a reference of zeros divides by the dtype's smallest normal number instead)."""
    if len(ours) != len(reference):
        return {"max_abs_error": None, "max_rel_error": None, "matches": False,
                "detail": f"{len(ours)} outputs against the reference's {len(reference)}"}
    err, rel, ok = 0.0, 0.0, True
    for a, b in zip(ours, reference):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return {"max_abs_error": None, "max_rel_error": None, "matches": False,
                    "detail": f"shape {a.shape} against {b.shape}"}
        if not a.size:
            continue
        tol = (MODEL_TOLERANCE if tolerance is None else tolerance).get(str(b.dtype), 0.0)
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        e = float(np.max(np.abs(a64 - b64)))
        scale = float(np.max(np.abs(b64)))
        tiny = float(np.finfo(b.dtype).tiny) if np.issubdtype(b.dtype, np.floating) else 1.0
        r = e / max(scale, tiny)
        err, rel = float(np.maximum(err, e)), float(np.maximum(rel, r))  # a NaN stays NaN
        ok = ok and bool(r <= tol)  # False for a NaN
    return {"max_abs_error": err, "max_rel_error": rel, "matches": ok}


def openvino_runner(proto, threads: int):
    """OpenVINO's CPU plugin as a second peer beside onnxruntime, optional: None where ``openvino`` is not
    importable (it is no dependency of roller). Returns a function of the feeds that gives a no-argument
    callable running the model once (outputs as numpy arrays, in the model's order), compiled from the
    ONNX bytes with ``threads`` inference threads (the device's cores, as roller's and onnxruntime's),
    PERFORMANCE_HINT LATENCY and float32 inference precision."""
    try:
        import openvino as ov
    except ImportError:
        return None
    core = ov.Core()
    compiled = core.compile_model(core.read_model(proto.SerializeToString()), "CPU",
                                  {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads,
                                   "INFERENCE_PRECISION_HINT": "f32"})
    request, outputs = compiled.create_infer_request(), list(compiled.outputs)

    def bind(feeds):
        def call():
            res = request.infer(feeds, share_inputs=True)  # outputs copied out, as onnxruntime returns new arrays
            return [np.asarray(res[o]) for o in outputs]
        return call
    return bind


def check_against_onnxruntime(cm: CompiledModel, model, seed: int = 0, time_it: bool = True,
                              rounds: int | None = None, openvino: bool = True) -> dict:
    """Runs ``cm`` and onnxruntime on the same random inputs: ``max_abs_error``, ``max_rel_error`` and
    ``matches`` (:func:`compare`), and with ``time_it`` both latencies and their ratio.

    The timing: ``rounds`` rounds (default ROUNDS, fewer for a model so slow that they would take over
    TIMING_BUDGET_SECONDS, never under MIN_ROUNDS), each timing roller, then onnxruntime, in this
    process; each engine's turn starts with a pause of SETTLE_SECONDS (the other's thread pool stops
    spinning), then WARMUP_SECONDS of untimed calls (:func:`roller.measure.timing.warm_up`: after the pause its own
    pool's first calls are slow), then one timed batch of at least TARGET_BATCH_SECONDS.
    ``latency_seconds`` and ``onnxruntime_latency_seconds`` are the medians over the rounds, and
    ``onnxruntime_over_roller`` the median over the rounds of the round's onnxruntime / roller ratio
    (:func:`roller.measure.timing.paired_ratio`; > 1: roller is faster).

    With ``openvino`` and the ``openvino`` package importable, OpenVINO (:func:`openvino_runner`) is a
    second peer, timed in the same rounds after onnxruntime where its outputs match onnxruntime's
    (``openvino_matches``, ``openvino_max_rel_error``): ``openvino_latency_seconds``,
    ``openvino_over_roller``; one that fails to compile gives ``openvino_error`` instead. ``peers`` names
    the peers timed and ``fastest_peer`` the one of lowest median latency."""
    proto = load_onnx(model)
    feeds = cm.random_inputs(seed)
    sess = onnxruntime_session(proto, cm.device.units.count)
    reference = sess.run(None, feeds)
    run = cm.run_fn(feeds)
    quantized = is_quantized(proto)
    tolerance = tolerance_for(proto)
    result = compare(outputs_to_numpy(run()), reference, tolerance)
    impls = [("roller", run), ("onnxruntime", lambda: sess.run(None, feeds))]
    if openvino and time_it:
        ov_call = None
        try:
            bind = openvino_runner(proto, cm.device.units.count)
            if bind is not None:
                ov_call = bind(feeds)
                theirs = ov_call()
        except Exception as e:  # noqa: BLE001  (an optional peer that fails is left out, and says why)
            result["openvino_error"] = f"{type(e).__name__}: {e}"[:500]
            ov_call = None
        if ov_call is not None:
            ov_check = compare(theirs, reference, tolerance)
            result["openvino_matches"] = ov_check["matches"]
            result["openvino_max_rel_error"] = ov_check["max_rel_error"]
            if ov_check["matches"]:
                impls.append(("openvino", ov_call))
            else:
                result["openvino_error"] = "its outputs differ from onnxruntime's: not timed"
    if time_it:
        if rounds is None:  # from each engine's second call (the first pays for allocations)
            seconds = []
            for _, fn in impls:
                t = time.perf_counter()
                fn()
                seconds.append(time.perf_counter() - t)
            rounds = timing_rounds(max(seconds), len(impls))
        times = time_rounds(impls, rounds=rounds, target=TARGET_BATCH_SECONDS, repeats=1, settle=SETTLE_SECONDS,
                            warmup=WARMUP_SECONDS)
        result["latency_seconds"] = float(np.median(times["roller"]))
        peers = [name for name, _ in impls[1:]]
        for name in peers:
            result[f"{name}_latency_seconds"] = float(np.median(times[name]))
            result[f"{name}_over_roller"] = paired_ratio(times[name], times["roller"])
        result["peers"] = peers
        result["fastest_peer"] = fastest_peer(times, peers)[0]
        result["timing"] = {"rounds": rounds, "settle_seconds": SETTLE_SECONDS, "warmup_seconds": WARMUP_SECONDS,
                            "batch_seconds": TARGET_BATCH_SECONDS}
    result["tolerance"] = {"rule": TOLERANCE_RULE, "tol_by_dtype": dict(tolerance), "quantized_graph": quantized}
    return result


def timing_rounds(call_seconds: float, engines: int = 2) -> int:
    """Rounds for :func:`check_against_onnxruntime` when one call of the slowest engine takes about
    ``call_seconds``: ROUNDS, or as many as fit in TIMING_BUDGET_SECONDS, not under MIN_ROUNDS.
    A turn costs the pause, the warm-up (at least 3 calls) and the batch (at least one call)."""
    turn = SETTLE_SECONDS + max(WARMUP_SECONDS, 3 * call_seconds) + max(TARGET_BATCH_SECONDS, call_seconds)
    return max(MIN_ROUNDS, min(ROUNDS, int(TIMING_BUDGET_SECONDS / (engines * turn) + 1e-9)))
