"""Top-K profiling: build candidate kernels in worker processes, check each against a reference, time the
verified ones on the same buffers in this process, keep the fastest (where it beat the model's first plan by
a margin, round by round: see time_finalists).

A TVM crash (TVM's SIGSEGV handler ends the process) or an abort kills only a worker; the pool is then
recreated and the remaining candidates go on. Work crosses the process boundary as plain data: the
PrimFunc as TVMScript text, the Expr and Device as frozen dataclasses, the RProgram as a dict.
"""
from __future__ import annotations

import atexit
import contextlib
import math
import multiprocessing
import os
import select
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
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

# Buffer placements every timed repeat spreads its calls over (placed_copies): a kernel's speed can depend on
# where its tensors sit relative to each other within a page (loads and stores 4 KiB apart alias in the L1
# and the store buffer). Measured, 2 threads, one process: depthwise 3x3 dilation 2 on 28x28x256, its first
# plan (channels split over the cores) ran 20 us with the output 512 B (mod 1 KiB) past the input's page
# offset and 30-41 us at 0, 64, 256, 768, ...; the third plan 22-31 us. Timed on the one placement the
# profile's buffers had, the first plan won at 20 us and then ran 40.4 us on the suite's buffers.
PLACEMENTS = 4
PLACEMENT_BYTES = 256 << 20  # at most this many bytes of copies: fewer placements for large operators
PLACEMENT_ALIGN = 64  # the kernels' buffers are 64-byte aligned; offsets step by that
# Seconds of building after which candidates not yet started are skipped (the model's first is always
# built): a few plans with long partitioned, unrolled tails compile for 10-15 s each (depthwise 5x5 on
# 83x83x42), and a JIT user wants a kernel in seconds more than the tenth-ranked plan.
BUILD_BUDGET_SECONDS = 5.0
# Candidates still compiling at this multiple of the build budget are stopped: a grace for those started
# just before it ran out, short enough to bound the build (depthwise 5x5 on 83x83x42, whose plans
# compile in 0.6 to over 10 s: 10.6 s a build when the grace was the whole budget again)
STOP_AFTER_BUDGET = 1.25
SKIPPED = "skipped: the build budget was spent before it started"
STOPPED = f"stopped: still compiling at {STOP_AFTER_BUDGET}x the build budget"


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


_BUILD_ROOT: dict[int, str] = {}  # pid -> this process's build folder
_BUILD_ROOT_LOCK = threading.Lock()
BUILD_ROOT_PREFIX = "roller-builds-"


def build_root() -> str:
    """This process's folder for the libraries it compiles (``roller-builds-<pid>`` in the temp dir):
    removed when the process exits normally; folders of processes that no longer run are removed when
    another process makes its own."""
    pid = os.getpid()
    with _BUILD_ROOT_LOCK:
        root = _BUILD_ROOT.get(pid)
        if root is None:
            base = Path(tempfile.gettempdir())
            for old in base.glob(f"{BUILD_ROOT_PREFIX}*"):
                other = old.name[len(BUILD_ROOT_PREFIX):]
                if other.isdigit() and int(other) != pid and not _alive(int(other)):
                    shutil.rmtree(old, ignore_errors=True)
            root = str(base / f"{BUILD_ROOT_PREFIX}{pid}")
            os.makedirs(root, exist_ok=True)
            _BUILD_ROOT[pid] = root
            atexit.register(_remove_build_root, pid, root)
        return root


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_build_root(pid: int, root: str) -> None:
    if os.getpid() == pid:  # never from a forked child that inherited the handler
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class KernelLibrary:
    """A compiled kernel's shared library, owned by whoever holds this object: :meth:`close` deletes its
    folder (a module already loaded from it keeps working). A library never closed goes with its
    process's :func:`build_root` at exit."""

    path: str
    folder: str

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    @property
    def closed(self) -> bool:
        return not os.path.exists(self.path)


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
# Worker side: everything here runs in a child process.

def _build_in_worker(func_json: str, expr: Expr, program: dict | None, device: Device, out_dir: str,
                     index: int, hook: Callable | None) -> tuple[str | None, float, str | None, tuple[str, ...]]:
    """Schedules (unless ``program`` is None), compiles and exports one kernel.

    Returns (library path, compile seconds, error text, notes: schedule steps that did not apply); errors
    are returned as text because TVM's exception objects do not always survive pickling.
    """
    notes: list[str] = []
    try:
        import tvm

        t0 = time.perf_counter()  # compile time, without the worker's one-time imports
        if hook is not None:
            hook(index, program)
        func = tvm.ir.load_json(func_json)  # JSON, not TVMScript: the parser reads float literals as float32
        path = os.path.join(out_dir, f"cand{index}.so")
        compile_plan(func, expr, None if program is None else RProgram.from_dict(program), device, path, notes)
        return path, time.perf_counter() - t0, None, tuple(notes)
    except Exception as e:  # reported per candidate; the caller turns all-failed into BuildError
        return None, None, _short_error(e), tuple(notes)


