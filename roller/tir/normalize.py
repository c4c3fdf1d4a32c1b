"""PrimFunc normalization: the input checks and the schedule primitives that bring a function to one main block.

:func:`roller.tir.analysis.analyze` (and, for its checks, :func:`roller.tir.rowwise.analyze_rows`) take a
PrimFunc, IRModule or TE tensors through ``_to_prim_func`` and the static-shape and block-form checks, then
``_inline`` injective stages and ``_classify_rest`` the blocks left into kept producers (padding, layout
gathers) and at most one epilogue. The module docstring of :mod:`roller.tir.analysis` describes the rules.
"""
from __future__ import annotations

from roller.errors import UnsupportedExpressionError
from roller.tir.accesses import _call_name, _simplifier, _walk

# ---------------------------------------------------------------------------------------------
# Input normalization and checks

def _to_prim_func(func):
    """(PrimFunc, its name for messages)."""
    import tvm
    from tvm import te, tirx

    if isinstance(func, (list, tuple)) and func and all(isinstance(t, te.Tensor) for t in func):
        func = te.create_prim_func(list(func))
    if isinstance(func, tirx.PrimFunc):
        attrs = func.attrs
        return func, str(attrs["global_symbol"]) if attrs is not None and "global_symbol" in attrs else "main"
    if isinstance(func, tvm.IRModule):
        prims = [(gv.name_hint, f) for gv, f in func.functions.items() if isinstance(f, tirx.PrimFunc)]
        if len(prims) != 1:
            names = ", ".join(n for n, _ in prims) or "none"
            raise UnsupportedExpressionError(f"the IRModule holds {len(prims)} PrimFuncs ({names}); pass exactly one "
                                             f"(mod[name])")
        return prims[0][1], prims[0][0]
    raise UnsupportedExpressionError(f"cannot analyse a {type(func).__name__}: pass a tvm.tirx.PrimFunc, an IRModule "
                                     f"with one PrimFunc, or a list of TE tensors (arguments then outputs)")


def _narrow_indices(prim):
    """``prim`` with its index arithmetic in int32 (``tirx.transform.ForceNarrowIndexToInt32``) where every
    extent fits and no parameter holds int64 data (else the function as it is). Relax
    legalizes with int64 shapes, and with int64 indices LLVM kept the tail predicates of a padded tile
    inside its vector loops: ViT's 197 x 197 attention scores ran 14.7 ms against 0.56 ms in int32."""
    import tvm
    from tvm import tirx

    if any(str(getattr(p, "dtype", "")) in ("int64", "uint64") for p in prim.params):
        return prim  # (the pass refuses int64 data buffers)
    try:
        return tirx.transform.ForceNarrowIndexToInt32()(tvm.IRModule({"main": prim}))["main"]
    except tvm.error.TVMError:  # an extent or a buffer it cannot narrow: int64 stays correct
        return prim


def _const_shape(buf) -> bool:
    from tvm import tirx

    return all(isinstance(s, tirx.IntImm) for s in buf.shape)


def _check_static_shapes(prim, ctx: str) -> None:
    from tvm import tirx

    for p in prim.params:
        if not isinstance(getattr(p, "ty", None), tirx.buffer.BufferType):
            raise UnsupportedExpressionError(f"{ctx}: parameter {p} is a scalar, not a buffer; roller builds kernels for "
                                             f"fixed shapes and values: bind it first (func.specialize)")
        if not _const_shape(p):
            raise UnsupportedExpressionError(
                f"{ctx}: buffer {p.name} has a symbolic shape {list(p.shape)}; roller builds kernels for static shapes: "
                f"bind the variables first, e.g. func.specialize({{var: 1024}})")


def _check_block_form(block, ctx: str) -> None:
    """Every block must be one buffer store under data-parallel / reduction iter vars."""
    from tvm import tirx

    bctx = f"{ctx}, block {block.name_hint!r}"
    if not isinstance(block.body, tirx.BufferStore):
        raise UnsupportedExpressionError(f"{bctx}: the body is a {type(block.body).__name__}, not a single buffer "
                                         f"store (nested loops or blocks, or an opaque block): pass an unscheduled "
                                         f"function with one store per block")
    if block.match_buffers or block.alloc_buffers:
        raise UnsupportedExpressionError(f"{bctx}: match_buffer / alloc_buffer inside a block is not supported")
    for iv in block.iter_vars:
        if iv.iter_type not in (tirx.IterVar.DataPar, tirx.IterVar.CommReduce):
            raise UnsupportedExpressionError(f"{bctx}: iter var {iv.var} is neither spatial nor reduction "
                                             f"(opaque or ordered); roller needs spatial/reduction axes")
        if not isinstance(iv.dom.extent, tirx.IntImm) or not isinstance(iv.dom.min, tirx.IntImm):
            raise UnsupportedExpressionError(f"{bctx}: iter var {iv.var} has a symbolic range {iv.dom}; "
                                             f"bind the shape variables first (func.specialize)")
    for buf in [block.body.buffer] + [r.source for r in block.reads]:
        if not _const_shape(buf):
            raise UnsupportedExpressionError(f"{bctx}: buffer {buf.name} has a symbolic shape {list(buf.shape)}; "
                                             f"bind the shape variables first (func.specialize)")


