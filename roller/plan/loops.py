"""The loop nest the CPU code generator derives from a plan, as the policy sees it: each axis's loop extents,
and the two tail splits both the model and code generation must agree on (the last top tile run alone, the
partial last vector split off)."""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from roller.plan.expr import REDUCE, Expr
from roller.plan.rprogram import RProgram
from roller.plan.rtile import clamp_tiles
from roller.plan.tails import tiling_extents


def axis_factors(expr: Expr, tiles: Sequence[Mapping[str, int]], vector_axis: str | None,
                 lanes: int) -> dict[str, list[int]]:
    """Axis -> its loops' extents as the CPU schedule splits it: the grid of top tiles, then each level's
    tiles in the level above (top - 1 .. 1), then the register tile (tile sizes clamped to the tiling
    extents; a factor of 1 makes no loop)."""
    tiling = tiling_extents(expr, vector_axis, lanes)
    out = {}
    n = len(tiles)
    for a in expr.axes:
        sizes = clamp_tiles(tiling[a.name], [t[a.name] for t in tiles])
        out[a.name] = ([math.ceil(a.extent / sizes[-1])] + [sizes[l] // sizes[l - 1] for l in range(n - 1, 0, -1)]
                       + [sizes[0]])
    return out


def serial_tail(expr: Expr, program: RProgram, lanes: int) -> bool:
    """Whether the parallel grid loop itself carries a loop-partition hint, so that lowering splits its last
    top tile off and runs it alone after the others: one predicated spatial axis's grid loop is the whole
    parallel grid (the held grid loop, ``program.held_grid``, is not part of it), with no tile loop of that
    axis below it to carry the split (docs/design-notes.md#tails-serial_tail). The one rule for the model
    (a wave more, ``cost.estimate``), balancing (:func:`balanced_grid`) and code generation
    (``targets/cpu/schedule.py``, which places the hint where this says)."""
    if not program.predicated:  # every estimate asks: most plans predicate nothing
        return False
    f = axis_factors(expr, program.tiles, program.vector_axis, lanes)
    grids = [a.name for a in expr.spatial_axes if f[a.name][0] > 1 and a.name != program.held_grid]
    if len(grids) != 1 or grids[0] not in program.predicated:
        return False
    return all(x <= 1 for x in f[grids[0]][1:-1])


def vector_tail_split(expr: Expr, program: RProgram, lanes: int) -> bool:
    """Whether code generation splits the partial last vector of the plan's predicated spatial vector axis off
    as a vector loop of its own (narrower, constant lanes): once every loop above it is split at its last
    iteration, where the axis has no grid loop (one top tile covers it), its grid loop is the plan's held one
    (``program.held_grid``), or it is the parallel loop itself with no tile loop of the axis below it. The
    one rule for the model (``tails.tail_compute_factor``) and code generation (``targets/cpu/schedule.py``);
    construction, which has no plan yet, asks ``tails.vector_tail_split`` of the tiles (the same answer for
    a plan whose ``held_grid`` is :func:`held_grid`'s)."""
    va = program.vector_axis
    if va is None or va not in program.predicated or expr.axis(va).kind == REDUCE:
        return False
    f = axis_factors(expr, program.tiles, va, lanes)
    return f[va][0] <= 1 or program.held_grid == va or all(x <= 1 for x in f[va][1:-1])
