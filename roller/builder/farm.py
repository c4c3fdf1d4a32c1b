"""Top-K profiling: build candidate kernels in worker processes, check each against a reference, time the
verified ones on the same buffers in this process, keep the fastest (where it beat the model's first plan by
a margin, round by round: see time_finalists).

The worker pool that builds the candidates is :mod:`roller.builder.workers`, the folder the libraries go
to :mod:`roller.builder.buildroot`; this module verifies, places and times what they built.
"""
from __future__ import annotations

import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from roller.device.spec import Device
from roller.errors import BuildError
from roller.plan.expr import Expr
from roller.plan.cost import PAGE_BYTES
from roller.plan.rprogram import RProgram
from roller.measure.finalists import REPEATS, SCREEN_SECONDS, TARGET_MEASURE_SECONDS, Timing, time_finalists
from roller.measure.verify import TOLERANCE, check_inputs, fill_sentinel, wrong_result
from roller.builder.buildroot import KernelLibrary, build_root
from roller.builder.workers import BUILD_BUDGET_SECONDS, _build_all, _build_here
# re-exported: their callers import them from here
from roller.builder.workers import SKIPPED as SKIPPED, STOPPED as STOPPED, warm_up as warm_up

# Buffer placements every timed repeat spreads its calls over (placed_copies): a kernel's speed can depend on
# where its tensors sit relative to each other within a page (loads and stores 4 KiB apart alias in the L1
# and the store buffer), so a plan timed on one placement can win by luck (docs/design-notes.md#farm-placements).
PLACEMENTS = 4
PLACEMENT_BYTES = 256 << 20  # at most this many bytes of copies: fewer placements for large operators
PLACEMENT_ALIGN = 64  # the kernels' buffers are 64-byte aligned; offsets step by that


@dataclass
class CandidateResult:
    """What happened to one candidate. ``measured_seconds`` is None unless it built, verified and ran."""

    index: int
    program: RProgram | None
    compile_seconds: float | None = None
    verified: bool = False
    measured_seconds: float | None = None
    error: str | None = None
    lib_path: str | None = None
    notes: tuple[str, ...] = ()  # schedule steps that did not apply (the plan assumed them)

    def summary(self) -> str:
        """One line: the failure, or the measured time."""
        if self.error:
            return f"candidate {self.index}: {self.error.strip().splitlines()[-1][:300] if self.error.strip() else '?'}"
        if self.measured_seconds is None:
            return f"candidate {self.index}: verified, not timed"
        return f"candidate {self.index}: {self.measured_seconds * 1e3:.3f} ms"


@dataclass
class ProfileResult:
    """Outcome of :func:`profile`. ``module`` is the best kernel's loaded runtime module (call it, or
    ``module["main"]``, on tvm tensors); ``library`` its shared library, which the caller owns
    (:meth:`save` copies it, :meth:`cleanup` deletes it)."""

    candidates: list[CandidateResult]
    best: int | None
    module: object | None
    library: KernelLibrary | None

    @property
    def lib_path(self) -> str | None:
        return None if self.library is None else self.library.path

    @property
    def measured_seconds(self) -> list[float | None]:
        return [c.measured_seconds for c in self.candidates]

    @property
    def verified(self) -> list[bool]:
        return [c.verified for c in self.candidates]

    @property
    def error(self) -> list[str | None]:
        return [c.error for c in self.candidates]

    @property
    def compile_seconds(self) -> list[float | None]:
        return [c.compile_seconds for c in self.candidates]

    @property
    def best_program(self) -> RProgram | None:
        return None if self.best is None else self.candidates[self.best].program

    def save(self, directory: str | os.PathLike, name: str = "kernel.so") -> Path:
        """Copies the best kernel's shared library into ``directory``; returns its path."""
        if self.lib_path is None or not Path(self.lib_path).exists():
            raise BuildError("no kernel library to save: the profile has no best candidate or was cleaned up")
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        dst = out / name
        shutil.copyfile(self.lib_path, dst)
        return dst

    def cleanup(self) -> None:
        """Deletes the best kernel's library (the loaded module stays usable)."""
        if self.library is not None:
            self.library.close()


# ---------------------------------------------------------------------------------------------
# Caller side.


