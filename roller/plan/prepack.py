"""Constant inputs packed once, ahead of the kernel: a model's weights arrive in the layout the plan walks.

A plan reads each input tile by tile at every memory level, and copies some of them per top tile into a
compact buffer (``RProgram.packed``, ``RProgram.layouts``, rows padded by ``RProgram.storage_pad``). An
input that is a constant at every call (a weight) is instead stored once, when the model is compiled, in
the plan's tiles: every tile of every level one contiguous block, the blocks in the order the kernel walks
them (``RProgram.prepacked``). The kernel reads it in place, without a copy, and its first pass over a
cold weight streams. :class:`PackedLayout` is that layout as plain data; ``roller.tir.layout`` turns it into
the index maps code generation applies to the parameter (``Schedule.transform_layout``) and applies them
to an array (the constant, with numpy at compile time), so both sides follow one description.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, replace
from typing import Mapping, Sequence


from roller.errors import BuildError
from roller.plan.dot import dot_axis
from roller.plan.expr import REDUCE, Expr, TensorAccess
from roller.plan.rtile import clamp_tiles, compute_lanes
from roller.plan.tails import tiling_extents


@dataclass(frozen=True)
class PackedLayout:
    """How a prepacked input is stored, per dimension of the buffer (its own, unfused ones). ``shape``: the
    buffer's shape; ``tiles``: the plan's tile at each level, the top's first, as extents along each
    dimension (a dimension's extent where one tile covers it); ``orders``: at each level, the order in
    which the kernel walks that level's tiles within the tile above (a permutation of the dimensions), and
    last the order of the elements within the smallest tile; ``row_pad``: elements padding each row of
    the smallest tile (to whole vectors); ``dot``: where above 1, the innermost ``dot`` elements of dimension
    ``dot_dim`` (the reduced one) within the smallest tile are stored last, after the vector axis (``[k/4, n,
    4]``: dot-product lanes read 4 x lanes contiguous bytes, ``roller.plan.dot``). Every tile is one
    contiguous block, and the blocks follow each other in the order the kernel walks them. Padded tails (a
    tile overhanging its dimension, the row padding) hold zeros."""

    shape: tuple[int, ...]
    tiles: tuple[tuple[int, ...], ...]
    orders: tuple[tuple[int, ...], ...]
    row_pad: int = 0
    dot: int = 1
    dot_dim: int = 0

    def to_dict(self) -> dict:
        return {"shape": list(self.shape), "tiles": [list(t) for t in self.tiles],
                "orders": [list(o) for o in self.orders], "row_pad": self.row_pad, "dot": self.dot,
                "dot_dim": self.dot_dim}

    @classmethod
    def from_dict(cls, d: Mapping) -> "PackedLayout":
        return cls(tuple(d["shape"]), tuple(tuple(t) for t in d["tiles"]), tuple(tuple(o) for o in d["orders"]),
                   int(d.get("row_pad", 0)), int(d.get("dot", 1)), int(d.get("dot_dim", 0)))

    def block_elements(self) -> int:
        """Elements stored per top tile: the top tile's, its smallest tiles' rows padded."""
        n = math.prod(self.tiles[0])
        if self.row_pad:
            row = self.tiles[-1][self.orders[-1][-1]]
            n = n // row * (row + self.row_pad)
        return n


def packed_layout(expr: Expr, t: TensorAccess, tiles: Sequence[Mapping[str, int]], vector_axis: str | None,
                  lanes: int, dot: int = 1) -> PackedLayout | None:
    """The layout in which input ``t`` arrives prepacked under a plan with these tiles (reg first, clamped
    as code generation runs them), or None when it cannot: a dimension indexed other than by one axis (a
    window, a stride), or by a fused axis whose top tile covers part of it (its tile is no box of the
    buffer). The kernel walks the tiles of each level spatial axes first, then reduced ones, and a register
    tile reduced axes first, the vector axis last (``codegen.cpu``): the blocks are stored in that order,
    so the kernel's first pass over them streams. Rows along the vector axis are padded to whole vectors.
    With ``dot`` above 1 (the plan's ``RProgram.dot_depth``) the dot axis's (``dot.dot_axis``) innermost
    ``dot`` elements go last in the smallest tile, whose extent along it must be a multiple of ``dot``."""
    if t.packed_order:  # a transposed access (rtile.layout_expr): the tensor as stored
        stored = sorted(range(len(t.index)), key=lambda i: t.packed_order[i])
        t = replace(t, index=tuple(t.index[i] for i in stored), shape=tuple(t.shape[i] for i in stored), packed_order=())
    extents = tiling_extents(expr, vector_axis, lanes)
    shape, sizes, axis_of = [], [], []  # per buffer dimension: extent, tile per level (top first), axis
    for i, dim in enumerate(t.index):
        if len(dim) != 1 or dim[0][1] != 1:
            return None
        axis = expr.axis(dim[0][0])
        clamped = [min(x, axis.extent) for x in reversed(clamp_tiles(extents[axis.name], [tl[axis.name] for tl in tiles]))]
        if t.shape[i] != axis.extent or (len(axis.parts) > 1 and clamped[0] < axis.extent):
            return None
        # a fused axis's dimension (whole at every level) unfolds into its parts, the buffer's dimensions
        parts = [e for _, e in axis.parts] if len(axis.parts) > 1 else [axis.extent]
        for e in parts:
            shape.append(e)
            sizes.append(clamped if len(parts) == 1 else [e] * len(clamped))
            axis_of.append(axis.name)
    if not shape:  # a scalar (a 0-d constant such as attention's scale): nothing to lay out
        return None
    position = {a.name: i for i, a in enumerate(expr.axes)}
    reduce = {a.name for a in expr.axes if a.kind == REDUCE}
    dims = range(len(shape))
    levels = tuple(tuple(sorted(dims, key=lambda d: (axis_of[d] in reduce, position[axis_of[d]], d)))
                   for _ in range(len(tiles) - 1))
    last = tuple(sorted(dims, key=lambda d: (axis_of[d] not in reduce, axis_of[d] == vector_axis,
                                             position[axis_of[d]], d)))
    row = sizes[last[-1]][-1]
    pad = lanes - row % lanes if axis_of[last[-1]] == vector_axis and row > lanes and row % lanes else 0
    k = dot_axis(expr, vector_axis) if dot > 1 else None
    dot_dim = next((d for d in dims if axis_of[d] == k), None) if k is not None else None
    if dot_dim is not None and (sizes[dot_dim][-1] % dot or pad):
        raise BuildError(f"{expr.name}: {t.name} cannot be packed {dot} deep along {axis_of[dot_dim]}: its register "
                         f"tile takes {sizes[dot_dim][-1]} of it{' and pads its rows' if pad else ''}")
    return PackedLayout(tuple(shape), tuple(tuple(s[l] for s in sizes) for l in range(len(tiles))),
                        (tuple(dims),) + levels + (last,), pad, dot if dot_dim is not None else 1, dot_dim or 0)


def prepackable(expr: Expr, tiles: Sequence[Mapping[str, int]], vector_axis: str | None, lanes: int,
                padded: Sequence[str], constants: frozenset[str]) -> tuple[str, ...]:
    """The inputs that arrive prepacked: the ``constants`` the function reads as they are (no producer
    stage writes them), none of whose axes the plan pads (their padded copy is made per call), and whose
    tiles are boxes of the buffer (:func:`packed_layout`). Whether or not the plan would copy them: stored
    in its tiles, every input reads as dense blocks."""
    out = []
    for t in expr.inputs:
        if (t.name in constants and t.name not in expr.staged and not t.axes & set(padded)
                and packed_layout(expr, t, tiles, vector_axis, lanes) is not None):
            out.append(t.name)
    return tuple(out)


def program_layouts(expr: Expr, program, device) -> dict[str, PackedLayout]:
    """Input name -> the layout it arrives in, for each input ``program`` (an RProgram) prepacks; ``expr``
    is the function's Expr as analysed."""
    lanes = compute_lanes(expr, device)
    out = {}
    for t in expr.inputs:
        if t.name in program.prepacked:
            layout = packed_layout(expr, t, program.tiles, program.vector_axis, lanes, program.dot_depth)
            if layout is None:
                raise BuildError(f"{expr.name}: the plan prepacks {t.name}, whose top tile is no box of the buffer")
            out[t.name] = layout
    return out
