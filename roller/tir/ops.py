"""The operators roller's CLI, tests and benchmarks use: TE definitions, shape checks, numpy references.

``OPS`` maps an operator name (as typed on the command line) to an :class:`OpSpec` that knows the
operator's shape keys, builds its unscheduled PrimFunc, makes random inputs, and computes a numpy
reference. The plain functions (:func:`matmul`, :func:`conv2d_nhwc`...) build the PrimFuncs directly.

Some operators take string options besides their shape (``pool2d``'s ``kind`` max|avg, ``matmul``'s
``layout`` nn|nt): ``OPS[name].with_options(kind="avg")`` is the same OpSpec with the option fixed (and
checked); every method then builds, feeds and checks that variant. Unset options take their default,
the first allowed value.

Conventions: inputs come in the order of the PrimFunc's parameters, the output is the last parameter.
Reductions over int8 accumulate (and store) in int32; every other dtype computes in its own type.
Random inputs are multiples of 1/8 in [-1, 1] (integers in [-3, 3] for int8), so float32 sums of up to
~10^5 products are exact and a kernel can be checked against the float64 reference with tight bounds.

The numpy references live in :mod:`roller.tir.opref`, the TE building blocks the definitions share (padding,
kernel windows) in :mod:`roller.tir.teutil`; this module holds the OpSpecs, the shape checks, the TE
definitions and the ``OPS`` table.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

import numpy as np

from roller.dtypes import dtype_bytes
from roller.errors import InvalidShapeError
from roller.tir.opref import (Params, Shape, _conv_out, _conv_reference, _depthwise_reference, _nhwc,
                              _pool_reference, _window_points)
from roller.tir.opref import conv_out_size as conv_out_size  # re-exported: its callers import it from here
from roller.tir.teutil import _merge_last_two, _mul_acc, _pad_hw, _window, _zero

SUPPORTED_DTYPES = ("float32", "float64", "float16", "int8")
MAX_ELEMENTS = 2**31 - 1          # per tensor (and per dimension): 32-bit indexing in the generated code
MAX_TOTAL_BYTES = 16 * 2**30      # all tensors of one operator together


def _out_dtype(dtype: str, reduces: bool) -> str:
    """int8 reductions accumulate in int32 (they would overflow int8); other types keep theirs."""
    return "int32" if (reduces and dtype == "int8") else dtype


@dataclass(frozen=True)
class OpSpec:
    """One operator: its shape keys, string options and the callables that build, feed and check it.

    ``shape_keys`` are required, in the order the CLI documents them; ``optional_keys`` map to their
    defaults. ``options`` map an option's name to its allowed values, the default first; ``chosen``
    holds the values set by :meth:`with_options`. The callables receive the operator's parameters: the
    full shape plus every option's value. The public methods validate the shape first
    (InvalidShapeError names the key and rule).
    """

    name: str
    shape_keys: tuple[str, ...]
    optional_keys: Mapping[str, int]
    doc: str
    build_fn: Callable[..., object] = field(repr=False)              # (**params, dtype) -> PrimFunc
    input_shapes_fn: Callable[[Params], list[tuple[int, ...]]] = field(repr=False)
    output_shape_fn: Callable[[Params], tuple[int, ...]] = field(repr=False)
    reference_fn: Callable[[Sequence[np.ndarray], Params], np.ndarray] = field(repr=False)
    flops_fn: Callable[[Params], int] = field(repr=False)
    # int8 inputs accumulate (and store) in int32; False keeps the input dtype (elementwise ops, pooling)
    reduces: bool = True
    check_fn: Callable[[OpSpec, Params, str], None] | None = field(default=None, repr=False)  # op-specific rules
    options: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    chosen: Mapping[str, str] = field(default_factory=dict)

    def with_options(self, **options: str) -> OpSpec:
        """This operator with ``options`` set (others keep their value); InvalidShapeError names an
        unknown option (and the operators that take it) or a value that is not allowed."""
        for key, value in options.items():
            if key not in self.options:
                owners = [n for n, spec in OPS.items() if key in spec.options]
                where = f"an option of {', '.join(owners)}" if owners else "no operator takes it"
                raise InvalidShapeError(f"{self.name} has no option {key!r} ({where}); {_options_help(self)}")
            if not isinstance(value, str) or value not in self.options[key]:
                raise InvalidShapeError(f"{self.name}: {key}={value!r} is not allowed: use one of "
                                        f"{', '.join(self.options[key])}")
        return replace(self, chosen={**self.chosen, **options})

    @property
    def option_values(self) -> dict[str, str]:
        """Every option's value: the chosen one, or the default."""
        return {key: self.chosen.get(key, allowed[0]) for key, allowed in self.options.items()}

    def full_shape(self, shape: Shape) -> dict[str, int]:
        """The shape with optional keys filled in (no validation)."""
        return {**self.optional_keys, **shape}

    def params(self, shape: Shape) -> dict[str, int | str]:
        """What the callables receive: the full shape plus the options' values (no validation)."""
        return {**self.full_shape(shape), **self.option_values}

    def out_dtype(self, dtype: str) -> str:
        """The output's dtype for inputs of ``dtype``."""
        return _out_dtype(dtype, self.reduces)

    def make(self, shape: Shape, dtype: str = "float32"):
        """The unscheduled PrimFunc (via ``te.create_prim_func``)."""
        full = validate_shape(self, shape, dtype)
        return self.build_fn(**self.params(full), dtype=dtype)

    def input_shapes(self, shape: Shape) -> list[tuple[int, ...]]:
        """The input tensors' shapes, in parameter order."""
        return self.input_shapes_fn(self.params(shape))

    def output_shape(self, shape: Shape) -> tuple[int, ...]:
        """The output tensor's shape."""
        return self.output_shape_fn(self.params(shape))

    def inputs(self, shape: Shape, dtype: str = "float32", rng: np.random.Generator | None = None) -> list[np.ndarray]:
        """Random inputs in parameter order (see the module docstring for the value range)."""
        full = validate_shape(self, shape, dtype)
        rng = rng if rng is not None else np.random.default_rng(0)
        shapes = self.input_shapes_fn(self.params(full))
        if dtype == "int8":
            return [rng.integers(-3, 4, size=s).astype(dtype) for s in shapes]
        return [(rng.integers(-8, 9, size=s) / 8.0).astype(dtype) for s in shapes]

    def reference(self, arrays: Sequence[np.ndarray], shape: Shape) -> np.ndarray:
        """The numpy result for ``arrays`` (computed in float64, or int64 for integers, then cast)."""
        dtype = str(arrays[0].dtype)
        wide = np.int64 if np.issubdtype(arrays[0].dtype, np.integer) else np.float64
        out = self.reference_fn([np.asarray(a, dtype=wide) for a in arrays], self.params(shape))
        return out.astype(self.out_dtype(dtype))

    def flops(self, shape: Shape) -> int:
        """Arithmetic operations of the whole operator (2 per multiply-add)."""
        return self.flops_fn(self.params(shape))


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


