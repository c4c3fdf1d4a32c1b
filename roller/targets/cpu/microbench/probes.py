"""Calibration probes of the cost model's terms: pairs of kernels that differ in one thing only, so that their
time difference is the cost the model charges for it (issue 33: every cost term measured on the device).

- ``launch_kernel``: a tiny write over ``units`` rows, the rows a parallel loop or a serial one; the
  difference is TVM's thread pool starting and joining (``model.parallel_launch_cycles``).
- ``share_kernel``: every unit writes its slice of each cache line (``shared``), or the same number of
  stores to lines of its own; the difference per line is what a line two units write costs
  (``model.false_sharing_seconds``).
- ``accumulator_kernel``: a register tile of ``mr`` x ``nv`` vectors over ``tiles`` tiles and a reduction in
  ``chunks`` chunks; ``moved``, the chunk loop runs outside the tile loop, so every tile loads its
  accumulators from memory and stores them back at each chunk, as code generation does where a plan splits
  its reduction above several register tiles; otherwise they stay in registers for the whole reduction
  (``model.accumulator_cycles``, per vector moved).

Each has a numpy reference, so the runner checks what it computes before timing it.
"""
from __future__ import annotations

import numpy as np


def launch_kernel(parallel: bool):
    """PrimFunc ``(O,)`` over O: (units, 16) float32: ``O += 1``, the rows a parallel loop or a serial one."""
    from tvm.script import tirx as T

    loop = T.parallel if parallel else T.serial

    @T.prim_func
    def f(o: T.handle):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        U = T.int32()
        O = T.match_buffer(o, (U, 16), "float32")
        for u in loop(U):
            for w in T.vectorized(16):
                O[u, w] = O[u, w] + T.float32(1)
    return f


def share_kernel(units: int, line_elems: int, shared: bool):
    """PrimFunc ``(O, reps)``: ``reps`` times, every unit adds 1 to ``line_elems // units`` floats of every
    line. ``shared``: O is (lines, line_elems) and unit u writes the u-th slice of each line (every line
    written by all units); otherwise O is (units, lines, line_elems) and unit u writes the first slice of its
    own lines. The same stores either way."""
    from tvm.script import tirx as T

    part = line_elems // units

    @T.prim_func
    def f_shared(o: T.handle, reps: T.int32):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        L = T.int32()
        O = T.match_buffer(o, (L, line_elems), "float32")
        for u in T.parallel(units):
            for t in range(reps):
                for line in range(L):
                    for w in T.vectorized(part):
                        O[line, u * part + w] = O[line, u * part + w] + T.float32(1)

    @T.prim_func
    def f_private(o: T.handle, reps: T.int32):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        L = T.int32()
        O = T.match_buffer(o, (units, L, line_elems), "float32")
        for u in T.parallel(units):
            for t in range(reps):
                for line in range(L):
                    for w in T.vectorized(part):
                        O[u, line, w] = O[u, line, w] + T.float32(1)
    return f_shared if shared else f_private


def share_reference(o: np.ndarray, units: int, reps: int, shared: bool) -> np.ndarray:
    """numpy result of ``share_kernel`` on O = ``o``."""
    out = o.copy()
    part = out.shape[-1] // units
    if shared:
        out[:, :part * units] += reps
    else:
        out[:, :, :part] += reps
    return out


def accumulator_kernel(lanes: int, mr: int, nv: int, tiles: int, chunks: int, chunk: int, reps: int, moved: bool):
    """PrimFunc ``(A, B, C)``: ``C += reps * A @ B`` over A: (tiles * mr, K), B: (K, nv * lanes),
    C: (tiles * mr, nv * lanes), K = chunks * chunk, one register tile of mr x nv vectors at a time.

    ``moved``: chunks outside tiles, the accumulators loaded from C and stored back at every chunk (2 x chunks
    moves a vector a pass); otherwise loaded once and stored once a pass (2 moves)."""
    from tvm.script import tirx as T

    nr, m, k = nv * lanes, tiles * mr, chunks * chunk
    # two functions, not one with a branch: they differ in the order of the chunk and tile loops, which is the point

    @T.prim_func
    def f_moved(a: T.handle, b: T.handle, c: T.handle):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        A = T.match_buffer(a, (m, k), "float32")
        B = T.match_buffer(b, (k, nr), "float32")
        C = T.match_buffer(c, (m, nr), "float32")
        acc = T.decl_buffer((mr, nr), "float32", scope="local")
        for r in range(reps):
            for ch in range(chunks):
                for t in range(tiles):
                    for i in T.unroll(mr):
                        for j in T.vectorized(nr):
                            acc[i, j] = C[t * mr + i, j]
                    for kk in range(chunk):
                        for i in T.unroll(mr):
                            for j in T.vectorized(nr):
                                acc[i, j] = acc[i, j] + A[t * mr + i, ch * chunk + kk] * B[ch * chunk + kk, j]
                    for i in T.unroll(mr):
                        for j in T.vectorized(nr):
                            C[t * mr + i, j] = acc[i, j]

    @T.prim_func
    def f_held(a: T.handle, b: T.handle, c: T.handle):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        A = T.match_buffer(a, (m, k), "float32")
        B = T.match_buffer(b, (k, nr), "float32")
        C = T.match_buffer(c, (m, nr), "float32")
        acc = T.decl_buffer((mr, nr), "float32", scope="local")
        for r in range(reps):
            for t in range(tiles):
                for i in T.unroll(mr):
                    for j in T.vectorized(nr):
                        acc[i, j] = C[t * mr + i, j]
                for ch in range(chunks):
                    for kk in range(chunk):
                        for i in T.unroll(mr):
                            for j in T.vectorized(nr):
                                acc[i, j] = acc[i, j] + A[t * mr + i, ch * chunk + kk] * B[ch * chunk + kk, j]
                for i in T.unroll(mr):
                    for j in T.vectorized(nr):
                        C[t * mr + i, j] = acc[i, j]
    return f_moved if moved else f_held


def accumulator_inputs(m: int, k: int, nr: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Small integers, so that the sums are exact in float32 and the check is exact."""
    return rng.integers(0, 3, (m, k)).astype("float32"), rng.integers(0, 3, (k, nr)).astype("float32")


def accumulator_reference(a: np.ndarray, b: np.ndarray, reps: int) -> np.ndarray:
    """numpy result of ``accumulator_kernel`` on a zeroed C."""
    return reps * (a.astype("float64") @ b.astype("float64"))