def _short_error(e: Exception) -> str:
    """The exception's type and last two lines: TVM errors print the whole IR first, the reason last."""
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    short = " | ".join(lines[-2:]) if len(lines) > 2 else " ".join(lines)
    return f"{type(e).__name__}: {short}"


def compile_plan(func, expr: Expr, program: RProgram | None, device: Device, path: str,
                 notes: list[str]) -> str:
    """Schedules ``func`` by ``program`` (None: leaves it unscheduled), compiles it for ``device`` and
    exports the library to ``path``; schedule steps that did not apply are appended to ``notes``."""
    import tvm

    from roller.tir.compile import compile_for, export_library, target_for

    if program is None:
        mod = tvm.IRModule({"main": func})
    else:
        from roller.targets import schedule
        mod = schedule(func, expr, program, device, notes).mod
    export_library(compile_for(mod, target_for(device)), path)
    return path


_MAIN_LOCK = threading.Lock()
_main_hiders = 0                      # threads inside _main_module_hidden; the first hides, the last restores
_main_saved: dict = {}


@contextlib.contextmanager
def _main_module_hidden():
    """Starts worker processes without re-running the caller's main script in them.

    multiprocessing's spawn and forkserver workers import the parent's ``__main__`` (by path or module
    name) before running anything; a user script that calls roller at top level, without the
    ``if __name__ == "__main__"`` guard, would then build again inside every worker. The workers only
    run roller's own functions, so they are started with the main module's origin hidden. Threads that
    start workers at once share one hiding (counted under a lock): none restores the origin while
    another still starts a worker.
    """
    global _main_hiders, _main_saved
    with _MAIN_LOCK:
        if _main_hiders == 0:
            main = sys.modules.get("__main__")
            _main_saved = {k: main.__dict__[k] for k in ("__file__", "__spec__")
                           if main is not None and k in main.__dict__}
            for k in _main_saved:
                if k == "__spec__":
                    main.__spec__ = None
                else:
                    del main.__dict__[k]
        _main_hiders += 1
    try:
        yield
    finally:
        with _MAIN_LOCK:
            _main_hiders -= 1
            if _main_hiders == 0:
                main = sys.modules.get("__main__")
                for k, v in _main_saved.items():
                    main.__dict__[k] = v
                _main_saved = {}


def _context():
    # forkserver: workers fork from a clean server process (never from a caller that already runs TVM
    # threads) that imported TVM once, so a worker starts in milliseconds instead of a second or more.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tvm", "roller.targets", "roller.builder.farm"])
    return ctx


def warm_up() -> None:
    """Starts the build server now (it imports TVM, ~1 s) so that it is ready when profile() needs it;
    callers do this before their own analysis and construction to overlap the two."""
    from multiprocessing import forkserver

    _context()
    with _main_module_hidden():
        forkserver.ensure_running()


def _new_pool(workers: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=workers, mp_context=_context(), initializer=_end_with,
                               initargs=(os.getpid(),))


def _end_with(pid: int) -> None:
    """Worker initializer: the worker exits when process ``pid`` (the one that made its pool) has ended.
    A worker forked by the forkserver otherwise outlives a caller that was killed or crashed, forever,
    and keeps the forkserver alive too (it holds the server's liveness pipe)."""
    def watch() -> None:
        try:
            fd = os.pidfd_open(pid)  # readable when the process ends (Linux 5.3+); immune to pid reuse
            select.select([fd], [], [])
        except (AttributeError, OSError):
            while True:
                time.sleep(1.0)
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                except PermissionError:
                    continue
        os._exit(1)

    threading.Thread(target=watch, name="roller-end-with-caller", daemon=True).start()


