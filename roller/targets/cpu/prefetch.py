"""Software prefetch of a prepacked constant's next top tile (a whole model's weights).

Inside a model, other layers push a layer's weights out of the caches between calls, and the kernel reads
them from memory. The hardware prefetchers do not hide that stream under the compute: a register tile
walks a block of weights once at a high rate, then reuses it from cache, and the streamers stop at every
4 KiB page. A prepacked input (``roller.plan.prepack``) stores each top tile as one block, in the order the
kernel walks them, so the block the next iteration of the parallel grid loop reads is known: while a top
tile computes, its loops issue ``prefetch`` (to L2) for that block, a few cache lines an iteration, spread
evenly over the tile. It pays where a model's weights outgrow the caches, not where they stay cached;
GPT-2 decode has no kernel it applies to (its GEMVs read each weight once). Whole-model figures:
docs/design-notes.md#prefetch.

This edits the scheduled function (the schedule primitives have no prefetch), so it runs last and
returns a new ``tvm.s_tir.Schedule`` of the edited module.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from roller.errors import BuildError
from roller.plan.choices import MIN_BLOCK_BYTES, MIN_CARRIER_POINTS
from roller.tir.tirtree import is_const, path_to, rebuilt, substitution, with_main

LOCALITY = 2         # llvm.prefetch locality 2: prefetcht1, into L2 (a top tile's block outgrows L1)
MAX_LINES_PER_ITERATION = 4  # lines prefetched an iteration of the loop that carries them, where loops allow


def prefetch_prepacked(sch, block_name: str, blocks: Mapping[str, int], top_loops: int, line_bytes: int):
    """``sch`` with prefetches of the next top tile's block of each prepacked input in ``blocks`` (name ->
    elements in one top tile's block: those the plan prefetches, ``RProgram.prefetched``, decided by
    ``roller.plan.choices.prefetched_inputs``) that the block ``block_name`` reads, ``line_bytes`` apart (the
    level's transaction length); ``sch`` itself when ``blocks`` is empty. A top tile is one iteration of the
    parallel grid loop and of the ``top_loops`` loops right below it (the top tile's reduction chunks).
    Raises BuildError where a prefetch the plan asks for cannot go in (no parallel grid loop, a block the
    main block does not read, read once, or no loop to carry it)."""
    import tvm

    if not blocks:
        return sch
    names = sorted(blocks)

    def cannot(why: str):
        return BuildError(f"{block_name}: the plan prefetches {names}, but {why}")
    func = sch.mod["main"]
    path = path_to(func.body, lambda s: isinstance(s, tvm.s_tir.SBlockRealize) and s.block.name_hint == block_name)
    if path is None:
        raise cannot("the scheduled function has no such block")
    par = next((i for i, s in enumerate(path) if isinstance(s, tvm.tirx.For)
                and s.kind == tvm.tirx.ForKind.PARALLEL), None)
    if par is None:
        raise cannot("it has no parallel grid loop")
    realize = path[-1]
    loops = [s for s in path[par + 1:] if isinstance(s, tvm.tirx.For)]
    serial = []
    for lp in loops:  # the loops a top tile walks, down to the register tile (unrolled / vectorized)
        if lp.kind != tvm.tirx.ForKind.SERIAL or not isinstance(lp.extent, tvm.tirx.IntImm):
            break
        serial.append(lp)
    if len(serial) < top_loops:
        raise cannot(f"only {len(serial)} serial loops lie below the grid loop, not the top tile's {top_loops}")
    units, inner = [path[par]] + serial[:top_loops], serial[top_loops:]
    stmts = []
    for name, elems in blocks.items():
        region = next((r for r in realize.block.reads if str(r.source.name) == name), None)
        if region is None:
            raise cannot(f"the block does not read {name}")
        stmt = _prefetch_stmt(realize, region, elems, loops, units, inner, line_bytes)
        if stmt is None:
            raise cannot(f"{name}'s block is small, read once by a top tile, or no loop can carry its prefetches")
        stmts.append(stmt)
    carrier = stmts[0][0]
    body = tvm.tirx.SeqStmt([s for c, s in stmts if c.same_as(carrier)] + [carrier.body])
    new = rebuilt(path, next(i for i, x in enumerate(path) if x.same_as(carrier)),
                  tvm.tirx.For(carrier.loop_var, carrier.min, carrier.extent, carrier.kind, body,
                               carrier.thread_binding, carrier.annotations, carrier.step, carrier.span))
    if new is None:
        raise cannot("an unexpected statement lies on the loop path")
    return with_main(sch, func.with_body(new))


def _prefetch_stmt(realize, region, block_elems: int, loops, units, inner, line_bytes: int):
    """(loop that carries it, statement): prefetches of the block of the input read through ``region``
    that the next top tile (the next iteration of the ``units`` loops, the grid loop first) reads,
    spread over the iterations of the ``inner`` loops. None when the block is small, read once, or no
    loop can carry the prefetches."""
    import tvm
    from tvm import sym, tirx

    buf = region.source
    shape = [int(d) for d in buf.shape]
    elem = tvm.DataType(buf.dtype).bits // 8
    total = math.prod(shape)
    if block_elems * elem < MIN_BLOCK_BYTES:
        return None
    simplify = sym.Analyzer().simplify
    loop_vars = [units[0].loop_var] + [lp.loop_var for lp in loops]
    at = substitution(loop_vars, list(realize.iter_values))  # block iteration <- loop variables
    first = substitution([iv.var for iv in realize.block.iter_vars], [r.min for r in region.region])
    strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]

    def flat(values):
        """The input's flat offset read at the block iteration ``values``."""
        idx = first.map_indices(list(values))
        return sum((i.astype("int64") * s for i, s in zip(idx, strides)), tirx.const(0, "int64"))

    def offset(unit_values):
        """The flat offset a top tile reads first: the loops below its own at their start."""
        return flat(at.map_indices(list(unit_values) + [lp.min for lp in loops[len(units) - 1:]]))

    def stepped(lp):
        """The block iteration with loop ``lp`` one step on."""
        return at.map_indices([v + 1 if v.same_as(lp.loop_var) else v for v in loop_vars])

    iteration = list(realize.iter_values)
    walked = [lp for lp in inner if int(lp.extent) > 1]
    # Only a block the top tile reads more than once (some loop walks on without moving in it): a
    # stream read once (a GEMV's weights) is the hardware prefetchers' case, and a second stream beside
    # it only competes for the bandwidth (docs/design-notes.md#prefetch-prefetch_stmt).
    if all(not is_const(simplify(flat(stepped(lp)) - flat(iteration)), 0) for lp in walked):
        return None
    # The loops that carry the prefetches: any but the innermost, each of whose iterations runs at least
    # MIN_CARRIER_POINTS of the block's iterations, so that the prefetches' own instructions (an address,
    # a bound) stay few beside the compute; not kept out of the reduction loops either, or they come in
    # bursts too long for the misses in flight (docs/design-notes.md#prefetch-prefetch_stmt).
    def points(lp):
        at_lp = next(i for i, x in enumerate(loops) if x.same_as(lp))
        return math.prod(int(x.extent) for x in loops[at_lp + 1:])

    carriers = [lp for lp in walked[:-1] if points(lp) >= MIN_CARRIER_POINTS]
    if not carriers:
        return None
    lines = math.ceil(block_elems * elem / line_bytes)
    depth, iters = 0, 1
    while depth < len(carriers) and iters * MAX_LINES_PER_ITERATION < lines:
        iters *= int(carriers[depth].extent)
        depth += 1
    depth = max(depth, 1)
    iters = math.prod(int(lp.extent) for lp in carriers[:depth])
    k = math.ceil(lines / iters)

    # the next top tile: the units' linear index plus one (the last top tile: itself)
    ext = [lp.extent.astype("int64") for lp in units]
    u = tirx.const(0, "int64")
    for lp, e in zip(units, ext):
        u = u * e + (lp.loop_var - lp.min).astype("int64")
    count = math.prod(int(e) for e in ext) if all(isinstance(e, tirx.IntImm) for e in ext) else None
    u_next = tirx.min(u + 1, count - 1) if count is not None else u + 1
    nxt_values, rest = [], u_next
    for lp, e in reversed(list(zip(units, ext))):
        nxt_values.append((rest % e + lp.min.astype("int64")).astype(str(lp.loop_var.ty.dtype)))
        rest = rest // e
    nxt = simplify(offset(reversed(nxt_values)))
    cur = simplify(offset([lp.loop_var for lp in units]))

    j = tirx.const(0, "int64")
    for lp in carriers[:depth]:
        j = j * int(lp.extent) + (lp.loop_var - lp.min).astype("int64")
    start = (j * lines + iters - 1) // iters
    end = ((j + 1) * lines + iters - 1) // iters
    # the input as one flat row over the same memory: an address is the next block's start plus a line
    flat_view = tirx.decl_buffer((total,), buf.dtype, name=f"{buf.name}_flat", data=buf.data)
    q = tirx.Var("q", "int64")
    at_line = simplify(tirx.min(nxt + (start + q) * max(1, line_bytes // elem), tirx.const(total - 1, "int64")))
    call = tirx.call_llvm_intrin("void", "llvm.prefetch.p0",
                                 tirx.address_of(tirx.BufferLoad(flat_view, [at_line])), 0, LOCALITY, 1)
    one = tirx.IfThenElse(simplify(start + q < end), tirx.Evaluate(call), None)
    lines_loop = tirx.For(q, tirx.const(0, "int64"), tirx.const(k, "int64"), tirx.ForKind.SERIAL, one)
    body = tirx.SeqStmt([tirx.DeclBuffer(flat_view, data=buf.data), lines_loop])
    return carriers[depth - 1], tirx.IfThenElse(simplify(nxt != cur), body, None)
