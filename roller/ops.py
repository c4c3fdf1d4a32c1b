"""The operators roller's CLI, tests and benchmarks use: TE definitions, shape checks, numpy references.

``OPS`` maps an operator name (as typed on the command line) to an :class:`OpSpec` that knows the
operator's shape keys, builds its unscheduled PrimFunc, makes random inputs, and computes a numpy
reference. The plain functions (:func:`matmul`, :func:`conv2d_nhwc`...) build the PrimFuncs directly.

Conventions: inputs come in the order of the PrimFunc's parameters, the output is the last parameter.
Reductions over int8 accumulate (and store) in int32; every other dtype computes in its own type.
Random inputs are multiples of 1/8 in [-1, 1] (integers in [-3, 3] for int8), so float32 sums of up to
~10^5 products are exact and a kernel can be checked against the float64 reference with tight bounds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from .dtypes import dtype_bytes
from .errors import InvalidShapeError

SUPPORTED_DTYPES = ("float32", "float64", "float16", "int8")
MAX_ELEMENTS = 2**31 - 1          # per tensor (and per dimension): 32-bit indexing in the generated code
MAX_TOTAL_BYTES = 16 * 2**30      # all tensors of one operator together

Shape = Mapping[str, int]


def _out_dtype(dtype: str, reduces: bool) -> str:
    """int8 reductions accumulate in int32 (they would overflow int8); other types keep theirs."""
    return "int32" if (reduces and dtype == "int8") else dtype


@dataclass(frozen=True)
class OpSpec:
    """One operator: its shape keys and the callables that build, feed and check it.

    ``shape_keys`` are required, in the order the CLI documents them; ``optional_keys`` map to their
    defaults. The public methods validate the shape first (InvalidShapeError names the key and rule).
    """

    name: str
    shape_keys: tuple[str, ...]
    optional_keys: Mapping[str, int]
    doc: str
    build_fn: Callable[..., object] = field(repr=False)              # (**shape, dtype) -> PrimFunc
    input_shapes_fn: Callable[[Shape], list[tuple[int, ...]]] = field(repr=False)
    output_shape_fn: Callable[[Shape], tuple[int, ...]] = field(repr=False)
    reference_fn: Callable[[Sequence[np.ndarray], Shape], np.ndarray] = field(repr=False)
    flops_fn: Callable[[Shape], int] = field(repr=False)
    reduces: bool = True
    check_fn: Callable[[Shape], None] | None = field(default=None, repr=False)  # op-specific rules

    def full_shape(self, shape: Shape) -> dict[str, int]:
        """The shape with optional keys filled in (no validation)."""
        return {**self.optional_keys, **shape}

    def out_dtype(self, dtype: str) -> str:
        """The output's dtype for inputs of ``dtype``."""
        return _out_dtype(dtype, self.reduces)

    def make(self, shape: Shape, dtype: str = "float32"):
        """The unscheduled PrimFunc (via ``te.create_prim_func``)."""
        full = validate_shape(self, shape, dtype)
        return self.build_fn(**full, dtype=dtype)

    def input_shapes(self, shape: Shape) -> list[tuple[int, ...]]:
        return self.input_shapes_fn(self.full_shape(shape))

    def output_shape(self, shape: Shape) -> tuple[int, ...]:
        return self.output_shape_fn(self.full_shape(shape))

    def inputs(self, shape: Shape, dtype: str = "float32", rng: np.random.Generator | None = None) -> list[np.ndarray]:
        """Random inputs in parameter order (see the module docstring for the value range)."""
        full = validate_shape(self, shape, dtype)
        rng = rng if rng is not None else np.random.default_rng(0)
        if dtype == "int8":
            return [rng.integers(-3, 4, size=s).astype(dtype) for s in self.input_shapes_fn(full)]
        return [(rng.integers(-8, 9, size=s) / 8.0).astype(dtype) for s in self.input_shapes_fn(full)]

    def reference(self, arrays: Sequence[np.ndarray], shape: Shape) -> np.ndarray:
        """The numpy result for ``arrays`` (computed in float64, or int64 for integers, then cast)."""
        full = self.full_shape(shape)
        dtype = str(arrays[0].dtype)
        wide = np.int64 if np.issubdtype(arrays[0].dtype, np.integer) else np.float64
        out = self.reference_fn([np.asarray(a, dtype=wide) for a in arrays], full)
        return out.astype(self.out_dtype(dtype))

    def flops(self, shape: Shape) -> int:
        """Arithmetic operations of the whole operator (2 per multiply-add)."""
        return self.flops_fn(self.full_shape(shape))


# ---------------------------------------------------------------------------------------------
# Shape parsing and validation

