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
  a reduction's lanes become vector partial sums (``rfactor``), summed across lanes once per row in a
  tree of vector steps (:func:`roller.plan.rows.lane_tree`);
- where a row is not a whole number of vectors, lowering splits the last, partial vector off
  (loop-partition hints) so that the whole vectors stay vectorized; a reduction over such a row runs
  over the row padded to whole vectors (:func:`padded_reductions`).
"""
from __future__ import annotations

from roller.errors import BuildError
from roller.plan.rows import RowPlan, lane_tree
from roller.tir.schedutil import PARTITION_HINT, split_vectors


# Block annotations that mark, until the blocks are placed, partial sums and their lanes (and those over
# a padded row); removed once read.
_LANES, _PADDED = "roller_partial_sum_lanes", "roller_padded_row"


def schedule_rows(func, plan: RowPlan, notes: list[str] | None = None):
    """The ``tvm.s_tir.Schedule`` of ``func`` (the normalized function of
    :func:`roller.tir.analysis.analyze_rows`) following ``plan`` (see the module docstring)."""
    import tvm

    notes = notes if notes is not None else []
    func, padded = padded_reductions(reciprocal_divisions(func, plan.row_axes), plan.vector_reductions,
                                     plan.reduction_cols)
    sch = tvm.s_tir.Schedule(func)
    for name in plan.inlined:
        sch.compute_inline(sch.get_sblock(name))
    rows = plan.row_axes
    # Reductions first, while each block still has its own loop nest (rfactor needs the reduction block
    # to be the first child of its loop; after compute_at it would hoist the partial sums out of the row
    # loop): the columns fused and split into vectors of partial sums.
    for name in plan.reductions:
        block = sch.get_sblock(name)
        cols = sch.get_loops(block)[rows:]
        col = sch.fuse(*cols) if len(cols) > 1 else cols[0]
        if name not in plan.vector_reductions:
            notes.append(f"{name}: the reduction runs scalar (a row of one column, or columns over several "
                         "loops, which padding to whole vectors does not extend)")
            continue
        if int(sch.get(col).extent) % plan.reduction_lanes:  # a predicate compute_at would drop
            notes.append(f"{name}: the reduction runs scalar (not of a form padded_reductions pads)")
            continue
        _, lane = sch.split(col, [None, plan.reduction_lanes])
        # the partial sums keep the default scope: computed at the row loop they become a stack array of
        # one vector (registers after LLVM); a "local" buffer was allocated through
        # TVMBackendAllocWorkspace on every row (docs/design-notes.md#rows-schedule_rows)
        rf = sch.rfactor(lane, factor_axis=plan.reduction_ndim[name])
        sch.annotate(rf, _LANES, plan.reduction_lanes)
        if name in padded:
            sch.annotate(rf, _PADDED, 1)
        _lane_tree(sch, block, plan.reduction_lanes, plan.reduction_ndim[name])
    order = sch.get_child_blocks(sch.get_sblock("root"))
    if rows:
        loops = sch.get_loops(order[-1])
        row = sch.fuse(*loops[:rows]) if rows > 1 else loops[0]
        for block in reversed(order[:-1]):
            sch.compute_at(block, row, preserve_unit_loops=True)
        if plan.parallel:
            sch.parallel(row)
    for block in order:
        stmt = sch.get(block)
        inner = sch.get_loops(block)[1 if rows else 0:]
        if _LANES in stmt.annotations:  # partial sums, or a level of their tree
            lanes, tail = int(stmt.annotations[_LANES]), _PADDED in stmt.annotations
            for key in (_LANES, _PADDED) if tail else (_LANES,):
                sch.unannotate(block, key)
            _vector_partial_sums(sch, block, inner, lanes, stmt.name_hint, tail)
        elif stmt.name_hint in plan.reductions:
            if rows == 0 or stmt.name_hint in plan.vector_reductions:  # a write-back's init above its lanes
                sch.decompose_reduction(block, inner[0])
        elif inner:  # elementwise (per-row blocks have no loop of their own under the row)
            _vectorize_columns(sch, inner, plan.lanes, plan.tail)
    return sch


def _lane_tree(sch, write_back, lanes: int, ndim: int) -> None:
    """The write-back of ``lanes`` partial sums made a tree (:func:`roller.plan.rows.lane_tree`): each step
    another rfactor, a block of half as many partial sums (annotated with its lanes) that folds the upper
    half onto the lower in one vector operation. The scalar chain across the lanes, a dependent operation
    a lane, becomes log2(lanes) vector steps and a last pair."""
    from tvm import tirx

    for half in lane_tree(lanes):
        loop = next(lp for lp, iv in _bound_iter_vars(sch, write_back, sch.get_loops(write_back))
                    if iv is not None and iv.iter_type == tirx.IterVar.CommReduce)
        _, inner = sch.split(loop, [2, half])
        sch.annotate(sch.rfactor(inner, factor_axis=ndim), _LANES, half)


def _bound_iter_vars(sch, block, loops) -> list:
    """(loop, the iter var of ``block`` bound to exactly that loop's variable, or None) for each loop."""
    from tvm import tirx
    from tvm.s_tir.dlight.analysis.common_analysis import get_sblockrealize

    stmt, values = sch.get(block), get_sblockrealize(sch, block).iter_values
    out = []
    for lp in loops:
        var = sch.get(lp).loop_var
        out.append((lp, next((iv for iv, val in zip(stmt.iter_vars, values)
                              if isinstance(val, tirx.Var) and val.same_as(var)), None)))
    return out


def _vector_partial_sums(sch, block, inner, lanes: int, name: str, padded: bool) -> None:
    """The rf block's lanes go innermost and are vectorized; its init goes above the columns' loop. Over a
    ``padded`` row (:func:`padded_reductions`) lowering splits the last vector off."""
    from tvm import tirx

    # the lanes: the loop bound to the rf block's spatial iter var of extent ``lanes`` (compute_at
    # made the loops in iter var order, the split at root the other way round); the columns' vectors:
    # the loop bound to its reduce iter var
    lane = red = None
    for lp, iv in _bound_iter_vars(sch, block, inner):
        if iv is None:
            continue
        if iv.iter_type == tirx.IterVar.CommReduce:
            red = lp
        elif int(iv.dom.extent) == lanes:
            lane = lp
    if lane is None or red is None:
        raise BuildError(f"{name}: no loop of {lanes} lanes and one of vectors among the partial sums' "
                         f"{len(inner)} loops")
    sch.reorder(red, lane)
    sch.vectorize(lane)
    if padded:
        sch.annotate(red, PARTITION_HINT, 1)
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


def padded_reductions(func, names: tuple[str, ...], cols: int):
    """(``func``, the names of the blocks padded): each reduction block in ``names`` whose one reduction
    loop (k, extent n) is shorter than ``cols`` runs over ``cols`` and folds in
    ``if_then_else(likely(k < n), value, identity)``, the identity being what its init stores.

    rfactor over whole vectors then needs no predicate (compute_at would drop one). if_then_else only
    evaluates the branch taken, so the padding reads nothing; the block's declared reads are clamped to
    ``min(k, n - 1)``, the elements it does read. Lowering splits the last vector off the others (the
    partition hint on the loop over vectors): there ``likely`` holds and the whole vectors load as
    vectors. Blocks of another form are left as they are."""
    import tvm
    import tvm_ffi
    from tvm import ir, tirx
    from tvm.s_tir.stmt import SBlock, SBlockRealize

    loops: dict = {}  # loop var -> padded extent
    done: set[str] = set()

    def pad(realize):
        block = realize.block
        red = [i for i, iv in enumerate(block.iter_vars) if iv.iter_type == tirx.IterVar.CommReduce]
        body, init = block.body, block.init
        if block.name_hint not in names or len(red) != 1 or not isinstance(body, tirx.BufferStore) \
                or not isinstance(init, tirx.BufferStore) \
                or not isinstance(init.value, (tirx.FloatImm, tirx.IntImm)):
            return realize
        (r,) = red
        iv, loop = block.iter_vars[r], realize.iter_values[r]
        n = int(iv.dom.extent)
        acc = body.value
        # the combiner: op(self, value) with self the load of what the block stores
        if n >= cols or not isinstance(loop, tirx.Var) or not isinstance(acc, (tirx.Add, tirx.Max, tirx.Min)):
            return realize
        self_load = [x for x in (acc.a, acc.b)
                     if isinstance(x, ir.expr.TensorLoad) and x.source.same_as(body.buffer)
                     and all(tvm_ffi.structural_equal(i, j) for i, j in zip(x.indices, body.indices))]
        if not self_load:
            return realize
        value = acc.b if self_load[0].same_as(acc.a) else acc.a
        k = iv.var

        def clamp(e):
            return tvm_ffi.structural_map(e, [(tirx.Var, lambda v: tirx.min(v, n - 1) if v.same_as(k) else v)])

        folded = tirx.if_then_else(tirx.likely(k < n), value, init.value)
        new_acc = type(acc)(self_load[0], folded)
        reads = [tirx.BufferRegion(br.source, [tvm.ir.Range.from_min_extent(clamp(rg.min), rg.extent)
                                               for rg in br.region]) for br in block.reads]
        iter_vars = list(block.iter_vars)
        iter_vars[r] = tirx.IterVar(tvm.ir.Range(0, cols), k, tirx.IterVar.CommReduce)
        new = SBlock(iter_vars, reads, block.writes, block.name_hint,
                     tirx.BufferStore(body.buffer, new_acc, body.indices), init,
                     block.alloc_buffers, block.match_buffers, block.annotations, block.span)
        loops[loop] = cols
        done.add(block.name_hint)
        return SBlockRealize(realize.iter_values, realize.predicate, new)

    func = tvm_ffi.structural_map(func, [(SBlockRealize, pad)])
    if not loops:
        return func, frozenset()

    def extend(loop):
        if loop.loop_var in loops:
            return tirx.For(loop.loop_var, loop.min, loops[loop.loop_var], loop.kind, loop.body,
                            loop.thread_binding, loop.annotations)
        return loop

    return tvm_ffi.structural_map(func, [(tirx.For, extend)]), frozenset(done)


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
