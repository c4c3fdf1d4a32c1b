"""AMX's tdpbusd as a TVM tensor intrinsic: a register tile of int32 accumulators kept in tile registers over
a reduction, ``C[rows, cols] += sum_k u8 A[rows * row_step, k] x s8 B[k/4, cols, 4]``.

A plan that runs on AMX (``RProgram.amx``, ``roller.plan.dot.amx_layout``) is tensorized with it from the
first reduce loop of its register tile down: the accumulator tiles (tile_rows x 16 int32) are loaded from the
accumulator buffer once, every step (``step`` reduce elements) loads the activation's row tiles in place
(tile_rows rows of ``step`` bytes at the activation's own stride, times ``row_step`` for a strided
convolution) and the prepacked weight's column tiles (step / 4 rows of 64 bytes of the ``[K/4, N, 4]``
layout VNNI reads too) and runs one ``tdpbusd`` per accumulator tile, and the tiles are stored back once.
Tile registers by role: accumulators 0-3, the activation's 4-5, the weight's 6-7; the configuration (rows
and bytes a row of each) follows from tile_rows and step alone (:func:`with_tile_state` loads it).

Linux hands a process the tile state only on request (``arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)``): :func:`with_tile_state` puts that call in the kernel's prologue, once per call of
the kernel, so a library loaded by any process runs.
"""
from __future__ import annotations

from roller.plan.dot import AMX_COLUMNS, AMX_DEPTH, AMX_ROWS

ROW_BYTES = 64   # bytes a tile row holds at most: 64 u8 of the activation, 16 x 4 s8 of the weight, 16 int32
_ACC, _ACT, _WEIGHT = 0, 4, 6  # the first tile register of each role
_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18