def _options_help(spec: OpSpec) -> str:
    if not spec.options:
        return f"{spec.name} takes no options"
    return f"{spec.name} takes " + ", ".join(f"{k} ({'|'.join(v)}, default {v[0]})" for k, v in spec.options.items())


def option_names() -> dict[str, tuple[str, ...]]:
    """Every option any operator takes, with the operators that take it (for the CLI's flags)."""
    names: dict[str, tuple[str, ...]] = {}
    for name, spec in OPS.items():
        for key in spec.options:
            names[key] = names.get(key, ()) + (name,)
    return names


def parse_shape(op: str | OpSpec, text: str, dtype: str = "float32") -> dict[str, int]:
    """Parses ``M=1024,N=1024,K=1024`` into a validated shape dict (optional keys filled in).

    Keys match exactly or, failing that, case-insensitively (``m=64`` works for matmul). Pass an OpSpec
    with its options set to check the rules that depend on them.
    """
    spec = get_op(op)
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
    every tensor <= 2**31-1 elements, all tensors together <= 16 GiB, plus the operator's own rules (a
    convolution's output >= 1, groups dividing the channels...). ``op`` may be an OpSpec with options set.
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
    params = spec.params(full)
    if spec.check_fn is not None:
        spec.check_fn(spec, params, dtype)
    tensors = [("input", s, dtype) for s in spec.input_shapes_fn(params)]
    tensors.append(("output", spec.output_shape_fn(params), spec.out_dtype(dtype)))
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

