"""Zero-padding stages the plan reads in place (``RProgram.inlined``): the register tiles that read no padding
run without the bounds checks.

Inlined, TVM's padding stage is ``if_then_else(in bounds, data[i - pad], 0)`` at every load of the register
tile. LLVM sometimes moves those checks out of the loops itself; where it does not, the branches between the
multiply-adds keep the accumulators out of registers, stored and reloaded around every one of them. After
scheduling, the loops of the register tile's whole reduction are therefore copied: one copy without checks,
run where every load of the loops is in bounds (one comparison per check ahead of them), the other as it was,
for the tiles at the border (docs/design-notes.md#inline_pad-unswitched_padding).
"""
from __future__ import annotations

from collections.abc import Iterable


def padding_sources(func, names: Iterable[str]) -> frozenset[str]:
    """The buffers the stages writing ``names`` read (what an inlined padding stage's guarded loads read)."""
    import tvm_ffi
    from tvm.s_tir.stmt import SBlockRealize

    names, found = frozenset(names), set()

    def visit(realize):
        block = realize.block
        if any(w.source.name in names for w in block.writes):
            found.update(r.source.name for r in block.reads)
        return realize

    tvm_ffi.structural_map(func, [(SBlockRealize, visit)])
    return frozenset(found)


def unswitched_padding(func, block_name: str, names: Iterable[str]):
    """``func`` with the loops around block ``block_name`` (which reads the buffers ``names`` behind padding
    checks) run twice over: without the checks where every load of the loops' iterations is in bounds, else as
    they were. The copied loops are the chain right around the block that holds one register tile's
    accumulators: reduce loops, unrolled or vectorized ones and loops of one iteration, each the only
    statement of its parent. ``func`` as it was where the checks are not comparisons of loop indices, or no
    iteration of the chain is wholly inside."""
    import tvm_ffi
    from tvm import ir, s_tir, sym, tirx

    from roller.tir.accesses import uses_var
    from roller.tir.tirtree import path_to, rebuilt

    names = frozenset(names)
    path = path_to(func.body, lambda s: isinstance(s, s_tir.SBlockRealize) and s.block.name_hint == block_name)
    if path is None:
        return func
    realize = path[-1]
    binding = list(zip([iv.var for iv in realize.block.iter_vars], realize.iter_values))

    def bound(v):
        return next((e for var, e in binding if var.same_as(v)), v)

    def guarded(call) -> bool:
        return (isinstance(call, ir.expr.Call) and call.op.name == "prim.if_then_else"
                and isinstance(call.args[1], ir.expr.TensorLoad) and call.args[1].source.name in names
                and isinstance(call.args[2], (tirx.FloatImm, tirx.IntImm)))

    conds = []
    tvm_ffi.structural_map(realize.block.body, [(ir.expr.Call, lambda c: conds.append(c.args[0]) or c
                                                  if guarded(c) else c)])
    atoms = []
    for cond in conds:
        todo = [tvm_ffi.structural_map(cond, [(tirx.Var, bound)])]
        while todo:
            e = todo.pop()
            if isinstance(e, tirx.And):
                todo += [e.a, e.b]
            elif isinstance(e, (tirx.LE, tirx.LT, tirx.GE, tirx.GT)):
                atoms.append(e)
            else:
                return func
    if not atoms:
        return func
    loops = [(i, s) for i, s in enumerate(path) if isinstance(s, tirx.For)]

    # the loops whose variables index the output (spatial): one of extent > 1 that is neither unrolled nor
    # vectorized ends the chain, as its iterations hold other accumulators
    spatial = [e for iv, (_, e) in zip(realize.block.iter_vars, binding) if iv.iter_type != tirx.IterVar.CommReduce]
    split = None
    for i, loop in reversed(loops):
        if not (loop.body.same_as(path[i + 1]) and isinstance(path[i + 1], (tirx.For, s_tir.SBlockRealize))):
            break  # only a chain of loops around the block is copied (no other statements beside it)
        if loop.kind in (tirx.ForKind.PARALLEL, tirx.ForKind.THREAD_BINDING):
            break
        small = loop.kind in (tirx.ForKind.UNROLLED, tirx.ForKind.VECTORIZED) or (
            isinstance(loop.extent, tirx.IntImm) and int(loop.extent) == 1)
        if not small and any(uses_var(e, loop.loop_var) for e in spatial):
            break
        if loop.kind != tirx.ForKind.VECTORIZED:
            split = i
    if split is None:
        return func
    analyzer = sym.Analyzer()
    dom = {}
    for i, loop in loops:
        if i >= split:
            if not (isinstance(loop.min, tirx.IntImm) and isinstance(loop.extent, tirx.IntImm)):
                return func
            dom[loop.loop_var] = sym.IntervalSet(int(loop.min), int(loop.min) + int(loop.extent) - 1)
    inside = None
    for atom in atoms:
        span = analyzer.int_set(atom.a - atom.b, dom)
        if isinstance(atom, (tirx.LE, tirx.LT)):
            check = span.max_value <= 0 if isinstance(atom, tirx.LE) else span.max_value < 0
        else:
            check = span.min_value >= 0 if isinstance(atom, tirx.GE) else span.min_value > 0
        inside = check if inside is None else tirx.And(inside, check)
    inside = analyzer.simplify(inside)
    if isinstance(inside, tirx.IntImm) and not int(inside):
        return func  # no iteration is wholly inside: the checked loops as they were
    loop = path[split]
    unchecked = _renamed(tvm_ffi.structural_map(loop, [(ir.expr.Call, lambda c: c.args[1] if guarded(c) else c)]))
    node = unchecked if isinstance(inside, tirx.IntImm) else tirx.IfThenElse(inside, unchecked, loop)
    new = rebuilt(path, split, node)
    return func if new is None else func.with_body(new)


def _renamed(stmt):
    """``stmt`` with fresh copies of the loop and block variables it defines, its blocks renamed with an
    ``_inside`` suffix: a second copy of a loop nest in one function (TIR defines each variable once)."""
    import tvm_ffi
    from tvm import tirx
    from tvm.s_tir.stmt import SBlock, SBlockRealize

    defined = []

    def collect_for(loop):
        defined.append(loop.loop_var)
        return loop

    def collect_block(realize):
        defined.extend(iv.var for iv in realize.block.iter_vars)
        return realize

    tvm_ffi.structural_map(stmt, [(tirx.For, collect_for), (SBlockRealize, collect_block)])
    fresh = [(v, tirx.Var(v.name + "_i", v.ty)) for v in defined]

    def var(v):
        return next((n for old, n in fresh if old.same_as(v)), v)

    def block(b):
        return SBlock(b.iter_vars, b.reads, b.writes, b.name_hint + "_inside", b.body, b.init, b.alloc_buffers,
                      b.match_buffers, b.annotations, b.span)

    return tvm_ffi.structural_map(stmt, [(tirx.Var, var), (SBlock, block)])
