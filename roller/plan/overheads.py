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
from roller.plan.tails import accumulator_tile, split_axes, stack_array, transposed_elements


DEFAULT_CLOCK_GHZ = 2.0  # for a spec without clock_ghz


def cycle_seconds(device: Device) -> float:
    """Seconds one cycle of a compute unit takes (the spec's clock)."""
    return 1.0 / ((device.units.clock_ghz or DEFAULT_CLOCK_GHZ) * 1e9)


# device.model.tile_overhead_cycles (the spec's model: section; docs/cost-constants.md): fixed cost of one top tile
# (loop-nest set-up, the pipeline's ramp at its edges)


def tile_overhead(device: Device) -> float:
    """Seconds one top tile costs beyond its compute and traffic: nothing for the model's ranking of big
    tiles, but it stops a memory-bound operator from tying with a plan of one-vector tiles."""
    return device.model.tile_overhead_cycles * cycle_seconds(device)


# device.model.parallel_launch_cycles (the spec's model: section; docs/cost-constants.md): Fixed cost of running a
# kernel over several units: TVM's thread pool wakes its workers and joins them on every call.


def launch_seconds(device: Device, units: int) -> float:
    """Seconds a kernel spends starting and joining its parallel loop (none on one unit)."""
    return device.model.parallel_launch_cycles * cycle_seconds(device) if units > 1 else 0.0


# device.model.false_sharing_seconds (the spec's model: section; docs/cost-constants.md): Seconds a cache line
# written by two units costs (it moves between their caches): where the parallel grid splits the output's contiguous
# dimension between units at a boundary inside a line.


