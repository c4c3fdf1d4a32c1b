"""The GPU specs and the GPU policy (no GPU, no compiler): limits, occupancy, waves, alignment, bank padding."""
import pytest
import yaml

from policy_exprs import spec_error
from roller.device.load import load_device
from roller.device.spec import shipped_specs
from roller.targets.cuda.reduce import reduction_shared_bytes

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




@pytest.mark.parametrize("mutate,needles", [
    (lambda s: s.pop("gpu"), ["bad.yaml", "gpu", "missing"]),
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
    msg = spec_error(mutate, gpu_spec())
    for n in needles:
        assert n in msg, (n, msg)


# ---------------------------------------------------------------------------------------------
# The GPU level rules, by hand.

from policy_exprs import conv2d_nhwc, elementwise, matmul, reduce_rows  # noqa: E402
from roller.targets.cuda import cost as gpu_model, rules as gpu_rules  # noqa: E402
from roller.targets import construct  # noqa: E402
from roller.targets.cuda.rules import GpuLevelRules, Occupancy, occupancy  # noqa: E402
from roller.plan.rtile import aligning_tensors  # noqa: E402
from roller.plan.gpuplan import GpuKind  # noqa: E402


@pytest.fixture(scope="module")
def a100():
    return load_device("a100", calibrated=False)


@pytest.mark.parametrize("threads,regs,smem,expected", [
    # 256 threads x 64 registers: 2048 registers a warp, 32 warps' worth per SM, 8 warps a block -> 4
    (256, 64, 16 * 1024, Occupancy(4, 32, "registers")),
    # 48 KiB a block: 164 KiB / 48 KiB -> 3 blocks (registers would allow 16)
    (128, 32, 48 * 1024, Occupancy(3, 12, "shared")),
    # 64 threads, 16 registers, 1 KiB: 32 blocks a SM is the cap (threads would allow 32 too: the cap names it)
    (64, 16, 1024, Occupancy(32, 64, "blocks")),
    # 33 registers round up to 1280 per warp (units of 256): 65536 // 1280 = 51 warps, 51 // 16 = 3 blocks
    (512, 33, 1024, Occupancy(3, 48, "registers")),
    (1056, 32, 0, Occupancy(0, 0, "threads")),
    (128, 256, 0, Occupancy(0, 0, "registers")),
    (128, 32, 164 * 1024, Occupancy(0, 0, "shared")),
])
def test_occupancy_by_hand(a100, threads, regs, smem, expected):
    assert occupancy(a100, threads, regs, smem) == expected


def test_occupancy_follows_the_spec():
    rtx = load_device("rtx4090", calibrated=False)
    # 1024 threads = 32 warps; 48 resident warps allow one such block, where an A100 holds two
    assert occupancy(rtx, 1024, 32, 0) == Occupancy(1, 32, "threads")
    assert occupancy(load_device("a100", calibrated=False), 1024, 32, 0) == Occupancy(2, 64, "registers")


def test_waves(a100):
    assert gpu_rules.waves(1024, a100, 2) == 5      # 216 blocks a wave
    assert gpu_rules.waves(216, a100, 2) == 1
    assert gpu_rules.waves(217, a100, 2) == 2
    assert gpu_rules.waves(10, a100, 0) == 1        # no division by zero for a block that does not fit


def test_bank_padding_enters_the_shared_footprint(a100):
    e = matmul(4096, 4096, 4096)
    rules = GpuLevelRules.of(a100, 1, e)
    a, b, c = e.inputs[0], e.inputs[1], e.output
    block = {"i": 128, "j": 128, "k": 8}
    # rows of 8 and 128 words put a column in 4 and 1 of 32 banks: one word of padding
    assert rules.storage_pad_bytes(32) == 4 and rules.storage_pad_bytes(512) == 4
    assert rules.storage_pad_bytes(36) == 0                  # 9 words: odd stride, all banks
    # A's rows run along k (reduced): the warp's threads (differing in i, j) read it down a column: padded.
    # B's rows run along j: read along the row, not padded
    assert rules.column_read == {"A"}
    assert gpu_rules.bank_pad_elements(a, block, rules) == 1 and gpu_rules.bank_pad_elements(b, block, rules) == 0
    assert rules.row_bytes(a, 8) == 36 and rules.row_bytes(b, 128) == 512
    assert rules.row_bytes(c, 128) == 0                      # the output stays in registers
    assert rules.row_bytes(c, 100, moved=True) == 416        # ... and is written in whole 32-B sectors
    assert rules.row_bytes(a, 9, moved=True) == 64           # 36 B read as two sectors
    assert gpu_rules.shared_bytes(e, block, a100) == 128 * 36 + 8 * 512
    # a buffer starts 64-B aligned: A's 8 x 9 floats end at 288 B, B's tile starts at 320
    assert gpu_rules.shared_bytes(e, {"i": 8, "j": 128, "k": 8}, a100) == 320 + 8 * 512
    # a convolution's input rows run along c (reduced): padded; the weight's along k (spatial): not
    conv = conv2d_nhwc(1, 28, 28, 64, 64, 3, 3)
    assert GpuLevelRules.of(a100, 1, conv).column_read == {"X"}


def test_thread_level_holds_elements(a100):
    e = matmul(64, 64, 64)
    rules = GpuLevelRules.of(a100, 0, e)
    assert rules.lanes == 1 and rules.vector_axis is None
    assert rules.row_bytes(e.inputs[0], 3) == 12 and rules.row_bytes(e.inputs[0], 3, moved=True) == 12
    # an 8 x 8 accumulator tile, 8 + 8 operands for a few steps in flight, and the fixed overhead
    assert gpu_rules.thread_registers(e, {"i": 8, "j": 8, "k": 1}) == (
        64 + 16 * gpu_rules.FRAGMENT_STEPS + gpu_rules.REGISTER_OVERHEAD)


def test_copy_lanes_keep_vector_accesses_aligned():
    e = matmul(4096, 4096, 4096)
    b = e.inputs[1]
    assert gpu_rules.copy_lanes(b, {"i": 1, "j": 128, "k": 8}) == 4
    assert gpu_rules.copy_lanes(b, {"i": 1, "j": 128, "k": 8}, pad=1) == 1   # padded rows break 16-B alignment
    assert gpu_rules.copy_lanes(b, {"i": 1, "j": 6, "k": 8}) == 2
    odd = matmul(64, 4095, 64).inputs[1]                                    # a row of 4095: scalar loads
    assert gpu_rules.copy_lanes(odd, {"i": 1, "j": 128, "k": 8}) == 1
    x = conv2d_nhwc(1, 8, 8, 16, 16, 3, 3).inputs[0]                         # the window's innermost is c
    assert gpu_rules.copy_lanes(x, {"n": 1, "h": 2, "w": 2, "k": 1, "r": 3, "s": 3, "c": 16}) == 4


CASES = {
    "matmul 4096": matmul(4096, 4096, 4096),
    "matmul odd": matmul(127, 251, 509),
    "gemv": matmul(1, 4096, 4096),
    "conv": conv2d_nhwc(1, 28, 28, 64, 64, 3, 3),
    "rows": reduce_rows(100, 3001),
    "add": elementwise(997, 1009),
}


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("case", CASES)
def test_gpu_plans_follow_the_rules(gpu, case):
    dev = load_device(gpu, calibrated=False)
    e = CASES[case]
    plans = construct(e, dev, topk=10).programs
    assert plans
    sector = dev.private_levels[1].transaction_bytes // 4
    for p in plans:
        thread, block = p.tiles
        assert p.levels == ("reg", "smem") and p.vector_axis is None
        assert p.problem([a.name for a in e.axes]) is None                       # blocks nest thread tiles
        if p.gpu.kind is GpuKind.BLOCK_REDUCTION:  # a block-level reduction (tests/test_gpu_reduce.py has its rules)
            r = p.gpu.reduction.threads
            rows = gpu_rules.threads_per_block(e, thread, block)
            assert rows == p.gpu.reduction.rows and p.gpu.tensor_core is None
            assert p.gpu.threads == rows * r and r % 32 == 0 and rows * r <= 1024
            assert p.gpu.model.shared_bytes == reduction_shared_bytes(rows, r, dev)
            assert p.packed == () and p.storage_pad == {} and case == "rows"
            continue
        assert p.gpu.kind is GpuKind.TILES and p.gpu.reduction is None and p.gpu.tensor_core is None
        threads = gpu_rules.threads_per_block(e, thread, block)
        assert threads == p.gpu.threads and threads % 32 == 0 and threads <= 1024  # whole warps
        assert all(thread[a.name] == 1 for a in e.reduce_axes)                  # a thread's reduction is serial
        for t in aligning_tensors(e):  # contiguous extents of the block in whole sectors, or the whole extent
            for a in t.innermost_axes():
                assert block[a] % sector == 0 or block[a] >= e.axis(a).extent, (a, block)
        assert p.gpu.model.shared_bytes == gpu_rules.shared_bytes(e, block, dev) <= dev.private_levels[1].usable_bytes
        occ = occupancy(dev, threads, p.gpu.model.registers, p.gpu.model.shared_bytes)
        assert occ.blocks_per_sm == p.gpu.model.blocks_per_sm >= 1
        blocks = 1
        for a in e.spatial_axes:
            blocks *= p.grid[a.name]
        assert p.waves == gpu_rules.waves(blocks, dev, occ.blocks_per_sm)
        assert p.predicated == tuple(a.name for a in e.axes if a.extent % block[a.name])
        assert p.packed == tuple(t.name for t in e.inputs)
        assert p.storage_pad == {t.name: n for t in e.inputs
                                 if (n := gpu_rules.bank_pad_elements(t, block, GpuLevelRules.of(dev, 1, e)))}


def test_the_model_counts_waves_and_latency(a100):
    thread, block = {"i": 8, "j": 8, "k": 1}, {"i": 128, "j": 128, "k": 8}
    one = gpu_model.estimate(matmul(128 * 108, 128, 1024), [thread, block], a100)
    two = gpu_model.estimate(matmul(128 * 216, 128, 1024), [thread, block], a100)
    assert one.estimate.tiles == 108 and two.estimate.tiles == 216
    # 256 threads x 104 registers: 3328 a warp, 19 warps' worth per SM: 2 blocks of 8 warps
    assert one.registers == 104 and one.occupancy == Occupancy(2, 16, "registers") and one.estimate.waves == 1
    # twice the blocks: the busiest SM runs two, twice the time (but the launch)
    launch = a100.model.launch_seconds
    assert two.estimate.seconds - launch == pytest.approx(2 * (one.estimate.seconds - launch), rel=1e-6)
    # 256 threads = 8 warps: enough to hide latency; a 32-thread block is not, and runs at 1/8 of the peak
    assert gpu_model.latency_efficiency(8, a100) == 1.0 and gpu_model.latency_efficiency(1, a100) == 1 / 8
    # compute per block at the SM's fp32 peak: 128 x 128 x 1024 x 2 flops
    assert one.estimate.compute_seconds == pytest.approx(128 * 128 * 1024 * 2 / (a100.units.peak("float32") * 1e9))


def test_gpu_planning_needs_no_compiler():
    import subprocess
    import sys
    code = ("import sys; sys.path.insert(0, 'tests'); from policy_exprs import matmul; "
            "from roller.device import load_device; from roller.targets import construct; "
            "assert construct(matmul(512, 512, 512), load_device('h100', calibrated=False)).programs; "
            "assert 'tvm' not in sys.modules, 'the GPU policy imported TVM'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_thread_tiles_interleave_along_the_innermost_axes():
    e = conv2d_nhwc(2, 28, 28, 64, 64, 3, 3)
    # spatial axes n, h, w, k: the last three with a tile over 1 get virtual threads
    assert gpu_rules.interleaved_axes(e, {"n": 2, "h": 2, "w": 2, "k": 4, "r": 1, "s": 1, "c": 1}) == ("h", "w", "k")
    assert gpu_rules.interleaved_axes(e, {"n": 1, "h": 1, "w": 4, "k": 1, "r": 1, "s": 1, "c": 1}) == ("w",)
    assert gpu_rules.interleaved_axes(matmul(64, 64, 64), {"i": 1, "j": 1, "k": 1}) == ()


def test_small_operators_spread_over_the_sms(a100):
    # a 1x1 convolution on 7x7 pixels: growth along the 7-wide axes stopped at 56 threads, no warp divided it;
    # the warp seeds give blocks of whole warps that still cover every SM
    e = conv2d_nhwc(1, 7, 7, 960, 160, 1, 1)
    p = construct(e, a100, topk=1).programs[0]
    blocks = p.grid["n"] * p.grid["h"] * p.grid["w"] * p.grid["k"]
    assert p.gpu.threads % 32 == 0 and blocks >= a100.units.count, (p.tiles, p.grid)
    assert p.units == a100.units.count


def test_devices_lists_the_gpu_specs(capsys):
    import json

    from roller.cli import main
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    for name in GPUS:
        assert f"{name}: NVIDIA" in out
    assert "GPU limits: 1024 threads per block, 1536 threads and 24 blocks per SM" in out  # the RTX 4090
    assert "1020 B per thread" in out and "48 KiB per block" in out
    assert main(["devices", "--json"]) == 0
    rows = {d["name"]: d for d in json.loads(capsys.readouterr().out)}
    assert rows["h100"]["gpu"]["shared_per_block_optin"] == 227 * 1024 and "gpu" not in rows["x86-avx512"]
