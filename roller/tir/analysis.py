"""Expression analysis: a TVM PrimFunc becomes a :class:`roller.plan.expr.Expr` (axes, affine accesses, flops).

``analyze`` first normalizes the function with ``tvm.s_tir.Schedule``:

- injective producers of the main block (casts, scales, transposes) are ``compute_inline``-d into it;
  a producer with a conditional in its body (zero padding, ``pad_temp``) stays its own block, and code
  generation decides where to compute it;
- elementwise consumers (bias add, ReLU, casts) are merged into ONE epilogue block. TVM cannot inline a
  consumer into a reduction block (the block updates its output in place), so for a reduction the
  epilogue stays a separate block that code generation computes at the output tile
  (``reverse_compute_at``, or ``reverse_compute_inline`` into a ``cache_write`` block). Without a
  reduction (add + ReLU) everything collapses into one block.

The Expr describes the fused operator: its axes are the main block's iter vars, its inputs every buffer
the main block reads plus the epilogue's extra inputs (a bias), and its output the function's output
(the epilogue's buffer when there is one, the main block's otherwise); ``Expr.block`` names the main
block in ``Analysis.func``, which is all code generation needs. ``Analysis`` also records the other
blocks and the intermediate buffer, for reports and tests.

Axis fusion is not applied here (it is ``roller.plan.expr.fuse_axes``, the policy's choice).

The parts live in their own modules: the input checks and the normalization in :mod:`roller.tir.normalize`,
the axes, accesses and flops of a block in :mod:`roller.tir.accesses`, and row-wise functions with several
reductions (:func:`analyze_rows`) in :mod:`roller.tir.rowwise`; this module puts them together.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from roller.errors import UnsupportedExpressionError
from roller.plan.expr import Expr, fuse_axes
from roller.tir.accesses import _describe
from roller.tir.accesses import axis_base_name as axis_base_name  # re-exported: its callers import it from here
from roller.tir.accesses import zero_padding_is_neutral as zero_padding_is_neutral  # re-exported, as above
from roller.tir.normalize import (_check_block_form, _check_static_shapes, _classify_rest, _gathers, _inline,
                                  _is_reduction, _main_without_reduction, _narrow_indices, _to_prim_func)
from roller.tir.rowwise import analyze_rows as analyze_rows  # re-exported, as above


@dataclass(frozen=True)
class Analysis:
    """The result of :func:`analyze`.

    ``func`` is the normalized PrimFunc code generation schedules (``expr.block`` names its main block).
    ``epilogue_block`` is the block applying the elementwise epilogue to the main block's output
    (``accumulator``, an intermediate buffer) and writing ``expr.output``; None when there is none, and
    then ``accumulator == expr.output.name``. ``producer_blocks`` are producers kept as their own
    blocks (padding). ``inlined`` names the stages that were inlined away; ``expr.epilogue`` lists
    them followed by the epilogue block, for reports. ``iter_vars`` pairs each axis with the iter var
    it came from (axis names drop the ``v_`` prefix TE gives iter vars, and are made unique).
    """

    expr: Expr
    func: object  # tvm.tirx.PrimFunc
    epilogue_block: str | None = None
    accumulator: str = ""
    producer_blocks: tuple[str, ...] = ()
    inlined: tuple[str, ...] = ()
    iter_vars: tuple[tuple[str, str], ...] = ()  # (axis name, the main block's iter var name), axis order


def analyze(func, name: str | None = None) -> Analysis:
    """Analyses ``func``: a PrimFunc, an IRModule holding one PrimFunc, or a list of TE tensors.

    ``name`` becomes ``Expr.name`` (default: the main block's name). Raises UnsupportedExpressionError
    for several reductions, symbolic shapes, non-affine or data-dependent indices, opaque blocks.
    """
    import tvm
    from tvm import s_tir

    prim, fname = _to_prim_func(func)
    ctx = f"function {fname!r}"
    _check_static_shapes(prim, ctx)
    prim = _narrow_indices(prim)
    if not isinstance(prim.body, s_tir.SBlockRealize):
        raise UnsupportedExpressionError(f"{ctx}: the body is not a root block (the function is already lowered "
                                         f"or not a TensorIR function): pass the unscheduled PrimFunc")
    sch = s_tir.Schedule(tvm.IRModule({"main": prim}))
    root = sch.get_sblock(prim.body.block.name_hint)
    if not sch.get_child_blocks(root):
        raise UnsupportedExpressionError(f"{ctx}: no computation block under the root block "
                                         f"{prim.body.block.name_hint!r} (no block at all, or opaque code): pass a "
                                         f"function built with te.create_prim_func or TVMScript blocks")
    for b in sch.get_child_blocks(root):
        _check_block_form(sch.get(b), ctx)

    reductions = [sch.get(b).name_hint for b in sch.get_child_blocks(root) if _is_reduction(sch.get(b))]
    if len(reductions) > 1:
        raise UnsupportedExpressionError(
            f"{ctx}: {len(reductions)} reduction blocks ({', '.join(reductions)}); roller handles one reduction per "
            f"operator (softmax and layer norm need several): split the function into one PrimFunc per reduction")
    main_name = reductions[0] if reductions else None
    inlined = _inline(sch, root, main_name)

    blocks = {sch.get(b).name_hint: b for b in sch.get_child_blocks(root)}
    if main_name is None:
        main_name = _main_without_reduction(sch, blocks, ctx)
    producers, epilogue = _classify_rest(sch, blocks, main_name, ctx)

    expr, accumulator = _describe(sch, blocks, main_name, epilogue, inlined, ctx, name)
    staged = {w.source.name for p in producers for w in sch.get(blocks[p]).writes}
    padding = {w.source.name for p in producers for w in sch.get(blocks[p]).writes
               if not _gathers(sch.get(blocks[p])) and not sch.get_producers(blocks[p])}
    widths = {}
    for p in producers:
        block = sch.get(blocks[p])
        if block.writes[0].source.name in padding and (w := _pad_widths(block)) is not None:
            widths[block.writes[0].source.name] = w
    expr = replace(expr, staged=tuple(t.name for t in expr.inputs if t.name in staged),
                   inlinable=tuple(t.name for t in expr.inputs if t.name in padding),
                   pad_widths=tuple((t.name, widths[t.name]) for t in expr.inputs if t.name in widths),
                   repeats=_repeats(sch, blocks, producers, {t.name for t in expr.inputs}))
    ivs = sch.get(blocks[main_name]).iter_vars
    return Analysis(expr=expr, func=sch.mod["main"], epilogue_block=epilogue, accumulator=accumulator,
                    producer_blocks=producers, inlined=inlined,
                    iter_vars=tuple((a.name, str(iv.var.name)) for a, iv in zip(expr.axes, ivs)))


def _repeats(sch, blocks: dict, producers: tuple[str, ...], inputs: set[str]) -> tuple[tuple[str, int], ...]:
    """(input, repeat) for the kept producers annotated with ``roller.tir.ops.LANE_RUN``: each element they read
    is written that many times (a grouped convolution's group_rep)."""
    from roller.tir.ops import LANE_RUN

    out = []
    for p in producers:
        block = sch.get(blocks[p])
        run = int(block.annotations.get(LANE_RUN, 1))
        out += [(w.source.name, run) for w in block.writes if run > 1 and w.source.name in inputs]
    return tuple(out)


def analyze_fused(func) -> tuple[Expr, Any]:
    """(Expr with its axes fused where they can be, normalized PrimFunc) of a TVM PrimFunc / IRModule / list of
    TE tensors: what construction and code generation take."""
    found = analyze(func)
    return fuse_axes(found.expr), found.func


def _pad_widths(block) -> tuple[tuple[int, int], ...] | None:
    """The zero padding a padding stage adds per dimension, (before, after): where it writes element ``i`` from
    its one source's element ``i - before``; None for a stage of another form."""
    from tvm import sym, tirx

    if len(block.reads) != 1 or len(block.writes) != 1:
        return None
    src, out = block.reads[0], block.writes[0]
    if len(src.region) != len(out.region):
        return None
    analyzer = sym.Analyzer()
    widths = []
    for r, w, n_src, n_out in zip(src.region, out.region, src.source.shape, out.source.shape):
        before = analyzer.simplify(w.min - r.min)
        if not isinstance(before, tirx.IntImm):
            return None
        widths.append((int(before), int(n_out) - int(n_src) - int(before)))
    return tuple(widths)
