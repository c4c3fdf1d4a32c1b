"""GPU calibration: microbenchmark kernels in TIR (compiled like roller's kernels: TVM, then NVRTC), the plan
of sizes for a device, and the measurement (``measure``) on a ``roller.targets.cuda.runtime`` runtime.

Kernels (each checked against numpy on its first run, before any timing counts):

- ``fma_kernel``: every thread runs ``chains`` independent chains ``x = x * m + c`` for ``iters`` steps
  (float32: NVRTC contracts them to ``fma.rn.f32``; float16: ``__hfma`` per element). Peak FMA per dtype.
- ``read_kernel``: threads sum ``lanes``-wide vectors of a float32 buffer. ``per_block=False``: the blocks
  split the buffer (DRAM bandwidth, a buffer well over L2); ``per_block=True``: every block reads all of it
  (L2 bandwidth, a buffer inside L2 and over every SM's L1).
- ``smem_kernel``: a block fills a shared buffer, then each thread reads it ``reps`` times at addresses that
  change every read, a warp's 32 reads in 32 distinct banks (shared-memory bandwidth).
- ``rows_kernel``: reads only the first ``row`` elements of rows ``stride`` elements apart (small transfers).

Every kernel writes one partial sum per thread, so nothing is dead code. The same TIR runs as OpenCL on PoCL
in the tests: the numbers are known right though nobody can time them here.
"""
from __future__ import annotations

import numpy as np

from roller.device.spec import Device
from roller.errors import CalibrationError

PEAK_DTYPES = ("float32", "float16")
THREADS = 256
CHAINS = 8          # independent FMA chains a thread: enough to hide the FMA latency (4 cycles) at full occupancy
SMEM_FLOATS = 8192  # 32 KiB shared buffer (a power of two: the address wraps with a mask)
SMALL_ROW_BYTES = (4, 16, 32, 64, 128)
SMALL_STRIDE_BYTES = 512


def fma_kernel(dtype: str, blocks: int, threads: int, chains: int, iters: int):
    """PrimFunc ``(X, C, O)``: O[t, c] = chain of ``iters`` steps x = x * C[0] + C[1] from X[t, c]."""
    from tvm.script import tirx as T

    half = dtype == "float16"  # TVM emits half `*` and `+` as separate __hmul/__hadd: ask for __hfma itself

    @T.prim_func
    def f(X: T.Buffer((blocks * threads, chains), dtype), C: T.Buffer((2,), dtype),
          O: T.Buffer((blocks * threads, chains), dtype)):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for b in T.thread_binding(blocks, thread="blockIdx.x"):
            for t in T.thread_binding(threads, thread="threadIdx.x"):
                acc = T.decl_buffer((chains,), dtype, scope="local")
                for c in T.unroll(chains):
                    acc[c] = X[b * threads + t, c]
                for i in range(iters):
                    for c in T.unroll(chains):
                        if half:
                            acc[c] = T.call_pure_extern(dtype, "__hfma", acc[c], C[0], C[1])
                        else:
                            acc[c] = acc[c] * C[0] + C[1]
                for c in T.unroll(chains):
                    O[b * threads + t, c] = acc[c]
    return f


def fma_reference(x: np.ndarray, coef: np.ndarray, iters: int) -> np.ndarray:
    """numpy ``fma_kernel`` result, stepped in float64."""
    m, c = (float(v) for v in coef)
    out = x.astype("float64")
    for _ in range(iters):
        out = out * m + c
    return out


def fma_flops(blocks: int, threads: int, chains: int, iters: int) -> int:
    return 2 * blocks * threads * chains * iters


