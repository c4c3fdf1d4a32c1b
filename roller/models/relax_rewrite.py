"""What roller's Relax rewrites share: running a ``PyExprMutator`` over every Relax function of a module, and
a Relax tensor type's static shape."""
from __future__ import annotations


def mutate_functions(mutator, mod):
    """The module ``mutator`` (a ``PyExprMutator`` built on ``mod``, or on a part of it) builds from every
    Relax function of ``mod`` visited; PrimFuncs carry over."""
    from tvm import relax

    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()


def static_dims(ty) -> tuple[int, ...] | None:
    """The static shape of a Relax tensor type (a var's or call's ``ty``), else None."""
    values = getattr(getattr(ty, "shape", None), "values", None)
    if values is None or not all(hasattr(d, "value") for d in values):
        return None
    return tuple(int(d.value) for d in values)
