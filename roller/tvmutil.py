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
