"""The estimate's terms beyond the paper's: what the generated code spends on copies (transposed packs,
producer stages' copies, a repeating stage's replicas), on strided and interleaved streams the prefetcher
does not follow, on rows read in short slices, on false sharing, on accumulator workspaces and on a
kernel's launch and per-tile overhead; and the bytes of the top level's fill that short rows waste or the
caches save (``roller.plan.cost.estimate`` adds them up)."""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from roller.device.spec import Device
from roller.plan.expr import REDUCE, Expr, TensorAccess
from roller.plan.residency import resident_share
from roller.plan.rtile import LevelRules, ceil_div, compute_lanes, tensor_footprint, tile_counts
from roller.plan.tails import accumulator_tile, partial_sums, split_axes, stack_array, transposed_elements


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
