"""Construction: scale up level by level, scale out over the units, rank with the model (no search).

Scale-up (DESIGN.md, the paper's Figure 8): at the level nearest compute, start from the smallest
aligned tile and grow it along the axis with the best data-reuse score until the next step would not
fit the level or no step saves traffic; the tile becomes the seed of the next level. A few tiles per
level go on (the greedy end, then the ends of the same growth with one axis held at the seed, then the
first compute-bound tile and the step before the end, up to BRANCH), so the levels multiply into a
small set of plans. Scale-out: the top tiles' grid spreads over the units
in waves; a plan with fewer tiles than units is rebuilt with one spatial axis bounded ("shrink").
Plans are ranked with roller.plan.cost; epsilon (the allowed padding waste) grows only when too few exist.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from roller.device.spec import Device
from roller.errors import InvalidShapeError, UnsupportedExpressionError
from roller.plan.expr import REDUCE, Expr
from roller.plan.choices import estimated, plan_choices
from roller.plan.dot import amx_register_tiles, is_amx_tile
from roller.plan.cost import Estimate, compute_rate, rank, source_bandwidth, tensor_bytes
from roller.plan.panels import panel_tiles, resident_input
from roller.plan.rprogram import RProgram
from roller.plan.rtile import (LevelRules, default_vector_axis, aligned_sizes, axis_step, ceil_div, compute_lanes, footprint,
                               level_footprints, exact_axes, layout_expr, next_aligned, packing_bytes,
                               padding_waste, reuse_score, round_up, tile_counts, traffic, vector_candidates)
from roller.plan.tails import (inline_options, partial_sums, spills_window, stack_array,
                               tail_options, tiling_extents)

EPSILON_STEPS = (0.0, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
# Plans gathered (epsilon grown) before ranking, whatever topk asks: the first plan of top-1 (no profiling)
# is then the first of top-10 (a pool of topk can stop at epsilon 0 short of a better padded plan), and
# constructing for 10 costs about what constructing for 1 does; docs/design-notes.md#construct-rank_pool.
RANK_POOL = 10
BRANCH = 4  # tiles per level carried on to the next level
# Where a spatial axis's extent has no divisor up to SMALL_DIVISORS, epsilon grows to EPSILON_ALWAYS even
# with a full pool. ViT's attention (12 x 197x197 @ 197x64): register tiles of one row up to 0.05 (predicted
# 1304 us, ran 706), 6 rows x 4 vectors at 0.1 (predicted 148, ran 196). For every plan it made the suite's
# construction 4x slower; docs/models.md ("ViT-B/16").
EPSILON_ALWAYS = 0.1
SMALL_DIVISORS = 8
# Padding along the vector axis a two-vector register tile may add beyond epsilon (scale_up's two_vectors):
# its last tile is padded or predicated, which the model charges. Set so that an odd count of vectors (11
# padded to 12, 9%) still gets two-vector tiles; docs/design-notes.md#construct-two_vector_waste.
TWO_VECTOR_WASTE = 0.1
# The widest register tile (in vectors along the vector axis) scale_up's fullest() tries; wider ones leave
# too few registers for rows (docs/design-notes.md#construct-fullest).
MAX_REGISTER_VECTORS = 8


@dataclass(frozen=True)
class Construction:
    """The ranked plans of one expression on one device, and how long constructing them took."""

    expr: Expr
    programs: tuple[RProgram, ...]
    epsilon: float
    seconds: float


def _first_tile(expr: Expr, rules: LevelRules, seed: Mapping[str, int], eps: float,
                extents: Mapping[str, int]) -> dict[str, int] | None:
    """The smallest tile at this level that nests the seed and follows the level's alignment."""
    tile = {}
    for a in expr.axes:
        lower = seed.get(a.name, 1)
        size = next_aligned(extents[a.name], lower - 1, axis_step(expr, a.name, rules), lower, eps,
                            exact=a.name in exact_axes(expr, rules))
        if size is None:
            return None
        tile[a.name] = size
    return tile


