"""The JIT an inference server calls: a runnable kernel for a function now, a faster one soon after.

    from roller.serve.jit import JIT
    jit = JIT()                   # this machine; JIT("x86-avx2"), JIT(device, topk=5, background=1)
    k = jit(func)                 # a PrimFunc / TE tensors with concrete shapes -> Kernel, at once
    k(a, b, out)                  # runs the best kernel known so far (TVM tensors, parameter order)
    k.wait(); k.tier              # "profiled" once the background profile has replaced the top-1 kernel
    cm = jit(relax_mod)           # a Relax IRModule (a whole model, static shapes) -> CompiledModel
    cm.run({"x": x})              # numpy in, numpy out

Where a kernel comes from, fastest first: this JIT's memo (functions seen before in this process), the
persistent kernel cache (``roller.cache.store``: a directory, or Redis for a fleet), a compile. Two tiers:

- ``top1``: the model's first plan, constructed and compiled in the calling thread (no worker
  processes to start: well under a second for one operator), verified against TVM's unscheduled build.
- ``profiled``: the top-k plans built, verified and timed by ``roller.build`` in a background process
  (``background`` of them at once per JIT), which publishes the winner in the cache under its own key;
  this process then loads it and every :class:`Kernel` handle of the function switches to it (one
  reference assignment: a call runs either the old or the new kernel, never a mix).

A Relax module (a whole model: ``relax.frontend``'s, or ``from_exported_program``'s) is compiled by
:func:`roller.compile_model` with the top-1 plans, each fused function through the kernel cache (roller.
model_cache: a second process compiling the model loads them), and memoized like a function; whole
models are profiled offline (``compile_model(profile=True)``), not in the background. The memo holds at
most ``memo_size`` functions and models (least recently used dropped first).

``jit(func, tier=...)``: ``"any"`` (the default: the best kernel known now, profiling started when only
the top-1 exists), ``"top1"`` (the top-1 kernel, nothing started in the background) or ``"profiled"``
(waits for the profiled kernel, up to ``timeout`` seconds). Everything here may be called from several
threads at once; one function is compiled once per key across threads, processes and (through Redis)
machines.
"""
from __future__ import annotations

import atexit
import itertools
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from roller.builder.api import BuildResult, _device, build, cache_options, lookup
from roller.device.spec import Device
from roller.errors import BuildError, RollerError
from roller.builder.farm import BUILD_BUDGET_SECONDS

TIERS = ("any", "top1", "profiled")
MEMO_SIZE = 512  # functions and models a JIT holds; a kernel library is ~20-200 KB of memory


class JITWarning(UserWarning):
    """The background profile of a function failed: its top-1 kernel stays in use."""


@dataclass
class _Slot:
    """What this process holds for one function: its top-1 and profiled builds (each None until known)."""

    func: Any
    top1: BuildResult | None = None
    profiled: BuildResult | None = None
    looked_up: bool = False          # the cache was asked for the profiled tier once
    queued: bool = False             # a background profile was started
    error: str | None = None         # why the background profile failed
    done: threading.Event = field(default_factory=threading.Event)  # set: profiled, or failed
    lock: threading.Lock = field(default_factory=threading.Lock)    # one filler at a time


class Kernel:
    """A handle on the best kernel of one function this JIT holds. Calling it runs that kernel
    (``module["main"]``); when the profiled kernel arrives the handle switches to it, unless it was
    asked for the ``top1`` tier."""

    def __init__(self, slot: _Slot, tier: str, served: threading.Event):
        self._slot = slot
        self._tier = tier
        self._served = served  # the JIT's: set once a kernel of it has run (background work may start)
        self._main = None  # (build, its main function)

    @property
    def result(self) -> BuildResult:
        """The current build: module, program (the plan), report (as `roller build --json`)."""
        s = self._slot
        return s.top1 if self._tier == "top1" or s.profiled is None else s.profiled

    @property
    def module(self):
        return self.result.module

    @property
    def report(self) -> dict:
        return self.result.report

    @property
    def tier(self) -> str:
        """"top1" or "profiled": which kernel a call runs now."""
        return self.result.report["tier"]

    def __call__(self, *args):
        result = self.result
        main = self._main
        if main is None or main[0] is not result:  # the function is looked up once per build
            main = self._main = (result, result.module["main"])
        out = main[1](*args)
        if not self._served.is_set():
            self._served.set()
        return out

    def wait(self, timeout: float | None = None) -> bool:
        """Waits until the background profile has ended (at most ``timeout`` seconds); True if the
        profiled kernel is now in use."""
        if self._tier != "top1":
            self._served.set()  # the caller wants it now: background work need not wait for a first call
            self._slot.done.wait(timeout)
        return self.tier == "profiled"


