"""Panel tiles: the first cache level's tile shaped as BLIS shapes a GEMM's (the micro-panel of one input stays
in the cache, the other input streams past it).

Scale-up grows a level's tile until every tensor's region fits the level. For a reduction whose weight-like
input (B of ``C[m, n] = A[m, k] B[k, n]``) does not index some spatial axis (``m``), BLIS keeps a different
shape at L1: the register tile's columns of B over a chunk of the reduction (a micro-panel, ``k_c x n_r``), while
the loop over the L2 tile's rows runs inside it, each row block of A read once from L2 and used against the
panel held in L1. In this project's loop nest (each level iterates the level below's tiles, spatial loops
first), that is an L1 tile with the L2 tile's extent along the axes B does not index, the register tile's
along the other spatial axes, and ``k_c`` of the reduction: its A region (``m_L2 x k_c``) does not fit L1 and
need not, for A streams. The tile cuts what the cache level below delivers per FMA: a register tile's B
vectors come from L1 instead of L2 at every reduction step. The model charges its traffic as for any tile
(``rtile.traffic``: each tile's regions loaded once); construction offers it beside the grown tiles and the
ranking decides.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from roller.device.spec import Device
from roller.plan.expr import REDUCE, Expr
from roller.plan.rtile import LevelRules, axis_step, footprint, streamed_axes

# Share of the first cache level's whole capacity a panel may hold (B's chunk, A's and C's register-tile rows),
# beyond the usable share grown tiles keep: a panel's streamed input only passes through. On the 48 KiB L1 of
# the development Xeon a 32 KiB chunk of B (128 deep under a 4 x 64 register tile) ran ~4% faster than a 16 KiB
# one (docs/design-notes.md#panels-panel_tiles); BLIS sizes its B micro-panels alike.
PANEL_SHARE = 0.75


def panel_capacity(device: Device) -> float:
    """Bytes a panel may hold at the first cache level: PANEL_SHARE of it, at least its usable share."""
    level = device.private_levels[1]
    return max(level.usable_bytes, PANEL_SHARE * level.capacity_bytes)


def resident_input(expr: Expr, vector_axis: str | None) -> str | None:
    """The input a panel keeps in the first cache level: the largest input that the vector axis indexes
    (its register-tile rows are vector loads; the streamed input's are broadcasts) and some spatial axis of
    extent above 1 does not (a GEMM's B, a 1x1 convolution's weight), where the expression reduces
    along exactly one axis longer than 1 that indexes it; None otherwise."""
    reduce = [a for a in expr.axes if a.kind == REDUCE and a.extent > 1]
    if len(reduce) != 1:
        return None
    spatial = {a.name for a in expr.axes if a.kind != REDUCE and a.extent > 1}
    best = None
    for t in expr.inputs:
        if (vector_axis in t.axes and reduce[0].name in t.axes and spatial - t.axes
                and any(len(d) == 1 for d in t.index)):
            size = math.prod(t.shape)
            if best is None or size > best[0]:
                best = (size, t.name)
    return best[1] if best else None


def panel_tiles(expr: Expr, device: Device, tiles: Sequence[Mapping[str, int]],
                vector_axis: str | None, constants: frozenset[str] = frozenset()) -> list[list[dict[str, int]]]:
    """The plan ``tiles`` (reg, L1, L2, ...) with its L1 tile replaced by a panel (module docstring): the
    L2 tile's extent along the spatial axes the resident input does not index, the register tile's along
    the others, and a reduction chunk that nests and aligns (a multiple of the register tile's and of L1's
    alignment step, dividing the L2 tile's, or the L2 tile's whole):
    the largest whose panel fits :func:`panel_capacity` as a panel is held (``rtile.level_footprints``: the
    resident input's chunk whole, the streamed inputs' and the output's register-tile rows), and the largest
    of half that; none where the plan has no such level or the expression no resident input; a panel that is the
    plan's own L1 tile is left out. Nor where the resident input is one of the ``constants`` (a model's weight,
    prepacked in the plan's tiles): inside whole models such panels ran slower (BERT-base at batch 8, 110
    against 97 ms), not understood yet (docs/operator-suite.md, "panel tiles for GEMMs")."""
    if len(tiles) < 3 or len(device.private_levels) < 3:
        return []
    name = resident_input(expr, vector_axis)
    if name is None or name in constants:
        return []
    resident = next(t for t in expr.inputs if t.name == name)
    reg, l1, l2 = tiles[0], tiles[1], tiles[2]
    k = next(a.name for a in expr.axes if a.kind == REDUCE and a.extent > 1)
    panel = {}
    for a in expr.axes:
        if a.kind == REDUCE:
            panel[a.name] = reg[a.name]  # a reduced axis of extent 1 (a 1x1 convolution's r, s)
            continue
        panel[a.name] = reg[a.name] if a.name in resident.axes else l2[a.name]
    rules = LevelRules.of(device, 1, expr, vector_axis)
    budget = panel_capacity(device)
    fits = []
    step = math.lcm(reg[k], axis_step(expr, k, rules))  # nested in the register tile, aligned at L1
    sizes = list(range(step, l2[k], step)) + [l2[k]]
    for chunk in sizes:
        if l2[k] % chunk == 0:
            held = footprint(expr, {**reg, k: chunk}, rules)  # held: the register tile's rows over the chunk
            if held > budget:
                break
            fits.append((chunk, held))
    chosen = {c for c, held in fits[-1:]} | {c for c, held in fits if held <= budget / 2}
    out = []
    for c in sorted(chosen, reverse=True)[:2]:
        tile = {a.name: (c if a.name == k else panel[a.name]) for a in expr.axes}
        made = [dict(reg), tile] + [dict(t) for t in tiles[2:]]
        if tile != dict(l1) and streamed_axes(expr, made):  # a panel: it spans the L2 tile beyond the register tile
            out.append(made)
    return out
