"""Tensor-core plans for fp16 matmuls on sm_80+ (roller.targets.cuda.tensorcore, codegen/cuda_tensorcore): the policy by
hand, and the kernels compiled offline (NVRTC + ptxas) with WMMA instructions in the PTX, within the limits.
Their numbers cannot be checked here: OpenCL has no tensor-core instructions and no GPU is reachable."""
import re

import pytest
from tvm import te

from gpu_marks import needs_cuda
from roller.tir import ops
from roller.builder.api import analyze
from roller.targets.cuda.schedule import build_cuda
from roller.targets import construct
from roller.device.load import load_device
from roller.plan.gpuplan import GpuKind
from roller.targets.cuda.tensorcore import tc_registers, tc_shared_bytes, tensorcore_axes


def _mixed(m, n, k):
    """fp16 inputs, fp32 accumulation and output."""
    a = te.placeholder((m, k), "float16", "A")
    b = te.placeholder((k, n), "float16", "B")
    r = te.reduce_axis((0, k), "r")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r].astype("float32") * b[r, j].astype("float32"), axis=r), "C")
    return analyze(te.create_prim_func([a, b, c]))


def test_offered_for_fp16_matmuls_on_sm80_and_later():
    expr, _ = _mixed(256, 256, 256)
    assert tensorcore_axes(expr, load_device("a100", calibrated=False)) == ("i", "j", "r")
    assert tensorcore_axes(expr, load_device("v100", calibrated=False)) is None  # sm_70: not offered
    fp32, _ = analyze(ops.get_op("matmul").make({"M": 256, "N": 256, "K": 256}, "float32"))
    assert tensorcore_axes(fp32, load_device("a100", calibrated=False)) is None
    conv, _ = analyze(ops.get_op("conv2d").make({"N": 1, "H": 8, "W": 8, "C": 16, "K": 16, "R": 3, "S": 3}, "float16"))
    assert tensorcore_axes(conv, load_device("a100", calibrated=False)) is None  # windows


def test_registers_and_shared_memory_by_hand():
    # a 4 x 4-fragment warp tile, fp32 accumulators: 16 fragments x 256 x 4 B over 32 threads = 128 registers,
    # A and B fragments of 2 reduction fragments: 8 x 2 x 256 x 2 B / 4 / 32 = 64, plus 32 of overhead
    assert tc_registers(4, 4, 2, 4) == 128 + 64 + 32
    # 128 x 256 block, 32 deep: (128 + 256) rows of 32 + 8 halves, and 128 x (256 + 4) fp32 staged on the way out
    assert tc_shared_bytes(128, 256, 32, 4) == 384 * 40 * 2 + 128 * 260 * 4


@needs_cuda
@pytest.mark.parametrize("gpu", ["a100", "h100"])
@pytest.mark.parametrize("out", ["float32", "float16"])
def test_tensor_core_kernels_compile_within_the_limits(gpu, out):
    dev = load_device(gpu, calibrated=False)
    if out == "float32":
        expr, func = _mixed(1024, 1024, 512)
    else:
        expr, func = analyze(ops.get_op("matmul").make({"M": 1000, "N": 1000, "K": 512}, "float16"))
    plans = construct(expr, dev, topk=4).programs
    chosen = None
    for p in plans:  # the model's best plan that builds within the limits (a lowering failure drops one)
        assert p.gpu.kind is GpuKind.TENSOR_CORE and p.gpu.tensor_core, "an fp16 matmul on sm_80+ is planned for the tensor cores"
        try:
            build = build_cuda(func, expr, p, dev)
        except Exception as e:  # noqa: BLE001  (BuildError: TVM could not lower this factor set)
            assert "TVM could not lower" in str(e)
            continue
        if not build.problems:
            chosen = (p, build)
            break
    assert chosen is not None
    p, build = chosen
    acc = "f32.f32" if out == "float32" else "f16.f16"
    assert re.search(rf"wmma\.mma\.sync\.aligned\.row\.col\.m16n16k16\.{acc}", build.ptx)
    main = build.main()
    assert not main.spills and main.registers <= dev.gpu.max_registers_per_thread
    assert main.registers <= p.gpu.model.registers + 16  # the model's estimate is near ptxas's (no worse)
    assert p.gpu.model.shared_bytes <= dev.gpu.shared_per_block_optin


def test_build_says_tensor_core_numbers_are_unchecked():
    from roller.targets.cuda.build import _check_twin

    expr, func = _mixed(64, 64, 64)
    dev = load_device("a100", calibrated=False)
    p = construct(expr, dev, topk=1).programs[0]
    assert p.gpu.kind is GpuKind.TENSOR_CORE
    verified, by = _check_twin(func, expr, p, dev, None, None)
    assert verified is None and "no OpenCL twin" in by
