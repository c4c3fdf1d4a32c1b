"""Whole models through the kernel cache: each fused function of a Relax module is one cache entry.

``compile_model``'s top-1 path (:class:`CachedStep`, the per-function step of the one driver,
:class:`roller.models.relax_pass.ScheduleModule`) looks every fused PrimFunc up in the
persistent kernel cache (:mod:`roller.cache.store`) under the key of a single operator: sha256 of the
function (its name left out, so a function two models share is one entry) + the whole device (spec,
target with mcpu/mattr, calibration) + roller's and TVM's versions + the build options (top-1, the
rule chain's ``verify``). A miss schedules the function with the driver's rule chain, compiles it alone
into a library and publishes it (one compile per key across threads, processes and, through Redis,
machines). The Relax module then calls each cached library by name
(``call_tir`` becomes ``call_dps_packed`` of a global function registered in this process), so that a
second process compiling the same model loads the libraries and compiles only the Relax part.
Functions go through two worker threads: one schedules (Python, one at a time: the rules keep no state,
but scheduling holds the GIL, so a second scheduler would only wait) while the other compiles the
function before (LLVM and the linker release the GIL).

Such an executable depends on those registrations: :meth:`roller.models.frontend.CompiledModel.export` compiles
the scheduled functions into one self-contained library instead (``CompiledModel.module``).
"""
from __future__ import annotations

import os
import tempfile
import threading
import time
from typing import Any

from roller.device.spec import Device
from roller.models.relax_pass import FunctionStep
from roller.models.relax_rewrite import mutate_functions

SYMBOL_PREFIX = "roller_kernel_"     # + the cache key: the global function a Relax call names
REPORT_KIND = "relax_function"

_REGISTERED: set[str] = set()
_REGISTER_LOCK = threading.Lock()
WORKERS = 2  # functions in flight: one scheduling, one compiling


def function_key(func, device: Device, verify: bool, constants: frozenset[str] = frozenset()) -> tuple[str, dict]:
    """(cache key, ingredients) of one fused PrimFunc compiled at the top-1 tier; ``constants`` (the
    parameters that are constants at every call, which the kernel may take packed and so with another
    signature) is part of it."""
    from roller import cache as kcache

    options = {"kind": REPORT_KIND, "profile": False, "topk": 1, "build_budget": None, "verify": bool(verify)}
    if constants:
        options["constants"] = sorted(constants)
    return kcache.kernel_key(func.with_attr("global_symbol", "main"), device, options)


def _compile(func, device: Device, path: str) -> None:
    """Compiles one PrimFunc (scheduled or not) into the library ``path``."""
    import tvm

    from roller.tir.compile import compile_for, export_library, target_for

    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    export_library(compile_for(mod, target_for(device)), path)


def _register(key: str, module) -> str:
    """Registers ``module["main"]`` as the global function a Relax call finds by name; returns the name."""
    import tvm_ffi

    name = SYMBOL_PREFIX + key
    with _REGISTER_LOCK:
        if name not in _REGISTERED:
            tvm_ffi.register_global_func(name, module["main"], override=True)
            _REGISTERED.add(name)
    return name