def _build_all(func_json: str, expr: Expr, jobs: list[tuple[int, dict | None]], device: Device, out_dir: str,
               hook: Callable | None, progress,
               budget: float | None = None) -> dict[int, tuple[str | None, float | None, str | None]]:
    """Builds the jobs in order, one per worker at a time; a worker that dies fails only its own job.

    With a ``budget`` (seconds), jobs not started when it is spent are skipped (error SKIPPED), and jobs
    still compiling at STOP_AFTER_BUDGET times the budget are stopped (error STOPPED). The first job (the
    model's first plan) and the reference (index -1) always run to the end.
    """
    results: dict[int, tuple] = {}
    programs = dict(jobs)
    queue = list(jobs)
    protected = {-1, jobs[0][0]} if jobs else {-1}
    workers = max(1, min(device.units.count, len(jobs)))
    t0 = time.perf_counter()
    pool = _new_pool(workers)
    inflight: dict = {}  # future -> job index

    def done(idx, result):
        results[idx] = result
        if progress is not None:
            progress.update(1)

    try:
        while queue or inflight:
            spent = budget is not None and time.perf_counter() - t0 >= budget
            if spent:
                for idx, _ in [j for j in queue if j[0] not in protected]:
                    done(idx, (None, None, SKIPPED, ()))
                queue = [j for j in queue if j[0] in protected]
            while queue and len(inflight) < workers:
                idx, prog = queue.pop(0)
                with _main_module_hidden():  # a worker starts on the first submit
                    inflight[pool.submit(_build_in_worker, func_json, expr, prog, device, out_dir, idx, hook)] = idx
            if budget is None:
                timeout = None
            elif not spent:
                timeout = max(0.0, t0 + budget - time.perf_counter())
            else:
                timeout = max(0.0, t0 + STOP_AFTER_BUDGET * budget - time.perf_counter())
            finished, _ = wait(list(inflight), timeout=timeout, return_when=FIRST_COMPLETED)
            for fut in finished:
                idx = inflight.pop(fut)
                try:
                    done(idx, fut.result())
                except BrokenProcessPool:
                    # the pool is gone with every job in it: the others are retried alone, so that only
                    # the crashing candidate is blamed
                    lost = [i for i in inflight.values()] + [idx]
                    inflight.clear()
                    pool.shutdown(wait=True, cancel_futures=True)
                    for i in lost:
                        done(i, _build_alone(func_json, expr, programs[i], device, out_dir, i, hook))
                    pool = _new_pool(workers)
                    break
            if (not finished and spent and time.perf_counter() - t0 >= STOP_AFTER_BUDGET * budget
                    and not protected & set(inflight.values())):
                for i in inflight.values():
                    done(i, (None, None, STOPPED, ()))
                inflight.clear()
                _stop_workers(pool)
                pool = _new_pool(workers)
    finally:
        _stop_workers(pool) if inflight else pool.shutdown(wait=True, cancel_futures=True)
    return results


def _build_here(func, expr: Expr, jobs: list[tuple[int, dict | None]], device: Device, out_dir: str,
                progress, budget: float | None = None
                ) -> dict[int, tuple[str | None, float | None, str | None, tuple[str, ...]]]:
    """_build_all's results, compiled one after the other in this thread; with a ``budget``, jobs not
    started when it is spent are skipped (never the first, nor the reference: index -1). A running
    compile cannot be stopped here."""
    results = {}
    protected = {-1, jobs[0][0]} if jobs else {-1}
    t_start = time.perf_counter()
    for idx, prog in jobs:
        if budget is not None and idx not in protected and time.perf_counter() - t_start >= budget:
            results[idx] = (None, None, SKIPPED, ())
            continue
        notes: list[str] = []
        t0 = time.perf_counter()
        try:
            path = compile_plan(func, expr, None if prog is None else RProgram.from_dict(prog), device,
                                os.path.join(out_dir, f"cand{idx}.so"), notes)
            results[idx] = (path, time.perf_counter() - t0, None, tuple(notes))
        except Exception as e:  # reported per candidate, as from a worker
            results[idx] = (None, None, _short_error(e), tuple(notes))
        if progress is not None:
            progress.update(1)
    return results


def _build_alone(func_json, expr, prog, device, out_dir, idx, hook):
    """One job in a pool of its own: a crash fails this job only."""
    pool = _new_pool(1)
    try:
        with _main_module_hidden():
            return pool.submit(_build_in_worker, func_json, expr, prog, device, out_dir, idx, hook).result()
    except BrokenProcessPool:
        return (None, None, "worker process died while building (TVM crash or abort)", ())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Ends a pool whose workers are still compiling: terminates them (the executor has no public way
    before Python 3.14) and shuts it down."""
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(Exception):
            proc.terminate()
    pool.shutdown(wait=True, cancel_futures=True)


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
