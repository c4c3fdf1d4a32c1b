"""CPU code generation: an RProgram becomes TVM schedule primitives (``tvm.s_tir.Schedule``).

Loop structure for levels (reg, L1, L2) and axes i, j (spatial), k (reduce), from outer to inner::

    [i_g j_g fused, parallel]  k_g  | i_2 j_2  k_2 | i_1 j_1  k_1 | k_0  i_0 j_0(vectorized)
     grid of top tiles over cores     L1 tiles in     reg tiles in    one reg tile
     reduce top tiles (serial)        the top tile    the L1 tile     (unrolled)

Each level iterates the tiles of the level below it, spatial loops first then reduce loops, so the
accumulator of one reg tile stays in vector registers across the innermost reduce loop. The output
is accumulated in a tile buffer (``cache_write``) attached above the first reduce loop that iterates
more than once (``tails.accumulator_tile``): the reg tile itself when one L1 pass covers the reduction,
a larger tile otherwise.
Packed inputs are copied per top tile (per grid tile and reduce top tile) into a compact buffer whose
rows are padded by ``storage_pad``, in the plan's layout (``RProgram.layouts``: transposed copies).
Tile sizes larger than an extent are clamped to it first (the vector axis to whole vectors), so small
shapes waste nothing; tiles that still overhang were padded before (``padding.py``) or, where the plan
predicates them, get bounds whose last iterations lowering splits off (loop-partition hints).

When the vector axis is a reduce axis (a row sum's n, a GEMV's k), its reg loop is split so that one
vector of lanes is innermost and ``rfactor``-ed: the partial sums become a local buffer with the lanes as
a spatial axis (one vector accumulator per output element of the reg tile), updated with vector adds;
the cross-lane sum runs in the write-back, once per accumulator tile. The plan decides
(``RProgram.partial_sums``, from ``roller.plan.tails.partial_sums``); other plans keep the scalar reduction.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from roller.device.spec import Device
from roller.errors import BuildError
from roller.plan.dot import DOT_DEPTH, amx_layout, dot_axis
from roller.plan.expr import REDUCE, Expr
from roller.tir.accesses import uses_var
from roller.tir.ops import LANE_RUN
from roller.plan.rprogram import RProgram
from roller.plan.rtile import clamp_tiles, compute_lanes
from roller.plan.choices import serial_tail, vector_tail_split
from roller.plan.tails import rolled_reduce_axes, tiling_extents
from roller.targets.cpu.inline_pad import padding_sources, unswitched_padding
from roller.targets.cpu.prefetch import prefetch_prepacked
from roller.targets.cpu.amx import register_amx, with_tile_state
from roller.targets.cpu.vnni import register_vnni
from roller.tir.tirtree import path_to, with_main
from roller.targets.cpu.transpose import in_registers, mark as register_transpose
from roller.tir.schedutil import check_program as _check_program, fuse_axes as _fuse_axes
from roller.tir.schedutil import main_block as _main_block, producer_of as _producer_of, read_index as _read_index
from roller.tir.schedutil import PARTITION_HINT, split_vectors, storage_pad as _storage_pad, try_step as _try

# A register tile's loops are unrolled up to this many iterations; a longer one stays a loop. A QDQ model's
# quantized input (226 x 226 x 4 with its padding) took register tiles of 113 rows of a 4-wide vector: 113
# copies of its quantization chain compiled in 9-17 s and ran 92 us, as a loop 0.2 s and 60 us. A float
# transpose's 64 rows of 3 channels, unrolled, ran 19 us against 25 in 14-row tiles (docs/models.md,
# "Compile time").
MAX_UNROLL = 64


@dataclass
class _AxisLoops:
    """The loops one Expr axis was split into: ``grid`` then ``levels[l]`` for l = top-1 .. 0."""

    name: str
    kind: str
    sizes: tuple[int, ...]   # clamped tile size per level, reg first
    grid: object             # LoopRV over top tiles
    levels: list             # LoopRV per level, reg first: levels[l] iterates level l-1 tiles in a level-l tile


# Storage scope of the accumulator tiles (the cache_write tile, the partial sums of rfactor). TVM's host
# lowering allocates every "local" buffer through TVMBackendAllocWorkspace, whatever its size, and LLVM
# cannot keep a tile behind that call's pointer in registers; a default-scope ("global") buffer under
# tails.STACK_ARRAY_BYTES becomes a stack array, which it can (larger ones still go through the workspace,
# and the model charges them: tails.accumulator_tile names the tile;
# docs/design-notes.md#schedule-accumulator_scope).
ACCUMULATOR_SCOPE = "global"


def _loop_extent(sch, loop) -> int:
    return int(sch.get(loop).extent)


def schedule_cpu(func, expr: Expr, program: RProgram, device: Device, root_copies: frozenset[str] = frozenset(),
                 notes: list[str] | None = None):
    """Schedules ``func`` (a PrimFunc) following ``program``; returns the ``tvm.s_tir.Schedule``.

    ``root_copies`` names inputs whose producer stage (a padding copy) runs once at root instead of per
    top tile. Optional steps that did not apply are appended to ``notes`` (what the plan assumed and the
    code does not do: the report shows them).

    Raises BuildError when the program does not fit the expression, UnsupportedExpressionError
    when the function's structure is not what ``expr`` describes, and lets TVM's ScheduleError
    through for a primitive that cannot apply (the profiler reports it as a failed candidate).
    """
    import tvm

    _check_program(expr, program)
    if set(program.inlined) - set(expr.inlinable):
        raise BuildError(f"{expr.name}: the plan inlines the stages that write {sorted(program.inlined)}, but the "
                         f"function's zero-padding stages write {sorted(expr.inlinable) or 'no input'}")
    # inlined padding read by broadcasts (not in vectors along the vector axis, whose checks cost nothing
    # measurable): its register tiles inside the borders run unchecked (after scheduling, below)
    broadcast = [t.name for t in expr.inputs
                 if t.name in program.inlined and program.vector_axis not in t.innermost_axes()]
    pad_sources = padding_sources(func, broadcast) if broadcast else frozenset()
    sch = tvm.s_tir.Schedule(func)
    block = _main_block(sch, expr)
    extents = expr.extents
    nlev = len(program.tiles)
    lanes = compute_lanes(expr, device)
    notes = notes if notes is not None else []

    axis_loop = _fuse_axes(sch, block, expr)
    tiling = tiling_extents(expr, program.vector_axis, lanes)  # whole vectors along the vector axis
    # --- split every axis per level (clamped sizes). Loops of one iteration are not created: TVM would
    # still count them as reduce loops, and the accumulator's init must sit above every reduce loop.
    axes: list[_AxisLoops] = []
    for ax in expr.axes:
        sizes = clamp_tiles(tiling[ax.name], [t[ax.name] for t in program.tiles])
        factors = ([math.ceil(extents[ax.name] / sizes[-1])]
                   + [sizes[l] // sizes[l - 1] for l in range(nlev - 1, 0, -1)] + [sizes[0]])
        keep = [i for i, f in enumerate(factors) if f > 1] or [len(factors) - 1]
        if len(keep) == 1:
            made = [axis_loop[ax.name]]
        else:
            made = sch.split(axis_loop[ax.name], factors=[None] + [factors[i] for i in keep[1:]])
        slots: list = [None] * len(factors)  # grid, level top-1 .. level 0
        for i, lp in zip(keep, made):
            slots[i] = lp
        axes.append(_AxisLoops(ax.name, ax.kind, sizes, slots[0], list(reversed(slots[1:]))))
    spatial = [a for a in axes if a.kind != REDUCE]
    reduce = [a for a in axes if a.kind == REDUCE]
    vname = program.vector_axis
    vec = next((a for a in spatial if a.name == vname), None)
    # A reduce vector axis (a row sum's n) is split so that one vector of lanes is innermost; rfactor
    # below turns those lanes into vector partial sums, one vector per output element of the reg tile.
    # The plan decides (roller.plan.tails.partial_sums; the policy counts those vectors in the register file).
    rvec = next((a for a in reduce if a.name == vname), None)
    lane = None
    if program.partial_sums and rvec is None:
        raise BuildError(f"{expr.name}: the plan keeps vector partial sums, but its vector axis {vname} is not "
                         f"reduced")
    if rvec is not None and program.partial_sums:
        if rvec.sizes[0] > lanes:
            rvec.levels[0], lane = sch.split(rvec.levels[0], [None, lanes])
        else:
            rvec.levels[0], lane = None, rvec.levels[0]
        if lane is None:
            raise BuildError(f"{expr.name}: the plan keeps vector partial sums, but its register tile along {vname} "
                             f"is one element: no lane loop to rfactor")

    dot = _dot_loop(sch, expr, program, reduce, vec, lanes) if program.dot_depth > 1 else None

    def present(loops):
        return [lp for lp in loops if lp is not None]

    sgrid, rgrid = present([a.grid for a in spatial]), present([a.grid for a in reduce])
    # The plan's held grid loop (RProgram.held_grid, roller.plan.choices.held_grid): a predicated vector
    # axis's grid loop kept out of the fused parallel loop, so lowering can split its overhanging last tile off.
    held = None
    if program.held_grid is not None:
        if (vec is None or vec.name != program.held_grid or vec.name not in program.predicated or vec.grid is None
                or len(sgrid) < 2):
            raise BuildError(f"{expr.name}: the plan holds the grid loop of {program.held_grid} out of the parallel "
                             f"grid, but it is no predicated vector axis with a grid loop beside another's")
        held = vec.grid
    sgrid = [g for g in sgrid if g is not held]
    # the spatial axis whose grid loop is the whole parallel grid (not fused with another's), if one is
    solo = next((a.name for a in spatial if len(sgrid) == 1 and a.grid is sgrid[0]), None)
    order = sgrid + ([held] if held is not None else []) + rgrid
    if lane is not None:
        # Partial sums (dot-product lanes): every spatial loop first, then the whole top tile's reduction,
        # so a register tile keeps its vectors of partial sums in registers for all of it and the lanes are
        # summed once per output. Nested level by level instead, LLVM unrolls the short reduction loop above
        # the register tile and hoists the operand vectors that do not change across the next spatial loop,
        # spilling them (docs/design-notes.md#schedule-schedule_cpu).
        order += [lp for l in range(nlev - 1, 0, -1) for lp in present([a.levels[l] for a in spatial])]
        order += [lp for l in range(nlev - 1, 0, -1) for lp in present([a.levels[l] for a in reduce])]
    else:
        for l in range(nlev - 1, 0, -1):
            order += present([a.levels[l] for a in spatial]) + present([a.levels[l] for a in reduce])
    order += present([a.levels[0] for a in reduce] + [a.levels[0] for a in spatial if a is not vec])
    if vec is not None and vec.levels[0] is not None:
        order.append(vec.levels[0])
    if lane is not None:
        order.append(lane)
    if dot is not None:
        order.append(dot)  # below the lanes: one vpdpbusd per vector of the register tile (tensorized below)
    if len(order) > 1:
        sch.reorder(*order)
    grid = (sch.fuse(*sgrid) if len(sgrid) > 1 else sgrid[0]) if sgrid else None
    order = ([grid] if grid is not None else []) + order[len(sgrid):]

    wb = None  # after rfactor: the write-back block, the cross-lane sum of the vector partial sums
    rf = _rfactor(sch, lane, len(expr.output.shape), expr.name) if lane is not None else None
    if rf is not None:
        # rfactor rebuilds the loop nest (reduce LoopRVs go stale): find every loop again by position
        pos = {id(lp): i for i, lp in enumerate(order)}
        wb, block = block, rf
        sch.set_scope(block, 0, ACCUMULATOR_SCOPE)
        new = sch.get_loops(block)
        if len(new) != len(order):
            raise BuildError(f"{expr.name}: rfactor left {len(new)} loops around the partial sums, "
                             f"expected {len(order)}")

        def moved(lp):
            return None if lp is None else new[pos[id(lp)]]
        for a in axes:  # spatial grid loops were fused into ``grid`` above
            a.levels = [moved(lp) for lp in a.levels]
            if a.kind == REDUCE:
                a.grid = moved(a.grid)
        grid, lane, order = moved(grid), moved(lane), list(new)
        rgrid = present([a.grid for a in reduce])
    # --- where tiles live. Packs: below the grid and the reduce grid loops (one top tile).
    # Accumulator: above the first reduce loop, so its init and write-back wrap the whole reduction.
    prefix = ([grid] if grid is not None else []) + ([held] if held is not None else []) + rgrid
    pack_at = prefix[-1] if prefix and grid is not None else None
    reduce_ids = {id(lp) for a in reduce for lp in [a.grid] + a.levels if lp is not None}
    first_reduce = next((i for i, lp in enumerate(order) if id(lp) in reduce_ids), None)
    acc_at = order[first_reduce - 1] if first_reduce else None
    consumers = list(sch.get_consumers(block))

    writer = block
    if wb is not None:
        # Partial sums (the rf buffer: lanes per output element) accumulate across the reduce loops;
        # the write-back folds the lanes per top-tile row into a local copy that takes the epilogues.
        if acc_at is not None:
            consumers = list(sch.get_consumers(wb))
            sch.reverse_compute_at(wb, acc_at)
            writer = sch.cache_write(wb, 0, ACCUMULATOR_SCOPE)
            _inline_epilogues(sch, consumers, program, expr.name)
            sch.reverse_compute_at(writer, acc_at)
            _vectorize_inner(sch, writer, lanes, notes)
        else:
            writer = wb
    elif reduce:
        if acc_at is not None:
            writer = sch.cache_write(block, 0, ACCUMULATOR_SCOPE)
            _inline_epilogues(sch, consumers, program, expr.name)  # fold the epilogue into the write-back
            sch.reverse_compute_at(writer, acc_at)
            _vectorize_inner(sch, writer, lanes, notes)
    else:
        _inline_epilogues(sch, consumers, program, expr.name)
    # what is not inlined (a padded plan's crop; the epilogue of a reduction without an accumulator tile) runs
    # per top tile, or at root where the plan has one top tile (a note says so where the per-tile step fails)
    for c in sch.get_consumers(writer):
        if grid is None or not _try(notes, f"{sch.get(c).name_hint} per top tile", sch.reverse_compute_at, c, grid):
            _parallel_root(sch, c, lanes, notes)

    # --- inputs: packed copies per top tile; producer stages (padding) per top tile or at root
    pad_of = dict(program.storage_pad)
    for t in expr.inputs:
        producer = _producer_of(sch, block, t.name)
        if t.name in program.inlined and producer is not None:
            sch.compute_inline(producer)  # the main block reads the tensor itself, behind its bounds
            continue
        # the plan's layout over the buffer's own dimensions (fused axes stand for several)
        if t.name in program.prepacked:
            continue  # it arrives packed: the kernel reads it in place (_read_prepacked)
        layout = _buffer_order(expr, t, program.layouts[t.name]) if program.layouts.get(t.name) else ()
        if producer is None and t.name in program.packed and _read_index(sch, block, t.name) is not None:
            if pack_at is None and not layout:
                notes.append(f"{t.name} not packed: the plan has one top tile, no loop to pack under")
                continue
            producer = sch.cache_read(block, _read_index(sch, block, t.name), "global")
        if producer is None:
            continue
        for stage in sch.get_producers(producer):
            # a stage of the function behind this copy (a convolution's zero padding behind its padded,
            # re-indexed window) is folded into the copy, or else runs at root over the cores: left as
            # it was, it ran serial and scalar (nas 3x3 conv on 42x42x84: a 44x44x84 copy, one core)
            if not _try(notes, f"inlining {sch.get(stage).name_hint} into the copy of {t.name}", sch.compute_inline,
                        stage):
                _parallel_root(sch, stage, lanes, notes)
        if layout:
            _transpose(sch, producer, layout)
        in_regs = t.name in program.register_transposes
        if t.name in root_copies or pack_at is None:
            _parallel_root(sch, producer, lanes, notes, layout, in_regs)
        elif not _try(notes, f"compute_at of {sch.get(producer).name_hint} per top tile", sch.compute_at,
                      producer, pack_at):
            _parallel_root(sch, producer, lanes, notes, layout, in_regs)
        else:
            _storage_pad(sch, producer, pad_of.get(t.name, 0))
            if not layout or not _block_transpose(sch, producer, layout, lanes, in_regs):
                _vectorize_inner(sch, producer, lanes, notes)
        if in_regs and not layout:
            raise BuildError(f"{expr.name}: the plan transposes {t.name} in registers, but does not pack it transposed")

    # Predicated tails (the plan's choice): TVM scalarizes a vector loop that carries a bound, so lowering
    # is asked to split the last, overhanging iterations of each such axis off the others.
    # The vector axis's register loops are split too (below), where every loop above them is
    # (``choices.vector_tail_split``, the rule the model charges by); the parallel grid loop itself where the
    # plan runs its last top tile alone (``choices.serial_tail``, the model's extra wave).
    tail_vector = vector_tail_split(expr, program, lanes)
    grid_tail = serial_tail(expr, program, lanes)
    if grid_tail and (solo is None or solo not in program.predicated or grid is None):
        raise BuildError(f"{expr.name}: the plan splits the parallel grid loop at its last top tile, but it is no "
                         f"predicated axis's own grid loop")
    for a in axes:
        if a.name in program.predicated:
            # not the register loops: unrolled, they must keep constant extents (a partitioned tail in a
            # fused grid loop would not be), and a bound on a non-vector axis there costs a branch only.
            # Nor the fused grid loop for a non-vector axis: splitting it (div/mod conditions) multiplied
            # the code and the compile time (docs/design-notes.md#schedule-schedule_cpu); the vector axis's grid
            # loop is held out of it for this.
            if a.kind == REDUCE:
                loops = [a.grid] + a.levels[1:]
            elif a.grid is held and held is not None:
                loops = [held] + a.levels[1:]
            else:
                # The parallel grid loop itself only where nothing below it can carry the split: a split
                # parallel loop runs its tail iteration after the parallel part, on one core
                # (docs/design-notes.md#schedule-schedule_cpu)
                inner = [lp for lp in a.levels[1:] if lp is not None]
                loops = ([grid] if a.name == solo and grid_tail else []) + inner
            if a is rvec:  # the lanes of partial sums: its register loop's overhanging vectors split off too
                loops.append(a.levels[0])
            for lp in loops:
                if lp is not None:
                    sch.annotate(lp, PARTITION_HINT, 1)
    selects = [a for a in (_select_axes(sch, block, [a for a in axes if len(expr.axis(a.name).parts) == 1])
                           if not reduce else ()) if a.name not in program.predicated]
    for a in selects:
        for lp in a.levels[1:]:
            if lp is not None:
                sch.annotate(lp, PARTITION_HINT, 1)
    # --- reg tile: vector lanes on the vector axis, everything else in the reg tile unrolled
    if vec is not None and vec.levels[0] is not None:
        vloop = vec.levels[0]
        vext = _loop_extent(sch, vloop)
        if vext > lanes and not program.amx:  # an AMX register tile is one tensorized unit (below)
            # whole vectors; a tile wider than a short axis (84 channels in a 96-wide tile) keeps its
            # overhang as a predicated last vector: vectorized whole, it runs far slower
            # (docs/design-notes.md#schedule-schedule_cpu)
            outer, vloop = split_vectors(sch, vloop, lanes, tail_vector)
            if any(a is vec for a in selects):
                # a register tile wider than one input of a concatenation: its vectors split where the
                # inputs meet, as the tile loops above do (a loop that is partitioned cannot be unrolled)
                sch.annotate(outer, PARTITION_HINT, 1)
            else:
                sch.unroll(outer)
        if dot is None and vext > 1:  # with a dot step: tensorized once the weight is laid out (below)
            sch.vectorize(vloop)
            if tail_vector:
                # The partial last vector as a vector loop of its own (constant lanes, the loops above it
                # split already): left in the whole vector loop, its bound made TVM emit it scalar and
                # LLVM regather it into 8 + 2 lane pieces shuffled in and out of every accumulator
                # (docs/design-notes.md#schedule-schedule_cpu).
                sch.annotate(vloop, PARTITION_HINT, 1)
    rolled = rolled_reduce_axes(expr, {a.name: a.sizes[0] for a in axes}, vname, lanes,
                                device.private_levels[0].capacity_bytes // device.units.vector_bytes)
    for a in axes if not program.amx else ():  # an AMX register tile's loops are tensorized (below)
        if (a is not vec and a.name not in rolled and a.levels[0] is not None
                and 1 < _loop_extent(sch, a.levels[0]) <= MAX_UNROLL):
            sch.unroll(a.levels[0])
    if grid is not None and _loop_extent(sch, grid) > 1:
        sch.parallel(grid)
    if lane is not None:
        sch.vectorize(lane)
    if reduce:
        # the init goes right below the accumulator: annotate loops first, decompose last
        _init_in_layout_order(sch, sch.decompose_reduction(block, order[first_reduce]), block)
    update = sch.get(block).name_hint  # the block that reads inlined padding (the reduction's update)
    if wb is not None:
        # the write-back's own loops start below the accumulator's loop: its init goes above them all
        _init_in_layout_order(sch, sch.decompose_reduction(wb, sch.get_loops(wb)[first_reduce or 0]), wb)
    if program.prepacked:
        layouts = _read_prepacked(sch, block, expr, program, device)
        blocks = {n: layout.block_elements() for n, layout in layouts.items()}
        blocks = {n: e for n, e in blocks.items() if n in program.prefetched}
        name = sch.get(block).name_hint
        if program.amx:  # the register tile one block before the prefetch's edit, which stops above it
            name = _tensorize_amx(sch, name, expr, program, device, len(present([a.levels[0] for a in axes])) + 1)
        sch = prefetch_prepacked(sch, name, blocks, len(prefix) - 1 if grid is not None else 0,
                                 device.private_levels[-1].transaction_bytes)
        if program.amx:
            layout = amx_layout(expr, device, program.vector_axis)
            sch = with_tile_state(sch, layout.tile_rows, layout.step)
        elif dot is not None:
            # the register tile's vector and its dot step, one vpdpbusd (the schedule is the prefetch's edit:
            # the loops are found again, the vector loop second innermost)
            sch.tensorize(sch.get_loops(sch.get_sblock(name))[-2], register_vnni(lanes, ACCUMULATOR_SCOPE))
    elif program.prefetched or dot is not None:
        raise BuildError(f"{expr.name}: the plan prefetches {list(program.prefetched)} or runs dot-product lanes "
                         f"(depth {program.dot_depth}) on a weight it does not prepack")
    func = in_registers(sch.mod["main"])
    if pad_sources:
        func = unswitched_padding(func, update, pad_sources)
    return with_main(sch, func)


def _tensorize_amx(sch, name: str, expr: Expr, program: RProgram, device: Device, count: int) -> str:
    """The register tile of an AMX plan (``RProgram.amx``), one tensorized unit (``roller.targets.cpu.amx``);
    returns the name of its block. The tile's ``count`` loops, the innermost of block ``name``, are the
    reduction's 4-deep groups, the rows, the columns and the dot step, and loops of one iteration (an axis
    of extent 1), moved above them. A BuildError where they are not that."""
    from tvm.s_tir.schedule.schedule import ScheduleError

    reg = program.tiles[0]
    k = dot_axis(expr, program.vector_axis)
    layout = amx_layout(expr, device, program.vector_axis)
    unit = sch.get_loops(sch.get_sblock(name))[-count:]
    ones = [lp for lp in unit if _loop_extent(sch, lp) == 1]
    if k is None or layout is None or len(unit) - len(ones) != 4:
        raise BuildError(f"{expr.name}: the plan runs on AMX tiles, but its register tile has no rows, columns "
                         f"and reduction to tensorize")
    if ones:
        sch.reorder(*ones, *[lp for lp in unit if _loop_extent(sch, lp) > 1])
    try:
        unit = sch.blockize(sch.get_loops(sch.get_sblock(name))[-4])
        unit_name = sch.get(unit).name_hint
        sch.tensorize(unit, register_amx(reg[layout.rows], reg[program.vector_axis], reg[k], layout.tile_rows,
                                         layout.step, layout.row_step, ACCUMULATOR_SCOPE))
        return unit_name
    except (ScheduleError, ValueError) as e:
        raise BuildError(f"{expr.name}: the AMX register tile {dict(reg)} does not tensorize: "
                         f"{str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__}") from e


def _dot_loop(sch, expr: Expr, program: RProgram, reduce: list[_AxisLoops], vec: _AxisLoops | None, lanes: int):
    """The loop of the plan's dot step (``RProgram.dot_depth`` reduce elements, innermost, summed per lane by
    vpdpbusd: ``roller.plan.dot``), split off the reduction's register loop, which keeps the rest. A
    BuildError where the plan's dot-product lanes do not fit the expression or its tiles."""
    depth = program.dot_depth
    name = dot_axis(expr, program.vector_axis)
    k = next((a for a in reduce if a.name == name), None)
    if depth != DOT_DEPTH or k is None or vec is None:
        raise BuildError(f"{expr.name}: the plan runs {depth}-deep dot-product lanes, but the expression is no "
                         f"u8 x s8 reduction along {program.vector_axis} that vpdpbusd ({DOT_DEPTH} deep) can run")
    if k.levels[0] is None or k.sizes[0] % depth or vec.sizes[0] % lanes:
        raise BuildError(f"{expr.name}: the plan runs {depth}-deep dot-product lanes, but its register tile takes "
                         f"{k.sizes[0]} of {k.name} and {vec.sizes[0]} of {vec.name} ({lanes} lanes)")
    if k.sizes[0] == depth:
        loop, k.levels[0] = k.levels[0], None
    else:
        k.levels[0], loop = sch.split(k.levels[0], [None, depth])
    return loop


