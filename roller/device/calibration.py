"""A device's calibration file: where it lives, its schema and checks, loading and saving it, and the
datasheet-against-measured summary. A bad file is ignored with one warning naming it, never fatal.

File schema (``SCHEMA``): ``peak_gflops`` {dtype: GFLOP/s per unit}, optional ``tensor_peak_gflops`` (the
matrix unit's, AMX, by input dtype), ``bandwidth_gbps`` {level:
{"unit": GB/s, "total": GB/s, ...}} (what ``Device.with_calibration`` consumes), plus ``schema``,
``device``, ``fingerprint``, ``created``, ``seconds``, ``tvm_version``, ``threads``, ``peak_gflops_one``
(one unit alone), ``peak_gflops_all`` (all units together),
``small_transfer``, ``sweep``, ``skipped``, ``datasheet`` and ``warnings``; ``model`` (name -> {"value",
"source", "probe"}: the cost model's terms the probes measured; ``Device.with_calibration`` applies them).
"""
from __future__ import annotations

import json
import math
import os
import re
import warnings
from pathlib import Path
from typing import Any, Mapping

from roller.device.model_constants import ModelConstants
from roller.device.spec import Device
from roller.errors import CalibrationError
from roller.output import atomic_write_bytes, read_json_record
from roller.userdirs import CACHE_ENV, cache_dir


SCHEMA = 1
# how the source of a cost-model term a calibration probe measured begins (``roller devices`` marks those terms)
MEASURED_SOURCE = "measured by roller calibrate"


class CalibrationWarning(UserWarning):
    """A calibration file was ignored, or a measured figure looks implausible."""


def device_record_path(folder: str, device: Device) -> Path:
    """``<cache>/<folder>/<name>-<fingerprint>.json``: where a per-device record (calibration, fidelity) lives."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", device.name) or "device"
    return cache_dir() / folder / f"{name}-{device.fingerprint or 'nofingerprint'}.json"


def calibration_path(device: Device) -> Path:
    """Where ``device``'s calibration lives: ``<cache>/calibration/<name>-<fingerprint>.json``."""
    return device_record_path("calibration", device)


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def record_header_problem(data: Any, schema: int, device: Device | None) -> str | None:
    """What is wrong with a per-device record's frame (None if sound): a JSON object of this ``schema``, for
    ``device``'s fingerprint (where a device is given)."""
    if not isinstance(data, Mapping):
        return "not a JSON object"
    if data.get("schema") != schema:
        return f"schema {data.get('schema')!r}, this roller reads schema {schema}"
    if device is not None and data.get("fingerprint") != device.fingerprint:
        return (f"it is for fingerprint {data.get('fingerprint')!r}, the device has {device.fingerprint!r} "
                f"(the hardware or spec changed)")
    return None


def validate_calibration(data: Any, device: Device | None = None) -> str | None:
    """What is wrong with a calibration dict (None if usable): schema, fingerprint, figures."""
    header = record_header_problem(data, SCHEMA, device)
    if header:
        return header
    peaks = data.get("peak_gflops")
    if not isinstance(peaks, Mapping) or not peaks:
        return "peak_gflops is missing or empty"
    for dt, v in peaks.items():
        if not _positive(v):
            return f"peak_gflops.{dt} is {v!r}, expected a positive number"
    tensor = data.get("tensor_peak_gflops", {})
    if not isinstance(tensor, Mapping):
        return "tensor_peak_gflops is not a mapping of dtype to GOP/s"
    for dt, v in tensor.items():
        if not _positive(v):
            return f"tensor_peak_gflops.{dt} is {v!r}, expected a positive number"
    if data.get("clock_ghz") is not None and not _positive(data["clock_ghz"]):
        return f"clock_ghz is {data['clock_ghz']!r}, expected a positive number (or none)"
    bws = data.get("bandwidth_gbps")
    if not isinstance(bws, Mapping):
        return "bandwidth_gbps is missing"
    for lv, m in bws.items():
        if not isinstance(m, Mapping) or not _positive(m.get("unit")) or not _positive(m.get("total")):
            return f"bandwidth_gbps.{lv} needs positive 'unit' and 'total' GB/s, got {m!r}"
        if device is not None and lv not in {x.name for x in device.levels}:
            return f"bandwidth_gbps.{lv}: the device has no level {lv!r}"
    terms = data.get("model", {})
    if not isinstance(terms, Mapping):
        return "model is not a mapping of the cost model's terms"
    known = set(ModelConstants.names())
    for name, e in terms.items():
        if name not in known:
            return f"model.{name}: the cost model has no such term (a newer roller wrote it?)"
        if not isinstance(e, Mapping) or not isinstance(e.get("source"), str) or not (
                isinstance(e.get("value"), (int, float)) and not isinstance(e.get("value"), bool)
                and math.isfinite(e["value"]) and e["value"] >= 0):
            return f"model.{name} needs a finite 'value' >= 0 and a 'source', got {e!r}"
    return None


