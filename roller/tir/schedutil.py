"""Schedule steps both code generators take (``cpu``, ``cuda``): find the main block, give each Expr axis
one loop, find a tensor's read and producer, run an optional step, pad a staged buffer's rows.

Plain helpers over a ``tvm.s_tir.Schedule``; they decide nothing a plan does not say.
"""
from __future__ import annotations

from roller.errors import BuildError, UnsupportedExpressionError
from roller.plan.expr import Expr
from roller.plan.rprogram import RProgram

# The loop annotation that asks lowering to split a loop's last, overhanging iterations off the others (a
# predicated tail: TVM runs a vector loop that carries a bound as scalar code)
PARTITION_HINT = "pragma_loop_partition_hint"


def check_program(expr: Expr, program: RProgram) -> None:
    """BuildError unless ``program`` tiles exactly the axes of ``expr``."""
    problem = program.problem([a.name for a in expr.axes])
    if problem:
        raise BuildError(f"{problem} ({expr.name})")


def main_block(sch, expr: Expr):
    """The block the Expr describes: ``expr.block`` by name, else the one reduction block, else the last."""
    from tvm.s_tir.dlight.analysis import get_root_block

    blocks = sch.get_child_blocks(get_root_block(sch))
    names = [sch.get(b).name_hint for b in blocks]
    if expr.block:
        if expr.block not in names:
            raise UnsupportedExpressionError(f"{expr.name}: block {expr.block!r} is not in the function "
                                             f"(blocks: {names})")
        return sch.get_sblock(expr.block)
    reducing = [b for b in blocks if any(iv.iter_type != 0 for iv in sch.get(b).iter_vars)]
    if len(reducing) > 1:
        raise UnsupportedExpressionError(f"{expr.name}: several reduction blocks {names}; set Expr.block")
    return reducing[0] if reducing else blocks[-1]


def axis_loop_map(sch, block, expr: Expr) -> dict[str, object]:
    """Name -> loop for each iter var of the block (by iter var name and by loop var name)."""
    loops = sch.get_loops(block)
    ivs = sch.get(block).iter_vars
    bname = sch.get(block).name_hint
    if len(loops) != len(ivs):
        raise UnsupportedExpressionError(f"{expr.name}: block {bname} has {len(ivs)} iter vars but {len(loops)} "
                                         f"loops; roller schedules blocks with one loop per iter var")
    out: dict[str, object] = {}
    for lp, iv in zip(loops, ivs):
        ext, dom = sch.get(lp).extent, iv.dom.extent
        if int(ext) != int(dom):
            raise UnsupportedExpressionError(f"{expr.name}: loop {sch.get(lp).loop_var.name} (extent {ext}) does not "
                                             f"bind iter var {iv.var.name} (extent {dom}) one to one")
        out[iv.var.name] = lp
        out.setdefault(sch.get(lp).loop_var.name, lp)
    return out


def fuse_axes(sch, block, expr: Expr) -> dict[str, object]:
    """One loop per Expr axis: the original loops of fused axes are reordered and fused (outer first)."""
    by_name = axis_loop_map(sch, block, expr)
    groups = []
    for ax in expr.axes:
        parts = []
        for pname, _ in ax.parts:
            if pname not in by_name:
                raise UnsupportedExpressionError(f"{expr.name}: axis {ax.name} names loop {pname!r}, which block "
                                                 f"{sch.get(block).name_hint} does not have")
            parts.append(by_name[pname])
        groups.append(parts)
    flat = [lp for g in groups for lp in g]
    if len(flat) != len(sch.get_loops(block)):
        raise UnsupportedExpressionError(f"{expr.name}: the Expr's axes cover {len(flat)} loops but block "
                                         f"{sch.get(block).name_hint} has {len(sch.get_loops(block))}")
    if len(flat) > 1:
        sch.reorder(*flat)
    return {ax.name: (sch.fuse(*g) if len(g) > 1 else g[0]) for ax, g in zip(expr.axes, groups)}


def read_index(sch, block, name: str) -> int | None:
    """The index of tensor ``name`` among the reads of ``block`` (for ``cache_read``), or None."""
    for i, region in enumerate(sch.get(block).reads):
        if region.source.name == name:
            return i
    return None


def producer_of(sch, block, name: str):
    """The block that writes tensor ``name`` for ``block`` (a padding stage), or None."""
    for p in sch.get_producers(block):
        if any(r.source.name == name for r in sch.get(p).writes):
            return p
    return None


def split_vectors(sch, loop, width: int, tail: bool):
    """``loop`` split into (a loop over vectors, a loop of ``width`` lanes); with ``tail`` (an extent not a
    whole number of vectors) lowering splits the last, partial vector off (PARTITION_HINT): TVM emits a
    vector loop that carries a bound as scalar code."""
    outer, inner = sch.split(loop, [None, width])
    if tail:
        sch.annotate(outer, PARTITION_HINT, 1)
    return outer, inner


def try_step(notes: list[str] | None, what: str, fn, *args):
    """Runs one optional schedule step; False if TVM says it does not apply (the schedule is unchanged).
    With ``notes``, a step that did not apply is reported there (``what`` names it)."""
    from tvm.s_tir.schedule.schedule import ScheduleError

    try:
        fn(*args)
        return True
    except ScheduleError:
        if notes is not None:
            notes.append(f"{what} did not apply")
        return False


def storage_pad(sch, block, pad: int) -> None:
    """Pads each row of the buffer ``block`` writes by ``pad`` elements (against cache-set conflicts)."""
    if pad <= 0:
        return
    ndim = len(sch.get(block).writes[0].source.shape)
    loops = sch.get_loops(block)
    if ndim < 2 or not loops:
        return
    # The buffer is compacted to the tile at lowering; the copy's innermost loop spans one tile row.
    # storage_align makes stride = k * factor + offset for the smallest k that fits: row + pad.
    row = int(sch.get(loops[-1]).extent)
    sch.storage_align(block, 0, ndim - 2, row + pad, 0)
