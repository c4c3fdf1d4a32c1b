"""The Python interface: load a device, construct plans for a function, build a function into a kernel.

    import roller
    dev = roller.load_device()                      # this machine (or a name / a YAML path)
    plans = roller.construct(roller.tir.ops.matmul(1024, 1024, 1024), dev)   # plain data, no build
    result = roller.build_op("matmul", {"M": 1024, "N": 1024, "K": 1024})  # profiled, verified kernel
    result.report                                    # the report, as printed by roller build --json
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from roller.plan.construct import Construction
from roller.device.spec import Device
from roller.device.load import load_device
from roller.plan.expr import Expr
from roller.builder.farm import BUILD_BUDGET_SECONDS
from roller.plan.rprogram import RProgram
from roller.targets import target_of


def _device(device: Device | str | None) -> Device:
    return device if isinstance(device, Device) else load_device(device)


def analyze(func) -> tuple[Expr, Any]:
    """(fused Expr, normalized PrimFunc) of a TVM PrimFunc / IRModule / list of TE tensors."""
    from roller.tir.analysis import analyze_fused

    return analyze_fused(func)


def construct(func_or_expr, device: Device | str | None = None, topk: int = 10) -> Construction:
    """The ranked top-``topk`` RPrograms for a function (or an Expr); policy only, nothing is built."""
    dev = _device(device)
    expr = func_or_expr if isinstance(func_or_expr, Expr) else analyze(func_or_expr)[0]
    return target_of(dev).construct(expr, dev, topk)


@dataclass
class BuildResult:
    """A built, verified kernel: ``module`` runs it (TVM tensors in parameter order), ``report`` says how
    it was chosen (keys as in the CLI's --json), ``program`` is the winning plan."""

    module: Any
    program: RProgram
    report: dict
    expr: Expr
    device: Device
    profile: Any = field(default=None, repr=False)
    library: str | None = None  # the kernel's shared library: the cache entry's, or this build's own
    _owned: Any = field(default=None, repr=False)  # this build's own library (a profile.KernelLibrary)

    def save(self, directory) -> dict[str, str]:
        """Writes ``<op>.so`` (the kernel library) and ``<op>.json`` (the report) into ``directory``;
        returns their paths."""
        from roller.output import save_build
        return save_build(self, directory)

    def close(self) -> None:
        """Deletes this build's own copy of its library (built with ``cache=False``; a cache entry's stays:
        the cache owns it). The module keeps working; :meth:`save` no longer can. Left open, the copy
        goes when the process exits."""
        if self._owned is not None:
            self._owned.close()

    def _adopt(self, entry) -> "BuildResult":
        """Points at the cache entry this build was published as, and deletes its own copy."""
        owned, self._owned, self.library = self._owned, None, entry.library
        if owned is not None:
            owned.close()
        return self


def build(func, device: Device | str | None = None, topk: int | None = None, profile: bool = True,
          inputs: Sequence[np.ndarray] | None = None, reference: np.ndarray | None = None,
          progress: bool = False, name: str | None = None, shape: Mapping[str, int] | None = None,
          build_budget: float | None = BUILD_BUDGET_SECONDS, cache: bool = True,
          options: Mapping[str, str] | None = None, in_process: bool | None = None) -> BuildResult:
    """Constructs, builds and verifies a kernel for ``func``.

    With ``profile`` the top-``topk`` plans are built in worker processes, checked and timed, and the
    fastest verified one wins where it beat the model's first plan by ``profile.WIN_MARGIN`` in the same
    timing rounds (else the first plan stays); without it only the model's first plan is built (still verified).
    ``topk`` None: as many as the model's measured error asks (:func:`profiled_plans`).
    ``inputs`` / ``reference`` are numpy arrays for the check (random inputs and TVM's unscheduled build
    of ``func`` are used when absent). Candidates whose build has not started after ``build_budget``
    seconds of compiling are skipped (None: build all).

    With ``cache`` (the default) the kernel comes from the persistent kernel cache (roller.cache.store,
    ``$ROLLER_CACHE``) when this function was built before for the same device and options; it was
    verified when it was built and is not checked again. Otherwise it is built and stored. The report's
    ``cache`` is "hit", "miss" or "off". ``name``, ``shape`` and ``options`` label the report.
    ``in_process`` compiles the plans in this thread instead of worker processes (default: only the
    top-1 tier does; the JIT's background process, already apart from the server, profiles so too).

    On a GPU device the top-``topk`` plans are compiled offline and checked against its limits
    (``roller.targets.cuda.build``: a GpuBuildResult; nothing cached). Where that GPU is in this machine and a
    ``reference`` is given (``build_op`` makes one), they are checked against numpy and timed on it and
    the fastest wins (by the same margin); otherwise the model ranks them, nothing is timed, and the chosen schedule's OpenCL
    twin is checked against numpy.
    """
    if inputs is not None:  # bad arrays are an error even when the kernel comes from the cache
        from roller.measure.verify import check_inputs
        check_inputs(analyze(func)[1], inputs)
    return _build(func, device, topk, profile, lambda: (inputs, reference), progress, name, shape, build_budget,
                  cache, options, in_process=in_process)


def _prepare(func, device, name, shape, options, dtype) -> tuple[Device, Expr, Any, dict]:
    """(device, fused Expr, normalized PrimFunc, report labels) of a function about to be built."""
    dev = _device(device)
    target_of(dev)  # BuildError for a kind no target family builds for
    expr, norm = analyze(func)
    labels = {"op": name or expr.name,
              "shape": dict(shape) if shape is not None else {a.name: a.extent for a in expr.axes}}
    if options is not None:
        labels["options"] = dict(options)
    if dtype is not None:
        labels["dtype"] = dtype
    return dev, expr, norm, labels


def cache_options(profile: bool, topk: int, build_budget: float | None, margin: float | None = None) -> dict:
    """The build options that enter the kernel cache's key: the tier (profiled or the model's top-1),
    and for the profiled tier how many plans, the margin that cut them (where one did) and how many seconds
    of building."""
    opts = {"profile": bool(profile), "topk": topk if profile else 1,
            "build_budget": build_budget if profile else None}
    if profile and margin is not None:
        opts["margin"] = round(margin, 3)
    return opts


AUTO_TOPK = 10  # the most plans a profiled build takes when no --topk forces a number


def profiled_plans(topk: int | None, device: Device, profile: bool = True) -> tuple[int, float | None]:
    """How many of the constructor's plans a profiled build takes, and the margin that cuts them (issue 33:
    profiling that trusts the model): ``topk`` where given (a forced number, no margin); else up to
    AUTO_TOPK, of which :func:`within_margin` keeps those predicted within the device's profiling margin of
    the first (``roller.device.fidelity_record.profile_margin``, from its last ``roller fidelity``: a sure
    model builds one plan, an unsure one more); all AUTO_TOPK where no fidelity record applies. Without
    ``profile`` (the model's first plan only) nothing is cut and the record is not read."""
    if topk is not None or not profile:
        return (AUTO_TOPK if topk is None else topk), None
    from roller.device.fidelity_record import profile_margin

    return AUTO_TOPK, profile_margin(device)


def within_margin(programs: Sequence[RProgram], margin: float | None) -> list[RProgram]:
    """The ranked ``programs`` predicted within ``margin`` of the first (all of them where None)."""
    if margin is None or not programs:
        return list(programs)
    limit = programs[0].predicted_seconds * (1 + margin)
    return [programs[0]] + [p for p in programs[1:] if p.predicted_seconds <= limit]


def _loader(dev: Device, expr: Expr, labels: Mapping, t0: float) -> Callable:
    """Turns a cache entry into a BuildResult (its module loaded, its report relabelled for this call)."""

    def load(entry) -> BuildResult:
        import tvm

        from roller.tir.compile import set_threads

        set_threads(dev.units.count)  # before the runtime's pool starts, as for a fresh build
        module = tvm.runtime.load_module(entry.library)
        report = dict(entry.report)
        program = RProgram.from_dict(report.pop("program"))
        report.update(labels, cached_build_seconds=report["build_seconds"], build_seconds=time.perf_counter() - t0)
        return BuildResult(module=module, program=program, report=report, expr=expr, device=dev,
                           library=entry.library)

    return load


def lookup(func, device: Device | str | None = None, topk: int | None = None, profile: bool = True,
           build_budget: float | None = BUILD_BUDGET_SECONDS, name: str | None = None,
           key: str | None = None) -> BuildResult | None:
    """The kernel :func:`build` with these arguments would return from the kernel cache, or None when the
    cache holds none (or an unreadable one); never builds. The JIT asks it for the profiled tier. ``key``:
    the entry to load, as another process published it (its roller sources may differ from this one's,
    and the sources enter the key)."""
    from roller import cache as kcache

    t0 = time.perf_counter()
    dev, expr, norm, labels = _prepare(func, device, name, None, None, None)
    count, margin = profiled_plans(topk, dev, profile)
    options = cache_options(profile, count, build_budget, margin)
    store = kcache.open_store()
    if key is None:
        key, _ = kcache.kernel_key(norm, dev, options)
    found = kcache.lookup(store, key, _loader(dev, expr, labels, t0))
    if found is not None:
        found.report.update(cache="hit", cache_key=key, cache_options=options)
    return found


# The build report's version: raised when a key changes meaning or goes away (new keys do not raise it).
# 1: the keys listed in the README (roller build --json), with tier.
REPORT_SCHEMA = 1
BUILD_LOG_ENV = "ROLLER_BUILD_LOG"  # a file: one JSON line per compile (not per cache hit), from every process


def _log_build(report: Mapping, key: str | None) -> None:
    """Appends one line (key, op, shape, tier, pid, seconds) to $ROLLER_BUILD_LOG, if set: a fleet's
    compiles counted outside the cache (one O_APPEND write per line: lines of processes do not mix)."""
    path = os.environ.get(BUILD_LOG_ENV)
    if not path:
        return
    line = json.dumps({"key": key, "op": report.get("op"), "shape": report.get("shape"), "tier": report.get("tier"),
                       "pid": os.getpid(), "seconds": report.get("build_seconds")}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _build(func, device, topk: int | None, profile: bool, check: Callable[[], tuple], progress: bool, name, shape,
           build_budget: float | None, cache: bool, options, dtype: str | None = None,
           in_process: bool | None = None) -> BuildResult:
    """build(), with the check's (inputs, reference) made by ``check()`` only when something is compiled:
    a cache hit needs neither (build_op's numpy reference of a large operator takes longer than the hit)."""
    t0 = time.perf_counter()
    dev, expr, norm, labels = _prepare(func, device, name, shape, options, dtype)
    topk, margin = profiled_plans(topk, dev, profile)
    target = target_of(dev)
    if target.offline:  # the family's own build path (a GPU's: compiled offline, checked against its limits)
        return target.build_offline(func, expr, dev, topk, labels, check, profile)
    key = None

    def compile_() -> BuildResult:
        inputs, reference = check()
        result = _build_uncached(norm, expr, dev, topk, profile, inputs, reference, progress, build_budget, labels, t0,
                                 in_process=not profile if in_process is None else in_process, margin=margin)
        _log_build(result.report, key)
        return result

    if not cache:
        result = compile_()
        result.report["cache"] = "off"
        return result

    from roller import cache as kcache

    opts = cache_options(profile, topk, build_budget, margin)
    store = kcache.open_store()
    key, parts = kcache.kernel_key(norm, dev, opts)

    def build_and_describe() -> tuple[BuildResult, str, dict]:
        result = compile_()
        stored = dict(result.report, program=result.program.to_dict(), cache_options=opts)
        return result, result.library, stored

    status, result = kcache.get_or_build(store, key, parts, build_and_describe, _loader(dev, expr, labels, t0),
                                         published=BuildResult._adopt)
    result.report.update(cache=status, cache_key=key, cache_options=opts)
    return result


def _build_uncached(norm, expr: Expr, dev: Device, topk: int, profile: bool, inputs, reference, progress: bool,
                    build_budget: float | None, labels: Mapping, t0: float, in_process: bool = False,
                    margin: float | None = None) -> BuildResult:
    """Constructs the plans of an analysed function, builds, checks and times them (see build), in
    worker processes or (``in_process``) in this thread; a profiled build takes the top-``topk`` plans
    predicted within ``margin`` of the first (:func:`within_margin`)."""
    from roller.builder.farm import profile as _profile, warm_up

    if not in_process:
        warm_up()
    cons = target_of(dev).construct(expr, dev, topk if profile else 1)
    programs = within_margin(cons.programs, margin) if profile else list(cons.programs[:1])
    if inputs is None:
        inputs = random_inputs(norm)
    prof = _profile(norm, expr, programs, dev, list(inputs), reference, progress=progress, time_kernels=profile,
                    build_budget=build_budget, in_process=in_process)
    best = prof.best
    program = programs[best]
    kernel_s = prof.candidates[best].measured_seconds if profile else None
    report = {
        **labels,  # op, shape, options first: what the kernel is
        "schema": REPORT_SCHEMA,
        "dtype": labels.get("dtype", expr.dtype),  # what build_op was asked (int8), else the function's
        "out_dtype": expr.dtype,  # what the kernel writes (an int8 reduction accumulates and stores int32)
        "device": dev.name,
        "tier": "profiled" if profile else "top1",
        "device_calibrated": dev.calibrated,
        "construct_seconds": cons.seconds,
        "build_seconds": time.perf_counter() - t0,
        "kernel_seconds": kernel_s,
        "gflops": (expr.flops / kernel_s / 1e9) if kernel_s else None,
        "predicted_gflops": expr.flops / program.predicted_seconds / 1e9 if program.predicted_seconds else None,
        "verified": bool(prof.candidates[best].verified),
        "chosen": best,
        "epsilon": cons.epsilon,
        "build_budget": build_budget,
        "profile_margin": margin if profile else None,
        "threads": dev.units.count,
        "candidates": [_candidate_report(p, c) for p, c in zip(programs, prof.candidates)],
    }
    return BuildResult(module=prof.module, program=program, report=report, expr=expr, device=dev, profile=prof,
                       library=prof.lib_path, _owned=prof.library)


def _candidate_report(p: RProgram, c) -> dict:
    return {
        "tiles": {lv: dict(t) for lv, t in zip(p.levels, p.tiles)},
        "packed": list(p.packed),
        "units": p.units, "waves": p.waves,
        "predicted_seconds": p.predicted_seconds,
        "measured_seconds": c.measured_seconds,
        "compile_seconds": c.compile_seconds,
        "verified": bool(c.verified),
        "error": c.error,
        "notes": list(c.notes),
        "vector_axis": p.vector_axis, "padded": list(p.padded), "predicated": list(p.predicated),
        "inlined": list(p.inlined),
        "footprint_bytes": dict(p.footprint_bytes),
        "traffic_bytes": dict(p.traffic_bytes),
    }


def random_inputs(func, seed: int = 0) -> list[np.ndarray]:
    """Random arrays for a PrimFunc's input parameters (all but the last, the output)."""
    rng = np.random.default_rng(seed)
    arrays = []
    for p in list(func.params)[:-1]:
        shape, dtype = tuple(int(s) for s in p.shape), str(p.dtype)
        if "float" in dtype:
            arrays.append(rng.uniform(-1, 1, shape).astype(dtype))
        else:
            arrays.append(rng.integers(-4, 5, shape).astype(dtype))
    return arrays


def build_op(op: str, shape: Mapping[str, int], dtype: str = "float32", device: Device | str | None = None,
             topk: int | None = None, profile: bool = True, progress: bool = False,
             build_budget: float | None = BUILD_BUDGET_SECONDS, cache: bool = True, **options: str) -> BuildResult:
    """Builds one of roller's named operators (see roller.tir.ops.OPS), verified against its numpy reference.

    ``options`` set the operator's string options, e.g. ``kind="avg"`` for pool2d or ``layout="nt"`` for
    matmul (InvalidShapeError for an option the operator does not take or a value it does not allow);
    the report's ``options`` names every option's value. ``cache``: see :func:`build`.
    """
    from roller.tir import ops
    from roller.builder.farm import warm_up

    spec = ops.get_op(op).with_options(**options)
    full = ops.validate_shape(spec, dict(shape), dtype)
    if not cache and profile:  # the build server imports TVM while this process does the same, on the other
        warm_up()  # core (with the cache, only a miss starts it: a hit needs no build server; top-1 needs none)
    func = spec.make(full, dtype)

    def check() -> tuple[list[np.ndarray], np.ndarray]:
        inputs = spec.inputs(full, dtype, np.random.default_rng(0))
        return inputs, spec.reference(inputs, full)

    return _build(func, device, topk, profile, check, progress, spec.name, full, build_budget, cache,
                  spec.option_values, dtype)
