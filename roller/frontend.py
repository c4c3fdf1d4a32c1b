"""Whole models: import (ONNX, or a Relax IRModule such as ``from_exported_program`` gives), legalize and
fuse with Relax, schedule every fused function (:mod:`roller.relax`), build, run, and compare with
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

from .device import Device, load_device
from .errors import ModelError
from .relax import PROFILE_BUDGET_SECONDS
from .timing import paired_ratio, time_rounds

# Model outputs against onnxruntime, per output: max|ours - theirs| <= tol * max|theirs|, tol by dtype (see
# compare). Looser than a single kernel's check (roller.profile.TOLERANCE): a model chains dozens of
# reductions whose summation order differs from onnxruntime's.
MODEL_TOLERANCE = {"float64": 1e-6, "float32": 1e-3, "float16": 2e-2}
TOLERANCE_RULE = "max|ours - onnxruntime| <= tol * max|onnxruntime| per output (tol by dtype; other dtypes: equal)"
# Timing (check_against_onnxruntime): ROUNDS rounds, each engine in turn in each round, each after a pause of
# SETTLE_SECONDS, then a warm-up of WARMUP_SECONDS (roller.timing.warm_up), then one batch of calls of at
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
    """A model compiled for a device. ``report`` holds one :class:`roller.relax.FunctionReport` per fused
    function; ``inputs`` maps each input name to (shape, dtype), in the model's order."""

    executable: Any
    device: Device
    name: str
    inputs: dict[str, tuple[tuple[int, ...], str]]
    report: list
    seconds: dict[str, float] = field(default_factory=dict)  # import, legalize, schedule, build, total
    module: Any = field(default=None, repr=False)  # the scheduled Relax IRModule, before lowering
    # True where ``executable`` calls kernels of the kernel cache by name (roller.model_cache): export then
    # compiles ``module`` (every scheduled function in place) into one self-contained library
    calls_cache: bool = False
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

            from .tvmutil import set_threads

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
        from .tvmutil import export_library, target_for
        ex = build_module(self.module, target_for(self.device)) if self.calls_cache else self.executable
        export_library(ex, str(lib))
        rep = out / f"{self.name}.json"
        rep.write_text(json.dumps(self.to_dict(), indent=2))
        return {"library": str(lib), "report": str(rep)}

    def to_dict(self) -> dict:
        return {"model": self.name, "device": self.device.name, "compile_seconds": self.compile_seconds,
                "phases": dict(self.seconds),
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


def import_onnx(proto, inputs: Mapping[str, tuple[tuple[int, ...], str]]):
    """The Relax IRModule of an ONNX model (weights as constants); ModelError for an operator TVM's ONNX
    frontend does not import."""
    import tvm
    from tvm.relax.frontend.onnx import from_onnx

    try:
        return from_onnx(proto, shape_dict={n: list(s) for n, (s, _) in inputs.items()},
                         dtype_dict={n: d for n, (_, d) in inputs.items()}, keep_params_in_input=False)
    except tvm.error.OpError as e:  # OpNotImplemented / OpAttributeInvalid...: one line naming the operator
        raise ModelError(f"unsupported by TVM's ONNX frontend: {str(e).strip().splitlines()[-1]}") from None


def relax_inputs(mod) -> dict[str, tuple[tuple[int, ...], str]]:
    """The static (shape, dtype) of each parameter of ``mod["main"]`` (a Relax function)."""
    from tvm import relax, tirx

    main = mod["main"]
    out = {}
    for p in main.params:
        ty = p.ty
        shape = getattr(ty, "shape", None)
        dims = getattr(shape, "values", None)
        if not isinstance(ty, relax.TensorType) or dims is None:
            raise ModelError(f"parameter {p.name} of main is not a tensor with a known shape")
        if not all(isinstance(d, tirx.IntImm) for d in dims):
            raise ModelError(f"parameter {p.name} of main has a symbolic shape {list(dims)}: bind it first "
                             f"(relax.transform.BindSymbolicVars)")
        out[str(p.name)] = (tuple(int(d) for d in dims), str(ty.dtype))
    return out


# ---------------------------------------------------------------------------------------------
# Compile

def legalize_and_fuse(mod, target, layout: str = "NHWC", fast_math: bool = True):
    """TVM's CPU dispatch + legalize passes, then view-only reshapes turned into runtime reshapes.

    With ``layout="NHWC"`` convolutions are first converted to NHWC activations and HWIO weights
    (``relax.transform.ConvertLayout``; the layout propagates through elementwise operators and pools,
    and the weights' transposes fold into constants), so that output channels are contiguous for the
    vector lanes; ``"NCHW"`` keeps the frontend's layout. ``fast_math`` replaces erf, exp, tanh and
    softmax by TVM's vectorizable approximations (``relax.transform.FastMathTransform``: fast_erf is
    within 2e-7 of erf and ran 4096 values in 1 us against 27-37 us, which dominated a GELU MLP)."""
    import tvm
    from tvm import relax
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    if layout not in ("NHWC", "NCHW"):
        raise ModelError(f"layout {layout!r}: use NHWC or NCHW")
    convert = [relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "HWIO"]})] if layout == "NHWC" else []
    fast = [relax.transform.FastMathTransform()] if fast_math else []
    fold = [tvm.transform.module_pass(_fold_layout_constants, opt_level=0, name="roller.FoldLayoutConstants")]
    # folded before the layout conversion too: a Clip's bounds must be constants for its kernels to become
    # Relax operators that the conversion sees through (see _layout_folder)
    passes = (fold + convert + fold + fast + cpu.library_dispatch_passes(target) + cpu.legalize_passes(target)
              + [relax.transform.RewriteDataflowReshape(), relax.transform.DeadCodeElimination()])
    with target:
        return tvm.transform.Sequential(passes)(mod)


