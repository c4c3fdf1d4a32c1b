"""GPU calibration without a GPU: the microbenchmark kernels compile to cubins for every shipped GPU spec
(NVRTC + ptxas), their OpenCL twins give numpy's answers on the CPU (PoCL) through the same measuring code
that runs on a GPU, and ``roller calibrate --device a100`` says in one line that there is no GPU here."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tvm

from gpu_marks import GPUS, needs_cuda, needs_oclgrind, needs_opencl
from roller.targets.cuda import microbench as gpu
from roller.targets.cuda import toolchain as cudatools
from roller.device.calibration import load_calibration, save_calibration, validate_calibration
from roller.device.load import load_device
from roller.errors import CalibrationError
from roller.targets.cuda.runtime import OpenCLRuntime, cuda_missing

pytestmark = pytest.mark.build



def _cuda_source(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch}, host={"kind": "llvm"})
    return tvm.compile(tvm.IRModule({"main": func}), target).mod.imports[0].inspect_source("")


def _kernels(plan):
    """(name, PrimFunc, a PTX instruction it must hold, as a regex) for every kernel of a plan."""
    out = []
    for p in plan["peak"]:
        op = r"fma\.rn\.f16" if p["dtype"] == "float16" else r"fma\.rn(\.ftz)?\.f32"
        out.append((f"fma {p['dtype']}", gpu.fma_kernel(p["dtype"], p["blocks"], p["threads"], p["chains"],
                                                        p["iters"]), op))
    for role, per_block in (("dram", False), ("l2", True)):
        q = plan[role]
        out.append((role, gpu.read_kernel(q["n"], q["blocks"], q["threads"], q["lanes"], per_block), r"ld\.global(\.nc)?\.v4\.f32"))
    q = plan["smem"]
    out.append(("smem", gpu.smem_kernel(q["blocks"], q["threads"], q["reps"]), r"ld\.shared\.f32"))
    r = plan["small"]["rows"][0]
    out.append(("rows", gpu.rows_kernel(r["rows"], r["row"], r["stride"], plan["small"]["blocks"],
                                        plan["small"]["threads"]), r"ld\.global(\.nc)?\.f32"))
    return out


@needs_cuda
@pytest.mark.parametrize("name", GPUS)
def test_microbench_kernels_compile_to_cubins(name):
    dev = load_device(name, calibrated=False)
    plan = gpu.make_gpu_plan(dev)  # the sizes a real calibration of this GPU uses
    arch = dev.target["arch"]
    for what, func, instruction in _kernels(plan):
        ptx = cudatools.to_ptx(_cuda_source(func, arch), arch)
        assert re.search(instruction, ptx), f"{what}: no {instruction} in the PTX"
        cubin, res = cudatools.assemble(ptx, arch)
        assert cubin[:4] == b"\x7fELF"
        assert res and not any(r.spills for r in res), f"{what}: {res}"
        if what.startswith("fma"):
            # the chains survive as FMAs: CHAINS of them per step of the loop (unrolled by NVRTC or not)
            assert len(re.findall(r"\bfma\.rn", ptx)) >= gpu.CHAINS, what
        if what == "smem":
            assert res[0].shared_bytes == gpu.SMEM_FLOATS * 4


def test_plan_sizes_follow_the_spec():
    dev = load_device("a100", calibrated=False)
    plan = gpu.make_gpu_plan(dev)
    assert plan["levels"] == {"smem": "smem", "l2": "L2", "dram": "DRAM"}
    q = plan["dram"]
    assert q["blocks"] == 108 * 8  # 2048 threads an SM / 256 a block, on every SM
    assert q["n"] * 4 >= 4 * dev.level("L2").capacity_bytes  # DRAM's buffer is well over L2
    assert plan["l2"]["n"] * 4 <= dev.level("L2").capacity_bytes // 4
    assert plan["l2"]["n"] * 4 > dev.gpu.l1_and_shared_per_sm  # and over an SM's L1
    with pytest.raises(CalibrationError, match="plans GPUs only"):
        gpu.make_gpu_plan(load_device("x86-avx512", calibrated=False))


@needs_opencl
def test_measure_on_the_opencl_twin_checks_every_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLER_CACHE_DIR", str(tmp_path))
    dev = load_device("a100", calibrated=False)
    plan = gpu.make_gpu_plan(dev, scale=1e-3)
    seen = []
    raw = gpu.measure(plan, OpenCLRuntime(), repeat=2, progress=seen.append)
    # every kernel ran and matched numpy (measure raises otherwise); float16 needs cl_khr_fp16, which PoCL lacks
    assert "peak float32" in seen and "shared-memory bandwidth" in seen and len(raw["small"]) == len(gpu.SMALL_ROW_BYTES)
    assert set(raw["bandwidth"]) == {"dram", "l2", "smem"}
    assert set(raw["peak"]) | set(raw["skipped"]) == set(gpu.PEAK_DTYPES)
    cal = gpu.summarize_gpu(dev, plan, raw, 1.0)
    assert cal["runtime"] == "opencl"
    assert validate_calibration(cal, dev) is None
    # the same file and cache folder as a CPU calibration; loading it replaces the datasheet figures
    path = save_calibration(dev, cal)
    assert path.parent == tmp_path / "calibration"
    assert load_calibration(dev)["bandwidth_gbps"]["DRAM"]["total"] == raw["bandwidth"]["dram"]
    assert dev.with_calibration(cal).level("smem").bandwidth_gbps == pytest.approx(raw["bandwidth"]["smem"] / 108)


class _Corrupting(OpenCLRuntime):
    """Returns every output off by one: a kernel that computes the wrong thing."""

    def run(self, kernel, arrays, outputs):
        return {k: v + 1 for k, v in super().run(kernel, arrays, outputs).items()}


@needs_opencl
def test_a_wrong_kernel_result_stops_the_calibration():
    plan = gpu.make_gpu_plan(load_device("a100", calibrated=False), scale=1e-3)
    with pytest.raises(CalibrationError, match="differ from numpy"):
        gpu.measure(plan, _Corrupting(), repeat=1)


@pytest.mark.skipif(cuda_missing() is None, reason="a CUDA GPU is present: this checks the machine without one")
def test_calibrate_a_gpu_without_one_fails_in_one_line(tmp_path):
    env = dict(os.environ, **{"ROLLER_CACHE_DIR": str(tmp_path)})
    proc = subprocess.run([sys.executable, "-m", "roller.cli", "calibrate", "--device", "a100"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA GPU" in lines[0] and "a100" in lines[0], proc.stderr
    assert not (tmp_path / "calibration").exists() or not any((tmp_path / "calibration").iterdir())


def test_fma_reference_is_the_chain():
    x = np.array([[1.0, -1.0]], "float32")
    np.testing.assert_allclose(gpu.fma_reference(x, np.array([0.5, 0.25]), 2), [[0.625, 0.125]])  # 1 -> 0.75 -> 0.625; -1 -> -0.25 -> 0.125


SMEM_SCRIPT = """
import numpy as np, tvm
from gpu_marks import GPUS, needs_cuda, needs_oclgrind, needs_opencl
from roller.targets.cuda import microbench as gpu
from roller.targets.cuda import opencl
prog = opencl.opencl_program(tvm.IRModule({"main": gpu.smem_kernel(2, 64, 40, size=256)}))
a = np.arange(256, dtype="float32")
got = opencl.run(prog, {"A": a, "O": np.zeros(128, "float32")}, ("O",))["O"]
assert np.allclose(got, gpu.smem_reference(a, 2, 64, 40)), got
print("ok")
"""


@needs_opencl
@needs_oclgrind
def test_shared_memory_kernel_is_race_free_under_oclgrind():
    # the kernel's fill and reads of shared memory are separated by the barrier TVM's ThreadSync inserts
    src = _cuda_source(gpu.smem_kernel(2, 64, 40, size=256), "sm_80")
    assert "__syncthreads()" in src
    proc = subprocess.run(["oclgrind", "--data-races", sys.executable, "-c", SMEM_SCRIPT], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]
    assert "data race" not in proc.stderr.lower(), proc.stderr[-3000:]
