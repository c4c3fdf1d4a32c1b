"""Row-function analysis: softmax, layer norm and other row-wise functions with several reductions.

:func:`analyze_rows` describes such a function as a :class:`roller.plan.rows.RowFunction`, one Expr per
block (built as :func:`roller.tir.analysis.analyze` builds its one), where ``analyze`` accepts a single
reduction only.
"""
from __future__ import annotations

from roller.errors import UnsupportedExpressionError
from roller.tir.accesses import _count_flops, _describe
from roller.tir.normalize import (_check_block_form, _check_static_shapes, _narrow_indices, _to_prim_func,
                                  _writes_param)

# ---------------------------------------------------------------------------------------------
# Row-wise functions with several reductions (softmax, layer norm): one Expr per block

def analyze_rows(func):
    """(:class:`roller.plan.rows.RowFunction`, the normalized PrimFunc its block names refer to) for a function
    whose blocks all run row by row: every block's leading spatial axes are the same rows (extents equal
    to the reduction's), a reduction reduces only the axes after them, an elementwise block runs over
    the rows and one row's columns, a per-row block over the rows only; the last block is elementwise and
    writes the output. Elementwise blocks independent of the rows (a weight's cast) are inlined into
    their readers. Raises UnsupportedExpressionError naming what does not fit."""
    import math

    import tvm
    from tvm import s_tir
    from tvm.s_tir.dlight import normalize_prim_func

    from roller.plan.rows import PROLOGUE, RowBlock, RowFunction

    prim, fname = _to_prim_func(func)
    ctx = f"function {fname!r}"
    _check_static_shapes(prim, ctx)
    sch = s_tir.Schedule(tvm.IRModule({"main": _narrow_indices(prim)}))
    for _ in range(2):  # a second pass after inlining the blocks independent of the rows
        infos = normalize_prim_func(sch)
        if infos is None:
            raise UnsupportedExpressionError(f"{ctx}: blocks are not in a normal form (opaque or nested blocks)")
        for info in infos:
            _check_block_form(sch.get(info.block_rv), ctx)
        row_ext, cols, kinds = _row_kinds(sch, infos, ctx)
        # inlined first: blocks independent of the rows, and casts and copies (two of them may write
        # buffers of one name, which the per-block Exprs below could not tell apart)
        prologue = [i.block_rv for i, k in zip(infos, kinds)
                    if k == PROLOGUE or (i.is_injective() and not _writes_param(sch, sch.get(i.block_rv))
                                         and _count_flops(sch.get(i.block_rv).body.value, ctx) == 0)]
        if not prologue:
            break
        for rv in prologue:
            sch.compute_inline(rv)
    names = {sch.get(i.block_rv).name_hint: i.block_rv for i in infos}
    blocks = []
    for info, kind in zip(infos, kinds):
        block = sch.get(info.block_rv)
        expr, _ = _describe(sch, names, block.name_hint, None, (), ctx, None)
        blocks.append(RowBlock(name=block.name_hint, kind=kind, expr=expr,
                               readers=len(sch.get_consumers(info.block_rv)),
                               output_ndim=len(block.body.buffer.shape), writes_output=_writes_param(sch, block)))
    params = sum(math.prod(int(d) for d in p.shape) * p.dtype.bits // 8 for p in prim.params)
    fn = RowFunction(name=fname, row_axes=len(row_ext), rows=math.prod(row_ext), cols=cols,
                     dtype=str(sch.get(infos[-1].block_rv).body.buffer.dtype), blocks=tuple(blocks),
                     params_bytes=params)
    return fn, sch.mod["main"]


def _row_kinds(sch, infos, ctx: str) -> tuple[list[int], int, list[str]]:
    """(row extents, columns per row, each block's kind) of a row-wise function (see analyze_rows)."""
    import math

    from roller.plan.rows import ELEMENTWISE, PER_ROW, PROLOGUE, REDUCTION

    reductions = [i for i in infos if not i.is_injective()]
    if not reductions or len(infos) < 2:
        raise UnsupportedExpressionError(f"{ctx}: not a row-wise function: it needs a reduction and a block "
                                         f"after it ({len(infos)} blocks, {len(reductions)} reductions)")
    last = sch.get(infos[-1].block_rv)
    if not infos[-1].is_injective() or not _writes_param(sch, last):
        raise UnsupportedExpressionError(f"{ctx}: the last block {last.name_hint!r} must be elementwise and write "
                                         f"the output")
    lead = reductions[0].dom_kind()
    row_ext = [int(it.dom) for it in reductions[0].iters][:len(lead) - len(lead.lstrip("S"))]
    if math.prod(row_ext) == 1:
        row_ext = []  # one row: its unit axes are columns of extent 1 (normalization drops some, not all)
    last_ext = [int(it.dom) for it in infos[-1].iters]
    nrow = len(row_ext)
    if last_ext[:nrow] != row_ext:
        raise UnsupportedExpressionError(f"{ctx}: the reduction {reductions[0].name!r} runs over rows "
                                         f"{row_ext}, not the leading axes of the last block {last_ext}")
    cols = math.prod(last_ext[nrow:])
    kinds = []
    for info in infos:
        block = sch.get(info.block_rv)
        dom, ext = info.dom_kind(), [int(it.dom) for it in info.iters]
        rest, n = dom[nrow:], math.prod(ext[nrow:])
        if not nrow:  # unit spatial axes ahead of a one-row reduction's columns
            rest = "".join(k for k, e in zip(dom, ext) if e > 1)
        if ext[:nrow] != row_ext or dom[:nrow] != "S" * nrow:
            if not info.is_injective() or _writes_param(sch, block):
                raise UnsupportedExpressionError(f"{ctx}, block {block.name_hint!r}: its leading axes {ext[:nrow]} "
                                                 f"({dom}) are not the rows {row_ext}")
            kinds.append(PROLOGUE)  # independent of the rows (a weight's cast)
        elif not rest:
            kinds.append(PER_ROW)
        elif rest == "S" * len(rest) and n == cols:
            kinds.append(ELEMENTWISE)
        elif rest == "R" * len(rest) and n == cols:
            kinds.append(REDUCTION)
        else:
            raise UnsupportedExpressionError(f"{ctx}, block {block.name_hint!r}: runs over {ext[nrow:]} ({rest}) "
                                             f"after the rows, not one row of {cols} columns")
    return row_ext, cols, kinds
