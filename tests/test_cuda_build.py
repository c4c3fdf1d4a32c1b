"""roller build on a GPU spec without a GPU: candidates compiled offline, checked against the device's limits,
reported beside the model, the ranking said to be the model's alone; clear errors."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from roller.targets.cuda import toolchain as cudatools
from roller.targets.cuda import opencl
from roller.targets.cuda.schedule import resource_problems
from roller.targets.cuda.toolchain import KernelResources
from roller.device.load import load_device
from roller.errors import ToolchainError

no_cuda = cudatools.missing()
needs_cuda = pytest.mark.skipif(no_cuda is not None, reason=f"CUDA toolchain: {no_cuda}")


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "roller.cli", *args], capture_output=True, text=True, cwd=cwd)


@pytest.mark.build
@needs_cuda
def test_build_on_a_gpu_spec_writes_cuda_and_reports_ptxas(tmp_path):
    proc = _cli("build", "matmul", "--shape", "M=128,N=96,K=64", "--device", "a100", "--topk", "3", "--json",
                "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["device"] == "a100" and r["arch"] == "sm_80" and r["timed"] is False
    assert "nothing was timed" in r["ranking"] and r["kernel_seconds"] is None
    if opencl.missing() is None:
        assert r["verified"] is True and "OpenCL twin" in r["verified_by"]
    assert 0 < r["peak_fraction"] <= 1
    chosen = r["candidates"][r["chosen"]]
    assert not chosen["dropped"] and not chosen["problems"]
    assert all(c["dropped"] for c in r["candidates"][:r["chosen"]])  # the first that fits is chosen
    for c in r["candidates"]:
        if c["ptxas"] is not None:
            assert c["ptxas"]["shared_bytes"] == c["model"]["shared_bytes"]
            assert c["ptxas"]["registers"] > 0
        assert c["dropped"] == bool(c["problems"] or c["error"])
    assert (tmp_path / "matmul.cubin").read_bytes()[:4] == b"\x7fELF"
    assert "__global__" in (tmp_path / "matmul.cu").read_text()
    assert ".target sm_80" in (tmp_path / "matmul.ptx").read_text()
    saved = json.loads((tmp_path / "matmul.json").read_text())
    assert saved["program"]["gpu"]["threads"] == chosen["model"]["threads"]
    assert {Path(v).name for v in saved["files"].values()} == {"matmul.cu", "matmul.ptx", "matmul.cubin", "matmul.json"}


@pytest.mark.build
@needs_cuda
def test_build_text_report_names_model_and_ptxas():
    proc = _cli("build", "reduce_sum", "--shape", "M=64,N=100", "--device", "rtx4090", "--topk", "2")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "sm_89" in out and "regs model/ptxas" in out and "smem model/ptxas" in out
    assert "no GPU was used and nothing was timed" in out


def test_plot_is_refused_on_a_gpu_spec(tmp_path):
    proc = _cli("build", "matmul", "--shape", "M=64,N=64,K=64", "--device", "a100", "--plot", str(tmp_path / "r.png"))
    assert proc.returncode == 2 and "nothing is timed" in proc.stderr and proc.stderr.count("\n") == 1


def test_missing_toolchain_is_one_clear_error(monkeypatch):
    from roller.builder import api
    monkeypatch.setattr(cudatools, "missing", lambda: "the NVIDIA CUDA wheels are not installed; " + cudatools.INSTALL_HINT)
    with pytest.raises(ToolchainError, match=r'pip install -e "\.\[cuda\]"'):
        api.build_op("matmul", {"M": 64, "N": 64, "K": 64}, device="a100", topk=1)


def _res(**kw):
    base = dict(kernel="main_kernel", registers=32, spill_store_bytes=0, spill_load_bytes=0, stack_bytes=0,
                shared_bytes=8192, barriers=1)
    return KernelResources(**{**base, **kw})


def test_resource_problems_by_hand():
    from roller.plan.gpuplan import BlockModel, GpuKind, GpuPlan
    from roller.plan.rprogram import RProgram
    dev = load_device("a100", calibrated=False)
    gpu = GpuPlan(kind=GpuKind.TILES, threads=256, model=BlockModel(registers=32, shared_bytes=8192, blocks_per_sm=4,
                                                                    warps_per_sm=32, limited_by="threads",
                                                                    reduction_steps=1))
    p = RProgram(levels=("reg", "smem"), tiles=({}, {}), grid={"m": 108 * 8}, units=108, waves=2, gpu=gpu)
    # 256 threads x 32 registers and 8 KiB: 8 blocks fit, the model assumed 4: fine
    assert resource_problems(dev, p, [_res()], True) == []
    # 64 registers: 65536 / (64 x 256) = 4 blocks: still what the model assumed
    assert resource_problems(dev, p, [_res(registers=64)], True) == []
    # 72 registers: 3 blocks, below the model's 4
    (msg,) = resource_problems(dev, p, [_res(registers=72)], True)
    assert "3 blocks per SM" in msg and "assumed 4" in msg and "registers" in msg
    # an SM that gets 2 blocks runs both at once with 3 blocks' room as with 4: the model's count holds
    few = RProgram(levels=("reg", "smem"), tiles=({}, {}), grid={"m": 108 * 2}, units=108, waves=1, gpu=gpu)
    assert resource_problems(dev, few, [_res(registers=72)], True) == []
    assert any("spills 8 B stored" in m for m in resource_problems(dev, p, [_res(spill_store_bytes=8)], True))
    assert any("verify_gpu_code" in m for m in resource_problems(dev, p, [_res()], False))


@pytest.mark.build
@needs_cuda
def test_python_build_on_a_gpu_spec():
    import numpy as np

    import roller
    from roller.tir import ops
    a = (np.arange(32 * 40).reshape(32, 40) % 7 / 8).astype("float32")
    b = (np.arange(40 * 48).reshape(40, 48) % 5 / 4).astype("float32")
    r = roller.build(ops.matmul(32, 48, 40), device="a100", topk=2, inputs=[a, b], reference=a @ b)
    assert r.report["timed"] is False and r.build.cubin[:4] == b"\x7fELF"
    if opencl.missing() is None:
        assert r.report["verified"] is True
    bare = roller.build(ops.matmul(32, 48, 40), device="a100", topk=1)
    assert bare.report["verified"] is None and "no inputs" in bare.report["verified_by"]
    if opencl.missing() is not None:
        pytest.skip(f"OpenCL: {opencl.missing()}")
    with pytest.raises(roller.errors.BuildError, match="OpenCL twin does not match"):  # a wrong reference is caught
        roller.build(ops.matmul(32, 48, 40), device="a100", topk=1, inputs=[a, b], reference=a @ b + 1)


@pytest.mark.build
@needs_cuda
@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_other_dtypes_build_and_say_how_they_were_checked(dtype):
    from roller.builder import api
    r = api.build_op("matmul", {"M": 64, "N": 64, "K": 64}, dtype, device="a100", topk=2)
    assert r.build.cubin[:4] == b"\x7fELF" and r.report["out_dtype"] == ("int32" if dtype == "int8" else dtype)
    if r.program.gpu.kind.value == "tensor_core":  # fp16 on sm_80: tensor cores, which have no OpenCL twin
        reason = "no OpenCL twin"
    else:
        reason = opencl.missing() or opencl.unsupported([dtype, r.report["out_dtype"]])
    if reason:
        assert r.report["verified"] is None and reason in r.report["verified_by"]
    else:
        assert r.report["verified"] is True


SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def test_gpu_suite_script_without_a_gpu_predicts_and_exits_0():
    import os
    env = dict(os.environ, PYTHONPATH=str(SCRIPTS.parent))
    proc = subprocess.run([sys.executable, str(SCRIPTS / "gpu_suite.py"), "--cases", "^(matmul_1000|rowsum_4096x7)$"],
                          capture_output=True, text=True, env=env, cwd=SCRIPTS)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "NO GPU on this machine: predictions only, nothing is measured" in lines[0]
    rows = [ln for ln in lines if ln.startswith(("matmul_1000", "rowsum_4096x7"))]
    assert len(rows) == 2 and all(ln.split()[-2:] == ["-", "-"] for ln in rows)  # nothing measured


@pytest.mark.build
@needs_cuda
def test_dlight_comparison_script():
    import os
    env = dict(os.environ, PYTHONPATH=str(SCRIPTS.parent))
    proc = subprocess.run([sys.executable, str(SCRIPTS / "gpu_matmul_vs_dlight.py"), "--shape", "256,256,256",
                           "--topk", "2"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    roller_line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("roller"))
    dlight_line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("dlight"))
    for line in (roller_line, dlight_line):
        assert "ptxas:" in line and "registers" in line and "of peak" in line
    assert "thread tile 4x4, block tile 32x64x16" in dlight_line  # dlight's CUDA config for matmul
