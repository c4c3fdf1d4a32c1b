"""roller.targets.cpu.calibrate: the cache file (atomic, locked, validated), loading into devices, the command."""
import json
import multiprocessing
import warnings

import pytest

from roller import cli, userdirs
from roller.device import calibration as store
from roller.targets.cpu import calibrate as C
from roller.device.load import load_device
from roller.errors import CalibrationError


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Every test gets its own cache dir: the user's cache is never touched."""
    monkeypatch.setenv(userdirs.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def spec():
    return load_device("x86-avx512", calibrated=False)


def fake_calibration(dev, scale=1.0):
    return {"schema": store.SCHEMA, "device": dev.name, "fingerprint": dev.fingerprint,
            "peak_gflops": {"float32": 200.0 * scale},
            "bandwidth_gbps": {"L1": {"unit": 300.0 * scale, "total": 600.0 * scale},
                               "DRAM": {"unit": 9.0 * scale, "total": 12.0 * scale}},
            "datasheet": store.figures(dev), "pad": "x" * 20000}


def test_path_is_keyed_by_name_and_fingerprint(spec, cache):
    p = store.calibration_path(spec)
    assert p == cache / "calibration" / f"x86-avx512-{spec.fingerprint}.json"


def test_saved_calibration_replaces_datasheet_figures(spec):
    path = store.save_calibration(spec, fake_calibration(spec))
    assert path.exists() and not list(path.parent.glob("*.tmp"))
    dev = load_device("x86-avx512", calibrated=True)
    assert dev.calibrated and dev.units.peak("float32") == 200.0
    assert dev.level("L1").bandwidth_gbps == 300.0 and dev.level("L1").total_bandwidth_gbps == 600.0
    assert dev.level("L2").bandwidth_gbps == spec.level("L2").bandwidth_gbps  # not measured: datasheet
    rows = {f: (ds, got) for f, ds, got in store.calibration_summary(dev)}
    assert rows["peak_gflops.float32"] == (spec.units.peak("float32"), 200.0)
    assert rows["bandwidth_gbps.L2.unit"] == (spec.level("L2").bandwidth_gbps, None)
    assert rows["peak_gflops.float64"][1] is None


def test_a_measured_matrix_unit_peak_replaces_the_specs(spec):
    """Where calibration measured the matrix unit (AMX's tdpbusd, ``tensor_peak_gflops``), the model reads it;
    the summary shows it beside the spec's figure; a non-positive one is refused."""
    data = dict(fake_calibration(spec), tensor_peak_gflops={"int8": 5000.0})
    assert store.validate_calibration(data, spec) is None
    store.save_calibration(spec, data)
    dev = load_device("x86-avx512", calibrated=True)
    assert dev.units.tensor_peak_gflops["int8"] == 5000.0
    rows = {f: (ds, got) for f, ds, got in store.calibration_summary(dev)}
    assert rows["tensor_peak_gflops.int8"] == (spec.units.tensor_peak_gflops["int8"], 5000.0)
    assert "tensor_peak_gflops.int8" in store.validate_calibration(dict(data, tensor_peak_gflops={"int8": -1}), spec)


def test_empty_cache_gives_datasheet_device_without_warning(spec, cache):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dev = load_device("x86-avx512", calibrated=True)
    assert not dev.calibrated and dev == spec and not cache.exists()
    assert all(got is None for _, _, got in store.calibration_summary(dev))


def _truncated(dev):
    return json.dumps(fake_calibration(dev))[:500]


BAD_FILES = {
    "garbage": lambda dev: "\x00\x01 not json at all",
    "binary garbage": lambda dev: b"\xff\xfe\x00\x9c\x80 not UTF-8",
    "empty": lambda dev: "",
    "truncated": _truncated,
    "not an object": lambda dev: "[1, 2, 3]",
    "wrong schema": lambda dev: json.dumps(dict(fake_calibration(dev), schema=99)),
    "other fingerprint": lambda dev: json.dumps(dict(fake_calibration(dev), fingerprint="0123456789ab")),
    "negative peak": lambda dev: json.dumps(dict(fake_calibration(dev), peak_gflops={"float32": -1})),
    "level missing total": lambda dev: json.dumps(dict(fake_calibration(dev), bandwidth_gbps={"L1": {"unit": 5}})),
    "unknown level": lambda dev: json.dumps(dict(fake_calibration(dev),
                                                 bandwidth_gbps={"L9": {"unit": 5, "total": 9}})),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_cache_file_warns_and_falls_back(spec, case):
    path = store.calibration_path(spec)
    path.parent.mkdir(parents=True)
    data = BAD_FILES[case](spec)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    with pytest.warns(store.CalibrationWarning) as rec:
        assert store.load_calibration(spec) is None
    assert len(rec) == 1
    msg = str(rec[0].message)
    assert str(path) in msg and "roller calibrate" in msg
    with pytest.warns(store.CalibrationWarning):
        dev = load_device("x86-avx512", calibrated=True)
    assert not dev.calibrated and dev.units.peak("float32") == spec.units.peak("float32")
    # Recalibrating over the bad file repairs it.
    store.save_calibration(spec, fake_calibration(spec))
    assert store.load_calibration(spec)["peak_gflops"] == {"float32": 200.0}


def test_save_refuses_bad_data_and_unwritable_places(spec, tmp_path):
    with pytest.raises(CalibrationError, match="peak_gflops"):
        store.save_calibration(spec, {"schema": store.SCHEMA, "peak_gflops": {}, "bandwidth_gbps": {}})
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(CalibrationError, match="cannot write"):
        store.save_calibration(spec, fake_calibration(spec), blocker / "sub" / "cal.json")


def _writer(args):
    cache_dir, seed = args
    import os
    os.environ[userdirs.CACHE_ENV] = cache_dir
    dev = load_device("x86-avx512", calibrated=False)
    for i in range(15):
        store.save_calibration(dev, fake_calibration(dev, scale=1 + seed + i / 100))
    return seed


def test_concurrent_writers_leave_a_valid_file(spec, cache):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(6) as pool:
        assert sorted(pool.map(_writer, [(str(cache), s) for s in range(6)])) == list(range(6))
    path = store.calibration_path(spec)
    data = json.loads(path.read_text())
    assert store.validate_calibration(data, spec) is None
    scale = data["peak_gflops"]["float32"] / 200.0
    assert data["bandwidth_gbps"]["L1"]["unit"] == pytest.approx(300.0 * scale)  # one writer's whole file
    assert not list(path.parent.glob("*.tmp"))


def _calibrator(args):
    """`roller calibrate` in a worker, its measurement replaced by a 0.8 s sleep; returns (start, end)."""
    import argparse
    import os
    import time
    cache_dir, = args
    os.environ[userdirs.CACHE_ENV] = cache_dir
    span = []

    def measure(dev, quick=False, progress=True):
        span.append(time.time())
        time.sleep(0.8)
        span.append(time.time())
        return fake_calibration(dev)

    C.run_calibration = measure
    cli._print_table = lambda *a: None
    cli.cmd_calibrate(argparse.Namespace(device="x86-avx512", quick=True, json=False, out=None, check=False))
    return tuple(span)


def test_calibrations_on_one_machine_run_one_after_the_other(cache):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        spans = sorted(pool.map(_calibrator, [(str(cache),)] * 3))
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:])), spans  # no two measured at once


