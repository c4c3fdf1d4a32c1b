"""A tensor expression as plain data: loop axes, each tensor's affine access map, flops.

This is what the policy sees of an operator. ``roller.tir.analysis`` builds it from a TVM PrimFunc; tests
build it by hand. Index convention: tensor dimension d is indexed by ``sum(coef * axis)`` over the pairs
in ``index[d]`` plus a constant offset that the policy ignores (it moves a tile, it does not resize it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property

from roller.dtypes import dtype_bytes
from roller.errors import UnsupportedExpressionError

SPATIAL = "spatial"
REDUCE = "reduce"


@dataclass(frozen=True)
class Axis:
    """One loop axis. ``parts`` lists the original (name, extent) axes it fuses, outer first."""

    name: str
    extent: int
    kind: str  # SPATIAL or REDUCE
    parts: tuple[tuple[str, int], ...] = ()

    def __post_init__(self):
        if self.kind not in (SPATIAL, REDUCE):
            raise UnsupportedExpressionError(f"axis {self.name}: kind must be {SPATIAL!r} or {REDUCE!r}")
        if not self.parts:
            object.__setattr__(self, "parts", ((self.name, self.extent),))


@dataclass(frozen=True)
class TensorAccess:
    """A tensor and how the loop axes index it: ``index[d]`` is ((axis, coef), ...) for dimension d."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    index: tuple[tuple[tuple[str, int], ...], ...]
    # set on the access of a packed copy whose dimensions are the tensor's in this order (a transposed
    # layout, roller.plan.rtile.layout_expr); empty for the tensor as stored
    packed_order: tuple[int, ...] = ()

    @cached_property  # the fields never change; construction asks ~10^6 times
    def elem_bytes(self) -> int:
        return dtype_bytes(self.dtype)

    @cached_property  # construction asks for it per tile; the access never changes
    def axes(self) -> frozenset[str]:
        return frozenset(a for dim in self.index for a, _ in dim)

    @cached_property
    def axis_order(self) -> tuple[str, ...]:
        """The axes that index the tensor, each once, in a fixed order (a key of its tile's region)."""
        return tuple(sorted(self.axes))

    @cached_property
    def _region_terms(self) -> tuple[tuple[int, tuple[tuple[str, int], ...]], ...]:
        """(size, ((axis, |coef|), ...)) per dimension: what region() reads, prepared once."""
        return tuple((size, tuple((a, abs(c)) for a, c in dim)) for dim, size in zip(self.index, self.shape))

    def region(self, tile: dict[str, int], distinct: bool = False) -> tuple[int, ...]:
        """Extent of the region a tile touches, per dimension: a sliding window where several axes
        index one dimension, ``sum(coef * (t - 1)) + 1``, clipped to the tensor's shape. With ``distinct``,
        the indices the tile reads rather than their span: a strided axis (a stride-2 convolution's
        ``2 * w``) reads every other one, and a window whose smaller step does not bridge the larger
        (``2 * h + r`` with one r a tile) reads separate runs."""
        out = []
        for size, dim in self._region_terms:  # plain loops: construction calls this ~10^6 times
            if len(dim) == 1:
                a, c = dim[0]
                n = tile[a] if c == 1 or distinct else c * (tile[a] - 1) + 1
            else:
                n = 1
                for a, c in dim:
                    n += c * (tile[a] - 1)
                if distinct and len(dim) == 2:
                    (a1, c1), (a2, c2) = sorted(dim, key=lambda ac: ac[1])
                    run = c1 * (tile[a1] - 1) + 1  # the span of the smaller step's axis
                    if run < c2 and tile[a2] > 1:  # runs that do not meet
                        n = tile[a2] * (tile[a1] if c1 > 1 else run)
            out.append(n if n < size else size)
        return tuple(out)

    def innermost_axes(self) -> tuple[str, ...]:
        """Axes that index the last (contiguous) dimension with coefficient 1."""
        return self._innermost

    @cached_property
    def _innermost(self) -> tuple[str, ...]:
        return tuple(a for a, c in self.index[-1] if c == 1) if self.index else ()


