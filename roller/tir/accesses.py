"""Access-map extraction: a normalized block's iter vars become Axes, its loads and store affine TensorAccesses.

What :func:`roller.tir.analysis.analyze` and :func:`roller.tir.rowwise.analyze_rows` share once the function is
normalized: ``_describe`` builds a block's Expr (with an elementwise epilogue folded in), from the axes,
accesses and flop count computed here, and ``zero_padding_is_neutral`` tells code generation whether a
reduction axis may be padded with zeros. Helpers walk tirx expressions without TVM's visitors.
"""
from __future__ import annotations

from roller.errors import UnsupportedExpressionError
from roller.plan.expr import REDUCE, SPATIAL, Axis, Expr, TensorAccess

# Arithmetic counted by flops_per_point; index arithmetic inside loads is never counted.
_MATH_CALLS = {"exp", "exp2", "exp10", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "tanh", "sigmoid",
               "erf", "pow", "fabs", "floor", "ceil", "round", "trunc", "nearbyint", "sin", "cos", "tan",
               "sinh", "cosh", "asin", "acos", "atan", "atan2", "fmod", "hypot", "copysign", "ldexp"}
_FREE_CALLS = {"if_then_else", "likely", "isnan", "isinf", "isfinite", "reinterpret"}

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
    epilogue_ops = 0
    if epilogue is not None:
        ectx = f"{ctx}, block {epilogue!r}"
        output = _fold_epilogue(sch.get(blocks[epilogue]), store, var_axis, inputs, ectx)
        epilogue_ops = _count_flops(sch.get(blocks[epilogue]).body.value, ectx)
        stages = stages + (epilogue,)
    neutral = tuple(a.name for a, iv in zip(axes, main.iter_vars)
                    if a.kind == REDUCE and zero_padding_is_neutral(main, [iv.var]))
    expr = Expr(name=name or main_name, axes=axes, inputs=tuple(inputs.values()), output=output,
                flops_per_point=_count_flops(store.value, bctx), block=main_name, epilogue=stages,
                zero_pad_axes=neutral, accumulates=str(store.buffer.dtype), epilogue_ops=epilogue_ops)
    return expr, accumulator

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
    the epilogue's output access. The epilogue must be elementwise over the main block's output, which
    the main block may write at affine indices of its axes (a grouped convolution's g * K/groups + j):
    each epilogue axis then stands for the index the main block writes that dimension at."""
    from tvm import tirx

    acc = store.buffer
    stored = _access(acc, store.indices, var_axis, ectx)
    loads = list(_loads(epi.body.value))
    dim_of = None  # epilogue iter var -> the accumulator dimension it indexes
    for load in loads:
        if load.source.same_as(acc):
            if not all(isinstance(i, tirx.Var) for i in load.indices):
                raise UnsupportedExpressionError(f"{ectx}: reads {acc.name} at {list(load.indices)}, not elementwise; "
                                                 f"roller fuses elementwise epilogues only")
            this = {v: d for d, v in enumerate(load.indices)}
            if dim_of is not None and dim_of != this:
                raise UnsupportedExpressionError(f"{ectx}: reads {acc.name} with two access patterns")
            dim_of = this
    if dim_of is None:
        raise UnsupportedExpressionError(f"{ectx}: does not read the main block's output {acc.name}")
    for iv in epi.iter_vars:
        if iv.var not in dim_of:
            raise UnsupportedExpressionError(f"{ectx}: axis {iv.var} does not index {acc.name}; the epilogue must be "
                                             f"elementwise over the main block's output")
    simplify = _simplifier(epi)
    names = {v: str(d) for v, d in dim_of.items()}

    def mapped(buf, indices) -> TensorAccess:
        """The access in the epilogue's axes, each replaced by the main block's index of its dimension."""
        seen = _access(buf, indices, names, ectx, simplify)
        index = []
        for dim in seen.index:
            coeff: dict[str, int] = {}
            for d, c in dim:
                for a, c2 in stored.index[int(d)]:
                    coeff[a] = coeff.get(a, 0) + c * c2
            index.append(tuple((a, c) for a, c in coeff.items() if c))
        return TensorAccess(seen.name, seen.shape, seen.dtype, tuple(index))

    for load in loads:
        if not load.source.same_as(acc):
            _add_input(inputs, mapped(load.source, load.indices), ectx)
    out = mapped(epi.body.buffer, epi.body.indices)
    if out.shape != stored.shape or out.index != stored.index:
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
    """Arithmetic operations in a store's value (data arithmetic only: loads' indices are skipped), each
    distinct subexpression once, as the compiler computes it (TVM's fast exp writes ``clamp(x)`` and
    ``floor(...)`` a dozen times over: 95 operations as written, ~25 computed)."""
    import tvm_ffi
    from tvm import ir

    count = [0]
    seen: dict[int, list] = {}

    def visit(e):
        if isinstance(e, ir.expr.TensorLoad):
            return False
        kind = type(e).__name__
        if kind in _ARITH or isinstance(e, ir.expr.Call):
            same = seen.setdefault(tvm_ffi.structural_hash(e), [])
            if any(tvm_ffi.structural_equal(e, o) for o in same):
                return False  # computed once already, with everything below it
            same.append(e)
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
        return any(uses_var(i, var) for i in e.indices)
    if isinstance(e, tirx.Cast):
        return _zero_if_padded(e.value, var)
    if isinstance(e, tirx.Mul):
        return _zero_if_padded(e.a, var) or _zero_if_padded(e.b, var)
    if isinstance(e, (tirx.Add, tirx.Sub)):
        return _zero_if_padded(e.a, var) and _zero_if_padded(e.b, var)
    return False


def uses_var(index, var) -> bool:
    """Whether the expression ``index`` reads the variable ``var``."""
    from tvm import tirx

    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(index))
