"""Transposed copies in registers: a ``lanes x lanes`` block loaded as rows, transposed by shuffles, stored
as rows.

A transposed pack (an input the plan reads in another layout, e.g. a linear layer's weight ``B[N, K]``
packed as ``[K, N]`` blocks) is blocked by ``cpu._block_transpose`` into square blocks of ``lanes``
source rows by ``lanes`` contiguous elements. Left to TVM, such a block loads a vector of each source row
and scatters its lanes one scalar store each. Here the block becomes ``lanes`` vector loads, ``log2(lanes)``
stages of two-input shuffles (row ``r`` with row ``r ^ b``: the classic butterfly, one ``vpermt2ps``-class
instruction a vector a stage) and ``lanes`` contiguous vector stores, several times faster than the
scattered stores (docs/design-notes.md#transpose).

The schedule primitives have no shuffle, so ``_block_transpose`` marks the block's outer loop
(``mark``) and ``in_registers`` rewrites the marked loops of the scheduled function afterwards, in the
same way as ``prefetch.py`` and ``balance.py``. The plan says which packs go in registers
(``RProgram.register_transposes``, the rule ``roller.plan.tails.register_transposes``); a marked loop whose
block is not a plain copy (a predicate, a cast, indices not affine with unit stride) raises a BuildError:
the plan said registers, the code would be scattered.
"""
from __future__ import annotations

from roller.errors import BuildError
from roller.tir.tirtree import is_const, path_to, rebuilt

ANNOTATION = "roller.register_transpose"  # on the block's outer loop: the block's side (lanes)


def mark(sch, loop, lanes: int) -> None:
    """Marks ``loop`` (over the destination rows, right above the vectorized loop over the source's
    contiguous run, both ``lanes`` long) for ``in_registers``."""
    if lanes < 2 or lanes & (lanes - 1):
        raise BuildError(f"a register transpose needs a power-of-two number of lanes, not {lanes}")
    sch.annotate(loop, ANNOTATION, lanes)


def butterfly(rows: list, lanes: int, shuffle) -> list:
    """The transpose of ``lanes`` row vectors in ``log2(lanes)`` stages; ``shuffle(a, b, indices)`` is a
    two-input shuffle (indices below ``lanes`` pick from ``a``, the others from ``b``). At the stage of
    stride ``s`` rows ``r`` and ``r ^ s`` swap the lanes whose bit ``s`` differs from their row's: after all
    stages lane ``c`` of row ``r`` holds what lane ``r`` of row ``c`` held."""
    s = 1
    while s < lanes:
        out = []
        for r in range(lanes):
            p = r ^ s
            lo, hi = (rows[r], rows[p]) if r < p else (rows[p], rows[r])
            if r < p:  # lanes with bit s set come from the partner's lanes without it
                idx = [lanes + (c ^ s) if c & s else c for c in range(lanes)]
            else:  # lanes with bit s clear come from the partner's lanes with it
                idx = [lanes + c if c & s else c ^ s for c in range(lanes)]
            out.append(shuffle(lo, hi, idx))
        rows = out
        s *= 2
    return rows


def in_registers(func):
    """``func`` (a scheduled PrimFunc) with each marked transposed block (see ``mark``) in registers, or
    ``func`` itself when there is no marked loop. A marked loop it cannot rewrite raises a BuildError."""
    from tvm import tirx as tir

    body = func.body
    while True:
        path = path_to(body, lambda s: isinstance(s, tir.For) and ANNOTATION in s.annotations)
        if path is None:
            break
        loop = path[-1]
        node = _registers(loop, int(loop.annotations[ANNOTATION]))
        if node is None:
            raise BuildError("the plan transposes a pack in registers, but its block is not a plain copy of whole "
                             "vectors (a predicate, a cast, or indices not contiguous along its loops)")
        body = rebuilt(path, len(path) - 1, node)
        if body is None:
            raise RuntimeError("transpose.in_registers: unexpected statement above a marked loop")
    return func if body.same_as(func.body) else func.with_body(body)


def _registers(loop, lanes: int):
    """The statements that replace ``loop`` (marked), or None when its block is not a plain copy whose
    source is contiguous along the inner loop and whose destination is contiguous along ``loop``."""
    from tvm import tirx as tir
    from tvm.ir.expr import TensorLoad
    from tvm.sym.analyzer import Analyzer

    inner = loop.body
    if (not isinstance(inner, tir.For) or inner.kind != tir.ForKind.VECTORIZED
            or not is_const(loop.extent, lanes) or not is_const(inner.extent, lanes)
            or not is_const(loop.min, 0) or not is_const(inner.min, 0)):
        return None
    realize = inner.body
    block = getattr(realize, "block", None)
    if block is None or not is_const(realize.predicate, 1) or block.init is not None:
        return None
    store = block.body
    if not isinstance(store, tir.BufferStore) or not isinstance(store.value, TensorLoad):
        return None
    load = store.value
    if load.source.dtype != store.buffer.dtype:
        return None
    dst, src = loop.loop_var, inner.loop_var

    def at(indices, d: int, s: int) -> list:
        """``indices`` (over the block's variables) at dst = d, src = s."""
        ana = Analyzer()
        ana.bind(dst, tir.IntImm(str(dst.ty), d))
        ana.bind(src, tir.IntImm(str(src.ty), s))
        for iv, value in zip(block.iter_vars, realize.iter_values):
            ana.bind(iv.var, value)
        return [ana.simplify(e) for e in indices]

    def contiguous(indices, along_dst: bool):
        """f(j): ``indices`` as vectors along one loop with the other at j, or None unless one step of
        that loop moves the last index by one and no other."""
        step = (1, 0) if along_dst else (0, 1)
        zero, one = at(indices, 0, 0), at(indices, *step)
        if not all(is_const(Analyzer().simplify(b - a), 1 if k == len(zero) - 1 else 0)
                   for k, (a, b) in enumerate(zip(zero, one))):
            return None

        def vectors(j: int) -> list:
            fixed = at(indices, *((0, j) if along_dst else (j, 0)))
            last = fixed[-1]
            return fixed[:-1] + [tir.Ramp(last, tir.IntImm(str(last.ty), 1), lanes)]
        return vectors

    rows_at, cols_at = contiguous(load.indices, False), contiguous(store.indices, True)
    if rows_at is None or cols_at is None:
        return None
    vtype = f"{load.source.dtype}x{lanes}"
    binds, rows = [], []
    for r in range(lanes):
        var = tir.Var(f"tr_row{r}", vtype)
        binds.append(tir.Bind(var, tir.BufferLoad(load.source, rows_at(r))))
        rows.append(var)

    def shuffle(a, b, idx):
        var = tir.Var("tr", vtype)
        binds.append(tir.Bind(var, tir.Shuffle([a, b], [tir.IntImm("int32", i) for i in idx])))
        return var

    cols = butterfly(rows, lanes, shuffle)
    return tir.SeqStmt(binds + [tir.BufferStore(store.buffer, cols[c], cols_at(c)) for c in range(lanes)])
