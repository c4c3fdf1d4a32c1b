"""What the GPU tests need on this machine, as pytest skip marks with the reason (shared by the GPU test files):
the CUDA toolchain extra (NVRTC, ptxas), an OpenCL platform (PoCL) with pyopencl, and oclgrind."""
import shutil

import pytest

from roller.targets.cuda import toolchain as cudatools
from roller.targets.cuda import opencl

GPUS = ("v100", "a100", "h100", "rtx4090")  # the shipped GPU specs

no_cuda = cudatools.missing()
no_opencl = opencl.missing()
needs_cuda = pytest.mark.skipif(no_cuda is not None, reason=f"CUDA toolchain: {no_cuda}")
needs_opencl = pytest.mark.skipif(no_opencl is not None, reason=f"OpenCL: {no_opencl}")
needs_oclgrind = pytest.mark.skipif(shutil.which("oclgrind") is None, reason="oclgrind is not installed (Debian: "
                                    "apt-get install oclgrind; .ci/run installs it)")
