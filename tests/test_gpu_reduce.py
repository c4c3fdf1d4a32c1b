"""Block-level reductions on a GPU (roller.targets.cuda.reduce, codegen/cuda_reduce): where rows are long and few the
threads of a block share rows; the policy against hand-computed cases, the kernels' numbers on PoCL (OpenCL
twin), race-freedom under oclgrind, and the CUDA build within the limits (NVRTC + ptxas)."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from gpu_marks import GPUS, needs_cuda, needs_oclgrind, needs_opencl
from roller.tir import ops
from roller.builder.api import analyze
from roller.targets.cuda import opencl
from roller.targets.cuda.schedule import build_cuda, schedule_cuda
from roller.targets import construct
from roller.device.load import load_device
from roller.plan.gpuplan import GpuKind
from roller.targets.cuda.reduce import block_reduction_tiles, reduce_axis, reduction_shared_bytes


A100 = load_device("a100", calibrated=False)


def _expr(op, shape, **options):
    spec = ops.get_op(op).with_options(**options)
    return spec, analyze(spec.make(shape, "float32"))


def test_offered_where_the_reduction_is_contiguous_and_rows_long_and_few():
    assert reduce_axis(_expr("reduce_sum", {"M": 100, "N": 3001})[1][0], A100) == "n"
    assert reduce_axis(_expr("matmul", {"M": 1, "N": 1000, "K": 2048}, layout="nt")[1][0], A100) == "k"
    # k runs down B's columns in the nn layout: a warp along k would not coalesce
    assert reduce_axis(_expr("matmul", {"M": 1, "N": 1000, "K": 2048})[1][0], A100) is None
    assert reduce_axis(_expr("reduce_sum", {"M": 4096, "N": 7})[1][0], A100) is None       # short rows
    many = 108 * 2048  # as many rows as the A100 holds resident threads: one thread a row fills it
    assert reduce_axis(_expr("reduce_sum", {"M": many, "N": 512})[1][0], A100) is None
    assert reduce_axis(_expr("conv2d", {"N": 1, "H": 8, "W": 8, "C": 64, "K": 8, "R": 3, "S": 3,
                                        "pad": 1})[1][0], A100) is None  # several reduction axes


def test_tiles_are_whole_warps_within_the_block_limit():
    expr = _expr("reduce_sum", {"M": 100, "N": 3001})[1][0]
    tiles = block_reduction_tiles(expr, A100)
    assert tiles and all(s.threads % 32 == 0 and block["n"] == s.threads and block["m"] == s.rows
                         and s.rows * s.threads <= 1024 and thread == {"m": 1, "n": 1} for thread, block, s in tiles)
    assert {s.threads for _, _, s in tiles} == {32, 64, 128, 256, 512, 1024}


def test_shared_bytes_of_the_combine_by_hand():
    # 1 row over 32 warps: 32 staging words (128 B) + 1 result word (64 B aligned) = 192 B (ptxas says 192)
    assert reduction_shared_bytes(1, 1024, A100) == 192
    assert reduction_shared_bytes(2, 512, A100) == 128 + 64   # 32 staging words + 2 result words
    assert reduction_shared_bytes(4, 32, A100) == 64          # one warp: shuffles, and the 4 results


def test_few_long_rows_choose_a_block_reduction():
    expr = _expr("reduce_sum", {"M": 100, "N": 3001})[1][0]
    best = construct(expr, A100, topk=3).programs[0]
    assert best.gpu.reduction.threads >= 256 and best.packed == ()
    assert best.grid == {"m": 100 // best.tiles[1]["m"]}
    # many short rows keep one thread a row
    expr = _expr("reduce_sum", {"M": 4096, "N": 7})[1][0]
    assert construct(expr, A100, topk=1).programs[0].gpu.kind is GpuKind.TILES


CASES = [("reduce_sum", {"M": 100, "N": 3001}, {}), ("reduce_sum", {"M": 37, "N": 515}, {}),
         ("matmul", {"M": 1, "N": 250, "K": 2048}, {"layout": "nt"})]


@needs_opencl
@pytest.mark.parametrize("op,shape,options", CASES)
def test_opencl_twin_of_every_block_reduction_plan_matches_numpy(op, shape, options):
    spec, (expr, func) = _expr(op, shape, **options)
    plans = [p for p in construct(expr, A100, topk=20).programs if p.gpu.kind is GpuKind.BLOCK_REDUCTION]
    assert plans
    arrays = spec.inputs(shape, "float32", np.random.default_rng(2))
    ref = spec.reference(arrays, shape)
    names = [str(p.name) for p in func.params]
    for p in plans[:6]:
        twin = opencl.opencl_program(schedule_cuda(func, expr, p, A100).mod)
        got = opencl.run(twin, dict(zip(names, arrays + [np.full(ref.shape, np.nan, ref.dtype)])), (names[-1],))
        np.testing.assert_allclose(got[names[-1]], ref, rtol=1e-4, atol=1e-4, err_msg=str(p.tiles[1]))


@needs_cuda
@pytest.mark.parametrize("gpu", GPUS)
def test_block_reductions_build_within_the_limits(gpu):
    dev = load_device(gpu, calibrated=False)
    spec, (expr, func) = _expr("reduce_sum", {"M": 100, "N": 3001})
    p = construct(expr, dev, topk=1).programs[0]
    assert p.gpu.kind is GpuKind.BLOCK_REDUCTION
    build = build_cuda(func, expr, p, dev)
    assert not build.problems and build.cubin[:4] == b"\x7fELF"
    assert "__shfl_down_sync" in build.source  # the combine within a warp is by shuffles
    main = build.main()
    assert not main.spills and main.registers <= dev.gpu.max_registers_per_thread


OCLGRIND_SCRIPT = textwrap.dedent("""
    import numpy as np
    from roller import ops
    from roller.builder.api import analyze
    from roller.targets.cuda import opencl
    from roller.targets.cuda.schedule import schedule_cuda
    from roller.device import load_device
    from roller.targets.cuda.construct import _program
    from roller.targets.cuda.reduce import estimate_block_reduction
    from roller.plan.gpuplan import BlockReduction
    dev = load_device("a100", calibrated=False)
    spec = ops.get_op("reduce_sum")
    shape = {"M": 6, "N": 300}
    expr, func = analyze(spec.make(shape, "float32"))
    thread, block = {"m": 1, "n": 1}, {"m": 2, "n": 128}  # 2 rows a block, 4 warps a row: shuffles + staging
    red = BlockReduction(threads=128, rows=2)
    p = _program(expr, [thread, block], dev, 0.0, estimate_block_reduction(expr, thread, block, red, dev), red)
    twin = opencl.opencl_program(schedule_cuda(func, expr, p, dev).mod)
    arrays = spec.inputs(shape, "float32", np.random.default_rng(3))
    got = opencl.run(twin, {"A": arrays[0], "B": np.zeros(6, "float32")}, ("B",))["B"]
    assert np.allclose(got, spec.reference(arrays, shape), rtol=1e-4, atol=1e-4), got
    print("ok")
""")


@needs_opencl
@needs_oclgrind
def test_block_reduction_is_race_free_under_oclgrind():
    proc = subprocess.run(["oclgrind", "--data-races", sys.executable, "-c", OCLGRIND_SCRIPT], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]
    assert "data race" not in proc.stderr.lower(), proc.stderr[-3000:]
