"""Calibration kernels, generated with TVM (TE + s_tir.Schedule, or TVMScript) for the target itself.

Three families, each with a numpy reference so tests can check what they compute:

- ``peak_kernel``: a register-tile matmul (the paper's "aggressively enlarged tile"): ``mr`` rows ×
  ``nv`` vectors of accumulators updated from L1-resident data in an unrolled, vectorized loop, repeated
  ``reps`` times, so the FMA units and not memory bound the time.
- ``stream_kernel``: read (sum into vector accumulators), write (fill) or read+write (in-place +1) over
  a buffer ``(units, rows, ROW)`` ``reps`` times; symbolic sizes, so one build serves the whole sweep.
- ``row_kernel``: reads the first ``row`` elements of every strided row (the small-transfer cost).

``parallel=True`` spreads the leading ``units`` axis over TVM's thread pool (all units); the serial
variant runs on the calling thread (one unit), so one process measures both.
"""
from __future__ import annotations

import numpy as np

# Elements of one stream row: 4 chunks of 128 float32 (8 AVX-512 vectors of independent accumulators,
# enough add chains to hide the add latency); 2 KiB per row, the sweep's size granularity per unit.
CHUNK = 128
ROW = 4 * CHUNK
STREAM_DTYPE = "float32"
STREAM_KINDS = ("read", "write", "rw")


def peak_kernel(dtype: str, lanes: int, mr: int, nv: int, k: int, reps: int, units: int, parallel: bool):
    """PrimFunc ``C[u,i,j] = Σ_{r<reps, kk<k} A[u,i,kk]·B[u,kk,j]`` with a register-resident C tile.

    A: (units, mr, k), B: (units, k, nv·lanes), C: (units, mr, nv·lanes). Flops per call:
    ``2·units·mr·nv·lanes·k·reps`` (see ``peak_flops``).
    """
    import tvm
    from tvm import te

    nr = nv * lanes
    A = te.placeholder((units, mr, k), dtype, "A")
    B = te.placeholder((units, k, nr), dtype, "B")
    r = te.reduce_axis((0, reps), "r")
    kk = te.reduce_axis((0, k), "kk")
    C = te.compute((units, mr, nr), lambda u, i, j: te.sum(A[u, i, kk] * B[u, kk, j], axis=[r, kk]), "C")
    sch = tvm.s_tir.Schedule(te.create_prim_func([A, B, C]))
    blk = sch.get_sblock("C")
    # The accumulator tile lives in a local buffer that LLVM promotes to vector registers once every
    # index is constant (i unrolled, j vectorized).
    acc = sch.cache_write(blk, 0, "local")
    u, i, j, rr, kl = sch.get_loops(blk)
    sch.reorder(u, rr, kl, i, j)
    sch.reverse_compute_at(acc, u)
    sch.unroll(i)
    sch.vectorize(j)
    sch.vectorize(sch.get_loops(acc)[-1])
    if parallel:
        sch.parallel(u)
    sch.decompose_reduction(blk, rr)  # last: annotations fail after decompose (TVM-NOTES)
    return sch.mod["main"]


def peak_flops(units: int, mr: int, nv: int, lanes: int, k: int, reps: int) -> int:
    """Floating-point operations (multiply and add counted apart) of one ``peak_kernel`` call."""
    return 2 * units * mr * nv * lanes * k * reps


