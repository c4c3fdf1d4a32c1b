"""Loading a device by name: ``host`` (this machine, described from sysfs), a shipped spec, or a YAML path,
with its calibration applied where one was measured."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from roller.device.spec import Device, load_spec_file, shipped_specs
from roller.errors import DeviceSpecError


def load_device(spec: str | os.PathLike | None = None, calibrated: bool = True) -> Device:
    """The device for a name, a YAML path, or None / ``host`` (this machine, the default).

    With ``calibrated`` the per-user calibration of that device, if any, replaces datasheet figures
    (see roller.targets.cpu.calibrate); a corrupt calibration file is ignored with a warning, never fatal.
    """
    if spec is None or str(spec) == "host":
        from roller.device.host import host_device
        dev = host_device()
    else:
        specs = shipped_specs()
        s = str(spec)
        if s in specs:
            dev = load_spec_file(specs[s])
        elif s.endswith((".yaml", ".yml")) or os.sep in s or Path(s).exists():
            dev = load_spec_file(s)
        else:
            raise DeviceSpecError(f"unknown device {s!r}: use 'host', one of {', '.join(specs)}, "
                                  f"or the path of a YAML spec")
    if not dev.fingerprint:
        dev = dataclasses.replace(dev, fingerprint=spec_fingerprint(dev))
    if calibrated:
        from roller.device.calibration import load_calibration
        found = load_calibration(dev)
        if found is not None:
            dev = dev.with_calibration(found)
    return dev


def spec_fingerprint(dev: Device) -> str:
    """A short hash of what the hardware is (units, levels' capacities, target): keys calibration files."""
    import hashlib
    key = repr((dev.kind, dict(sorted(dev.target.items())), dev.units.count, dev.units.vector_bytes,
                dev.units.warp_threads, [(lv.name, lv.capacity_bytes, lv.shared) for lv in dev.levels]))
    if dev.gpu is not None:  # a CPU's key stays as it was (calibration files are named by it)
        key += repr(dev.gpu)
    return hashlib.sha256(key.encode()).hexdigest()[:12]
