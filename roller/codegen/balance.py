"""Dynamic scheduling of a CPU kernel's parallel grid: the cores take chunks of the grid from a shared
ticket counter, as OpenMP's ``schedule(dynamic)`` does, instead of TVM's fixed split.

TVM's ``parallel`` loop gives each core one contiguous share of the grid, so the kernel takes as long as
its slowest core. On a shared machine the cores do not run at one speed: on this project's VMs one
vCPU ran 1.5x slower than the other for seconds at a time (a co-tenant on its host core; measured with a
one-thread matmul pinned to each vCPU), and a two-core matmul with a fixed split then ran 1.5x slower,
where PyTorch's (which balances) ran 1.2x slower. With tickets the fast core takes the slow one's share.

The transformed loop nest (``G`` grid iterations in ``C`` chunks, ``U`` cores)::

    pthread_spin_init(&lock)  next = 0
    for t in parallel(U):                   # one task per core
        mine = take()                       # lock; mine = next; next += 1; unlock
        for c in range(C):                  # tickets rise, so each task meets its own in order
            if c == mine:
                for g in chunk c: body(g)   # the grid loop's own variable: the body is unchanged
                mine = take()

The lock is glibc's spin lock (``pthread_spin_*``, resolved from the C library when the kernel loads);
each take costs tens of nanoseconds, paid ``C + U`` times a call, so kernels predicted shorter than
``MIN_SECONDS`` keep the fixed split.
"""
from __future__ import annotations

CHUNKS_PER_UNIT = 8  # tickets per core: a late core leaves at most ~1/8 of its share to the others
MIN_SECONDS = 50e-6  # below this the takes (and the lock's cache line moving between cores) would show


def _take(lock, mine):
    """lock; mine = next; next = mine + 1; unlock."""
    from tvm import tirx as tir

    address = tir.address_of(tir.BufferLoad(lock, [0]))
    return tir.SeqStmt([
        tir.Evaluate(tir.call_extern("int32", "pthread_spin_lock", address)),
        tir.BufferStore(mine, tir.BufferLoad(lock, [1]), [0]),
        tir.BufferStore(lock, tir.BufferLoad(mine, [0]) + 1, [1]),
        tir.Evaluate(tir.call_extern("int32", "pthread_spin_unlock", address)),
    ])


def balance_grid(func, units: int):
    """``func`` (a scheduled PrimFunc) with each parallel loop of more than ``units`` iterations taken in
    chunks from a ticket counter of its own by ``units`` tasks (see the module docstring): the loops at the top of its
    root block, where roller's schedules put them. ``func`` itself when it has none."""
    from tvm import tirx as tir

    realize = func.body
    root = getattr(realize, "block", None)
    if root is None or units < 2:
        return func
    locks = []

    def rewrite(stmt):
        if not isinstance(stmt, tir.For) or stmt.kind != tir.ForKind.PARALLEL:
            return None
        if not isinstance(stmt.extent, tir.IntImm) or stmt.extent.value <= units:
            return None
        # [0]: the spin lock's word, [1]: the next ticket
        lock = tir.decl_buffer((2,), "int32", f"grid_tickets{len(locks)}")
        locks.append(lock)
        extent = stmt.extent.value
        size = max(1, extent // (units * CHUNKS_PER_UNIT))
        chunks = -(-extent // size)
        mine = tir.decl_buffer((1,), "int32", "grid_ticket", scope="local")
        c = tir.Var("chunk", "int32")
        first = stmt.min + c * size
        span = tir.Min(tir.IntImm("int32", size), stmt.min + extent - first) if extent % size else size
        grid = tir.For(stmt.loop_var, first, span, tir.ForKind.SERIAL, stmt.body)
        walk = tir.For(c, 0, chunks, tir.ForKind.SERIAL,
                       tir.IfThenElse(tir.EQ(c, tir.BufferLoad(mine, [0])), tir.SeqStmt([grid, _take(lock, mine)]),
                                      None))
        task = tir.Var("task", "int32")
        body = tir.SeqStmt([tir.AllocBuffer(mine), _take(lock, mine), walk])
        return tir.SeqStmt([
            tir.Evaluate(tir.call_extern("int32", "pthread_spin_init", tir.address_of(tir.BufferLoad(lock, [0])),
                                         0)),
            tir.BufferStore(lock, tir.IntImm("int32", 0), [1]),
            tir.For(task, 0, units, tir.ForKind.PARALLEL, body),
        ])

    top = list(root.body.seq) if isinstance(root.body, tir.SeqStmt) else [root.body]
    new = [rewrite(stmt) or stmt for stmt in top]  # roller's schedules put their parallel loops at the top
    body = tir.SeqStmt(new) if len(new) > 1 else new[0]
    if not locks:
        return func
    from tvm import s_tir

    block = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, body, root.init,
                         list(root.alloc_buffers) + locks, root.match_buffers, root.annotations)
    return func.with_body(s_tir.SBlockRealize(realize.iter_values, realize.predicate, block))
