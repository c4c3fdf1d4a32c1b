"""Runs a calibration plan (``roller.targets.cpu.microbench.plan.make_plan``) and reports the raw measurements.

Meant to run in its own process (``python -m roller.targets.cpu.microbench.runner``, the plan as JSON on stdin) with
TVM_NUM_THREADS set to the plan's thread count before TVM starts its pool: serial kernels then measure
one unit and parallel kernels all units, and a TVM crash cannot take the caller down. It prints JSON
lines on stdout: ``{"event": "start", "total": N}``, ``{"event": "progress", "what": ...}`` per step,
then ``{"event": "result", "data": {...}}`` or ``{"event": "error", "message": ...}``.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Callable

import numpy as np

from roller.device.spec import ComputeUnits, Device, MemoryLevel, family_model, model_constants
from roller.errors import CalibrationError

from roller.targets.cpu.microbench import kernels as K
from roller.targets.cpu.microbench import probes as P
from roller.targets.cpu.microbench.prefetch import prefetch_probe

SKIP_BF16 = ("x86 has no bfloat16 FMA (only vdpbf16ps dot products into float32, and AMX tiles); "
             "TVM computes bfloat16 arithmetic through float32")
# All units together below this fraction of units × one unit: other processes held cores.
SCALING_OK = 0.7
# LLVM feature that gives a native vector FMA for each dtype beyond float32/float64.
NATIVE_FEATURE = {"float16": "avx512fp16", "int8": "avx512vnni"}


def device_from_json(d: dict) -> Device:
    """Rebuilds a Device from ``Device.to_dict()`` output (the plan carries it to this process)."""
    units = ComputeUnits(**d["units"])
    levels = tuple(MemoryLevel(**lv) for lv in d["levels"])
    return Device(name=d["name"], kind=d["kind"], target=d["target"], units=units, levels=levels,
                  description=d.get("description", ""), source=d.get("source", ""),
                  fingerprint=d.get("fingerprint", ""),
                  model=model_constants(d.get("model") or {}, "the plan's device", base=family_model(d["kind"])))


def rate_stats(work: float, seconds: list[float]) -> dict:
    """Rates (work per second) of each repeat, summarised.

    ``value`` is the median of the fastest third: other processes on a shared machine only ever slow
    a repeat down (repeats are short, so some run within one scheduler slice), so the fast repeats
    are the device; the median of them keeps a single lucky repeat out.
    """
    rates = sorted(work / s for s in seconds if s > 0)
    if not rates:
        raise CalibrationError("a kernel timed at zero seconds: the timer is unusable on this machine")
    fast = rates[len(rates) - max(1, len(rates) // 3):]
    return {"value": float(np.median(fast)), "median": float(np.median(rates)),
            "max": rates[-1], "min": rates[0], "n": len(rates)}


def round_stats(work: float, rounds: list[list[float]]) -> dict:
    """``rate_stats`` of the best round (rounds are minutes apart: the quietest one is the device)."""
    per = [rate_stats(work, r) for r in rounds]
    best = dict(max(per, key=lambda st: st["value"]))
    best.update(rounds=[st["value"] for st in per], n=sum(st["n"] for st in per))
    return best


class Runner:
    """Builds the kernels of a plan for its device and measures them (one process, one thread pool)."""

    def __init__(self, plan: dict, progress: Callable[[str], None] = lambda what: None,
                 more_steps: Callable[[int], None] = lambda n: None):
        import tvm

        from roller.tir.compile import target_for

        self.tvm = tvm
        self.plan = plan
        self.progress = progress
        self.more_steps = more_steps  # told when extra rounds add steps to the progress total
        self.device = device_from_json(plan["device"])
        self.target = target_for(self.device)
        self.dev = tvm.cpu()
        self.threads = int(plan["threads"])
        self.samples: dict[tuple, list[list[float]]] = {}  # by figure: per round, seconds per repeat
        self.peaks: dict[str, dict] = {}
        self.tensor_peaks: dict[str, dict] = {}  # the matrix unit's (AMX), by input dtype
        self.modules: dict[tuple, object] = {}
        self.points: dict[str, dict[int, dict]] = {"one": {}, "all": {}}
        self.flat = None

    # -- building -------------------------------------------------------------------------------
    def compile(self, func):
        """Compiled module (``tvm.runtime.Module``) of a PrimFunc for the plan's target."""
        ex = self.tvm.compile(self.tvm.IRModule({"main": func}), self.target)
        return ex.mod

    def time(self, key: tuple, mod, args, work: float) -> dict:
        """Rate of ``work`` per second over many short repeats, best of this and earlier rounds.

        One timed call sizes the repeat count to the plan's time budget, within its bounds. Rounds
        spread each figure's repeats over the whole run, so a burst of load from other processes
        spoils one round, not the figure (see ``round_stats``).
        """
        p = self.plan
        first = mod.time_evaluator("main", self.dev, number=1, repeat=1)(*args).results[0]
        n = int(min(p["max_repeat"], max(p["min_repeat"], p["budget_seconds"] / max(first, 1e-9))))
        ev = mod.time_evaluator("main", self.dev, number=1, repeat=n)
        self.samples.setdefault(key, []).append(list(ev(*args).results))
        return round_stats(work, self.samples[key])

    def steps(self) -> int:
        """Progress steps the whole plan takes (for the caller's progress bar)."""
        rounds = int(self.plan["rounds"])
        sizes = sum(len(self.sizes(mode, True)) + (rounds - 1) * len(self.sizes(mode, False, self.repeat_memory))
                    for mode in ("one", "all"))
        line = self.plan["probes"]["line_elems"]
        probes = 0 if self.plan["quick"] else 1 + (self.threads > 1) + (1 < self.threads <= line)  # at most
        return 1 + rounds * (2 * len(self.plan["peak"]) + 2 + len(self.plan["small"]["rows"])) + sizes + probes

    def sizes(self, mode: str, sweep: bool, memory: bool = True) -> list[int]:
        """Working sets measured in ``mode``: the levels' points (without main memory's, the largest, unless
        ``memory``), plus the sweep when ``sweep``."""
        pts = {lv[mode] for lv in self.plan["levels"].values()}
        if not memory:
            pts.discard(max(pts))
        return sorted(pts | set(self.plan["sweep"][mode]) if sweep else pts)

    @property
    def repeat_memory(self) -> bool:
        """Whether rounds after the first measure main memory again: not with ``quick``, where its passes over
        a working set of hundreds of MiB take most of the time (its figure moves least between rounds)."""
        return not self.plan["quick"]

    # -- peak compute ---------------------------------------------------------------------------
    def peak_support(self, dtype: str) -> str | None:
        """None when the target computes ``dtype`` natively, else why it is skipped."""
        from tvm.target.codegen import llvm_cpu_has_features

        if dtype in ("float32", "float64", "int32"):  # int32: a multiply and an add (vpmulld, vpaddd)
            return None
        if dtype == "bfloat16":
            return SKIP_BF16
        feat = NATIVE_FEATURE.get(dtype)
        if feat and llvm_cpu_has_features(feat, self.target):
            return None
        mcpu = self.target.attrs.get("mcpu", "?")
        return (f"target mcpu={mcpu} lacks {feat or 'a native ' + dtype + ' vector FMA'}, the instruction the "
                f"{dtype} peak tile needs (if the CPU has it, add it to the target's mattr); datasheet figure kept")

    def peak(self, tile: dict, modes=("one", "all")) -> dict:
        """Peak GFLOP/s of one unit and of all units for one dtype, or the reason it is skipped."""
        dtype = tile["dtype"]
        why = self.peak_support(dtype)
        if why:
            for _ in modes:
                self.progress(f"peak {dtype}: skipped")
            return {"skipped": why}
        lanes, mr, nv, k = tile["lanes"], tile["mr"], tile["nv"], tile["k"]
        per_rep = K.int8_peak_ops(1, mr, nv, k, 1) if dtype == "int8" else K.peak_flops(1, mr, nv, lanes, k, 1)
        datasheet = self.device.units.peak(dtype) * 1e9
        reps = max(1, int(datasheet * float(self.plan["peak_call_seconds"]) / per_rep))
        if dtype == "float16":
            reps = min(reps, 600)  # keeps the check's exact sums (≤ 3·reps) under float16's 2048 limit
        out = self.peaks.setdefault(dtype, {"tile": dict(tile, reps=reps)})
        for mode, units, par in (("one", 1, False), ("all", self.threads, True)):
            if mode not in modes:
                continue
            # Check data: one non-zero column of A, so exact sums stay small in every dtype.
            rng = np.random.default_rng(0)
            built = self.modules.get(("peak", dtype, mode))
            if dtype == "int8":
                mod = built or self.compile(K.int8_peak_kernel(mr, nv, k, reps, units, par))
                a = np.zeros((units, mr, k), "uint8")
                a[:, :, 0] = 1
                b = rng.integers(-2, 3, (units, k // 4, nv * 16, 4)).astype("int8")
                c_shape, c_dtype = (units, mr, nv * 16), "int32"
                work = K.int8_peak_ops(units, mr, nv, k, reps)
            else:
                mod = built or self.compile(K.peak_kernel(dtype, lanes, mr, nv, k, reps, units, par))
                a, b = K.peak_inputs(dtype, units, mr, nv, lanes, k, rng)
                c_shape, c_dtype = (units, mr, nv * lanes), dtype
                work = K.peak_flops(units, mr, nv, lanes, k, reps)
            ref = K.int8_peak_reference(a, b, reps) if dtype == "int8" else K.peak_reference(a, b, reps)
            A, B = (self.tvm.runtime.tensor(x, self.dev) for x in (a, b))
            C = self.tvm.runtime.empty(c_shape, c_dtype, self.dev)
            if built is None:
                mod["main"](A, B, C)
                if not np.array_equal(C.numpy().astype("float64"), ref.astype("float64")):
                    raise CalibrationError(f"peak kernel {dtype} ({mode}) computed a wrong result: "
                                           f"the roller.targets.cpu.microbench is broken for target {self.target}")
                self.modules["peak", dtype, mode] = mod
            st = self.time(("peak", dtype, mode), mod, [A, B, C], work / 1e9)
            out[mode] = st
            self.progress(f"peak {dtype} {mode}: {st['value']:.0f} GFLOP/s")
        return out

    def tensor_peak(self, modes=("one", "all")) -> dict:
        """The matrix unit's int8 peak (GOP/s of one unit and of all units; AMX, ``K.amx_peak_kernel``), or
        the reason it is skipped: a target without AMX."""
        from roller.plan.dot import has_amx

        if not has_amx(self.device):
            for _ in modes:
                self.progress("peak int8 matrix unit: skipped")
            return {"skipped": "the target has no matrix unit roller programs (AMX: mattr +amx-tile, +amx-int8)"}
        per_rep = K.amx_peak_ops(1, 1)
        reps = max(1, int(self.device.units.tensor_peak_gflops.get("int8", 4096.0) * 1e9
                          * float(self.plan["peak_call_seconds"]) / per_rep))
        out = self.tensor_peaks.setdefault("int8", {"tile": {"rows": K.AMX_ROWS, "cols": K.AMX_COLS,
                                                               "k": K.AMX_K, "reps": reps}})
        for mode, units, par in (("one", 1, False), ("all", self.threads, True)):
            if mode not in modes:
                continue
            built = self.modules.get(("tensor_peak", mode))
            mod = built or self.compile(K.amx_peak_kernel(reps, units, par))
            a = np.zeros((units, K.AMX_ROWS, K.AMX_K), "uint8")
            a[:, :, 0] = 1  # one non-zero column: the exact sums stay small
            b = np.random.default_rng(0).integers(-2, 3, (units, K.AMX_K // 4, K.AMX_COLS, 4)).astype("int8")
            A, B = (self.tvm.runtime.tensor(x, self.dev) for x in (a, b))
            C = self.tvm.runtime.tensor(np.zeros((units, K.AMX_ROWS, K.AMX_COLS), "int32"), self.dev)
            if built is None:
                mod["main"](A, B, C)
                if not np.array_equal(C.numpy().astype("int64"), K.int8_peak_reference(a, b, reps)):
                    raise CalibrationError(f"the AMX peak kernel ({mode}) computed a wrong result: "
                                           f"the roller.targets.cpu.microbench is broken for target {self.target}")
                self.modules["tensor_peak", mode] = mod
            st = self.time(("tensor_peak", mode), mod, [A, B, C], K.amx_peak_ops(units, reps) / 1e9)
            out[mode] = st
            self.progress(f"peak int8 matrix unit {mode}: {st['value']:.0f} GOP/s")
        return out

    # -- bandwidth ------------------------------------------------------------------------------
    def stream_modules(self) -> dict:
        """The six stream kernels, each checked once against numpy on a small buffer."""
        mods = {}
        rng = np.random.default_rng(1)
        for kind in K.STREAM_KINDS:
            for mode, par in (("one", False), ("all", True)):
                mod = self.compile(K.stream_kernel(kind, par))
                units = 1 if mode == "one" else self.threads
                a = rng.integers(0, 5, (units, 3, K.ROW)).astype("float32")
                A = self.tvm.runtime.tensor(a, self.dev)
                O = self.tvm.runtime.empty((units, K.CHUNK), "float32", self.dev)
                mod["main"](A, O, 3)
                got = O.numpy() if kind == "read" else A.numpy()
                if not np.array_equal(got, K.stream_reference(kind, a, 3)):
                    raise CalibrationError(f"stream kernel {kind} ({mode}) computed a wrong result: "
                                           f"the roller.targets.cpu.microbench is broken for target {self.target}")
                mods[kind, mode] = mod
        return mods

    def bandwidth(self, mods: dict, sweep: bool, modes=("one", "all"), memory: bool = True) -> None:
        """GB/s of read, write and read+write at every level's point (and the sweep's sizes)."""
        if self.flat is None:
            largest = max(max(self.sizes("one", True)), max(self.sizes("all", True)))
            self.flat = self.tvm.runtime.empty((largest // 4,), "float32", self.dev)
        for mode in modes:
            units = 1 if mode == "one" else self.threads
            O = self.tvm.runtime.empty((units, K.CHUNK), "float32", self.dev)
            for size in self.sizes(mode, sweep, memory):
                rows = size // (units * K.ROW * 4)
                A = self.flat._create_view((units, rows, K.ROW))
                nbytes = units * rows * K.ROW * 4
                reps = max(1, int(self.plan["target_bytes"]) // nbytes)
                point = {"bytes": nbytes, "reps": reps}
                for kind in ("write", "read", "rw"):  # write first: it puts the pages in place
                    point[kind] = self.time(("stream", kind, mode, size), mods[kind, mode], [A, O, reps],
                                            K.stream_bytes(kind, nbytes, reps) / 1e9)
                self.points[mode][size] = point
                self.progress(f"bandwidth {mode} {nbytes >> 10} KiB: read {point['read']['value']:.0f} GB/s")

    def small_transfer(self) -> dict:
        """Useful GB/s reading only the first ``row`` floats of rows ``stride_bytes`` apart (one unit)."""
        sp = self.plan["small"]
        stride, total = int(sp["stride_bytes"]), int(sp["bytes"])
        n = total // stride
        A = self.flat._create_view((n, stride // 4))  # main-memory buffer, already written
        rows = []
        for row in sp["rows"]:
            mod = self.modules.get(("row", row))
            if mod is None:
                mod = self.compile(K.row_kernel(row))
                small = np.arange(4 * max(row, stride // 4), dtype="float32").reshape(4, -1) % 7
                S = self.tvm.runtime.tensor(small, self.dev)
                So = self.tvm.runtime.empty((row,), "float32", self.dev)
                mod["main"](S, So)
                if not np.array_equal(So.numpy(), K.row_reference(small, row)):
                    raise CalibrationError(f"row kernel ({row} floats) computed a wrong result")
                self.modules["row", row] = mod
            O = self.tvm.runtime.empty((row,), "float32", self.dev)
            st = self.time(("row", row), mod, [A, O], n * row * 4 / 1e9)
            rows.append({"elems": row, "bytes": row * 4, "gbps": st})
            self.progress(f"small transfer {row * 4} B rows: {st['value']:.1f} GB/s")
        return {"stride_bytes": stride, "rows_read": n, "buffer_bytes": n * stride, "rows": rows}

    # -- the cost model's terms ----------------------------------------------------------------
    def paired(self, slow, fast, work: float, number: int) -> dict:
        """Seconds ``slow`` takes beyond ``fast`` per unit of ``work`` (calls of ``(mod, args)``): the two
        timed in turn ``probe_rounds`` times, each a median of repeats of ``number`` calls; the median of
        the rounds' differences (alternating rounds put drift on both alike). Keeps each round's figures."""
        diffs, rounds = [], []
        for _ in range(int(self.plan["probe_rounds"])):
            t = [float(np.median(mod.time_evaluator("main", self.dev, number=number, repeat=7)(*args).results))
                 for mod, args in (slow, fast)]
            diffs.append((t[0] - t[1]) / work)
            rounds.append(t)
        return {"value": float(np.median(diffs)), "rounds": rounds, "work": work}

    def probes(self) -> dict:
        """The cost model's terms measured by ``roller.targets.cpu.microbench.probes``, each checked against
        numpy first: pool launch and join (seconds a call), a line two units write (seconds a line), an
        accumulator vector moved through L1 (seconds a move, one unit, the float32 peak tile)."""
        spec = self.plan["probes"]
        out = {}
        tvm = self.tvm
        busy = self.busy()  # other processes held cores: units did not run at once, the probes of several would lie
        if self.threads > 1 and not busy:  # a pool to launch
            par, ser = self.compile(P.launch_kernel(True)), self.compile(P.launch_kernel(False))
            o = tvm.runtime.tensor(np.zeros((self.threads, 16), "float32"), self.dev)
            par(o)
            ser(o)
            if not np.array_equal(o.numpy(), np.full((self.threads, 16), 2, "float32")):
                raise CalibrationError("the launch probe computed a wrong result")
            out["launch"] = self.paired((par, [o]), (ser, [o]), 1, number=200)
            self.progress(f"probe: pool launch {out['launch']['value'] * 1e6:.2f} us")
        line, lines, reps = spec["line_elems"], spec["share_lines"], spec["share_reps"]
        if 1 < self.threads <= line and not busy:  # each unit a slice of the line
            shared = self.compile(P.share_kernel(self.threads, line, True))
            private = self.compile(P.share_kernel(self.threads, line, False))
            a = np.zeros((lines, line), "float32")
            b = np.zeros((self.threads, lines, line), "float32")
            A, B = tvm.runtime.tensor(a, self.dev), tvm.runtime.tensor(b, self.dev)
            shared(A, 3)
            private(B, 3)
            if not (np.array_equal(A.numpy(), P.share_reference(a, self.threads, 3, True))
                    and np.array_equal(B.numpy(), P.share_reference(b, self.threads, 3, False))):
                raise CalibrationError("the false-sharing probe computed a wrong result")
            out["false_sharing"] = self.paired((shared, [A, reps]), (private, [B, reps]), lines * reps,
                                               number=1)
            self.progress(f"probe: shared line {out['false_sharing']['value'] * 1e9:.1f} ns")
        acc = spec["accumulator"]
        lanes, mr, nv = acc["lanes"], acc["mr"], acc["nv"]
        tiles, chunks, chunk, reps = acc["tiles"], acc["chunks"], acc["chunk"], acc["reps"]
        moved = self.compile(P.accumulator_kernel(lanes, mr, nv, tiles, chunks, chunk, reps, True))
        held = self.compile(P.accumulator_kernel(lanes, mr, nv, tiles, chunks, chunk, reps, False))
        a, b = P.accumulator_inputs(tiles * mr, chunks * chunk, nv * lanes, np.random.default_rng(2))
        A, B = tvm.runtime.tensor(a, self.dev), tvm.runtime.tensor(b, self.dev)
        for mod in (moved, held):
            C = tvm.runtime.tensor(np.zeros((tiles * mr, nv * lanes), "float32"), self.dev)
            mod(A, B, C)
            if not np.array_equal(C.numpy(), P.accumulator_reference(a, b, reps)):
                raise CalibrationError("the accumulator probe computed a wrong result")
        moves = reps * tiles * mr * nv * 2 * (chunks - 1)  # beyond the held tiles' one load and store a pass
        out["accumulator"] = dict(self.paired((moved, [A, B, C]), (held, [A, B, C]), moves,
                                              number=10), tile=acc)
        self.progress(f"probe: accumulator move {out['accumulator']['value'] * 1e9:.3f} ns")
        pf = spec.get("prefetch")
        if pf and not busy:  # all units at once, as in a model
            try:
                out["prefetch"] = prefetch_probe(self.device, pf["shape"], pf["rounds"])
                self.progress(f"probe: software prefetch {out['prefetch']['value']:.3f}x")
            except CalibrationError as e:  # the spec's figure stays
                self.progress(f"probe: software prefetch not measured: {e}")
        return out

    def busy(self) -> bool:
        """True when some all-units peak fell under SCALING_OK × units × one unit (cores were taken)."""
        return self.threads > 1 and any(
            p["all"]["value"] < SCALING_OK * self.threads * p["one"]["value"]
            for p in self.peaks.values() if "all" in p)

    def run(self) -> dict:
        """Everything the plan asks for, as raw measurements (see roller.targets.cpu.calibrate for the summary)."""
        import tvm_ffi

        t0 = time.perf_counter()
        mods = self.stream_modules()
        self.progress("kernels built and checked")
        for rnd in range(int(self.plan["rounds"])):  # each figure keeps its best round
            t_round = time.perf_counter()
            peaks = {tile["dtype"]: self.peak(tile) for tile in self.plan["peak"]}
            tensor = {"int8": self.tensor_peak()}
            self.bandwidth(mods, sweep=rnd == 0, memory=rnd == 0 or self.repeat_memory)
            small = self.small_transfer()
            t_round = time.perf_counter() - t_round
        # Other processes held cores during every all-units run: spend what is left of the time budget
        # re-measuring the all-units figures (they need every core free at once).
        extra = 0
        while (extra < int(self.plan["extra_rounds"]) and self.busy()
               and time.perf_counter() - t0 + t_round < float(self.plan["deadline_seconds"])):
            extra += 1
            self.more_steps(1 + len(self.plan["peak"]) + len(self.sizes("all", False, self.repeat_memory)))
            self.progress(f"all units slowed by other processes: extra round {extra}")
            peaks = {tile["dtype"]: self.peak(tile, modes=("all",)) for tile in self.plan["peak"]}
            self.bandwidth(mods, sweep=False, modes=("all",), memory=self.repeat_memory)
        probes = {} if self.plan["quick"] else self.probes()
        bw = self.points
        return {
            "peak": peaks, "tensor_peak": tensor,
            "bandwidth": {m: [v[k] for k in sorted(v)] for m, v in bw.items()},
            "levels": {name: {mode: bw[mode][pt[mode]] for mode in ("one", "all")}
                       for name, pt in self.plan["levels"].items()},
            "rounds": int(self.plan["rounds"]), "extra_rounds": extra,
            "small_transfer": small, "probes": probes, "threads": self.threads,
            "tvm_num_threads": int(tvm_ffi.get_global_func("runtime.NumThreads")()),
            "target": str(self.target), "tvm_version": self.tvm.__version__,
            "seconds": time.perf_counter() - t0,
        }


def main() -> int:
    """Process entry point: plan on stdin, JSON lines on stdout (see the module docstring)."""
    def emit(**kw):
        sys.stdout.write(json.dumps(kw) + "\n")
        sys.stdout.flush()

    plan = json.load(sys.stdin)
    if os.environ.get("TVM_NUM_THREADS") != str(plan["threads"]):
        emit(event="error", message=f"TVM_NUM_THREADS is {os.environ.get('TVM_NUM_THREADS')!r}, the plan needs "
                                    f"{plan['threads']}: run through roller.targets.cpu.calibrate.run_calibration")
        return 1
    try:
        runner = Runner(plan, progress=lambda what: emit(event="progress", what=what),
                        more_steps=lambda n: emit(event="more", steps=n))
        emit(event="start", total=runner.steps())
        emit(event="result", data=runner.run())
    except CalibrationError as e:
        emit(event="error", message=str(e))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