def test_sanity_warnings_name_the_odd_figures(spec):
    def point(gbps):
        return {"read": {"value": gbps}}
    raw = {"levels": {"L1": {"one": point(50.0)}, "L2": {"one": point(80.0)}, "DRAM": {"one": point(10.0)}},
           "peak": {"float32": {"one": {"value": 10.0}, "all": {"value": 11.0}},
                    "float64": {"one": {"value": 60.0}, "all": {"value": 120.0}},
                    "int8": {"skipped": "why"}}}
    warns = C._sanity(spec, raw, ["L1", "L2", "DRAM"], 2)
    text = "\n".join(warns)
    assert "L1 read 50.0 GB/s is not faster than L2" in text and "L2 read" not in text
    assert "peak float32 10 GFLOP/s per unit is under a quarter" in text
    assert "peak float32 on 2 units is 1.10x" in text and "float64" not in text


def test_cli_errors_are_one_line(capsys):
    assert cli.main(["calibrate", "--device", "no-such-device", "--quick"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown device 'no-such-device'" in err[0]


@pytest.mark.build
def test_quick_calibration_json(tmp_path, capsys):
    out = tmp_path / "cal.json"
    assert cli.main(["calibrate", "--quick", "--json", "--out", str(out)]) == 0
    res = json.loads(capsys.readouterr().out)
    for key in ("peak_gflops", "peak_gflops_all", "bandwidth_gbps", "bandwidth_total_gbps", "seconds",
                "small_transfer", "warnings", "skipped", "path"):
        assert key in res
    assert res["path"] == str(out)
    assert res["peak_gflops"]["float32"] > 0 and res["peak_gflops"]["float64"] > 0
    assert res["peak_gflops"]["int32"] > 0  # integer multiply-adds without dot steps, measured too
    assert set(res["bandwidth_gbps"]) == {"L1", "L2", "L3", "DRAM"}
    assert all(v > 0 for v in res["bandwidth_gbps"].values())
    assert "bfloat16" in res["skipped"]
    assert res["model"] == {} and any(w.startswith("quick: the cost model's terms") for w in res["warnings"])
    saved = json.loads(out.read_text())
    host = load_device("host", calibrated=False)
    assert store.validate_calibration(saved, host) is None
    assert saved["fingerprint"] == host.fingerprint and saved["tvm_version"] and saved["created"]
    assert {"one", "all"} == set(saved["sweep"]) and saved["small_transfer"]["rows"]
    assert not store.calibration_path(host).exists()  # --out: the cache is left alone
    dev = host.with_calibration(saved)
    assert dev.units.peak("float32") == res["peak_gflops"]["float32"]
    from roller.plan.dot import has_amx
    if has_amx(host):  # the matrix unit's peak, measured (AMX's tdpbusd, exact against numpy first)
        assert saved["tensor_peak_gflops"]["int8"] > 0 and saved["tensor_peak_gflops_one"]["int8"] > 0
        assert dev.units.tensor_peak_gflops["int8"] == saved["tensor_peak_gflops"]["int8"]
    else:
        assert "tensor_peak_gflops" not in saved


def test_per_unit_is_the_all_units_share():
    assert C.per_unit(total=216.0, units=2) == 108.0
    assert C.per_unit(total=10.0, units=1) == 10.0


def test_probed_model_terms_replace_the_specs_and_are_checked(spec):
    probes = {"launch": {"value": 1.0e-6, "rounds": [], "work": 1},
              "false_sharing": {"value": -2e-9, "rounds": [], "work": 1},  # noise around a free term: 0
              "accumulator": {"value": 0.2e-9, "rounds": [], "work": 1,
                              "tile": {"mr": 14, "nv": 2, "chunks": 8, "chunk": 4}},
              "prefetch": {"value": 0.96, "seconds": [[3.1e-3, 2.9e-3], [3.0e-3, 2.9e-3]],
                           "shape": {"M": 128, "N": 3072, "K": 768}}}
    terms = C.model_terms(spec, probes, "2026-11-28")
    hz = spec.units.clock_ghz * 1e9
    assert terms["software_prefetch_gain"]["value"] == 0.96
    assert "128 x 3072 x 768" in terms["software_prefetch_gain"]["source"]
    assert terms["parallel_launch_cycles"]["value"] == round(1e-6 * hz)
    assert terms["false_sharing_seconds"]["value"] == 0.0
    assert terms["accumulator_cycles"]["value"] == pytest.approx(0.2e-9 * hz)
    assert all(e["source"].startswith(store.MEASURED_SOURCE) for e in terms.values())
    cal = dict(fake_calibration(spec), model=terms)
    cal["datasheet"] = dict(cal["datasheet"], model={n: getattr(spec.model, n) for n in terms})
    assert store.validate_calibration(cal, spec) is None
    dev = spec.with_calibration(cal)
    assert dev.model.parallel_launch_cycles == round(1e-6 * hz) != spec.model.parallel_launch_cycles
    assert dev.model.accumulator_cycles == pytest.approx(0.2e-9 * hz)
    assert dev.model.sources["accumulator_cycles"].startswith(store.MEASURED_SOURCE)
    assert dev.model.software_prefetch_gain == 0.96 != spec.model.software_prefetch_gain
    assert dev.model.fold_cycles == spec.model.fold_cycles  # not probed: the spec's
    rows = {f: (ds, got) for f, ds, got in store.calibration_summary(dev)}
    assert rows["model.accumulator_cycles"] == (spec.model.accumulator_cycles, pytest.approx(0.2e-9 * hz))
    bad = dict(cal, model={"no_such_term": {"value": 1, "source": "x"}})
    assert "no such term" in store.validate_calibration(bad, spec)
    bad = dict(cal, model={"accumulator_cycles": {"value": -1.0, "source": "x"}})
    assert ">= 0" in store.validate_calibration(bad, spec)


def test_devices_marks_measured_terms_beside_the_specs_value(spec, capsys):
    probes = {"accumulator": {"value": 0.2e-9, "rounds": [], "work": 1,
                              "tile": {"mr": 14, "nv": 2, "chunks": 8, "chunk": 4}}}
    terms = C.model_terms(spec, probes, "2026-11-28")
    cal = dict(fake_calibration(spec), model=terms)
    cal["datasheet"] = dict(cal["datasheet"], model={n: getattr(spec.model, n) for n in terms})
    store.save_calibration(spec, cal)
    assert cli.main(["devices"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines()[1:] if "accumulator_cycles" in ln
                and "[measured" in ln)
    assert f"[measured; spec {spec.model.accumulator_cycles:g}]" in line and "fold_cycles 2," in line
    assert cli.main(["devices", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["x86-avx512"]["model"]["accumulator_cycles"]["spec_value"] == spec.model.accumulator_cycles
    assert "spec_value" not in rows["x86-avx512"]["model"]["fold_cycles"]


@pytest.mark.build
def test_the_prefetch_probe_times_a_prepacked_gemm_with_and_without_its_prefetches(device):
    """The probe behind ``model.software_prefetch_gain`` builds the first plan of a GEMM whose weight is
    prepacked, with and without the prefetch of its next top tile's block, checks both against numpy and
    times cold calls of each in turn: the figure is the time without over the time with."""
    from roller.targets.cpu.microbench.prefetch import prefetch_probe

    shape = {"M": 64, "N": 1024, "K": 512}
    got = prefetch_probe(device, shape, rounds=2)
    assert got["shape"] == shape and len(got["seconds"]) == 2
    assert all(len(r) == 2 and min(r) > 0 for r in got["seconds"])
    ratios = sorted(without / with_ for with_, without in got["seconds"])
    assert got["value"] == pytest.approx(sum(ratios) / 2)  # the median of two rounds