def get_op(op: str | OpSpec) -> OpSpec:
    """The OpSpec of ``op`` (a name or an OpSpec); InvalidShapeError lists the known names otherwise."""
    if isinstance(op, OpSpec):
        return op
    try:
        return OPS[op]
    except KeyError:
        raise InvalidShapeError(f"unknown operator {op!r}: use one of {', '.join(OPS)}") from None


def _keys_help(spec: OpSpec) -> str:
    opt = ", ".join(f"{k} (default {v})" for k, v in spec.optional_keys.items())
    return f"{spec.name} takes {','.join(spec.shape_keys)}" + (f" and optionally {opt}" if opt else "")


def parse_shape(op_name: str, text: str, dtype: str = "float32") -> dict[str, int]:
    """Parses ``M=1024,N=1024,K=1024`` into a validated shape dict (optional keys filled in).

    Keys match exactly or, failing that, case-insensitively (``m=64`` works for matmul).
    """
    spec = get_op(op_name)
    known = (*spec.shape_keys, *spec.optional_keys)
    shape: dict[str, object] = {}
    for item in (p.strip() for p in str(text).split(",")):
        if not item:
            continue
        key, sep, value = (s.strip() for s in item.partition("="))
        if not sep or not key:
            raise InvalidShapeError(f"{spec.name}: cannot parse {item!r} in shape {text!r}: write KEY=VALUE pairs "
                                    f"separated by commas, e.g. {','.join(f'{k}=64' for k in spec.shape_keys)}")
        if key not in known:
            matches = [k for k in known if k.lower() == key.lower()]
            key = matches[0] if len(matches) == 1 else key
        if key in shape:
            raise InvalidShapeError(f"{spec.name}: key {key} is given twice in shape {text!r}")
        try:
            shape[key] = int(value)
        except ValueError:
            raise InvalidShapeError(f"{spec.name}: {key}={value!r} is not an integer") from None
    return validate_shape(spec, shape, dtype)


def validate_shape(op: str | OpSpec, shape: Shape, dtype: str = "float32") -> dict[str, int]:
    """Checks a shape and dtype for ``op``; returns the shape with optional keys filled in.

    Rules: all required keys present, no unknown key, integer values, dimensions >= 1 (pad >= 0),
    every tensor <= 2**31-1 elements, all tensors together <= 16 GiB, a convolution's output >= 1.
    """
    spec = get_op(op)
    dtype = str(dtype)
    dtype_bytes(dtype)  # unknown names -> InvalidShapeError listing the known ones
    if dtype not in SUPPORTED_DTYPES:
        raise InvalidShapeError(f"{spec.name}: dtype {dtype} is not supported by the operators: "
                                f"use one of {', '.join(SUPPORTED_DTYPES)}")
    missing = [k for k in spec.shape_keys if k not in shape]
    if missing:
        raise InvalidShapeError(f"{spec.name}: missing shape key(s) {', '.join(missing)}; {_keys_help(spec)}")
    unknown = [k for k in shape if k not in spec.shape_keys and k not in spec.optional_keys]
    if unknown:
        raise InvalidShapeError(f"{spec.name}: unknown shape key(s) {', '.join(map(str, unknown))}; {_keys_help(spec)}")
    full: dict[str, int] = {}
    for key, value in spec.full_shape(shape).items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise InvalidShapeError(f"{spec.name}: {key}={value!r} must be an integer")
        value = int(value)
        low = 0 if key == "pad" else 1
        if value < low:
            raise InvalidShapeError(f"{spec.name}: {key}={value} must be >= {low}")
        if value > MAX_ELEMENTS:
            raise InvalidShapeError(f"{spec.name}: {key}={value} is too large (at most {MAX_ELEMENTS})")
        full[key] = value
    if spec.check_fn is not None:
        spec.check_fn(full)
    tensors = [("input", s, dtype) for s in spec.input_shapes_fn(full)]
    tensors.append(("output", spec.output_shape_fn(full), spec.out_dtype(dtype)))
    total = 0
    for role, tshape, tdtype in tensors:
        elems = math.prod(tshape)
        if elems > MAX_ELEMENTS:
            raise InvalidShapeError(f"{spec.name}: the {role} of shape {list(tshape)} has {elems} elements, more "
                                    f"than {MAX_ELEMENTS}: use smaller dimensions")
        total += elems * dtype_bytes(tdtype)
    if total > MAX_TOTAL_BYTES:
        raise InvalidShapeError(f"{spec.name}: the tensors need {total / 2**30:.1f} GiB together, more than "
                                f"{MAX_TOTAL_BYTES // 2**30} GiB: use smaller dimensions")
    return full


# ---------------------------------------------------------------------------------------------
# TE definitions (te is imported lazily: the policy half of roller must not need TVM)

