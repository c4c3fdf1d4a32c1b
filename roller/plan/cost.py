"""The micro performance model (the paper's): memory time per level, compute time, waves.

Its only inputs are the Expr, the tiles, and the Device's figures: ``units.peak(dtype)`` and each
level's ``bandwidth_gbps`` / ``total_bandwidth_gbps``. Those are datasheet values until ``roller
calibrate`` has measured the device, after which ``load_device`` hands over the measured ones; nothing
else feeds the model.

For a plan with tiles T_0..T_{L-1} over the per-unit levels, the operator is cut into S top tiles
(spatial grid) spread over U units in W = ceil(S / U) waves. One top tile costs
max(compute, memory time of every level), where level i's memory time is the traffic Q_i(T_i) that
fills it from the level below divided by that level's bandwidth per unit (a shared level's bandwidth is
split between the active units), plus a fixed overhead per top tile. The plan costs W times that.

Beyond the paper's terms the model charges what the generated code does (``roller.plan.tails``): flops of
whole vectors (padding included), the copies of padded plans and transposed packs as traffic through
the top level (a padded input copied once, whole, at root instead: a parallel loop of its own before the
kernel's, its bytes at the data's bandwidth plus a launch, ``tails.root_copy_bytes``), transposed packs
also at their element rate before the tile's compute (device.model.transpose_cycles, or device.model.register_transpose_cycles
for whole blocks transposed in registers), the lanes of partial sums folded one by one at the write-back
(device.model.fold_cycles), a predicated vector axis's partial last vector as its
power-of-two pieces (scalar lanes where code generation cannot split it off, ``tails.tail_compute_factor`` of
``choices.vector_tail_split``)
and a parallel grid loop split at its last top tile one wave longer (``choices.serial_tail``), output lines
two units write where they split the output's contiguous rows inside a line (device.model.false_sharing_seconds), a
register tile with too few accumulators below peak (unless its accumulation chain is short enough for the
out-of-order window to overlap it with the next tiles', ``units.reorder_window``), the rows a sliding window's
consecutive top tiles share in the cache (``halo_bytes``), a reduction that cannot keep vector partial
sums at scalar speed, the bounds checks of a padding stage the plan inlines (device.model.inline_check_cycles) instead
of copying it, the bandwidth short strided rows lose at the top level (the calibrated small-transfer
efficiency, ``short_row_bytes``), the misses of inputs read on more strided streams than the hardware
prefetcher follows (device.model.untracked_line_cycles), the lines of broadcast operands whose register-tile loads read
runs side by side in one page (device.model.interleaved_line_cycles), the accumulators a plan that splits its reduction moves
through memory between the chunks (device.model.accumulator_cycles), and the copies a repeating stage (a grouped
convolution's group_rep) writes, at their element rate (device.model.replicate_cycles) rather than as traffic from below.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from roller.device.spec import Device
from roller.plan.dot import amx_efficiency
from roller.plan.expr import REDUCE, Expr
from roller.plan.loops import serial_tail, vector_tail_split
# the estimate's terms, the ranking and the data's residency live in their own modules; their names are
# re-exported here, where callers have imported them from
from roller.plan.overheads import (DEFAULT_CLOCK_GHZ, PAGE_BYTES, broadcast_run, cycle_seconds,  # noqa: F401
                                   epilogue_seconds, false_sharing_seconds, fold_seconds, halo_bytes,
                                   inline_check_seconds,
                                   interleaved_run_seconds, launch_seconds, repeated_fill_bytes, replicate_seconds,
                                   short_row_bytes, sliced_row_seconds, stage_copy_seconds, tile_overhead,
                                   top_step_axis, transpose_seconds, untracked_stream_seconds, workspace_seconds)
from roller.plan.ranking import TIE, Estimate, rank  # noqa: F401
from roller.plan.rprogram import RProgram
from roller.plan.residency import (balances, data_source, imbalance_seconds, memory_bound,  # noqa: F401
                                   private_fill, resident_share, shared_source, source_bandwidth, tensor_bytes,
                                   unit_bandwidth)
from roller.plan.rtile import (LevelRules, ceil_div, compute_lanes, layout_expr, level_footprints,
                               round_up, tensor_footprint, tile_counts, traffic)
from roller.plan.tails import clamped_top, copy_bytes, root_copy_bytes, tail_compute_factor, tiling_extents


# device.model.register_load_share (the spec's model: section; docs/cost-constants.md): Share of the L1's calibrated
# read bandwidth (a stream of whole-vector loads) that a register tile's loads reach between its FMAs: the register
# level's traffic is charged at it.


def padded_flops(expr: Expr, tiles: Sequence[Mapping[str, int]], lanes: int, vector_axis: str | None = None,
                 padded: tuple[str, ...] = ()) -> float:
    """Flops the kernel executes: whole top tiles over the tiling extents (the vector axis in whole
    vectors; a padded axis up to its tiles as code generation clamps them, ``tails.clamped_top``), and a
    register tile narrower than a vector along the vector axis still issues whole vectors."""
    ext = tiling_extents(expr, vector_axis, lanes)
    top, reg = tiles[-1], tiles[0]
    pts = math.prod(round_up(ext[a.name], clamped_top(expr, tiles, a.name, vector_axis, lanes)
                             if a.name in padded else min(top[a.name], ext[a.name])) for a in expr.axes)
    if vector_axis is not None and lanes > 1:
        t = min(reg[vector_axis], ext[vector_axis])
        pts *= round_up(t, lanes) / t
    return pts * expr.flops_per_point


def accumulator_efficiency(expr: Expr, reg: Mapping[str, int], device: Device,
                           vector_axis: str | None = None, chain: float | None = None) -> float:
    """Fraction of peak the register tile can issue: a fused multiply-add waits for the previous one on
    the same accumulator, so peak needs ``units.accumulators_for_peak`` independent accumulator vectors
    (FMA latency x FMA pipes). A register tile with fewer leaves the pipes idle in proportion. Along a
    spatial vector axis the accumulators are the output's vectors; along a reduced one (partial sums)
    every output element holds its own vector.

    ``chain`` is how many steps each accumulator takes before the tile writes it back (default: the whole
    reduction). Chains shorter than the core's out-of-order window (``units.reorder_window`` operations)
    overlap with the next register tiles', so a tile counts as ``window / chain`` accumulators when it holds
    fewer (docs/design-notes.md#cost-accumulator_efficiency)."""
    need = device.units.accumulators_for_peak
    if need <= 1:
        return 1.0
    lanes = compute_lanes(expr, device)
    out = math.prod(expr.output.region(reg))
    spatial = vector_axis is not None and expr.axis(vector_axis).kind != REDUCE
    vectors = math.ceil(out / lanes) if spatial else out
    window = device.units.reorder_window
    if window:
        if chain is None:
            chain = accumulation_chain(expr, [reg], vector_axis, lanes)  # no parent: the whole reduction
        vectors = max(vectors, window / max(1.0, chain))
    return min(1.0, vectors / need)


def accumulation_chain(expr: Expr, tiles: Sequence[Mapping[str, int]], vector_axis: str | None,
                       lanes: int) -> float:
    """Steps each register-tile accumulator takes before it is written back: the reduction of its
    ``accumulator_parent`` tile (the whole reduction without one); a reduced vector axis (partial sums)
    takes a step per vector of it."""
    parent = accumulator_parent(expr, tiles, 0, vector_axis)
    chain = math.prod((parent[a.name] if parent is not None else a.extent) for a in expr.reduce_axes)
    if vector_axis is not None and expr.axis(vector_axis).kind == REDUCE:
        chain /= lanes
    return chain


def compute_rate(expr: Expr, reg: Mapping[str, int], device: Device, vector_axis: str | None,
                 partial_sums: bool, chain: float | None = None, dot: int = 1, amx: bool = False) -> float:
    """GFLOP/s one unit issues with this register tile: the accumulation type's peak, scaled by the
    accumulator efficiency (``chain``: see there); a reduced vector axis without vector partial sums
    (``partial_sums``: the plan's ``RProgram.partial_sums``, or ``tails.partial_sums`` of a register tile
    before there is a plan) runs scalar (1 / lanes). Dot-product lanes (``dot``: ``RProgram.dot_depth``, 4
    with VNNI) run at the int8 peak (``peak_gflops.int8``, what the VNNI microbenchmark measures), their
    accumulators taking one step per ``dot`` reduce elements. A register tile on AMX's tile registers
    (``amx``: ``RProgram.amx``) runs at the matrix unit's int8 peak (``tensor_peak_gflops.int8``) times
    ``dot.amx_efficiency``."""
    if amx:
        return device.units.tensor_peak_gflops["int8"] * amx_efficiency(expr, device, vector_axis, reg)
    lanes = compute_lanes(expr, device)
    if dot > 1 and chain is not None:
        chain /= dot
    peak = (device.units.peak("int8") if dot > 1 else device.units.peak(expr.compute_dtype)) * accumulator_efficiency(
        expr, reg, device, vector_axis, chain)
    if vector_axis is not None and expr.axis(vector_axis).kind == REDUCE and not partial_sums:
        peak /= lanes
    return peak


def amx_register_bytes(expr: Expr, reg: Mapping[str, int]) -> int:
    """Bytes an AMX plan's tile loads and stores move between L1 and the tile registers (``RProgram.amx``):
    each register tile loads the activation's rows and the weight's columns it reduces over once, as
    64-byte tile rows, and its int32 accumulator tiles in and out once (``targets.cpu.amx``)."""
    total, _ = tile_counts(expr, reg)
    reduce = {a.name for a in expr.reduce_axes}
    operands = sum(math.prod(t.region(reg)) * t.elem_bytes for t in expr.inputs if t.axes & reduce)
    return total * (operands + 2 * 4 * math.prod(expr.output.region(reg)))


def accumulator_parent(expr: Expr, tiles: Sequence[Mapping[str, int]], index: int,
                       vector_axis: str | None = None) -> Mapping[str, int] | None:
    """The tile whose reduction chunks make level ``index`` read its output tile back (``rtile.traffic``'s
    parent): the next level's, except that the register tile's accumulators stay in registers through
    every level above whose tile holds no other register tile (the compiler keeps them there: no loop over
    other outputs runs between those reduction loops), where several register tiles under one tile send
    their accumulators back to memory at each reduction chunk (docs/design-notes.md#cost-accumulator_parent;
    the cost of a move: docs/cost-constants.md#accumulator_cycles-08). Not for partial sums (a reduced
    vector axis), which codegen keeps in a buffer of their own. None: the whole reduction."""
    if index + 1 >= len(tiles):
        return None
    if index == 0 and (vector_axis is None or expr.axis(vector_axis).kind != REDUCE):
        spatial = [a.name for a in expr.axes if a.kind != REDUCE]
        for parent in tiles[1:]:
            if any(parent[a] != tiles[0][a] for a in spatial):
                return parent
        return None
    return tiles[index + 1]


# device.model.accumulator_cycles (the spec's model: section; docs/cost-constants.md): Cycles per accumulator vector
# moved between the registers and memory where the plan splits the reduction above the register tile and other
# register tiles run between its chunks (accumulator_parent is not None): code generation then keeps the
# accumulators in a tile buffer that is zeroed, loaded and stored at every chunk and copied out at the end (2 x
# chunks + 1 moves a vector more than accumulators that stay in registers and are stored once), between the FMAs of
# the register tiles, not under them.


def accumulator_seconds(expr: Expr, program: RProgram, device: Device) -> float:
    """Seconds the whole operator spends moving the plan's accumulators through a tile buffer in memory (see
    device.model.accumulator_cycles); 0 where they stay in registers for the whole reduction, or where the
    plan's vector axis is reduced (``program.vector_axis``: vector partial sums have a buffer of their own,
    charged by the fold, and a scalar reduction's accumulator is one element a register tile)."""
    tiles, vector_axis = [dict(t) for t in program.tiles], program.vector_axis
    if vector_axis is not None and expr.axis(vector_axis).kind == REDUCE:
        return 0.0
    parent = accumulator_parent(expr, tiles, 0, vector_axis)
    if parent is None:
        return 0.0
    chunks = math.prod(ceil_div(a.extent, parent[a.name]) for a in expr.axes if a.kind == REDUCE)
    if chunks <= 1:
        return 0.0
    lanes = compute_lanes(expr, device) if vector_axis is not None else 1
    ext = tiling_extents(expr, vector_axis, lanes)
    vectors = math.prod(ext[a.name] for a in expr.axes if a.kind != REDUCE) / lanes
    return (vectors * (2 * chunks + 1) * device.model.accumulator_cycles * cycle_seconds(device)
            * accumulator_level_factor(expr, tiles, device))


def accumulator_level_factor(expr: Expr, tiles: Sequence[Mapping[str, int]], device: Device) -> float:
    """How much dearer a move of an accumulator vector is than device.model.accumulator_cycles (fitted with the tile
    buffer in L1): the buffer between the outermost chunks is the output region of the highest tile
    whose reduction is split (the chunk loop runs over it), and it lives in the first private level
    that holds it; a move then costs in proportion to that level's bandwidth against L1's
    (docs/design-notes.md#cost-accumulator_level_factor)."""
    caches = device.private_levels[1:]  # a tile buffer is memory, not the register level
    reduce = [a for a in expr.axes if a.kind == REDUCE]
    split = next((tile for i, tile in reversed(list(enumerate(tiles)))
                  if any(tile[a.name] < (tiles[i + 1][a.name] if i + 1 < len(tiles) else a.extent) for a in reduce)),
                 None)
    if split is None or not caches:
        return 1.0
    held = math.prod(expr.output.region(split)) * expr.output.elem_bytes
    levels = caches + device.shared_levels[:1]  # beyond the private caches: the first shared level
    level = next((lv for lv in levels if held <= lv.usable_bytes), levels[-1])
    return max(1.0, caches[0].bandwidth_gbps / unit_bandwidth(level, device.units.count))


def held_grid_waves(expr: Expr, program: RProgram, device: Device, spatial: int, waves: int) -> float:
    """Waves of top tiles the plan's held grid loop (``program.held_grid``) adds, as the model charges them:
    ``device.model.held_grid_wave_share`` of the difference between the waves the parallel loop of S / H
    iterations runs (H top tiles in a row each: ceil(S / H / U) x H) and the ceil(S / U) = ``waves`` charged
    to every plan (docs/cost-constants.md#held_grid_wave_share). 0 without a held loop."""
    share = device.model.held_grid_wave_share or 0.0
    if program.held_grid is None or not share:
        return 0.0
    held = ceil_div(expr.axis(program.held_grid).extent, program.tiles[-1][program.held_grid])
    return share * max(0, ceil_div(ceil_div(spatial, held), device.units.count) * held - waves)


def estimate(expr: Expr, program: RProgram, device: Device) -> Estimate:
    """Predicts the run time of ``program`` on ``device``: the plan whose tile at private level i is
    ``program.tiles[i]``. ``expr`` (first: the plan does not carry the operator it tiles) is the Expr the plan
    was constructed for. The model charges what the plan says and decides none of it (``roller.plan.choices``
    does, for construction): its vector axis, padded and predicated axes, packed, prepacked and inlined
    inputs, register transposes and balancing. Beyond the paper's terms it charges what the generated code
    does: whole vectors (padded flops), copies (padding, the crop, transposed packs; ``tails.copy_bytes``) as
    traffic through the top level, a predicated vector tail's partial vector (``tails.tail_compute_factor``),
    a bounds check per load of an inlined padding stage, no copy for inputs that arrive packed, and the wait
    for the slowest unit, shorter where the plan balances its grid (``residency.imbalance_seconds``).

    Every choice field is charged: ``balanced`` by the imbalance wait, ``register_transposes`` at
    device.model.register_transpose_cycles, ``held_grid`` by the waves its serial loop adds
    (:func:`held_grid_waves`, device.model.held_grid_wave_share) and by the vector tail it lets code generation
    split off (``choices.vector_tail_split``), ``partial_sums`` by the compute rate and the fold. ``prefetched``
    costs nothing the model must see: a prefetch fetches the next top tile's lines ahead of their loads,
    hiding latency, and the model charges memory as bandwidth overlapped with compute (each level's time
    against the tile's compute, the constants' cold traffic at constants_level's bandwidth), never as
    latency; its instructions, one per line of a block on a loop that runs at least
    ``choices.MIN_CARRIER_POINTS`` points an iteration, are under one per 4096 points."""

    tiles = [dict(t) for t in program.tiles]
    vector_axis, padded, inlined = program.vector_axis, program.padded, program.inlined
    predicated, packed, prepacked = program.predicated, program.packed, program.prepacked
    levels = device.private_levels
    if len(tiles) != len(levels):
        raise ValueError(f"expected {len(levels)} tiles (one per private level), got {len(tiles)}")
    expr = layout_expr(expr, vector_axis)  # inputs the plan packs transposed, as the kernel reads them
    total, spatial = tile_counts(expr, tiles[-1])
    units = max(1, min(device.units.count, spatial))
    waves = math.ceil(spatial / device.units.count)
    lanes = compute_lanes(expr, device)
    rate = compute_rate(expr, tiles[0], device, vector_axis, program.partial_sums,
                        accumulation_chain(expr, tiles, vector_axis, lanes), program.dot_depth, program.amx)
    if serial_tail(expr, program, lanes):  # the rule code generation splits the last top tile off by
        waves = math.ceil((spatial - 1) / device.units.count) + 1  # the split-off last top tile runs alone
    compute_all = (padded_flops(expr, tiles, lanes, vector_axis, padded)
                   * tail_compute_factor(expr, vector_axis, lanes, predicated, vector_tail_split(expr, program, lanes))
                   / (rate * 1e9)
                   + inline_check_seconds(expr, tiles, device, vector_axis, inlined))
    per_tile = compute_all / spatial
    root_copies = root_copy_bytes(expr, padded, packed, prepacked)
    copies = copy_bytes(expr, tiles[-1], padded, packed, inlined, prepacked) - root_copies
    mem, traf = {}, {}
    cold_inputs = set(prepacked) | set(program.constants)
    foot = dict(zip((lv.name for lv in levels), level_footprints(expr, list(tiles), device, vector_axis)))
    for i, (lv, tile) in enumerate(zip(levels, tiles)):
        rules = LevelRules.of(device, i, expr, vector_axis)
        q = traffic(expr, tile, rules, accumulator_parent(expr, tiles, i, vector_axis))
        if i == 0 and program.amx:
            q = amx_register_bytes(expr, tile)
        if i == len(levels) - 1:
            q += (copies + short_row_bytes(expr, tile, rules, device) - repeated_fill_bytes(expr, tile, rules)
                  - halo_bytes(expr, tile, rules, vector_axis, predicated))
        below = unit_bandwidth(levels[i + 1], units) if i + 1 < len(levels) else source_bandwidth(expr, device, units)
        if i == 0:
            below *= device.model.register_load_share
        cold = 0.0
        if i == len(levels) - 1 and cold_inputs and device.constants_level:
            # a model's weights that do not stay in the caches between calls come from constants_level,
            # prepacked or read as stored
            cold = sum(tensor_footprint(t, tile, rules, moved=True) for t in expr.inputs
                       if t.name in cold_inputs) * total
        mem[lv.name] = (q - cold) / (below * 1e9)
        if cold:
            mem[lv.name] += cold / (unit_bandwidth(device.level(device.constants_level), units) * 1e9)
        traf[lv.name] = q
    # inputs the kernel reads from a copy made per top tile: packed ones, and every producer stage the plan
    # does not inline (padding, and group_rep, which is never inlined: not strided streams;
    # docs/design-notes.md#cost-estimate)
    copied = tuple(n for n in expr.staged if n not in inlined)
    staged = tuple(packed) + copied
    worst = (max([per_tile] + [m / spatial for m in mem.values()]) + tile_overhead(device)
             + untracked_stream_seconds(expr, tiles[-1], device, staged, tiles[-2] if len(tiles) > 1 else None)
             * total / spatial
             + transpose_seconds(expr, tiles[-1], device, prepacked, program.register_transposes) * total / spatial
             + replicate_seconds(expr, tiles[-1], device) * total / spatial
             + stage_copy_seconds(expr, tiles[-1], device, [n for n in copied if n not in packed]) * total / spatial
             + workspace_seconds(expr, tiles, device, vector_axis) / spatial
             + interleaved_run_seconds(expr, tiles, device, vector_axis, staged) / spatial
             + sliced_row_seconds(expr, tiles, device, vector_axis, packed) / spatial
             + fold_seconds(expr, tiles[-1], device, program.partial_sums)
             # the epilogue runs at each write-back, after the tile's reduction: not under its memory time
             + epilogue_seconds(expr, device) / spatial
             + accumulator_seconds(expr, program, device) / spatial)
    seconds = ((waves + held_grid_waves(expr, program, device, spatial, waves)) * worst
               + launch_seconds(device, units) + false_sharing_seconds(expr, tiles[-1], device, units))
    if root_copies:
        # a parallel loop of its own before the kernel's, not under its compute (docs/design-notes.md#cost-estimate)
        seconds += root_copies / (source_bandwidth(expr, device) * 1e9) + launch_seconds(device, device.units.count)
    est = Estimate(seconds=seconds, compute_seconds=compute_all / units, memory_seconds=mem, traffic_bytes=traf,
                   footprint_bytes=foot, tiles=spatial, units=units, waves=waves, base_seconds=seconds,
                   tile_seconds=worst)
    return rebalanced(expr, est, device, program.balanced)


def rebalanced(expr: Expr, est: Estimate, device: Device, balanced: bool) -> Estimate:
    """``est`` with the wait for the slowest unit charged as a plan that does (``balanced``) or does not
    balance its grid waits (``residency.imbalance_seconds``): the model's one charge for it."""
    import dataclasses

    extra = imbalance_seconds(expr, est.tile_seconds, est.waves, device, balanced) if est.units > 1 else 0.0
    return dataclasses.replace(est, seconds=est.base_seconds + extra)
