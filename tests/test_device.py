"""Device specs: shipped files, host detection, and clear errors for malformed specs (no TVM)."""
import pytest
import yaml

from policy_exprs import cpu_spec, spec_error
from roller.plan.choices import estimate_tiles
from roller.device.spec import device_from_dict, load_spec_file, parse_size, shipped_specs
from roller.device.load import load_device
from roller.errors import DeviceSpecError


def test_shipped_specs_load_and_are_ordered_nearest_compute_first():
    specs = shipped_specs()
    assert {"x86-avx512", "x86-avx2"} <= set(specs)
    for name in specs:
        dev = load_device(name, calibrated=False)
        if dev.kind == "gpu":  # registers per thread, shared memory per block: tests/test_gpu_policy.py
            continue
        assert [lv.name for lv in dev.levels][:3] == ["reg", "L1", "L2"]
        assert [lv.capacity_bytes for lv in dev.private_levels] == sorted(lv.capacity_bytes for lv in dev.private_levels)
        assert dev.levels[-1].shared and not dev.levels[0].shared
        assert dev.fingerprint


def test_lanes_follow_the_simd_width():
    avx512 = load_device("x86-avx512", calibrated=False)
    avx2 = load_device("x86-avx2", calibrated=False)
    assert avx512.units.lanes("float32") == 16 and avx512.units.lanes("float16") == 32
    assert avx2.units.lanes("float32") == 8


def test_host_describes_this_machine():
    import os
    dev = load_device("host", calibrated=False)
    assert dev.name == "host" and dev.kind == "cpu"
    assert dev.units.count == len(os.sched_getaffinity(0))
    assert dev.level("L1").capacity_bytes >= 16 * 1024
    assert load_device(None, calibrated=False).fingerprint == dev.fingerprint


def test_parse_size():
    assert parse_size("48K") == 48 * 1024
    assert parse_size("2MiB") == 2 * 1024 ** 2
    assert parse_size(4096) == 4096
    assert parse_size("0") is None and parse_size(-1) is None and parse_size("lots") is None


def bad(mutate):
    return spec_error(mutate)


@pytest.mark.parametrize("mutate,needles", [
    (lambda s: s.pop("name"), ["bad.yaml", "name", "missing"]),
    (lambda s: s.update(kind="fpga"), ["kind", "cpu, gpu"]),
    (lambda s: s["units"].update(count=0), ["units.count", "positive integer"]),
    (lambda s: s["units"].update(count="two"), ["units.count", "'two'"]),
    (lambda s: s["units"]["peak_gflops"].update(float33=1.0), ["float33", "unknown dtype"]),
    (lambda s: s["units"].pop("vector_bytes"), ["vector_bytes", "warp_threads"]),
    (lambda s: s["levels"][1].update(capacity="huge"), ["levels[1].capacity", "size in bytes"]),
    (lambda s: s["levels"][1].update(capacity=-5), ["levels[1].capacity"]),
    (lambda s: s["levels"][2].update(bandwidth_gbps=0), ["levels[2].bandwidth_gbps", "positive number"]),
    (lambda s: s["levels"][1].update(usable_fraction=1.5), ["usable_fraction", "(0, 1]"]),
    (lambda s: s["levels"][1].update(colour="red"), ["levels[1]", "unknown field", "colour"]),
    (lambda s: s["levels"][3].pop("total_bandwidth_gbps"), ["levels[3].total_bandwidth_gbps", "shared level"]),
    (lambda s: s["levels"][1].pop("bank_bytes"), ["levels[1]", "banks and bank_bytes"]),
    (lambda s: s["levels"].reverse(), ["levels[0]", "nearest compute"]),
    (lambda s: s["levels"][1].update(name="reg"), ["unique"]),
    (lambda s: s.update(levels=[]), ["levels", "non-empty list"]),
    (lambda s: s.update(target={"mcpu": "x"}), ["target.kind"]),
])
def test_malformed_spec_names_the_field(mutate, needles):
    msg = bad(mutate)
    for n in needles:
        assert n in msg, (n, msg)


