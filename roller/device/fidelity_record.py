"""A device's fidelity record: how well its cost model ranked plans when ``roller fidelity`` last measured it
(roller.builder.fidelity), kept beside its calibration and readable without a compiler, so that the plan
layer's callers (profiling: how many plans to build) can read the model's measured error.

File: ``<cache>/fidelity/<name>-<fingerprint>.json``, named as the calibration file is
(roller.device.calibration.calibration_path). Schema (``SCHEMA``): ``schema``, ``device``, ``fingerprint``,
``calibrated`` (whether the model ran on calibrated figures), ``calibration_created`` (that calibration's
``created``, or None), ``created`` (seconds since the epoch), ``quick`` (the quick shape set), ``selection``
(``"quick"``, ``"full"`` or ``"custom"``: the shapes picked by hand), ``samples``, ``topk``, ``rounds``,
``targets``, ``shapes`` (one object per shape: ``label``, ``spearman``, ``first_over_best``, ...),
``mean_spearman``, ``first_within``, ``first_within_timing_pass``, ``shape_count``, ``relative_error``,
``profile_margin`` (see :func:`profile_margin`), ``seconds``. A bad file is ignored with one warning naming it, never fatal.
"""
from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any, Mapping

from roller.device.calibration import device_record_path, record_header_problem
from roller.device.spec import Device
from roller.errors import CalibrationError
from roller.output import atomic_write_bytes, read_json_record
from roller.userdirs import CACHE_ENV

SCHEMA = 1


class FidelityWarning(UserWarning):
    """A fidelity record was ignored."""


def fidelity_path(device: Device) -> Path:
    """Where ``device``'s fidelity record lives: ``<cache>/fidelity/<name>-<fingerprint>.json``."""
    return device_record_path("fidelity", device)


def _number_or_none(x: Any) -> bool:
    return x is None or (isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x))


def validate_fidelity(data: Any, device: Device | None = None) -> str | None:
    """What is wrong with a fidelity record (None if usable): schema, fingerprint, the summary figures."""
    header = record_header_problem(data, SCHEMA, device)
    if header:
        return header
    for key in ("mean_spearman", "relative_error"):
        if key not in data or not _number_or_none(data[key]):
            return f"{key} is {data.get(key)!r}, expected a finite number or null"
    if not isinstance(data.get("shapes"), list) or not all(isinstance(s, Mapping) for s in data["shapes"]):
        return "shapes is missing or not a list of objects"
    return None


def load_fidelity(device: Device) -> dict | None:
    """The last fidelity record of ``device``, or None when there is none or it is unusable (a corrupt,
    wrong-schema or other-fingerprint file gives one FidelityWarning naming it; never an exception)."""
    path = fidelity_path(device)
    data, why = read_json_record(path, lambda d: validate_fidelity(d, device))
    if why:
        _warn_bad(path, why)
    return data


def _warn_bad(path: Path, why: str) -> None:
    warnings.warn(f"ignoring fidelity record {path}: {why}; rerun `roller fidelity` to measure it again",
                  FidelityWarning, stacklevel=3)


def save_fidelity(device: Device, data: Mapping) -> Path:
    """Writes ``data`` (a record as :func:`validate_fidelity` reads it) to :func:`fidelity_path` atomically;
    returns the path. CalibrationError if it is unusable or the folder unwritable."""
    problem = validate_fidelity(data, device)
    if problem:
        raise CalibrationError(f"refusing to save a fidelity record for {device.name!r}: {problem}")
    target = fidelity_path(device)
    try:
        atomic_write_bytes(target, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())
    except OSError as e:
        raise CalibrationError(f"{target}: cannot write the fidelity record ({e.strerror or e}); "
                               f"set {CACHE_ENV} to a writable folder") from None
    return target


def profile_margin(device: Device) -> float | None:
    """The profiling margin (``profile_margin``: how much slower than the first plan the model predicted
    top-k plans that ran faster) of ``device``'s last fidelity record, where that record speaks for the model
    as it now runs: measured on the whole shape list or the quick one (not shapes picked by hand), on the same
    figures (datasheet, or the same calibration: a new calibration makes the record stale). None otherwise."""
    rec = load_fidelity(device)
    if rec is None or rec.get("selection") == "custom" or bool(rec.get("calibrated")) != device.calibrated:
        return None
    if device.calibrated and rec.get("calibration_created") != (device.calibration or {}).get("created"):
        return None
    m = rec.get("profile_margin")
    return float(m) if _number_or_none(m) and m is not None and m >= 0 else None