def placement_count(args) -> int:
    """How many placements of ``args`` (tvm tensors) :func:`profile` times on: PLACEMENTS, fewer where
    their copies would exceed PLACEMENT_BYTES."""
    total = sum(math.prod(a.shape) * a.dtype.itemsize for a in args)
    return max(1, min(PLACEMENTS, PLACEMENT_BYTES // max(1, total)))


def placed_copies(args, count: int, seed: int = 0) -> list[list]:
    """``count`` argument lists holding copies of ``args`` (tvm tensors on the CPU), every tensor at an offset
    within a page of its own (multiples of PLACEMENT_ALIGN, drawn from a generator seeded by ``seed``): the
    relative positions a kernel's buffers may take in a caller's memory."""
    rng = np.random.default_rng(seed)
    return [[_copy_at(a, int(rng.integers(0, PAGE_BYTES // PLACEMENT_ALIGN)) * PLACEMENT_ALIGN) for a in args]
            for _ in range(count)]


def _copy_at(tensor, offset: int):
    """A copy of ``tensor`` whose data starts ``offset`` bytes into a page (a view of a numpy arena: TVM's
    kernels take no byte offset, so the data pointer itself must sit there; the view keeps the arena)."""
    import tvm

    values = tensor.numpy()
    arena = np.empty(values.nbytes + PAGE_BYTES, np.uint8)
    start = (offset - arena.ctypes.data) % PAGE_BYTES
    raw = tvm.runtime.from_dlpack(arena[start:start + values.nbytes])
    placed = raw._create_view(tuple(values.shape), str(tensor.dtype), 0)
    placed.copyfrom(tensor)
    return placed


def _placed_timers(mod, dev, placements, targets: Sequence[float]) -> list[Callable[[], float]]:
    """Per target duration, one timed repeat of ``mod`` (seconds a call): ~that many seconds of calls split
    evenly over ``placements`` (argument lists), their mean; only as many placements as that time holds a
    call on."""
    t0 = time.perf_counter()
    mod["main"](*placements[0])
    dev.sync()
    call = max(time.perf_counter() - t0, 1e-7)

    def timer(target: float) -> Callable[[], float]:
        used = placements[:max(1, min(len(placements), int(target / call)))]
        number = max(1, min(1000, math.ceil(target / len(used) / call)))
        ev = mod.time_evaluator("main", dev, number=number, repeat=1)
        return lambda: statistics.fmean(float(ev(*args).results[0]) for args in used)
    return [timer(t) for t in targets]


def time_module(mod, dev, args, repeats: int = REPEATS) -> float:
    """Median seconds of one call of ``mod["main"](*args)`` over ``repeats`` repeats of
    ~TARGET_MEASURE_SECONDS of calls each, on these buffers only (the timer :func:`profile` uses, one placement)."""
    timer = _placed_timers(mod, dev, [args], (TARGET_MEASURE_SECONDS,))[0]
    return float(np.median([timer() for _ in range(repeats)]))


def _time_all(modules: dict, dev, placements) -> Timing:
    """``time_finalists`` of CPU modules, each repeat ~TARGET_MEASURE_SECONDS of calls (SCREEN_SECONDS in
    the screen) spread over the buffer ``placements`` (argument lists, :func:`placed_copies`): a kernel
    fast on one placement only is timed as the caller's buffers will find it, on average."""
    timers = {i: _placed_timers(mod, dev, placements, (TARGET_MEASURE_SECONDS, SCREEN_SECONDS))
              for i, mod in modules.items()}
    return time_finalists({i: t[0] for i, t in timers.items()}, {i: t[1] for i, t in timers.items()})


def profile(func, expr: Expr, programs: Sequence[RProgram], device: Device, inputs: Sequence[np.ndarray],
            reference: np.ndarray | None = None, rtol: float | None = None, atol: float | None = None,
            progress: bool = True, time_kernels: bool = True, build_budget: float | None = BUILD_BUDGET_SECONDS,
            in_process: bool = False, _worker_hook: Callable | None = None) -> ProfileResult:
    """Builds ``programs`` in worker processes, verifies each against ``reference`` (or, if None, the
    output of the unscheduled ``func``), times the verified ones and keeps the fastest where it beat the first
    verified one (the model's choice) by WIN_MARGIN (:func:`time_finalists`), else that one.

    ``inputs`` are the arrays of the function's input parameters in order; the remaining parameter is
    the output. Tolerances default to :data:`TOLERANCE` of the output dtype. Raises BuildError listing
    every candidate's failure when none builds and verifies. With ``time_kernels=False`` nothing is
    timed and the first verified candidate wins. Candidates whose build has not started after
    ``build_budget`` seconds of building are skipped (their error says so; None: no limit).
    ``in_process`` compiles in this thread instead of worker processes (no worker to start: the JIT's
    tiers; a TVM crash then ends this process, and a candidate already compiling is not stopped).
    ``_worker_hook(index, program_dict)`` runs
    in the worker before each build (tests use it to crash a worker).
    """
    import tvm

    from roller.tir.compile import set_threads, target_for

    if not programs:
        raise BuildError("profile: no candidate programs to build; the constructor returned none")
    set_threads(device.units.count)
    target_for(device)  # fail early, in the caller, on a bad target
    out_shape, out_dtype = check_inputs(func, inputs)
    rt, at = TOLERANCE.get(out_dtype, (0.0, 0.0))
    rtol = rt if rtol is None else rtol
    atol = at if atol is None else atol

    tmp = tempfile.mkdtemp(prefix="profile-", dir=build_root())
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(programs) + (reference is None), desc=f"profile {expr.name}", file=sys.stderr,
                   unit="kernel", leave=False)
    try:
        jobs: list[tuple[int, dict | None]] = [(i, p.to_dict()) for i, p in enumerate(programs)]
        if reference is None:
            jobs.append((-1, None))  # the unscheduled function gives the reference
        if in_process:
            built = _build_here(func, expr, jobs, device, tmp, bar, build_budget)
        else:
            built = _build_all(tvm.ir.save_json(func), expr, jobs, device, tmp, _worker_hook, bar, build_budget)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if bar is not None:
            bar.close()

    try:
        dev = tvm.cpu(0)
        args_in = [tvm.runtime.tensor(np.asarray(a, order="C"), dev) for a in inputs]
        out_np = np.empty(out_shape, dtype=out_dtype)
        out_tvm = tvm.runtime.tensor(fill_sentinel(out_np), dev)
        if reference is None:
            path, _, err, _ = built[-1]
            if path is None:
                raise BuildError(f"profile: the unscheduled {expr.name} (used as the reference) did not build: {err}")
            tvm.runtime.load_module(path)["main"](*args_in, out_tvm)
            reference = out_tvm.numpy()
        reference = np.asarray(reference)
        if reference.shape != out_shape:
            raise BuildError(f"profile: reference has shape {reference.shape}, the output is {out_shape}")

        cands = []
        modules = {}
        for i, prog in enumerate(programs):
            path, secs, err, notes = built[i]
            c = CandidateResult(index=i, program=prog, compile_seconds=secs, error=err, lib_path=path,
                                notes=notes)
            cands.append(c)
            if path is None:
                continue
            mod = tvm.runtime.load_module(path)
            out_tvm.copyfrom(fill_sentinel(out_np))
            mod["main"](*args_in, out_tvm)
            c.error = wrong_result(out_tvm.numpy(), reference, rtol, atol)
            if c.error:
                continue
            c.verified = True
            modules[i] = mod
        chosen = None
        if time_kernels and modules:
            args = args_in + [out_tvm]
            timing = _time_all(modules, dev, placed_copies(args, placement_count(args)))
            for i, secs in timing.seconds.items():
                cands[i].measured_seconds = secs
            chosen = cands[timing.best]
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    timed = [c for c in cands if c.verified and (c.measured_seconds is not None or not time_kernels)]
    if not timed:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BuildError(f"profile {expr.name}: none of the {len(cands)} candidates built and verified "
                         f"(first: {cands[0].summary()}; all of them with --debug)",
                         details="\n".join(c.summary() for c in cands))
    best = chosen or timed[0]
    # keep only the best library, in a folder of its own the caller owns; the rest goes now
    keep = tempfile.mkdtemp(prefix="kernel-", dir=build_root())
    lib = os.path.join(keep, "kernel.so")
    shutil.move(best.lib_path, lib)
    shutil.rmtree(tmp, ignore_errors=True)
    for c in cands:
        c.lib_path = lib if c is best else None
    return ProfileResult(candidates=cands, best=best.index, module=modules[best.index],
                         library=KernelLibrary(path=lib, folder=keep))