def _select_axes(sch, block, axes: list[_AxisLoops]) -> list[_AxisLoops]:
    """The spatial axes whose loops decide a select in the block's value: a concatenation's ``if_then_else``
    on its channel. Where the block reduces nothing, their tile loops (not the grid, nor the unrolled register
    loops) get a partition hint, so lowering splits them where the condition turns and each side copies whole
    vectors of one input; left in the loop, every vector loaded both inputs and blended them (SqueezeNet's
    concatenations, alone: 54x54 of 128 + 128 channels 152 -> 93 us, 27x27 of 256 + 256 58 -> 23 us).
    Not in reductions: the selects of an inlined padding, hinted too, made ShuffleNetV2 5% slower. The caller
    passes only axes that are no fusion of several (a condition on one turns into div/mod, and TVM's loop
    partitioning failed on Swin-T's: "Trying to update var ... with a different const bound")."""
    import tvm

    from roller.tir.accesses import _call_name, _walk

    stmt = sch.get(block)
    if stmt.body is None or not hasattr(stmt.body, "value"):
        return []
    conditions = []

    def visit(e):
        if isinstance(e, tvm.tirx.Select):
            conditions.append(e.condition)
        elif isinstance(e, tvm.ir.expr.Call) and _call_name(e) == "if_then_else":
            conditions.append(e.args[0])
        return True
    _walk(stmt.body.value, visit)
    if not conditions:
        return []
    path = path_to(sch.mod["main"].body, lambda x: isinstance(x, tvm.s_tir.SBlockRealize) and x.block.same_as(stmt))
    if path is None:
        return []
    realize = path[-1]
    deciding = [bv for c in conditions for bv in tvm.tirx.analysis.undefined_vars(c)]
    used = [v for iv, value in zip(realize.block.iter_vars, realize.iter_values)
            if any(iv.var.same_as(bv) for bv in deciding) for v in tvm.tirx.analysis.undefined_vars(value)]
    return [a for a in axes if a.kind != REDUCE and any(
        lp is not None and any(v.same_as(sch.get(lp).loop_var) for v in used) for lp in a.levels[1:])]