# Elementwise Relax operators folded with numpy when all their arguments are constants: the ONNX
# frontend's Clip (ReLU6) tests its constant bounds with isnan and where, 70 scalar kernels that TVM's
# FoldConstant built and ran one by one (MobileNetV2's legalization: 6.9 s).
_NUMPY_ELEMENTWISE = {"relax.isnan": np.isnan, "relax.where": np.where, "relax.add": np.add,
                      "relax.subtract": np.subtract, "relax.multiply": np.multiply, "relax.divide": np.divide,
                      "relax.maximum": np.maximum, "relax.minimum": np.minimum, "relax.negative": np.negative,
                      "relax.sqrt": np.sqrt, "relax.logical_not": np.logical_not}


def _extremum_kind(func) -> str | None:
    """"maximum" / "minimum" when ``func`` is a TE elementwise max / min of a tensor and a 0-d bound (how
    the ONNX frontend emits Clip: ``emit_te(topi.maximum, x, lo)``), else None."""
    import tvm
    from tvm import tirx

    if len(func.params) != 3 or len(func.params[1].shape) != 0:
        return None
    sch = tvm.s_tir.Schedule(func)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    body = sch.get(blocks[0]).body if len(blocks) == 1 else None
    if not isinstance(body, tirx.BufferStore):
        return None
    value, kinds = body.value, {tirx.Max: "maximum", tirx.Min: "minimum"}
    if type(value) not in kinds or not all(isinstance(x, tvm.ir.expr.TensorLoad) for x in (value.a, value.b)):
        return None
    return kinds[type(value)]