def _nested_extents(expr: Expr, vector_axis: str | None, lanes: int, seed: Mapping[str, int]) -> dict[str, int]:
    """The extents a level tiles above the tile ``seed``: along the vector axis, the extent the seed pads it to
    (a two-vector register tile over an odd count of vectors): that padding is the register tile's, charged by
    the model, not this level's (the same holds along the other axes; docs/design-notes.md#construct-level_tiles)."""
    extents = tiling_extents(expr, vector_axis, lanes)
    if vector_axis in seed:
        extents[vector_axis] = round_up(extents[vector_axis], seed[vector_axis])
    return extents


def _compute_bound(expr: Expr, tile: Mapping[str, int], rules: LevelRules, device: Device,
                   below_bw_gbps: float, reg: Mapping[str, int]) -> bool:
    """Whether filling this level costs less time than computing on it (the tile is big enough), at the
    rate the register tile ``reg`` computes (the model's, accumulator efficiency included; with the level's
    dot-product lanes, ``LevelRules.dot``, at the int8 peak: a plan whose weight then arrives unpacked runs and is
    charged one lane a step, ``dot.program_dot_depth``, only its tiles grew for the faster rate)."""
    lanes = compute_lanes(expr, device)  # no plan yet: the partial sums this register tile would keep
    compute = expr.flops / (compute_rate(expr, reg, device, rules.vector_axis,
                                         partial_sums(expr, reg, rules.vector_axis, lanes), dot=rules.dot,
                                         amx=is_amx_tile(expr, device, rules.vector_axis, reg)) * 1e9)
    return traffic(expr, tile, rules) / (below_bw_gbps * 1e9) <= compute


