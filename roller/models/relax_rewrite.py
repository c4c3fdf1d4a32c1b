"""What roller's Relax rewrites share: running a ``PyExprMutator`` over every Relax function of a module, a
Relax tensor type's static shape, the operator a call names and the expression a variable is bound to."""
from __future__ import annotations


def mutate_functions(mutator, mod):
    """The module ``mutator`` (a ``PyExprMutator`` built on ``mod``, or on a part of it) builds from every
    Relax function of ``mod`` visited; PrimFuncs carry over."""
    from tvm import relax

    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()


def rewrite_counted(mutator, mod):
    """``(module, count)``: :func:`mutate_functions` of ``mutator`` (one that counts its rewrites in
    ``rewritten``), with the bindings the rewrites left unused removed where there were any."""
    from tvm import relax

    out = mutate_functions(mutator, mod)
    if mutator.rewritten:
        out = relax.transform.DeadCodeElimination()(out)
    return out, mutator.rewritten


def static_dims(ty) -> tuple[int, ...] | None:
    """The static shape of a Relax tensor type (a var's or call's ``ty``), else None."""
    values = getattr(getattr(ty, "shape", None), "values", None)
    if values is None or not all(hasattr(d, "value") for d in values):
        return None
    return tuple(int(d.value) for d in values)


def op_name(expr) -> str:
    """The name of the operator ``expr`` calls ("" for anything else)."""
    import tvm
    from tvm import relax

    return expr.op.name if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) else ""


def bound(mutator, expr):
    """The expression a dataflow variable is bound to, through chains of variables (a ``PyExprMutator``'s
    bindings), else ``expr``."""
    from tvm import relax

    while isinstance(expr, relax.Var):
        value = mutator.lookup_binding(expr)
        if value is None:
            return expr
        expr = value
    return expr
