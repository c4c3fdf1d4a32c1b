"""roller.targets.cpu.microbench: the plan (pure Python) and the calibration kernels (built with TVM, checked against numpy)."""
import dataclasses

import numpy as np
import pytest

from roller.targets.cpu.microbench import kernels as K
from roller.targets.cpu.microbench import probes as P
from roller.targets.cpu.microbench.plan import level_working_sets, make_plan, peak_tile, probe_plan, sweep_sizes
from roller.targets.cpu.microbench.runner import device_from_json, rate_stats
from roller.device.load import load_device
from roller.errors import CalibrationError

MIB = 1 << 20


@pytest.fixture(scope="module")
def spec():
    return load_device("x86-avx512", calibrated=False)


def test_working_sets_sit_inside_each_level(spec):
    for units in (1, 2):
        ws, warns = level_working_sets(spec, units, cap=2 << 30)
        assert list(ws) == ["L1", "L2", "L3", "DRAM"]  # registers are not swept
        assert not warns
        l1, l2, l3 = (spec.level(n).capacity_bytes for n in ("L1", "L2", "L3"))
        assert 2048 * units < ws["L1"] <= l1 * units // 2
        assert l1 * units < ws["L2"] <= l2 * units // 2
        assert l2 * units < ws["L3"] <= l3 // 4
        assert ws["DRAM"] >= 4 * l3
        assert all(v % (units * K.ROW * 4) == 0 for v in ws.values())


def test_working_sets_warn_when_levels_are_too_close(spec):
    l2 = spec.level("L2")
    close = dataclasses.replace(spec, levels=tuple(
        dataclasses.replace(lv, capacity_bytes=l2.capacity_bytes + MIB) if lv.name == "L3" else lv
        for lv in spec.levels))
    ws, warns = level_working_sets(close, 2, cap=2 << 30)
    assert any(w.startswith("L3:") for w in warns)
    assert ws["L3"] < close.level("L3").capacity_bytes
    ws, warns = level_working_sets(spec, 1, cap=48 * MIB)  # memory cap below 2x L3: DRAM figure suspect
    assert ws["DRAM"] == 48 * MIB and any(w.startswith("DRAM:") for w in warns)


def test_sweep_and_peak_tile(spec):
    sizes = sweep_sizes(256 * MIB, 2)
    assert sizes[0] == 16 << 10 and sizes[-1] == 128 * MIB and len(sizes) == 14
    t = peak_tile(spec, "float32")
    assert (t["mr"], t["nv"], t["lanes"]) == (14, 2, 16)  # 28 of 32 zmm registers accumulate
    assert t["k"] * (t["mr"] + t["nv"] * t["lanes"]) * 4 <= spec.level("L1").capacity_bytes // 2
    assert peak_tile(load_device("x86-avx2", calibrated=False), "float64")["mr"] == 6  # 16 ymm registers


def test_plan_is_json_and_rejects_gpus(spec):
    import json
    plan = make_plan(spec, 2, quick=True)
    assert json.loads(json.dumps(plan)) == plan
    assert device_from_json(plan["device"]) == spec
    assert plan["sweep"] == {"one": [], "all": []} and plan["small"]["rows"] == [1, 16]
    with pytest.raises(CalibrationError, match="make_plan plans CPUs"):
        make_plan(dataclasses.replace(spec, kind="gpu"), 2)


def test_rate_stats_takes_the_fastest_third():
    st = rate_stats(10.0, [1.0, 2.0, 0.5, 4.0, 0.4, 5.0])  # rates 10, 5, 20, 2.5, 25, 2
    assert st["value"] == pytest.approx(22.5) and st["max"] == 25.0 and st["min"] == 2.0 and st["n"] == 6
    assert st["median"] == pytest.approx(7.5)
    with pytest.raises(CalibrationError):
        rate_stats(1.0, [0.0])


# ---------------------------------------------------------------------------------------------
# Kernels, built and run on this machine.

@pytest.fixture(scope="module")
def tvm_env():
    import tvm

    from roller.tir.compile import target_for
    return tvm, target_for(load_device("host", calibrated=False)), tvm.cpu()


def _run(tvm_env, func, *arrays_and_scalars):
    tvm, target, dev = tvm_env
    f = tvm.compile(tvm.IRModule({"main": func}), target)["main"]
    args = [tvm.runtime.tensor(x, dev) if isinstance(x, np.ndarray) else x for x in arrays_and_scalars]
    f(*args)
    return [a.numpy() if hasattr(a, "numpy") else a for a in args]


@pytest.mark.build
@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("kind", K.STREAM_KINDS)
def test_stream_kernels_match_numpy(tvm_env, kind, parallel):
    rng = np.random.default_rng(3)
    units = 2 if parallel else 1
    a = rng.standard_normal((units, 5, K.ROW)).astype("float32")
    o = np.zeros((units, K.CHUNK), "float32")
    A, O, _ = _run(tvm_env, K.stream_kernel(kind, parallel), a.copy(), o, 3)
    if kind == "read":  # the sum over rows and 128-float chunks, three passes
        want = 3 * a.reshape(units, -1, K.CHUNK).astype("float64").sum(axis=1)
        np.testing.assert_allclose(O, want, rtol=1e-5, atol=1e-4)
    elif kind == "write":
        np.testing.assert_array_equal(A, np.full_like(a, 2.0))
    else:
        np.testing.assert_allclose(A, a + 3, rtol=1e-6)
    assert K.stream_bytes(kind, a.nbytes, 3) == 3 * a.nbytes * (2 if kind == "rw" else 1)


