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
also at their element rate before the tile's compute (TRANSPOSE_CYCLES, or REGISTER_TRANSPOSE_CYCLES
for whole blocks transposed in registers), the lanes of partial sums folded one by one at the write-back
(FOLD_CYCLES), a predicated vector axis's partial last vector as its
power-of-two pieces (scalar lanes where code generation cannot split it off, ``tails.tail_compute_factor``)
and a parallel grid loop split at its last top tile one wave longer (``tails.serial_tail``), output lines
two units write where they split the output's contiguous rows inside a line (FALSE_SHARING_SECONDS), a
register tile with too few accumulators below peak (unless its accumulation chain is short enough for the
out-of-order window to overlap it with the next tiles', ``units.reorder_window``), the rows a sliding window's
consecutive top tiles share in the cache (``halo_bytes``), a reduction that cannot keep vector partial
sums at scalar speed, the bounds checks of a padding stage the plan inlines (INLINE_CHECK_CYCLES) instead
of copying it, the bandwidth short strided rows lose at the top level (the calibrated small-transfer
efficiency, ``short_row_bytes``), the misses of inputs read on more strided streams than the hardware
prefetcher follows (UNTRACKED_LINE_CYCLES), the lines of broadcast operands whose register-tile loads read
runs side by side in one page (INTERLEAVED_LINE_CYCLES), the accumulators a plan that splits its reduction moves
through memory between the chunks (ACCUMULATOR_CYCLES), and the copies a repeating stage (a grouped
convolution's group_rep) writes, at their element rate (REPLICATE_CYCLES) rather than as traffic from below.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from roller.device.spec import Device, MemoryLevel
from roller.plan.expr import REDUCE, Expr, TensorAccess
from roller.plan.prepack import prepackable
from roller.plan.rtile import (LevelRules, ceil_div, compute_lanes, default_vector_axis, layout_expr, level_footprints, packing, round_up,
                               tensor_footprint, tile_counts, traffic)
from roller.plan.tails import (accumulator_tile, clamped_top, copy_bytes, partial_sums, predicated_axes,
                               root_copy_bytes, serial_tail, split_axes, stack_array, tail_compute_factor,
                               tail_options, tiling_extents, transposed_elements)


@dataclass(frozen=True)
class Estimate:
    """What the model predicts for one plan; memory and traffic figures are per private level."""

    seconds: float
    compute_seconds: float
    memory_seconds: Mapping[str, float] = field(default_factory=dict)
    traffic_bytes: Mapping[str, int] = field(default_factory=dict)
    footprint_bytes: Mapping[str, int] = field(default_factory=dict)
    tiles: int = 1
    units: int = 1
    waves: int = 1

DEFAULT_CLOCK_GHZ = 2.0  # for a spec without clock_ghz


def cycle_seconds(device: Device) -> float:
    """Seconds one cycle of a compute unit takes (the spec's clock)."""
    return 1.0 / ((device.units.clock_ghz or DEFAULT_CLOCK_GHZ) * 1e9)


TILE_OVERHEAD_CYCLES = 20  # fixed cost of one top tile (loop-nest set-up, the pipeline's ramp at its edges)


def tile_overhead(device: Device) -> float:
    """Seconds one top tile costs beyond its compute and traffic: nothing for the model's ranking of big
    tiles, but it stops a memory-bound operator from tying with a plan of one-vector tiles."""
    return TILE_OVERHEAD_CYCLES * cycle_seconds(device)


# Fixed cost of running a kernel over several units: TVM's thread pool wakes its workers and joins them
# on every call. Measured here (one process, alternating, 2026-11-27): add_relu over 2x64 elements in two
# top tiles on 2 cores 1.4-1.8 us, in one top tile (no parallel loop) 0.2-0.4 us: 1.2-1.4 us; over 2x4096
# one unit 1.7 us against two 2.6, 2x8192 2.7 against 3.2, 2x16384 5.1 against 4.2 (construction offers
# the one-unit plan, construct._fits_one_unit). 3000 cycles of the calibrated 2.1 GHz clock (1.4 us);
# 5000 before, fitted at 1.9 us when the spec's clock was 2.6 GHz, charged 2.4 us and ranked one unit
# first at 2x16384.
PARALLEL_LAUNCH_CYCLES = 3000


def launch_seconds(device: Device, units: int) -> float:
    """Seconds a kernel spends starting and joining its parallel loop (none on one unit)."""
    return PARALLEL_LAUNCH_CYCLES * cycle_seconds(device) if units > 1 else 0.0


# Share of the L1's calibrated read bandwidth (a stream of whole-vector loads) that a register tile's loads
# reach between its FMAs: the register level's traffic is charged at it. One thread, a 1x1 conv on
# 42x42x168 -> 168: 14 pixels x one vector (15 loads a step for 14 FMAs) ran 910-1151 us, 7 x 2 vectors
# (9 loads for 14) 687-707; at 0.75 the first is load-bound at 1.65x the second, which just stays
# FMA-bound, as it ran. Two suite first plans moved (ab_first_plans.py, 11 rounds, old/new): the 5x5
# depthwise to its window's rows inside the register tile 1.036, gpt2_gemv_768to768 1.015.
REGISTER_LOAD_SHARE = 0.75


# Seconds a cache line written by two units costs (it moves between their caches): where the parallel grid
# splits the output's contiguous dimension between units at a boundary inside a line. Fitted on one case
# (two threads, one process, the same tiles): a depthwise 3x3 of stride 2 on 28x28x90 whose cores split
# the channels in 16-channel top tiles (their boundary inside 7 of every 8 pixels' lines) ran 21.1 us
# against 11.5 on one thread; split over the rows instead, 8.3; on 96 channels, lines whole, 5.7. About 13 us
# for 171 shared lines.
FALSE_SHARING_SECONDS = 75e-9


def false_sharing_seconds(expr: Expr, top: Mapping[str, int], device: Device, units: int) -> float:
    """Seconds lost to output lines two units write (FALSE_SHARING_SECONDS each): where the only axis the
    parallel grid splits is the one that indexes the output's contiguous dimension, each boundary between
    two units' shares falls inside a line in every output row where that row's offset plus the boundary's
    is not a whole line."""
    out = expr.output
    inner = out.innermost_axes()
    if units < 2 or len(inner) != 1 or not out.shape:
        return 0.0
    axis = inner[0]
    if split_axes(expr, top) != [axis]:
        return 0.0
    line = device.private_levels[0].transaction_bytes
    tiles = ceil_div(expr.axis(axis).extent, top[axis])
    row = out.shape[-1] * out.elem_bytes
    rows = math.prod(out.shape[:-1])
    period = line // math.gcd(row, line)  # rows repeat their offset within a line after this many
    shared = 0
    for u in range(1, units):  # a unit's share: consecutive top tiles (the parallel loop's static split)
        edge = ceil_div(tiles * u, units) * top[axis] * out.elem_bytes
        if edge >= row:
            continue
        straddles = sum((r * row + edge) % line != 0 for r in range(period))
        shared += rows * straddles / period
    return shared * FALSE_SHARING_SECONDS


# Cycles one element of a transposed pack costs (tails.transposed_elements), where it is scattered: the
# copy reads its source in runs of a vector and writes one scalar per element (codegen/cpu._block_transpose),
# and it runs before the tile's compute, not under it. Measured: a [1000, 2048] weight packed for a batch-32
# fc layer added 0.9 ms on 2 cores (2.0 vs 1.1 ms with the same tiles untransposed), ~3 cycles an element at
# 3.6 GHz. In whole lanes x lanes blocks the copy is transposed in registers (codegen/transpose.py): BERT fc1
# in the [N, K] layout (128 x 3072, K 768; top tiles 128 x 192 x 384), one thread, the same plan: 5481 us
# scattered, 4663 in registers, 4242 with B prepacked (no copy): 420 us for 2.36 M elements, 0.37 cycles an
# element at the calibrated 2.1 GHz (the scattered copy here: 1240 us, ~1.1).
TRANSPOSE_CYCLES = 3.0
REGISTER_TRANSPOSE_CYCLES = 0.4


def transpose_seconds(expr: Expr, top: Mapping[str, int], device: Device, prepacked: tuple[str, ...] = ()) -> float:
    """Seconds the transposed packs of one top tile (one step of its reduction) take, serial with its
    compute (none for inputs that arrive packed)."""
    scattered, shuffled = transposed_elements(expr, top, compute_lanes(expr, device), prepacked)
    return (scattered * TRANSPOSE_CYCLES + shuffled * REGISTER_TRANSPOSE_CYCLES) * cycle_seconds(device)


# Cycles per lane of partial sums folded into its output (a reduced vector axis): the write-back adds the
# lanes of every output element one by one. Measured: bert fc1 nt (128 x 3072, K 768) with a 4x4x16
# dot-product register tile ran 6.1 ms against 3.4 ms of compute in the model, ~2 cycles per lane at 2.6 GHz.
FOLD_CYCLES = 2.0


def fold_seconds(expr: Expr, top: Mapping[str, int], reg: Mapping[str, int], device: Device,
                 vector_axis: str | None) -> float:
    """Seconds the write-back of one top tile spends summing the lanes of partial sums (0 without them)."""
    lanes = compute_lanes(expr, device)
    if vector_axis is None or expr.axis(vector_axis).kind != REDUCE or not partial_sums(expr, reg, vector_axis,
                                                                                          lanes):
        return 0.0
    outputs = math.prod(expr.output.region(top))
    return outputs * lanes * FOLD_CYCLES * cycle_seconds(device)


# Cycles each element load of an input whose zero-padding stage the plan inlines costs (RProgram.inlined):
# the load sits behind a bounds check on its window position. Fitted on one thread, one A/B process each,
# the same plan staged and inlined, on the register tiles construction makes now (accumulators as stack
# arrays, no spilling window values): the ResNet stem (4 x 64 outputs a register tile, 3.2 M broadcast
# loads) 1489 -> 1731 us, ~0.17 cycles a load at 2.3 GHz; a 3x3 conv on 42x42x84 (3.0 M) 1710 -> 1585, no
# cost. (Fitted on earlier code, whose checks sat in spilling unrolled loops: ~2 cycles.) Loads along the
# vector axis share one check per window row, and cost nothing measurable: depthwise convs ran faster
# inlined (3x3/2 on 112x112x96 760 -> 400 us, 5x5 on 83x83x42 369 -> 292 us), the copy they save dominating.
INLINE_CHECK_CYCLES = 0.2


def inline_check_seconds(expr: Expr, tiles: Sequence[Mapping[str, int]], device: Device,
                         vector_axis: str | None, inlined: tuple[str, ...]) -> float:
    """Seconds the bounds checks of the inlined padding stages' loads take, over the whole operator (all
    units): one check per element loaded at the register level (a broadcast); a tensor read in vectors
    along the vector axis is not charged (see INLINE_CHECK_CYCLES)."""
    if not inlined:
        return 0.0
    rules = LevelRules.of(device, 0, expr, vector_axis)
    total = tile_counts(expr, tiles[0])[0]
    loads = sum(tensor_footprint(t, tiles[0], rules, moved=True) for t in expr.inputs
                if t.name in inlined and vector_axis not in t.innermost_axes())
    return loads * total / rules.level.transaction_bytes * INLINE_CHECK_CYCLES * cycle_seconds(device)


def short_row_bytes(expr: Expr, top: Mapping[str, int], rules: LevelRules, device: Device) -> float:
    """Bytes the top level's fill wastes on short strided rows: an input whose top tile takes part of each
    of its rows (a 16-channel slice of a 96-channel window: 64 B of every 384) streams at the calibrated
    efficiency of such rows (``Device.run_efficiency``), charged as the extra bytes that costs. One thread,
    one A/B process, first plans before and after: stride-2 depthwise conv on 112x112x96 525 -> 245 us
    (16 -> 96 channels a tile; PyTorch 349), dw 3x3 on 56x56x144 297 -> 193, on 112x112x32 209 -> 145,
    max pool 3x3/2 on 112x112x64 302 -> 146.

    Only the bytes that come from beyond the units' private caches are charged (1 - resident_share):
    the efficiency is the memory's, and lines the L2s still hold come whole. Depthwise 3x3 on 56x56x144
    (3.6 MB, 56% resident), two threads: 16-channel top tiles ran 78-80 us like whole-pixel ones (81),
    charged 113 us of short rows."""
    remote = 1.0 - resident_share(expr, device)
    if remote <= 0:
        return 0.0
    total = tile_counts(expr, top)[0]
    extra = 0.0
    for t in expr.inputs:
        if not t.index or t.region(top)[-1] >= t.shape[-1]:
            continue  # a scalar, or whole rows: the tile reads the tensor contiguously
        eff = device.run_efficiency(rules.row_bytes(t, t.region(top)[-1], moved=True))
        if eff < 1.0:
            extra += tensor_footprint(t, top, rules, moved=True) * total * (1.0 / eff - 1.0)
    return extra * remote


# Cycles a line of an input costs, serial with the tile's compute, where the kernel reads it on a stream
# the hardware prefetcher cannot follow: the top tile reads more strided rows, each on its own page, than
# the prefetcher tracks (``units.prefetch_streams``), in runs too short (under PREFETCH_RUN_BYTES) for it
# to pick a stream up within one, so the loads wait on their misses. Fitted on one thread, one A/B process:
# a 1x1 conv, 165x165x96 -> 48 channels, with top tiles of 165, 45 and 15 rows of 384 B (one pixel each)
# and otherwise the same loops ran 4.5, 2.6-3.0 and 1.8 ms: ~20 ns (46 cycles at 2.3 GHz) for each of the
# 163 k input lines, times the share of the streams the prefetcher cannot hold (1 - 32 / rows). A pure
# read of the same pattern streams at full bandwidth: without compute between them the loads run ahead.
# A run is what the kernel reads of a row before it moves to the next: the width of the tile it walks the
# top tile in, not the top tile's (MobileNetV2's 1x1 conv 112x112x16 -> 96 in 56 x 28 top tiles walked in
# L1 tiles one pixel wide, 64 B a row, ran 615 us; walked along the rows 396, PyTorch 351; one thread).
# Runs of 1-2 KiB still lose lines before the prefetcher catches up: NASNet's 1x1 conv on 165x165x96 -> 42
# in top tiles of 55 rows x 5 pixels (1920 B runs) ran 2249 us against 2027 in whole rows (one thread).
UNTRACKED_LINE_CYCLES = 46
PREFETCH_RUN_BYTES = 2048
PAGE_BYTES = 4096


def _level_loop_order(expr: Expr) -> list:
    """The loops code generation runs over the tiles of the level below within one tile, outer to inner
    (codegen/cpu): the spatial axes in axis order, then the reduce axes."""
    return [a for a in expr.axes if a.kind != REDUCE] + [a for a in expr.axes if a.kind == REDUCE]


def untracked_stream_seconds(expr: Expr, top: Mapping[str, int], device: Device,
                             staged: Sequence[str] = (), step: Mapping[str, int] | None = None) -> float:
    """Seconds one top tile waits on the lines of inputs read on more strided streams than the prefetcher
    follows (see UNTRACKED_LINE_CYCLES); inputs copied per top tile (``staged``) stream row by row.
    ``step`` is the tile the kernel walks the top tile in (the next level's, default the top tile): it
    reads each row of the top tile in runs as wide as that tile's."""
    step = dict(step or top)
    # consecutive step tiles follow the innermost loop over them (_level_loop_order): along its axis a row
    # continues from one step tile into the next
    walked_axis = next((a.name for a in reversed(_level_loop_order(expr)) if ceil_div(top[a.name], step[a.name]) > 1),
                       None)
    if walked_axis is not None:
        step[walked_axis] = top[walked_axis]
    tracked = device.units.prefetch_streams
    if not tracked:
        return 0.0
    rules = LevelRules.of(device, len(device.private_levels) - 1, expr)
    lines = 0.0
    for t in expr.inputs:
        if t.name in staged or not t.index:
            continue
        region, walked = t.region(top), t.region(step)
        run = 1
        for d in reversed(range(len(walked))):  # contiguous: the whole trailing dimensions and one more
            run *= walked[d]
            if walked[d] < t.shape[d]:
                break
        if run * t.elem_bytes >= PREFETCH_RUN_BYTES:
            continue
        streams = math.prod(r for d, r in enumerate(region)
                            if math.prod(t.shape[d + 1:]) * t.elem_bytes >= PAGE_BYTES)
        if streams > tracked:
            moved = tensor_footprint(t, top, rules, moved=True) / rules.level.transaction_bytes
            lines += moved * (1.0 - tracked / streams)
    return lines * UNTRACKED_LINE_CYCLES * cycle_seconds(device)


# Cycles a line of a broadcast operand costs where the register tile's loads of it read runs that interleave
# in one page. The register tile loads each element of an input the vector axis does not index (a conv's
# pixel, a matmul's row of A) with its own instruction, which walks the reduction along the input's
# contiguous row. A tile one pixel wide and several rows tall walks each run on its own page, one ascending
# stream a page that the L2 streamer follows; a tile several pixels wide walks as many runs side by side in
# one page, and the streamer (one stream a page) falls behind them. One thread, one A/B process, 1x1 convs
# on 60x60 -> 42 channels, the same loops, register tiles of 6 rows x 1 pixel against 1 x 6 and 3 x 2:
# 96 channels (runs of 6 lines) 316 / 359 / 331 us, 256 channels 850 / 982 / 896, 48 channels 155 / 175 /
# 178 (~2.3 ns a line of the 1 x 6 tile's, (1 - 1/k) of the lines of k runs in a page); 32 and 16
# channels (runs of 1-2 lines, the pixels swept whole) the same time; NASNet's 165x165x96 -> 42 (input
# from L3) 2342 against 2728 us, 2.4 ns a line. Those ran in the machine's slow phases; in its fast ones the
# same tiles differ by 2-4% (0.3 ns a line; 48 channels once 143 / 137 / 143, the wide tile 4% ahead): the
# figure sits between the two, a tie-breaker more than a cost.
INTERLEAVED_LINE_CYCLES = 3
INTERLEAVED_MIN_RUN_LINES = 3


def broadcast_run(expr: Expr, t: TensorAccess, tiles: Sequence[Mapping[str, int]],
                  shape: Sequence[int]) -> dict[str, int]:
    """The tile of iteration space one load instruction of the register tile covers of ``t`` (laid out as
    ``shape``) in one unbroken ascending run: its reduction loop inside the L1 tile, continued through the
    loops over register tiles (``_level_loop_order`` at each level) for as long as each step starts where
    the run so far ended. Loops over axes that do not
    index ``t`` re-read the run and let it go on after them."""
    cover = {a.name: 1 for a in expr.axes}

    def contiguous(tile) -> bool:
        region = t.region(tile)
        partial = next((d for d in reversed(range(len(region))) if region[d] < shape[d]), None)
        return partial is None or all(r == 1 for r in region[:partial])

    inner_first = list(reversed(_level_loop_order(expr)))
    for lower, upper in zip(tiles, tiles[1:]):
        for a in inner_first:
            steps = ceil_div(upper[a.name], lower[a.name])
            if steps == 1 or a.name not in t.axes:
                continue
            # a load starts as one element of the register tile: a step longer than what it covered so
            # far (a tile several pixels wide) leaves a gap; one that overlaps it (a sliding window) or
            # leaves the row's contiguous block goes back or jumps
            grown = dict(cover, **{a.name: cover[a.name] * steps})
            if (lower[a.name] != cover[a.name] or not contiguous(grown)
                    or math.prod(t.region(grown)) != math.prod(t.region(cover)) * steps):
                return cover
            cover = grown
    return cover


def interleaved_run_seconds(expr: Expr, tiles: Sequence[Mapping[str, int]], device: Device,
                            vector_axis: str | None, staged: Sequence[str] = ()) -> float:
    """Seconds the whole operator (all units) loses to broadcast operands whose register-tile loads read
    runs side by side in one page (see INTERLEAVED_LINE_CYCLES): of the lines each such input moves into the
    L1 tiles, the share (1 - 1/k) where k runs share a page; whole rows shorter than
    INTERLEAVED_MIN_RUN_LINES lines side by side are one dense block the loads sweep, and cost nothing. A
    copy made per top tile (``staged``) is laid out as the top tile's region."""
    if len(tiles) < 2 or not device.units.prefetch_streams:
        return 0.0
    rules = LevelRules.of(device, 1, expr, vector_axis)
    line = rules.level.transaction_bytes
    total = tile_counts(expr, tiles[1])[0]
    reduced = {a.name for a in expr.reduce_axes}
    lines = 0.0
    for t in expr.inputs:
        inner = t.innermost_axes()
        if not inner or vector_axis in t.axes or not set(inner) <= reduced:
            continue  # not a broadcast operand read along the reduction
        shape = t.region(tiles[-1]) if t.name in staged else t.shape
        run = t.region(broadcast_run(expr, t, tiles, shape))
        outer = min((d for d in range(len(run)) if run[d] > 1), default=len(run) - 1)
        whole = all(r == n for r, n in zip(run[outer:], shape[outer:]))
        if whole and math.prod(run) * t.elem_bytes < INTERLEAVED_MIN_RUN_LINES * line:
            continue  # short whole rows side by side: the loads sweep one dense block
        # the register tile's loads lie side by side along the nearest dimension outside the run (not
        # the overlapping rows of a sliding window, which were not measured)
        side, reg = outer - 1, t.region(tiles[0])
        if side < 0 or reg[side] == 1 or sum(1 for a, _ in t.index[side] if expr.axis(a).extent > 1) != 1:
            continue
        k = min(reg[side], PAGE_BYTES / (math.prod(shape[side + 1:]) * t.elem_bytes))
        if k > 1:
            lines += tensor_footprint(t, tiles[1], rules, moved=True) * total / line * (1.0 - 1.0 / k)
    return lines * INTERLEAVED_LINE_CYCLES * cycle_seconds(device)


# Cycles an accumulator tile of tails.STACK_ARRAY_BYTES or more costs each time its loop enters it: TVM
# allocates it through TVMBackendAllocWorkspace (and frees it), zeroes it with memset and the write-back
# reads it back from memory, where a smaller tile is a stack array held in registers. One thread, one A/B
# process, a 1x1 conv 56x56, 24 -> 144 channels: register tiles of 8 x 48 outputs (1.5 KiB, 1176 tiles)
# 157 us against 4 x 48 (768 B) 130 us; of 8 x 32 (1 KiB, 1960 tiles) 157.5 against 7 x 32 (896 B) 134.8:
# 12-23 ns a tile, ~40 cycles at 2.3 GHz.
WORKSPACE_TILE_CYCLES = 40


def workspace_seconds(expr: Expr, tiles: Sequence[Mapping[str, int]], device: Device,
                      vector_axis: str | None) -> float:
    """Seconds the whole operator (all units) spends on accumulator tiles too large for a stack array
    (see WORKSPACE_TILE_CYCLES); 0 when they fit or there is no reduction."""
    acc = accumulator_tile(expr, tiles, vector_axis, compute_lanes(expr, device))
    if acc is None or stack_array(expr, acc):
        return 0.0
    count = math.prod(ceil_div(a.extent, acc[a.name]) for a in expr.axes if a.kind != REDUCE)
    return count * WORKSPACE_TILE_CYCLES * cycle_seconds(device)


def repeated_fill_bytes(expr: Expr, top: Mapping[str, int], rules: LevelRules) -> float:
    """Bytes of the top level's fill (``rtile.traffic``) that inputs written by a repeating stage
    (``Expr.repeats``) do not bring from below: the stage reads 1/repeat of the region it writes per top
    tile, the rest are copies it makes in the cache (charged by :func:`replicate_seconds`)."""
    total = tile_counts(expr, top)[0]
    return sum(tensor_footprint(t, top, rules, moved=True) * total * (1.0 - 1.0 / expr.repeat(t.name))
               for t in expr.inputs if expr.repeat(t.name) > 1)


def top_step_axis(expr: Expr, top: Mapping[str, int], vector_axis: str | None,
                  predicated: tuple[str, ...]) -> str | None:
    """The axis one unit's consecutive top tiles step along: code generation's innermost grid loop of more
    than one tile (codegen/cpu: the fused spatial grid, then a predicated vector axis's grid held out of it,
    then the reduction's grid loops); None for a single top tile."""
    steps = {a.name: ceil_div(a.extent, top[a.name]) for a in expr.axes}
    reduce = [a.name for a in expr.reduce_axes if steps[a.name] > 1]
    if reduce:
        return reduce[-1]
    spatial = [a.name for a in expr.axes if a.kind != REDUCE and steps[a.name] > 1]
    if vector_axis in spatial and vector_axis in predicated and len(spatial) > 1:
        return vector_axis
    return spatial[-1] if spatial else None


def halo_bytes(expr: Expr, top: Mapping[str, int], rules: LevelRules, vector_axis: str | None,
               predicated: tuple[str, ...]) -> float:
    """Bytes of the top level's fill (``rtile.traffic``) that a unit's consecutive top tiles share, so the
    next tile finds them in the cache: the overlap of a sliding window (an input dimension indexed by the
    step axis and a reduction axis, a pool's or convolution's rows) between neighbouring tiles. A 3x3 pool
    of stride 2 over 165x165x42 in one-row tiles reads two new input rows a tile, not three: counted as
    three, its memory time was 1.4x the 151-162 us it ran (two threads). Inputs the step axis does not
    index at all (a convolution's weights) are left as they were: the model has not charged their reuse
    between top tiles anywhere, and ranking compute-bound plans was tuned without it."""
    axis = top_step_axis(expr, top, vector_axis, predicated)
    if axis is None:
        return 0.0
    steps = ceil_div(expr.axis(axis).extent, top[axis])
    total = tile_counts(expr, top)[0]
    saved = 0.0
    for t in expr.inputs:
        shared, window = 1.0, False
        for dim, size in zip(t.index, t.region(top)):
            coef = next((c for a, c in dim if a == axis), 0)
            if coef and len(dim) > 1:
                shared *= max(0, size - abs(coef) * top[axis]) / size
                window = True
            elif coef:
                shared = 0.0
        if window and shared > 0:
            saved += tensor_footprint(t, top, rules, moved=True) * shared * total * (steps - 1) / steps
    return saved


# Cycles a line costs where the tile below the top (the L1 tile) reads a slice of an input's rows along the
# vector axis that the top tile holds more of: the kernel walks the same pixels once per slice, each time in
# runs of a line or two at the pixel stride, and the loads wait on more of their fills from L2 than in whole
# runs. Times (1 - 1 / slices): nothing for whole rows. Measured, one thread, CPU time, the same plans with
# only the L1 tile's channels changed (scripts/compare_plans.py --cpu-time): avg pool 3x3 on 83x83x84, 16 of
# 96 channels 572 us, all 96 384; depthwise 3x3/2 on 112x112x96, 16 of 96 375, 96 282; depthwise 3x3 on
# 112x112x32, 16 of 32 153, 32 142 (1.8, 2.3 and 0.7 cycles a line at 2.1 GHz); the model tied each pair.
# Only as far as a slice's rows outnumber the streams the prefetcher follows (units.prefetch_streams): an
# L1 tile of one pixel's 3x3 window (9 rows) walks the next slice of the same rows right after, and the
# avg pool ran 173 us in such tiles, against 268 in slices of 83 pixels (255 rows).
SLICED_LINE_CYCLES = 2.0


def sliced_row_seconds(expr: Expr, tiles: Sequence[Mapping[str, int]], device: Device, vector_axis: str | None,
                       packed: Sequence[str] = ()) -> float:
    """Seconds the whole operator loses to L1 tiles that read slices of an input's rows (see
    SLICED_LINE_CYCLES): inputs whose contiguous dimension is the (spatial) vector axis, not packed, read
    in slices of more rows than the prefetcher follows."""
    tracked = device.units.prefetch_streams
    if not tracked or len(tiles) < 2 or vector_axis is None or expr.axis(vector_axis).kind == REDUCE:
        return 0.0  # (no prefetch_streams: the model assumes the prefetcher follows every stream)
    top, walk = tiles[-1], tiles[-2]
    rules = LevelRules.of(device, len(tiles) - 2, expr, vector_axis)
    walks = tile_counts(expr, walk)[0]
    lines = 0.0
    for t in expr.inputs:
        if t.name in packed or not t.index or t.index[-1] != ((vector_axis, 1),):
            continue
        region = t.region(walk)
        slices = ceil_div(t.region(top)[-1], region[-1])
        rows = math.prod(region[:-1])
        if slices > 1 and rows > tracked:
            moved = tensor_footprint(t, walk, rules, moved=True) * walks / rules.level.transaction_bytes
            lines += moved * (1.0 - 1.0 / slices) * (1.0 - tracked / rows)
    return lines * SLICED_LINE_CYCLES * cycle_seconds(device)


# Cycles each element a repeating stage writes costs (Expr.repeats: a grouped convolution's group_rep, each
# input channel copied for the K/groups output channels of its group), serial with the tile's compute: it
# runs in vectors of runs of one broadcast load each (ops.LANE_RUN), before the tile's compute. Fitted on
# one thread, cpu time, first plans, 3x3 pad 1 (time beyond the compute at peak over the elements the
# stage writes): 56x56x128 in 32 groups of 4, 512 us (0.39 cycles an element at 2.3 GHz); 28x28x64 in
# 16 groups of 4, 53 us (0.34); 14x14x256 in 64 of 4, 81 us (0.54); 28x28x64 in 32 of 2, 32 us (0.44).
# Before, the model charged all of group_rep's bytes as traffic from below (4x the input's) and none of
# this: 450 us predicted on 2 cores for the first, 237-250 measured (2 threads), 13 for the others.
REPLICATE_CYCLES = 0.4


def replicate_seconds(expr: Expr, top: Mapping[str, int], device: Device) -> float:
    """Seconds the repeating stages of one top tile take to write their copies (see REPLICATE_CYCLES)."""
    elements = sum(math.prod(t.region(top)) for t in expr.inputs if expr.repeat(t.name) > 1)
    return elements * REPLICATE_CYCLES * cycle_seconds(device)


# Cycles each element of a producer stage's copy costs (a convolution's zero padding, copied per top tile
# where the plan does not inline it; not a stage folded into a pack), serial with the tile's compute: it
# reads the window's rows behind the padding's bounds and writes the copy. TVM vectorizes the copy's inner
# loop where its rows are whole vectors (the last dimension a multiple of the lanes). One process, the
# same plan staged and inlined: a 3x3 conv on 42x42x84 (rows of 84, not vectorized by TVM) in 6 top tiles
# copying the whole padded input each, 2 threads, 1454 -> 1266 us, 0.8 cycles an element at 2.1 GHz; a
# depthwise 3x3 on 56x56x144 (vectors), one thread, 278 -> 195 and 318 -> 275 us for 534 k elements, ~0.25
# cycles (less the inlined plan's own costs, which the model puts at none there). The gap is not the
# vectorization alone: that 84-channel copy in 5 vectors and a tail split off ran no faster (1450 / 1444
# and 1019 / 1014 us, 2 threads), LLVM presumably vectorizing the plain loop itself; not explained yet.
# Before, the copies counted as traffic only (under the compute), and plans copying the same window for
# every top tile of channels, or 5x wider windows than their tiles, ranked first (depthwise 5x5 on
# 83x83x42 in one-pixel-wide tiles: 1175 us against 550, one thread).
STAGE_COPY_CYCLES = 0.8
STAGE_VECTOR_COPY_CYCLES = 0.25


def stage_copy_seconds(expr: Expr, top: Mapping[str, int], device: Device, copied: Sequence[str]) -> float:
    """Seconds the producer stages' copies of one top tile take (see STAGE_COPY_CYCLES): the inputs in
    ``copied``, staged and neither inlined nor folded into a pack."""
    lanes = compute_lanes(expr, device)
    cycles = 0.0
    for t in expr.inputs:
        if t.name in copied and expr.repeat(t.name) == 1:  # a repeating stage: replicate_seconds
            region = t.region(top)
            vector = bool(region) and region[-1] >= lanes and region[-1] % lanes == 0  # () : a scalar
            cycles += math.prod(region) * (STAGE_VECTOR_COPY_CYCLES if vector else STAGE_COPY_CYCLES)
    return cycles * cycle_seconds(device)


TIE = 1.02  # predictions closer than this ratio are a tie: the model is not that precise


def rank(items: Sequence, seconds, memory_seconds, body_runs=None) -> list:
    """``items`` best first by the model: the fastest prediction, except that among predictions within
    TIE of it the plan with the least total memory time (traffic over bandwidth, summed over levels)
    goes first, and among those equal in that too the one whose register tile's body runs the fewest times
    (``body_runs(item)``, when given): its loop control and bounds checks serve more vectors, which the
    model does not count (a 3x3 avg pool on 83x83x84, its tiles otherwise the same, with register tiles of
    1, 2, 3 and 6 vectors all predicted 120 us: 175, 151, 146 and 156 us, two threads).
    ``seconds(item)`` and ``memory_seconds(item)`` (level -> seconds) read an item."""
    remaining = sorted(items, key=seconds)
    out = []
    while remaining:
        bound = seconds(remaining[0]) * TIE
        tied = [x for x in remaining if seconds(x) <= bound]
        pick = min(tied, key=lambda x: (sum(memory_seconds(x).values()), body_runs(x) if body_runs else 0))
        out.append(pick)
        remaining.remove(pick)
    return out


# The share of an operator's bytes the units' outermost private caches still hold at its next call falls
# from all to none as its bytes grow from RESIDENT_FULL to RESIDENT_NONE times those caches' capacity (all
# units' together); the rest comes from the first shared level that holds it all. Measured (2 cores x
# 2 MiB L2, top-1 kernels timed alternately, scripts/residency.py): add_relu on M x 3001 ran at 135 GB/s
# at 2.2 MB, 87 at 3.6 MB (0.86 of the L2s: 0.65 of its bytes from them at 228 GB/s, the rest from L3 at
# 44), 68 at 4.3 MB and 47 at 6.5; a row sum 71 GB/s at 3.6 MB, 50 at 4.8 and 43 at 6.7. One step at 0.9
# of the capacity put 3.6 MB wholly in L2 (predicted 2.1x too fast) and 4.1 MB wholly in L3 (1.5x slow).
RESIDENT_FULL = 0.45
RESIDENT_NONE = 1.45


def tensor_bytes(expr: Expr) -> int:
    """Bytes of all the operator's tensors (inputs and output)."""
    return sum(math.prod(t.shape) * t.elem_bytes for t in expr.tensors)


def memory_bound(expr: Expr, device: Device) -> bool:
    """Whether the operator does fewer flops per byte of its tensors than the device's cores can per byte
    from where its data lives between calls (:func:`source_bandwidth`)."""
    peak = device.units.peak(expr.dtype) * device.units.count
    return expr.flops / tensor_bytes(expr) < peak / source_bandwidth(expr, device)


# Kernels predicted shorter than this keep TVM's fixed split of the parallel grid (codegen/balance.py): a
# take of the balanced grid costs tens of nanoseconds, and its lock's cache line moves between the cores.
BALANCE_MIN_SECONDS = 50e-6


def balances(expr: Expr, seconds: float, device: Device) -> bool:
    """Whether the kernel of a plan predicted to run ``seconds`` (before ``imbalance_seconds``) balances its
    grid across the units (codegen/balance.py): compute-bound operators predicted at least
    BALANCE_MIN_SECONDS. Memory-bound ones keep the fixed split, their time being their data's."""
    return seconds >= BALANCE_MIN_SECONDS and not memory_bound(expr, device)


def imbalance_seconds(expr: Expr, seconds: float, tile_seconds: float, waves: int, device: Device) -> float:
    """Seconds a compute-bound kernel waits for its slowest unit (``units.speed_spread``): a fixed split
    waits for that unit's whole share, ``waves`` top tiles; a balanced grid (``balances``) for about one
    tile, the others stealing the rest of its share. Measured (2 threads, one process, 15 alternated
    rounds): a 3x3 conv on 56x56x64 in 14 top tiles ran 1005 us with the fixed split and 914 balanced; in
    2 top tiles, one a core, 1051 and 1023 (the first plan, which the model ranked above the 14-tile one).
    Memory-bound kernels are not charged: a core slowed by a co-tenant on its host core loses issue
    slots, not its share of the bandwidth (not measured; they keep the fixed split either way, so the
    charge would only scale every plan of theirs alike)."""
    spread = device.units.speed_spread
    if not spread:
        return 0.0
    if balances(expr, seconds, device):  # compute-bound, so charged (one memory_bound test on this path)
        return spread * tile_seconds
    return 0.0 if memory_bound(expr, device) else spread * tile_seconds * waves


def private_fill(expr: Expr, device: Device) -> float:
    """The operator's bytes over all the units' outermost private caches together (0 without any)."""
    private = device.private_levels
    return tensor_bytes(expr) / (private[-1].capacity_bytes * device.units.count) if private else 0.0


def resident_share(expr: Expr, device: Device) -> float:
    """The share of the operator's bytes a CPU's units find in their outermost private caches at its next
    call (a kernel called again on the same tensors, or on the output of the one before finds them there:
    400 KB of rows summed at 141 GB/s, more than twice the 60 GB/s of the shared L3), from 1 up to
    RESIDENT_FULL of those caches' capacity down to 0 from RESIDENT_NONE; 0 where the private levels are
    scratchpads that keep nothing between calls (``MemoryLevel.keeps_data``)."""
    if not device.private_levels or not device.private_levels[-1].keeps_data:
        return 0.0
    return min(1.0, max(0.0, (RESIDENT_NONE - private_fill(expr, device)) / (RESIDENT_NONE - RESIDENT_FULL)))


def shared_source(expr: Expr, device: Device) -> MemoryLevel:
    """The first shared level whose usable capacity holds all the operator's tensors (else the last)."""
    total = tensor_bytes(expr)
    shared = device.shared_levels
    return next((lv for lv in shared if total <= lv.usable_bytes), shared[-1])


def data_source(expr: Expr, device: Device) -> MemoryLevel:
    """The level most of the operator's data lives in between calls: the units' outermost private cache
    while it holds at least half of it (:func:`resident_share`), else :func:`shared_source`."""
    return device.private_levels[-1] if resident_share(expr, device) >= 0.5 else shared_source(expr, device)


def source_bandwidth(expr: Expr, device: Device, units: int | None = None) -> float:
    """GB/s the operator's data arrives at from where it lives between calls: what each of ``units``
    active units draws (None: all the units together), the private caches' share of the bytes
    (:func:`resident_share`) at their bandwidth and the rest at :func:`shared_source`'s."""
    def bandwidth(level: MemoryLevel) -> float:
        return level.total_bandwidth_gbps if units is None else unit_bandwidth(level, units)

    share, shared = resident_share(expr, device), shared_source(expr, device)
    if share <= 0:
        return bandwidth(shared)
    return 1.0 / (share / bandwidth(device.private_levels[-1]) + (1.0 - share) / bandwidth(shared))


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
    fewer: a depthwise 5x5 conv on 56x56x128 (one thread) with a one-vector register tile (chain 25) ran at
    26% of peak, 64 / 25 = 2.6 of the 10 accumulators; with four vectors at 43% (4 of 10)."""
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
                 chain: float | None = None) -> float:
    """GFLOP/s one unit issues with this register tile: the accumulation type's peak, scaled by the
    accumulator efficiency (``chain``: see there); a reduction that cannot keep vector partial sums runs
    scalar (1 / lanes)."""
    lanes = compute_lanes(expr, device)
    peak = device.units.peak(expr.dtype) * accumulator_efficiency(expr, reg, device, vector_axis, chain)
    if vector_axis is not None and expr.axis(vector_axis).kind == REDUCE and not partial_sums(
            expr, reg, vector_axis, lanes):
        peak /= lanes
    return peak


def accumulator_parent(expr: Expr, tiles: Sequence[Mapping[str, int]], index: int,
                       vector_axis: str | None = None) -> Mapping[str, int] | None:
    """The tile whose reduction chunks make level ``index`` read its output tile back (``rtile.traffic``'s
    parent): the next level's, except that the register tile's accumulators stay in registers through
    every level above whose tile holds no other register tile (the compiler keeps them there: no loop over
    other outputs runs between those reduction loops). A 1x1 conv on 42x42x168 with one register tile
    per L1 tile ran 751-759 us (one thread), with 7 a tile 837-875, all tied by the model before: their
    accumulators went back to memory at each of the 11 reduction chunks. Not for partial sums (a reduced
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


# Cycles per accumulator vector moved between the registers and memory where the plan splits the reduction
# above the register tile and other register tiles run between its chunks (accumulator_parent is not None):
# code generation then keeps the accumulators in a tile buffer that is zeroed, loaded and stored at every
# chunk and copied out at the end (2 x chunks + 1 moves a vector more than accumulators that stay in
# registers and are stored once), between the FMAs of the register tiles, not under them. Fitted on one
# thread, one A/B process, the same loops otherwise: a 1x1 conv on 56x56x256 -> 64 with its reduction in
# 8, 4, 2 and 1 L1 chunks ran 680, 652, 642 and 629 us (~0.5 cycles a move at 2.3 GHz); on 56x56x64 -> 256,
# 2 chunks against 1, 790 against 672 us (PyTorch 677; ~1.1 cycles); BERT's QK^T (12 x 128x128x64, two
# threads) in 2 chunks of 32 against 16-deep chunks of one register tile kept in registers, 147 against 136
# us (~0.75 cycles). Near their mean: at 0.5 (the lowest fit) the memory tie-break ranked such split plans
# first; at 0.8, 6 of the suite's 58 first plans moved to unsplit ones (scripts/ab_first_plans.py, 11-21
# rounds, old/new): bert_qk_b12 1.06-1.15, bert_ffn1_128 1.06-1.08 (once 0.93), its nt layout 1.07-1.09,
# nas_conv1x1_21_336to336 1.04-1.12, vit_fc1_197 0.98-1.00, inc_conv3x3s2_57_64 0.87-1.00 (0.98 over 21).
ACCUMULATOR_CYCLES = 0.8


def accumulator_seconds(expr: Expr, tiles: Sequence[Mapping[str, int]], device: Device,
                        vector_axis: str | None) -> float:
    """Seconds the whole operator spends moving accumulators through a tile buffer in memory (see
    ACCUMULATOR_CYCLES); 0 where they stay in registers for the whole reduction, or are vector partial
    sums (a reduced vector axis: a buffer of their own, charged by the fold)."""
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
    return (vectors * (2 * chunks + 1) * ACCUMULATOR_CYCLES * cycle_seconds(device)
            * accumulator_level_factor(expr, tiles, device))


def accumulator_level_factor(expr: Expr, tiles: Sequence[Mapping[str, int]], device: Device) -> float:
    """How much dearer a move of an accumulator vector is than ACCUMULATOR_CYCLES (fitted with the tile
    buffer in L1): the buffer between the outermost chunks is the output region of the highest tile
    whose reduction is split (the chunk loop runs over it), and it lives in the first private level
    that holds it; a move then costs in proportion to that level's bandwidth against L1's. A
    grouped 3x3 conv on 56x56x128 (32 groups) whose top tiles take one input channel of four, 401 KB of
    accumulators in L2 between them, ran 770 us against 307 for a plan without the split, both predicted
    ~360 before (two threads)."""
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


def unit_bandwidth(level: MemoryLevel, units: int) -> float:
    """GB/s one of ``units`` active units draws from ``level`` (a shared level's total split between them)."""
    if level.shared:
        return min(level.bandwidth_gbps, level.total_bandwidth_gbps / units)
    return level.bandwidth_gbps


def estimate(expr: Expr, tiles: Sequence[Mapping[str, int]], device: Device,
             vector_axis: str | None = None, padded: tuple[str, ...] | None = None,
             inlined: tuple[str, ...] = (), constants: frozenset[str] = frozenset()) -> Estimate:
    """Predicts the run time of the plan whose tile at private level i is ``tiles[i]``, that vectorizes
    ``vector_axis`` (default: the first candidate) and pads the overhanging axes when ``padded`` (default:
    the last of ``roller.plan.tails.tail_options``), else predicates them. Beyond the paper's terms it charges what
    the generated code does: whole vectors (padded flops), copies (padding, the crop, transposed packs;
    ``tails.copy_bytes``) as traffic through the top level, and a predicated vector tail's partial vector
    (``tails.tail_compute_factor``).
    ``inlined`` names the padding stages the plan inlines: no copy, a bounds check per load instead.
    ``constants`` names inputs that are constants at every call: they arrive packed in the plan's tiles
    (``roller.plan.prepack.prepackable``) and cost no copy."""
    levels = device.private_levels
    if len(tiles) != len(levels):
        raise ValueError(f"expected {len(levels)} tiles (one per private level), got {len(tiles)}")
    if vector_axis is None:
        vector_axis = default_vector_axis(expr)
    expr = layout_expr(expr, vector_axis)  # inputs the plan packs transposed, as the kernel reads them
    total, spatial = tile_counts(expr, tiles[-1])
    units = max(1, min(device.units.count, spatial))
    waves = math.ceil(spatial / device.units.count)
    lanes = compute_lanes(expr, device)
    rate = compute_rate(expr, tiles[0], device, vector_axis, accumulation_chain(expr, tiles, vector_axis, lanes))
    if padded is None:
        # everything padded where every overhanging axis can be, else nothing
        padded = next((p for p, rest in tail_options(expr, tiles, vector_axis, lanes) if not rest), ())
    predicated = predicated_axes(expr, tiles, vector_axis, lanes, padded)
    if serial_tail(expr, tiles, vector_axis, lanes, predicated):
        waves = math.ceil((spatial - 1) / device.units.count) + 1  # the split-off last top tile runs alone
    compute_all = (padded_flops(expr, tiles, lanes, vector_axis, padded)
                   * tail_compute_factor(expr, tiles, vector_axis, lanes, predicated) / (rate * 1e9)
                   + inline_check_seconds(expr, tiles, device, vector_axis, inlined))
    per_tile = compute_all / spatial
    packed, _ = packing(expr, list(tiles), device, vector_axis)
    prepacked = prepackable(expr, tiles, vector_axis, lanes, padded, constants) if constants else ()
    root_copies = root_copy_bytes(expr, padded, packed, prepacked)
    copies = copy_bytes(expr, tiles[-1], padded, packed, inlined, prepacked) - root_copies
    mem, traf = {}, {}
    foot = dict(zip((lv.name for lv in levels), level_footprints(expr, list(tiles), device, vector_axis)))
    for i, (lv, tile) in enumerate(zip(levels, tiles)):
        rules = LevelRules.of(device, i, expr, vector_axis)
        q = traffic(expr, tile, rules, accumulator_parent(expr, tiles, i, vector_axis))
        if i == len(levels) - 1:
            q += (copies + short_row_bytes(expr, tile, rules, device) - repeated_fill_bytes(expr, tile, rules)
                  - halo_bytes(expr, tile, rules, vector_axis, predicated))
        below = unit_bandwidth(levels[i + 1], units) if i + 1 < len(levels) else source_bandwidth(expr, device, units)
        if i == 0:
            below *= REGISTER_LOAD_SHARE
        cold = 0.0
        if i == len(levels) - 1 and prepacked and device.constants_level:
            # a model's weights that do not stay in the caches between calls come from constants_level
            cold = sum(tensor_footprint(t, tile, rules, moved=True) for t in expr.inputs
                       if t.name in prepacked) * total
        mem[lv.name] = (q - cold) / (below * 1e9)
        if cold:
            mem[lv.name] += cold / (unit_bandwidth(device.level(device.constants_level), units) * 1e9)
        traf[lv.name] = q
    # inputs the kernel reads from a copy made per top tile: packed ones, and every producer stage the plan
    # does not inline (padding, and group_rep, which is never inlined: charged before as strided streams,
    # 287 us of untracked lines for a plan of a grouped conv on 14x14x256 in 64 groups that ran 71.5 us)
    copied = tuple(n for n in expr.staged if n not in inlined)
    staged = tuple(packed) + copied
    worst = (max([per_tile] + [m / spatial for m in mem.values()]) + tile_overhead(device)
             + untracked_stream_seconds(expr, tiles[-1], device, staged, tiles[-2] if len(tiles) > 1 else None)
             * total / spatial
             + transpose_seconds(expr, tiles[-1], device, prepacked) * total / spatial
             + replicate_seconds(expr, tiles[-1], device) * total / spatial
             + stage_copy_seconds(expr, tiles[-1], device, [n for n in copied if n not in packed]) * total / spatial
             + workspace_seconds(expr, tiles, device, vector_axis) / spatial
             + interleaved_run_seconds(expr, tiles, device, vector_axis, staged) / spatial
             + sliced_row_seconds(expr, tiles, device, vector_axis, packed) / spatial
             + fold_seconds(expr, tiles[-1], tiles[0], device, vector_axis)
             + accumulator_seconds(expr, tiles, device, vector_axis) / spatial)
    seconds = waves * worst + launch_seconds(device, units) + false_sharing_seconds(expr, tiles[-1], device, units)
    if root_copies:
        # a parallel loop of its own before the kernel's, not under its compute: the prime matmul 127 x 251
        # x 509 padded along m (A copied whole) ranked first, and the plan predicating m ran 1.11-1.34x faster
        seconds += root_copies / (source_bandwidth(expr, device) * 1e9) + launch_seconds(device, device.units.count)
    if units > 1:
        seconds += imbalance_seconds(expr, seconds, worst, waves, device)
    return Estimate(seconds=seconds, compute_seconds=compute_all / units,
                    memory_seconds=mem, traffic_bytes=traf, footprint_bytes=foot, tiles=spatial, units=units,
                    waves=waves)