def _inline_epilogues(sch, consumers, program: RProgram, name: str) -> None:
    """Inlines the main block's consumers into its write-back: the function's elementwise epilogue (analysis
    admits no other), or else a BuildError. A padded plan's consumers are its crops (``padding._guard_crop``
    keeps each its own block, placed per top tile): not inlined, by the plan's decision to pad."""
    from tvm.s_tir.schedule.schedule import ScheduleError

    if program.padded:
        return
    for c in consumers:
        try:
            sch.reverse_compute_inline(c)
        except ScheduleError as e:
            raise BuildError(f"{name}: the epilogue {sch.get(c).name_hint} cannot be inlined into the write-back: "
                             f"{str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__}") from e


def _init_in_layout_order(sch, init, block) -> None:
    """The loops ``decompose_reduction`` made for ``init`` (copies of the spatial loops of ``block`` below
    the accumulator) reordered into the order of the dimensions of the buffer it zeroes, the vector loop
    kept innermost. Left in the register tile's order, a large accumulator (a top tile's whole output
    region, where its reduction is split) is zeroed as many short rows: LLVM made each a 128-byte memset
    and unrolled them all, where in buffer order the region becomes one memset
    (docs/design-notes.md#schedule-init_in_layout_order)."""
    from tvm import tirx
    from tvm.s_tir.dlight.analysis.common_analysis import get_sblockrealize

    stmt = sch.get(init)
    if not isinstance(stmt.body, tirx.BufferStore):
        return
    outer = [sch.get(lp) for lp in sch.get_loops(block)]
    own = [lp for lp in sch.get_loops(init) if not any(sch.get(lp).same_as(o) for o in outer)]
    if len(own) < 2:
        return
    bindings = list(zip(stmt.iter_vars, get_sblockrealize(sch, init).iter_values))

    def dim(lp) -> int:
        """The first buffer dimension whose index the loop's variable reaches (through the iter vars)."""
        var = sch.get(lp).loop_var
        if sch.get(lp).kind == tirx.ForKind.VECTORIZED:
            return len(stmt.body.indices)  # innermost whatever it indexes
        for d, index in enumerate(stmt.body.indices):
            for iv, value in bindings:
                if uses_var(index, iv.var) and uses_var(value, var):
                    return d
        return -1  # a loop of extent one: outermost

    ordered = sorted(own, key=lambda lp: (dim(lp), own.index(lp)))
    if ordered != own:
        sch.reorder(*ordered)


