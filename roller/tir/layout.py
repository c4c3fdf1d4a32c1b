"""A prepacked input's layout (``roller.plan.prepack.PackedLayout``) in TIR terms: the index maps code generation
applies to the parameter (``Schedule.transform_layout``), and the same maps applied to a constant with numpy."""
from __future__ import annotations

import numpy as np

from roller.errors import BuildError
from roller.plan.prepack import PackedLayout


def index_maps(layout: PackedLayout) -> list:
    """The ``tvm.tirx.IndexMap`` steps from the buffer's indices to the packed ones: the position of the
    tile at each level, then the element within the smallest tile; with row padding, the last dimension
    split by the padded row length, a split TVM pads; with ``dot``, the reduced dimension split by it within the
    smallest tile, its remainder last."""
    from tvm.tirx import IndexMap

    if len(layout.orders) != len(layout.tiles) + 1:
        raise BuildError(f"a packed layout with {len(layout.tiles)} tile levels needs {len(layout.tiles) + 1} orders, "
                         f"got {len(layout.orders)}")
    outer = (layout.shape,) + layout.tiles  # each level's tile and the one it splits

    def within(x, d, level):  # the index within the tile of ``level`` (0: the whole buffer)
        return x[d] % outer[level][d] if outer[level][d] < layout.shape[d] else x[d]

    def packed(*x):
        out = []
        for level, (tile, order) in enumerate(zip(layout.tiles, layout.orders)):
            out += [within(x, d, level) // tile[d] for d in order if tile[d] < outer[level][d]]
        last = len(layout.tiles)
        if layout.dot == 1:
            return out + [within(x, d, last) for d in layout.orders[-1]]
        # dot-product lanes: the reduced dimension's innermost ``dot`` elements stored last (its dot steps in
        # place, where the smallest tile holds more than one: a zero index would not invert)
        steps = layout.tiles[-1][layout.dot_dim] > layout.dot
        inner = [within(x, d, last) // layout.dot if d == layout.dot_dim else within(x, d, last)
                 for d in layout.orders[-1] if d != layout.dot_dim or steps]
        return out + inner + [x[layout.dot_dim] % layout.dot]

    maps = [IndexMap.from_func(packed, ndim=len(layout.shape), index_dtype="int32")]
    if layout.row_pad:
        row = layout.tiles[-1][layout.orders[-1][-1]] + layout.row_pad
        n = len(maps[0].final_indices)
        maps.append(IndexMap.from_func(lambda *y: list(y[:-1]) + [y[-1] // row, y[-1] % row], ndim=n,
                                       index_dtype="int32"))
    return maps


def pack_constant(layout: PackedLayout, array: np.ndarray) -> np.ndarray:
    """``array`` (of ``shape``) stored in this layout: each index map evaluated with numpy over every
    index, padding zero."""
    if tuple(array.shape) != layout.shape:
        raise BuildError(f"a prepacked input of shape {list(layout.shape)} got an array of shape {list(array.shape)}")
    for m in index_maps(layout):
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
