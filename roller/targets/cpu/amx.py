"""AMX's tdpbusd as a TVM tensor intrinsic: a register tile of int32 accumulators kept in tile registers over
a reduction, ``C[rows, cols] += sum_k u8 A[rows, k] x s8 B[k/4, cols, 4]``.

A plan that runs on AMX (``RProgram.amx``, ``roller.plan.dot.amx_tiles``) is tensorized with it from the
first reduce loop above its register tile down: the accumulator tiles (16 rows of 16 int32) are loaded from
the accumulator buffer once, every 64-deep step loads the activation's row tiles in place (16 rows of 64
bytes at the activation's own stride) and the prepacked weight's column tiles (16 rows of 64 bytes of the
``[K/4, N, 4]`` layout VNNI reads too) and runs one ``tdpbusd`` per accumulator tile, and the tiles are
stored back once. Tile registers: accumulators first, then the activation's, then the weight's; every tile
is 16 rows of 64 bytes, so one configuration serves every plan (:func:`with_tile_state` loads it).

Linux hands a process the tile state only on request (``arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)``): :func:`with_tile_state` puts that call in the kernel's prologue, once per call of
the kernel, so a library loaded by any process runs.
"""
from __future__ import annotations

ROWS = 16        # rows of a tile register
ROW_BYTES = 64   # bytes a tile row holds: 64 u8 of the activation, 16 x 4 s8 of the weight, 16 int32 sums
DEPTH = 64       # reduce elements one tdpbusd sums into each accumulator
COLUMNS = ROW_BYTES // 4  # int32 accumulators a tile row holds
TILES = 8        # tile registers
_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18


def tiles_needed(rows: int, cols: int) -> int:
    """Tile registers a register tile of ``rows`` x ``cols`` int32 accumulators takes with its operands."""
    r, c = rows // ROWS, cols // COLUMNS
    return r * c + r + c


