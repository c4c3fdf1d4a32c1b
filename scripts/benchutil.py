"""What the benchmark scripts share: timing implementations alternately (roller.measure.timing, re-exported
here), timing calls on cold caches (roller.measure.cold.ColdTimer, re-exported), the peer implementations
(numpy, PyTorch) of roller's named operators, and which OpenBLAS kernel numpy runs.

Imported by the benchmark scripts (bench_ops, bench_suite, bench_models, model_breakdown, prepack_ab, ...; run as
``python scripts/NAME.py``, which puts scripts/ on sys.path).
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np


from roller.measure.cold import ColdTimer  # noqa: F401 (re-exported)
from roller.measure.timing import SETTLE_SECONDS, median_seconds, time_alternately  # noqa: F401 (re-exported)

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")


def onnx_file(path: str, batch: int = 1):
    """The ONNX model in file ``path`` (as scripts/export_models.py writes them) at ``batch``: the file
    itself at batch 1, else NAME_bBATCH.onnx beside it (exported at that batch: a file's Reshape shapes
    fix its batch, so it is not rewritten here)."""
    import onnx

    p = path if batch == 1 else f"{path[:-len('.onnx')]}_b{batch}.onnx"
    if not os.path.exists(p):
        hint = (f"; export it with scripts/export_models.py DIR --models NAME --batch {batch}" if batch != 1 else "")
        raise FileNotFoundError(f"no ONNX file {p}{hint}")
    return onnx.load(p)


def model_name(name: str) -> str:
    """The name a row shows: a built-in model's name, or an ONNX file's stem."""
    return os.path.basename(name)[:-len(".onnx")] if name.endswith(".onnx") else name


def models(batch: int = 1, files=()) -> dict:
    """{name: maker of the ONNX model} of the whole-model scripts (bench_models, model_breakdown,
    prepack_ab): tests/onnx_models.py's models at benchmark sizes, random weights, nothing downloaded;
    every one built with ``batch`` as its leading (batch) dimension (gpt2_decode: ``batch`` sequences
    decoded at once, each over its own KV cache); plus each ``files`` path ending in .onnx, loaded by
    :func:`onnx_file` (real architectures from scripts/export_models.py)."""
    if TESTS not in sys.path:
        sys.path.insert(0, TESTS)  # onnx_models: the test models, one definition
    import onnx_models as m

    built = {f: (lambda f=f: onnx_file(f, batch)) for f in files if f.endswith(".onnx")}
    return built | {
        "resnet50": lambda: m.resnet50(batch=batch),
        "bert": lambda: m.transformer_encoder(12, seq=128, dim=768, heads=12, hidden=3072, name="bert_like",
                                              batch=batch),
        "mobilenet_v2": lambda: m.mobilenet_v2(batch=batch),
        "gpt2_decode": lambda: m.gpt2_decoder(12, past=32, dim=768, heads=12, name="gpt2_decode", batch=batch),
        "cnn": lambda: m.small_cnn(batch=batch, size=96, channels=32),
        # the same through onnxruntime's quantize_static, QDQ (uint8 activations, int8 weights per channel)
        "cnn_qdq": lambda: m.quantized_qdq(m.small_cnn(batch=batch, size=96, channels=32), samples=2,
                                           per_channel=True),
        "block": lambda: m.transformer_block(seq=77, dim=192, heads=3, hidden=768, batch=batch),
    }


def cpu_seconds(fn, target: float) -> float:
    """Seconds of this thread's CPU time per call of ``fn``, over calls for about ``target`` CPU seconds
    (after one warm-up call)."""
    fn()
    n, t0 = 0, time.thread_time()
    while time.thread_time() - t0 < target or n < 2:
        fn()
        n += 1
    return (time.thread_time() - t0) / n


class SpeedProbe:
    """How fast the machine runs now against its calibration: the calibration's own peak kernel
    (``roller.targets.cpu.microbench.kernels.peak_kernel``, float32, every unit, ~1 ms a call) timed a few times, its median
    rate over the device's calibrated float32 peak. On a shared VM whose speed moves by up to 3.5x between
    minutes, a run's measured/model figures mean little without it: the model is calibrated in one phase
    and timed in another. It reports; nothing is scaled by it."""

    def __init__(self, device, calls: int = 5):
        import tvm

        from roller.targets.cpu.microbench.kernels import peak_flops, peak_inputs, peak_kernel, peak_reference
        from roller.targets.cpu.microbench.plan import peak_tile
        from roller.tir.compile import target_for

        tile = peak_tile(device, "float32")
        units, lanes, mr, nv, k = device.units.count, tile["lanes"], tile["mr"], tile["nv"], tile["k"]
        self.peak = device.units.peak("float32") * units  # GFLOP/s, calibrated
        reps = max(1, int(self.peak * 1e9 * 1e-3 / peak_flops(units, mr, nv, lanes, k, 1)))
        self.work = peak_flops(units, mr, nv, lanes, k, reps)
        mod = tvm.compile(tvm.IRModule({"main": peak_kernel("float32", lanes, mr, nv, k, reps, units, True)}),
                          target_for(device)).mod
        a, b = peak_inputs("float32", units, mr, nv, lanes, k, np.random.default_rng(0))
        dev = tvm.cpu()
        args = [tvm.runtime.tensor(x, dev) for x in (a, b)] + [tvm.runtime.empty((units, mr, nv * lanes),
                                                                                   "float32", dev)]
        mod["main"](*args)
        if not np.array_equal(args[-1].numpy(), peak_reference(a, b, reps)):
            raise RuntimeError("the speed probe's peak kernel computed a wrong result")
        self._timer = mod.time_evaluator("main", dev, number=1, repeat=calls)
        self._args = args

    def speed(self) -> float:
        """The median rate of a few calls now, as a fraction of the calibrated peak."""
        rates = sorted(self.work / s / 1e9 for s in self._timer(*self._args).results)
        return rates[len(rates) // 2] / self.peak


def checked_plan(func, expr, program, device, arrays: Sequence[np.ndarray], reference: np.ndarray,
                 label: str, dtype: str = "float32") -> Callable[[], Any]:
    """A call of ``program``'s kernel for ``func`` on ``arrays`` (its prepacked inputs in the plan's layout),
    built and checked once against ``reference`` at the profiler's tolerance for ``dtype`` (the output
    starts as NaN: a kernel that skips part of it fails); AssertionError naming ``label`` otherwise."""
    import tvm

    from roller.targets import build
    from roller.plan.prepack import program_layouts
    from roller.tir.layout import pack_constant
    from roller.measure.verify import TOLERANCE

    kernel = build(func, expr, program, device)["main"]  # looked up once: a lookup per call costs
    layouts = program_layouts(expr, program, device)
    names = [b.name for b in func.params][:len(arrays)]
    tensors = [tvm.runtime.tensor(pack_constant(layouts[n], a) if n in layouts else a) for n, a in zip(names, arrays)]
    tensors.append(tvm.runtime.tensor(np.full(reference.shape, np.nan, reference.dtype)))
    kernel(*tensors)
    rtol, atol = TOLERANCE[dtype]
    np.testing.assert_allclose(tensors[-1].numpy(), reference, rtol=rtol, atol=atol, err_msg=label)
    return lambda: kernel(*tensors)


# ---------------------------------------------------------------------------------------------
# Peers

@dataclass
class Peer:
    """One peer implementation: ``run()`` computes the operator (into a preallocated output where the
    library has ``out=``) and returns the result; ``to_numpy(result)`` gives it in roller's output
    layout, for checking the peer computes the same thing."""

    name: str
    run: Callable[[], Any]
    to_numpy: Callable[[Any], np.ndarray]
    note: str = ""


def numpy_peer(op: str, shape: Mapping[str, int], arrays: Sequence[np.ndarray], out: np.ndarray,
               options: Mapping[str, str] | None = None) -> Peer | None:
    """numpy's implementation of ``op`` on ``arrays`` writing into ``out``, or None if it has none.
    matmul and batch_matmul run in OpenBLAS (threaded); numpy's elementwise ops and sums use one thread."""
    options = options or {}
    if op in ("matmul", "batch_matmul"):
        a, b = arrays
        if options.get("layout") == "nt":  # B is [N, K]: a transposed view, BLAS reads it as such
            b = np.swapaxes(b, -1, -2)
        return Peer("numpy", lambda: np.matmul(a, b, out=out), np.asarray, "OpenBLAS")
    if op == "reduce_sum":
        (a,) = arrays
        return Peer("numpy", lambda: np.sum(a, axis=1, out=out), np.asarray, "1 thread")
    if op == "add_relu":
        a, b = arrays

        def add_relu():
            np.add(a, b, out=out)
            return np.maximum(out, 0, out=out)
        return Peer("numpy", add_relu, np.asarray, "1 thread")
    return None