def _layout_folder():
    """A Relax mutator folding ``permute_dims`` / ``reshape`` of constants, and elementwise operators of
    constants (:data:`_NUMPY_ELEMENTWISE`), with numpy; and turning the ONNX frontend's Clip kernels (a
    ``call_tir`` of a TE max / min with a constant bound, :func:`_extremum_kind`) into Relax's
    ``maximum`` / ``minimum``: ConvertLayout cannot see into a ``call_tir`` and wrapped each in two
    transposes, so MobileNetV2's ReLU6 ran as 35 functions of their own instead of conv epilogues."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class _Fold(PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)
            self.mod = mod

        def constant(self, arg):
            if isinstance(arg, relax.Var):
                arg = self.lookup_binding(arg)
            return arg.value.numpy() if isinstance(arg, tvm.ir.expr.Constant) else None

        def extremum(self, call):
            """relax.op.maximum / minimum for a Clip kernel's call_tir, else None."""
            gv, args = call.args[0], call.args[1]
            func = self.mod[gv] if isinstance(gv, tvm.ir.GlobalVar) and gv in self.mod.functions else None
            if not isinstance(func, tvm.tirx.PrimFunc) or not isinstance(args, relax.Tuple) or len(args) != 2:
                return None
            bound = self.constant(args[1])
            kind = _extremum_kind(func) if bound is not None else None
            if kind is None:
                return None
            return getattr(relax.op, kind)(args[0], relax.const(bound, str(bound.dtype)))

        def visit_call_(self, call):
            call = super().visit_call_(call)
            name = call.op.name if isinstance(call.op, tvm.ir.Op) else ""
            if name == "relax.call_tir":
                op = self.extremum(call)
                return call if op is None else op
            if name in _NUMPY_ELEMENTWISE:
                args = [self.constant(a) for a in call.args]
                dtype = getattr(call.ty, "dtype", None)  # the normalized call's tensor type
                if any(a is None for a in args) or dtype is None:
                    return call
                out = np.asarray(_NUMPY_ELEMENTWISE[name](*args)).astype(str(dtype))
                return relax.const(out, str(dtype))
            if name not in ("relax.permute_dims", "relax.reshape"):
                return call
            data = self.constant(call.args[0])
            if data is None:
                return call
            if name == "relax.permute_dims":
                axes = call.attrs.axes
                out = np.transpose(data, None if axes is None else [int(a) for a in axes])
            else:
                dims = getattr(call.args[1], "values", None)  # a ShapeExpr
                if dims is None or not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
                    return call
                out = data.reshape([int(d) for d in dims])
            return relax.const(np.asarray(out, order="C"), str(data.dtype))

    return _Fold


