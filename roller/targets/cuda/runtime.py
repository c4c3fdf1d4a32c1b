"""Where GPU kernels run: TVM's CUDA runtime on a machine with an NVIDIA GPU, or the OpenCL twin of the same
schedule on any OpenCL platform (PoCL on a CPU) to check the device-independent path without a GPU.

Both runtimes take a scheduled IRModule (``compile``), run it on numpy arrays by parameter name (``run``) and
time it (``timer``: a function returning the seconds a call of one repeat, each repeat ~50 ms of calls). Calibration (``roller.targets.cuda.microbench``) and GPU
profiling (``roller.targets.cuda.profile``) are written against this interface only, so the code that runs on a GPU
is the code the tests drive on PoCL. Only ``CudaRuntime``'s timings mean anything about a GPU.
"""
from __future__ import annotations

import math
import time
from typing import Callable, Mapping

import numpy as np

from roller.device.spec import Device
from roller.errors import ToolchainError
from roller.measure.finalists import TARGET_MEASURE_SECONDS


def cuda_missing(arch: str | None = None) -> str | None:
    """Why TVM's CUDA runtime cannot run kernels for ``arch`` (e.g. ``sm_80``) here (one line), or None.

    Checked through TVM (``tvm.runtime.enabled("cuda")``, ``tvm.cuda(0).exist``): without a driver this
    answers False and never raises (the CUDA driver API through cuda-bindings raises at ``cuInit`` instead)."""
    import tvm

    if not tvm.runtime.enabled("cuda"):
        return "TVM's CUDA runtime is not usable here (no NVIDIA driver): this machine has no CUDA GPU"
    dev = tvm.cuda(0)
    if not dev.exist:
        return "TVM's CUDA runtime sees no GPU (tvm.cuda(0).exist is False): this machine has no CUDA GPU"
    if arch:
        here = "sm_" + str(dev.compute_version).replace(".", "")
        if here != arch:
            return f"the GPU here is {dev.device_name} ({here}), not the spec's {arch}"
    return None


TARGET_SECONDS = TARGET_MEASURE_SECONDS  # a timed repeat runs the kernel about this long, as on the CPU


def _calls_for(run_once: Callable[[], object], target: float) -> int:
    """Calls a repeat makes so that it lasts about ``target`` seconds (one untimed call sizes it)."""
    t0 = time.perf_counter()
    run_once()
    return max(1, min(1000, math.ceil(target / max(time.perf_counter() - t0, 1e-7))))


def _param_names(mod) -> list[str]:
    func = mod["main"] if "main" in [g.name_hint for g in mod.get_global_vars()] else list(mod.functions.values())[0]
    return [str(p.name) for p in func.params]


class CudaRuntime:
    """TVM's CUDA runtime on GPU 0: ``tvm.compile`` for the device's target (NVRTC), tensors on the GPU,
    ``time_evaluator`` for timing. Construct only where ``cuda_missing`` is None."""

    name = "cuda"
    timed = True

    def __init__(self, device: Device):
        import tvm

        from roller.tir.compile import target_for

        reason = cuda_missing(str(device.target.get("arch", "")) or None)
        if reason:
            raise ToolchainError(reason)
        from roller.targets.cuda import toolchain as cudatools

        cudatools.include_root()  # NVRTC needs the headers
        self.tvm, self.dev, self.target = tvm, tvm.cuda(0), target_for(device)

    def unsupported(self, dtypes) -> str | None:
        """Why this GPU cannot run kernels over ``dtypes`` (None: every dtype roller plans runs on sm_70+)."""
        return None

    def compile(self, mod):
        return (self.tvm.compile(mod, self.target), _param_names(mod))

    def _tensors(self, kernel, arrays: Mapping[str, np.ndarray]):
        return [self.tvm.runtime.tensor(np.ascontiguousarray(arrays[n]), self.dev) for n in kernel[1]]

    def run(self, kernel, arrays: Mapping[str, np.ndarray], outputs) -> dict[str, np.ndarray]:
        tensors = self._tensors(kernel, arrays)
        kernel[0]["main"](*tensors)
        self.dev.sync()
        return {n: tensors[kernel[1].index(n)].numpy() for n in outputs}

    def timer(self, kernel, arrays: Mapping[str, np.ndarray], target: float = TARGET_SECONDS) -> Callable[[], float]:
        tensors = self._tensors(kernel, arrays)
        number = _calls_for(lambda: (kernel[0]["main"](*tensors), self.dev.sync()), target)
        ev = kernel[0].time_evaluator("main", self.dev, number=number, repeat=1)
        return lambda: float(ev(*tensors).results[0])


class OpenCLRuntime:
    """The OpenCL twin of each module on the first OpenCL device (``roller.targets.cuda.opencl``): right numbers,
    and timings of that device (a CPU under PoCL), which say nothing about a GPU."""

    name = "opencl"
    timed = False

    def __init__(self):
        from roller.targets.cuda import opencl

        reason = opencl.missing()
        if reason:
            raise ToolchainError(reason)
        self.opencl = opencl

    def unsupported(self, dtypes) -> str | None:
        """Why the OpenCL device cannot run kernels over ``dtypes`` (PoCL on a CPU has no float16), or None."""
        return self.opencl.unsupported(dtypes)

    def compile(self, mod):
        return self.opencl.Launcher(self.opencl.opencl_program(mod))

    def run(self, kernel, arrays: Mapping[str, np.ndarray], outputs) -> dict[str, np.ndarray]:
        return kernel.run(arrays, tuple(outputs))

    def timer(self, kernel, arrays: Mapping[str, np.ndarray], target: float = TARGET_SECONDS) -> Callable[[], float]:
        bufs = kernel.upload(arrays)

        def once():
            kernel.launch(bufs)
            kernel.finish()

        number = _calls_for(once, target)

        def repeat() -> float:
            t0 = time.perf_counter()
            for _ in range(number):
                kernel.launch(bufs)
            kernel.finish()
            return (time.perf_counter() - t0) / number
        return repeat