def torch_peer(op: str, shape: Mapping[str, int], arrays: Sequence[np.ndarray], out: np.ndarray,
               options: Mapping[str, str] | None = None) -> Peer | None:
    """PyTorch's implementation of ``op`` (None if torch is not installed or has no counterpart).
    Convolutions and pooling run on channels_last tensors, so the data stays NHWC as roller's does;
    ``out=`` is used where the function has it. The caller sets torch's thread count."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    options = options or {}
    t = [torch.from_numpy(x) for x in arrays]
    o = torch.from_numpy(out)
    plain = lambda r: r.numpy()  # noqa: E731
    nhwc = lambda r: r.permute(0, 2, 3, 1).numpy()  # channels_last NCHW view -> NHWC array  # noqa: E731
    if op in ("matmul", "batch_matmul"):
        a, b = t
        if options.get("layout") == "nt":
            b = b.transpose(-1, -2)
        return Peer("torch", lambda: torch.matmul(a, b, out=o), plain)
    if op == "reduce_sum":
        return Peer("torch", lambda: torch.sum(t[0], dim=1, out=o), plain)
    if op == "add_relu":
        return Peer("torch", lambda: torch.relu_(torch.add(t[0], t[1], out=o)), plain)
    stride, pad, dil = shape.get("stride", 1), shape.get("pad", 0), shape.get("dilation", 1)
    if op in ("conv2d", "depthwise_conv2d", "pool2d"):
        x = t[0].permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)  # NHWC data, NCHW view
    if op == "conv2d":
        w = t[1].permute(3, 2, 0, 1).contiguous()  # [R, S, C/groups, K] -> [K, C/groups, R, S]
        groups = shape.get("groups", 1)
        return Peer("torch", lambda: F.conv2d(x, w, stride=stride, padding=pad, dilation=dil, groups=groups), nhwc)
    if op == "depthwise_conv2d":
        w = t[1].permute(2, 0, 1).unsqueeze(1).contiguous()  # [R, S, C] -> [C, 1, R, S]
        groups = shape["C"]
        return Peer("torch", lambda: F.conv2d(x, w, stride=stride, padding=pad, dilation=dil, groups=groups), nhwc)
    if op == "pool2d":
        kernel = (shape["R"], shape["S"])
        if options.get("kind", "max") == "max":
            return Peer("torch", lambda: F.max_pool2d(x, kernel, stride=stride, padding=pad), nhwc)
        return Peer("torch", lambda: F.avg_pool2d(x, kernel, stride=stride, padding=pad), nhwc)
    return None


def peers(op: str, shape: Mapping[str, int], arrays: Sequence[np.ndarray], out_shape: Sequence[int],
          options: Mapping[str, str] | None = None, use_torch: bool = True) -> list[Peer]:
    """The peers of ``op`` (numpy, then PyTorch), each with its own preallocated output."""
    found = [numpy_peer(op, shape, arrays, np.empty(out_shape, arrays[0].dtype), options)]
    if use_torch:
        found.append(torch_peer(op, shape, arrays, np.empty(out_shape, arrays[0].dtype), options))
    return [p for p in found if p is not None]


# ---------------------------------------------------------------------------------------------
# OpenBLAS

def openblas_info() -> str:
    """Which OpenBLAS numpy runs: version, kernel (core type) and threads, via threadpoolctl when
    installed, else OpenBLAS's own get_corename, else numpy.show_config."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        core = _openblas_corename()
        if core:
            return f"threadpoolctl not installed; OpenBLAS reports kernel {core}"
        import contextlib
        import io
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            np.show_config()
        lines = [ln.strip() for ln in buf.getvalue().splitlines() if "openblas" in ln.lower() and "config" in ln.lower()]
        return "threadpoolctl not installed; numpy.show_config: " + (" ".join(lines[:1]) or "no OpenBLAS line")
    infos = [i for i in threadpool_info() if i.get("internal_api") == "openblas"]
    return "; ".join(f"OpenBLAS {i.get('version')} kernel {i.get('architecture')} threads {i.get('num_threads')}"
                     for i in infos) or "threadpoolctl finds no OpenBLAS loaded"


