"""``roller build OP --device a100``: the GPU plans compiled offline, checked against the device's limits, then
profiled on the GPU where it is present, else the chosen kernel's numbers checked on the CPU (OpenCL twin).

The top-K plans are compiled to CUDA, PTX and cubin for the spec's architecture (``codegen.cuda.build_cuda``);
a candidate whose kernel breaks a limit (``verify_gpu_code``, registers, spills, an occupancy below the
model's) is dropped before the ranking is final. Where TVM's CUDA runtime finds the spec's GPU, the kept
candidates run on it, are checked against numpy and timed (``roller.targets.cuda.profile``, the CPU profiling's
screen-then-alternated-finalists timing), and the fastest wins (``timed: true``, ``measured_seconds``).
Without a GPU the ranking is the model's alone and nothing is timed, which the report says (``timed:
false``, ``ranking``); where PoCL (or another OpenCL platform) is installed, the chosen schedule's OpenCL twin
runs on the operator's inputs and is compared with numpy (``verified``); without one ``verified`` is null
and ``verified_by`` says why.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from roller.targets.cuda.schedule import CudaBuild
from roller.plan.construct import construct
from roller.targets.cuda import construct as rules
from roller.device.spec import Device
from roller.errors import BuildError, ToolchainError
from roller.plan.expr import Expr
from roller.plan.gpuplan import GpuKind
from roller.plan.rprogram import RProgram

NOT_TIMED = "the model's alone: no GPU was used and nothing was timed"
# Operators above this many flops are not run through the OpenCL twin (nor is their numpy reference made):
# PoCL on this 2-core machine took ~40 s for a 4096^3 matmul (137 GFLOP) including the reference; the same
# schedules are checked on small shapes by tests/test_cuda_codegen.py.
TWIN_FLOP_LIMIT = 2e9


@dataclass
class GpuBuildResult:
    """The chosen GPU plan, its offline build (``build``: source, PTX, cubin, ptxas resources) and the report
    (keys as ``roller build --json`` prints them)."""

    program: RProgram
    build: CudaBuild
    report: dict
    expr: Expr
    device: Device
    builds: list = field(default_factory=list, repr=False)

    def save(self, directory) -> dict[str, str]:
        """Writes ``<op>.cu``, ``<op>.ptx``, ``<op>.cubin`` and ``<op>.json`` (the report) into ``directory``."""
        from roller.output import atomic_write_bytes

        out = Path(directory)
        stem = str(self.report.get("op") or self.expr.name)
        paths = {"source": out / f"{stem}.cu", "ptx": out / f"{stem}.ptx", "cubin": out / f"{stem}.cubin",
                 "report": out / f"{stem}.json"}
        atomic_write_bytes(paths["source"], self.build.source.encode())
        atomic_write_bytes(paths["ptx"], self.build.ptx.encode())
        atomic_write_bytes(paths["cubin"], self.build.cubin)
        report = dict(self.report, program=self.program.to_dict(), files={k: str(v) for k, v in paths.items()})
        atomic_write_bytes(paths["report"], (json.dumps(report, indent=2) + "\n").encode())
        return {k: str(v) for k, v in paths.items()}


def _candidate(p: RProgram, build: CudaBuild | None, error: str | None) -> dict:
    main = build.main() if build is not None else None
    return {
        "tiles": {lv: dict(t) for lv, t in zip(p.levels, p.tiles)},
        "grid": dict(p.grid), "units": p.units, "waves": p.waves,
        "predicted_seconds": p.predicted_seconds, "measured_seconds": None, "verified": None,
        "kind": p.gpu.kind.value,
        "model": {"threads": p.gpu.threads, "registers": p.gpu.model.registers,
                  "shared_bytes": p.gpu.model.shared_bytes, "blocks_per_sm": p.gpu.model.blocks_per_sm,
                  "footprint_bytes": dict(p.footprint_bytes)},
        "ptxas": main.to_dict() if main is not None else None,
        "problems": list(build.problems) if build is not None else [],
        "error": error,
        "dropped": build is None or bool(build.problems),
        "predicated": list(p.predicated), "storage_pad": dict(p.storage_pad),
        "copy_lanes": dict(p.gpu.copy_lanes),
    }


def _check_twin(func, expr: Expr, program: RProgram, device: Device, inputs, reference) -> tuple[bool | None, str]:
    """(verified, by what): the OpenCL twin of the schedule on this machine's OpenCL device against numpy."""
    from roller.targets.cuda import opencl
    from roller.targets.cuda.schedule import schedule_cuda

    from roller.measure.verify import fill_sentinel

    if program.gpu.kind is GpuKind.TENSOR_CORE:
        return None, "not checked: tensor-core (WMMA) code has no OpenCL twin, and no GPU ran it"
    reason = opencl.missing() or opencl.unsupported(t.dtype for t in expr.tensors)
    if reason:
        return None, f"not checked: {reason}"
    twin = opencl.opencl_program(schedule_cuda(func, expr, program, device).mod)
    names = [str(p.name) for p in func.params]
    out = fill_sentinel(np.empty(reference.shape, reference.dtype))
    got = opencl.run(twin, dict(zip(names, list(inputs) + [out])), (names[-1],))[names[-1]]
    ok = bool(np.allclose(got, reference, rtol=1e-4, atol=1e-4))
    return ok, "the OpenCL twin of the same schedule on this CPU (PoCL), against numpy"


