"""The offline CUDA toolchain (roller.targets.cuda.toolchain): headers gathered by roller, NVRTC to PTX and cubin, ptxas -v parsed."""
import os

import pytest

from roller.targets.cuda import toolchain as cudatools
from roller.errors import ToolchainError

PTXAS_SAMPLE = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'main_kernel' for 'sm_80'
ptxas info    : Function properties for main_kernel
    24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 6912 bytes smem, 380 bytes cmem[0]
ptxas info    : Compiling entry function 'other' for 'sm_80'
ptxas info    : Function properties for other
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, 360 bytes cmem[0]
"""

KERNEL = """
extern "C" __global__ void __launch_bounds__(128) axpy(float* __restrict__ y, const float* __restrict__ x, int n) {
  __shared__ float buf[128];
  int i = blockIdx.x * 128 + threadIdx.x;
  buf[threadIdx.x] = i < n ? x[i] : 0.0f;
  __syncthreads();
  if (i < n) y[i] += 2.0f * buf[127 - threadIdx.x];
}
"""


def test_parse_ptxas_reads_every_kernel():
    found = cudatools.parse_ptxas(PTXAS_SAMPLE)
    assert [k.kernel for k in found] == ["main_kernel", "other"]
    main, other = found
    assert (main.registers, main.spill_store_bytes, main.spill_load_bytes, main.stack_bytes, main.shared_bytes,
            main.barriers) == (255, 8, 12, 24, 6912, 1)
    assert main.spills and not other.spills
    assert (other.registers, other.shared_bytes, other.barriers) == (10, 0, 0)


def test_parse_ptxas_without_register_line_is_an_error():
    with pytest.raises(ToolchainError, match="no register count"):
        cudatools.parse_ptxas("ptxas info    : Compiling entry function 'k' for 'sm_80'\n")


needs_cuda = pytest.mark.skipif(cudatools.missing() is not None, reason=f"CUDA toolchain: {cudatools.missing()}")


@needs_cuda
def test_include_root_gathers_headers(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    root = cudatools.include_root()
    assert os.environ["CUDA_PATH"] == str(root)
    assert (root / "include" / "cuda_runtime.h").is_file()
    assert (root / "include" / "cuda" / "std" / "cstdint").is_file()
    assert (root / "include" / "crt" / "mma.h").is_file()  # what mma.h (WMMA) includes
    assert cudatools.include_root() == root  # idempotent: existing links are kept


@needs_cuda
@pytest.mark.parametrize("arch", ["sm_70", "sm_80", "sm_89", "sm_90"])
def test_source_to_ptx_cubin_and_resources(arch):
    ptx = cudatools.to_ptx(KERNEL, arch)
    assert ".entry axpy" in ptx and f".target {arch}" in ptx
    cubin = cudatools.to_cubin(KERNEL, arch)
    assert cubin[:4] == b"\x7fELF"
    assembled, (res,) = cudatools.assemble(ptx, arch)
    assert assembled[:4] == b"\x7fELF"
    assert res.kernel == "axpy" and res.shared_bytes == 128 * 4 and res.barriers == 1
    assert 0 < res.registers < 64 and not res.spills


WMMA_KERNEL = r"""
#include <mma.h>
using namespace nvcuda;
extern "C" __global__ void tc(const half* a, const half* b, float* c) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::fill_fragment(fc, 0.0f);
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}
"""


@needs_cuda
def test_tensor_core_source_compiles():
    # fp16 in, fp32 accumulate on the tensor cores: the headers WMMA needs are gathered too (only the
    # compile is checked here: no GPU runs it)
    ptx = cudatools.to_ptx(WMMA_KERNEL, "sm_80")
    assert "wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32" in ptx
    _, (res,) = cudatools.assemble(ptx, "sm_80")
    assert not res.spills


@needs_cuda
def test_bad_source_names_the_arch():
    with pytest.raises(ToolchainError, match="sm_80"):
        cudatools.to_ptx("this is not CUDA", "sm_80")