def false_sharing_seconds(expr: Expr, top: Mapping[str, int], device: Device, units: int) -> float:
    """Seconds lost to output lines two units write (device.model.false_sharing_seconds each): where the only axis the
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
    return shared * device.model.false_sharing_seconds


# device.model.transpose_cycles (the spec's model: section; docs/cost-constants.md): Cycles one element of a
# transposed pack costs (tails.transposed_elements), where it is scattered: the copy reads its source in runs of a
# vector and writes one scalar per element (codegen/cpu._block_transpose), and it runs before the tile's compute,
# not under it.


def transpose_seconds(expr: Expr, top: Mapping[str, int], device: Device, prepacked: tuple[str, ...] = (),
                      in_registers: tuple[str, ...] = ()) -> float:
    """Seconds the transposed packs of one top tile (one step of its reduction) take, serial with its
    compute (none for inputs that arrive packed; ``in_registers``: the plan's ``register_transposes``)."""
    scattered, shuffled = transposed_elements(expr, top, in_registers, prepacked)
    return (scattered * device.model.transpose_cycles + shuffled * device.model.register_transpose_cycles) * cycle_seconds(device)


# device.model.fold_cycles (the spec's model: section; docs/cost-constants.md): Cycles per lane of partial sums
# folded into its output (a reduced vector axis): the write-back adds the lanes of every output element one by one.


def fold_seconds(expr: Expr, top: Mapping[str, int], device: Device, partial_sums: bool) -> float:
    """Seconds the write-back of one top tile spends summing the lanes of partial sums (0 without them:
    ``partial_sums`` is the plan's ``RProgram.partial_sums``)."""
    if not partial_sums:
        return 0.0
    outputs = math.prod(expr.output.region(top))
    return outputs * compute_lanes(expr, device) * device.model.fold_cycles * cycle_seconds(device)


# device.model.inline_check_cycles (the spec's model: section; docs/cost-constants.md): Cycles each element load of
# an input whose zero-padding stage the plan inlines costs (RProgram.inlined): the load sits behind a bounds check
# on its window position.


def inline_check_seconds(expr: Expr, tiles: Sequence[Mapping[str, int]], device: Device,
                         vector_axis: str | None, inlined: tuple[str, ...]) -> float:
    """Seconds the bounds checks of the inlined padding stages' loads take, over the whole operator (all
    units): one check per element loaded at the register level (a broadcast); a tensor read in vectors
    along the vector axis is not charged (see device.model.inline_check_cycles)."""
    if not inlined:
        return 0.0
    rules = LevelRules.of(device, 0, expr, vector_axis)
    total = tile_counts(expr, tiles[0])[0]
    loads = sum(tensor_footprint(t, tiles[0], rules, moved=True) for t in expr.inputs
                if t.name in inlined and vector_axis not in t.innermost_axes())
    return loads * total / rules.level.transaction_bytes * device.model.inline_check_cycles * cycle_seconds(device)


def epilogue_seconds(expr: Expr, device: Device) -> float:
    """Seconds the fused elementwise epilogue's arithmetic takes over the whole operator (all units): its
    operations per output point (``Expr.epilogue_ops``), each a vector operation on a float32 vector's lanes
    at device.model.epilogue_op_cycles. A QDQ convolution's requantization took longer than its 64-deep
    int8 reduction on AMX, which the model had not charged (predicted 39 us, ran 213)."""
    if not expr.epilogue_ops:
        return 0.0
    vectors = math.prod(expr.output.shape) / device.units.lanes("float32")
    return vectors * expr.epilogue_ops * device.model.epilogue_op_cycles * cycle_seconds(device)


def short_row_bytes(expr: Expr, top: Mapping[str, int], rules: LevelRules, device: Device) -> float:
    """Bytes the top level's fill wastes on short strided rows: an input whose top tile takes part of each
    of its rows (a 16-channel slice of a 96-channel window: 64 B of every 384) streams at the calibrated
    efficiency of such rows (``Device.run_efficiency``), charged as the extra bytes that costs.

    Only the bytes that come from beyond the units' private caches are charged (1 - resident_share):
    the efficiency is the memory's, and lines the L2s still hold come whole
    (docs/design-notes.md#overheads-short_row_bytes)."""
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


# device.model.untracked_line_cycles (the spec's model: section; docs/cost-constants.md): Cycles a line of an input
# costs, serial with the tile's compute, where the kernel reads it on a stream the hardware prefetcher cannot
# follow: the top tile reads more strided rows, each on its own page, than the prefetcher tracks
# (``units.prefetch_streams``), in runs too short (under device.model.prefetch_run_bytes) for it to pick a stream up within one,
# so the loads wait on their misses.


PAGE_BYTES = 4096


def _level_loop_order(expr: Expr) -> list:
    """The loops code generation runs over the tiles of the level below within one tile, outer to inner
    (codegen/cpu): the spatial axes in axis order, then the reduce axes."""
    return [a for a in expr.axes if a.kind != REDUCE] + [a for a in expr.axes if a.kind == REDUCE]


def untracked_stream_seconds(expr: Expr, top: Mapping[str, int], device: Device,
                             staged: Sequence[str] = (), step: Mapping[str, int] | None = None) -> float:
    """Seconds one top tile waits on the lines of inputs read on more strided streams than the prefetcher
    follows (see device.model.untracked_line_cycles); inputs copied per top tile (``staged``) stream row by row.
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
        if run * t.elem_bytes >= device.model.prefetch_run_bytes:
            continue
        streams = math.prod(r for d, r in enumerate(region)
                            if math.prod(t.shape[d + 1:]) * t.elem_bytes >= PAGE_BYTES)
        if streams > tracked:
            moved = tensor_footprint(t, top, rules, moved=True) / rules.level.transaction_bytes
            lines += moved * (1.0 - tracked / streams)
    return lines * device.model.untracked_line_cycles * cycle_seconds(device)


# device.model.interleaved_line_cycles (the spec's model: section; docs/cost-constants.md): Cycles a line of a
# broadcast operand costs where the register tile's loads of it read runs that interleave in one page.


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
    runs side by side in one page (see device.model.interleaved_line_cycles): of the lines each such input moves into the
    L1 tiles, the share (1 - 1/k) where k runs share a page; whole rows shorter than
    device.model.interleaved_min_run_lines lines side by side are one dense block the loads sweep, and cost nothing. A
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
        if whole and math.prod(run) * t.elem_bytes < device.model.interleaved_min_run_lines * line:
            continue  # short whole rows side by side: the loads sweep one dense block
        # the register tile's loads lie side by side along the nearest dimension outside the run (not
        # the overlapping rows of a sliding window, which were not measured)
        side, reg = outer - 1, t.region(tiles[0])
        if side < 0 or reg[side] == 1 or sum(1 for a, _ in t.index[side] if expr.axis(a).extent > 1) != 1:
            continue
        k = min(reg[side], PAGE_BYTES / (math.prod(shape[side + 1:]) * t.elem_bytes))
        if k > 1:
            lines += tensor_footprint(t, tiles[1], rules, moved=True) * total / line * (1.0 - 1.0 / k)
    return lines * device.model.interleaved_line_cycles * cycle_seconds(device)


# device.model.workspace_tile_cycles (the spec's model: section; docs/cost-constants.md): Cycles an accumulator tile
# of tails.STACK_ARRAY_BYTES or more costs each time its loop enters it: TVM allocates it through
# TVMBackendAllocWorkspace (and frees it), zeroes it with memset and the write-back reads it back from memory, where
# a smaller tile is a stack array held in registers.


def workspace_seconds(expr: Expr, tiles: Sequence[Mapping[str, int]], device: Device,
                      vector_axis: str | None) -> float:
    """Seconds the whole operator (all units) spends on accumulator tiles too large for a stack array
    (see device.model.workspace_tile_cycles); 0 when they fit or there is no reduction."""
    acc = accumulator_tile(expr, tiles, vector_axis, compute_lanes(expr, device))
    if acc is None or stack_array(expr, acc):
        return 0.0
    count = math.prod(ceil_div(a.extent, acc[a.name]) for a in expr.axes if a.kind != REDUCE)
    return count * device.model.workspace_tile_cycles * cycle_seconds(device)


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
    step axis and a reduction axis, a pool's or convolution's rows) between neighbouring tiles: a 3x3 pool
    of stride 2 in one-row tiles reads two new input rows a tile, not three
    (docs/design-notes.md#overheads-halo_bytes). Inputs the step axis does not
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


# device.model.sliced_line_cycles (the spec's model: section; docs/cost-constants.md): Cycles a line costs where the
# tile below the top (the L1 tile) reads a slice of an input's rows along the vector axis that the top tile holds
# more of: the kernel walks the same pixels once per slice, each time in runs of a line or two at the pixel stride,
# and the loads wait on more of their fills from L2 than in whole runs.


def sliced_row_seconds(expr: Expr, tiles: Sequence[Mapping[str, int]], device: Device, vector_axis: str | None,
                       packed: Sequence[str] = ()) -> float:
    """Seconds the whole operator loses to L1 tiles that read slices of an input's rows (see
    device.model.sliced_line_cycles): inputs whose contiguous dimension is the (spatial) vector axis, not packed, read
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
    return lines * device.model.sliced_line_cycles * cycle_seconds(device)


