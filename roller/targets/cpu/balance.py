"""Load balancing of a CPU kernel's parallel grid: each core walks its own share of the grid, as under
TVM's fixed split, and a core that finishes early takes the last part of another's share.

TVM's ``parallel`` loop gives each core one contiguous share of the grid, so the kernel takes as long as
its slowest core. On a shared machine the cores do not run at one speed: a co-tenant on one vCPU's host
core slows it for seconds at a time, and a fixed split waits for it (docs/design-notes.md#balance).

Each core keeps its fixed share while the cores run at one speed: it finds its part of the tensors in
its own caches at the next call (and the next kernel's), as the model assumes, and it prefetches its own
next tile (``prefetch.py``). Cores that took the grid in turn instead (guided chunks from one counter)
ran ResNet-50 3-5% slower than the fixed split. A core claims its share in chunks from the front (a
quarter of what is left, at least one tile); when its share is done it steals half of what is left of
the fullest other share, from the back. The state is ``[lock, lo_0, hi_0, lo_1, hi_1, ...]`` (share
``u`` is ``[lo_u, hi_u)``), under glibc's spin lock (``pthread_spin_*``, resolved from the C library
when the kernel loads)::

    for t in parallel(U):                   # one task per core
        take()                              # lock; [start, end) = own front chunk or a stolen back; unlock
        while start < G:
            for g in range(G):              # the grid loop's own variable: its body is unchanged
                if start <= g < end:        # (a stolen chunk may lie behind: the while walks again)
                    body(g)
                    if g + 1 == end: take()

A take costs tens of nanoseconds, so kernels predicted shorter than ``model.balance_min_seconds`` keep the
fixed split, and so do memory-bound operators, whose time is their data's: a core stealing another's tiles
reads that core's part from its L2 or from L3, not its own. The plan decides (``RProgram.balanced``, from
``roller.plan.choices.balanced_grid``), and the model charges its wait for the slowest core by the same field.
"""
from __future__ import annotations

from roller.tir.schedutil import PARTITION_HINT

OWN_SHARE = 4       # a core claims a quarter of what is left of its own share at a time (at least one tile)


def _take(state, mine, pick, task, units: int, extent: int):
    """Under the lock: ``mine`` = the next chunk [start, end) of this task's own share, or else half of
    what is left of the fullest other share, from its back, or else [extent, extent) (all taken)."""
    from tvm import tirx as tir

    def i32(v):
        return tir.IntImm("int32", v)

    def load(buf, i):
        return tir.BufferLoad(buf, [i])

    task = tir.Cast("int32", task)
    lo, hi = i32(1) + task * 2, i32(2) + task * 2
    own = tir.SeqStmt([
        tir.BufferStore(mine, load(state, lo), [0]),
        tir.BufferStore(mine, load(mine, 0) + tir.Max(i32(1), tir.FloorDiv(load(state, hi) - load(mine, 0),
                                                                            i32(OWN_SHARE))), [1]),
        tir.BufferStore(state, load(mine, 1), [lo]),
    ])
    u = tir.Var("u", "int32")
    left = load(state, i32(2) + u * 2) - load(state, i32(1) + u * 2)
    victim_hi = i32(2) + load(pick, 0) * 2
    steal = tir.SeqStmt([
        tir.BufferStore(pick, i32(0), [0]),
        tir.BufferStore(pick, i32(0), [1]),
        tir.For(u, i32(0), i32(units), tir.ForKind.SERIAL, tir.IfThenElse(
            tir.GT(left, load(pick, 1)), tir.SeqStmt([tir.BufferStore(pick, u, [0]), tir.BufferStore(pick, left, [1])]),
            None)),
        tir.IfThenElse(
            tir.GT(load(pick, 1), i32(0)),
            tir.SeqStmt([
                tir.BufferStore(mine, load(state, victim_hi), [1]),
                tir.BufferStore(mine, load(mine, 1) - tir.Max(i32(1), tir.FloorDiv(load(pick, 1), i32(2))), [0]),
                tir.BufferStore(state, load(mine, 0), [victim_hi]),
            ]),
            tir.SeqStmt([tir.BufferStore(mine, i32(extent), [0]), tir.BufferStore(mine, i32(extent), [1])])),
    ])
    address = tir.address_of(load(state, 0))
    return tir.SeqStmt([
        tir.Evaluate(tir.call_extern("int32", "pthread_spin_lock", address)),
        tir.IfThenElse(tir.LT(load(state, lo), load(state, hi)), own, steal),
        tir.Evaluate(tir.call_extern("int32", "pthread_spin_unlock", address)),
    ])


