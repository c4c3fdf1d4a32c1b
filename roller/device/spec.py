"""Hardware description: memory levels and execution units, loaded from a YAML spec.

A device is a list of memory levels, nearest the compute first, plus its execution units (see
DESIGN.md). This module is policy: plain data, no compiler back end. The TVM target is kept as a dict
and resolved by codegen (``mcpu: host`` means "the CPU this process runs on").

Bandwidth convention: ``MemoryLevel.bandwidth_gbps`` is the rate at which ONE execution unit reads
data held in that level; ``total_bandwidth_gbps`` is what all units together get from it. A tile held at
level i is filled from level i+1, so its traffic is charged to level i+1's bandwidth.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from roller.dtypes import DTYPE_BYTES, dtype_bytes
from roller.device.fields import _Fields, _show, parse_size
from roller.device.model_constants import ModelConstants, family_model, model_constants, spec_dir
from roller.errors import DeviceSpecError

KINDS = ("cpu", "gpu")


@dataclass(frozen=True)
class MemoryLevel:
    """One level of the memory hierarchy.

    capacity_bytes is per unit when ``shared`` is false, for the whole device otherwise.
    usable_fraction is how much of the capacity a tile may fill (caches are not scratchpads: a tile
    that fills a whole cache thrashes it). banks × bank_bytes is the conflict period (GPU shared memory
    banks, CPU cache sets × line): a tile row whose stride is a multiple of it gets bank_bytes padding.
    """

    name: str
    capacity_bytes: int
    shared: bool
    transaction_bytes: int
    bandwidth_gbps: float
    total_bandwidth_gbps: float
    storage_scope: str
    usable_fraction: float = 1.0
    banks: int | None = None
    bank_bytes: int | None = None

    @property
    def usable_bytes(self) -> int:
        return int(self.capacity_bytes * self.usable_fraction)

    @property
    def keeps_data(self) -> bool:
        """Whether data stays in this level between kernel calls: a hardware cache of global memory (TVM
        scope ``global``) does; a scratchpad the kernel fills (a GPU's registers and shared memory) does not."""
        return self.storage_scope == "global"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ComputeUnits:
    """The execution units a kernel scales out over (CPU cores, GPU SMs).

    vector_bytes (CPU SIMD register width) or warp_threads (GPU) define the minimum schedulable unit;
    peak_gflops is per unit, by dtype. accumulators_for_peak is how many independent accumulator
    vectors keep the FMA pipes busy (FMA latency x pipes; 1 means the model ignores it). reorder_window is
    how many accumulating vector operations the out-of-order core holds in flight: a register tile whose
    accumulation chain is shorter than that overlaps with the next tiles' chains (a 3x3 pool's nine maxima),
    so it needs fewer accumulators of its own (0: no overlap, every tile's chain runs alone).
    prefetch_streams is how many strided streams (one a 4 KiB page) the unit's hardware prefetcher follows
    at once (0: unknown, the model assumes it follows every stream). speed_spread is how much slower than
    the others, on average, the slowest unit runs (a shared VM's cores: a co-tenant on one host core; 0 on
    a dedicated machine): a kernel split evenly waits for that unit's share (``model.imbalance_seconds``).
    """

    count: int
    peak_gflops: Mapping[str, float]
    vector_bytes: int | None = None
    warp_threads: int | None = None
    clock_ghz: float | None = None
    accumulators_for_peak: int = 1
    reorder_window: int = 0
    prefetch_streams: int = 0
    speed_spread: float = 0.0
    # matrix units (GPU tensor cores, x86 AMX), by input dtype
    tensor_peak_gflops: Mapping[str, float] = field(default_factory=dict)

    def lanes(self, dtype: str) -> int:
        """Elements one minimum schedulable unit handles: SIMD lanes on a CPU, warp size on a GPU."""
        if self.vector_bytes:
            return max(1, self.vector_bytes // dtype_bytes(dtype))
        return self.warp_threads or 1

    def peak(self, dtype: str) -> float:
        """Peak GFLOP/s of one unit for ``dtype`` (falls back to float32's when the spec has none)."""
        if dtype in self.peak_gflops:
            return float(self.peak_gflops[dtype])
        if "float32" in self.peak_gflops:
            return float(self.peak_gflops["float32"])
        raise DeviceSpecError(f"units.peak_gflops has no entry for {dtype!r} nor float32: add one")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["peak_gflops"] = dict(self.peak_gflops)
        if self.tensor_peak_gflops:
            d["tensor_peak_gflops"] = dict(self.tensor_peak_gflops)
        else:
            del d["tensor_peak_gflops"]
        return d


@dataclass(frozen=True)
class GpuLimits:
    """The per-block and per-SM limits of a GPU (``gpu:`` in its spec; CUDA's compute-capability table).

    They bound a thread block (threads, registers, shared memory) and decide how many blocks one SM holds
    at once (occupancy: ``roller.targets.cuda.rules.occupancy``). Shared memory is per block up to
    ``shared_per_block`` statically and ``shared_per_block_optin`` with the dynamic opt-in; per SM the
    blocks together get ``shared_per_sm``. Registers are allocated per warp in multiples of
    ``register_allocation_unit``.
    """

    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    registers_per_sm: int
    max_registers_per_thread: int
    register_allocation_unit: int
    shared_per_block: int
    shared_per_block_optin: int
    shared_per_sm: int
    l1_and_shared_per_sm: int | None = None

    def max_warps_per_sm(self, warp_threads: int) -> int:
        return self.max_threads_per_sm // warp_threads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)



GPU_LEVELS = ("local", "shared")  # storage scopes of a GPU's per-unit levels: per thread, per block


@dataclass(frozen=True)
class Device:
    """A device: execution units plus memory levels (nearest compute first) and its TVM target.

    ``calibration`` holds the measured figures (see roller.targets.cpu.calibrate) when they replaced the
    datasheet ones, else None; ``source`` says where the spec came from.
    """

    name: str
    kind: str
    target: Mapping[str, Any]
    units: ComputeUnits
    levels: tuple[MemoryLevel, ...]
    description: str = ""
    source: str = ""
    fingerprint: str = ""
    calibration: Mapping[str, Any] | None = field(default=None, compare=False)
    gpu: GpuLimits | None = None  # a GPU's block and SM limits (kind gpu only)
    # the level a kernel's constants (a model's weights) are read from at every call, where the model
    # compiler knows they do not stay in the caches between calls (roller.models.constants.constants_device); None:
    # like the rest of the data (roller.plan.cost.data_source)
    constants_level: str | None = None
    # the cost model's fitted or assumed figures (``model:``; see ModelConstants)
    model: ModelConstants = field(default_factory=ModelConstants)

    @property
    def calibrated(self) -> bool:
        return self.calibration is not None

    # the share of a cache level's calibrated bandwidth at which a swept working set still counts as read
    # from that cache (largest_cached_bytes)
    CACHED_SHARE = 0.75

    def largest_cached_bytes(self) -> int:
        """Bytes one unit can read again and again and still find in a cache: the largest working set the
        calibration sweep (one unit) read at CACHED_SHARE or more of the last cache level's bandwidth;
        without a sweep, that level's usable bytes. On a virtual machine sysfs reports the host's cache
        (here an L3 of 260 MB), while the sweep reads at L3 speed only up to 64 MB (16 MB: 30 GB/s, 64 MB:
        24, 128 MB: 16, memory's)."""
        if len(self.levels) < 2:
            return 0
        last = self.levels[-2]  # the last cache: every level but the memory
        sweep = ((self.calibration or {}).get("sweep") or {}).get("one") or []
        fits = [row["bytes"] for row in sweep if row.get("read", 0) >= self.CACHED_SHARE * last.bandwidth_gbps]
        return max(fits) if fits else last.usable_bytes

    def level(self, name: str) -> MemoryLevel:
        for lv in self.levels:
            if lv.name == name:
                return lv
        raise DeviceSpecError(f"device {self.name!r} has no memory level {name!r}: "
                              f"it has {', '.join(lv.name for lv in self.levels)}")

    @property
    def private_levels(self) -> tuple[MemoryLevel, ...]:
        """The per-unit levels, nearest compute first: where tiles are built up (scale-up)."""
        return tuple(lv for lv in self.levels if not lv.shared)

    @property
    def shared_levels(self) -> tuple[MemoryLevel, ...]:
        return tuple(lv for lv in self.levels if lv.shared)

    def run_efficiency(self, row_bytes: int) -> float:
        """The share of the bandwidth a stream of rows of ``row_bytes`` gets from the bottom of the memory
        hierarchy, where rows are strided (a tile taking part of each row of a tensor), from the calibrated
        small-transfer sweep (``roller calibrate``: rows 256 B apart; 64 B rows gave 42% here, 128 B 81%: the
        hardware fetches lines in pairs); interpolated, 1 from the sweep's stride on. 1 when not calibrated."""
        sweep = (self.calibration or {}).get("small_transfer") or {}
        points = sorted((int(r["bytes"]), float(r["efficiency"])) for r in sweep.get("rows", ())
                        if r.get("efficiency"))
        if not points:
            return 1.0
        points.append((max(int(sweep.get("stride_bytes", 0)), points[-1][0] + 1), 1.0))
        if row_bytes <= points[0][0]:
            return points[0][1]
        for (b0, e0), (b1, e1) in zip(points, points[1:]):
            if row_bytes <= b1:
                return min(1.0, e0 + (e1 - e0) * (row_bytes - b0) / (b1 - b0))
        return 1.0

    def with_calibration(self, calibration: Mapping[str, Any]) -> "Device":
        """A copy whose peaks and bandwidths are replaced by measured ones.

        ``calibration`` has ``peak_gflops`` (dtype → per-unit GFLOP/s), where measured
        ``tensor_peak_gflops`` (the matrix unit's, by input dtype) and ``bandwidth_gbps``
        (level → {"unit": GB/s, "total": GB/s}); levels or dtypes it lacks keep datasheet values. Its
        ``clock_ghz`` (the clock when it was measured; older files have none) replaces the spec's, so
        that machines sharing one calibration file share every figure of the model. Its ``model`` (name ->
        {"value", "source", ...}: the cost model's terms the probes measured) replaces those of the spec.
        """
        def measured(peaks: Mapping[str, float], key: str) -> dict[str, float]:
            return {**peaks, **{dt: float(v) for dt, v in (calibration.get(key) or {}).items()}}

        peaks = measured(self.units.peak_gflops, "peak_gflops")
        tensor = measured(self.units.tensor_peak_gflops, "tensor_peak_gflops")
        bws = calibration.get("bandwidth_gbps") or {}
        levels = []
        for lv in self.levels:
            m = bws.get(lv.name)
            if m:
                lv = dataclasses.replace(lv, bandwidth_gbps=float(m.get("unit", lv.bandwidth_gbps)),
                                         total_bandwidth_gbps=float(m.get("total", lv.total_bandwidth_gbps)))
            levels.append(lv)
        clock = calibration.get("clock_ghz") or self.units.clock_ghz
        model = self.model
        terms = calibration.get("model") or {}
        if terms:  # the cost model's terms the calibration's probes measured replace the spec's, value and source
            model = dataclasses.replace(
                model, **{name: e["value"] for name, e in terms.items()},
                sources={**model.sources, **{name: e["source"] for name, e in terms.items()}})
        units = dataclasses.replace(self.units, peak_gflops=peaks, tensor_peak_gflops=tensor, clock_ghz=clock)
        return dataclasses.replace(self, units=units,
                                   levels=tuple(levels), calibration=dict(calibration), model=model)

    def to_dict(self) -> dict:
        d = {
            "name": self.name, "kind": self.kind, "description": self.description,
            "target": dict(self.target), "units": self.units.to_dict(),
            "levels": [lv.to_dict() for lv in self.levels], "source": self.source,
            "fingerprint": self.fingerprint, "calibrated": self.calibrated,
        }
        if self.gpu is not None:
            d["gpu"] = self.gpu.to_dict()
        d["model"] = self.model.to_dict()
        return d


# ---------------------------------------------------------------------------------------------
# YAML parsing with messages that name the file and the field.


def device_from_dict(data: Any, where: str = "<spec>") -> Device:
    """Builds and validates a Device from parsed YAML; errors name ``where`` and the field."""
    top = _Fields(data, where, "")
    top.unknown({"name", "kind", "description", "target", "units", "levels", "base", "gpu", "model"})
    name = top.get("name", "str")
    kind = top.get("kind", "str")
    if kind not in KINDS:
        raise top.fail("kind", f"one of {', '.join(KINDS)}")
    target = dict(top.get("target", "map"))
    if not isinstance(target.get("kind"), str):
        raise DeviceSpecError(f"{where}: target.kind: expected a TVM target kind such as 'llvm' or 'cuda', "
                              f"got {_show(target.get('kind'))}")

    u = top.sub("units")
    u.unknown({"count", "peak_gflops", "vector_bytes", "warp_threads", "clock_ghz", "accumulators_for_peak",
               "reorder_window", "prefetch_streams", "speed_spread", "tensor_peak_gflops"})
    peaks = _peaks(u, "peak_gflops", where)
    spread = u.get("speed_spread", "float", 0.0, positive=False)
    if not 0.0 <= spread < 1.0:
        raise u.fail("speed_spread", "a number from 0 (cores at one speed) up to but not including 1")
    if u.get("reorder_window", "int", 0, positive=False) < 0:
        raise u.fail("reorder_window", "a whole number of operations, 0 or more (0: no overlap between tiles)")
    units = ComputeUnits(
        count=u.get("count", "int"), peak_gflops=peaks,
        vector_bytes=u.get("vector_bytes", "int", None), warp_threads=u.get("warp_threads", "int", None),
        clock_ghz=u.get("clock_ghz", "float", None), accumulators_for_peak=u.get("accumulators_for_peak", "int", 1),
        reorder_window=u.get("reorder_window", "int", 0, positive=False),
        prefetch_streams=u.get("prefetch_streams", "int", 0), speed_spread=spread,
        tensor_peak_gflops=_peaks(u, "tensor_peak_gflops", where) if "tensor_peak_gflops" in u.data else {})
    if (units.vector_bytes is None) == (units.warp_threads is None):
        raise DeviceSpecError(f"{where}: units: give exactly one of vector_bytes (CPU SIMD width) "
                              f"or warp_threads (GPU warp size)")

    levels = []
    for i, raw in enumerate(top.get("levels", "list")):
        f = _Fields(raw, where, f"levels[{i}]")
        f.unknown({"name", "capacity", "shared", "transaction_bytes", "bandwidth_gbps", "total_bandwidth_gbps",
                   "storage_scope", "usable_fraction", "banks", "bank_bytes"})
        lname = f.get("name", "str")
        cap = parse_size(f.data.get("capacity"))
        if cap is None:
            raise f.fail("capacity", "a size in bytes such as 49152, '48K' or '2MiB'")
        shared = f.get("shared", "bool")
        bw = f.get("bandwidth_gbps", "float")
        total = f.get("total_bandwidth_gbps", "float", None)
        if total is None:
            if shared:
                raise f.fail("total_bandwidth_gbps", "a positive number (a shared level needs its all-units bandwidth)")
            total = bw * units.count
        banks, bank_bytes = f.get("banks", "int", None), f.get("bank_bytes", "int", None)
        if (banks is None) != (bank_bytes is None):
            raise DeviceSpecError(f"{where}: levels[{i}]: give both banks and bank_bytes, or neither")
        levels.append(MemoryLevel(
            name=lname, capacity_bytes=cap, shared=shared, transaction_bytes=f.get("transaction_bytes", "int"),
            bandwidth_gbps=bw, total_bandwidth_gbps=total, storage_scope=f.get("storage_scope", "str"),
            usable_fraction=f.get("usable_fraction", "fraction", 1.0), banks=banks, bank_bytes=bank_bytes))
    names = [lv.name for lv in levels]
    if len(set(names)) != len(names):
        raise DeviceSpecError(f"{where}: levels: names must be unique, got {', '.join(names)}")
    if levels[0].shared:
        raise DeviceSpecError(f"{where}: levels[0] ({levels[0].name}): the level nearest compute must be per unit "
                              f"(shared: false)")
    seen_shared = False
    for i, lv in enumerate(levels):
        if seen_shared and not lv.shared:
            raise DeviceSpecError(f"{where}: levels[{i}] ({lv.name}): a per-unit level cannot follow a shared one; "
                                  f"list levels nearest compute first")
        seen_shared |= lv.shared
    if not levels[-1].shared:
        raise DeviceSpecError(f"{where}: levels: the last level (main memory) must be shared: true")
    gpu = _gpu_limits(top, kind, units, levels, where)
    model = model_constants(top.data.get("model"), where, base=family_model(kind))
    return Device(name=name, kind=kind, target=target, units=units, levels=tuple(levels),
                  description=str(top.data.get("description", "")), source=where, gpu=gpu, model=model)


def _peaks(u: "_Fields", key: str, where: str) -> dict[str, float]:
    """A mapping dtype -> GFLOP/s per unit (``units.peak_gflops`` / ``units.tensor_peak_gflops``)."""
    f = u.sub(key)
    peaks = {}
    for dt in f.data:
        if dt not in DTYPE_BYTES:
            raise DeviceSpecError(f"{where}: units.{key}.{dt}: unknown dtype; use one of {', '.join(DTYPE_BYTES)}")
        peaks[dt] = f.get(dt, "float")
    if not peaks:
        raise u.fail(key, "a mapping dtype -> GFLOP/s per unit with at least one entry")
    return peaks


def _gpu_limits(top: "_Fields", kind: str, units: ComputeUnits, levels: list[MemoryLevel],
                where: str) -> GpuLimits | None:
    """The ``gpu:`` section of a GPU spec, checked against the units and levels; None for a CPU."""
    if kind != "gpu":
        if "gpu" in top.data:
            raise DeviceSpecError(f"{where}: gpu: only a spec of kind gpu has GPU limits; remove the section "
                                  f"or set kind: gpu")
        return None
    if units.warp_threads is None:
        raise DeviceSpecError(f"{where}: units.warp_threads: a GPU spec needs its warp size (32 on NVIDIA)")
    g = top.sub("gpu")
    sizes = ("shared_per_block", "shared_per_block_optin", "shared_per_sm", "l1_and_shared_per_sm")
    g.unknown({f.name for f in dataclasses.fields(GpuLimits)})
    values: dict[str, int | None] = {}
    for f in dataclasses.fields(GpuLimits):
        optional = f.default is None
        if f.name in sizes:
            raw = g.data.get(f.name)
            values[f.name] = None if raw is None and optional else parse_size(raw)
            if values[f.name] is None and not (raw is None and optional):
                raise g.fail(f.name, "a size in bytes such as 49152 or '48K'")
        else:
            values[f.name] = g.get(f.name, "int")
    lim = GpuLimits(**values)
    warp = units.warp_threads
    private = [lv for lv in levels if not lv.shared]
    problems = []
    if lim.max_threads_per_block % warp:
        problems.append(f"gpu.max_threads_per_block ({lim.max_threads_per_block}) is not a multiple of the warp "
                        f"size ({warp})")
    if lim.max_threads_per_sm < lim.max_threads_per_block:
        problems.append("gpu.max_threads_per_sm is below gpu.max_threads_per_block")
    if not lim.shared_per_block <= lim.shared_per_block_optin <= lim.shared_per_sm:
        problems.append("gpu: expected shared_per_block <= shared_per_block_optin <= shared_per_sm")
    if lim.registers_per_sm < lim.max_registers_per_thread * warp:
        problems.append("gpu.registers_per_sm cannot hold one warp at max_registers_per_thread")
    if tuple(lv.storage_scope for lv in private) != GPU_LEVELS:
        problems.append(f"levels: a GPU has two per-unit levels, registers per thread (storage_scope: local) "
                        f"then shared memory per block (storage_scope: shared); got "
                        f"{', '.join(f'{lv.name} ({lv.storage_scope})' for lv in private)}")
    elif private[1].capacity_bytes > lim.shared_per_block_optin:
        problems.append(f"levels: {private[1].name}'s capacity exceeds gpu.shared_per_block_optin")
    elif private[0].capacity_bytes > lim.max_registers_per_thread * 4:
        problems.append(f"levels: {private[0].name}'s capacity exceeds gpu.max_registers_per_thread x 4 bytes")
    if problems:
        raise DeviceSpecError(f"{where}: " + "; ".join(problems))
    return lim


# ---------------------------------------------------------------------------------------------
# Finding specs.


def shipped_specs() -> dict[str, Path]:
    """Name → path of every shipped spec (file stem)."""
    return {p.stem: p for p in sorted(spec_dir().glob("*.yaml"))}


def load_spec_file(path: str | os.PathLike) -> Device:
    """Parses one YAML spec file; DeviceSpecError names the file and the field on any problem."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise DeviceSpecError(f"{p}: cannot read the spec ({e.strerror or e}); check the path") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise DeviceSpecError(f"{p}: not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None
    if isinstance(data, Mapping) and "base" in data:
        return _load_with_base(data, p)
    return device_from_dict(data, str(p))


def _deep_merge(base: Mapping, over: Mapping) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def _load_with_base(data: Mapping, path: Path) -> Device:
    """A spec with ``base: NAME`` overrides fields of a shipped spec (levels matched by name)."""
    base_name = data["base"]
    specs = shipped_specs()
    if base_name not in specs:
        raise DeviceSpecError(f"{path}: base: no shipped spec {base_name!r}; shipped: {', '.join(specs)}")
    base = yaml.safe_load(specs[base_name].read_text())
    merged = _deep_merge(base, {k: v for k, v in data.items() if k not in ("base", "levels")})
    if "levels" in data:
        if not isinstance(data["levels"], list):
            raise DeviceSpecError(f"{path}: levels: expected a list of level overrides with a name each")
        by_name = {lv["name"]: lv for lv in merged["levels"]}
        for i, lv in enumerate(data["levels"]):
            if not isinstance(lv, Mapping) or lv.get("name") not in by_name:
                raise DeviceSpecError(f"{path}: levels[{i}]: an override must name one of the base's levels "
                                      f"({', '.join(by_name)})")
            by_name[lv["name"]].update(lv)
    return device_from_dict(merged, str(path))