def scale_up(expr: Expr, device: Device, index: int, below_tiles: list[Mapping[str, int]], eps: float,
             bounds: Mapping[str, int] | None = None, units_floor: int = 1,
             vector_axis: str | None = None, rescue: bool = False) -> list[dict[str, int]]:
    """Grows a tile at private level ``index`` from the tile of the level below (``below_tiles[-1]``;
    ``below_tiles`` holds every lower level's tile, nearest compute first, and is empty at level 0).

    Returns up to BRANCH distinct tiles in this order: the greedy end, at level 0 the largest tile on the
    way whose accumulators make a stack array (where the greedy end's would not and the next level holds
    the whole reduction), the greedy ends with one axis held at the seed (least traffic first), the first
    compute-bound tile on the way, the step before the end; and beyond BRANCH, where they are new, at level
    0 a register tile two vectors wide and a GEMM's with the most accumulators (``fullest``), and at a middle
    level the tile below grown along the reduction only:
    shapes the growths pass by that the model ranks first where they run fastest.
    With ``rescue`` (construction asks where the picks ended no plan at all), picks that leave the next level
    no room for a tile give way to the last tiles on the growths that do.
    ``bounds`` caps spatial axes (shrink); ``units_floor`` forbids steps that would leave fewer spatial
    tiles than that (scale-out needs tiles for every unit). At level 0 a step is refused where the distinct
    values of a window the register tile slides along no longer fit beside its accumulators
    (``tails.spills_window``).
    The score of a step also counts what it saves the level below: a longer reduction here means fewer
    reloads of the child's output tile.
    """
    bounds = bounds or {}
    if vector_axis is None:
        vector_axis = default_vector_axis(expr)
    rules = LevelRules.of(device, index, expr, vector_axis)
    levels = device.private_levels
    top = index == len(levels) - 1
    source_gbps = levels[index + 1].bandwidth_gbps if not top else source_bandwidth(expr, device, 1)
    seed = below_tiles[-1] if below_tiles else {}
    extents = _nested_extents(expr, vector_axis, rules.lanes, seed)
    tile = _first_tile(expr, rules, seed, eps, extents)

    # The growths below (the greedy one and one per held axis) meet the same tiles again and again:
    # footprints and traffic are computed once per tile (construction time went mostly there).
    memo: dict[tuple, int] = {}

    def cached(kind: str, fn, t: Mapping[str, int]) -> int:
        key = (kind, *t.values())
        if key not in memo:
            memo[key] = fn(t)
        return memo[key]

    def q(t, parent=None):
        if parent is None:
            return cached("q", lambda x: traffic(expr, x, rules), t)
        return cached("qc" + repr(tuple(parent.values())), lambda x: traffic(expr, x, child_rules, parent), t)

    def f(t):
        return cached("f", lambda x: footprint(expr, x, rules), t)

    def held(t: dict[str, int]) -> int:
        """Bytes the tile holds at this level; at the top, with the copies of the inputs it packs."""
        extra = (cached("p", lambda x: packing_bytes(expr, list(below_tiles) + [x], device, vector_axis), t)
                 if top and below_tiles else 0)
        return f(t) + extra

    if tile is None or held(tile) > rules.capacity:
        return []
    child_rules = LevelRules.of(device, index - 1, expr, vector_axis) if below_tiles else None
    registers = levels[0].capacity_bytes // device.units.vector_bytes if device.units.vector_bytes else 0
    limit = max(1, rules.capacity // min(t.elem_bytes for t in expr.tensors))
    steps = {a.name: axis_step(expr, a.name, rules) for a in expr.axes}
    exact = exact_axes(expr, rules)
    contiguity = {a.name: sum(a.name in t.innermost_axes() for t in expr.tensors) for a in expr.axes}
    order = {a.name: i for i, a in enumerate(expr.axes)}

    # What one growth step from a tile can do depends on the tile alone: each axis's next size and its score,
    # never on the axes a growth holds. The growths with an axis held walk the greedy path again until it grows
    # that axis, so the candidates (and whether a tile is compute-bound) are found once per tile.
    steps_from: dict[tuple, list] = {}
    bound_at: dict[tuple, bool] = {}

    def candidates(tile: dict[str, int]) -> list:
        """(axis, score, grown tile) for every axis a step from ``tile`` may grow, in axis order."""
        key = tuple(tile.values())
        hit = steps_from.get(key)
        if hit is not None:
            return hit
        out = []
        for a in expr.axes:
            nxt = next_aligned(extents[a.name], tile[a.name], steps[a.name], seed.get(a.name, 1), eps, limit,
                               a.name in exact)
            if nxt is None or (a.name in bounds and nxt > bounds[a.name]):
                continue
            grown = {**tile, a.name: nxt}
            if held(grown) > rules.capacity or (index == 0 and spills_window(expr, grown, vector_axis,
                                                                             rules.lanes, registers)):
                continue
            if (units_floor > 1 and a.kind != REDUCE
                    and tile_counts(expr, grown)[1] < min(units_floor, tile_counts(expr, tile)[1])):
                continue
            out.append((a, reuse_score(expr, tile, grown, rules, seed if child_rules else None, child_rules,
                                       traffic_of=q, footprint_of=f), grown))
        steps_from[key] = out
        return out

    def compute_bound(tile: dict[str, int]) -> bool:
        key = tuple(tile.values())
        hit = bound_at.get(key)
        if hit is None:
            hit = bound_at[key] = _compute_bound(expr, tile, rules, device, source_gbps,
                                                 below_tiles[0] if below_tiles else tile)
        return hit

    def grow(tile: dict[str, int], frozen: set[str]) -> tuple[list[dict[str, int]], dict[str, int] | None]:
        """The greedy path from ``tile`` (never growing the axes in ``frozen``) and its first compute-bound
        tile."""
        path, first_bound = [tile], None
        while True:
            if first_bound is None and compute_bound(tile):
                first_bound = tile
            best = fallback = None
            for a, score, grown in candidates(tile):
                if a.name in frozen:
                    continue
                if score > 0 and (best is None or score > best[0]):
                    best = (score, grown)
                elif a.kind != REDUCE and (score == 0 or (score < 0 and not expr.reduce_axes)):
                    # no reuse along any axis (elementwise; a negative score there is only the padding of
                    # an overhanging tile): bigger tiles still amortise loop overhead; grow the spatial
                    # axis contiguous in most tensors (the last such in loop order)
                    rank = (contiguity[a.name], order[a.name])
                    if fallback is None or rank > fallback[0]:
                        fallback = (rank, grown)
            if best is None and fallback is not None:
                best = (0.0, fallback[1])
            if best is None:
                return path, first_bound
            tile = best[1]
            path.append(tile)

    def starts(t: Mapping[str, int]) -> bool:
        """Whether the next level can hold a tile nesting ``t`` at all: a tile it cannot ends no plan."""
        if index >= len(levels) - 1:
            return True
        up = LevelRules.of(device, index + 1, expr, vector_axis)
        first = _first_tile(expr, up, t, eps, _nested_extents(expr, vector_axis, up.lanes, t))
        return first is not None and footprint(expr, first, up) <= up.capacity

    def end(path: list[dict[str, int]]) -> dict[str, int] | None:
        return next((t for t in reversed(path) if starts(t)), None)

    def two_vectors(room: bool = False) -> dict[str, int] | None:
        """A register tile two vectors wide along a spatial vector axis, grown along one other spatial axis
        (and the reduction) to the largest whose accumulators make a stack array; of those, the least
        traffic. The growths above reach one vector or four, and the model ties four with two though two
        runs faster (docs/design-notes.md#construct-two_vectors). With ``room``, only tiles that leave the next
        level room (``starts``)."""
        if vector_axis is None or expr.axis(vector_axis).kind == REDUCE or rules.lanes <= 1:
            return None
        width = 2 * rules.lanes
        if tile[vector_axis] != rules.lanes or vector_axis in exact or extents[vector_axis] < width or (
                next_aligned(extents[vector_axis], tile[vector_axis], steps[vector_axis], 1, eps, limit) != width
                and padding_waste(extents[vector_axis], width) > TWO_VECTOR_WASTE):
            return None
        start = {**tile, vector_axis: width}
        others = [a.name for a in expr.spatial_axes if a.name != vector_axis and extents[a.name] > 1]
        ends = []
        for keep in others:
            stack = [t for t in grow(start, {vector_axis, *others} - {keep})[0]
                     if stack_array(expr, t) and (not room or starts(t))]
            if stack and stack[-1] != start:
                ends.append(stack[-1])
        return min(ends, key=q, default=None)

    def fullest() -> dict[str, int] | None:
        """The register tile holding the most accumulator vectors (least traffic among equals) of a GEMM: a
        reduction along one axis and one row axis (a spatial axis that the reduced input the vector axis
        indexes does not index: the rows of A; batch axes index both): each width along the vector axis, up to
        MAX_REGISTER_VECTORS vectors, grown along the rows as far as the registers hold it. The growths above
        stop at power-of-two shapes (BERT's FFN: 4 rows x 4 vectors, 16 accumulators), where 8 rows x 3
        vectors (24) streams half the weight per multiply-add. Not for convolutions' pixel rows (h and w):
        the model does not see the split reductions of the top tiles above such tiles, and their first plans
        lost; docs/design-notes.md#construct-fullest."""
        b = resident_input(expr, vector_axis)  # B: the vector axis indexes it, the rows do not
        if vector_axis is None or expr.axis(vector_axis).kind == REDUCE or rules.lanes <= 1 or not registers \
                or b is None:
            return None
        columns = next(t.axes for t in expr.inputs if t.name == b)
        rows = [a.name for a in expr.spatial_axes if a.name not in columns and extents[a.name] > 1]
        if len(rows) != 1:
            return None
        best, best_key, width = None, None, tile[vector_axis]
        while width is not None and width <= MAX_REGISTER_VECTORS * rules.lanes:
            start = {**tile, vector_axis: width}
            if held(start) > rules.capacity:
                break
            t = grow(start, {a.name for a in expr.axes} - set(rows))[0][-1]
            key = (-ceil_div(math.prod(expr.output.region(t)), rules.lanes), q(t))
            if best_key is None or key < best_key:
                best, best_key = t, key
            width = next_aligned(extents[vector_axis], width, steps[vector_axis], seed.get(vector_axis, 1), eps,
                                 limit, vector_axis in exact)
        return best

    path, first_bound = grow(tile, set())
    # The greedy choice is myopic (an axis that wins early can use up the level); the same growth with
    # one axis held at the seed gives the other shapes of the level's tile, for the model to rank. Holding
    # an axis that has no next size (extent 1, already whole, capped by the bounds) changes nothing: its
    # growth is the greedy one, not walked again (a third of the growths of a 1x1 convolution).
    def can_step(a) -> bool:
        nxt = next_aligned(extents[a.name], tile[a.name], steps[a.name], seed.get(a.name, 1), eps, limit,
                           a.name in exact)
        return nxt is not None and not (a.name in bounds and nxt > bounds[a.name])

    grown = [grow(tile, {a.name})[0] if can_step(a) else path for a in expr.axes if len(expr.axes) > 1]
    variants = sorted((g[-1] for g in grown), key=lambda t: traffic(expr, t, rules))
    picks = [path[-1]] + variants + ([first_bound] if first_bound is not None else []) + path[-2:-3:-1]
    if index == 0 and expr.reduce_axes:
        # the largest register tile on the way whose accumulators make a stack array, where they can live
        # per register tile: the greedy end's would be a workspace buffer (model.WORKSPACE_TILE_CYCLES)
        stack = [t for t in path if stack_array(expr, t)]
        if stack and stack[-1] is not path[-1] and _reduction_fits_above(expr, device, stack[-1], vector_axis):
            picks.insert(1, stack[-1])
    extras = []  # beyond BRANCH: shapes the growths pass by
    if index == 0 and expr.reduce_axes:
        extras = [two_vectors(), fullest()]
    elif index < len(levels) - 1 and expr.reduce_axes:
        # the tile below grown along the reduction only: one register tile's accumulators per tile, its
        # reduction chunked here, a shape the greedy growth passes by
        # (docs/design-notes.md#construct-reduction_only).
        extras = [grow(tile, {a.name for a in expr.spatial_axes})[0][-1]]
    branch = BRANCH
    for extra in extras:
        if extra is not None and extra not in picks[:branch]:
            picks.insert(1, extra)
            branch += 1
    if rescue:
        # the picks ended no plan: a tile the next level cannot hold (at level 0: window rows in the register
        # tile beside a whole, unalignable reduction at L1) gives way to the last tiles on the growths that
        # leave it room, so that the level still ends plans (else epsilon grew, to far worse padded ones:
        # nas 3x3 conv on 42x42x84 with the x86-avx2 spec, 0.37x)
        kept = [t for t in picks[:branch] if starts(t)]
        ends = [end(path)] + [end(g) for g in grown] + ([two_vectors(room=True)] if index == 0 and expr.reduce_axes
                                                        else [])
        picks = kept + [t for t in ends if t is not None]
        branch = len(picks)
    out = []
    for t in picks:
        if t not in out:
            out.append(t)
    return out[:branch]


def _reduction_fits_above(expr: Expr, device: Device, reg: Mapping[str, int], vector_axis: str | None) -> bool:
    """Whether the next level can hold this register tile's whole reduction, the condition for its
    accumulators to live per register tile (``tails.accumulator_tile``); else they live in a larger tile
    whatever the register tile's size (a 1000^3 matmul's: the top tile)."""
    if len(device.private_levels) < 2:
        return False
    whole = {a.name: (a.extent if a.kind == REDUCE else reg[a.name]) for a in expr.axes}
    rules = LevelRules.of(device, 1, expr, vector_axis)
    return footprint(expr, whole, rules) <= rules.capacity


def _program(expr: Expr, choices: RProgram, device: Device, eps: float, est: Estimate) -> RProgram:
    """The plan ``choices`` (``roller.plan.choices.plan_choices``, balancing decided) with the model's
    prediction ``est`` of it."""
    tiles = [dict(t) for t in choices.tiles]
    foot = dict(est.footprint_bytes)
    foot[device.private_levels[-1].name] += packing_bytes(expr, tiles, device, choices.vector_axis)
    return dataclasses.replace(
        choices, units=est.units, waves=est.waves, predicted_seconds=est.seconds,
        compute_seconds=est.compute_seconds, memory_seconds=dict(est.memory_seconds), footprint_bytes=foot,
        traffic_bytes=dict(est.traffic_bytes), epsilon=eps)


def replanned(expr: Expr, program: RProgram, device: Device, constants: frozenset[str]) -> RProgram:
    """``program``'s plan (same tiles, vector axis, tails, inlined stages) made again with the ``constants``
    given: its choices that follow from them (prepacked inputs, prefetches, register transposes, balancing)
    decided as construction decides them, and the model's prediction of the result."""
    ex = layout_expr(expr, program.vector_axis)
    choices, est = estimated(ex, plan_choices(ex, program.tiles, device, program.vector_axis, program.padded,
                                              program.inlined, frozenset(constants)), device)
    return _program(ex, choices, device, program.epsilon, est)


def _plans(expr: Expr, device: Device, eps: float, bounds: Mapping[str, int],
           vector_axis: str | None, constants: frozenset[str] = frozenset()) -> list[list[dict[str, int]]]:
    """Every combination of the per-level tiles scale_up carries on (depth first, bottom level first)."""
    n = len(device.private_levels)
    units = device.units.count
    out: list[list[dict[str, int]]] = []

    def walk(index: int, acc: list[dict[str, int]], rescue: bool = False):
        floor = units if index == n - 1 else 1
        tiles = scale_up(expr, device, index, acc, eps, bounds, units_floor=floor, vector_axis=vector_axis,
                         rescue=rescue)
        if index == n - 1 and units > 1 and _fits_one_unit(expr, device):
            # the whole operator on one unit, without the thread pool's start and join
            # (model.PARALLEL_LAUNCH_CYCLES): for the smallest operators that is most of their time
            tiles += [t for t in scale_up(expr, device, index, acc, eps, bounds, vector_axis=vector_axis)
                      if tile_counts(expr, t)[1] == 1 and t not in tiles]
        for tile in tiles:
            if index == n - 1:
                out.append(acc + [tile])
            else:
                walk(index + 1, acc + [tile], rescue)

    walk(0, [])
    if not out:
        walk(0, [], rescue=True)
    if n > 1:  # register tiles of AMX's tile registers (roller.plan.dot), each grown level by level above
        for reg in amx_register_tiles(expr, device, vector_axis, device.private_levels[1].usable_bytes):
            if all(reg[a] <= b for a, b in bounds.items()):
                walk(1, [reg])
    # the first cache level's tile as a panel (roller.plan.panels), once per register and upper tiles
    seen = {_tiles_key(p) for p in out}
    for p in list(out):
        for panel in panel_tiles(expr, device, p, vector_axis, constants):
            if _tiles_key(panel) not in seen:
                seen.add(_tiles_key(panel))
                out.append(panel)
    return out


def _tiles_key(tiles: list[Mapping[str, int]]) -> tuple:
    return tuple(tuple(sorted(t.items())) for t in tiles)


def _fits_one_unit(expr: Expr, device: Device) -> bool:
    """Whether every tensor of the operator together fits one unit's last private level: the operators
    small enough that a plan running them on one unit is worth ranking against spreading them."""
    return tensor_bytes(expr) <= device.private_levels[-1].capacity_bytes


def _shrink_bounds(expr: Expr, device: Device) -> list[dict[str, int]]:
    """One bound per spatial axis that, alone, leaves at least one tile per unit along it."""
    out = []
    for a in expr.spatial_axes:
        if a.extent > 1:
            out.append({a.name: max(1, ceil_div(a.extent, device.units.count))})
    return out


def enumerate_programs(expr: Expr, device: Device, epsilon: float, axes: tuple[str, ...] | None = None,
                       constants: frozenset[str] = frozenset(), limit: int | None = None) -> list[RProgram]:
    """All plans construction considers at one epsilon, ranked by the model (best first), de-duplicated
    (the best ``limit`` and each vector axis's best, with ``limit``: ``distinct_programs``).
    Inputs named in ``constants`` arrive packed in each plan's tiles (``roller.plan.prepack``).

    The vector axis is a choice like the tile sizes: plans are built for every candidate
    (``rtile.vector_candidates``; only ``axes`` when given), each with its own level-0 rules and
    layout (``rtile.layout_expr``), and ranked together."""
    plans: list[RProgram] = []
    ests: list[Estimate] = []
    for va in (axes if axes is not None else vector_candidates(expr) or (None,)):
        ex = layout_expr(expr, va)  # inputs packed transposed for this vector axis, as the kernel reads them
        found = _plans(ex, device, epsilon, {}, va, constants)
        if not found or max(tile_counts(ex, p[-1])[1] for p in found) < device.units.count:  # a unit idle
            for b in _shrink_bounds(ex, device):
                found += _plans(ex, device, epsilon, b, va, constants)
        for tiles in found:  # each way to cover the overhanging axes (and to run padding stages) is a plan
            for padded, _ in tail_options(ex, tiles, va, compute_lanes(ex, device)):
                for inlined in inline_options(ex, tiles, va, compute_lanes(ex, device), padded):
                    prog, est = estimated(ex, plan_choices(ex, tiles, device, va, padded, inlined, constants),
                                          device)
                    plans.append(prog)
                    ests.append(est)
    ranked = rank(list(zip(ests, range(len(plans)))), lambda x: x[0].seconds, lambda x: x[0].memory_seconds,
                  lambda x: tile_counts(expr, plans[x[1]].tiles[0])[0])

    def build(item):
        est, i = item
        return _program(layout_expr(expr, plans[i].vector_axis), plans[i], device, epsilon, est)
    return distinct_programs(ranked, build, lambda item: plans[item[1]].vector_axis, limit)


def distinct_programs(ranked, build, vector_axis, limit: int | None = None) -> list[RProgram]:
    """The plans ``build`` makes of the ``ranked`` candidates, in order, each key once: all of them, or the
    first ``limit`` and then the first of each vector axis (``vector_axis(candidate)``) not among those
    (construction's epsilon loop wants every vector axis ranked). Making a plan (its packing, layouts,
    predicates) was 9% of construction when every candidate was made, ten of thousands kept."""
    seen, axes, out = set(), set(), []
    for item in ranked:
        va = vector_axis(item)
        if limit is not None and len(out) >= limit and va in axes:
            continue
        prog = build(item)
        if prog.key not in seen:
            seen.add(prog.key)
            axes.add(va)
            out.append(prog)
    return out


def construct(expr: Expr, device: Device, topk: int = 10, constants: frozenset[str] = frozenset(),
              rules=None) -> Construction:
    """The top-``topk`` plans for ``expr`` on ``device``. Epsilon grows only while fewer than
    max(topk, RANK_POOL) plans exist, or while some vector-axis candidate has none yet (its aligned tiles
    may need a little padding where another candidate's do not: every candidate reaches the model's
    ranking). ``rules`` enumerates the plans: a module or object with ``vector_candidates(expr)`` and
    ``enumerate_programs(expr, device, epsilon, axes, constants, limit)``; by default this module's, the
    cache-hierarchy rules of a CPU (a GPU target passes its own). ``constants`` names inputs that are constants at every call (a model's weights): they are
    packed once, ahead of the kernel, in the plan's tiles (``RProgram.prepacked``), and the model charges
    no copy for them."""
    if topk < 1:
        raise InvalidShapeError(f"topk must be at least 1, got {topk}")
    if not device.private_levels:
        raise UnsupportedExpressionError(f"device {device.name} has no per-unit memory level to tile for")
    t0 = time.perf_counter()
    kind = rules if rules is not None else sys.modules[__name__]
    best: list[RProgram] = []
    pending = set(kind.vector_candidates(expr))
    eps = EPSILON_STEPS[0]
    pool = max(topk, RANK_POOL)
    # an axis with no small divisor (a prime extent: ViT's 197 tokens) has no aligned tile but 1 and itself
    # below a little padding: epsilon grows to EPSILON_ALWAYS whatever the pool holds
    until = EPSILON_ALWAYS if any(a.kind != REDUCE and a.extent > SMALL_DIVISORS and
                                  all(a.extent % d for d in range(2, SMALL_DIVISORS + 1)) for a in expr.axes) else 0.0
    for eps in EPSILON_STEPS:
        full = len(best) >= pool and not pending
        if full and eps < until:
            continue  # straight to ``until``: the steps between add a few padded tiles at twice the time
        axes = None if len(best) < pool or eps <= until else tuple(sorted(pending))
        progs = kind.enumerate_programs(expr, device, eps, axes, frozenset(constants), limit=pool)
        keys = {p.key for p in best}
        best += [p for p in progs if p.key not in keys]
        pending -= {p.vector_axis for p in progs}
        if len(best) >= pool and not pending and eps >= until:
            break
    if not best:
        raise UnsupportedExpressionError(
            f"{expr.name}: no tile fits the device {device.name!r} (even with {EPSILON_STEPS[-1]:.0%} padding); "
            f"the tensors' smallest tiles exceed the level capacities")
    best = rank_programs(expr, best)
    return Construction(expr=expr, programs=tuple(best[:topk]), epsilon=eps,
                        seconds=time.perf_counter() - t0)


def rank_programs(expr: Expr, programs: Sequence[RProgram]) -> list[RProgram]:
    """``programs`` in the model's order: predicted time, then its tie-breaks (memory time, then the register
    tile's size), as construction ranks its plans."""
    return rank(list(programs), lambda p: p.predicted_seconds, lambda p: p.memory_seconds,
                lambda p: tile_counts(expr, p.tiles[0])[0])


def sample_programs(expr: Expr, device: Device, count: int, seed: int = 0, epsilon: float = 0.0,
                    attempts: int = 2000) -> list[RProgram]:
    """Up to ``count`` distinct random valid plans (aligned, nested, fitting every level), with the
    model's predictions: the varied population a model-fidelity study needs (the top-K are alike)."""
    import random

    rng = random.Random(seed)
    levels = device.private_levels
    candidates = vector_candidates(expr) or (None,)
    seen, out = set(), []
    for _ in range(attempts):
        if len(out) >= count:
            break
        tiles: list[dict[str, int]] = []
        ok = True
        va = rng.choice(candidates)
        ex = layout_expr(expr, va)
        extents = tiling_extents(ex, va, compute_lanes(ex, device))
        for i in range(len(levels)):
            rules = LevelRules.of(device, i, ex, va)
            lower = tiles[-1] if tiles else {}
            limit = max(1, rules.capacity // min(t.elem_bytes for t in ex.tensors))
            tile = {}
            for a in ex.axes:
                sizes = aligned_sizes(extents[a.name], axis_step(ex, a.name, rules), lower.get(a.name, 1), epsilon,
                                      limit, a.name in exact_axes(ex, rules))
                if not sizes:
                    ok = False
                    break
                # favour small sizes: the first pick of a log-uniform index
                tile[a.name] = sizes[min(len(sizes) - 1, int(len(sizes) ** rng.random()) - 1)]
            if not ok:
                break
            tiles.append(tile)
        if not ok or any(f > lv.usable_bytes for f, lv in zip(level_footprints(ex, tiles, device, va), levels)):
            continue
        padded = rng.choice(tail_options(ex, tiles, va, compute_lanes(ex, device)))[0]
        inlined = rng.choice(inline_options(ex, tiles, va, compute_lanes(ex, device), padded))
        choices, est = estimated(ex, plan_choices(ex, tiles, device, va, padded, inlined), device)
        prog = _program(ex, choices, device, epsilon, est)
        if prog.key not in seen:
            seen.add(prog.key)
            out.append(prog)
    return out
