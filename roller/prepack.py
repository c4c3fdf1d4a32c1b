"""Inputs packed once, ahead of the kernel: a constant (a model's weight) the plan packs arrives packed.

A plan copies a packed input per top tile into a compact buffer (``RProgram.packed``, in the plan's
layout ``RProgram.layouts``, rows padded by ``RProgram.storage_pad``). When the input is a constant at
every call, the same copy can be made once when the model is compiled: the input is then stored tile by
tile, each top tile's region contiguous in the plan's layout with padded rows, and the kernel reads it in
place (``RProgram.prepacked``). :class:`PackedLayout` is that layout as plain data; it gives the index maps
code generation applies to the parameter (``Schedule.transform_layout``) and applies them to an array
(the constant, with numpy at compile time), so both sides follow one description.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .errors import BuildError
from .expr import Expr, TensorAccess
from .rtile import compute_lanes
from .tails import clamped_top


@dataclass(frozen=True)
class PackedLayout:
    """How a prepacked input is stored. ``shape``: the buffer's own shape; ``tile``: the top tile's extent
    along each buffer dimension (the dimension's extent where one tile covers it); ``order``: the buffer
    dimensions within a tile, outermost first (the plan's layout); ``row_pad``: elements padding each row
    of a tile (its last dimension). The tile grid's dimensions go first, in buffer order; padded tails
    (a tile overhanging its dimension, the row padding) hold zeros."""

    shape: tuple[int, ...]
    tile: tuple[int, ...]
    order: tuple[int, ...]
    row_pad: int = 0

    def to_dict(self) -> dict:
        return {"shape": list(self.shape), "tile": list(self.tile), "order": list(self.order), "row_pad": self.row_pad}

    @classmethod
    def from_dict(cls, d: Mapping) -> "PackedLayout":
        return cls(tuple(d["shape"]), tuple(d["tile"]), tuple(d["order"]), int(d.get("row_pad", 0)))

    def index_maps(self) -> list:
        """The ``tvm.tirx.IndexMap`` steps from the buffer's indices to the packed ones: tiles first, then
        (with row padding) the last dimension split by the padded row length, a split TVM pads."""
        from tvm.tirx import IndexMap

        tiled = [d for d in range(len(self.shape)) if self.tile[d] < self.shape[d]]

        def tiles(*x):
            return ([x[d] // self.tile[d] for d in tiled]
                    + [x[d] % self.tile[d] if d in tiled else x[d] for d in self.order])

        maps = [IndexMap.from_func(tiles, ndim=len(self.shape), index_dtype="int32")]
        if self.row_pad:
            row = self.tile[self.order[-1]] + self.row_pad
            n = len(tiled) + len(self.order)
            maps.append(IndexMap.from_func(lambda *y: list(y[:-1]) + [y[-1] // row, y[-1] % row], ndim=n,
                                           index_dtype="int32"))
        return maps

    def apply(self, array: np.ndarray) -> np.ndarray:
        """``array`` (of ``shape``) stored in this layout: each index map evaluated with numpy over every
        index, padding zero."""
        if tuple(array.shape) != self.shape:
            raise BuildError(f"a prepacked input of shape {list(self.shape)} got an array of shape {list(array.shape)}")
        for m in self.index_maps():
            array = _map_array(m, array)
        return array


def _map_array(index_map, src: np.ndarray) -> np.ndarray:
    """``src`` moved to the indices ``index_map`` gives (its final indices evaluated over numpy index
    grids); positions no index reaches stay zero."""
    dst = np.zeros([int(d) for d in index_map.map_shape(list(src.shape))], dtype=src.dtype)
    env = {v: g for v, g in zip(index_map.initial_indices, np.indices(src.shape, sparse=True))}
    dst[tuple(_evaluate(e, env) for e in index_map.final_indices)] = src
    return dst


def _evaluate(e, env):
    """An index expression of an IndexMap (variables, integers, + - * // %) over numpy arrays."""
    from tvm import tirx

    ops = {tirx.Add: np.add, tirx.Sub: np.subtract, tirx.Mul: np.multiply, tirx.FloorDiv: np.floor_divide,
           tirx.FloorMod: np.mod}
    if isinstance(e, tirx.Var):
        return env[e]
    if isinstance(e, tirx.IntImm):
        return int(e.value)
    if type(e) in ops:
        return ops[type(e)](_evaluate(e.a, env), _evaluate(e.b, env))
    raise BuildError(f"index map expression {e} is not one a prepacked layout uses")


def packed_layout(expr: Expr, t: TensorAccess, tiles: Sequence[Mapping[str, int]], vector_axis: str | None,
                  lanes: int, storage_pad: Mapping[str, int]) -> PackedLayout | None:
    """The layout in which input ``t`` (as ``layout_expr`` gives it, transposed or not) arrives prepacked
    under a plan with these tiles, or None when it cannot: a dimension indexed other than by one axis (a
    window, a stride), or by a fused axis whose top tile covers part of it (its tile is no box of the
    buffer). The row padding is the plan's for a copy per top tile, none where one tile covers every
    spatial axis (code generation then packs once, at root, unpadded)."""
    order = t.packed_order or tuple(range(len(t.shape)))
    shape: list[int] = [0] * len(t.shape)
    tile: list[int] = [0] * len(t.shape)
    parts: list[list[int]] = [[]] * len(t.shape)  # original dimension -> its buffer dimensions' extents
    for i, dim in enumerate(t.index):
        if len(dim) != 1 or dim[0][1] != 1:
            return None
        axis = expr.axis(dim[0][0])
        top = clamped_top(expr, tiles, axis.name, vector_axis, lanes)
        extents = [e for _, e in axis.parts]
        if t.shape[i] != axis.extent or (len(extents) > 1 and top < axis.extent):
            return None
        parts[order[i]] = extents
        shape[order[i]], tile[order[i]] = axis.extent, min(top, axis.extent) if len(extents) == 1 else axis.extent
    # the buffer's own dimensions: a fused axis's dimension (whole tile) unfolds into its parts
    bshape, btile, first = [], [], []
    for d in range(len(shape)):
        first.append(len(bshape))
        bshape += parts[d]
        btile += parts[d] if len(parts[d]) > 1 else [tile[d]]
    border = tuple(first[d] + k for d in order for k in range(len(parts[d])))
    grid = any(math.ceil(a.extent / clamped_top(expr, tiles, a.name, vector_axis, lanes)) > 1
               for a in expr.spatial_axes)
    return PackedLayout(tuple(bshape), tuple(btile), border, storage_pad.get(t.name, 0) if grid else 0)


def prepackable(expr: Expr, tiles: Sequence[Mapping[str, int]], vector_axis: str | None, lanes: int,
                packed: Sequence[str], padded: Sequence[str], constants: frozenset[str]) -> tuple[str, ...]:
    """The packed inputs that arrive prepacked: constants read in place by the main block (no producer
    stage of the function), none of whose axes the plan pads (their padded copy is made per call), and
    whose tile is a box of the buffer (:func:`packed_layout`)."""
    out = []
    for t in expr.inputs:
        if (t.name in packed and t.name in constants and t.name not in expr.staged and not t.axes & set(padded)
                and packed_layout(expr, t, tiles, vector_axis, lanes, {}) is not None):
            out.append(t.name)
    return tuple(out)


def program_layouts(expr: Expr, program, device) -> dict[str, PackedLayout]:
    """Input name -> the layout it arrives in, for each input ``program`` (an RProgram) prepacks; ``expr``
    is the function's Expr as analysed (the plan's transposed layouts are applied here)."""
    from .rtile import layout_expr

    ex = layout_expr(expr, program.vector_axis)
    lanes = compute_lanes(ex, device)
    out = {}
    for t in ex.inputs:
        if t.name in program.prepacked:
            layout = packed_layout(ex, t, program.tiles, program.vector_axis, lanes, program.storage_pad)
            if layout is None:
                raise BuildError(f"{expr.name}: the plan prepacks {t.name}, whose top tile is no box of the buffer")
            out[t.name] = layout
    return out