def load_calibration(device: Device) -> dict | None:
    """The cached calibration of ``device``, or None when there is none or it is unusable.

    An unreadable, corrupt, truncated, wrong-schema or other-fingerprint file gives one
    CalibrationWarning naming the file and saying to rerun ``roller calibrate``; never an exception.
    """
    path = calibration_path(device)
    data, why = read_json_record(path, lambda d: validate_calibration(d, device))
    if why:
        _warn_bad(path, why)
    return data


def _warn_bad(path: Path, why: str) -> None:
    warnings.warn(f"ignoring calibration file {path}: {why}; using datasheet figures, "
                  f"rerun `roller calibrate` to measure the device again", CalibrationWarning, stacklevel=3)


def save_calibration(device: Device, data: Mapping, path: str | os.PathLike | None = None) -> Path:
    """Writes ``data`` atomically (temp file + os.replace, under a file lock); returns the path.

    Concurrent savers never leave a partial file: each writes its own temp file and the rename is
    atomic; the lock orders them. CalibrationError if the data is unusable or the folder unwritable.
    """
    from filelock import FileLock, Timeout

    problem = validate_calibration(data, None)
    if problem:
        raise CalibrationError(f"refusing to save a calibration for {device.name!r}: {problem}")
    target = Path(path) if path is not None else calibration_path(device)
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(target) + ".lock", timeout=60):
            atomic_write_bytes(target, text.encode())
    except Timeout:
        raise CalibrationError(f"{target}: another process holds {target}.lock for over 60 s; "
                               f"wait for it or delete the lock file") from None
    except OSError as e:
        raise CalibrationError(f"{target}: cannot write the calibration ({e.strerror or e}); "
                               f"pick a writable --out or set {CACHE_ENV}") from None
    return target


def figures(device: Device) -> dict:
    """The device's current peaks and bandwidths in the calibration file's shape."""
    return {"peak_gflops": dict(device.units.peak_gflops),
            **({"tensor_peak_gflops": dict(device.units.tensor_peak_gflops)} if device.units.tensor_peak_gflops
               else {}),
            "bandwidth_gbps": {lv.name: {"unit": lv.bandwidth_gbps, "total": lv.total_bandwidth_gbps}
                               for lv in device.levels}}


def calibration_summary(device: Device) -> list[tuple[str, float, float | None]]:
    """Rows ``(field, datasheet, calibrated)`` for ``device`` (calibrated None when not measured).

    Uses ``device.calibration`` if the device carries one, else its cached calibration if any.
    """
    cal = device.calibration
    if cal is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CalibrationWarning)  # load_device already warned once
            cal = load_calibration(device)
    ds = (cal or {}).get("datasheet") or figures(device)
    rows: list[tuple[str, float, float | None]] = []
    peaks = (cal or {}).get("peak_gflops", {})
    for dt, v in ds["peak_gflops"].items():
        rows.append((f"peak_gflops.{dt}", float(v), peaks.get(dt)))
    tensor = (cal or {}).get("tensor_peak_gflops", {})
    for dt, v in (ds.get("tensor_peak_gflops") or {}).items():
        rows.append((f"tensor_peak_gflops.{dt}", float(v), tensor.get(dt)))
    bws = (cal or {}).get("bandwidth_gbps", {})
    for lv in device.levels:  # nearest compute first, as the device lists them
        m = ds["bandwidth_gbps"].get(lv.name) or {"unit": lv.bandwidth_gbps, "total": lv.total_bandwidth_gbps}
        got = bws.get(lv.name) or {}
        rows.append((f"bandwidth_gbps.{lv.name}.unit", float(m["unit"]), got.get("unit")))
        rows.append((f"bandwidth_gbps.{lv.name}.total", float(m["total"]), got.get("total")))
    spec = ds.get("model") or {}
    for name, e in ((cal or {}).get("model") or {}).items():  # the cost model's terms the probes measured
        rows.append((f"model.{name}", float(spec.get(name, math.nan)), float(e["value"])))
    return rows
