"""Where GPU kernels run: TVM's CUDA runtime on a machine with an NVIDIA GPU, or the OpenCL twin of the same
schedule on any OpenCL platform (PoCL on a CPU) to check the device-independent path without a GPU.

Both runtimes take a scheduled IRModule (``compile``), run it on numpy arrays by parameter name (``run``) and
time it (``time``: seconds per call, one entry per repeat). Calibration (``microbench.gpu``) and GPU
profiling (``roller.gpu_profile``) are written against this interface only, so the code that runs on a GPU
is the code the tests drive on PoCL. Only ``CudaRuntime``'s timings mean anything about a GPU.
"""
from __future__ import annotations

import time
from typing import Mapping

import numpy as np

from .device import Device
from .errors import ToolchainError


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

        from .tvmutil import target_for

        reason = cuda_missing(str(device.target.get("arch", "")) or None)
        if reason:
            raise ToolchainError(reason)
        from . import cudatools

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

    def time(self, kernel, arrays: Mapping[str, np.ndarray], number: int, repeat: int) -> list[float]:
        tensors = self._tensors(kernel, arrays)
        ev = kernel[0].time_evaluator("main", self.dev, number=number, repeat=repeat)
        return [float(s) for s in ev(*tensors).results]


class OpenCLRuntime:
    """The OpenCL twin of each module on the first OpenCL device (``roller.codegen.opencl``): right numbers,
    and timings of that device (a CPU under PoCL), which say nothing about a GPU."""

    name = "opencl"
    timed = False

    def __init__(self):
        from .codegen import opencl

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

    def time(self, kernel, arrays: Mapping[str, np.ndarray], number: int, repeat: int) -> list[float]:
        bufs = kernel.upload(arrays)
        out = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(number):
                kernel.launch(bufs)
            kernel.finish()
            out.append((time.perf_counter() - t0) / number)
        return out
