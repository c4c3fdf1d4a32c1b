"""CPU schedule of a row-wise function with several reductions: softmax, layer norm, RMS norm, a mean
followed by elementwise work.

Such a function is a chain of blocks that share their leading spatial axes (the rows) and run over the
rest of the row (the columns): reductions (``max``, ``sum``) and elementwise blocks (``exp``, the
normalization), the last one writing the output. The plan (:class:`roller.plan.rows.RowPlan`, from
:func:`roller.plan.rows.plan_rows`) keeps every block and runs them all row by row:

- the rows, fused, run in parallel over the cores; every block is computed at the row loop of the last
  one, so the intermediate rows (``exp(x - max)``, the squares) live in a row-sized buffer in L1
  instead of a tensor in memory;
- cheap intermediate blocks read once are inlined into their consumer (``x - max`` into ``exp``);
- each block's column loop is split into vectors of lanes: an elementwise block's lanes are vectorized,
  a reduction's lanes become vector partial sums (``rfactor``), summed across lanes once per row;
- where a row is not a whole number of vectors, lowering splits the last, partial vector off
  (loop-partition hints) so that the whole vectors stay vectorized.
"""
from __future__ import annotations

from roller.errors import BuildError
from roller.plan.rows import RowPlan
from roller.tir.schedutil import split_vectors


def schedule_rows(func, plan: RowPlan, notes: list[str] | None = None):
    """The ``tvm.s_tir.Schedule`` of ``func`` (the normalized function of
    :func:`roller.tir.analysis.analyze_rows`) following ``plan`` (see the module docstring)."""
    import tvm

    notes = notes if notes is not None else []
    sch = tvm.s_tir.Schedule(reciprocal_divisions(func, plan.row_axes))
    for name in plan.inlined:
        sch.compute_inline(sch.get_sblock(name))
    rows = plan.row_axes
    # Reductions first, while each block still has its own loop nest (rfactor needs the reduction block
    # to be the first child of its loop; after compute_at it would hoist the partial sums out of the row
    # loop): the columns fused and split into vectors of partial sums.
    rf_of: dict[str, str] = {}  # rf block -> its write-back (the original reduction block)
    for name in plan.reductions:
        block = sch.get_sblock(name)
        cols = sch.get_loops(block)[rows:]
        col = sch.fuse(*cols) if len(cols) > 1 else cols[0]
        if name not in plan.vector_reductions:
            notes.append(f"{name}: the reduction runs scalar (no divisor of the row fills half a vector)")
            continue
        _, lane = sch.split(col, [None, plan.reduction_lanes])
        # the partial sums keep the default scope: computed at the row loop they become a stack array of
        # one vector (registers after LLVM); a "local" buffer was allocated through
        # TVMBackendAllocWorkspace on every row (docs/design-notes.md#rows-schedule_rows)
        rf = sch.rfactor(lane, factor_axis=plan.reduction_ndim[name])
        rf_of[sch.get(rf).name_hint] = name
    order = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    if rows:
        loops = sch.get_loops(sch.get_sblock(order[-1]))
        row = sch.fuse(*loops[:rows]) if rows > 1 else loops[0]
        for name in reversed(order[:-1]):
            sch.compute_at(sch.get_sblock(name), row, preserve_unit_loops=True)
        if plan.parallel:
            sch.parallel(row)
    for name in order:
        block = sch.get_sblock(name)
        inner = sch.get_loops(block)[1 if rows else 0:]
        if name in rf_of:
            _vector_partial_sums(sch, block, inner, plan.reduction_lanes, name)
        elif name in plan.reductions:
            if rows == 0 or name in plan.vector_reductions:  # a write-back's init above its lanes loop
                sch.decompose_reduction(block, inner[0])
        elif inner:  # elementwise (per-row blocks have no loop of their own under the row)
            _vectorize_columns(sch, inner, plan.lanes, plan.tail)
    return sch


def _vector_partial_sums(sch, block, inner, lanes: int, name: str) -> None:
    """The rf block's lanes go innermost and are vectorized; its init goes above the columns' loop."""
    from tvm import tirx
    from tvm.s_tir.dlight.analysis.common_analysis import get_sblockrealize

    # the lanes: the loop bound to the rf block's spatial iter var of extent ``lanes`` (compute_at
    # made the loops in iter var order, the split at root the other way round); the columns' vectors:
    # the loop bound to its reduce iter var
    stmt, values = sch.get(block), get_sblockrealize(sch, block).iter_values
    lane = red = None
    for lp in inner:
        var = sch.get(lp).loop_var
        for iv, val in zip(stmt.iter_vars, values):
            if isinstance(val, tirx.Var) and val.same_as(var):
                if iv.iter_type == tirx.IterVar.CommReduce:
                    red = lp
                elif int(iv.dom.extent) == lanes:
                    lane = lp
    if lane is None or red is None:
        raise BuildError(f"{name}: no loop of {lanes} lanes and one of vectors among the partial sums' "
                         f"{len(inner)} loops")
    sch.reorder(red, lane)
    sch.vectorize(lane)
    sch.decompose_reduction(block, red)


def _vectorize_columns(sch, inner, lanes: int, tail: bool) -> None:
    """An elementwise block's columns in vectors of ``lanes``; a partial last vector is split off by
    lowering (loop-partition hint: TVM emits a vector loop that carries a bound as scalar code)."""
    col = sch.fuse(*inner) if len(inner) > 1 else inner[0]
    n = int(sch.get(col).extent)
    if n < 2:
        return
    if n > lanes:
        _, col = split_vectors(sch, col, lanes, tail)
    sch.vectorize(col)


def reciprocal_divisions(func, row_axes: int):
    """``func`` with every division by a per-row value (``exp / sum``, ``(x - mean) / sqrt(var + eps)``)
    written as a multiplication by its reciprocal, which LLVM then computes once a row outside the column
    loop instead of a vector division per vector (what onnxruntime does; the result differs from the
    division by at most an ulp or two). A divisor is per-row when it uses none of the block's variables
    after the first ``row_axes`` (the rows) while the dividend does."""
    import tvm_ffi
    from tvm import tirx
    from tvm.s_tir.stmt import SBlock

    def per_row_divisions(block):
        columns = {iv.var for iv in block.iter_vars[row_axes:]}
        if not columns:
            return block

        def uses_columns(expr) -> bool:
            found = []
            tvm_ffi.structural_visit(expr, [(tirx.Var, lambda v, _: found.append(v) if v in columns else None)])
            return bool(found)

        def div(node):
            if str(node.ty).startswith("float") and uses_columns(node.a) and not uses_columns(node.b):
                return node.a * (tirx.const(1.0, str(node.ty)) / node.b)
            return node

        body = tvm_ffi.structural_map(block.body, [(tirx.Div, div)])
        if body.same_as(block.body):
            return block
        return SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, body, block.init,
                      block.alloc_buffers, block.match_buffers, block.annotations, block.span)

    return tvm_ffi.structural_map(func, [(SBlock, per_row_divisions)])