def _mul_acc(a, b, out_dtype: str):
    """a * b in the accumulation type (casts only when it differs, so float ops stay cast-free)."""
    if str(a.dtype) != out_dtype:
        a, b = a.astype(out_dtype), b.astype(out_dtype)
    return a * b


def matmul(M: int, N: int, K: int, dtype: str = "float32"):
    """C[m, n] = sum_k A[m, k] * B[k, n]; parameters (A, B, C)."""
    from tvm import te

    validate_shape("matmul", {"M": M, "N": N, "K": K}, dtype)
    out = _out_dtype(dtype, True)
    A = te.placeholder((M, K), dtype, name="A")
    B = te.placeholder((K, N), dtype, name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda m, n: te.sum(_mul_acc(A[m, k], B[k, n], out), axis=k), name="C")
    return te.create_prim_func([A, B, C])


def batch_matmul(B: int, M: int, N: int, K: int, dtype: str = "float32"):
    """C[b, m, n] = sum_k A[b, m, k] * W[b, k, n]; parameters (A, W, C)."""
    from tvm import te

    validate_shape("batch_matmul", {"B": B, "M": M, "N": N, "K": K}, dtype)
    out = _out_dtype(dtype, True)
    A = te.placeholder((B, M, K), dtype, name="A")
    W = te.placeholder((B, K, N), dtype, name="W")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((B, M, N), lambda b, m, n: te.sum(_mul_acc(A[b, m, k], W[b, k, n], out), axis=k), name="C")
    return te.create_prim_func([A, W, C])