def peak_inputs(dtype: str, units: int, mr: int, nv: int, lanes: int, k: int,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Check data for ``peak_kernel``: A with one non-zero column (so exact sums stay small in every
    dtype) and B of small integers."""
    a = np.zeros((units, mr, k), dtype)
    a[:, :, 0] = 1
    return a, rng.integers(0, 3, (units, k, nv * lanes)).astype(dtype)


def peak_reference(a: np.ndarray, b: np.ndarray, reps: int) -> np.ndarray:
    """numpy ``peak_kernel`` result in float64."""
    return reps * np.einsum("uik,ukj->uij", a.astype("float64"), b.astype("float64"))


def _int8_peak_func(units: int, rows: int, cols: int, k: int, reps: int):
    """``C[u,i,j] = Σ_{r,kk} A[u,i,kk]·B[u,kk//4,j,kk%4]`` over ``reps`` repeats, u8 × s8 → s32: A (units, rows,
    k), B (units, k/4, cols, 4) (packed four deep, as vpdpbusd and tdpbusd read it), C (units, rows, cols)."""
    from tvm import te

    A = te.placeholder((units, rows, k), "uint8", "A")
    B = te.placeholder((units, k // 4, cols, 4), "int8", "B")
    r = te.reduce_axis((0, reps), "r")
    kk = te.reduce_axis((0, k), "kk")
    C = te.compute((units, rows, cols), lambda u, i, j: te.sum(
        A[u, i, kk].astype("int32") * B[u, kk // 4, j, kk % 4].astype("int32"), axis=[r, kk]), "C")
    return te.create_prim_func([A, B, C])


def int8_peak_kernel(mr: int, nv: int, k: int, reps: int, units: int, parallel: bool):
    """The int8 peak tile: ``C[u,i,j] = Σ_{r,kk} A[u,i,kk]·B[u,kk//4,j,kk%4]``, u8 × s8 → s32, via VNNI.

    A: (units, mr, k) uint8, B: (units, k/4, nv·16, 4) int8 (packed four deep, as vpdpbusd reads it),
    C: (units, mr, nv·16) int32 in registers. Operations per call: ``int8_peak_ops``.
    """
    import tvm

    from roller.targets.cpu.vnni import register_vnni

    sch = tvm.s_tir.Schedule(_int8_peak_func(units, mr, nv * 16, k, reps))
    blk = sch.get_sblock("C")
    acc = sch.cache_write(blk, 0, "local")
    u, i, j, rr, kl = sch.get_loops(blk)
    ko, ki = sch.split(kl, [None, 4])
    jo, ji = sch.split(j, [None, 16])
    sch.reorder(u, rr, ko, i, jo, ji, ki)
    sch.reverse_compute_at(acc, u)
    sch.unroll(i)
    sch.unroll(jo)
    sch.vectorize(sch.get_loops(acc)[-1])
    if parallel:
        sch.parallel(u)
    init = sch.decompose_reduction(blk, rr)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.tensorize(ji, register_vnni(16, "local"))  # the peak tile keeps C in a local buffer
    return sch.mod["main"]


def int8_peak_ops(units: int, mr: int, nv: int, k: int, reps: int) -> int:
    """Integer operations (multiply and add apart) of one ``int8_peak_kernel`` call."""
    return 2 * units * mr * nv * 16 * k * reps


def int8_peak_reference(a: np.ndarray, b: np.ndarray, reps: int) -> np.ndarray:
    """numpy ``int8_peak_kernel`` result (int64; the kernel wraps at int32)."""
    u, ko, nr, _ = b.shape
    unpacked = b.transpose(0, 1, 3, 2).reshape(u, ko * 4, nr).astype("int64")
    return reps * np.einsum("uik,ukj->uij", a.astype("int64"), unpacked)


AMX_ROWS, AMX_COLS, AMX_K = 32, 32, 256  # the matrix unit's peak tile: 2 x 2 accumulator tiles, 4 64-deep steps


def amx_peak_kernel(reps: int, units: int, parallel: bool):
    """The matrix unit's int8 peak tile (AMX): ``C[u] += reps x A[u] @ B[u]`` as ``reps`` register tiles of
    roller's AMX intrinsic (``roller.targets.cpu.amx``: each loads its 2 x 2 accumulator tiles, runs 4
    64-deep steps of 2 + 2 operand tile loads and 4 tdpbusd from L1, stores the tiles), on the tile state
    the code generator sets up. A: (units, 32, 256) uint8, B: (units, 64, 32, 4) int8, C: (units, 32, 32)
    int32 (the accumulators' buffer, zero before the call). Operations per call: ``amx_peak_ops``."""
    import tvm

    from roller.targets.cpu.amx import register_amx, with_tile_state

    sch = tvm.s_tir.Schedule(_int8_peak_func(units, AMX_ROWS, AMX_COLS, AMX_K, reps))
    blk = sch.get_sblock("C")
    u, i, j, rr, kl = sch.get_loops(blk)
    ko, ki = sch.split(kl, [None, 4])
    sch.reorder(u, rr, ko, i, j, ki)
    if parallel:
        sch.parallel(u)
    sch.decompose_reduction(blk, rr)
    sch.tensorize(ko, register_amx(AMX_ROWS, AMX_COLS, AMX_K))
    return with_tile_state(sch).mod["main"]


def amx_peak_ops(units: int, reps: int) -> int:
    """Integer operations (multiply and add apart) of one ``amx_peak_kernel`` call."""
    return 2 * units * AMX_ROWS * AMX_COLS * AMX_K * reps


def stream_kernel(kind: str, parallel: bool):
    """PrimFunc ``(A, O, reps)`` over A: (units, rows, ROW) float32, O: (units, CHUNK); symbolic sizes.

    read: ``O[u] = Σ_t Σ_rows Σ_chunks A[u, r, chunk]``; write: ``A[:] = reps - 1`` (O untouched);
    rw: ``A += 1`` reps times (O untouched). Bytes moved per call: ``reps·A.nbytes`` (×2 for rw).
    """
    if kind not in STREAM_KINDS:
        raise ValueError(f"stream kind {kind!r}: use one of {STREAM_KINDS}")
    from tvm.script import tirx as T

    dt = STREAM_DTYPE
    ch, nch, row = CHUNK, ROW // CHUNK, ROW
    loop = T.parallel if parallel else T.serial
    is_read, is_write = kind == "read", kind == "write"  # Python constants: TVMScript keeps one branch

    @T.prim_func
    def f(a: T.handle, o: T.handle, reps: T.int32):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        U = T.int32()
        R = T.int32()
        A = T.match_buffer(a, (U, R, row), dt)
        O = T.match_buffer(o, (U, ch), dt)
        for u in loop(U):
            if is_read:
                acc = T.decl_buffer((ch,), dt, scope="local")
                for w in T.vectorized(ch):
                    acc[w] = T.float32(0)
                for t in range(reps):
                    for r in range(R):
                        for c in T.unroll(nch):
                            for w in T.vectorized(ch):
                                acc[w] = acc[w] + A[u, r, c * ch + w]
                for w in T.vectorized(ch):
                    O[u, w] = acc[w]
            elif is_write:
                # The value depends on t so LLVM can neither drop earlier passes nor emit a memset.
                for t in range(reps):
                    for r in range(R):
                        for c in T.unroll(nch):
                            for w in T.vectorized(ch):
                                A[u, r, c * ch + w] = T.Cast(dt, t)
            else:
                for t in range(reps):
                    for r in range(R):
                        for c in T.unroll(nch):
                            for w in T.vectorized(ch):
                                A[u, r, c * ch + w] = A[u, r, c * ch + w] + T.float32(1)
    return f


def stream_reference(kind: str, a: np.ndarray, reps: int) -> np.ndarray:
    """numpy result of ``stream_kernel(kind)`` on A = ``a`` (units, rows, ROW): O for read, A otherwise."""
    if kind == "read":
        u = a.shape[0]
        return reps * a.astype("float64").reshape(u, -1, CHUNK).sum(axis=1)
    if kind == "write":
        return np.full_like(a, reps - 1)
    return a + reps


def stream_bytes(kind: str, nbytes: int, reps: int) -> int:
    """Bytes a ``stream_kernel`` call moves between the core and the memory level holding A."""
    return reps * nbytes * (2 if kind == "rw" else 1)


def row_kernel(row: int):
    """PrimFunc ``(A, O)``: ``O[l] = Σ_n A[n, l]`` for ``l < row`` over A: (rows, stride) float32.

    Only the first ``row`` elements of each strided row are read: the small-transfer probe.
    """
    from tvm.script import tirx as T

    dt = STREAM_DTYPE

    @T.prim_func
    def f(a: T.handle, o: T.handle):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        N = T.int32()
        S = T.int32()
        A = T.match_buffer(a, (N, S), dt)
        O = T.match_buffer(o, (row,), dt)
        acc = T.decl_buffer((row,), dt, scope="local")
        for w in T.vectorized(row):
            acc[w] = T.float32(0)
        for n in range(N):
            for w in T.vectorized(row):
                acc[w] = acc[w] + A[n, w]
        for w in T.vectorized(row):
            O[w] = acc[w]
    return f


def row_reference(a: np.ndarray, row: int) -> np.ndarray:
    """numpy result of ``row_kernel(row)``."""
    return a[:, :row].astype("float64").sum(axis=0)