def register_amx(rows: int, cols: int, depth: int, tile_rows: int = AMX_ROWS, step: int = AMX_DEPTH,
                 row_step: int = 1, scope: str = "global") -> str:
    """The name of the intrinsic for a ``rows`` x ``cols`` accumulator tile over ``depth`` reduce elements, in
    tiles of ``tile_rows`` rows and steps of ``step`` (rows one or two tiles, columns one or two of 16,
    ``depth`` a multiple of ``step``), the activation's rows ``row_step`` apart; registered on first use.
    BuildError for a shape the tile registers cannot hold."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    from roller.errors import BuildError

    nr, nc = (rows // tile_rows, cols // AMX_COLUMNS) if tile_rows > 0 else (0, 0)
    if (not 0 < tile_rows <= AMX_ROWS or step <= 0 or step > AMX_DEPTH or step % 4 or depth <= 0
            or depth % step or rows != nr * tile_rows or cols != nc * AMX_COLUMNS
            or nr not in (1, 2) or nc not in (1, 2) or row_step < 1):
        raise BuildError(f"AMX runs one or two tiles of up to {AMX_ROWS} rows by one or two of {AMX_COLUMNS} int32, "
                         f"in steps of up to {AMX_DEPTH} (whole groups of 4) with 8 tile registers, not a {rows} x "
                         f"{cols} tile over {depth} in tiles of {tile_rows} rows and steps of {step}")
    name = f"roller_amx_{rows}x{cols}x{depth}_r{tile_rows}_s{step}_x{row_step}_{scope}"
    if TensorIntrin.get(name, allow_missing=True) is not None:
        return name
    groups, span = depth // 4, (rows - 1) * row_step + 1

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle):
        sa = T.int32()
        sb = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, (span, depth), "uint8", strides=[sa, 1], offset_factor=1)
        B = T.match_buffer(b, (groups, cols, 4), "int8", strides=[sb, 4, 1], offset_factor=1)
        C = T.match_buffer(c, (rows, cols), "int32", strides=[sc, 1], offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C[0:rows, 0:cols], A[0:span, 0:depth], B[0:groups, 0:cols, 0:4])
            T.writes(C[0:rows, 0:cols])
            for k, i, j, kk in T.grid(groups, rows, cols, 4):
                with T.sblock("update"):
                    vi = T.axis.spatial(rows, i)
                    vj = T.axis.spatial(cols, j)
                    vk = T.axis.reduce(depth, k * 4 + kk)
                    C[vi, vj] = C[vi, vj] + T.Cast("int32", A[vi * row_step, vk]) * T.Cast(
                        "int32", B[vk // 4, vj, vk % 4])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle):
        sa = T.int32()
        sb = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, (span, depth), "uint8", strides=[sa, 1], offset_factor=1)
        B = T.match_buffer(b, (groups, cols, 4), "int8", strides=[sb, 4, 1], offset_factor=1)
        C = T.match_buffer(c, (rows, cols), "int32", strides=[sc, 1], offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C[0:rows, 0:cols], A[0:span, 0:depth], B[0:groups, 0:cols, 0:4])
            T.writes(C[0:rows, 0:cols])
            for r in T.unroll(nr):
                for q in T.unroll(nc):
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(_ACC + r * 2 + q),
                                                  T.address_of(C[r * tile_rows, q * AMX_COLUMNS]), T.int64(sc * 4)))
            for s in T.serial(depth // step):
                for r in T.unroll(nr):
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(_ACT + r),
                                                  T.address_of(A[r * tile_rows * row_step, s * step]),
                                                  T.int64(sa * row_step)))
                for q in T.unroll(nc):
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(_WEIGHT + q),
                                                  T.address_of(B[s * (step // 4), q * AMX_COLUMNS, 0]), T.int64(sb)))
                for r in T.unroll(nr):
                    for q in T.unroll(nc):
                        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tdpbusd", T.int8(_ACC + r * 2 + q),
                                                      T.int8(_ACT + r), T.int8(_WEIGHT + q)))
            for r in T.unroll(nr):
                for q in T.unroll(nc):
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.int8(_ACC + r * 2 + q),
                                                  T.address_of(C[r * tile_rows, q * AMX_COLUMNS]), T.int64(sc * 4)))

    TensorIntrin.register(name, desc, impl)
    return name


def config_words(tile_rows: int = AMX_ROWS, step: int = AMX_DEPTH) -> list[int]:
    """The tile configuration (``ldtilecfg``'s 64 bytes) as eight little-endian uint64 words: palette 1; the
    bytes a row (bytes 16.., a uint16 a tile) and the rows (bytes 48.., a uint8 a tile) of each tile by role:
    accumulators tile_rows x 64, the activation's tile_rows x step, the weight's step / 4 x 64."""
    colsb = [ROW_BYTES] * 4 + [step] * 2 + [ROW_BYTES] * 2
    rows = [tile_rows] * 6 + [step // 4] * 2
    words = [1, 0, 0, 0, 0, 0, 0, 0]
    for t in range(8):
        words[2 + t // 4] |= colsb[t] << (16 * (t % 4))
        words[6] |= rows[t] << (8 * t)
    return words


def with_tile_state(sch, tile_rows: int = AMX_ROWS, step: int = AMX_DEPTH):
    """``sch`` with what its tensorized AMX units (:func:`register_amx`) rely on: first in the function, the
    request for the tile state (``arch_prctl``, a system call: Linux grants it per process, and repeats of
    it return at once), the calling thread's tile configuration saved (``sttilecfg``; zeros where it has
    none) and the kernel's (:func:`config_words`) loaded; then loaded again at the start of each iteration
    of the parallel loop around the units (each thread's tiles are its own: TVM's pool threads); last, the
    calling thread's configuration restored (zeros release its tiles). The calling thread is the program's
    own, which other libraries' AMX kernels share: onnxruntime's kept its configuration across calls and
    stopped on an illegal instruction after a roller kernel had loaded another. Loaded per unit instead,
    the configuration took a third of a 128x768x768 matmul's time (``ldtilecfg`` also zeroes the tiles)."""
    from tvm import s_tir, tirx

    from roller.errors import BuildError
    from roller.tir.tirtree import path_to, rebuilt, with_main

    def config_call(intrinsic: str, buf):
        """``ldtilecfg`` / ``sttilecfg`` of the 64-byte configuration in ``buf``."""
        first = tirx.address_of(tirx.BufferLoad(buf, [tirx.const(0, "int32")]))
        return tirx.Evaluate(tirx.call_llvm_intrin("void", intrinsic, first))

    func = sch.mod["main"]
    root = func.body
    block = root.block
    cfg = tirx.decl_buffer((8,), "uint64", "amx_tile_config")
    saved = tirx.decl_buffer((8,), "uint64", "amx_caller_tile_config")
    load = config_call("llvm.x86.ldtilecfg", cfg)
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
             for i, w in enumerate(config_words(tile_rows, step))]
    # the caller's buffer zeroed first: a buffer read only through its first element's address is allocated
    # that one element (TVM's lowering), and sttilecfg writes all 64 bytes
    zeros = [tirx.BufferStore(saved, tirx.const(0, "uint64"), [tirx.const(i, "int32")]) for i in range(8)]
    first = fills + zeros + [request, config_call("llvm.x86.sttilecfg", saved), load]
    last = config_call("llvm.x86.ldtilecfg", saved)
    new = s_tir.SBlockRealize(list(root.iter_values), root.predicate, s_tir.SBlock(
        list(block.iter_vars), list(block.reads), list(block.writes), block.name_hint,
        tirx.SeqStmt(first + [body, last]), block.init, list(block.alloc_buffers) + [cfg, saved],
        list(block.match_buffers), block.annotations))
    return with_main(sch, func.with_body(new))
