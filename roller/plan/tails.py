"""How a plan covers extents its tiles do not divide: whole vectors, zero padding, predicated tails.

Policy, shared by construction, the model and code generation (which executes what is decided here):

- Register tiles are whole vectors along the vector axis. An axis of at least one vector is tiled as if
  its extent were rounded up to whole vectors (36 float32 lanes -> 48); an axis shorter than a vector is
  one short vector of its own extent (the code vectorizes the whole loop; the model charges a full vector).
- Where the top tile overhangs an axis, the iteration space is either *padded* (the kernel runs over
  whole tiles, on zero-padded copies of the inputs that the axis indexes, and a crop copies the output
  back) or *predicated* (bounds checks; lowering splits the last tiles off so the rest stays vectorized,
  and the partial last vector off as a narrower vector where the loops above it split too,
  ``vector_tail_split``: a vector loop that keeps a bound runs scalar).
- Padding applies to an axis of one original loop (a fused axis spans several, and no TVM primitive pads
  it), whose zero padding leaves the result unchanged (always for a spatial axis; for a reduced axis only
  a sum of products with a factor indexed by it, ``Expr.zero_pad_axes``), and not when an input is read
  once per point (a row sum's input: the padded copy would move as many bytes as the kernel).
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from roller.plan.expr import REDUCE, Expr, TensorAccess
from roller.plan.rtile import ceil_div, clamp_tiles, exact_axes, round_up, tile_counts


def tiling_extents(expr: Expr, vector_axis: str | None, lanes: int) -> dict[str, int]:
    """The extent each axis is tiled over: the vector axis rounded up to whole vectors when it is at
    least one vector long (and may overhang, ``rtile.exact_axes``), every other axis its own extent."""
    out = {a.name: a.extent for a in expr.axes}
    if (vector_axis is not None and lanes > 1 and out[vector_axis] >= lanes
            and vector_axis not in exact_axes(expr)):
        out[vector_axis] = round_up(out[vector_axis], lanes)
    return out


def streams_input(expr: Expr) -> bool:
    """Whether some input is indexed by every axis (read once per point: a row sum's, an elementwise
    operand): such an input's padded copy would double the kernel's traffic."""
    every = {a.name for a in expr.axes}
    return any(t.axes >= every for t in expr.inputs)


def can_pad(expr: Expr, axis: str) -> bool:
    """Whether zero padding along ``axis`` is possible and leaves the result unchanged (module docstring)."""
    a = expr.axis(axis)
    if len(a.parts) > 1 or streams_input(expr) or is_window(expr.output):
        return False  # is_window(output): pad_einsum needs the output written at plain indices
    return a.kind != REDUCE or axis in expr.zero_pad_axes


def clamped_top(expr: Expr, tiles: Sequence[Mapping[str, int]], axis: str, vector_axis: str | None,
                lanes: int) -> int:
    """The top tile along ``axis`` as code generation runs it: clamped (``rtile.clamp_tiles``) to the
    tiling extent, so a tile larger than a short extent shrinks to it, except that the vector axis keeps
    whole vectors (36 lanes tiled by 48 stay 48: a vector loop of a width not a whole vector runs far slower
    in TVM; docs/design-notes.md#tails-clamped_top)."""
    extent = tiling_extents(expr, vector_axis, lanes)[axis]
    return clamp_tiles(extent, [t[axis] for t in tiles])[-1]


def overhangs(expr: Expr, tiles: Sequence[Mapping[str, int]], vector_axis: str | None = None,
              lanes: int = 1) -> tuple[str, ...]:
    """Axes whose (clamped) tiles do not divide the extent: their last tile runs past it."""
    return tuple(a.name for a in expr.axes
                 if round_up(a.extent, clamped_top(expr, tiles, a.name, vector_axis, lanes)) != a.extent)


def predicated_axes(expr: Expr, tiles: Sequence[Mapping[str, int]], vector_axis: str | None, lanes: int,
                    padded: tuple[str, ...]) -> tuple[str, ...]:
    """The overhanging axes a plan leaves to bounds checks: those it does not pad."""
    return tuple(a for a in overhangs(expr, tiles, vector_axis, lanes) if a not in padded)


def tail_options(expr: Expr, tiles: Sequence[Mapping[str, int]], vector_axis: str | None = None,
                 lanes: int = 1) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """The ways a plan may cover its overhanging axes, as (padded axes, predicated axes): predicated;
    the axes a bound would slow down padded, the others predicated; last, everything padded when
    ``can_pad`` allows every overhanging axis.
    Construction makes a plan of each; the model charges each its copies and its tails."""
    over = overhangs(expr, tiles, vector_axis, lanes)
    if not over:
        return [((), ())]
    options = [((), over)]
    # Some axes padded, the others predicated: the vector axis (its partial vector costs pieces or scalar),
    # and with it the axes whose register tile overhangs (a bound inside the unrolled register tile
    # branches per row). Which is faster depends on the copies padding makes (a window's padded axis
    # re-indexes the window per tile; docs/design-notes.md#tails-tail_options).
    ext = tiling_extents(expr, vector_axis, lanes)
    inner = tuple(a for a in over if a == vector_axis
                  or ext[a] % clamp_tiles(ext[a], [t[a] for t in tiles])[0])
    for part in dict.fromkeys(((vector_axis,) if vector_axis in over else (), inner)):
        if part and len(part) < len(over) and all(can_pad(expr, a) for a in part):
            options.append((part, tuple(a for a in over if a not in part)))
    if all(can_pad(expr, a) for a in over):
        options.append((over, ()))
    if vector_axis in over and can_pad(expr, vector_axis) and scalar_tail_tiles(expr, tiles, vector_axis, lanes):
        options = [o for o in options if vector_axis not in o[1]]
    return options


def scalar_tail_tiles(expr: Expr, tiles: Sequence[Mapping[str, int]], vector_axis: str | None, lanes: int) -> bool:
    """Whether predicating the plan's spatial vector axis, which ends in a partial vector, would leave a
    reduction's tail tiles in scalar code: the axis's bound is not split off (:func:`vector_tail_split`), and
    with the register tile not holding the whole reduction, the tiles the bound crosses run a scalar variant of
    the register tile (a 1x1 convolution 13x13x512 -> 1000, SqueezeNet's classifier, whose 1000 channels end in
    half a vector on AVX-512: 312 scalar multiply-adds in its code beside 110 vector ones; the main loop keeps
    its accumulators in registers). It ran 927 us predicated, 519 padded, where the model, which charges only
    the partial vector's lanes, had 424 and 421 us; construction pads such an axis (``tail_options``). Whole
    vectors are left alone: a GEMV's 1000 outputs in 8-lane vectors ran 72 us predicated and 296 padded (its
    weight then copied per call)."""
    if vector_axis is None or expr.axis(vector_axis).kind == REDUCE or not expr.axis(vector_axis).extent % lanes:
        return False
    return (any(tiles[0][a.name] < a.extent for a in expr.reduce_axes)
            and not vector_tail_split(expr, tiles, vector_axis, lanes))


def _grid_loops(expr: Expr, tiles: Sequence[Mapping[str, int]], vector_axis: str | None,
                lanes: int) -> dict[str, tuple[int, bool]]:
    """Per spatial axis, as ``codegen.cpu`` splits it: (its top tiles, whether a tile loop of it runs
    between its grid loop and its register loop)."""
    ext = tiling_extents(expr, vector_axis, lanes)
    out = {}
    for a in expr.axes:
        if a.kind != REDUCE:
            sizes = clamp_tiles(ext[a.name], [t[a.name] for t in tiles])
            out[a.name] = (ceil_div(a.extent, sizes[-1]), any(hi != lo for lo, hi in zip(sizes, sizes[1:])))
    return out


def split_axes(expr: Expr, top: Mapping[str, int]) -> list[str]:
    """The spatial axes the parallel grid splits: those with more than one top tile of ``top``."""
    return [a.name for a in expr.axes if a.kind != REDUCE and ceil_div(a.extent, top[a.name]) > 1]


def vector_tail_split(expr: Expr, tiles: Sequence[Mapping[str, int]], vector_axis: str | None,
                      lanes: int) -> bool:
    """Whether code generation would split the partial last vector of a predicated spatial vector axis off as a
    vector loop of its own (narrower, constant lanes), asked of tiles before there is a plan (construction's
    ``inline_options``); the model and code generation ask the plan (``choices.vector_tail_split``). It can once every loop above that vector loop is
    split at its last iteration: the axis has no grid loop (one top tile covers it), or its grid loop is
    held out of the fused parallel loop (another spatial axis has top tiles too), or it is the parallel
    loop itself with no loop of the axis between it and the register tile (``codegen.cpu``)."""
    if vector_axis is None or expr.axis(vector_axis).kind == REDUCE:
        return False
    grid = _grid_loops(expr, tiles, vector_axis, lanes)
    count, inner = grid[vector_axis]
    return count <= 1 or any(c > 1 for n, (c, _) in grid.items() if n != vector_axis) or not inner


def tail_compute_factor(expr: Expr, vector_axis: str | None, lanes: int, predicated: tuple[str, ...],
                        split: bool) -> float:
    """How much more the vector work costs than in whole vectors for a predicated vector axis's tail.

    Split off as a vector loop of its own (``split``: the plan's ``choices.vector_tail_split``), the partial
    vector runs as the power-of-two vectors its lanes make up (10 lanes: an 8- and a 2-lane piece, loaded
    apart and joined), one whole vector's work each. Otherwise its lanes run scalar: lowering splits the
    overhanging iterations off every tiled loop of the axis, and in the unrolled register tile the whole
    vectors of the last tile keep constant, true bounds; only the partial vector stays scalar, not the whole
    last top tile (docs/design-notes.md#tails-tail_compute_factor)."""
    if vector_axis is None or vector_axis not in predicated:
        return 1.0
    extent = expr.axis(vector_axis).extent
    tail = extent % lanes
    if split:
        return 1.0 + (bin(tail).count("1") - 1) / ceil_div(extent, lanes) if tail else 1.0
    return 1.0 + tail / extent * (lanes - 1)


def partial_sums(expr: Expr, reg: Mapping[str, int], vector_axis: str | None, lanes: int) -> bool:
    """Whether a reduced vector axis accumulates vectors of partial sums (rfactor; one horizontal sum
    per output element at the end). It needs a register tile of whole vectors along the axis and
    something to accumulate across (a second vector in the tile, or a reduce loop above it); otherwise
    the reduction runs scalar."""
    if vector_axis is None or lanes <= 1 or expr.axis(vector_axis).kind != REDUCE:
        return False
    t = reg[vector_axis]
    if t % lanes or t > tiling_extents(expr, vector_axis, lanes)[vector_axis]:
        return False
    return t > lanes or any(ceil_div(a.extent, reg[a.name]) > 1 for a in expr.reduce_axes)


# Bytes under which the host lowering of TVM (0.27) makes an accumulator tile a stack array (its
# kMaxStackAlloca; default-scope buffers only, see codegen.cpu.ACCUMULATOR_SCOPE); from this size on the
# tile goes through TVMBackendAllocWorkspace each time its loop enters it.
STACK_ARRAY_BYTES = 1024


def stack_array(expr: Expr, tile: Mapping[str, int]) -> bool:
    """Whether the output tile ``tile`` (spatial extents) is small enough to accumulate in a stack array."""
    return math.prod(expr.output.region(tile)) * expr.output.elem_bytes < STACK_ARRAY_BYTES


def accumulator_tile(expr: Expr, tiles: Sequence[Mapping[str, int]], vector_axis: str | None,
                     lanes: int) -> dict[str, int] | None:
    """The spatial tile of the output that code generation accumulates in one buffer (its cache_write,
    attached above the first reduce loop that iterates more than once), or None without a reduction.

    Code generation orders the loops grid, then per level from the top the loops over the level below
    (spatial, then reduce), then the register tile's own loops; loops of one iteration are left out. So
    the buffer holds the top tile when the reduction spans several top tiles, else the tile of the level
    below the first level whose reduce loop iterates, else the register tile. (A reduced vector axis's
    partial sums have a buffer of their own, not described here.)"""
    reduce = [a.name for a in expr.axes if a.kind == REDUCE]
    if not reduce:
        return None
    ext = tiling_extents(expr, vector_axis, lanes)
    sizes = {a.name: clamp_tiles(ext[a.name], [t[a.name] for t in tiles]) for a in expr.axes}
    top = len(tiles) - 1
    if any(ceil_div(ext[a], sizes[a][top]) > 1 for a in reduce):
        level = top
    else:
        level = next((l - 1 for l in range(top, 0, -1) if any(sizes[a][l] > sizes[a][l - 1] for a in reduce)), 0)
    return {a.name: sizes[a.name][level] for a in expr.axes if a.kind != REDUCE}


def window_values(expr: Expr, t: TensorAccess, reg: Mapping[str, int], vector_axis: str | None,
                  lanes: int) -> tuple[frozenset[str], int]:
    """(the reduce axes, the distinct values) of an input the register tile ``reg`` reads through a window
    it slides along: a spatial and a reduce axis of the tile index one dimension of the input (a
    convolution's ``w * stride + s``), so the same element serves several (w, s) pairs. Fully unrolled,
    LLVM loads each distinct value (a vector along the vector axis, else a broadcast element) once and
    keeps it in a register from its first use to its last. ``(frozenset(), 0)`` for other inputs."""
    shared = {a for dim in t.index if len(dim) > 1 for a, _ in dim if reg[a] > 1}
    reduced = frozenset(a for a in shared if expr.axis(a).kind == REDUCE)
    if not reduced or len(shared) == len(reduced):
        return frozenset(), 0
    region = t.region(dict(reg))
    vectors = vector_axis in t.innermost_axes() and region
    return reduced, (math.prod(region[:-1]) * ceil_div(region[-1], lanes)) if vectors else math.prod(region)


def accumulator_vectors(expr: Expr, reg: Mapping[str, int], vector_axis: str | None, lanes: int) -> int:
    """Vector registers the register tile's accumulators take."""
    return math.prod(ceil_div(reg[a], lanes) if a == vector_axis else reg[a] for a in expr.output.axes)


def spills_window(expr: Expr, reg: Mapping[str, int], vector_axis: str | None, lanes: int, registers: int) -> bool:
    """Whether a window's distinct values (:func:`window_values`) and the accumulators together exceed the
    ``registers`` of the vector register file: unrolled, such a register tile spills."""
    acc = accumulator_vectors(expr, reg, vector_axis, lanes)
    values = [window_values(expr, t, reg, vector_axis, lanes)[1] for t in expr.inputs]
    return any(v and acc + v > registers for v in values)


def rolled_reduce_axes(expr: Expr, reg: Mapping[str, int], vector_axis: str | None, lanes: int,
                       registers: int) -> frozenset[str]:
    """Reduce axes whose register-tile loop code generation keeps rolled instead of unrolling: those of a
    window whose distinct values do not fit beside the accumulators (:func:`window_values`; LLVM would
    spill them; docs/design-notes.md#tails-rolled_reduce_axes). Rolled,
    one step holds only its own operands. ``reg`` is the register tile as code generation runs it
    (clamped); ``registers`` the vector register file's size: where every distinct value fits beside the
    accumulators, nothing spills (a stride-2 3x3 conv's 15 broadcasts + 14 accumulators did not) and
    unrolled stays as fast. Construction no longer plans such tiles (:func:`spills_window`): a rolled loop
    of a few steps LLVM unrolls again; this covers plans edited by hand."""
    acc = accumulator_vectors(expr, reg, vector_axis, lanes)
    rolled: set[str] = set()
    for t in expr.inputs:
        reduced, values = window_values(expr, t, reg, vector_axis, lanes)
        if values and acc + values > registers:
            rolled |= reduced
    return frozenset(rolled)


def is_window(t: TensorAccess) -> bool:
    """Whether a tensor is read through a sliding window (a dimension indexed by several axes, or with a
    stride): padding it copies the window per top tile (the re-indexed gather), never the whole tensor."""
    return any(len(dim) != 1 or dim[0][1] != 1 for dim in t.index)


def copied_per_tile(t: TensorAccess, packed: tuple[str, ...]) -> bool:
    """Whether an input's padded copy is made per top tile (packed inputs and windows) rather than once
    for the whole tensor at root (a plain input that many top tiles re-read)."""
    return t.name in packed or is_window(t)


def root_copy_bytes(expr: Expr, padded: tuple[str, ...], packed: tuple[str, ...],
                    prepacked: tuple[str, ...] = ()) -> int:
    """Bytes of the padded copies made once, whole, at root (read and written; part of
    :func:`copy_bytes`): inputs padded but neither packed nor windows (:func:`copied_per_tile`)."""
    return sum(2 * math.prod(t.shape) * t.elem_bytes for t in expr.inputs
               if t.name not in prepacked and not t.packed_order and t.axes & set(padded)
               and not copied_per_tile(t, packed))


def copy_bytes(expr: Expr, top: Mapping[str, int], padded: tuple[str, ...], packed: tuple[str, ...],
               inlined: tuple[str, ...] = (), prepacked: tuple[str, ...] = ()) -> int:
    """Bytes the plan's copies move for the whole operator (read and written once each):

    - an input packed in a transposed layout: its region, once per top tile (padded or not);
    - a padded window: re-indexed first, so one element per point of its axes (R x S times the window
      for a convolution), once per top tile;
    - another padded input: once per top tile when packed, else once, whole, at root;
    - a padded output: once more (the crop);
    - an input a producer stage of the function writes (``Expr.staged``, e.g. a convolution's own zero
      padding): its region, once per top tile, besides any copy above; nothing where the plan inlines
      that stage (``inlined``: the kernel reads the tensor itself, behind a bounds check). A stage that
      repeats what it reads (``Expr.repeats``: a grouped convolution's group_rep) is charged its read only,
      1/repeat of its region: its writes run at an element rate (``model.replicate_seconds``).

    A packed input's plain copy (no padding, no transposition) is not charged the first time: the model
    does not credit what packing saves either (conflict-free dense rows), and charging one side only
    ranked packed plans last while they ran fastest (matmul 1024^3). Copies of the same region again (top
    tiles along an axis that does not index the input) are charged. Inputs that arrive packed
    (``prepacked``) cost no copy."""
    tiles = tile_counts(expr, top)[0]
    total = 0
    for t in expr.inputs:
        if t.name in prepacked:
            continue  # packed once, at compile time (roller.plan.prepack): the kernel copies nothing of it
        region = 2 * math.prod(t.region(top)) * t.elem_bytes  # one tile's region, read and written
        if t.name in packed and not t.packed_order and not t.axes & set(padded):
            # a plain pack is free the first time (see the docstring), not when the top tiles
            # along an axis that does not index the input copy the same region again
            distinct = math.prod(ceil_div(expr.axis(a).extent, top[a]) for a in t.axes)
            total += region * (tiles - distinct)
        if t.name in expr.staged and t.name not in inlined:  # the function's own producer stage, per top tile
            repeat = expr.repeat(t.name)
            # a repeating stage reads 1/repeat of what it writes, and its writes cost their element rate
            # instead (model.replicate_seconds)
            total += (region if repeat == 1 else region // 2 // repeat) * tiles
        if t.packed_order:
            total += region * tiles
        elif not t.axes & set(padded):
            continue
        elif is_window(t):
            total += 2 * math.prod(min(top[a], expr.axis(a).extent) for a in t.axes) * t.elem_bytes * tiles
        elif copied_per_tile(t, packed):
            total += region * tiles
        # else once, whole, at root: root_copy_bytes
    total += root_copy_bytes(expr, padded, packed, prepacked)
    if padded:
        total += 2 * math.prod(expr.output.shape) * expr.output.elem_bytes
    return total


def register_transposes(expr: Expr, top: Mapping[str, int], lanes: int,
                        prepacked: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The transposed packs (inputs the plan stores in another layout and that do not arrive packed) that
    code generation copies in ``lanes x lanes`` register blocks (``targets/cpu/transpose.py``): the one rule,
    for construction (``RProgram.register_transposes``) and the model alike. A pack goes in registers where
    it splits into whole blocks: its run in the new layout and the source's contiguous run both whole
    vectors, in tiles that divide the tensor (an overhanging tile's copy is predicated, and scattered)."""
    out = []
    if lanes < 2 or lanes & (lanes - 1):
        return ()
    for t in expr.inputs:
        if not t.packed_order or t.name in prepacked:
            continue
        if any(len(dim) != 1 for dim in t.index):
            # a dimension indexed by no axis (a reshape's leading 1) or by several (768 = 12 heads x 64):
            # the copy has no loop of its own per dimension to block (it was a BuildError, and the function
            # went to TVM's generic schedule: BERT's K transpose in the quantized encoder)
            continue
        region = t.region(top)
        dims = (len(region) - 1, t.packed_order.index(len(region) - 1))  # the new run, the source's run

        def run(d: int) -> int:
            """The run's length in the buffer: a fused axis's dimension unfolds into its parts, the last
            one innermost (a [12, 12] pair fused into 144 runs 12 elements)."""
            dim = t.index[d]
            parts = expr.axis(dim[0][0]).parts if len(dim) == 1 else ()
            return parts[-1][1] if len(parts) > 1 else region[d]
        if all(region[d] % lanes == 0 and run(d) % lanes == 0 and t.shape[d] % region[d] == 0 for d in dims):
            out.append(t.name)
    return tuple(out)


def transposed_elements(expr: Expr, top: Mapping[str, int], in_registers: tuple[str, ...],
                        prepacked: tuple[str, ...] = ()) -> tuple[int, int]:
    """Elements one top tile copies into transposed packs (inputs the plan stores in another layout and
    that do not arrive packed): (scattered, in registers), the packs in ``in_registers`` (the plan's
    ``register_transposes``) going in registers."""
    scattered = shuffled = 0
    for t in expr.inputs:
        if not t.packed_order or t.name in prepacked:
            continue
        if t.name in in_registers:
            shuffled += math.prod(t.region(top))
        else:
            scattered += math.prod(t.region(top))
    return scattered, shuffled


def every_tile_reads_padding(expr: Expr, t, reg: Mapping[str, int]) -> bool:
    """Whether every register tile ``reg`` reads some of input ``t``'s zero padding (``Expr.pad_widths``): along
    one padded dimension no position of the tile keeps its window (the register tile's own reduce extents)
    inside the tensor. Code generation then has no register tile to run without the bounds checks
    (``targets.cpu.inline_pad``) and every load of the tile is checked, dearer than the copy
    (docs/design-notes.md#tails-every_tile_reads_padding). False where the widths are unknown."""
    widths = dict(expr.pad_widths).get(t.name)
    if not widths:
        return False
    kinds = {a.name: a for a in expr.axes}
    for dim, size, (before, after) in zip(t.index, t.shape, widths):
        if not (before or after):
            continue
        spatial = [(a, c) for a, c in dim if kinds[a].kind != REDUCE]
        if len(spatial) != 1 or any(c < 0 for _, c in dim):
            continue
        (axis, coef), = spatial
        step = min(reg[axis], kinds[axis].extent)
        window = sum(c * (min(reg[a], kinds[a].extent) - 1) for a, c in dim if kinds[a].kind == REDUCE)
        inside = any(coef * p >= before and coef * (p + step - 1) + window <= size - after - 1
                     for p in range(0, kinds[axis].extent - step + 1, step))
        if not inside:
            return True
    return False


def inline_options(expr: Expr, tiles: Sequence[Mapping[str, int]], vector_axis: str | None, lanes: int,
                   padded: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The ways a plan may run the function's zero-padding stages (``Expr.inlinable``): copied per top tile
    (the default, first), or inlined into the main block, which then reads the tensor itself behind a
    bounds check per load (``model.inline_check_seconds``). The copy moves the whole window again; the
    check slows every load; which wins depends on the kernel. Not where the plan pads an axis of that input
    (its padded copy re-indexes the stage's output), nor where the register tile holds several vectors of
    a predicated vector axis: the partial vector stays inside the unrolled register tile, and with the
    window's bounds there its lanes load one by one, unless code generation splits that vector off as a
    loop of its own (``vector_tail_split``). Nor where the plan predicates an axis of the window
    besides the vector axis: lowering then splits the loops on the window's bounds too, and the copies
    multiply (compiling takes several times longer). Measurements: docs/design-notes.md#tails-inline_options."""
    stages = tuple(t.name for t in expr.inputs if t.name in expr.inlinable and not t.axes & set(padded)
                   and not (vector_axis not in t.innermost_axes() and every_tile_reads_padding(expr, t, tiles[0])))
    if not stages:
        return [()]
    predicated = predicated_axes(expr, tiles, vector_axis, lanes, padded)
    windowed = {a for t in expr.inputs if t.name in stages for a in t.axes}
    if set(predicated) & windowed - {vector_axis}:
        return [()]
    if vector_axis in predicated and not vector_tail_split(expr, tiles, vector_axis, lanes):
        extent = tiling_extents(expr, vector_axis, lanes)[vector_axis]
        if clamp_tiles(extent, [t[vector_axis] for t in tiles])[0] > lanes:
            return [()]
    return [(), stages]