@dataclass
class _ModelSlot:
    """What this process holds for one Relax module: its compiled model (None until compiled)."""

    func: Any
    model: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Memo:
    """This JIT's functions and models: found by structural hash and equality, at most ``size`` of them;
    past that the least recently used is dropped (handles already returned keep their kernel; asking
    again finds it in the persistent cache). Callers hold the JIT's lock."""

    def __init__(self, size: int):
        self.size = size
        self._by_hash: dict[int, list] = {}                   # structural hash of the caller's object -> slots
        self._by_key: OrderedDict[str, tuple[list, Any]] = OrderedDict()  # key -> (its hashes, slot), LRU first

    def find(self, h: int, func):
        import tvm_ffi

        for key, slot in self._by_hash.get(h, ()):
            if tvm_ffi.structural_equal(slot.func, func):
                self._by_key.move_to_end(key)
                return slot
        return None

    def add(self, h: int, key: str, make):
        """The slot of ``key`` (made by ``make()`` if new), now also found by hash ``h``."""
        if key in self._by_key:
            hashes, slot = self._by_key[key]
            self._by_key.move_to_end(key)
        else:
            hashes, slot = [], make()
            self._by_key[key] = (hashes, slot)
        if h not in hashes:
            hashes.append(h)
            self._by_hash.setdefault(h, []).append((key, slot))
        while len(self._by_key) > self.size:
            old, (old_hashes, _) = self._by_key.popitem(last=False)
            for oh in old_hashes:
                left = [e for e in self._by_hash[oh] if e[0] != old]
                if left:
                    self._by_hash[oh] = left
                else:
                    del self._by_hash[oh]
        return slot

    def __len__(self) -> int:
        return len(self._by_key)

    def slots(self) -> list:
        return [slot for _, slot in self._by_key.values()]