@pytest.mark.build
@pytest.mark.parametrize("dtype,lanes,parallel", [("float32", 16, False), ("float64", 8, True), ("int32", 16, True)])
def test_peak_kernel_matches_numpy(tvm_env, dtype, lanes, parallel):
    """The peak tile in each dtype the calibration measures with it (int32: the multiply-adds of an integer
    kernel without dot steps) gives numpy's sums."""
    units, mr, nv, k, reps = (2 if parallel else 1), 14, 2, 8, 3
    rng = np.random.default_rng(4)
    if dtype == "int32":
        a = rng.integers(-50, 50, (units, mr, k)).astype(dtype)
        b = rng.integers(-50, 50, (units, k, nv * lanes)).astype(dtype)
    else:
        a = rng.standard_normal((units, mr, k)).astype(dtype)
        b = rng.standard_normal((units, k, nv * lanes)).astype(dtype)
    c = np.zeros((units, mr, nv * lanes), dtype)
    _, _, C = _run(tvm_env, K.peak_kernel(dtype, lanes, mr, nv, k, reps, units, parallel), a, b, c)
    want = reps * np.einsum("uik,ukj->uij", a.astype("float64"), b.astype("float64"))
    np.testing.assert_allclose(C, want, rtol=1e-4, atol=1e-4)
    assert K.peak_flops(units, mr, nv, lanes, k, reps) == 2 * units * mr * nv * lanes * k * reps


@pytest.mark.build
@pytest.mark.parametrize("row", [1, 8, 32])
def test_row_kernel_reads_the_first_elements_of_each_row(tvm_env, row):
    a = np.random.default_rng(5).standard_normal((37, 64)).astype("float32")
    _, O = _run(tvm_env, K.row_kernel(row), a, np.zeros(row, "float32"))
    np.testing.assert_allclose(O, a[:, :row].astype("float64").sum(axis=0), rtol=1e-5, atol=1e-5)


@pytest.mark.build
@pytest.mark.parametrize("parallel", [False, True])
def test_int8_vnni_peak_kernel_matches_numpy(tvm_env, parallel):
    from tvm.target.codegen import llvm_cpu_has_features
    if not llvm_cpu_has_features("avx512vnni", tvm_env[1]):
        pytest.skip("target without AVX-512 VNNI")
    units, mr, nv, k, reps = (2 if parallel else 1), 14, 2, 16, 3
    rng = np.random.default_rng(6)
    a = rng.integers(0, 256, (units, mr, k)).astype("uint8")
    b = rng.integers(-128, 128, (units, k // 4, nv * 16, 4)).astype("int8")
    c = np.zeros((units, mr, nv * 16), "int32")
    _, _, C = _run(tvm_env, K.int8_peak_kernel(mr, nv, k, reps, units, parallel), a, b, c)
    unpacked = b.transpose(0, 1, 3, 2).reshape(units, k, nv * 16).astype("int64")  # B[u, kk, j]
    np.testing.assert_array_equal(C, reps * np.einsum("uik,ukj->uij", a.astype("int64"), unpacked))
    assert K.int8_peak_ops(units, mr, nv, k, reps) == 2 * units * mr * nv * 16 * k * reps


@pytest.mark.build
def test_launch_probe_kernels_add_one_per_call(tvm_env):
    for parallel in (False, True):
        (O,) = _run(tvm_env, P.launch_kernel(parallel), np.arange(32, dtype="float32").reshape(2, 16))
        np.testing.assert_array_equal(O, np.arange(32, dtype="float32").reshape(2, 16) + 1)


@pytest.mark.build
@pytest.mark.parametrize("shared", [False, True])
def test_false_sharing_probe_writes_each_units_slice(tvm_env, shared):
    units, line, lines = 2, 16, 5
    o = np.random.default_rng(6).integers(0, 9, ((lines, line) if shared else (units, lines, line))).astype("float32")
    O, _ = _run(tvm_env, P.share_kernel(units, line, shared), o.copy(), 3)
    np.testing.assert_array_equal(O, P.share_reference(o, units, 3, shared))
    if shared:  # every unit's slice of every line, nothing else
        np.testing.assert_array_equal(O - o, np.full_like(o, 3))
    else:  # each unit the first half of its own lines
        assert (O - o)[:, :, :line // units].min() == 3 and (O - o)[:, :, line // units:].max() == 0


@pytest.mark.build
@pytest.mark.parametrize("moved", [False, True])
def test_accumulator_probe_kernels_match_numpy(tvm_env, moved):
    lanes, mr, nv, tiles, chunks, chunk, reps = 16, 3, 2, 2, 3, 4, 2
    a, b = P.accumulator_inputs(tiles * mr, chunks * chunk, nv * lanes, np.random.default_rng(7))
    _, _, C = _run(tvm_env, P.accumulator_kernel(lanes, mr, nv, tiles, chunks, chunk, reps, moved), a, b,
                   np.zeros((tiles * mr, nv * lanes), "float32"))
    np.testing.assert_array_equal(C, P.accumulator_reference(a, b, reps))


def test_probe_plan_keeps_the_accumulator_probe_in_half_of_l1(spec):
    p = probe_plan(spec)["accumulator"]
    tile = peak_tile(spec, "float32")
    assert (p["mr"], p["nv"], p["lanes"]) == (tile["mr"], tile["nv"], tile["lanes"])
    k = p["chunks"] * p["chunk"]
    floats = p["tiles"] * p["mr"] * k + k * p["nv"] * p["lanes"] + p["tiles"] * p["mr"] * p["nv"] * p["lanes"]
    assert 4 * floats <= spec.level("L1").capacity_bytes // 2 and p["chunks"] > 1
    assert probe_plan(spec)["line_elems"] * 4 == spec.level("L1").transaction_bytes
