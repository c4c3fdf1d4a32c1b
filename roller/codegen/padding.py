"""Padding the iteration space to whole top tiles, so overhanging tiles cost no predicates.

The constructor may let a top tile overhang an axis (1000 covered by tiles of 72 reaches 1008). Split
as is, every innermost loop then carries a bounds predicate and the kernel runs several times slower.
Instead the main block is rewritten with ``Schedule.pad_einsum``: it runs over the rounded-up extents,
reads zero-padded copies of its inputs (``A_pad``, blocks of the same name) and writes a padded output
that a crop block copies into the real one. The function keeps its parameters and results; code
generation then places the pad blocks like any producer of the main block (computed per top tile, so
each becomes a packed tile; at root when there is no grid) and the crop like an epilogue that cannot be
inlined (per top tile, with its exact bounds).

Not padded (the caller keeps the predicated schedule): memory-bound blocks whose input is read once per
point (the pad copy would double their traffic), fused axes (an ``Axis`` with several parts has no
single iter var to pad), reduce axes whose zero padding would change the result (a max, or a sum of
``exp``), and blocks ``pad_einsum`` rejects (any index that is not a plain axis, e.g. a convolution's
``h + r``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..expr import REDUCE, Axis, Expr, TensorAccess
from ..rprogram import RProgram
from .cpu import clamp_tiles


@dataclass(frozen=True)
class Padded:
    """A padded function and what describes it: ``expr`` has the padded extents and names the buffers
    the padded main block reads and writes; ``program`` is the plan with its per-tensor fields
    (``packed``, ``storage_pad``) renamed to those buffers. ``extents`` maps each axis to its padded extent."""

    func: Any  # tvm.tirx.PrimFunc
    expr: Expr
    program: RProgram
    extents: dict[str, int]


def padded_extents(expr: Expr, program: RProgram) -> dict[str, int]:
    """Each axis's extent rounded up to a whole number of (clamped) top tiles.

    Tiles are clamped as code generation clamps them (``clamp_tiles``), so a tile larger than a small
    extent pads nothing. The rounding repeats until the padded extent is a multiple of its own clamped
    top tile, which is what the schedule of the padded function splits by.
    """
    out = {}
    for a in expr.axes:
        sizes = [t[a.name] for t in program.tiles]
        ext = a.extent
        while True:
            top = clamp_tiles(ext, sizes)[-1]
            if ext % top == 0:
                break
            ext = -(-ext // top) * top
        out[a.name] = ext
    return out


def pad_to_tiles(func, expr: Expr, program: RProgram) -> Padded | None:
    """``func`` with the main block padded to whole top tiles, or None when it needs no padding or
    cannot be padded (see the module docstring); None means: schedule ``func`` as it is.

    ``func`` is the normalized PrimFunc ``expr`` describes (``roller.api.analyze``); the result computes
    the same outputs from the same parameters.
    """
    import tvm
    from tvm.s_tir.schedule.schedule import ScheduleError

    if program.problem([a.name for a in expr.axes]):
        return None  # schedule_cpu reports what is wrong with the plan
    extents = padded_extents(expr, program)
    grown = [a for a in expr.axes if extents[a.name] != a.extent]
    if not grown or not expr.block:
        return None
    if any(len(a.parts) > 1 for a in expr.axes):
        return None  # a fused axis spans several iter vars: pad_einsum pads each iter var on its own
    every = {a.name for a in expr.axes}
    if any(t.axes >= every for t in expr.inputs):
        # An input read once per point (a row sum's) is streamed: its padded copy moves as many bytes as
        # the kernel itself, and the predicated loop was faster (measured 0.5x padded, reduce_sum 1000^2).
        return None
    sch = tvm.s_tir.Schedule(func)
    block = sch.get_sblock(expr.block)
    ivs = sch.get(block).iter_vars
    if len(ivs) != len(expr.axes):
        return None
    if not _zero_padding_is_neutral(sch.get(block), [iv.var for iv, a in zip(ivs, expr.axes)
                                                    if a.kind == REDUCE and extents[a.name] != a.extent]):
        return None
    try:
        sch.pad_einsum(block, [extents[a.name] for a in expr.axes])
    except ScheduleError:
        # pad_einsum accepts only einsum-like blocks (plain-axis indices); others keep the predicates
        return None
    block = sch.get_sblock(expr.block)
    crops = [sch.get(c).name_hint for c in sch.get_consumers(block)]
    for c in crops:
        _guard_crop(sch, sch.get_sblock(c))
    padded = sch.mod["main"]
    main = sch.get(block)
    renamed = _renamed_inputs(sch, block)
    inputs = tuple(_retarget(t, renamed.get(t.name, t.name), main) for t in expr.inputs)
    store = main.body.buffer
    output = replace(expr.output, name=str(store.name), shape=tuple(int(s) for s in store.shape))
    new_expr = replace(
        expr, axes=tuple(Axis(a.name, extents[a.name], a.kind) for a in expr.axes), inputs=inputs,
        output=output, epilogue=expr.epilogue + tuple(crops))
    new_program = replace(
        program, packed=tuple(renamed.get(n, n) for n in program.packed),
        storage_pad={renamed.get(n, n): v for n, v in program.storage_pad.items()})
    return Padded(func=padded, expr=new_expr, program=new_program, extents=extents)


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

    An elementwise epilogue reading the crop's output is inlined into it first (then code generation
    places one block, not two). Then the crop gets an always-true block predicate (a split by more than
    its extent) so that ``reverse_compute_inline`` refuses it: inlined into the accumulator's write-back,
    the crop's bound becomes a predicate of that block over the padded domain, and TVM 0.27's
    ``reverse_compute_at`` drops it when moving the write-back to its tile: the kernel then writes past
    the real output. Kept as its own block, the crop goes to its top tile with its own, exact bounds.
    """
    from tvm.s_tir.schedule.schedule import ScheduleError

    for c in sch.get_consumers(crop):
        try:
            sch.reverse_compute_inline(c)
        except ScheduleError:
            pass  # not elementwise over the crop: it stays its own block at root (still correct)
    loops = sch.get_loops(crop)
    if loops:
        sch.split(loops[0], [None, int(sch.get(loops[0]).extent) + 1])


