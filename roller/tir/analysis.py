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
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from roller.errors import UnsupportedExpressionError
from roller.plan.expr import REDUCE, SPATIAL, Axis, Expr, TensorAccess, fuse_axes

# Arithmetic counted by flops_per_point; index arithmetic inside loads is never counted.
_MATH_CALLS = {"exp", "exp2", "exp10", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "tanh", "sigmoid",
               "erf", "pow", "fabs", "floor", "ceil", "round", "trunc", "nearbyint", "sin", "cos", "tan",
               "sinh", "cosh", "asin", "acos", "atan", "atan2", "fmod", "hypot", "copysign", "ldexp"}
_FREE_CALLS = {"if_then_else", "likely", "isnan", "isinf", "isfinite", "reinterpret"}


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
    expr = replace(expr, staged=tuple(t.name for t in expr.inputs if t.name in staged),
                   inlinable=tuple(t.name for t in expr.inputs if t.name in padding),
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


def _describe(sch, blocks: dict, main_name: str, epilogue: str | None, inlined: tuple[str, ...], ctx: str,
              name: str | None):
    """The Expr of the main block (with the epilogue folded in) and the buffer the main block writes."""
    main = sch.get(blocks[main_name])
    bctx = f"{ctx}, block {main_name!r}"
    axes, var_axis = _axes(main)
    store = main.body
    simplify = _simplifier(main)
    inputs: dict[str, TensorAccess] = {}
    for load in _loads(store.value):
        if load.source.same_as(store.buffer):
            continue  # the accumulator: the output, not an input
        _add_input(inputs, _access(load.source, load.indices, var_axis, bctx, simplify), bctx)
    output = _access(store.buffer, store.indices, var_axis, bctx, simplify)
    kinds = {a.name: a.kind for a in axes}
    for d, dim in enumerate(output.index):
        if any(kinds[a] != SPATIAL for a, _ in dim):
            raise UnsupportedExpressionError(f"{bctx}: output {output.name} dimension {d} is indexed by a reduction "
                                             f"axis; write the output with spatial axes only")
    accumulator = output.name
    stages = inlined
    if epilogue is not None:
        output = _fold_epilogue(sch.get(blocks[epilogue]), store, var_axis, inputs, f"{ctx}, block {epilogue!r}")
        stages = stages + (epilogue,)
    neutral = tuple(a.name for a, iv in zip(axes, main.iter_vars)
                    if a.kind == REDUCE and zero_padding_is_neutral(main, [iv.var]))
    expr = Expr(name=name or main_name, axes=axes, inputs=tuple(inputs.values()), output=output,
                flops_per_point=_count_flops(store.value, bctx), block=main_name, epilogue=stages,
                zero_pad_axes=neutral)
    return expr, accumulator


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


# ---------------------------------------------------------------------------------------------
# Axes, accesses, flops

def axis_base_name(var_name: str) -> str:
    """The axis name an iter var gives: its name without the ``v_`` prefix TE puts on iter vars."""
    return var_name[2:] if var_name.startswith("v_") and len(var_name) > 2 else var_name


def _axes(block) -> tuple[tuple[Axis, ...], dict]:
    """The block's iter vars as Axes (``v_`` prefix dropped, duplicates suffixed); var -> axis name map."""
    from tvm import tirx

    axes, var_axis, used = [], {}, set()
    for iv in block.iter_vars:
        base = axis_base_name(str(iv.var.name))
        name, n = base, 1
        while name in used:
            name, n = f"{base}_{n}", n + 1
        used.add(name)
        kind = REDUCE if iv.iter_type == tirx.IterVar.CommReduce else SPATIAL
        axes.append(Axis(name, int(iv.dom.extent), kind))
        var_axis[iv.var] = name
    return tuple(axes), var_axis


def _simplifier(block):
    """Simplifies an index knowing the block's iter var ranges: inlined broadcasts and reshapes leave
    ``(i + 0 + 0) % 16`` over an axis of extent 16, which is plainly ``i``."""
    from tvm import sym

    analyzer = sym.Analyzer()
    for iv in block.iter_vars:
        analyzer.bind(iv.var, iv.dom)
    return analyzer.simplify


def _access(buf, indices, var_axis: dict, bctx: str, simplify=None) -> TensorAccess:
    """The TensorAccess of ``buf[indices]``: per dimension the integer coefficient of each axis.
    An index that is not affine as written is retried after ``simplify`` (from :func:`_simplifier`),
    which removes what the axes' ranges make trivial; affine indices are kept as written (simplifying
    would drop axes of extent 1 from them)."""
    from tvm import sym, tirx

    variables = list(var_axis)
    index = []
    for d, idx in enumerate(indices):
        if simplify is not None and isinstance(idx, tirx.Expr) and not _affine(idx, variables):
            idx = simplify(idx)
        where = f"{bctx}: buffer {buf.name} dimension {d} index {idx}"
        if not isinstance(idx, tirx.Expr) or isinstance(idx, (tirx.Ramp, tirx.Broadcast)):
            raise UnsupportedExpressionError(f"{where} is a vector or opaque index; pass an unscheduled function")
        if _contains_load(idx):
            raise UnsupportedExpressionError(f"{where} depends on loaded data (a gather); roller needs indices that are "
                                             f"affine in the loop axes: compute it with a library kernel instead")
        coeffs = list(sym.detect_linear_equation(idx, variables))
        if not coeffs or not all(isinstance(c, tirx.IntImm) for c in coeffs):
            raise UnsupportedExpressionError(f"{where} is not affine in the block's axes (roller needs "
                                             f"sum(integer * axis) + integer; products of axes, division, modulo and "
                                             f"symbolic strides are not): rewrite the operator with affine indices")
        index.append(tuple((var_axis[v], int(c)) for v, c in zip(variables, coeffs[:-1]) if int(c) != 0))
    return TensorAccess(str(buf.name), tuple(int(s) for s in buf.shape), str(buf.dtype), tuple(index))


def _affine(idx, variables) -> bool:
    from tvm import sym, tirx

    coeffs = list(sym.detect_linear_equation(idx, variables))
    return bool(coeffs) and all(isinstance(c, tirx.IntImm) for c in coeffs)


def _add_input(inputs: dict, access: TensorAccess, bctx: str) -> None:
    old = inputs.get(access.name)
    if old is None:
        inputs[access.name] = access
    elif old.index != access.index:
        raise UnsupportedExpressionError(f"{bctx}: buffer {access.name} is read with two different access patterns "
                                         f"({old.index} and {access.index}); roller needs one per tensor")


def _fold_epilogue(epi, store, var_axis: dict, inputs: dict, ectx: str) -> TensorAccess:
    """Maps the epilogue block's accesses onto the main block's axes; adds its extra inputs; returns
    the epilogue's output access. The epilogue must be elementwise over the main block's output."""
    from tvm import tirx

    acc = store.buffer
    out_axes = []  # per dimension of the accumulator: the main axis indexing it
    for idx in store.indices:
        if not isinstance(idx, tirx.Var) or idx not in var_axis:
            raise UnsupportedExpressionError(f"{ectx}: the main block writes {acc.name} at {list(store.indices)}, not at "
                                             f"plain axes; an epilogue needs a plainly indexed output")
        out_axes.append(var_axis[idx])
    epi_map = None
    loads = list(_loads(epi.body.value))
    for load in loads:
        if load.source.same_as(acc):
            if not all(isinstance(i, tirx.Var) for i in load.indices):
                raise UnsupportedExpressionError(f"{ectx}: reads {acc.name} at {list(load.indices)}, not elementwise; "
                                                 f"roller fuses elementwise epilogues only")
            this = dict(zip(load.indices, out_axes))
            if epi_map is not None and epi_map != this:
                raise UnsupportedExpressionError(f"{ectx}: reads {acc.name} with two access patterns")
            epi_map = this
    if epi_map is None:
        raise UnsupportedExpressionError(f"{ectx}: does not read the main block's output {acc.name}")
    for iv in epi.iter_vars:
        if iv.var not in epi_map:
            raise UnsupportedExpressionError(f"{ectx}: axis {iv.var} does not index {acc.name}; the epilogue must be "
                                             f"elementwise over the main block's output")
    simplify = _simplifier(epi)
    for load in loads:
        if not load.source.same_as(acc):
            _add_input(inputs, _access(load.source, load.indices, epi_map, ectx, simplify), ectx)
    out = _access(epi.body.buffer, epi.body.indices, epi_map, ectx, simplify)
    if out.shape != tuple(int(s) for s in acc.shape) or out.index != tuple(((a, 1),) for a in out_axes):
        raise UnsupportedExpressionError(f"{ectx}: writes {out.name} in another layout than {acc.name}; roller fuses "
                                         f"elementwise epilogues only")
    return out


def _call_name(call) -> str:
    return str(call.op.name).rsplit(".", 1)[-1] if hasattr(call.op, "name") else ""


def _walk(expr, visit) -> None:
    """Pre-order walk over a tirx expression; ``visit`` returns False to skip the children."""
    from tvm import ir, tirx

    if not visit(expr):
        return
    if isinstance(expr, ir.expr.TensorLoad):
        children = list(expr.indices)
    elif isinstance(expr, ir.expr.Call):
        children = list(expr.args)
    elif isinstance(expr, tirx.Select):
        children = [expr.condition, expr.true_value, expr.false_value]
    elif isinstance(expr, tirx.Cast):
        children = [expr.value]
    elif isinstance(expr, tirx.Not):
        children = [expr.a]
    elif isinstance(expr, tirx.Let):
        children = [expr.value, expr.body]
    elif hasattr(expr, "a") and hasattr(expr, "b"):
        children = [expr.a, expr.b]
    else:
        children = []
    for c in children:
        _walk(c, visit)


def _loads(expr) -> list:
    from tvm import ir

    out = []

    def visit(e):
        if isinstance(e, ir.expr.TensorLoad):
            out.append(e)
            return False
        return True

    _walk(expr, visit)
    return out


def _contains_load(expr) -> bool:
    return bool(_loads(expr))


_ARITH = ("Add", "Sub", "Mul", "Div", "FloorDiv", "FloorMod", "Mod", "Max", "Min",
          "LShift", "RShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot")  # TVM's fast_exp shifts
_NEUTRAL = ("Cast", "Var", "IntImm", "FloatImm", "StringImm", "Select", "EQ", "NE", "LT", "LE", "GT", "GE",
            "And", "Or", "Not", "Let")


def _count_flops(expr, bctx: str) -> int:
    """Arithmetic operations in a store's value (data arithmetic only: loads' indices are skipped)."""
    from tvm import ir

    count = [0]

    def visit(e):
        if isinstance(e, ir.expr.TensorLoad):
            return False
        kind = type(e).__name__
        if kind in _ARITH:
            count[0] += 1
        elif isinstance(e, ir.expr.Call):
            op = _call_name(e)
            if op == "fma":
                count[0] += 2
            elif op in _MATH_CALLS:
                count[0] += 1
            elif op not in _FREE_CALLS:
                raise UnsupportedExpressionError(f"{bctx}: calls {e.op.name}, an opaque function roller cannot "
                                                 f"analyse; express the computation with arithmetic and math intrinsics")
        elif kind not in _NEUTRAL:
            raise UnsupportedExpressionError(f"{bctx}: unsupported {kind} node in the computed value")
        return True

    _walk(expr, visit)
    return count[0]


def zero_padding_is_neutral(block, reduce_vars) -> bool:
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
    sch = s_tir.Schedule(tvm.IRModule({"main": prim}))
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


def analyze_fused(func) -> tuple[Expr, Any]:
    """(Expr with its axes fused where they can be, normalized PrimFunc) of a TVM PrimFunc / IRModule / list of
    TE tensors: what construction and code generation take."""
    found = analyze(func)
    return fuse_axes(found.expr), found.func