def read_kernel(n: int, blocks: int, threads: int, lanes: int, per_block: bool):
    """PrimFunc ``(A, O)`` over A: (n,) float32, O: (blocks·threads, lanes) partial sums (see module doc)."""
    from tvm.script import tirx as T

    span = threads * lanes if per_block else blocks * threads * lanes
    if n % span:
        raise CalibrationError(f"read kernel: {n} elements are not whole passes of {span}")
    passes = n // span

    @T.prim_func
    def f(A: T.Buffer((n,), "float32"), O: T.Buffer((blocks * threads, lanes), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for b in T.thread_binding(blocks, thread="blockIdx.x"):
            for t in T.thread_binding(threads, thread="threadIdx.x"):
                acc = T.decl_buffer((lanes,), "float32", scope="local")
                for v in T.vectorized(lanes):
                    acc[v] = T.float32(0)
                for i in range(passes):
                    for v in T.vectorized(lanes):
                        if per_block:
                            acc[v] = acc[v] + A[(i * threads + t) * lanes + v]
                        else:
                            acc[v] = acc[v] + A[((i * blocks + b) * threads + t) * lanes + v]
                for v in T.vectorized(lanes):
                    O[b * threads + t, v] = acc[v]
    return f


def read_reference(a: np.ndarray, blocks: int, threads: int, lanes: int, per_block: bool) -> np.ndarray:
    a = a.astype("float64")
    if per_block:
        per_thread = a.reshape(-1, threads, lanes).sum(axis=0)
        return np.tile(per_thread, (blocks, 1))
    return a.reshape(-1, blocks * threads, lanes).sum(axis=0)


def smem_kernel(blocks: int, threads: int, reps: int, size: int = SMEM_FLOATS):
    """PrimFunc ``(A, O)``: each block copies A (size floats) to shared memory, then thread t sums
    ``smem[(r·threads + t) mod size]`` for r < reps into O[b·threads + t]."""
    from tvm.script import tirx as T

    if size & (size - 1) or size % threads:
        raise CalibrationError(f"shared-memory kernel: {size} floats must be a power of two and whole rounds "
                               f"of {threads} threads")

    @T.prim_func
    def f(A: T.Buffer((size,), "float32"), O: T.Buffer((blocks * threads,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for b in T.thread_binding(blocks, thread="blockIdx.x"):
            for t in T.thread_binding(threads, thread="threadIdx.x"):
                sm = T.alloc_buffer((size,), "float32", scope="shared")
                acc = T.decl_buffer((1,), "float32", scope="local")
                for j in range(size // threads):
                    sm[j * threads + t] = A[j * threads + t]
                acc[0] = T.float32(0)
                for r in range(reps):
                    acc[0] = acc[0] + sm[(r * threads + t) % size]
                O[b * threads + t] = acc[0]
    return f


def smem_reference(a: np.ndarray, blocks: int, threads: int, reps: int) -> np.ndarray:
    size = a.shape[0]
    idx = (np.arange(reps)[:, None] * threads + np.arange(threads)[None, :]) % size
    return np.tile(a.astype("float64")[idx].sum(axis=0), blocks)


def rows_kernel(rows: int, row: int, stride: int, blocks: int, threads: int):
    """PrimFunc ``(A, O)`` over A: (rows, stride) float32: the block's threads sum elements ``e < row`` of the
    rows, element i of the flattened useful data going to thread i mod (blocks·threads)."""
    from tvm.script import tirx as T

    total, n = rows * row, blocks * threads
    if total % n:
        raise CalibrationError(f"rows kernel: {total} useful elements are not whole passes of {n} threads")
    passes = total // n

    @T.prim_func
    def f(A: T.Buffer((rows, stride), "float32"), O: T.Buffer((blocks * threads,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for b in T.thread_binding(blocks, thread="blockIdx.x"):
            for t in T.thread_binding(threads, thread="threadIdx.x"):
                acc = T.decl_buffer((1,), "float32", scope="local")
                acc[0] = T.float32(0)
                for i in range(passes):
                    acc[0] = acc[0] + A[((i * blocks + b) * threads + t) // row, ((i * blocks + b) * threads + t) % row]
                O[b * threads + t] = acc[0]
    return f


def rows_reference(a: np.ndarray, row: int, blocks: int, threads: int) -> np.ndarray:
    return a[:, :row].astype("float64").reshape(-1, blocks * threads).sum(axis=0)


# ---------------------------------------------------------------------------------------------
# The plan: sizes from the device's spec.

def _levels(device: Device) -> dict[str, str]:
    """Role -> level name: the shared-memory level, L2 (the first shared global level), DRAM (the last)."""
    smem = next((lv.name for lv in device.levels if lv.storage_scope == "shared"), None)
    glob = [lv for lv in device.levels if lv.storage_scope == "global"]
    if smem is None or len(glob) < 2:
        raise CalibrationError(f"device {device.name!r}: a GPU calibration needs a 'shared' level and two global "
                               f"levels (L2, DRAM) in its spec; it has {[lv.name for lv in device.levels]}")
    return {"smem": smem, "l2": glob[0].name, "dram": glob[-1].name}


def _whole(n: int, grain: int) -> int:
    return max(grain, n // grain * grain)


def make_gpu_plan(device: Device, scale: float = 1.0) -> dict:
    """Kernel sizes for ``device``: about a millisecond of work a kernel on the spec's figures (``scale``
    shrinks everything, for tests on a CPU's OpenCL)."""
    if device.kind != "gpu" or device.gpu is None:
        raise CalibrationError(f"device {device.name!r} is a {device.kind}: make_gpu_plan plans GPUs only")
    roles = _levels(device)
    sms, threads = device.units.count, THREADS
    resident = max(1, min(device.gpu.max_threads_per_sm // threads, device.gpu.max_blocks_per_sm))
    blocks = max(1, int(sms * resident * scale)) if scale < 1 else sms * resident
    peaks = {}
    for dt in PEAK_DTYPES:
        flops_per_iter = fma_flops(blocks, threads, CHAINS, 1)
        total = device.units.peak(dt) * sms * 1e9 * 1e-3 * scale
        peaks[dt] = {"dtype": dt, "blocks": blocks, "threads": threads, "chains": CHAINS,
                     "iters": max(4, int(total / flops_per_iter))}
    l2 = device.level(roles["l2"])
    lanes = 4
    dram_n = _whole(int(max(4 * l2.capacity_bytes, 256 << 20) * scale) // 4, blocks * threads * lanes)
    l2_n = _whole(int(l2.capacity_bytes // 4 * scale) // 4, threads * lanes)
    smem_bw = device.level(roles["smem"]).total_bandwidth_gbps
    smem_reps = max(16, int(smem_bw * 1e9 * 1e-3 * scale / (blocks * threads * 4)))
    rows = []
    for rb in SMALL_ROW_BYTES:
        row = rb // 4
        total_rows = _whole(int(dram_n * 4 // SMALL_STRIDE_BYTES), blocks * threads)
        rows.append({"row": row, "rows": total_rows, "stride": SMALL_STRIDE_BYTES // 4})
    for n in [dram_n] + [r["rows"] * r["stride"] for r in rows]:
        if n >= 2 ** 31:  # TIR indexes buffers with int32
            raise CalibrationError(f"device {device.name!r}: a {n}-element calibration buffer overflows int32 indices")
    return {"kind": "gpu", "device": device.name, "levels": roles, "scale": scale,
            "peak": [peaks[dt] for dt in PEAK_DTYPES],
            "dram": {"n": dram_n, "blocks": blocks, "threads": threads, "lanes": lanes},
            "l2": {"n": l2_n, "blocks": blocks, "threads": threads, "lanes": lanes},
            "smem": {"blocks": blocks, "threads": threads, "reps": smem_reps},
            "small": {"blocks": blocks, "threads": threads, "rows": rows}}


# ---------------------------------------------------------------------------------------------
# Measuring on a runtime.

def _module(func):
    import tvm

    return tvm.IRModule({"main": func})


def _check(name: str, got: np.ndarray, want: np.ndarray, rtol: float) -> None:
    if not np.allclose(got.astype("float64"), want, rtol=rtol, atol=rtol):
        bad = int(np.sum(~np.isclose(got.astype("float64"), want, rtol=rtol, atol=rtol)))
        raise CalibrationError(f"calibration kernel {name}: {bad} of {want.size} results differ from numpy; "
                               f"the figures would be of a wrong kernel")


def _timed(runtime, kernel, arrays, repeat: int) -> float:
    """Seconds a call: the median of the fastest third of ``repeat`` repeats (as the CPU's rate_stats: other
    work only ever slows a repeat down)."""
    timer = runtime.timer(kernel, arrays, target=0.01)
    secs = sorted(timer() for _ in range(repeat))
    return float(np.median(secs[:max(1, len(secs) // 3)]))


def measure(plan: dict, runtime, repeat: int = 10, progress=lambda what: None) -> dict:
    """Runs every kernel of ``plan`` on ``runtime`` (``roller.targets.cuda.runtime``): checks its result against numpy,
    then times it. Returns raw figures: GFLOP/s per dtype, GB/s per role, small-transfer GB/s per row size."""
    rng = np.random.default_rng(0)
    raw: dict = {"runtime": runtime.name, "peak": {}, "skipped": {}, "bandwidth": {}, "small": []}
    for p in plan["peak"]:
        dt, b, t, c, it = p["dtype"], p["blocks"], p["threads"], p["chains"], p["iters"]
        why = runtime.unsupported([dt])
        if why:
            raw["skipped"][dt] = why
            continue
        progress(f"peak {dt}")
        kern = runtime.compile(_module(fma_kernel(dt, b, t, c, it)))
        x = rng.uniform(-1, 1, (b * t, c)).astype(dt)
        coef = np.array([0.5, 0.25], dt)  # x -> 0.5 x + 0.25: bounded, exact in float16
        arrays = {"X": x, "C": coef, "O": np.zeros_like(x)}
        _check(f"fma {dt}", runtime.run(kern, arrays, ("O",))["O"], fma_reference(x, coef, it),
               1e-2 if dt == "float16" else 1e-5)
        raw["peak"][dt] = fma_flops(b, t, c, it) / _timed(runtime, kern, arrays, repeat) / 1e9
    for role, per_block in (("dram", False), ("l2", True)):
        q = plan[role]
        progress(f"{role} bandwidth")
        kern = runtime.compile(_module(read_kernel(q["n"], q["blocks"], q["threads"], q["lanes"], per_block)))
        a = rng.integers(-4, 5, q["n"]).astype("float32")  # small integers: the sums are exact
        arrays = {"A": a, "O": np.zeros((q["blocks"] * q["threads"], q["lanes"]), "float32")}
        _check(f"read {role}", runtime.run(kern, arrays, ("O",))["O"],
               read_reference(a, q["blocks"], q["threads"], q["lanes"], per_block), 1e-6)
        nbytes = q["n"] * 4 * (q["blocks"] if per_block else 1)
        raw["bandwidth"][role] = nbytes / _timed(runtime, kern, arrays, repeat) / 1e9
    q = plan["smem"]
    progress("shared-memory bandwidth")
    kern = runtime.compile(_module(smem_kernel(q["blocks"], q["threads"], q["reps"])))
    a = rng.integers(-4, 5, SMEM_FLOATS).astype("float32")
    arrays = {"A": a, "O": np.zeros(q["blocks"] * q["threads"], "float32")}
    _check("shared memory", runtime.run(kern, arrays, ("O",))["O"],
           smem_reference(a, q["blocks"], q["threads"], q["reps"]), 1e-6)
    raw["bandwidth"]["smem"] = q["blocks"] * q["threads"] * q["reps"] * 4 / _timed(runtime, kern, arrays, repeat) / 1e9
    q = plan["small"]
    for r in q["rows"]:
        progress(f"small transfers of {r['row'] * 4} B")
        kern = runtime.compile(_module(rows_kernel(r["rows"], r["row"], r["stride"], q["blocks"], q["threads"])))
        a = rng.integers(-4, 5, (r["rows"], r["stride"])).astype("float32")
        arrays = {"A": a, "O": np.zeros(q["blocks"] * q["threads"], "float32")}
        _check(f"rows of {r['row']}", runtime.run(kern, arrays, ("O",))["O"],
               rows_reference(a, r["row"], q["blocks"], q["threads"]), 1e-6)
        useful = r["rows"] * r["row"] * 4
        raw["small"].append({"bytes": r["row"] * 4, "gbps": useful / _timed(runtime, kern, arrays, repeat) / 1e9})
    return raw


def summarize_gpu(device: Device, plan: dict, raw: dict, seconds: float) -> dict:
    """The calibration dict (``roller.targets.cpu.calibrate``'s file schema) from ``measure``'s raw figures: per-SM
    peaks and bandwidths (``unit``) beside the whole GPU's (``total``)."""
    import datetime

    import tvm

    from roller.device.calibration import SCHEMA, figures

    sms = device.units.count
    roles = plan["levels"]
    bws = {roles[role]: {"unit": gbps / sms, "total": gbps} for role, gbps in raw["bandwidth"].items()}
    dram = raw["bandwidth"]["dram"]
    small = {"level": roles["dram"], "stride_bytes": SMALL_STRIDE_BYTES, "contiguous_gbps": dram / sms,
             "rows": [{"bytes": r["bytes"], "gbps": r["gbps"] / sms, "efficiency": min(1.0, r["gbps"] / dram)}
                      for r in raw["small"]]}
    warns = []
    for dt, g in raw["peak"].items():
        if g < 0.25 * device.units.peak(dt) * sms:
            warns.append(f"peak {dt} {g:.0f} GFLOP/s is under a quarter of the datasheet's "
                         f"{device.units.peak(dt) * sms:.0f}: another process held the GPU, or its clock was low")
    return {
        "schema": SCHEMA, "device": device.name, "fingerprint": device.fingerprint,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(seconds, 2), "quick": plan["scale"] < 1, "tvm_version": tvm.__version__,
        "target": dict(device.target), "threads": sms, "runtime": raw["runtime"],
        "peak_gflops": {dt: g / sms for dt, g in raw["peak"].items()},
        "peak_gflops_one": {}, "peak_gflops_all": dict(raw["peak"]), "skipped": dict(raw["skipped"]),
        "bandwidth_gbps": bws, "small_transfer": small, "sweep": {},
        "datasheet": figures(device), "warnings": warns,
    }


def calibrate_gpu(device: Device, runtime=None, quick: bool = False, progress=lambda what: None) -> dict:
    """Measures the GPU ``device`` on ``runtime`` (default: TVM's CUDA runtime, which must find the spec's GPU
    here) and returns the calibration dict; does not save it. CalibrationError in one line without that GPU."""
    import time

    from roller.errors import ToolchainError
    from roller.targets.cuda.runtime import CudaRuntime

    t0 = time.perf_counter()
    if runtime is None:
        try:
            runtime = CudaRuntime(device)
        except ToolchainError as e:
            raise CalibrationError(f"cannot calibrate {device.name!r} here: {e}; run `roller calibrate --device "
                                   f"{device.name}` on a machine with that GPU") from None
    plan = make_gpu_plan(device, scale=0.25 if quick else 1.0)
    raw = measure(plan, runtime, repeat=5 if quick else 20, progress=progress)
    return summarize_gpu(device, plan, raw, time.perf_counter() - t0)
