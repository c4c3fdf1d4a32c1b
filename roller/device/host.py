"""Describes the CPU this process runs on: the closest shipped spec, with this machine's core count,
SIMD width, cache sizes (sysfs) and clock (/proc/cpuinfo) put in. Plain file reads, no back end."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import platform
import re
from pathlib import Path

from roller.device.spec import Device, load_spec_file, shipped_specs
from roller.errors import DeviceSpecError

_SYSFS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")

# CPU flags (/proc/cpuinfo) whose LLVM feature the CPU name LLVM detects may lack (a VM can report an
# older model than the features it has): passed as the target's mattr so the code uses them.
_LLVM_FEATURES = {"avx512_fp16": "+avx512fp16", "avx512_bf16": "+avx512bf16", "avx512_vnni": "+avx512vnni",
                  "avx_vnni": "+avxvnni", "amx_tile": "+amx-tile", "amx_int8": "+amx-int8"}


def cpu_count() -> int:
    """Cores this process may run on (affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if ":" in line:
                k, v = line.split(":", 1)
                info.setdefault(k.strip(), v.strip())
            elif info:  # first processor block is enough
                break
    except OSError:
        pass
    return info


def cpu_flags() -> set[str]:
    return set(_cpuinfo().get("flags", "").split())


def sysfs_caches(root: Path = _SYSFS_CACHE) -> dict[str, dict]:
    """Data caches by level name ("L1", "L2", "L3"): size, line, sets, ways, shared (by >1 cpu)."""
    out: dict[str, dict] = {}
    if not root.is_dir():
        return out
    from roller.device.spec import parse_size
    for idx in sorted(root.glob("index*")):
        try:
            read = lambda n: (idx / n).read_text().strip()  # noqa: E731
            if read("type") == "Instruction":
                continue
            size = parse_size(read("size"))
            if not size:
                continue
            shared_list = read("shared_cpu_list") if (idx / "shared_cpu_list").exists() else "0"
            entry = {"size": size, "line": int(read("coherency_line_size")),
                     "sets": int(read("number_of_sets")) if (idx / "number_of_sets").exists() else None,
                     "shared": ("," in shared_list or "-" in shared_list)}
            out[f"L{int(read('level'))}"] = entry
        except (OSError, ValueError):
            continue
    return out


_MAX_FREQ = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")


def _clock_ghz(info: dict[str, str], max_freq: Path = _MAX_FREQ) -> float | None:
    """A clock that stays put between processes and identical machines (it enters the model, and so the
    kernel cache's key): the highest the kernel reports (cpufreq), else the nominal one in the model name
    ("... @ 2.30GHz"), else /proc/cpuinfo's current "cpu MHz" rounded to 0.1 GHz (it moves with the load
    where the frequency scales: a calibration file, which records the clock, pins it; see README)."""
    try:
        return int(max_freq.read_text()) / 1e6
    except (OSError, ValueError):
        pass
    nominal = re.search(r"@\s*([0-9.]+)\s*GHz", info.get("model name", ""))
    if nominal:
        return float(nominal.group(1))
    try:
        return round(float(info["cpu MHz"]) / 1000.0, 1)
    except (KeyError, ValueError):
        return None


def host_device() -> Device:
    """The host CPU as a Device (see module docstring). DeviceSpecError if it is not a supported x86-64.

    Detected once per process and affinity mask (the spec's YAML, /proc and sysfs cost ~6 ms a call,
    most of a kernel-cache hit)."""
    return _detect_host(cpu_count())


@functools.lru_cache(maxsize=8)
def _detect_host(cores: int) -> Device:
    machine = platform.machine()
    flags = cpu_flags()
    specs = shipped_specs()
    if machine not in ("x86_64", "AMD64") or not ({"avx512f", "avx2"} & flags):
        raise DeviceSpecError(f"host: this CPU ({machine}) has neither AVX-512 nor AVX2; roller ships specs for "
                              f"x86-64 only ({', '.join(specs)}): pass --device PATH with a spec of your own")
    base_name = "x86-avx512" if "avx512f" in flags else "x86-avx2"
    base = load_spec_file(specs[base_name])
    info = _cpuinfo()
    clock = _clock_ghz(info) or base.units.clock_ghz
    ratio = clock / base.units.clock_ghz if base.units.clock_ghz else 1.0
    # Peaks and per-core cache bandwidths scale with the clock (bytes and flops per cycle are the core's).
    units = dataclasses.replace(base.units, count=cores, clock_ghz=clock,
                                peak_gflops={k: v * ratio for k, v in base.units.peak_gflops.items()},
                                tensor_peak_gflops={k: v * ratio for k, v in base.units.tensor_peak_gflops.items()})
    caches = sysfs_caches()
    levels = []
    for lv in base.levels:
        c = caches.get(lv.name)
        if not lv.shared:
            lv = dataclasses.replace(lv, bandwidth_gbps=lv.bandwidth_gbps * ratio,
                                     total_bandwidth_gbps=lv.bandwidth_gbps * ratio * cores)
        if c:
            repl = {"capacity_bytes": c["size"], "transaction_bytes": c["line"]}
            if c["sets"]:
                repl.update(banks=c["sets"], bank_bytes=c["line"])
            lv = dataclasses.replace(lv, **repl)
        levels.append(lv)
    model = info.get("model name", "unknown cpu")
    ident = repr((model, base_name, cores, sorted((k, v["size"]) for k, v in caches.items())))
    target = dict(base.target)
    mattr = sorted(feat for flag, feat in _LLVM_FEATURES.items() if flag in flags)
    if mattr:
        target["mattr"] = mattr
    return dataclasses.replace(
        base, name="host", units=units, levels=tuple(levels), target=target,
        description=f"{model}, {cores} cores, base spec {base_name}",
        source=f"host (detected, base {specs[base_name]})",
        fingerprint=hashlib.sha256(ident.encode()).hexdigest()[:12])