def _read_prepacked(sch, block, expr: Expr, program: RProgram, device: Device) -> dict:
    """The parameters of the inputs the plan prepacks take their packed layout (``roller.plan.prepack``): the
    main block reads them in place, and the function's signature changes to the packed shapes (padding,
    which the caller fills with zeros, becomes an assumption). Returns the layouts (name -> PackedLayout)."""
    import tvm

    from roller.plan.prepack import program_layouts
    from roller.tir.layout import index_maps

    from tvm.s_tir.dlight.analysis import get_root_block

    layouts = program_layouts(expr, program, device)
    for name, layout in layouts.items():
        dtype = next(t.dtype for t in expr.inputs if t.name == name)
        # the main block, or the write-back an epilogue's input (a bias) was inlined into
        reader = next((b for b in [block] + list(sch.get_child_blocks(get_root_block(sch)))
                       if _read_index(sch, b, name) is not None), None)
        if reader is None:
            raise BuildError(f"{expr.name}: no block reads the prepacked input {name}")
        for index_map in index_maps(layout):
            sch.transform_layout(reader, name, index_map, pad_value=tvm.tirx.const(0, dtype))
    return layouts


def _rfactor(sch, lane, factor_axis: int, name: str):
    """rfactor on the lane loop (lanes last in the rf buffer, so a vector is contiguous). The plan keeps
    partial sums (``RProgram.partial_sums``): where TVM says the block's reducer does not allow it, a
    BuildError says so (the plan is not what the code would be)."""
    from tvm.s_tir.schedule.schedule import ScheduleError

    try:
        return sch.rfactor(lane, factor_axis=factor_axis)
    except ScheduleError as e:
        raise BuildError(f"{name}: the plan keeps vector partial sums, but rfactor does not apply to its "
                         f"reduction: {str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__}") from e