def matmul(M: int, N: int, K: int, dtype: str = "float32", layout: str = "nn"):
    """C[m, n] = sum_k A[m, k] * B[k, n]; parameters (A, B, C).

    ``layout="nt"`` takes B transposed, [N, K] (a linear layer's weight): C[m, n] = sum_k A[m, k] * B[n, k].
    """
    from tvm import te

    validate_shape(OPS["matmul"].with_options(layout=layout), {"M": M, "N": N, "K": K}, dtype)
    out = _out_dtype(dtype, True)
    A = te.placeholder((M, K), dtype, name="A")
    k = te.reduce_axis((0, K), name="k")
    if layout == "nt":
        B = te.placeholder((N, K), dtype, name="B")
        C = te.compute((M, N), lambda m, n: te.sum(_mul_acc(A[m, k], B[n, k], out), axis=k), name="C")
    else:
        B = te.placeholder((K, N), dtype, name="B")
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


# A group with fewer output channels than this fills few lanes when its own channels are the vector axis,
# and a copy of its inputs per output channel costs few copies; from 8 on, the copy costs about what the
# idle lanes did (docs/design-notes.md#ops-group_replicate_below).
GROUP_REPLICATE_BELOW = 8
# Block annotation of a copy stage whose value repeats each element it loads over this many consecutive
# elements of its innermost axis (group_rep: (k // kg) * cg + c is the same for kg channels in a row).
# Code generation vectorizes such a stage in runs of that many lanes, each one load broadcast: in whole
# vectors its non-affine index loaded lane by lane (docs/design-notes.md#ops-lane_run).
LANE_RUN = "roller.lane_run"