def _fold_layout_constants(mod, _ctx):
    """Folds the weight transposes ConvertLayout inserts (and reshapes of constants) with numpy before
    legalization: TVM's FoldConstant builds and runs one unscheduled kernel per constant instead
    (ResNet-50: 7.1 s of a 25 s compile)."""
    from tvm import relax

    folder = _layout_folder()(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            folder.builder_.update_func(gv, folder.visit_expr(func))
    return folder.builder_.get()


def build_module(mod, target):
    """``tvm.compile`` with the CPU pipeline's lowering and finalization passes (legalization and
    fusion were done before scheduling)."""
    import tvm
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    from .tvmutil import compile_for

    lower = tvm.transform.Sequential(cpu.dataflow_lower_passes(target) + cpu.finalize_passes(target))

    @tvm.transform.module_pass(opt_level=0, name="roller.LowerAndFinalize")
    def _pipeline(m, _ctx):
        with target:
            return lower(m)

    return compile_for(mod, target, relax_pipeline=_pipeline)


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
    is scheduled by :class:`roller.relax.ScheduleModule`; with ``profile`` roller's functions use the best
    of their top-``topk`` plans, timed, instead of the model's first plan, the largest predicted share of
    the model first until ``profile_budget`` seconds are spent (None: no limit); with ``verify`` each scheduled
    function is checked against TVM's unscheduled build of it first (a disagreeing one falls back).
    With ``prepack`` (the default) the constants (weights) a roller kernel reads are packed once, here, in
    its plan's tiles, and the kernel reads them packed (:mod:`roller.prepack`), profiled plans too.

    Without ``profile`` and with ``cache`` (the default) every fused function comes from the persistent
    kernel cache, or is scheduled, compiled alone and stored there (:mod:`roller.model_cache`): a second
    process compiling the same model, or another model sharing functions, loads them instead. The
    report's ``cache`` says per function "hit" or "miss" (None on the other paths).
    """
    import tvm

    from .relax import ScheduleModule, constants_device
    from .tvmutil import target_for

    t0 = time.perf_counter()
    dev = device if isinstance(device, Device) else load_device(device)
    target = target_for(dev)
    seconds: dict[str, float] = {}
    if isinstance(model, tvm.IRModule):
        if inputs:
            raise ModelError("input shapes are part of a Relax module: give --input only with an ONNX model")
        mod, specs, label = model, relax_inputs(model), name or "model"
    else:
        proto = load_onnx(model)
        specs = onnx_inputs(proto, inputs)
        label = name or (Path(model).stem if not hasattr(model, "graph") else (proto.graph.name or "model"))
        mod = import_onnx(proto, specs)
    seconds["import"] = time.perf_counter() - t0
    t = time.perf_counter()
    mod = legalize_and_fuse(mod, target, layout, fast_math)
    seconds["legalize"] = time.perf_counter() - t
    t = time.perf_counter()
    # planned for where the weights live between calls (memory, where they outgrow the caches)
    plan_dev = constants_device(mod, dev) if prepack else dev
    calls_cache = cache and not profile
    if calls_cache:  # every function from the kernel cache or compiled alone into it
        from .model_cache import schedule_and_build
        ex, report, mod, seconds["build"] = schedule_and_build(mod, plan_dev, verify, prepack)
        seconds["schedule"] = time.perf_counter() - t - seconds["build"]
    else:
        sched = ScheduleModule(plan_dev, profile=profile, topk=topk, verify=verify, profile_budget=profile_budget,
                               prepack=prepack)
        mod = sched(mod)
        report = sched.report
        seconds["schedule"] = time.perf_counter() - t
        t = time.perf_counter()
        ex = build_module(mod, target)
        seconds["build"] = time.perf_counter() - t
    seconds["total"] = time.perf_counter() - t0
    return CompiledModel(executable=ex, device=dev, name=label, inputs=specs, report=report, seconds=seconds,
                         module=mod, calls_cache=calls_cache)


# ---------------------------------------------------------------------------------------------
# Run, compare, time

def random_arrays(specs: Mapping[str, tuple[tuple[int, ...], str]], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for n, (shape, dtype) in specs.items():
        if dtype == "bool":
            out[n] = rng.integers(0, 2, shape).astype(bool)
        elif np.issubdtype(np.dtype(dtype), np.floating):
            out[n] = rng.uniform(-1, 1, shape).astype(dtype)
        else:
            out[n] = rng.integers(0, 4, shape).astype(dtype)
    return out


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


def compare(ours: Sequence[np.ndarray], reference: Sequence[np.ndarray]) -> dict:
    """Our outputs against the reference's: ``matches`` when every output is within MODEL_TOLERANCE of
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
        tol = MODEL_TOLERANCE.get(str(b.dtype), 0.0)
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
    spinning), then WARMUP_SECONDS of untimed calls (:func:`roller.timing.warm_up`: after the pause its own
    pool's first calls are slow), then one timed batch of at least TARGET_BATCH_SECONDS.
    ``latency_seconds`` and ``onnxruntime_latency_seconds`` are the medians over the rounds, and
    ``onnxruntime_over_roller`` the median over the rounds of the round's onnxruntime / roller ratio
    (:func:`roller.timing.paired_ratio`; > 1: roller is faster).

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
    result = compare(outputs_to_numpy(run()), reference)
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
            ov_check = compare(theirs, reference)
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
        result["fastest_peer"] = min(peers, key=lambda n: result[f"{n}_latency_seconds"])
        result["timing"] = {"rounds": rounds, "settle_seconds": SETTLE_SECONDS, "warmup_seconds": WARMUP_SECONDS,
                            "batch_seconds": TARGET_BATCH_SECONDS}
    result["tolerance"] = {"rule": TOLERANCE_RULE, "tol_by_dtype": dict(MODEL_TOLERANCE)}
    return result


def timing_rounds(call_seconds: float, engines: int = 2) -> int:
    """Rounds for :func:`check_against_onnxruntime` when one call of the slowest engine takes about
    ``call_seconds``: ROUNDS, or as many as fit in TIMING_BUDGET_SECONDS, not under MIN_ROUNDS.
    A turn costs the pause, the warm-up (at least 3 calls) and the batch (at least one call)."""
    turn = SETTLE_SECONDS + max(WARMUP_SECONDS, 3 * call_seconds) + max(TARGET_BATCH_SECONDS, call_seconds)
    return max(MIN_ROUNDS, min(ROUNDS, int(TIMING_BUDGET_SECONDS / (engines * turn) + 1e-9)))