def _vectorize_inner(sch, block, lanes: int, notes: list[str]) -> None:
    """Vectorizes the innermost loop of a copy/write-back block when it is at least one vector long, or in
    the runs of a stage annotated with ``roller.tir.ops.LANE_RUN``."""
    loops = sch.get_loops(block)
    if not loops:
        return
    inner = loops[-1]
    if len(sch.get_child_blocks(inner)) != 1:
        # the block has no loop of its own here (e.g. a one-row write-back computed at the accumulator's
        # loop): its innermost loop also runs the reduction, which must not be vectorized
        return
    ext = sch.get(inner).extent
    if not isinstance(ext, int) and not hasattr(ext, "value"):
        return
    n = int(ext)
    run = int(sch.get(block).annotations.get(LANE_RUN, 0))
    width = run if 1 < run < lanes and n % run == 0 else lanes  # runs of one element broadcast (LANE_RUN)
    if n >= width and (n % width == 0 or width == lanes):
        if n > width:
            # a row longer than a vector but not a whole number of them (84 channels) ends in a
            # predicated vector, as the register tile's do: left scalar it cost a 96-channel tile 2x
            _, inner = split_vectors(sch, inner, width, n % width != 0)
        _try(notes, f"vectorize {sch.get(block).name_hint}", sch.vectorize, inner)