def balance_grid(func, units: int):
    """``func`` (a scheduled PrimFunc) with each parallel loop of more than ``units`` iterations run by
    ``units`` tasks that walk their own shares and steal from each other's (see the module docstring):
    the loops at the top of its root block, where roller's schedules put them, except those carrying a
    partition hint (``schedutil.PARTITION_HINT``). ``func`` itself when it has none."""
    from tvm import tirx as tir

    realize = func.body
    root = getattr(realize, "block", None)
    if root is None or units < 2:
        return func
    states = []

    def rewrite(stmt):
        if not isinstance(stmt, tir.For) or stmt.kind != tir.ForKind.PARALLEL:
            return None
        if not isinstance(stmt.extent, tir.IntImm) or stmt.extent.value <= units:
            return None
        if PARTITION_HINT in stmt.annotations:
            # a predicated axis's tail is split off this loop at lowering, which the stealing loop would
            # prevent (its bounds are loads the partition pass takes for invariants: wrong results when
            # kept) and leave the bound in every tile: a predicated vector loop ran scalar, a predicated
            # row kept its accumulators in memory (docs/design-notes.md#balance-balance_grid)
            return None
        extent = stmt.extent.value
        state = tir.decl_buffer((1 + 2 * units,), "int32", f"grid_shares{len(states)}")  # lock, [lo, hi) a core
        states.append(state)
        mine = tir.decl_buffer((2,), "int32", "grid_chunk", scope="local")  # this task's chunk [start, end)
        pick = tir.decl_buffer((2,), "int32", "grid_victim", scope="local")  # the fullest share: index, left
        dtype = str(stmt.loop_var.ty)  # the loop variable's: int64 in functions from Relax
        task = tir.Var("task", dtype)

        def take():  # a statement of its own at each use: its victim loop's variable is defined once
            return _take(state, mine, pick, task, units, extent)

        at = stmt.loop_var - stmt.min
        start, end = (tir.Cast(dtype, tir.BufferLoad(mine, [i])) for i in (0, 1))
        body = tir.IfThenElse(tir.And(tir.LE(start, at), tir.LT(at, end)),
                              tir.SeqStmt([stmt.body, tir.IfThenElse(tir.EQ(at + tir.IntImm(dtype, 1), end), take(),
                                                                     None)]), None)
        walk = tir.While(tir.LT(tir.BufferLoad(mine, [0]), tir.IntImm("int32", extent)),
                         tir.For(stmt.loop_var, stmt.min, stmt.extent, tir.ForKind.SERIAL, body))
        # the fixed split's shares: [u * G // U, (u + 1) * G // U)
        init = [tir.Evaluate(tir.call_extern("int32", "pthread_spin_init", tir.address_of(tir.BufferLoad(state, [0])),
                                             0))]
        for u in range(units):
            init += [tir.BufferStore(state, tir.IntImm("int32", u * extent // units), [1 + 2 * u]),
                     tir.BufferStore(state, tir.IntImm("int32", (u + 1) * extent // units), [2 + 2 * u])]
        return tir.SeqStmt(init + [
            tir.For(task, tir.IntImm(dtype, 0), tir.IntImm(dtype, units), tir.ForKind.PARALLEL,
                    tir.SeqStmt([tir.AllocBuffer(mine), tir.AllocBuffer(pick), take(), walk])),
        ])

    top = list(root.body.seq) if isinstance(root.body, tir.SeqStmt) else [root.body]
    new = [rewrite(stmt) or stmt for stmt in top]  # roller's schedules put their parallel loops at the top
    body = tir.SeqStmt(new) if len(new) > 1 else new[0]
    if not states:
        return func
    from tvm import s_tir

    block = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, body, root.init,
                         list(root.alloc_buffers) + states, root.match_buffers, root.annotations)
    return func.with_body(s_tir.SBlockRealize(realize.iter_values, realize.predicate, block))