@dataclass(frozen=True)
class Expr:
    """One operator: the main block's axes (iteration order), its inputs and its output.

    ``flops_per_point`` counts arithmetic operations per point of the iteration space (2 for a
    multiply-add). ``block`` names the main block in the PrimFunc, for code generation.
    """

    name: str
    axes: tuple[Axis, ...]
    inputs: tuple[TensorAccess, ...]
    output: TensorAccess
    flops_per_point: int = 2
    block: str = ""
    epilogue: tuple[str, ...] = field(default=())  # names of inlined elementwise stages, for reports
    # reduce axes along which zero-padded inputs leave the result unchanged (a sum of products with a
    # factor they index); filled by roller.tir.analysis, empty when unknown (such axes are then predicated)
    zero_pad_axes: tuple[str, ...] = field(default=())
    # inputs that a producer stage of the function writes (the operator's own zero padding, pad_temp):
    # the code runs that stage per top tile, over the tile's region; filled by roller.tir.analysis
    staged: tuple[str, ...] = field(default=())
    # staged inputs whose stage is zero padding only (no layout gather): a plan may inline it into the main
    # block instead (RProgram.inlined), reading the tensor directly behind a bounds check
    inlinable: tuple[str, ...] = field(default=())
    # per inlinable input, the zero padding its stage adds before and after each dimension ((before, after),
    # ...); filled by roller.tir.analysis where the stage reads its source at constant offsets
    pad_widths: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = field(default=())
    # staged inputs whose stage repeats each element it reads over this many consecutive elements it writes
    # (a grouped convolution's group_rep: one input channel for the K/groups output channels of its group):
    # the stage reads 1/repeat of the bytes it writes; filled by roller.tir.analysis
    repeats: tuple[tuple[str, int], ...] = field(default=())
    # the dtype the main block accumulates in (its own output buffer's, before an epilogue casts: an integer
    # matmul's int32 under a float rescale); "" when unknown (then the output's)
    accumulates: str = ""
    # arithmetic operations per output point of the fused elementwise epilogue, counted as flops_per_point is
    # (a QDQ convolution's rescale, rounding, clipping, residual and requantization: ~17)
    epilogue_ops: int = 0

    def __post_init__(self):
        names = [a.name for a in self.axes]
        if len(set(names)) != len(names):
            raise UnsupportedExpressionError(f"{self.name}: axis names must be unique, got {names}")
        for a in self.axes:
            if a.extent <= 0:
                raise UnsupportedExpressionError(f"{self.name}: axis {a.name} has extent {a.extent}; extents must be >= 1")
        for t in self.tensors:
            unknown = t.axes - set(names)
            if unknown:
                raise UnsupportedExpressionError(f"{self.name}: tensor {t.name} is indexed by unknown axes {sorted(unknown)}")
            if len(t.index) != len(t.shape):
                raise UnsupportedExpressionError(f"{self.name}: tensor {t.name} has {len(t.shape)} dims but "
                                                 f"{len(t.index)} indices")

    def repeat(self, name: str) -> int:
        """How many elements input ``name``'s stage writes per element it reads (1: a plain copy or none)."""
        return dict(self.repeats).get(name, 1)

    # the fields never change: the derived tuples below are made once (construction asks ~10^5 times)
    @cached_property
    def tensors(self) -> tuple[TensorAccess, ...]:
        return self.inputs + (self.output,)

    @property
    def dtype(self) -> str:
        return self.output.dtype

    @property
    def compute_dtype(self) -> str:
        """The dtype of the arithmetic: what the main block accumulates in (an integer convolution's int32
        under an epilogue that quantizes to uint8), else the output's."""
        return self.accumulates or self.output.dtype

    @property
    def in_dtype(self) -> str:
        return self.inputs[0].dtype if self.inputs else self.output.dtype

    def axis(self, name: str) -> Axis:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(name)

    @property
    def extents(self) -> dict[str, int]:
        return {a.name: a.extent for a in self.axes}

    @cached_property
    def spatial_axes(self) -> tuple[Axis, ...]:
        return tuple(a for a in self.axes if a.kind == SPATIAL)

    @cached_property
    def reduce_axes(self) -> tuple[Axis, ...]:
        return tuple(a for a in self.axes if a.kind == REDUCE)

    @property
    def points(self) -> int:
        return math.prod(a.extent for a in self.axes)

    @property
    def flops(self) -> int:
        return self.points * self.flops_per_point

    def to_dict(self) -> dict:
        return {
            "name": self.name, "flops": self.flops, "block": self.block,
            "axes": [{"name": a.name, "extent": a.extent, "kind": a.kind, "parts": [list(p) for p in a.parts]}
                     for a in self.axes],
            "tensors": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype,
                         "index": [[list(p) for p in dim] for dim in t.index],
                         "role": "output" if t is self.output else "input"} for t in self.tensors],
        }


