"""Padding the iteration space to whole top tiles, so overhanging tiles cost no predicates.

The plan says which axes are padded (``RProgram.padded``, decided by ``roller.plan.tails``): a top tile that
overhangs an axis (1000 covered by tiles of 72 reaches 1008), or a vector axis rounded up to whole
vectors (36 -> 48). The main block is rewritten with ``Schedule.pad_einsum``: it runs over the rounded-up
extents, reads zero-padded copies of the inputs those axes index (``A_pad``) and writes a padded output
that a crop block copies into the real one. The function keeps its parameters and results; code
generation places the pad blocks (per top tile where the input is packed, else once at root) and the
crop like an epilogue that cannot be inlined (per top tile, with its exact bounds).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from roller.errors import BuildError
from roller.plan.expr import Expr, TensorAccess
from roller.plan.rprogram import RProgram
from roller.plan.rtile import round_up
from roller.plan.tails import clamped_top, copied_per_tile
from roller.tir.analysis import axis_base_name, zero_padding_is_neutral


@dataclass(frozen=True)
class Padded:
    """A padded function and what describes it: ``expr`` has the padded extents and names the buffers
    the padded main block reads and writes; ``program`` is the plan with its per-tensor fields
    (``packed``, ``storage_pad``) renamed to those buffers. ``extents`` maps each axis to its padded extent."""

    func: Any  # tvm.tirx.PrimFunc
    expr: Expr
    program: RProgram
    extents: dict[str, int]
    root_copies: frozenset[str] = frozenset()  # padded inputs copied once at root (roller.plan.tails.copied_per_tile)


def padded_extents(expr: Expr, program: RProgram, lanes: int) -> dict[str, int]:
    """Each padded axis's extent rounded up to a whole number of top tiles as code generation runs them
    (``roller.plan.tails.clamped_top``: clamped to the extent, whole vectors on the vector axis); the other
    axes keep theirs."""
    return {a.name: round_up(a.extent, clamped_top(expr, program.tiles, a.name, program.vector_axis, lanes))
            if a.name in program.padded else a.extent for a in expr.axes}


def pad_to_tiles(func, expr: Expr, program: RProgram, lanes: int) -> Padded:
    """``func`` with the main block padded along ``program.padded`` to whole top tiles.

    ``func`` is the normalized PrimFunc ``expr`` describes (``roller.builder.api.analyze``); the result computes
    the same outputs from the same parameters. Inputs read through a sliding window (a convolution's
    ``h * stride + r``) are first re-indexed by the axes themselves (``Schedule.reindex``), which makes
    the block einsum-like for ``pad_einsum``; a re-indexed input that no padded axis touches is inlined
    back. Raises BuildError when TVM refuses what the plan decided (roller.plan.tails says what pads).
    """
    import tvm
    from tvm.s_tir.schedule.schedule import ScheduleError

    problem = program.problem([a.name for a in expr.axes])
    if problem:
        raise BuildError(f"{problem} ({expr.name})")
    extents = padded_extents(expr, program, lanes)
    padded = {a.name for a in expr.axes if extents[a.name] != a.extent}
    if not padded or not expr.block:
        raise BuildError(f"{expr.name}: the plan pads {list(program.padded)} but no axis needs it")
    sch = tvm.s_tir.Schedule(func)
    block = sch.get_sblock(expr.block)
    main = sch.get(block)
    var_axis = _iter_var_axes(expr, main)
    if not zero_padding_is_neutral(main, [iv.var for iv in main.iter_vars if var_axis[str(iv.var.name)] in padded
                                           and iv.iter_type != 0]):
        raise BuildError(f"{expr.name}: the plan pads reduce axes {sorted(padded)} but zero padding would change "
                         f"the result (Expr.zero_pad_axes disagrees with the block)")
    windows = _reindex_windows(sch, block)
    try:
        sch.pad_einsum(block, [extents[var_axis[str(iv.var.name)]] if var_axis[str(iv.var.name)] in padded
                               else int(iv.dom.extent) for iv in main.iter_vars])
    except ScheduleError as e:
        raise BuildError(f"{expr.name}: TVM cannot pad axes {sorted(padded)} of block {expr.block!r}: "
                         f"{str(e).splitlines()[-1]}") from None
    # The re-index stages go again: inlined into the main block where no axis of theirs was padded (it
    # reads the original tensor), else into their pad block (the window gather moves into the copy).
    for w in windows:
        sch.compute_inline(sch.get_sblock(w))
    block = sch.get_sblock(expr.block)
    crops = [sch.get(c).name_hint for c in sch.get_consumers(block)]
    for c in crops:
        _guard_crop(sch, sch.get_sblock(c))
    padded_func = sch.mod["main"]
    main = sch.get(block)
    renamed = _renamed_inputs(sch, block)
    inputs = tuple(_retarget(t, renamed.get(t.name, t.name), main, var_axis) for t in expr.inputs)
    store = main.body.buffer
    output = replace(expr.output, name=str(store.name), shape=tuple(int(s) for s in store.shape))
    new_expr = replace(
        expr, axes=tuple(a if a.name not in padded else replace(a, extent=extents[a.name],
                                                                 parts=((a.parts[0][0], extents[a.name]),))
                         for a in expr.axes),
        inputs=inputs, output=output, epilogue=expr.epilogue + tuple(crops))
    new_program = replace(
        program, packed=tuple(renamed.get(n, n) for n in program.packed),
        storage_pad={renamed.get(n, n): v for n, v in program.storage_pad.items()},
        layouts={renamed.get(n, n): v for n, v in program.layouts.items()})
    root = frozenset(renamed[t.name] for t in expr.inputs
                     if t.name in renamed and not copied_per_tile(t, program.packed))
    return Padded(func=padded_func, expr=new_expr, program=new_program, extents=extents, root_copies=root)


def _iter_var_axes(expr: Expr, block) -> dict[str, str]:
    """The main block's iter var name -> the Expr axis it belongs to (a fused axis lists its parts)."""
    part_axis = {p: a.name for a in expr.axes for p, _ in a.parts}
    out = {}
    for iv in block.iter_vars:
        name = str(iv.var.name)
        axis = part_axis.get(name, part_axis.get(axis_base_name(name)))
        if axis is None:
            raise BuildError(f"{expr.name}: block {expr.block!r} iter var {name} matches no axis of the Expr")
        out[name] = axis
    return out


