"""Walking and rebuilding a scheduled function's statements: what the post-schedule edits (``prefetch``,
``transpose``) share, TVM 0.27's Python API having no statement mutator and no expression substitution."""
from __future__ import annotations


def children(stmt) -> list:
    """The statements directly below ``stmt`` (loops, sequences, conditions and blocks)."""
    from tvm import s_tir, tirx

    if isinstance(stmt, tirx.SeqStmt):
        return list(stmt.seq)
    if isinstance(stmt, tirx.For):
        return [stmt.body]
    if isinstance(stmt, tirx.IfThenElse):
        return [stmt.then_case] + ([stmt.else_case] if stmt.else_case is not None else [])
    if isinstance(stmt, s_tir.SBlockRealize):
        return [stmt.block.body]
    return []


def path_to(stmt, found):
    """The statements from ``stmt`` down to the first (depth first) for which ``found`` holds, or None."""
    if found(stmt):
        return [stmt]
    for child in children(stmt):
        sub = path_to(child, found)
        if sub is not None:
            return [stmt] + sub
    return None


def rebuilt(path, index: int, node):
    """The first statement of ``path`` (statements from the root down) with ``path[index]`` replaced by
    ``node`` and every statement above it rebuilt around its new child; None when one of them is of a
    kind this does not rebuild."""
    from tvm import s_tir, tirx

    for stmt, old in zip(reversed(path[:index]), reversed(path[1:index + 1])):
        if isinstance(stmt, tirx.For):
            node = tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, node, stmt.thread_binding,
                            stmt.annotations, stmt.step, stmt.span)
        elif isinstance(stmt, tirx.SeqStmt):
            node = tirx.SeqStmt([node if c.same_as(old) else c for c in stmt.seq])
        elif isinstance(stmt, tirx.IfThenElse):
            then = node if stmt.then_case.same_as(old) else stmt.then_case
            other = node if stmt.else_case is not None and stmt.else_case.same_as(old) else stmt.else_case
            node = tirx.IfThenElse(stmt.condition, then, other)
        elif isinstance(stmt, s_tir.SBlockRealize):
            b = stmt.block
            node = s_tir.SBlockRealize(list(stmt.iter_values), stmt.predicate, s_tir.SBlock(
                list(b.iter_vars), list(b.reads), list(b.writes), b.name_hint, node, b.init, list(b.alloc_buffers),
                list(b.match_buffers), b.annotations))
        else:
            return None
    return node


def with_main(sch, func):
    """``sch`` itself when ``func`` is its main function unchanged, else a new ``tvm.s_tir.Schedule`` of
    ``func``: what each post-schedule edit returns."""
    import tvm

    return sch if func.same_as(sch.mod["main"]) else tvm.s_tir.Schedule(tvm.IRModule({"main": func}))


def substitution(inputs, outputs):
    """The substitution ``inputs`` -> ``outputs`` (variables -> expressions) as a TVM IndexMap: its
    ``map_indices(values)`` gives ``outputs`` with ``values`` in place of ``inputs``."""
    from tvm.tirx import IndexMap

    return IndexMap(inputs, outputs, None)


def is_const(e, value: int) -> bool:
    """Whether ``e`` is the integer constant ``value``."""
    return hasattr(e, "value") and not isinstance(e.value, float) and int(e.value) == value
