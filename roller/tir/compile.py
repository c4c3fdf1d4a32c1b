"""The few TVM runtime settings every building module shares: the target of a device, the thread pool."""
from __future__ import annotations

import functools
import os
import threading

from roller.device.spec import Device


_THREADS_LOCK = threading.Lock()
# yields a TVM worker spins through, once its pool goes idle, before it sleeps: long enough to span the gaps
# between the kernels of one model run, short enough not to hold a core from other work on the machine after
# roller's last call (TVM's own 300000 held one for ~150 ms; docs/models.md, "TVM's idle workers")
SPIN_COUNT = 20000


def set_threads(count: int) -> None:
    """Makes TVM's CPU thread pool use ``count`` threads, unless the user set TVM_NUM_THREADS, leaves its
    workers unpinned (``TVM_BIND_THREADS=0``) and lets them spin SPIN_COUNT yields when idle
    (``TVM_THREAD_POOL_SPIN_COUNT``), unless the user set those.

    TVM otherwise starts half the logical CPUs on x86 (one thread on a 2-core machine), and pins each worker
    to a core: a worker whose core other work keeps busy then holds up every parallel region's join for a
    time slice (ShuffleNet, 2 cores, a busy loop on one: 348 ms a call pinned, 3.9 ms unpinned, 2.9 idle
    either way; docs/models.md). The variables are read when the pool first starts, so call this before
    the first kernel runs. The environment is written at most once per process, under a lock (the first
    call wins; later ones find it set), so threads that build at once neither race on it nor change it
    under a running pool.
    """
    with _THREADS_LOCK:
        os.environ.setdefault("TVM_BIND_THREADS", "0")
        os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", str(SPIN_COUNT))
        os.environ.setdefault("TVM_NUM_THREADS", str(count))


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
# instead of folding the offsets into the loads' displacements; LLVM's own CSE does the rest without that
# (docs/design-notes.md#compile-cpu_pass_config).
CPU_PASS_CONFIG = {"tirx.disable_cse_tir": True}

# TVM's TIR lowering passes that only ever change GPU (or Hexagon) code: thread bindings, shared memory,
# tensor-core fragments, annotated pipelines and double buffers. On a CPU build each still walks the whole
# function to find nothing (docs/design-notes.md#compile-gpu_only_passes).
GPU_ONLY_PASSES = ("s_tir.LowerCrossThreadReduction", "s_tir.LiftThreadBinding",
                   "s_tir.ManifestSharedMemoryLocalStage", "s_tir.LowerAutoCopy", "s_tir.UnifyThreadBinding",
                   "s_tir.InjectPermutedLayout", "s_tir.InjectSoftwarePipeline", "s_tir.TransformMmaBufferLayout",
                   "s_tir.InjectVirtualThread", "s_tir.InjectDoubleBuffer", "s_tir.VerifyVTCMLimit",
                   "s_tir.LowerVtcmAlloc", "s_tir.ThreadSync", "s_tir.InferFragment", "s_tir.LowerThreadAllreduce",
                   "s_tir.MergeSharedMemoryAllocations")


def pass_context(target):
    """The PassContext to compile for ``target`` in: the current one, with CPU_PASS_CONFIG added and the
    GPU_ONLY_PASSES left out for an llvm target (an option the caller set stays as set)."""
    import tvm

    current = tvm.transform.PassContext.current()
    if target.kind.name != "llvm":
        return current
    config = {**CPU_PASS_CONFIG, **dict(current.config)}
    disabled = list(current.disabled_pass) + [p for p in GPU_ONLY_PASSES if p not in current.disabled_pass]
    return tvm.transform.PassContext(opt_level=current.opt_level, required_pass=current.required_pass,
                                     disabled_pass=disabled, instruments=current.instruments, config=config)


def compile_for(mod, target, **kwargs):
    """``tvm.compile(mod, target, **kwargs)`` in :func:`pass_context`: roller's kernels and modules are
    built through here, so that none misses the CPU pass configuration (the GPU builds and the dynamic-shape
    padding probes, whose unscheduled kernels it does not concern, call ``tvm.compile`` themselves)."""
    import tvm

    with pass_context(target):
        return tvm.compile(mod, target, **kwargs)


# Linking a kernel library. TVM's export runs ``g++ -shared``: the compiler driver, then collect2, then ld,
# most of that time the driver's; ld alone is a fraction of it (docs/design-notes.md#compile-direct_linker).
# An LLVM-built CPU kernel needs from the driver's defaults only libm (math calls) and libgcc (compiler
# helpers such as 128-bit division); the rest (TVM's FFI, libc) it finds in the process that loads it,
# as the driver-linked library does too.
@functools.lru_cache(maxsize=1)
def _direct_linker() -> tuple[str, str] | None:
    """(ld, libgcc.a) to link with, or None where either is missing (TVM's own link is used then)."""
    import shutil
    import subprocess

    from tvm.support import cc

    ld = shutil.which("ld")
    try:
        libgcc = subprocess.run([cc.get_cc(), "-print-libgcc-file-name"], capture_output=True, text=True,
                                check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError, TypeError):
        return None
    return (ld, libgcc) if ld and os.path.isfile(libgcc) else None


def _link_shared(output: str, objects, options=None, **kwargs) -> None:
    """``fcompile`` for ``export_library``: ld straight on LLVM object files; TVM's ``create_shared``
    (the compiler driver) for anything else (sources, options) or where ld fails."""
    import subprocess

    from tvm.support import cc

    files = [objects] if isinstance(objects, str) else list(objects)
    linker = _direct_linker()
    if linker is not None and not options and not kwargs and all(f.endswith(".o") for f in files):
        ld, libgcc = linker
        cmd = [ld, "-shared", "--eh-frame-hdr", "-o", output, *files, "-lm", libgcc]
        if subprocess.run(cmd, capture_output=True).returncode == 0:
            return
    cc.create_shared(output, files, options, **kwargs)


def export_library(executable, path: str) -> None:
    """Writes ``executable`` (from :func:`compile_for`) as a shared library at ``path``, linked by
    :func:`_link_shared`."""
    executable.export_library(path, fcompile=_link_shared)