# ---------------------------------------------------------------------------------------------
# Axis fusion (the paper's pass for irregular shapes): [17, 11, 3] -> [561].

def plain_dim(t: TensorAccess, axis: str, ones: frozenset[str] = frozenset()) -> int | None:
    """The dimension indexed by exactly ``axis`` with coefficient 1 (besides axes of extent 1, ``ones``,
    which are always 0: a 1x1 convolution's ``h + r``), or None."""
    for d, dim in enumerate(t.index):
        if tuple(p for p in dim if p[0] not in ones) == ((axis, 1),):
            return d
    return None


def _ones(expr: Expr) -> frozenset[str]:
    return frozenset(a.name for a in expr.axes if a.extent == 1)


def _can_fuse(expr: Expr, outer: Axis, inner: Axis) -> bool:
    if outer.kind != inner.kind:
        return False
    if outer.kind != REDUCE and expr.reduce_axes:
        # A reduction's register accumulator is written back per tile; over a fused spatial loop TVM
        # derives that write-back's region through div/mod and over-approximates it to whole rows, so
        # it writes elements other tiles own (seen on a 1x1 convolution with h and w fused).
        return False
    for t in expr.tensors:
        has_o, has_i = outer.name in t.axes, inner.name in t.axes
        if not has_o and not has_i:
            continue
        if has_o != has_i:
            return False
        ones = _ones(expr)
        do, di = plain_dim(t, outer.name, ones), plain_dim(t, inner.name, ones)
        if do is None or di is None or di != do + 1 or t.shape[di] != inner.extent or t.shape[do] != outer.extent:
            return False
    return True


def _fuse_pair(expr: Expr, outer: Axis, inner: Axis) -> Expr:
    fused = Axis(f"{outer.name}_{inner.name}", outer.extent * inner.extent, outer.kind, outer.parts + inner.parts)

    def fuse_tensor(t: TensorAccess) -> TensorAccess:
        if outer.name not in t.axes:
            return t
        d = plain_dim(t, outer.name, _ones(expr))
        shape = t.shape[:d] + (t.shape[d] * t.shape[d + 1],) + t.shape[d + 2:]
        index = t.index[:d] + (((fused.name, 1),),) + t.index[d + 2:]
        return replace(t, shape=shape, index=index)

    axes = []
    for a in expr.axes:
        if a.name == outer.name:
            axes.append(fused)
        elif a.name != inner.name:
            axes.append(a)
    return replace(expr, axes=tuple(axes), inputs=tuple(fuse_tensor(t) for t in expr.inputs),
                   output=fuse_tensor(expr.output))


def fuse_axes(expr: Expr) -> Expr:
    """Merges axes that are adjacent (outer then inner) in every tensor that has them and absent from
    the rest, until none remain. Fused axes keep their original axes in ``Axis.parts``."""
    changed = True
    while changed:
        changed = False
        for o in expr.axes:
            for i in expr.axes:
                if o is not i and _can_fuse(expr, o, i):
                    expr = _fuse_pair(expr, o, i)
                    changed = True
                    break
            if changed:
                break
    return expr