def _retarget(t: TensorAccess, name: str, main) -> TensorAccess:
    """``t`` renamed to the buffer the padded block reads, with that buffer's (padded) shape."""
    if name == t.name:
        return t
    for r in main.reads:
        if str(r.source.name) == name:
            return replace(t, name=name, shape=tuple(int(s) for s in r.source.shape))
    return t


def _zero_padding_is_neutral(block, reduce_vars) -> bool:
    """Whether padding the reduce iter vars ``reduce_vars`` with zero inputs leaves the result unchanged.

    pad_einsum reads 0 where a padded index is out of range. A padded reduction step then adds a term
    that must be 0: the block must be ``out = out + term`` and ``term`` zero whenever the loads indexed
    by a padded reduce var are zero (a load, a product with such a factor, casts, sums of such terms).
    """
    from tvm import ir, tirx

    if not reduce_vars:
        return True
    store = block.body
    if not isinstance(store, tirx.BufferStore) or not isinstance(store.value, tirx.Add):
        return False
    a, b = store.value.a, store.value.b

    def is_acc(e):
        return isinstance(e, ir.expr.TensorLoad) and e.source.same_as(store.buffer)
    term = b if is_acc(a) else a if is_acc(b) else None
    if term is None:
        return False
    return all(_zero_if_padded(term, v) for v in reduce_vars)


def _zero_if_padded(e, var) -> bool:
    """Whether ``e`` is 0 whenever every load indexed by ``var`` reads 0."""
    from tvm import ir, tirx

    if isinstance(e, ir.expr.TensorLoad):
        return any(_uses(i, var) for i in e.indices)
    if isinstance(e, tirx.Cast):
        return _zero_if_padded(e.value, var)
    if isinstance(e, tirx.Mul):
        return _zero_if_padded(e.a, var) or _zero_if_padded(e.b, var)
    if isinstance(e, (tirx.Add, tirx.Sub)):
        return _zero_if_padded(e.a, var) and _zero_if_padded(e.b, var)
    return False


def _uses(index, var) -> bool:
    from tvm import tirx

    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(index))