def default_runtime(device: Device):
    """TVM's CUDA runtime where the spec's GPU is in this machine, else None (the ranking is the model's)."""
    from roller.targets.cuda.runtime import CudaRuntime, cuda_missing

    return CudaRuntime(device) if cuda_missing(str(device.target.get("arch", "")) or None) is None else None


def _profile(norm, expr: Expr, programs, kept: list[int], device: Device, runtime, inputs, reference, rows) -> int:
    """Checks and times the kept candidates on ``runtime`` (``roller.targets.cuda.profile``); fills their rows and
    returns the index of the one the timing chose (the fastest by a margin, else the model's first). BuildError
    when none matches numpy."""
    from roller.targets.cuda.schedule import schedule_cuda
    from roller.targets.cuda.profile import profile_gpu

    modules = {i: schedule_cuda(norm, expr, programs[i], device).mod for i in kept}
    names = [str(p.name) for p in norm.params]
    timings = profile_gpu(modules, runtime, names, list(inputs), np.asarray(reference))
    for i, t in timings.items():
        rows[i]["verified"], rows[i]["measured_seconds"] = t.verified, t.measured_seconds
        if not t.verified:
            rows[i]["dropped"], rows[i]["error"] = True, t.error
    timed = [i for i in kept if timings[i].verified]
    if not timed:
        raise BuildError(f"{expr.name}: none of the {len(kept)} GPU candidates matched numpy on {runtime.name}",
                         details="\n".join(f"#{i}: {timings[i].error}" for i in kept))
    return next(i for i in timed if timings[i].chosen)


def _timed_on(runtime) -> str:
    if runtime.name == "cuda":
        return (f"measured on {runtime.dev.device_name} (TVM's CUDA runtime): the fastest verified candidate "
                "(by a margin over the model's first)")
    return ("measured on the OpenCL twin on this CPU: the profiling path runs, but these times are the CPU's "
            "and say nothing about the GPU")