class JIT:
    """Kernels for functions with concrete shapes, memoized, cached and compiled once (see the module).

    ``device``: a Device, a spec name or path, None for this machine. ``topk`` and ``build_budget`` are
    the profiled tier's (as `roller build`'s). ``background``: background profiles run at once (0: never
    profile; every kernel stays top-1). ``memo_size``: functions and models held in this process at
    most (least recently used dropped first; default MEMO_SIZE)."""

    def __init__(self, device: Device | str | None = None, topk: int = 10,
                 build_budget: float | None = BUILD_BUDGET_SECONDS, background: int = 1,
                 memo_size: int | None = None):
        memo_size = MEMO_SIZE if memo_size is None else memo_size
        if topk < 1 or background < 0 or memo_size < 1:
            raise RollerError(f"JIT: topk must be at least 1 (got {topk}), background at least 0 (got "
                              f"{background}) and memo_size at least 1 (got {memo_size})")
        self.device = _device(device)
        from roller.targets import target_of

        if target_of(self.device).offline:
            raise RollerError(f"JIT: device {self.device.name!r} is a {self.device.kind}: the JIT serves CPU "
                              f"devices (GPU kernels are compiled offline by roller.build, not run here)")
        self.topk = topk
        self.build_budget = build_budget
        self.background = background
        self._lock = threading.Lock()
        self._memo = _Memo(memo_size)  # by top-1 cache key (functions equal once normalized share a slot)
        self._queue: queue.Queue = queue.Queue()
        self._served = threading.Event()  # a kernel has run: the first response is out
        self._workers: list[threading.Thread] = []
        self._procs: set[subprocess.Popen] = set()
        self._closed = False
        from roller.tir.compile import set_threads
        set_threads(self.device.units.count)  # before any kernel starts TVM's thread pool
        atexit.register(self.close)

    # -- the memo

    def _slot(self, func) -> _Slot:
        import tvm_ffi

        h = tvm_ffi.structural_hash(func)
        with self._lock:
            slot = self._memo.find(h, func)
        if slot is not None:
            return slot
        from roller import cache as kcache
        from roller.builder.api import _prepare

        _, _, norm, _ = _prepare(func, self.device, None, None, None, None)
        key, _ = kcache.kernel_key(norm, self.device, cache_options(False, 1, None))
        with self._lock:
            return self._memo.add(h, key, lambda: _Slot(func=func))

    def kernels(self) -> int:
        """How many distinct functions (and Relax modules) this JIT holds kernels for."""
        with self._lock:
            return len(self._memo)

    # -- requests

    def __call__(self, func, tier: str = "any", timeout: float | None = None) -> Kernel:
        """A Kernel for ``func`` (a PrimFunc, an IRModule with one, or TE tensors) at ``tier`` (see the
        module). With ``tier="profiled"``, BuildError if the profile failed or ``timeout`` passed."""
        if tier not in TIERS:
            raise RollerError(f"JIT: tier must be one of {', '.join(TIERS)}, got {tier!r}")
        if _is_relax(func):
            return self._model(func, tier)
        func = _prim_func(func)
        slot = self._slot(func)
        with slot.lock:
            if tier != "top1" and not slot.looked_up:
                slot.looked_up = True
                slot.profiled = lookup(func, self.device, self.topk, True, self.build_budget)
                if slot.profiled is not None:
                    slot.done.set()
            if slot.top1 is None and (tier == "top1" or slot.profiled is None):
                slot.top1 = build(func, self.device, profile=False)
            if tier != "top1" and slot.profiled is None and not slot.queued:
                slot.queued = True
                self._start_profile(slot)
        if tier == "profiled":
            self._served.set()
            if not slot.done.wait(timeout):
                raise BuildError(f"JIT: the profiled kernel was not ready within {timeout} s; ask for "
                                 f"tier='any' to get the top-1 kernel meanwhile")
            if slot.profiled is None:
                raise BuildError(f"JIT: the background profile failed: {slot.error}")
        return Kernel(slot, tier, self._served)

    def _model(self, mod, tier: str):
        """The compiled model (:class:`roller.models.frontend.CompiledModel`, top-1 plans) of a Relax module with
        static shapes, its fused functions from the kernel cache (roller.models.function_cache), compiled once per
        JIT; ``tier="profiled"`` is refused (a model is profiled offline)."""
        import tvm_ffi

        from roller.models.frontend import compile_model

        if tier == "profiled":
            raise RollerError("JIT: a Relax module is served at the top-1 tier only; profile a model offline "
                              "with roller.compile_model(mod, profile=True), or ask for tier='any'")
        h = tvm_ffi.structural_hash(mod)
        with self._lock:
            slot = self._memo.find(h, mod) or self._memo.add(h, f"relax:{next(_MODEL_IDS)}", lambda: _ModelSlot(mod))
        with slot.lock:
            if slot.model is None:
                slot.model = compile_model(mod, self.device)
        return slot.model

    def dynamic(self, func, policy=None, tier: str = "any"):
        """A :class:`roller.serve.buckets.DynamicKernel` for a function with symbolic dimensions: called with
        numpy inputs of any allowed size, served by this JIT's kernels of bucketed sizes (``policy``: a
        :class:`roller.serve.buckets.BucketPolicy`; the default pads by at most 1/8 above 64)."""
        from roller.serve.buckets import DynamicKernel
        return DynamicKernel(self, _prim_func(func), policy, tier)

    # -- the background tier

    def _start_profile(self, slot: _Slot) -> None:
        if self.background == 0 or self._closed:
            slot.error = "background profiling is off (background=0)" if not self._closed else "the JIT is closed"
            slot.done.set()
            return
        self._queue.put(slot)
        with self._lock:
            if len(self._workers) < self.background:
                t = threading.Thread(target=self._work, name="roller-jit-profile", daemon=True)
                self._workers.append(t)
                t.start()

    def _work(self) -> None:
        """A background thread: feeds its build process (`python -m roller.serve.jit`, kept between requests
        so that TVM is imported once) one function at a time. Nothing starts before this JIT has served
        a first response (a kernel has run, or someone waits for a profile): the build process would
        take the cores from the server's first top-1 compiles."""
        proc = None
        while True:
            slot = self._queue.get()
            if slot is not None:
                self._served.wait()
            if slot is None or self._closed:
                break
            try:
                proc = self._profile(slot, proc)
            except Exception as e:  # noqa: BLE001 -- a failed profile leaves the top-1 kernel, never a crash
                slot.error = f"{type(e).__name__}: {e}"
            if slot.profiled is None and not self._closed:
                warnings.warn(f"JIT: profiling {slot.top1.report['op']} failed, its top-1 kernel stays: "
                              f"{slot.error}", JITWarning, stacklevel=1)
            slot.done.set()
        if proc is not None:
            proc.stdin.close()
            proc.wait()

    def _profile(self, slot: _Slot, proc: subprocess.Popen | None) -> subprocess.Popen | None:
        """Has the build process build the profiled tier into the cache, then loads it from there.
        Returns the process to use next (None after it died: the next request starts another)."""
        import tvm

        request = {"func": tvm.ir.save_json(slot.func), "device": self.device, "topk": self.topk,
                   "build_budget": self.build_budget}
        with self._lock:
            if self._closed:
                slot.error = "the JIT is closed"
                return proc
            if proc is None:
                proc = subprocess.Popen([sys.executable, "-c", _BACKGROUND_MAIN], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=_child_env())
                self._procs.add(proc)
        try:
            pickle.dump(request, proc.stdin)
            proc.stdin.flush()
            answer = pickle.load(proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError):
            with self._lock:
                self._procs.discard(proc)
            proc.kill()
            slot.error = f"the background build process died (exit code {proc.wait()}; a TVM crash, or killed)"
            return None
        if "error" in answer:
            slot.error = answer["error"]
            return proc
        found = lookup(slot.func, self.device, self.topk, True, self.build_budget, key=answer["key"])
        if found is None:
            slot.error = f"the profiled kernel {answer['key']} is not in the cache after its build"
            return proc
        slot.profiled = found  # the switch: Kernel handles read this reference on every call
        return proc

    def wait(self, timeout: float | None = None) -> bool:
        """Waits until every background profile started so far has ended; False on timeout."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            slots = [s for s in self._memo.slots() if isinstance(s, _Slot) and s.queued]
        for s in slots:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not s.done.wait(left):
                return False
        return True

    def close(self) -> None:
        """Stops background profiling (running profiles are stopped: they publish nothing, and whoever
        builds that key next compiles it). Kernels already returned keep working."""
        with self._lock:
            self._closed = True
            procs = list(self._procs)
            workers = list(self._workers)
        self._served.set()  # (a worker waiting for a first response sees the JIT closed)
        for _ in workers:
            self._queue.put(None)
        for p in procs:  # (a worker thread waiting on one sees it end and ends its request)
            p.terminate()  # it stops its own workers and exits; killed if it takes longer
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for t in workers:  # none may be left loading a kernel while the interpreter shuts down
            if t is not threading.current_thread():
                t.join(timeout=60)


def _is_relax(func) -> bool:
    """True for an IRModule holding a Relax function (a whole model, not one PrimFunc)."""
    import tvm
    from tvm import relax

    return isinstance(func, tvm.IRModule) and any(isinstance(f, relax.Function) for _, f in func.functions_items())


def _prim_func(func):
    """A PrimFunc from a PrimFunc, an IRModule holding one, or a list of TE tensors."""
    import tvm
    from tvm import te

    if isinstance(func, (list, tuple)):
        return te.create_prim_func(list(func))
    if isinstance(func, tvm.IRModule):
        funcs = [f for _, f in func.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
        if len(funcs) != 1:
            raise RollerError(f"JIT: the module holds {len(funcs)} PrimFuncs; pass a module with one, or the "
                              f"PrimFunc itself")
        return funcs[0]
    return func


def _child_env() -> dict:
    """The background build's environment: this process's, so that it finds the same cache; roller
    importable from where this process imported it."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