def test_malformed_yaml_file_names_file_and_line(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("name: x\nkind: cpu\nunits: [1, 2\n")
    with pytest.raises(DeviceSpecError, match=r"broken.yaml: not valid YAML at line"):
        load_spec_file(p)
    with pytest.raises(DeviceSpecError, match="cannot read"):
        load_spec_file(tmp_path / "missing.yaml")
    with pytest.raises(DeviceSpecError, match="unknown device 'nosuch'"):
        load_device("nosuch")


def test_spec_with_base_overrides_fields(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text(yaml.safe_dump({"base": "x86-avx512", "name": "mine", "units": {"count": 8},
                                 "levels": [{"name": "L2", "capacity": "1MiB"}]}))
    dev = load_device(str(p), calibrated=False)
    assert dev.name == "mine" and dev.units.count == 8
    assert dev.level("L2").capacity_bytes == 1024 ** 2 and dev.level("L1").capacity_bytes == 48 * 1024
    p.write_text(yaml.safe_dump({"base": "x86-avx512", "levels": [{"name": "L9", "capacity": 1}]}))
    with pytest.raises(DeviceSpecError, match=r"levels\[0\]: an override must name one of the base's levels"):
        load_device(str(p))


def test_calibration_replaces_datasheet_figures():
    dev = device_from_dict(cpu_spec(), "t")
    cal = dev.with_calibration({"peak_gflops": {"float32": 150.0},
                                "bandwidth_gbps": {"L2": {"unit": 70.0, "total": 130.0}}})
    assert cal.calibrated and not dev.calibrated
    assert cal.units.peak("float32") == 150.0
    assert cal.level("L2").bandwidth_gbps == 70.0 and cal.level("L2").total_bandwidth_gbps == 130.0
    assert cal.level("L1").bandwidth_gbps == dev.level("L1").bandwidth_gbps


def test_largest_cached_bytes_comes_from_the_calibration_sweep():
    """The caches a unit really gets: the largest swept working set read at 3/4 of the last cache level's
    bandwidth or more (a VM's sysfs names the host's L3); without a sweep, that level's usable bytes."""
    from policy_exprs import cpu

    dev = cpu()  # L3 16 MiB (usable 16 MiB) at 40 GB/s a unit, then DRAM
    assert dev.largest_cached_bytes() == 16 << 20
    sweep = {"sweep": {"one": [{"bytes": 4 << 20, "read": 41.0}, {"bytes": 8 << 20, "read": 31.0},
                               {"bytes": 16 << 20, "read": 29.0}, {"bytes": 64 << 20, "read": 10.0}]}}
    assert dev.with_calibration(sweep).largest_cached_bytes() == 8 << 20


def _avx512_dict() -> dict:
    import yaml

    from roller.device.spec import shipped_specs
    return yaml.safe_load(shipped_specs()["x86-avx512"].read_text())


def test_a_spec_model_figure_reaches_the_estimate():
    """A spec's ``model:`` entry replaces the family's default and the estimate reads it: doubling the parallel
    launch's cycles adds one more launch to a plan that runs on both units."""
    from roller.device.spec import device_from_dict
    from roller.plan.cost import cycle_seconds
    from policy_exprs import matmul

    base = device_from_dict(_avx512_dict(), "x86-avx512")
    assert base.model.parallel_launch_cycles == 3000 and "fitted" in base.model.sources["parallel_launch_cycles"]
    data = _avx512_dict()
    data["model"] = {"parallel_launch_cycles": {"value": 6000, "source": "test: doubled"}}
    doubled = device_from_dict(data, "doubled")
    assert doubled.model.parallel_launch_cycles == 6000
    assert doubled.model.sources["parallel_launch_cycles"] == "test: doubled"
    assert doubled.model.register_load_share == base.model.register_load_share  # the other entries: the defaults
    assert doubled.to_dict()["model"]["parallel_launch_cycles"] == {"value": 6000, "source": "test: doubled"}
    e = matmul(64, 64, 64)
    tiles = [{"i": 4, "j": 16, "k": 1}, {"i": 8, "j": 32, "k": 64}, {"i": 32, "j": 64, "k": 64}]
    one, two = estimate_tiles(e, tiles, base), estimate_tiles(e, tiles, doubled)
    assert one.units == 2
    assert two.seconds - one.seconds == pytest.approx(3000 * cycle_seconds(base), rel=1e-6)


@pytest.mark.parametrize("entry, message", [
    ({"nonsense_cycles": {"value": 1, "source": "x"}}, "model: unknown field(s) nonsense_cycles"),
    ({"fold_cycles": {"value": -2, "source": "x"}}, "model.fold_cycles.value: expected a positive number"),
    ({"fold_cycles": 2.0}, "model.fold_cycles: expected a mapping"),
    ({"fold_cycles": {"value": 2.0}}, "model.fold_cycles.source: expected a non-empty string"),
    ({"untracked_line_cycles": {"value": 4.5, "source": "x"}},
     "model.untracked_line_cycles.value: expected a positive integer"),
    ({"register_load_share": {"value": 1.5, "source": "x"}},
     "model.register_load_share.value: expected a number in (0, 1]"),
    ({"fold_cycles": {"value": 2.0, "source": "x", "when": "now"}}, "model.fold_cycles: unknown field(s) when"),
    ({"resident_none": {"value": 0.4, "source": "x"}}, "model.resident_none (0.4) must exceed"),
])
def test_a_malformed_model_entry_is_a_clear_spec_error(entry, message):
    from roller.device.spec import device_from_dict
    from roller.errors import DeviceSpecError

    data = _avx512_dict()
    data["model"] = entry
    with pytest.raises(DeviceSpecError) as err:
        device_from_dict(data, "bad.yaml")
    assert str(err.value).startswith("bad.yaml: ") and message in str(err.value)