# device.model.replicate_cycles (the spec's model: section; docs/cost-constants.md): Cycles each element a repeating
# stage writes costs (Expr.repeats: a grouped convolution's group_rep, each input channel copied for the K/groups
# output channels of its group), serial with the tile's compute: it runs in vectors of runs of one broadcast load
# each (ops.LANE_RUN), before the tile's compute.


def replicate_seconds(expr: Expr, top: Mapping[str, int], device: Device) -> float:
    """Seconds the repeating stages of one top tile take to write their copies (see device.model.replicate_cycles)."""
    elements = sum(math.prod(t.region(top)) for t in expr.inputs if expr.repeat(t.name) > 1)
    return elements * device.model.replicate_cycles * cycle_seconds(device)


# device.model.stage_copy_cycles (the spec's model: section; docs/cost-constants.md): Cycles each element of a
# producer stage's copy costs (a convolution's zero padding, copied per top tile where the plan does not inline it;
# not a stage folded into a pack), serial with the tile's compute: it reads the window's rows behind the padding's
# bounds and writes the copy.


def stage_copy_seconds(expr: Expr, top: Mapping[str, int], device: Device, copied: Sequence[str]) -> float:
    """Seconds the producer stages' copies of one top tile take (see device.model.stage_copy_cycles): the inputs in
    ``copied``, staged and neither inlined nor folded into a pack."""
    lanes = compute_lanes(expr, device)
    cycles = 0.0
    for t in expr.inputs:
        if t.name in copied and expr.repeat(t.name) == 1:  # a repeating stage: replicate_seconds
            region = t.region(top)
            vector = bool(region) and region[-1] >= lanes and region[-1] % lanes == 0  # () : a scalar
            cycles += math.prod(region) * (device.model.stage_vector_copy_cycles if vector else device.model.stage_copy_cycles)
    return cycles * cycle_seconds(device)
