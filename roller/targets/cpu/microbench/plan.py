"""What to measure on a device: working sets per memory level, the sweep, the peak kernels' tiles.

Plain Python over a ``roller.device.Device`` (no TVM): the plan is a JSON-able dict handed to the
measuring process (``roller.targets.cpu.microbench.runner``), and unit-testable with synthetic devices.
"""
from __future__ import annotations

import math
import os

from roller.device.spec import Device, MemoryLevel
from roller.errors import CalibrationError

from roller.targets.cpu.microbench.kernels import ROW

ROW_BYTES = ROW * 4          # one stream row (float32): the size granularity per unit
DRAM_MIN_BYTES = 256 << 20   # main-memory working set: at least this, and 4x the level above
SMALL_ROWS = (1, 4, 8, 16, 32)  # small-transfer row lengths, float32 elements
PEAK_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "int32")
SWEEP_START = 16 << 10
PREFETCH_GEMM = {"M": 128, "N": 3072, "K": 768}  # the software-prefetch probe's GEMM (microbench.prefetch)


def memory_cap_bytes() -> int:
    """Largest buffer the sweep allocates: 1/8 of physical memory, at most 2 GiB."""
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        phys = 8 << 30
    return int(min(2 << 30, phys // 8))


def swept_levels(device: Device) -> list[MemoryLevel]:
    """The levels a working-set sweep can reach: all but registers (storage scope ``local``)."""
    return [lv for lv in device.levels if lv.storage_scope != "local"]


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def level_working_sets(device: Device, units: int, cap: int | None = None) -> tuple[dict[str, int], list[str]]:
    """Total working set (bytes) that puts ``units`` active units' data well inside each swept level.

    A private level holds ``capacity × units``, a shared one ``capacity``. Inside a level the working
    set is a third (private) or an eighth (shared: other tenants use it too) of what it holds, and at
    least twice what the level
    above holds; main memory (the last level) gets 4× the level above, at least 256 MiB, at most
    ``cap``. Returns (level → bytes, warnings for levels too close to the one above to separate).
    """
    cap = cap or memory_cap_bytes()
    levels = swept_levels(device)
    if not levels:
        raise CalibrationError(f"device {device.name!r}: no memory level to sweep (all are registers)")
    first = device.levels.index(levels[0])
    above = device.levels[first - 1] if first > 0 else None
    prev_hold = (above.capacity_bytes * (1 if above.shared else units)) if above else 0
    grain = units * ROW_BYTES
    out, warns = {}, []
    for i, lv in enumerate(levels):
        hold = lv.capacity_bytes * (1 if lv.shared else units)
        if i == len(levels) - 1:
            ws = min(max(4 * prev_hold, DRAM_MIN_BYTES), cap)
            if ws < 2 * prev_hold:
                warns.append(f"{lv.name}: working set {ws >> 20} MiB is under twice the level above "
                             f"({prev_hold >> 20} MiB): its figure may include cache hits")
        else:
            ws = max(hold // (8 if lv.shared else 3), 2 * prev_hold)
            if ws > 3 * hold // 4:
                ws = min(int(math.sqrt(max(prev_hold, 1) * hold)), 3 * hold // 4)
                warns.append(f"{lv.name}: capacity {hold} B is too close to the level above ({prev_hold} B) "
                             f"to keep a working set well inside it; using {ws} B")
        out[lv.name] = _round_up(max(ws, grain), grain)
        prev_hold = hold
    return out, warns


def sweep_sizes(largest: int, units: int, start: int = SWEEP_START) -> list[int]:
    """Working sets doubling from ``start`` to ``largest`` (rounded to the row granularity)."""
    grain = units * ROW_BYTES
    sizes, s = [], start
    while s < largest:
        sizes.append(_round_up(s, grain))
        s *= 2
    return sorted(set(sizes))


def peak_tile(device: Device, dtype: str) -> dict:
    """The register tile of the peak kernel: ``mr`` rows × ``nv`` vectors of accumulators.

    The accumulators take all vector registers but four (one broadcast, two loaded B vectors, spare);
    A and B (k deep) stay well inside L1.
    """
    from roller.dtypes import dtype_bytes

    vec = device.units.vector_bytes or 32
    regs = 16
    reg = next((lv for lv in device.levels if lv.storage_scope == "local"), None)
    if reg is not None:
        regs = max(8, reg.capacity_bytes // vec)
    nv = 2
    mr = max(1, (regs - 4) // nv)
    lanes = device.units.lanes(dtype)
    b = dtype_bytes(dtype)
    l1_bytes = _l1_bytes(device)
    k = 64
    while k > 8 and k * (mr + nv * lanes) * b > l1_bytes // 2:
        k //= 2
    return {"dtype": dtype, "lanes": lanes, "mr": mr, "nv": nv, "k": k}


def _l1_bytes(device: Device) -> int:
    """Capacity of the first cache (the level nearest compute that is not registers), where it is a unit's own;
    32 KiB otherwise."""
    l1 = next((lv for lv in device.levels if lv.storage_scope != "local"), None)
    return l1.capacity_bytes if l1 is not None and not l1.shared else 32 << 10


def probe_plan(device: Device) -> dict:
    """Sizes of the cost model's probes (``roller.targets.cpu.microbench.probes``): the false-sharing probe's
    lines (a cache line of float32s, each unit a slice of it) and the accumulator probe's tile (the float32
    peak tile's rows and vectors, 4 tiles, 8 chunks of a reduction short enough that A, B and C stay in half of
    L1) and the prefetch probe's GEMM (``PREFETCH_GEMM``)."""
    line_bytes = next((lv.transaction_bytes for lv in device.levels if lv.storage_scope != "local"), 64)
    tile = peak_tile(device, "float32")
    lanes, mr, nv = tile["lanes"], tile["mr"], tile["nv"]
    l1_bytes = _l1_bytes(device)
    tiles, chunks, chunk = 4, 8, 8
    while chunk > 1 and 4 * (tiles * mr * chunks * chunk + chunks * chunk * nv * lanes + tiles * mr * nv * lanes) \
            > l1_bytes // 2:
        chunk //= 2
    return {"line_elems": max(1, line_bytes // 4), "share_lines": 256, "share_reps": 200,
            "accumulator": {"lanes": lanes, "mr": mr, "nv": nv, "tiles": tiles, "chunks": chunks, "chunk": chunk,
                            "reps": 40},
            # BERT-base's first FFN GEMM at 128 tokens: a 9 MiB weight, read from memory after each flush
            "prefetch": {"shape": dict(PREFETCH_GEMM), "rounds": 5}}


def make_plan(device: Device, threads: int, quick: bool = False) -> dict:
    """The full measurement plan for ``device`` with ``threads`` units active in the all-units runs."""
    if device.kind != "cpu":
        raise CalibrationError(f"device {device.name!r} is a {device.kind}: make_plan plans CPUs; GPUs are "
                               f"planned by roller.targets.cuda.microbench.make_gpu_plan")
    cap = memory_cap_bytes()
    one, w1 = level_working_sets(device, 1, cap)
    allu, wn = level_working_sets(device, threads, cap)
    plan = {
        "device": device.to_dict(),
        "threads": threads,
        "quick": quick,
        "levels": {name: {"one": one[name], "all": allu[name]} for name in one},
        "sweep": {"one": [] if quick else sweep_sizes(max(one.values()), 1),
                  "all": [] if quick else sweep_sizes(max(allu.values()), threads)},
        "peak": [peak_tile(device, dt) for dt in PEAK_DTYPES],
        "small": {"rows": [1, 16] if quick else list(SMALL_ROWS),
                  "stride_bytes": 4 * swept_levels(device)[-1].transaction_bytes,
                  "bytes": one[swept_levels(device)[-1].name]},
        # Timing: each call about 1 ms (short enough that some repeats run within one scheduler
        # slice on a busy machine), repeated to fill a time budget per figure within bounds.
        "peak_call_seconds": 0.001,
        "target_bytes": 64 << 20,   # bytes one stream call moves (at least one pass over the set)
        "budget_seconds": 0.015 if quick else 0.035,
        "min_repeat": 3,
        "max_repeat": 15 if quick else 30,
        # Peaks, level points and small transfers are measured in several rounds spread over the run
        # and each figure keeps its best round: a shared machine changes speed over seconds.
        "rounds": 2 if quick else 4,
        "extra_rounds": 1 if quick else 3,  # all-units re-measurements when other processes held cores
        "deadline_seconds": 11 if quick else 48,  # no extra round starts that would end after this
        "probes": probe_plan(device),
        "probe_rounds": 5,  # the full plan only: --quick probes nothing
        "warnings": sorted(set(w1 + wn)),
    }
    return plan
