"""The GPU specs and the GPU policy (no GPU, no compiler): limits, occupancy, waves, alignment, bank padding."""
import copy

import pytest
import yaml

from roller.device import device_from_dict, load_device, shipped_specs
from roller.errors import DeviceSpecError

GPUS = ("v100", "a100", "h100", "rtx4090")
ARCH = {"v100": "sm_70", "a100": "sm_80", "h100": "sm_90", "rtx4090": "sm_89"}


def gpu_spec(name="a100"):
    return yaml.safe_load(shipped_specs()[name].read_text())


@pytest.mark.parametrize("name", GPUS)
def test_gpu_specs_load(name):
    dev = load_device(name, calibrated=False)
    assert dev.kind == "gpu" and dev.target["arch"] == ARCH[name]
    assert dev.units.warp_threads == 32 and dev.gpu.max_threads_per_block == 1024
    assert [lv.storage_scope for lv in dev.private_levels] == ["local", "shared"]
    smem = dev.private_levels[1]
    assert (smem.banks, smem.bank_bytes) == (32, 4)
    assert dev.gpu.shared_per_block <= dev.gpu.shared_per_block_optin <= dev.gpu.shared_per_sm
    assert dev.levels[-1].name == "DRAM" and dev.levels[-1].shared
    # the fp32 peak is the SMs' lanes at the boost clock: 64 lanes on sm_70 / sm_80, 128 on sm_89 / sm_90
    lanes = 64 if name in ("v100", "a100") else 128
    assert dev.units.peak("float32") == pytest.approx(lanes * 2 * dev.units.clock_ghz, rel=0.01)
    assert dev.fingerprint and dev.fingerprint != load_device("x86-avx512", calibrated=False).fingerprint


def test_a100_figures_from_the_datasheet():
    dev = load_device("a100", calibrated=False)
    assert dev.units.count == 108
    assert dev.units.peak("float32") * 108 == pytest.approx(19500, rel=0.001)
    assert dev.level("DRAM").total_bandwidth_gbps == 2039.0
    assert dev.gpu.registers_per_sm == 65536 and dev.gpu.max_threads_per_sm == 2048
    assert dev.gpu.shared_per_block_optin == 163 * 1024
    assert dev.units.tensor_peak_gflops["float16"] * 108 == pytest.approx(312000, rel=0.001)


def test_rtx4090_has_fewer_resident_threads():
    dev = load_device("rtx4090", calibrated=False)
    assert dev.gpu.max_threads_per_sm == 1536 and dev.gpu.max_blocks_per_sm == 24
    assert dev.gpu.max_warps_per_sm(32) == 48


def bad_gpu(mutate):
    spec = copy.deepcopy(gpu_spec())
    mutate(spec)
    with pytest.raises(DeviceSpecError) as err:
        device_from_dict(spec, "gpu.yaml")
    return str(err.value)


@pytest.mark.parametrize("mutate,needles", [
    (lambda s: s.pop("gpu"), ["gpu.yaml", "gpu", "missing"]),
    (lambda s: s["gpu"].pop("registers_per_sm"), ["gpu.registers_per_sm", "missing"]),
    (lambda s: s["gpu"].update(max_threads_per_block=1000), ["max_threads_per_block", "multiple of the warp"]),
    (lambda s: s["gpu"].update(shared_per_block="lots"), ["gpu.shared_per_block", "'lots'"]),
    (lambda s: s["gpu"].update(shared_per_block_optin="300K"), ["shared_per_block_optin <= shared_per_sm"]),
    (lambda s: s["gpu"].update(max_threads_per_sm=512), ["max_threads_per_sm is below"]),
    (lambda s: s["gpu"].update(warps=4), ["unknown field", "warps"]),
    (lambda s: s["units"].pop("warp_threads") and s["units"].update(vector_bytes=64), ["warp_threads", "warp size"]),
    (lambda s: s["levels"][1].update(storage_scope="global"), ["storage_scope: shared", "smem (global)"]),
    (lambda s: s["levels"][1].update(capacity="200K"), ["smem", "shared_per_block_optin"]),
    (lambda s: s.update(kind="cpu", units={**{k: v for k, v in s["units"].items() if k != "warp_threads"},
                                           "vector_bytes": 64}), ["gpu", "only a spec of kind gpu"]),
])
def test_malformed_gpu_specs_name_the_field(mutate, needles):
    msg = bad_gpu(mutate)
    for n in needles:
        assert n in msg, (n, msg)