def build_gpu(func, device: Device, topk: int, labels: Mapping[str, Any], inputs=None, reference=None,
              runtime: Any = "auto") -> GpuBuildResult:
    """Constructs the top-``topk`` plans of ``func`` for the GPU ``device``, compiles each offline, drops
    those over the device's limits; then, on a ``runtime`` (``"auto"``: TVM's CUDA runtime where the spec's
    GPU is present; tests pass ``gpu_runtime.OpenCLRuntime()``) with ``inputs`` and ``reference``, checks each
    kept one against numpy and times it, as CPU profiling does, and returns the fastest; without a runtime,
    returns the model's best kept plan (see module doc)."""
    from roller.targets.cuda.schedule import build_cuda
    from roller.tir.analysis import analyze_fused as analyze

    t0 = time.perf_counter()
    expr, norm = analyze(func)
    cons = construct(expr, device, topk, rules=rules)
    builds: list[CudaBuild | None] = []
    rows = []
    from tvm.s_tir.schedule.schedule import ScheduleError

    for p in cons.programs:
        try:
            b, err = build_cuda(norm, expr, p, device), None
        except ToolchainError:
            raise
        except (BuildError, ScheduleError) as e:  # this candidate only: a step that does not apply
            b, err = None, f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
        builds.append(b)
        rows.append(_candidate(p, b, err))
    kept = [i for i, r in enumerate(rows) if not r["dropped"]]
    if not kept:
        raise BuildError(f"{expr.name}: every one of the {len(rows)} GPU candidates broke a limit of {device.name} "
                         f"or failed to build", details="\n".join(f"#{i}: {r['error'] or r['problems']}"
                                                               for i, r in enumerate(rows)))
    if runtime == "auto":
        runtime = default_runtime(device)
    measured = runtime is not None and inputs is not None and reference is not None
    if measured:
        best = _profile(norm, expr, cons.programs, kept, device, runtime, inputs, reference, rows)
        verified, by = True, f"numpy, on {runtime.name} (every timed candidate)"
    else:
        best = kept[0]  # the plans are in the model's order: the first that fits is the model's choice
    program = cons.programs[best]
    if measured:
        pass  # every timed candidate was checked against numpy on the runtime
    elif expr.flops > TWIN_FLOP_LIMIT:
        verified, by = None, (f"not checked: {expr.flops / 1e9:.3g} GFLOP is too much for the OpenCL twin on this "
                              f"CPU (limit {TWIN_FLOP_LIMIT / 1e9:g} GFLOP)")
    elif inputs is None or reference is None:
        verified, by = None, "not checked: no inputs and reference were given"
    else:
        verified, by = _check_twin(norm, expr, program, device, inputs, reference)
    if verified is False:
        raise BuildError(f"{expr.name}: the chosen GPU schedule's OpenCL twin does not match numpy on this CPU")
    report = {
        **labels,
        "dtype": labels.get("dtype", expr.dtype), "out_dtype": expr.dtype,
        "device": device.name, "device_kind": device.kind, "arch": builds[best].arch,
        "device_calibrated": device.calibrated,
        "construct_seconds": cons.seconds, "build_seconds": time.perf_counter() - t0,
        "kernel_seconds": rows[best]["measured_seconds"],
        "gflops": expr.flops / rows[best]["measured_seconds"] / 1e9 if rows[best]["measured_seconds"] else None,
        "predicted_gflops": expr.flops / program.predicted_seconds / 1e9 if program.predicted_seconds else None,
        "peak_fraction": (expr.flops / program.predicted_seconds / 1e9
                          / (device.units.peak(expr.dtype) * device.units.count)),
        "timed": measured, "ranking": _timed_on(runtime) if measured else NOT_TIMED,
        "verified": verified, "verified_by": by,
        "chosen": best, "dropped": [i for i, r in enumerate(rows) if r["dropped"]],
        "epsilon": cons.epsilon, "cache": "off",
        "candidates": rows,
    }
    return GpuBuildResult(program, builds[best], report, expr, device, builds)



def build_offline(func, expr: Expr, device: Device, topk: int, labels: Mapping[str, Any], check,
                  profile: bool) -> GpuBuildResult:
    """The GPU target's build path (``Target.build_offline``; ``expr`` is ``func``'s analysed Expr): with
    ``profile`` and the spec's GPU in this machine, the kept plans are checked and timed on it whatever their
    size; otherwise the model ranks them and the chosen one's OpenCL twin is checked where the operator is small
    enough. ``check()`` makes the (inputs, reference) only where they are used."""
    runtime = default_runtime(device) if profile else None
    inputs, reference = check() if runtime is not None or expr.flops <= TWIN_FLOP_LIMIT else (None, None)
    return build_gpu(func, device, topk, labels, inputs, reference, runtime=runtime)