def _kernel(sched, name: str, func, device: Device, store, constants: frozenset[str],
            scheduling: threading.Lock) -> tuple[str, Any, Any, Any]:
    """(cache key, loaded library, scheduled PrimFunc or None, FunctionReport) of one fused function whose
    parameters ``constants`` are constants at every call, from the cache, or scheduled (holding
    ``scheduling``), compiled and published; the report's ``cache`` is hit or miss."""
    import tvm

    from roller import cache as kcache
    from roller.builder.api import REPORT_SCHEMA, _log_build
    from roller.builder.farm import KernelLibrary, build_root
    from roller.models.relax_pass import FunctionReport

    key, parts = function_key(func, device, sched.verify, constants)
    built: list[KernelLibrary] = []
    made: list = []  # the scheduled function this call made, if it built the entry

    def build():
        with scheduling:
            t0 = time.perf_counter()
            scheduled, rep = sched.schedule_function(name, func, constants)
        made.append(scheduled)
        folder = tempfile.mkdtemp(prefix="function-", dir=build_root())
        built.append(KernelLibrary(path=os.path.join(folder, "kernel.so"), folder=folder))
        _compile(scheduled if scheduled is not None else func, device, built[-1].path)
        report = {"schema": REPORT_SCHEMA, "kind": REPORT_KIND, "op": name, "device": device.name, "tier": "top1",
                  "function": rep.to_dict(), "build_seconds": time.perf_counter() - t0,
                  "scheduled_func": tvm.ir.save_json(scheduled) if scheduled is not None else None}
        _log_build(report, key)
        return (tvm.runtime.load_module(built[-1].path), report), built[-1].path, report

    def load(entry):
        return tvm.runtime.load_module(entry.library), entry.report

    try:
        status, (module, report) = kcache.get_or_build(store, key, parts, build, load)
    finally:
        for lib in built:  # stored in the cache (or not storable) and loaded: this copy goes
            lib.close()
    rep = FunctionReport(**{k: v for k, v in report["function"].items() if k != "reason"})
    rep.notes, rep.cache, rep.name = tuple(rep.notes), status, name
    if made:
        scheduled = made[0]
    else:  # written by this TVM (its version is part of the key): no upgrade of older JSON to run
        from tvm_ffi.serialization import from_json_graph_str
        scheduled = from_json_graph_str(report["scheduled_func"]) if report.get("scheduled_func") else None
    return key, module, scheduled, rep


class CachedStep(FunctionStep):
    """The kernel cache's per-function step for :class:`roller.models.relax_pass.ScheduleModule` (the one
    driver): each function from the cache, or scheduled by the driver's rule chain, compiled alone and
    published (:func:`_kernel`), its library registered under the name its calls will use (``symbols``);
    then :meth:`build` compiles the Relax module calling those libraries by name. Identical functions are
    not reused by the driver (each is its own lookup: they share the key); two functions are in flight,
    one scheduling, one compiling (see the module docstring)."""

    reuse = False
    workers = WORKERS

    def __init__(self, device: Device):
        from roller import cache as kcache
        from roller.tir.compile import set_threads

        set_threads(device.units.count)  # before the first kernel library starts TVM's thread pool
        self.device = device
        self.store = kcache.open_store()
        self.symbols: dict[str, str] = {}  # function name -> the registered name its calls use
        self._scheduling = threading.Lock()

    def __call__(self, sched, name: str, func, constants: frozenset[str]):
        from roller.models.relax_pass import SCHEDULED_ATTR

        key, module, scheduled, rep = _kernel(sched, name, func, sched.device, self.store, constants,
                                              self._scheduling)
        self.symbols[name] = _register(key, module)
        return (scheduled.with_attr(SCHEDULED_ATTR, True) if scheduled is not None else None), rep

    def build(self, mod):
        """The executable of ``mod`` (the driver's output: every scheduled function in place, constants
        prepacked) calling the cached libraries by name (:func:`_by_name`)."""
        from roller.models.relax_steps import build_module
        from roller.tir.compile import target_for

        return build_module(_by_name(mod, self.symbols), target_for(self.device))


def _by_name(mod, symbols: dict):
    """``mod`` with every ``call_tir`` of a function in ``symbols`` (its name -> global function name)
    turned into ``call_dps_packed`` of that name, and those functions left out when no call remains."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    call_tir = tvm.ir.Op.get("relax.call_tir")
    kept: set = set()

    @mutator
    class _Rewrite(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if call.op.same_as(call_tir) and call.args[0].name_hint in symbols:
                if len(call.args) == 2:  # no symbolic-shape arguments (tir_vars)
                    out = call.ty_args[0]  # several outputs: a tuple type, given as the list of its fields
                    outs = list(out.fields) if isinstance(out, relax.TupleType) else [out]
                    return relax.call_dps_packed(relax.ExternFunc(symbols[call.args[0].name_hint]), call.args[1], outs)
                kept.add(call.args[0].name_hint)
            return call

    rewrite = _Rewrite(mod)
    out = mutate_functions(rewrite, mod)
    return tvm.IRModule({gv: f for gv, f in out.functions_items() if gv.name_hint not in symbols or gv.name_hint in kept},
                        attrs=out.attrs, global_infos=out.global_infos)
