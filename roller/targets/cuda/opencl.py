"""The OpenCL twin of a GPU schedule, run on the CPU: the GPU back end's numerics without a GPU.

TVM emits OpenCL C from the same scheduled module it emits CUDA from (``target.build.opencl``); its
OpenCL runtime is not in the wheel, so the kernels run through ``pyopencl`` on whatever OpenCL platform
is installed (Debian's PoCL runs them on the CPU; ``oclgrind`` checks them for data races). The host side
is read from the lowered host function: its kernel-call statements give each kernel's name, its buffer
arguments in order (not the function's parameter order) and its grid (blocks and threads per axis).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from roller.errors import BuildError, ToolchainError
from roller.targets.cuda.launch import KernelLaunch, kernel_launches, lower

INSTALL_HINT = ("install pyopencl (pip install pyopencl, in the test extra) and an OpenCL platform "
                "(Debian: apt-get install pocl-opencl-icd ocl-icd-libopencl1)")


@dataclass(frozen=True)
class OpenCLProgram:
    """The OpenCL source of a scheduled module and the kernel calls its host function makes, in order."""

    source: str
    launches: tuple[KernelLaunch, ...]


def opencl_program(mod) -> OpenCLProgram:
    """OpenCL C and kernel calls of a scheduled module (the same schedule the CUDA build uses)."""
    import tvm

    target = tvm.target.Target({"kind": "opencl"}, host={"kind": "llvm"})
    ex = tvm.compile(mod, target)
    source = ex.mod.imports[0].inspect_source("")
    return OpenCLProgram(source, kernel_launches(lower(mod, target)[0]))


def missing() -> str | None:
    """Why OpenCL kernels cannot run here (one line), or None."""
    try:
        import pyopencl as cl
    except ImportError:
        return f"pyopencl is not installed; {INSTALL_HINT}"
    try:
        if not any(p.get_devices() for p in cl.get_platforms()):
            return f"no OpenCL device; {INSTALL_HINT}"
    except cl.Error as e:
        return f"no OpenCL platform ({e}); {INSTALL_HINT}"
    return None


# dtype -> the OpenCL extension a kernel using it needs
DTYPE_EXTENSIONS = {"float16": "cl_khr_fp16", "float64": "cl_khr_fp64"}


def unsupported(dtypes) -> str | None:
    """Why the OpenCL device cannot run kernels over these dtypes (one line), or None."""
    import pyopencl as cl

    device = next(d for p in cl.get_platforms() for d in p.get_devices())
    lacking = sorted(DTYPE_EXTENSIONS[d] for d in set(map(str, dtypes)) if d in DTYPE_EXTENSIONS
                     and DTYPE_EXTENSIONS[d] not in device.extensions)
    return f"the OpenCL device {device.name} lacks {', '.join(lacking)}" if lacking else None


class Launcher:
    """An ``OpenCLProgram`` built once on the first OpenCL device: upload arrays, launch its kernels in order
    (as many times as asked), read outputs back."""

    def __init__(self, program: OpenCLProgram):
        reason = missing()
        if reason:
            raise ToolchainError(reason)
        import pyopencl as cl

        self.cl, self.program = cl, program
        device = next(d for p in cl.get_platforms() for d in p.get_devices())
        self.ctx = cl.Context([device])
        self.queue = cl.CommandQueue(self.ctx)
        try:
            self.built = cl.Program(self.ctx, program.source).build()
        except cl.RuntimeError as e:
            raise BuildError(f"the OpenCL twin does not compile on {device.name}: {e}") from None
        self.kernels = {name: cl.Kernel(self.built, name) for name in {lc.kernel for lc in program.launches}}

    def upload(self, arrays: Mapping[str, np.ndarray]) -> dict:
        """Device buffers holding ``arrays`` (every buffer a kernel takes, by name)."""
        mf = self.cl.mem_flags
        return {name: (self.cl.Buffer(self.ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(a)), a)
                for name, a in arrays.items()}

    def launch(self, bufs: dict) -> None:
        """Enqueues every kernel call of the program once, in order."""
        for launch in self.program.launches:
            missing_bufs = [b for b in launch.buffers if b not in bufs]
            if missing_bufs:
                raise BuildError(f"kernel {launch.kernel} takes buffer(s) {missing_bufs} that were not given")
            glob, local = launch.sizes()
            self.kernels[launch.kernel](self.queue, glob, local, *[bufs[b][0] for b in launch.buffers])

    def finish(self) -> None:
        self.queue.finish()

    def read(self, bufs: dict, outputs: tuple[str, ...]) -> dict[str, np.ndarray]:
        out = {}
        for name in outputs:
            out[name] = np.empty_like(bufs[name][1])
            self.cl.enqueue_copy(self.queue, out[name], bufs[name][0])
        self.queue.finish()
        return out

    def run(self, arrays: Mapping[str, np.ndarray], outputs: tuple[str, ...]) -> dict[str, np.ndarray]:
        """Uploads ``arrays``, runs the kernels once and returns the ``outputs``."""
        bufs = self.upload(arrays)
        self.launch(bufs)
        return self.read(bufs, outputs)


def run(program: OpenCLProgram, arrays: Mapping[str, np.ndarray], outputs: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Runs the kernels of ``program`` in order on the first OpenCL device, on ``arrays`` (every buffer a
    kernel takes, by name: inputs with data, outputs with their shape), and returns the ``outputs``."""
    return Launcher(program).run(arrays, outputs)
