"""The cost model's per-device figures (a spec's ``model:`` section, over the defaults of its family in
``hwspecs/families/<kind>.yaml``): each a value with its source, so that calibration can replace them."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import yaml

from roller.device.fields import _Fields
from roller.errors import DeviceSpecError


@dataclass(frozen=True)
class ModelConstants:
    """The cost model's fitted or assumed figures (``model:`` in a spec; defaults per kind in
    ``hwspecs/families/<kind>.yaml``), each with ``sources[name]`` saying where it comes from.

    CPU terms (``roller.plan.cost`` and its terms) are None on a GPU and GPU terms (``roller.targets.cuda``)
    on a CPU: each family's file gives its own. Calibration may later replace entries (value and source).
    """

    # CPU (roller.plan): cycles of a compute unit's clock, or seconds, or shares, per term
    tile_overhead_cycles: int | None = None
    parallel_launch_cycles: int | None = None
    register_load_share: float | None = None
    false_sharing_seconds: float | None = None
    transpose_cycles: float | None = None
    register_transpose_cycles: float | None = None
    fold_cycles: float | None = None
    inline_check_cycles: float | None = None
    untracked_line_cycles: int | None = None
    prefetch_run_bytes: int | None = None
    interleaved_line_cycles: int | None = None
    interleaved_min_run_lines: int | None = None
    workspace_tile_cycles: int | None = None
    sliced_line_cycles: float | None = None
    replicate_cycles: float | None = None
    stage_copy_cycles: float | None = None
    stage_vector_copy_cycles: float | None = None
    resident_full: float | None = None
    resident_none: float | None = None
    balance_min_seconds: float | None = None
    accumulator_cycles: float | None = None
    epilogue_op_cycles: float | None = None
    held_grid_wave_share: float | None = None
    software_prefetch_gain: float | None = None
    # GPU (roller.targets.cuda)
    warps_for_peak: int | None = None
    sync_cycles: int | None = None
    launch_seconds: float | None = None
    shuffle_cycles: int | None = None
    reduce_registers: int | None = None
    loads_in_flight: int | None = None
    l2_latency_cycles: int | None = None
    dram_latency_cycles: int | None = None
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.name != "sources"]

    def to_dict(self) -> dict:
        """name -> {"value", "source"} for every figure set (the shape of a spec's ``model:`` section)."""
        return {n: {"value": getattr(self, n), "source": self.sources.get(n, "")}
                for n in self.names() if getattr(self, n) is not None}


# the kind each ModelConstants figure is checked as (_Fields.get); the rest are positive numbers
_MODEL_KINDS = {f.name: ("int" if f.type.startswith("int") else "float") for f in dataclasses.fields(ModelConstants)
                if f.name != "sources"}
_MODEL_KINDS["register_load_share"] = "fraction"
_MODEL_KINDS["held_grid_wave_share"] = "share"  # 0 turns the term off


def model_constants(data: Any, where: str, base: ModelConstants | None = None) -> ModelConstants:
    """A ``model:`` section (name -> {value, source}) over ``base``'s figures: an entry replaces the base's
    whole, value and source together. DeviceSpecError names the file and the entry on an unknown name, a
    missing or extra field, or a value of the wrong kind."""
    values = {n: getattr(base, n) for n in ModelConstants.names()} if base is not None else {}
    sources = dict(base.sources) if base is not None else {}
    if data is None:
        return ModelConstants(**values, sources=sources)
    top = _Fields(data, where, "model")
    top.unknown(set(_MODEL_KINDS))
    for name in top.data:
        entry = top.sub(name)
        entry.unknown({"value", "source"})
        values[name] = entry.get("value", _MODEL_KINDS[name])
        sources[name] = entry.get("source", "str")
    full, none = values.get("resident_full"), values.get("resident_none")
    if full is not None and none is not None and not none > full:
        raise DeviceSpecError(f"{where}: model.resident_none ({none}) must exceed model.resident_full ({full})")
    return ModelConstants(**values, sources=sources)


_FAMILY_MODELS: dict[str, ModelConstants] = {}


def family_model(kind: str) -> ModelConstants:
    """The default ``model:`` figures of a kind's specs, from ``<spec_dir>/families/<kind>.yaml`` (empty
    where there is no such file)."""
    if kind not in _FAMILY_MODELS:
        path = spec_dir() / "families" / f"{kind}.yaml"
        data = None
        if path.is_file():
            try:
                data = yaml.safe_load(path.read_text())
            except yaml.YAMLError as e:
                raise DeviceSpecError(f"{path}: not valid YAML: {getattr(e, 'problem', None) or e}") from None
            data = _Fields(data, str(path), "").get("model", "map")
        _FAMILY_MODELS[kind] = model_constants(data, str(path))
    return _FAMILY_MODELS[kind]


def spec_dir() -> Path:
    """The folder of shipped specs (``hwspecs/`` at the project's top level): the one beside this package
    when running from a source tree (so a checkout's specs win over another checkout's editable install),
    else the installed ``roller.hwspecs``."""
    beside = Path(__file__).resolve().parents[2] / "hwspecs"
    if (beside / "__init__.py").is_file() and any(beside.glob("*.yaml")):
        return beside
    return Path(str(resources.files("roller.hwspecs")))