def _reindex_windows(sch, block) -> list[str]:
    """Re-indexes every input the block reads through a non-plain index (a sliding window); returns the
    names of the re-index blocks."""
    from tvm import tirx

    out = []
    for i in range(len(sch.get(block).reads)):
        region = sch.get(block).reads[i]
        if all(isinstance(r.min, tirx.Var) for r in region.region):
            continue
        if str(region.source.name) == str(sch.get(block).writes[0].source.name):
            continue
        stage = sch.reindex(block, ("read", i))
        out.append(sch.get(stage).name_hint)
    return out


def _renamed_inputs(sch, block) -> dict[str, str]:
    """Original input buffer -> the padded copy the main block now reads (from the pad producers)."""
    reads = {str(r.source.name) for r in sch.get(block).reads}
    out = {}
    for p in sch.get_producers(block):
        stage = sch.get(p)
        written = [str(w.source.name) for w in stage.writes]
        sources = [str(r.source.name) for r in stage.reads]
        if len(written) == 1 and written[0] in reads and len(set(sources)) == 1:
            out[sources[0]] = written[0]
    return out


def _guard_crop(sch, crop) -> None:
    """Prepares the crop block (padded output -> real output) for code generation.

    The elementwise epilogue reading the crop's output is inlined into it first (then code generation
    places one block, not two; a BuildError where TVM refuses). Then the crop gets an always-true block predicate (a split by more than
    its extent) so that ``reverse_compute_inline`` refuses it: inlined into the accumulator's write-back,
    the crop's bound becomes a predicate of that block over the padded domain, and TVM 0.27's
    ``reverse_compute_at`` drops it when moving the write-back to its tile: the kernel then writes past
    the real output. Kept as its own block, the crop goes to its top tile with its own, exact bounds.
    """
    from tvm.s_tir.schedule.schedule import ScheduleError

    for c in sch.get_consumers(crop):
        try:
            sch.reverse_compute_inline(c)
        except ScheduleError as e:  # analysis admits elementwise epilogues only: this one should inline
            raise BuildError(f"the epilogue {sch.get(c).name_hint} cannot be inlined into the crop "
                             f"{sch.get(crop).name_hint}: {str(e).strip().splitlines()[-1]}") from e
    loops = sch.get_loops(crop)
    if loops:
        sch.split(loops[0], [None, int(sch.get(loops[0]).extent) + 1])


def _retarget(t: TensorAccess, name: str, main, var_axis: dict[str, str]) -> TensorAccess:
    """``t`` as the padded block reads it: the padded copy's name and shape, and (for a re-indexed
    window) one plain dimension per axis."""
    if name == t.name:
        return t
    for r in main.reads:
        if str(r.source.name) == name:
            shape = tuple(int(s) for s in r.source.shape)
            if len(shape) == len(t.index):
                return replace(t, name=name, shape=shape)
            index = tuple(((var_axis[str(x.min.name)], 1),) for x in r.region)
            return replace(t, name=name, shape=shape, index=index)
    return t
