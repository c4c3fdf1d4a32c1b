"""The few TVM runtime settings every building module shares: the target of a device, the thread pool."""
from __future__ import annotations

import os
import threading

from .device import Device


_THREADS_LOCK = threading.Lock()


def set_threads(count: int) -> None:
    """Makes TVM's CPU thread pool use ``count`` threads, unless the user set TVM_NUM_THREADS.

    TVM otherwise starts half the logical CPUs on x86 (one thread on a 2-core machine). The variable is
    read when the pool first starts, so call this before the first kernel runs. The environment is
    written at most once per process, under a lock (the first call wins; later ones find it set), so
    threads that build at once neither race on it nor change it under a running pool.
    """
    if "TVM_NUM_THREADS" in os.environ:
        return
    with _THREADS_LOCK:
        if "TVM_NUM_THREADS" not in os.environ:
            os.environ["TVM_NUM_THREADS"] = str(count)


def target_for(device: Device):
    """The tvm.target.Target a device compiles for; ``mcpu: host`` becomes this machine's CPU."""
    import tvm

    spec = dict(device.target)
    if spec.get("kind") == "llvm":
        if spec.get("mcpu") in (None, "host"):
            spec["mcpu"] = tvm.target.codegen.llvm_get_system_cpu()
        spec.setdefault("num-cores", device.units.count)
        return tvm.target.Target(spec)
    host = spec.pop("host", {"kind": "llvm"})
    return tvm.target.Target(spec, host=host)


# TVM's TIR common-subexpression elimination is off for CPU builds. It binds index sums that hold the
# parallel loop's variable (``h_0 * 28672 + w_0 * 512 + ...``) to int32 lets and addresses every row of a
# register tile as that let plus a constant (``cse_v10 + 3552``, ``+ 7136``, ...). LLVM cannot prove those
# int32 additions do not overflow (the parallel variable has no known lower bound), so it sign-extends
# each row's index on its own (vectorized: broadcast, add, shift, extract per row, beside the FMAs)
# instead of folding the offsets into the loads' displacements; LLVM's own CSE does the rest without that.
# Measured, 2 threads, one process, the same plan alternating with and without: depthwise 3x3 on
# 112x112x32 with a register tile of 8 rows x 1 pixel 48-52 -> 35-40 us (the 1 row x 8 pixels tile the
# model ties it with ran 35 either way); every other suite case's first plan within noise, compile time
# unchanged.
CPU_PASS_CONFIG = {"tirx.disable_cse_tir": True}


def pass_context(target):
    """The PassContext to compile for ``target`` in: the current one, with CPU_PASS_CONFIG added for an
    llvm target (an option the caller set stays as set)."""
    import tvm

    current = tvm.transform.PassContext.current()
    if target.kind.name != "llvm":
        return current
    config = {**CPU_PASS_CONFIG, **dict(current.config)}
    return tvm.transform.PassContext(opt_level=current.opt_level, required_pass=current.required_pass,
                                     disabled_pass=current.disabled_pass, instruments=current.instruments,
                                     config=config)


def compile_for(mod, target, **kwargs):
    """``tvm.compile(mod, target, **kwargs)`` in :func:`pass_context`: roller's kernels and modules are
    built through here, so that none misses the CPU pass configuration (the GPU builds and the dynamic-shape
    padding probes, whose unscheduled kernels it does not concern, call ``tvm.compile`` themselves)."""
    import tvm

    with pass_context(target):
        return tvm.compile(mod, target, **kwargs)