def conv_out_size(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    """Output extent of a convolution along one spatial dimension (<= 0 when the kernel does not fit)."""
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


def conv2d_nhwc(N: int, H: int, W: int, C: int, K: int, R: int, S: int, stride: int = 1, pad: int = 0,
                dtype: str = "float32", dilation: int = 1):
    """2-D convolution, data NHWC, weight RSCK ([R, S, C, K]), output NHWK; parameters (data, weight, conv).

    With ``pad > 0`` the zero padding is its own stage ``pad_temp`` (code generation decides where to
    compute it); the convolution reads ``pad_temp[n, h*stride + r*dilation, w*stride + s*dilation, c]``.
    """
    from tvm import te, tirx

    full = validate_shape("conv2d", dict(N=N, H=H, W=W, C=C, K=K, R=R, S=S, stride=stride, pad=pad,
                                         dilation=dilation), dtype)
    OH = conv_out_size(H, R, stride, pad, dilation)
    OW = conv_out_size(W, S, stride, pad, dilation)
    out = _out_dtype(dtype, True)
    data = te.placeholder((N, H, W, C), dtype, name="data")
    weight = te.placeholder((R, S, C, K), dtype, name="weight")
    src = data
    if full["pad"] > 0:
        src = te.compute(
            (N, H + 2 * pad, W + 2 * pad, C),
            lambda n, h, w, c: tirx.if_then_else(
                tirx.all(h >= pad, h < H + pad, w >= pad, w < W + pad),
                data[n, h - pad, w - pad, c], tirx.const(0, dtype)),
            name="pad_temp")
    r = te.reduce_axis((0, R), name="r")
    s = te.reduce_axis((0, S), name="s")
    c = te.reduce_axis((0, C), name="c")
    conv = te.compute(
        (N, OH, OW, K),
        lambda n, h, w, k: te.sum(_mul_acc(src[n, h * stride + r * dilation, w * stride + s * dilation, c],
                                           weight[r, s, c, k], out), axis=[r, s, c]),
        name="conv")
    return te.create_prim_func([data, weight, conv])


def reduce_sum(M: int, N: int, dtype: str = "float32"):
    """B[m] = sum_n A[m, n] (the last axis); parameters (A, B)."""
    from tvm import te

    validate_shape("reduce_sum", {"M": M, "N": N}, dtype)
    out = _out_dtype(dtype, True)
    A = te.placeholder((M, N), dtype, name="A")
    n = te.reduce_axis((0, N), name="n")
    B = te.compute((M,), lambda m: te.sum(A[m, n].astype(out) if out != dtype else A[m, n], axis=n), name="B")
    return te.create_prim_func([A, B])


def add_relu(M: int, N: int, dtype: str = "float32"):
    """C = relu(A + B) as two stages (T_add, then C) so the analysis has one to inline; parameters (A, B, C)."""
    from tvm import te, tirx

    validate_shape("add_relu", {"M": M, "N": N}, dtype)
    A = te.placeholder((M, N), dtype, name="A")
    B = te.placeholder((M, N), dtype, name="B")
    T_add = te.compute((M, N), lambda m, n: A[m, n] + B[m, n], name="T_add")
    C = te.compute((M, N), lambda m, n: te.max(T_add[m, n], tirx.const(0, dtype)), name="C")
    return te.create_prim_func([A, B, C])


# ---------------------------------------------------------------------------------------------
# numpy references (inputs arrive widened to float64 / int64)

def _conv_out(s: Shape) -> tuple[int, int]:
    return (conv_out_size(s["H"], s["R"], s["stride"], s["pad"], s["dilation"]),
            conv_out_size(s["W"], s["S"], s["stride"], s["pad"], s["dilation"]))


def _conv_check(s: Shape) -> None:
    oh, ow = _conv_out(s)
    if oh <= 0 or ow <= 0:
        raise InvalidShapeError(
            f"conv2d: the kernel R={s['R']}, S={s['S']} (dilation {s['dilation']}) does not fit the padded input "
            f"H+2*pad={s['H'] + 2 * s['pad']}, W+2*pad={s['W'] + 2 * s['pad']} (output {oh}x{ow}): "
            f"use a smaller kernel or more padding")


def _conv_reference(arrays, s: Shape) -> np.ndarray:
    data, weight = arrays
    p, st, d = s["pad"], s["stride"], s["dilation"]
    x = np.pad(data, ((0, 0), (p, p), (p, p), (0, 0)))
    oh, ow = _conv_out(s)
    out = np.zeros((s["N"], oh, ow, s["K"]), dtype=data.dtype)
    for r in range(s["R"]):
        for q in range(s["S"]):
            window = x[:, r * d: r * d + (oh - 1) * st + 1: st, q * d: q * d + (ow - 1) * st + 1: st, :]
            out += window @ weight[r, q]
    return out


OPS: dict[str, OpSpec] = {
    "matmul": OpSpec(
        name="matmul", shape_keys=("M", "N", "K"), optional_keys={},
        doc="C[M,N] = A[M,K] @ B[K,N]",
        build_fn=matmul,
        input_shapes_fn=lambda s: [(s["M"], s["K"]), (s["K"], s["N"])],
        output_shape_fn=lambda s: (s["M"], s["N"]),
        reference_fn=lambda a, s: a[0] @ a[1],
        flops_fn=lambda s: 2 * s["M"] * s["N"] * s["K"]),
    "batch_matmul": OpSpec(
        name="batch_matmul", shape_keys=("B", "M", "N", "K"), optional_keys={},
        doc="C[B,M,N] = A[B,M,K] @ W[B,K,N]",
        build_fn=batch_matmul,
        input_shapes_fn=lambda s: [(s["B"], s["M"], s["K"]), (s["B"], s["K"], s["N"])],
        output_shape_fn=lambda s: (s["B"], s["M"], s["N"]),
        reference_fn=lambda a, s: a[0] @ a[1],
        flops_fn=lambda s: 2 * s["B"] * s["M"] * s["N"] * s["K"]),
    "conv2d": OpSpec(
        name="conv2d", shape_keys=("N", "H", "W", "C", "K", "R", "S"),
        optional_keys={"stride": 1, "pad": 0, "dilation": 1},
        doc="conv[N,OH,OW,K] = data[N,H,W,C] (*) weight[R,S,C,K], NHWC, zero padding as stage pad_temp",
        build_fn=lambda N, H, W, C, K, R, S, stride, pad, dilation, dtype:
            conv2d_nhwc(N, H, W, C, K, R, S, stride, pad, dtype, dilation),
        input_shapes_fn=lambda s: [(s["N"], s["H"], s["W"], s["C"]), (s["R"], s["S"], s["C"], s["K"])],
        output_shape_fn=lambda s: (s["N"], *_conv_out(s), s["K"]),
        reference_fn=_conv_reference,
        flops_fn=lambda s: 2 * s["N"] * math.prod(_conv_out(s)) * s["K"] * s["R"] * s["S"] * s["C"],
        check_fn=_conv_check),
    "reduce_sum": OpSpec(
        name="reduce_sum", shape_keys=("M", "N"), optional_keys={},
        doc="B[M] = sum over the last axis of A[M,N]",
        build_fn=reduce_sum,
        input_shapes_fn=lambda s: [(s["M"], s["N"])],
        output_shape_fn=lambda s: (s["M"],),
        reference_fn=lambda a, s: a[0].sum(axis=1),
        flops_fn=lambda s: s["M"] * s["N"]),
    "add_relu": OpSpec(
        name="add_relu", shape_keys=("M", "N"), optional_keys={},
        doc="C[M,N] = max(A + B, 0), elementwise",
        build_fn=add_relu,
        input_shapes_fn=lambda s: [(s["M"], s["N"]), (s["M"], s["N"])],
        output_shape_fn=lambda s: (s["M"], s["N"]),
        reference_fn=lambda a, s: np.maximum(a[0] + a[1], 0),
        flops_fn=lambda s: 2 * s["M"] * s["N"],
        reduces=False),
}
