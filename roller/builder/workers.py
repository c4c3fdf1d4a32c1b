"""The build worker pool: candidate kernels scheduled, compiled and exported in worker processes.

A TVM crash (TVM's SIGSEGV handler ends the process) or an abort kills only a worker; the pool is then
recreated and the remaining candidates go on. Work crosses the process boundary as plain data: the
PrimFunc as TVMScript text, the Expr and Device as frozen dataclasses, the RProgram as a dict. The build
budget (BUILD_BUDGET_SECONDS) skips candidates not started in time and stops those compiling far past it;
:func:`roller.builder.farm.profile` verifies and times what was built.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import select
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Callable

from roller.device.spec import Device
from roller.plan.expr import Expr
from roller.plan.rprogram import RProgram

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
