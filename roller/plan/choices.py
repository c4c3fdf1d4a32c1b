"""The choices of a plan that code generation executes, decided once, here: construction builds an RProgram's
choice fields with :func:`plan_choices` before the model (``roller.plan.cost.estimate``) charges what they say,
and code generation (``roller.targets.cpu``) follows them or raises. Nothing else decides them.

Beside the layout choices (vector axis, packing, tails, partial sums, inlined stages, prepacked inputs) these
are the code generator's own: the held grid loop (``held_grid``), register transposes
(``tails.register_transposes``), software prefetch of prepacked inputs (``prefetched``) and load balancing of
the parallel grid (``balanced``, decided from the model's time before its imbalance charge:
:func:`balanced_grid`).

The CPU schedule's loop nest (``targets/cpu/schedule.py``) is mirrored by :func:`axis_factors` and
:func:`main_loops`: the loops of the main block below the parallel grid loop, with their extents and kinds,
from which the prefetch rule reads where prefetches can go.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

from roller.device.spec import Device
from roller.plan.cost import estimate, rebalanced
from roller.plan.expr import REDUCE, Expr
from roller.plan.loops import axis_factors, serial_tail, vector_tail_split  # noqa: F401 (re-exported)
from roller.plan.dot import is_amx_tile, program_dot_depth
from roller.plan.prepack import packed_layout, prepackable
from roller.plan.residency import balances
from roller.plan.rprogram import RProgram
from roller.plan.rtile import (ceil_div, compute_lanes, default_vector_axis, layout_expr, packing)
from roller.plan.tails import (partial_sums, predicated_axes, register_transposes, rolled_reduce_axes,
                               tail_options)

# Software prefetch of prepacked inputs (targets/cpu/prefetch.py): smaller blocks (a bias) stream within a
# page and the prefetchers keep up; a loop carries prefetches only where each of its iterations runs at least
# MIN_CARRIER_POINTS of the block's iterations (points, lanes counted), so their own instructions stay few.
MIN_BLOCK_BYTES = 4096
MIN_CARRIER_POINTS = 4096

SERIAL, UNROLLED, VECTORIZED = "serial", "unrolled", "vectorized"


def held_grid(expr: Expr, tiles: Sequence[Mapping[str, int]], vector_axis: str | None, lanes: int,
              predicated: Sequence[str]) -> str | None:
    """The axis whose grid loop stays out of the fused parallel grid loop: a predicated spatial vector axis
    with a grid loop, where another spatial axis has one too. Lowering can split the overhanging last tile
    off a loop of its own, not off a fused one (div/mod), and a bound left on the vector loop makes TVM emit
    it scalar, far below the model (docs/design-notes.md#choices-held_grid)."""
    if vector_axis is None or vector_axis not in predicated or expr.axis(vector_axis).kind == REDUCE:
        return None
    f = axis_factors(expr, tiles, vector_axis, lanes)
    grids = [a.name for a in expr.spatial_axes if f[a.name][0] > 1]
    return vector_axis if vector_axis in grids and len(grids) > 1 else None


def balanced_grid(expr: Expr, program: RProgram, device: Device, seconds: float) -> bool:
    """Whether code generation balances the plan's parallel grid (``targets/cpu/balance.py``): the policy's
    ``residency.balances`` for a kernel the model times at ``seconds`` before its imbalance charge
    (compute-bound, long enough), on a device of several units, where the parallel grid has more top tiles
    than units and no loop-partition hint (a split-off tail would be lost to the stealing loop)."""
    if device.units.count < 2 or not balances(expr, seconds, device):
        return False
    lanes = compute_lanes(expr, device)
    f = axis_factors(expr, program.tiles, program.vector_axis, lanes)
    grid = math.prod(f[a.name][0] for a in expr.spatial_axes if a.name != program.held_grid)
    return grid > device.units.count and not serial_tail(expr, program, lanes)


def main_loops(expr: Expr, program: RProgram, device: Device) -> tuple[int, list[tuple[str, int, str]]] | None:
    """The loops of the main block below its parallel grid loop as the CPU schedule makes them, outer first,
    each (axis, extent, kind), and how many of them step over top tiles (the held grid loop and the
    reduction's top tiles); None without a parallel grid loop. An AMX plan's register tile has none."""
    lanes = compute_lanes(expr, device)
    va, n = program.vector_axis, len(program.tiles)
    f = axis_factors(expr, program.tiles, va, lanes)
    spatial = [a.name for a in expr.axes if a.kind != REDUCE]
    reduce = [a.name for a in expr.axes if a.kind == REDUCE]
    held = program.held_grid
    if math.prod(f[a][0] for a in spatial if a != held) <= 1:
        return None
    lane = va in reduce and program.partial_sums
    units = ([(held, f[held][0], SERIAL)] if held else []) + [(a, f[a][0], SERIAL) for a in reduce if f[a][0] > 1]
    levels: list[tuple[str, int, str]] = []
    pos = range(1, n)  # f[a][pos]: level n - pos tiles in the level above, pos = 1 .. n - 1

    def level(names, p):
        return [(a, f[a][p], SERIAL) for a in names if f[a][p] > 1]
    if lane:
        levels += [x for p in pos for x in level(spatial, p)] + [x for p in pos for x in level(reduce, p)]
    else:
        for p in pos:
            levels += level(spatial, p) + level(reduce, p)
    if program.amx:  # the register tile is one tensorized unit, no loops (targets/cpu/amx.py)
        return len(units), units + levels
    reg = {a: f[a][-1] for a in f}
    rolled = rolled_reduce_axes(expr, reg, va, lanes,
                                device.private_levels[0].capacity_bytes // device.units.vector_bytes)
    inner: list[tuple[str, int, str]] = []
    lane_loop = None
    for a in reduce:
        ext = reg[a]
        if lane and a == va:
            lane_loop = (a, min(ext, lanes), VECTORIZED)
            ext = ceil_div(ext, lanes) if ext > lanes else 1
        if ext > 1:
            inner.append((a, ext, SERIAL if a in rolled else UNROLLED))
    for a in spatial:
        if a != va and reg[a] > 1:
            inner.append((a, reg[a], UNROLLED))
    if va in spatial and reg[va] > 1:
        if reg[va] > lanes:
            inner.append((va, ceil_div(reg[va], lanes), UNROLLED))
        inner.append((va, min(reg[va], lanes), VECTORIZED))
    if lane_loop is not None:
        inner.append(lane_loop)
    return len(units), units + levels + inner


def prefetch_pays(device: Device) -> bool:
    """Whether software prefetch of prepacked weights pays on ``device``: its ``model.software_prefetch_gain``
    (time without over time with, which ``roller calibrate`` measures on a GEMM whose weight comes from memory)
    is above 1, or unknown (a spec without the figure keeps the prefetches)."""
    gain = device.model.software_prefetch_gain
    return gain is None or gain > 1.0


def prefetched_inputs(expr: Expr, program: RProgram, device: Device) -> tuple[str, ...]:
    """The prepacked inputs whose next top tile code generation prefetches while a top tile computes
    (``targets/cpu/prefetch.py``), on a device where that pays (:func:`prefetch_pays`): blocks of at least
    MIN_BLOCK_BYTES that the main block reads more than once in a top tile (some loop walks on without moving
    in it: a stream read once, a GEMV's weights, is the hardware prefetchers' case), where a loop other than the
    innermost walked one runs at least MIN_CARRIER_POINTS points an iteration to carry the prefetches, below a
    parallel grid loop."""
    if not program.prepacked or not prefetch_pays(device):
        return ()
    nest = main_loops(expr, program, device)
    if nest is None:
        return ()
    top, loops = nest
    serial = []
    for x in loops:
        if x[2] != SERIAL:
            break
        serial.append(x)
    if len(serial) < top:
        return ()
    walked = [x for x in serial[top:] if x[1] > 1]
    below = [math.prod(x[1] for x in loops[i + 1:]) for i in range(len(loops))]
    index = {id(x): i for i, x in enumerate(loops)}
    if not any(below[index[id(x)]] >= MIN_CARRIER_POINTS for x in walked[:-1]):
        return ()
    lanes = compute_lanes(expr, device)
    reduced = {a.name for a in expr.reduce_axes}
    out = []
    for t in expr.inputs:
        if t.name not in program.prepacked:
            continue
        if expr.epilogue and reduced and not t.axes & reduced:
            continue  # an epilogue's input (a bias): the write-back reads it, not the main block
        layout = packed_layout(expr, t, program.tiles, program.vector_axis, lanes, program.dot_depth)
        if layout is None or layout.block_elements() * t.elem_bytes < MIN_BLOCK_BYTES:
            continue
        if any(x[0] not in t.axes for x in walked):
            out.append(t.name)
    return tuple(out)


def plan_choices(expr: Expr, tiles: Sequence[Mapping[str, int]], device: Device, vector_axis: str | None = None,
                 padded: tuple[str, ...] | None = None, inlined: tuple[str, ...] = (),
                 constants: frozenset[str] = frozenset(), epsilon: float = 0.0) -> RProgram:
    """The plan of these tiles with every choice the generated code depends on and nothing predicted yet
    (``balanced`` False: :func:`balanced_grid` needs the model's time). ``vector_axis`` defaults to the
    first candidate, ``padded`` to every overhanging axis where all can be (else none: predicated);
    ``constants`` name inputs that arrive packed in the plan's tiles where they can (``prepack.prepackable``).
    ``expr`` is laid out for the vector axis here (``rtile.layout_expr``, idempotent)."""
    if len(tiles) != len(device.private_levels):
        raise ValueError(f"expected {len(device.private_levels)} tiles (one per private level), got {len(tiles)}")
    if vector_axis is None:
        vector_axis = default_vector_axis(expr)
    expr = layout_expr(expr, vector_axis)
    tiles = [dict(t) for t in tiles]
    lanes = compute_lanes(expr, device)
    if padded is None:
        padded = next((p for p, rest in tail_options(expr, tiles, vector_axis, lanes) if not rest), ())
    packed, pads = packing(expr, tiles, device, vector_axis, inlined)
    prepacked = prepackable(expr, tiles, vector_axis, lanes, padded, constants) if constants else ()
    predicated = predicated_axes(expr, tiles, vector_axis, lanes, padded)
    grid = {a.name: ceil_div(a.extent, tiles[-1][a.name]) for a in expr.axes if a.kind != REDUCE}
    spatial = math.prod(grid.values())
    program = RProgram(
        levels=tuple(lv.name for lv in device.private_levels), tiles=tuple(tiles), grid=grid,
        units=max(1, min(device.units.count, spatial)), waves=math.ceil(spatial / device.units.count),
        vector_axis=vector_axis, packed=packed, storage_pad=pads, padded=padded, predicated=predicated,
        partial_sums=partial_sums(expr, tiles[0], vector_axis, lanes),
        layouts={t.name: t.packed_order for t in expr.inputs if t.packed_order}, inlined=inlined,
        prepacked=prepacked, constants=tuple(t.name for t in expr.inputs if t.name in constants),
        register_transposes=register_transposes(expr, tiles[-1], lanes, prepacked),
        held_grid=held_grid(expr, tiles, vector_axis, lanes, predicated),
        dot_depth=program_dot_depth(expr, tiles, device, vector_axis, prepacked, padded + predicated, inlined),
        epsilon=epsilon)
    if program.dot_depth > 1 and is_amx_tile(expr, device, vector_axis, tiles[0]):
        program = dataclasses.replace(program, amx=True)
    return dataclasses.replace(program, prefetched=prefetched_inputs(expr, program, device))


def estimated(expr: Expr, program: RProgram, device: Device):
    """(the plan with ``balanced`` decided, its Estimate): the model's time before the imbalance charge
    decides the balancing (:func:`balanced_grid`), then the model charges what the plan says."""

    est = estimate(expr, program, device)
    if balanced_grid(layout_expr(expr, program.vector_axis), program, device, est.base_seconds):
        program = dataclasses.replace(program, balanced=True)
        est = rebalanced(expr, est, device, True)
    return program, est


def estimate_tiles(expr: Expr, tiles: Sequence[Mapping[str, int]], device: Device, vector_axis: str | None = None,
                   padded: tuple[str, ...] | None = None, inlined: tuple[str, ...] = (),
                   constants: frozenset[str] = frozenset()):
    """The model's Estimate of the plan :func:`plan_choices` makes of these tiles (for tests and scripts that
    hold tiles, not a plan): the same choices construction makes, balancing included."""
    return estimated(expr, plan_choices(expr, tiles, device, vector_axis, padded, inlined, constants), device)[1]