def register_amx(rows: int, cols: int, depth: int, scope: str = "global") -> str:
    """The name of the intrinsic for a ``rows`` x ``cols`` accumulator tile over ``depth`` reduce elements
    (each a multiple of the tiles' own), registered on first use. BuildError for a shape the tile registers
    cannot hold."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    from roller.errors import BuildError

    if rows % ROWS or cols % COLUMNS or depth % DEPTH or rows <= 0 or cols <= 0 or depth <= 0 \
            or tiles_needed(rows, cols) > TILES:
        raise BuildError(f"AMX runs accumulator tiles of {ROWS} x {COLUMNS} int32 over steps of {DEPTH} with "
                         f"{TILES} tile registers, not a {rows} x {cols} tile over {depth}")
    name = f"roller_amx_{rows}x{cols}x{depth}_{scope}"
    if TensorIntrin.get(name, allow_missing=True) is not None:
        return name
    nr, nc, groups = rows // ROWS, cols // COLUMNS, depth // 4

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle):
        sa = T.int32()
        sb = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, (rows, depth), "uint8", strides=[sa, 1], offset_factor=1)
        B = T.match_buffer(b, (groups, cols, 4), "int8", strides=[sb, 4, 1], offset_factor=1)
        C = T.match_buffer(c, (rows, cols), "int32", strides=[sc, 1], offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C[0:rows, 0:cols], A[0:rows, 0:depth], B[0:groups, 0:cols, 0:4])
            T.writes(C[0:rows, 0:cols])
            for k, i, j, kk in T.grid(groups, rows, cols, 4):
                with T.sblock("update"):
                    vi = T.axis.spatial(rows, i)
                    vj = T.axis.spatial(cols, j)
                    vk = T.axis.reduce(depth, k * 4 + kk)
                    C[vi, vj] = C[vi, vj] + T.Cast("int32", A[vi, vk]) * T.Cast("int32", B[vk // 4, vj, vk % 4])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle):
        sa = T.int32()
        sb = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, (rows, depth), "uint8", strides=[sa, 1], offset_factor=1)
        B = T.match_buffer(b, (groups, cols, 4), "int8", strides=[sb, 4, 1], offset_factor=1)
        C = T.match_buffer(c, (rows, cols), "int32", strides=[sc, 1], offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C[0:rows, 0:cols], A[0:rows, 0:depth], B[0:groups, 0:cols, 0:4])
            T.writes(C[0:rows, 0:cols])
            for r in T.unroll(nr):
                for q in T.unroll(nc):
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(r * nc + q),
                                                  T.address_of(C[r * ROWS, q * COLUMNS]), T.int64(sc * 4)))
            for s in T.serial(depth // DEPTH):
                for r in T.unroll(nr):
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(nr * nc + r),
                                                  T.address_of(A[r * ROWS, s * DEPTH]), T.int64(sa)))
                for q in T.unroll(nc):
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(nr * nc + nr + q),
                                                  T.address_of(B[s * (DEPTH // 4), q * COLUMNS, 0]), T.int64(sb)))
                for r in T.unroll(nr):
                    for q in T.unroll(nc):
                        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tdpbusd", T.int8(r * nc + q),
                                                      T.int8(nr * nc + r), T.int8(nr * nc + nr + q)))
            for r in T.unroll(nr):
                for q in T.unroll(nc):
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.int8(r * nc + q),
                                                  T.address_of(C[r * ROWS, q * COLUMNS]), T.int64(sc * 4)))

    TensorIntrin.register(name, desc, impl)
    return name


def _config_words() -> list[int]:
    """The tile configuration (``ldtilecfg``'s 64 bytes) as eight little-endian uint64 words: palette 1, and
    every tile 16 rows (bytes 48..) of 64 bytes (bytes 16.., as uint16)."""
    colsb = sum(ROW_BYTES << (16 * i) for i in range(4))
    rows = sum(ROWS << (8 * i) for i in range(8))
    return [1, 0, colsb, colsb, 0, 0, rows, 0]


def with_tile_state(sch):
    """``sch`` with what its tensorized AMX units (:func:`register_amx`) rely on: first in the function, the
    request for the tile state (``arch_prctl``, a system call: Linux grants it per process, and repeats of
    it return at once) and the tile configuration written to a buffer; then ``ldtilecfg`` of it at the start
    of each iteration of the parallel loop around the units (each thread's tiles are its own), or once
    where there is none. Loaded per unit instead, the configuration took a third of a 128x768x768 matmul's
    time (``ldtilecfg`` also zeroes the tiles)."""
    from tvm import tirx

    from roller.errors import BuildError
    from roller.tir.tirtree import path_to, rebuilt, with_main

    func = sch.mod["main"]
    root = func.body
    block = root.block
    cfg = tirx.decl_buffer((8,), "uint64", "amx_tile_config")
    load = tirx.Evaluate(tirx.call_llvm_intrin("void", "llvm.x86.ldtilecfg",
                                                tirx.address_of(tirx.BufferLoad(cfg, [tirx.const(0, "int32")]))))
    path = path_to(block.body, lambda st: isinstance(st, tirx.Evaluate) and "tdpbusd" in str(st))
    if path is None:
        raise BuildError("the AMX plan's function has no tdpbusd to configure the tiles for")
    par = next((i for i, st in enumerate(path) if isinstance(st, tirx.For) and st.kind == tirx.ForKind.PARALLEL),
               None)
    body = block.body
    if par is not None:
        lp = path[par]
        body = rebuilt(path, par, tirx.For(lp.loop_var, lp.min, lp.extent, lp.kind, tirx.SeqStmt([load, lp.body]),
                                           lp.thread_binding, lp.annotations, lp.step, lp.span))
        if body is None:
            raise BuildError("the AMX plan's loops around its tiles are of a kind the tile configuration cannot "
                             "go into")
    request = tirx.Evaluate(tirx.call_extern("int64", "syscall", tirx.const(_SYS_ARCH_PRCTL, "int64"),
                                             tirx.const(_ARCH_REQ_XCOMP_PERM, "int64"),
                                             tirx.const(_XFEATURE_XTILEDATA, "int64")))
    fills = [tirx.BufferStore(cfg, tirx.const(w, "uint64"), [tirx.const(i, "int32")])
             for i, w in enumerate(_config_words())]
    first = fills + [request] + ([load] if par is None else [])
    from tvm import s_tir
    new = s_tir.SBlockRealize(list(root.iter_values), root.predicate, s_tir.SBlock(
        list(block.iter_vars), list(block.reads), list(block.writes), block.name_hint,
        tirx.SeqStmt(first + [body]), block.init, list(block.alloc_buffers) + [cfg], list(block.match_buffers),
        block.annotations))
    return with_main(sch, func.with_body(new))
