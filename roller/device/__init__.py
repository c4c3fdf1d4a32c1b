"""The device layer: what a machine is (memory levels, execution units, alignment facts) as plain data,
loaded from a YAML spec or detected on the host, with its calibration applied. Imports no compiler."""
from roller.device.load import load_device, spec_fingerprint
from roller.device.spec import (GPU_LEVELS, KINDS, ComputeUnits, Device, GpuLimits, MemoryLevel, device_from_dict,
                                load_spec_file, parse_size, shipped_specs, spec_dir)

__all__ = ["GPU_LEVELS", "KINDS", "ComputeUnits", "Device", "GpuLimits", "MemoryLevel", "device_from_dict",
           "load_device", "load_spec_file", "parse_size", "shipped_specs", "spec_dir", "spec_fingerprint"]