def conv2d_nhwc(N: int, H: int, W: int, C: int, K: int, R: int, S: int, stride: int = 1, pad: int = 0,
                dtype: str = "float32", dilation: int = 1, groups: int = 1):
    """2-D convolution, data NHWC, weight RSCK ([R, S, C/groups, K]), output NHWK; parameters (data,
    weight, conv).

    With ``pad > 0`` the zero padding is its own stage ``pad_temp`` (code generation decides where to
    compute it); the convolution reads ``pad_temp[n, h*stride + r*dilation, w*stride + s*dilation, c]``.
    With ``groups > 1``, output channel k = g*(K/groups) + j reads input channels g*(C/groups) + c. Where
    a group has fewer output channels than ``GROUP_REPLICATE_BELOW``, a stage ``group_rep`` first gives
    each output channel a copy of its group's input channels ([N, H, W, C/groups, K], value
    data[..., (k // (K/groups)) * (C/groups) + c]) and the convolution reads it plainly, vectorizing over all K output channels (the
    analysis keeps the stage, code generation runs it per top tile); otherwise the block iterates g and j
    as two axes so every index stays affine, and the output buffer keeps its NHWK layout through
    ``transform_layout``.
    """
    from tvm import te

    shape = dict(N=N, H=H, W=W, C=C, K=K, R=R, S=S, stride=stride, pad=pad, dilation=dilation, groups=groups)
    validate_shape("conv2d", shape, dtype)
    OH, OW = _conv_out(shape)
    out = _out_dtype(dtype, True)
    data = te.placeholder((N, H, W, C), dtype, name="data")
    weight = te.placeholder((R, S, C // groups, K), dtype, name="weight")
    src = _pad_hw(data, pad, _zero(dtype))
    if groups > 1:
        return grouped_conv_func(data, weight, src, groups, stride, dilation, out, name="conv")
    r, s, pixel = _window(src, R, S, stride, dilation)
    c = te.reduce_axis((0, C), name="c")
    conv = te.compute(
        (N, OH, OW, K),
        lambda n, h, w, k: te.sum(_mul_acc(pixel(n, h, w, c), weight[r, s, c, k], out), axis=[r, s, c]),
        name="conv")
    return te.create_prim_func([data, weight, conv])


def grouped_conv_func(data, weight, src, groups: int, stride: int, dilation: int, out_dtype: str,
                      name: str = "conv", index_dtype: str | None = None):
    """The PrimFunc (data, weight, output) of a grouped convolution of ``src`` (``data`` NHWC, padded or
    itself) by ``weight`` ([R, S, C/groups, K]), output NHWK, in the form roller analyses: below
    ``GROUP_REPLICATE_BELOW`` output channels a group, through :func:`replicated_group_conv`; from there on,
    a block over g and j (output channel g * K/groups + j) as two axes, every index affine, its output
    stored NHWK by ``transform_layout``. The operator and the model frontend's legalization both build it
    (the latter with ``index_dtype="int64"``, Relax's shapes, as ``BlockBuilder.call_te`` does)."""
    from tvm import te

    N, H, W, C = (int(d) for d in src.shape)
    R, S, cg, K = (int(d) for d in weight.shape)
    kg = K // groups
    if kg < GROUP_REPLICATE_BELOW:
        conv = replicated_group_conv(src, weight, groups, stride, dilation, out_dtype, name=name)
        return te.create_prim_func([data, weight, conv], index_dtype_override=index_dtype)
    r, s, pixel = _window(src, R, S, stride, dilation)
    c = te.reduce_axis((0, cg), name="c")
    OH, OW = conv_out_size(H, R, stride, 0, dilation), conv_out_size(W, S, stride, 0, dilation)  # src is padded
    conv = te.compute(
        (N, OH, OW, groups, kg),
        lambda n, h, w, g, j: te.sum(_mul_acc(pixel(n, h, w, g * cg + c), weight[r, s, c, g * kg + j], out_dtype),
                                     axis=[r, s, c]),
        name=name)
    return _merge_last_two(te.create_prim_func([data, weight, conv], index_dtype_override=index_dtype), name, kg)


def replicated_group_conv(src, weight, groups: int, stride: int, dilation: int, out_dtype: str, name: str = "conv"):
    """The TE tensor of a grouped convolution of ``src`` (NHWC, already padded) by ``weight`` ([R, S,
    C/groups, K]) through the stage ``group_rep`` ([N, H, W, C/groups, K]: each output channel's copy of
    its group's input channels, annotated :data:`LANE_RUN`), so that every index the convolution reads is
    affine (see :func:`conv2d_nhwc`; the model frontend legalizes grouped convolutions with it too)."""
    from tvm import te

    N, H, W, C = (int(d) for d in src.shape)
    R, S, cg, K = (int(d) for d in weight.shape)
    kg = K // groups
    OH, OW = conv_out_size(H, R, stride, 0, dilation), conv_out_size(W, S, stride, 0, dilation)  # src is padded
    r, s, c = te.reduce_axis((0, R), name="r"), te.reduce_axis((0, S), name="s"), te.reduce_axis((0, cg), name="c")
    rep = te.compute((N, H, W, cg, K), lambda n, h, w, c, k: src[n, h, w, (k // kg) * cg + c], name="group_rep",
                     attrs={LANE_RUN: kg})
    return te.compute(
        (N, OH, OW, K),
        lambda n, h, w, k: te.sum(_mul_acc(rep[n, h * stride + r * dilation, w * stride + s * dilation, c, k],
                                           weight[r, s, c, k], out_dtype), axis=[r, s, c]),
        name=name)


def depthwise_conv2d(N: int, H: int, W: int, C: int, R: int, S: int, stride: int = 1, pad: int = 0,
                     dtype: str = "float32", dilation: int = 1):
    """Depthwise 2-D convolution (multiplier 1), data NHWC, weight [R, S, C], output NHWC; parameters
    (data, weight, conv): conv[n, h, w, c] = sum_{r,s} data[n, h*stride + r*dilation, w*stride + s*dilation, c]
    * weight[r, s, c], zero padding as the stage ``pad_temp`` (as in :func:`conv2d_nhwc`)."""
    from tvm import te

    shape = dict(N=N, H=H, W=W, C=C, R=R, S=S, stride=stride, pad=pad, dilation=dilation)
    validate_shape("depthwise_conv2d", shape, dtype)
    OH, OW = _conv_out(shape)
    out = _out_dtype(dtype, True)
    data = te.placeholder((N, H, W, C), dtype, name="data")
    weight = te.placeholder((R, S, C), dtype, name="weight")
    r, s, pixel = _window(_pad_hw(data, pad, _zero(dtype)), R, S, stride, dilation)
    conv = te.compute((N, OH, OW, C),
                      lambda n, h, w, c: te.sum(_mul_acc(pixel(n, h, w, c), weight[r, s, c], out), axis=[r, s]),
                      name="conv")
    return te.create_prim_func([data, weight, conv])


def pool2d(N: int, H: int, W: int, C: int, R: int, S: int, stride: int = 1, pad: int = 0,
           dtype: str = "float32", kind: str = "max"):
    """2-D pooling over R x S windows, data and output NHWC; parameters (data, pool).

    ``kind="max"``: one max-reduction; the padding holds the dtype's lowest value, so it never wins.
    ``kind="avg"``: a sum-reduction ``pool_sum`` then the elementwise epilogue ``pool`` dividing by R*S,
    padding included (PyTorch's count_include_pad=True); the analysis folds the division into the plan.
    """
    from tvm import te, tirx

    shape = dict(N=N, H=H, W=W, C=C, R=R, S=S, stride=stride, pad=pad)
    validate_shape(OPS["pool2d"].with_options(kind=kind), shape, dtype)
    OH, OW = _conv_out(shape)
    data = te.placeholder((N, H, W, C), dtype, name="data")
    src = _pad_hw(data, pad, tirx.min_value(dtype) if kind == "max" else _zero(dtype))
    r, s, pixel = _window(src, R, S, stride)
    out = (N, OH, OW, C)
    if kind == "max":
        pool = te.compute(out, lambda n, h, w, c: te.max(pixel(n, h, w, c), axis=[r, s]), name="pool")
    else:
        total = te.compute(out, lambda n, h, w, c: te.sum(pixel(n, h, w, c), axis=[r, s]), name="pool_sum")
        pool = te.compute(out, lambda n, h, w, c: total[n, h, w, c] / tirx.const(R * S, dtype), name="pool")
    return te.create_prim_func([data, pool])


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
# Shape rules of the window operators (their numpy references are in roller.tir.opref)

def _window_check(spec: OpSpec, s: Params, dtype: str) -> None:
    """The kernel window fits the padded input (the output has at least one point)."""
    oh, ow = _conv_out(s)
    if oh <= 0 or ow <= 0:
        raise InvalidShapeError(
            f"{spec.name}: the kernel R={s['R']}, S={s['S']} (dilation {s.get('dilation', 1)}) does not fit the "
            f"padded input H+2*pad={s['H'] + 2 * s['pad']}, W+2*pad={s['W'] + 2 * s['pad']} (output {oh}x{ow}): "
            f"use a smaller kernel or more padding")


def _conv_check(spec: OpSpec, s: Params, dtype: str) -> None:
    _window_check(spec, s, dtype)
    for key in ("C", "K"):
        if s[key] % s["groups"]:
            raise InvalidShapeError(f"{spec.name}: {key}={s[key]} is not divisible by groups={s['groups']}: "
                                    f"C and K must both be multiples of groups")


def _pool_check(spec: OpSpec, s: Params, dtype: str) -> None:
    _window_check(spec, s, dtype)
    if 2 * s["pad"] > min(s["R"], s["S"]):
        # PyTorch's rule too: a window made only of padding would have no maximum and a meaningless average
        raise InvalidShapeError(f"{spec.name}: pad={s['pad']} is more than half the window R={s['R']}, S={s['S']}: "
                                f"use pad <= min(R, S) // 2")
    if s["kind"] == "avg" and dtype == "int8":
        raise InvalidShapeError(f"{spec.name}: kind=avg needs a floating-point dtype (an int8 average would "
                                f"truncate): use float32, float16 or float64, or kind=max")


OPS: dict[str, OpSpec] = {
    "matmul": OpSpec(
        name="matmul", shape_keys=("M", "N", "K"), optional_keys={},
        doc="C[M,N] = A[M,K] @ B[K,N] (layout nn) or A[M,K] @ B[N,K]^T (layout nt)",
        build_fn=matmul,
        input_shapes_fn=lambda s: [(s["M"], s["K"]), (s["N"], s["K"]) if s["layout"] == "nt" else (s["K"], s["N"])],
        output_shape_fn=lambda s: (s["M"], s["N"]),
        reference_fn=lambda a, s: a[0] @ (a[1].T if s["layout"] == "nt" else a[1]),
        flops_fn=lambda s: 2 * s["M"] * s["N"] * s["K"],
        options={"layout": ("nn", "nt")}),
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
        optional_keys={"stride": 1, "pad": 0, "dilation": 1, "groups": 1},
        doc="conv[N,OH,OW,K] = data[N,H,W,C] (*) weight[R,S,C/groups,K], NHWC, zero padding as stage pad_temp",
        build_fn=conv2d_nhwc,
        input_shapes_fn=lambda s: [_nhwc(s), (s["R"], s["S"], s["C"] // s["groups"], s["K"])],
        output_shape_fn=lambda s: (s["N"], *_conv_out(s), s["K"]),
        reference_fn=_conv_reference,
        flops_fn=lambda s: 2 * _window_points(s) * s["K"] * (s["C"] // s["groups"]),
        check_fn=_conv_check),
    "depthwise_conv2d": OpSpec(
        name="depthwise_conv2d", shape_keys=("N", "H", "W", "C", "R", "S"),
        optional_keys={"stride": 1, "pad": 0, "dilation": 1},
        doc="conv[N,OH,OW,C] = data[N,H,W,C] (*) weight[R,S,C] per channel, NHWC, zero padding as stage pad_temp",
        build_fn=depthwise_conv2d,
        input_shapes_fn=lambda s: [_nhwc(s), (s["R"], s["S"], s["C"])],
        output_shape_fn=lambda s: (s["N"], *_conv_out(s), s["C"]),
        reference_fn=_depthwise_reference,
        flops_fn=lambda s: 2 * _window_points(s) * s["C"],
        check_fn=_window_check),
    "pool2d": OpSpec(
        name="pool2d", shape_keys=("N", "H", "W", "C", "R", "S"),
        optional_keys={"stride": 1, "pad": 0},
        doc="pool[N,OH,OW,C] = max or average of data[N,H,W,C] over R x S windows (avg divides by R*S)",
        build_fn=pool2d,
        input_shapes_fn=lambda s: [_nhwc(s)],
        output_shape_fn=lambda s: (s["N"], *_conv_out(s), s["C"]),
        reference_fn=_pool_reference,
        # one max or add per window point; avg adds one division per output point
        flops_fn=lambda s: _window_points(s) * s["C"] + (s["N"] * math.prod(_conv_out(s)) * s["C"]
                                                          if s["kind"] == "avg" else 0),
        reduces=False,
        check_fn=_pool_check,
        options={"kind": ("max", "avg")}),
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