def _parallel_root(sch, block, lanes: int, notes: list[str], layout: tuple[int, ...] = (),
                   in_registers: bool = False) -> None:
    """A stage left at root: its outermost loop runs over the cores, its innermost is vectorized (a
    transposed copy is blocked instead, see _block_transpose)."""
    blocked = bool(layout) and _block_transpose(sch, block, layout, lanes, in_registers)
    loops = sch.get_loops(block)
    if loops and int(sch.get(loops[0]).extent) > 1:
        _try(notes, f"parallel {sch.get(block).name_hint}", sch.parallel, loops[0])
    if len(loops) > 1 and not blocked:
        _vectorize_inner(sch, block, lanes, notes)


def _block_transpose(sch, block, order: tuple[int, ...], lanes: int, in_registers: bool = False) -> bool:
    """Blocks a transposed copy (its loops in the new layout's order, see _transpose) so that it reads
    its source in runs of ``lanes`` contiguous elements: the loop over the source's contiguous dimension
    is split and its inner part goes innermost. Left in the new layout's order, the copy reads one element
    per source row at a time, and source rows a power of two apart alias in the L1 sets. Where both run over
    whole vectors the copy goes in lanes x lanes blocks: a run of every source row of the tile at a time kept
    hundreds of rows in flight (docs/design-notes.md#schedule-block_transpose). Returns whether it did
    (False: the copy keeps fewer loops of its own than dimensions, e.g. rows of one element). The square
    blocks go in registers where the plan says so (``in_registers``: ``RProgram.register_transposes``), and a BuildError says why where
    they cannot."""
    name = sch.get(block).name_hint

    def cannot(why: str):
        if in_registers:
            raise BuildError(f"the plan transposes the copy {name} in registers, but {why}")
        return False
    loops = sch.get_loops(block)
    own = [lp for lp in loops if len(sch.get_child_blocks(lp)) == 1][-len(order):]
    if len(own) < len(order):
        return cannot("it has fewer loops of its own than dimensions")
    src_inner = own[order.index(len(order) - 1)]
    if src_inner is own[-1]:
        return cannot("it is not transposed in its last dimension")  # already reads contiguous runs
    n = _loop_extent(sch, src_inner)
    src_outer = None
    if n > lanes and n % lanes == 0:
        src_outer, src_inner = sch.split(src_inner, [None, lanes])
    dst = own[-1]
    m = _loop_extent(sch, dst)
    if n % lanes == 0 and m >= lanes and m % lanes == 0:
        # square blocks: lanes source rows at a time, not every row of the tile; each transposed in
        # registers where the plan says so (transpose.py; tails.register_transposes, the model's rule too)
        dst_outer, dst = sch.split(dst, [None, lanes]) if m > lanes else (None, dst)
        sch.reorder(*[lp for lp in (dst_outer, src_outer) if lp is not None], dst, src_inner)
        sch.vectorize(src_inner)
        if in_registers:
            register_transpose(sch, dst, lanes)
        return True
    if in_registers:
        cannot(f"its runs ({n} source, {m} new) are not whole {lanes}-lane vectors")
    sch.reorder(dst, src_inner)
    sch.vectorize(src_inner)
    return True


def _buffer_order(expr: Expr, t, order: tuple[int, ...]) -> tuple[int, ...]:
    """The plan's layout ``order`` (over the dimensions of ``t`` as the Expr sees it, fused axes merged)
    over the buffer's own dimensions: a dimension indexed by a fused axis stands for that axis's parts,
    consecutive dimensions of the buffer, which keep their order (a [2, 12, 20] tensor whose first two
    dimensions fused into one axis of 24 and that is packed transposed becomes [20, 2, 12])."""
    groups, start = [], 0
    for dim in t.index:
        n = len(expr.axis(dim[0][0]).parts) if len(dim) == 1 and dim[0][1] == 1 else 1
        groups.append(list(range(start, start + n)))
        start += n
    return tuple(d for g in order for d in groups[g])


def _transpose(sch, block, order: tuple[int, ...]) -> None:
    """The copy ``block`` (at root) writes its buffer with dimensions in ``order`` (the plan's packed
    layout), iterating in that order too, so the copy writes contiguous rows of the new layout."""
    import tvm

    index_map = tvm.tirx.IndexMap.from_func(lambda *i: [i[j] for j in order], ndim=len(order))
    sch.transform_layout(block, ("write", 0), index_map)
    sch.transform_block_layout(block, index_map)
