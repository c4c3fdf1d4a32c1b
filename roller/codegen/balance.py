"""Dynamic scheduling of a CPU kernel's parallel grid: the cores take chunks of the grid from a shared
counter, as OpenMP's ``schedule(guided)`` does, instead of TVM's fixed split.

TVM's ``parallel`` loop gives each core one contiguous share of the grid, so the kernel takes as long as
its slowest core. On a shared machine the cores do not run at one speed: on this project's VMs one
vCPU ran 1.5x slower than the other for seconds at a time (a co-tenant on its host core; measured with a
one-thread matmul pinned to each vCPU), and a two-core matmul with a fixed split then ran 1.5x slower,
where PyTorch's (which balances) ran 1.2x slower. Taking chunks, the fast core takes the slow one's share.

Chunks are guided: each is the rest of the grid over ``GUIDED_SHARE * U`` (at least one iteration), so
a core walks long contiguous runs first, as under the fixed split (the next tile it prefetches,
``prefetch.py``, is its own), and short ones at the end, where they even out the cores. Handing out
single tiles in turn made ResNet-50 and BERT 5% slower than the fixed split. The loop nest (``G`` grid
iterations, ``U`` cores)::

    pthread_spin_init(&lock)  next = 0
    for t in parallel(U):                   # one task per core
        take()                              # lock; [start, end) = [next, next + guided size); next = end; unlock
        for g in range(G):                  # the grid loop's own variable: its body is unchanged
            if start <= g < end:            # chunks rise, so each task meets its own in order
                body(g)
                if g + 1 == end: take()

The lock is glibc's spin lock (``pthread_spin_*``, resolved from the C library when the kernel loads);
a take costs tens of nanoseconds, so kernels predicted shorter than ``MIN_SECONDS`` keep the fixed split.
So do memory-bound operators (:func:`worth_balancing`): the fixed split gives a core the same part of
the tensors at every call, which then stays in its own L2 (the model counts on it: ``model.data_source``),
and chunks taken in turn lose that (warm, 2 cores: add_relu on 100x3001 43 -> 105 us, a 3x3 max pool
on 112x112x64 59 -> 83 us).
"""
from __future__ import annotations

GUIDED_SHARE = 2  # a chunk is the rest of the grid / (GUIDED_SHARE * cores), at least one iteration
MIN_SECONDS = 50e-6  # below this the takes (and the lock's cache line moving between cores) would show
ENABLED = True       # False: TVM's fixed split everywhere (for A/B timing: scripts/bench_models.py --ab-balance)


def _take(lock, mine, extent: int, units: int):
    """lock; mine = [next, next + guided size); next = mine's end; unlock (positions in the grid)."""
    from tvm import tirx as tir

    address = tir.address_of(tir.BufferLoad(lock, [0]))
    start = tir.BufferLoad(mine, [0])
    size = tir.Max(tir.IntImm("int32", 1), tir.FloorDiv(tir.IntImm("int32", extent) - start,
                                                        tir.IntImm("int32", GUIDED_SHARE * units)))
    return tir.SeqStmt([
        tir.Evaluate(tir.call_extern("int32", "pthread_spin_lock", address)),
        tir.BufferStore(mine, tir.BufferLoad(lock, [1]), [0]),
        tir.BufferStore(mine, tir.Min(tir.IntImm("int32", extent), start + size), [1]),
        tir.BufferStore(lock, tir.BufferLoad(mine, [1]), [1]),
        tir.Evaluate(tir.call_extern("int32", "pthread_spin_unlock", address)),
    ])


def worth_balancing(expr, program, device) -> bool:
    """Whether ``program``'s kernel takes its grid in chunks: predicted to run at least ``MIN_SECONDS``
    and compute-bound (more flops per byte of all its tensors than the device's peak over the bandwidth
    of the level they live in between calls)."""
    import math

    from ..model import data_source

    if not ENABLED or not program.predicted_seconds >= MIN_SECONDS:  # also NaN: a plan the model did not time
        return False
    nbytes = sum(math.prod(t.shape) * t.elem_bytes for t in expr.tensors)
    peak = device.units.peak(expr.dtype) * device.units.count
    return expr.flops / nbytes >= peak / data_source(expr, device).total_bandwidth_gbps


def balance_grid(func, units: int):
    """``func`` (a scheduled PrimFunc) with each parallel loop of more than ``units`` iterations taken in
    guided chunks from a counter of its own by ``units`` tasks (see the module docstring): the loops at the
    top of its root block, where roller's schedules put them. ``func`` itself when it has none."""
    from tvm import tirx as tir

    realize = func.body
    root = getattr(realize, "block", None)
    if not ENABLED or root is None or units < 2:
        return func
    locks = []

    def rewrite(stmt):
        if not isinstance(stmt, tir.For) or stmt.kind != tir.ForKind.PARALLEL:
            return None
        if not isinstance(stmt.extent, tir.IntImm) or stmt.extent.value <= units:
            return None
        # [0]: the spin lock's word, [1]: the grid position the next chunk starts at
        lock = tir.decl_buffer((2,), "int32", f"grid_next{len(locks)}")
        locks.append(lock)
        extent = stmt.extent.value
        mine = tir.decl_buffer((2,), "int32", "grid_chunk", scope="local")  # this task's chunk [start, end)
        dtype = str(stmt.loop_var.ty)  # the loop variable's: int64 in functions from Relax
        take = _take(lock, mine, extent, units)
        at = stmt.loop_var - stmt.min
        start, end = (tir.Cast(dtype, tir.BufferLoad(mine, [i])) for i in (0, 1))
        body = tir.IfThenElse(tir.And(tir.LE(start, at), tir.LT(at, end)),
                              tir.SeqStmt([stmt.body, tir.IfThenElse(tir.EQ(at + tir.IntImm(dtype, 1), end), take,
                                                                     None)]), None)
        walk = tir.For(stmt.loop_var, stmt.min, stmt.extent, tir.ForKind.SERIAL, body)
        task = tir.Var("task", dtype)
        return tir.SeqStmt([
            tir.Evaluate(tir.call_extern("int32", "pthread_spin_init", tir.address_of(tir.BufferLoad(lock, [0])),
                                         0)),
            tir.BufferStore(lock, tir.IntImm("int32", 0), [1]),
            tir.For(task, tir.IntImm(dtype, 0), tir.IntImm(dtype, units), tir.ForKind.PARALLEL,
                    tir.SeqStmt([tir.AllocBuffer(mine), take, walk])),
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