_MODEL_IDS = itertools.count()  # memo keys of Relax modules (found by structural equality, never by key)
_DEFAULT: dict[str, JIT] = {}
_DEFAULT_LOCK = threading.Lock()


def get(func, device: Device | str | None = None, tier: str = "any", timeout: float | None = None) -> Kernel:
    """``JIT(device)(func, tier, timeout)`` with one JIT per device name kept for the process."""
    dev = _device(device)
    with _DEFAULT_LOCK:
        jit = _DEFAULT.get(dev.name)
        if jit is None or jit.device != dev:
            jit = _DEFAULT[dev.name] = JIT(dev)
    return jit(func, tier, timeout)


BACKGROUND_NICE = 10  # the background build process's niceness: servers' requests come first
# The background process: niced before it imports anything (its children inherit it), then this module.
_BACKGROUND_MAIN = (f"import os; os.nice({BACKGROUND_NICE}); import runpy; "
                    f"runpy.run_module('roller.serve.jit', run_name='__main__', alter_sys=True)")


def _profile_main() -> int:
    """The background build process: builds the profiled tier of each function it is sent (pickled
    requests on stdin) into the kernel cache, and answers each with its key or its error (pickled, on
    the stdout it started with; anything else printed goes to stderr). Ends at the end of its input.
    It compiles the candidates itself, one after the other (no worker processes: it is already apart
    from the server, a TVM crash ends only it, and the JIT then starts another)."""
    import tvm

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # unwinds: the profile stops its workers
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    while True:
        try:
            request = pickle.load(sys.stdin.buffer)
        except EOFError:
            return 0
        try:
            func = tvm.ir.load_json(request["func"])
            result = build(func, request["device"], topk=request["topk"], profile=True,
                           build_budget=request["build_budget"], in_process=True)
            answer = {"cache": result.report["cache"], "key": result.report["cache_key"]}
        except RollerError as e:
            answer = {"error": f"{type(e).__name__}: {e}"}
        pickle.dump(answer, answers)
        answers.flush()


if __name__ == "__main__":
    warnings.formatwarning = lambda message, *a, **k: f"roller: warning: {message}\n"
    sys.exit(_profile_main())