def _is_reduction(block) -> bool:
    from tvm import tirx

    return any(iv.iter_type == tirx.IterVar.CommReduce for iv in block.iter_vars)


def _has_conditional(expr) -> bool:
    """Whether the value computes a select / if_then_else (padding); loads' indices are not searched."""
    from tvm import ir, tirx

    found = []

    def visit(e):
        if isinstance(e, tirx.Select) or (isinstance(e, ir.expr.Call) and _call_name(e) == "if_then_else"):
            found.append(e)
        return not isinstance(e, ir.expr.TensorLoad)

    _walk(expr, visit)
    return bool(found)


# ---------------------------------------------------------------------------------------------
# Normalization with schedule primitives

def _inline(sch, root, main_name: str | None) -> tuple[str, ...]:
    """Inlines injective stages until none applies; returns their names in order.

    A padding producer (conditional in its body, writing an intermediate buffer) is kept. A consumer is
    never reverse-inlined into the reduction block (TVM forbids it); consumer chains are merged into
    their last stage with compute_inline instead.
    """
    from tvm.s_tir import ScheduleError

    main_rv = sch.get_sblock(main_name) if main_name else None
    inlined: list[str] = []
    changed = True
    while changed:
        changed = False
        for rv in sch.get_child_blocks(root):
            block = sch.get(rv)
            name = block.name_hint
            if name == main_name or _is_reduction(block):
                continue
            if ((_has_conditional(block.body.value) or _gathers(block)) and not _writes_param(sch, block)
                    and (main_rv is None or name in _upstream(sch, main_rv))):
                continue  # padding, or a layout gather: code generation places it
            try:
                sch.compute_inline(rv)
            except ScheduleError:  # not applicable (an output block, or a consumer it cannot inline into)
                producers = [sch.get(p) for p in sch.get_producers(rv)]
                if not producers or any(_is_reduction(p) for p in producers):
                    continue
                try:
                    sch.reverse_compute_inline(rv)
                except ScheduleError:
                    continue
            inlined.append(name)
            changed = True
            break
    return tuple(inlined)


def _writes_param(sch, block) -> bool:
    params = sch.mod["main"].params
    return any(p.same_as(block.body.buffer) for p in params)


def _main_without_reduction(sch, blocks: dict, ctx: str) -> str:
    outputs = [n for n, rv in blocks.items() if _writes_param(sch, sch.get(rv))]
    if len(outputs) != 1:
        raise UnsupportedExpressionError(
            f"{ctx}: after inlining, {len(outputs)} blocks write function outputs ({', '.join(outputs) or 'none'}); "
            f"roller handles one output per operator: split the function")
    return outputs[0]


def _upstream(sch, rv) -> set[str]:
    seen: set[str] = set()
    todo = list(sch.get_producers(rv))
    while todo:
        p = todo.pop()
        name = sch.get(p).name_hint
        if name not in seen:
            seen.add(name)
            todo.extend(sch.get_producers(p))
    return seen


def _classify_rest(sch, blocks: dict, main_name: str, ctx: str) -> tuple[tuple[str, ...], str | None]:
    """Splits the blocks besides the main one into kept producers and at most one epilogue."""
    main_rv = blocks[main_name]
    upstream = _upstream(sch, main_rv)
    producers = tuple(n for n in blocks if n in upstream)
    rest = [n for n in blocks if n != main_name and n not in upstream]
    if not rest:
        return producers, None
    consumers = [sch.get(c).name_hint for c in sch.get_consumers(main_rv)]
    if len(rest) > 1 or rest[0] not in consumers:
        raise UnsupportedExpressionError(
            f"{ctx}: blocks {', '.join(rest)} are left after inlining besides the main block {main_name!r}; roller "
            f"supports a main block, padding producers and one elementwise epilogue: split the function")
    return producers, rest[0]


def _gathers(block) -> bool:
    """Whether the block loads at an index that stays divided or remaindered once its iter vars' ranges
    simplify it (a layout change, e.g. a grouped convolution's input channels replicated per output
    channel; a reshape's ``(i * 16 + j) // 16`` simplifies to ``i`` and is not one): inlined, that index
    would reach the main block and make it non-affine."""
    from tvm import ir, tirx

    divided = (tirx.FloorDiv, tirx.FloorMod, tirx.Div, tirx.Mod)
    simplify = _simplifier(block)
    found = []

    def in_index(e):
        if isinstance(e, divided):
            found.append(e)
        return True

    def visit(e):
        if isinstance(e, ir.expr.TensorLoad):
            for i in e.indices:
                _walk(simplify(i), in_index)
        return True

    _walk(block.body.value, visit)
    return bool(found)