def _openblas_corename() -> str | None:
    """The kernel OpenBLAS selected at run time (numpy wheels bundle it as scipy_openblas), or None."""
    libdir = os.path.join(os.path.dirname(np.__file__), "..", "numpy.libs")
    for lib in glob.glob(os.path.join(libdir, "*openblas*")):
        dll = ctypes.CDLL(lib)
        for sym in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename64_",
                    "openblas_get_corename"):
            fn = getattr(dll, sym, None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                return fn().decode()
    return None



# ---------------------------------------------------------------------------------------------
# A function with a symbolic dimension (scripts/serve_sim.py, scripts/bucket_cost.py)

def dynamic_linear(k: int, n: int):
    """A linear layer Y[seq, n] = A[seq, k] x W[k, n] whose sequence length ``seq`` is symbolic (a PrimFunc)."""
    from tvm import te

    seq = te.var("seq")
    a = te.placeholder((seq, k), name="A")
    w = te.placeholder((k, n), name="W")
    r = te.reduce_axis((0, k), name="r")
    y = te.compute((seq, n), lambda i, j: te.sum(a[i, r] * w[r, j], axis=r), name="Y")
    return te.create_prim_func([a, w, y])


@contextlib.contextmanager
def plans_with(**fields):
    """Within the block, every plan construction makes (``roller.plan.construct.construct``, which the CPU target
    and so ``roller.compile_model`` call) has ``fields`` replaced (``dataclasses.replace``): an A/B of one plan
    field with everything else the same, e.g. ``plans_with(balanced=False)`` for TVM's fixed split of the grid,
    ``plans_with(prefetched=())`` for no software prefetch. Predictions stay the model's for the plans as made."""
    import dataclasses

    from roller.plan import construct as module

    original = module.construct

    def construct(*args, **kwargs):
        cons = original(*args, **kwargs)
        return dataclasses.replace(cons, programs=tuple(dataclasses.replace(p, **fields) for p in cons.programs))
    module.construct = construct
    try:
        yield
    finally:
        module.construct = original
