"""RProgram: the constructor's output, a complete plan for one kernel, as plain data.

It is the contract between the policy (construct) and the back ends (codegen/<target>): the tile of
every per-unit memory level, how the top-level tiles spread over the execution units, which inputs are
packed, and what the model predicts. Serialisable with to_dict / from_dict.

Tile semantics (for codegen): ``tiles[i]`` is the rTile held at memory level ``levels[i]`` (nearest
compute first), giving a size for every axis of the expression. Along each axis a level's tile is a
multiple of the tile of the level before it. The last (top) tile is what one execution unit handles at a
time; it may overhang the axis extent (the padding waste is bounded by ``epsilon``). Reduction axes are
never split across units.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from roller.plan.gpuplan import GpuPlan


@dataclass(frozen=True)
class RProgram:
    """A constructed kernel plan (see module docstring)."""

    levels: tuple[str, ...]
    tiles: tuple[Mapping[str, int], ...]
    grid: Mapping[str, int]
    units: int
    waves: int
    vector_axis: str | None = None
    packed: tuple[str, ...] = ()
    storage_pad: Mapping[str, int] = field(default_factory=dict)  # tensor -> elements padded per row
    padded: tuple[str, ...] = ()      # axes run over whole top tiles on zero-padded copies (roller.plan.tails)
    predicated: tuple[str, ...] = ()  # overhanging axes left to bounds checks
    partial_sums: bool = False        # a reduced vector axis keeps vectors of partial sums (rfactor)
    layouts: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # packed input -> its dims' order
    inlined: tuple[str, ...] = ()     # staged inputs whose padding stage is inlined, not copied per top tile
    prepacked: tuple[str, ...] = ()   # constant inputs stored in the plan's tiles (roller.plan.prepack): no copy
    # every constant input (a model's weights), prepacked or not: where the other layers evict them between
    # calls (Device.constants_level) the model charges their bytes from there either way
    constants: tuple[str, ...] = ()
    # code generation's choices (roller.plan.choices decides them; codegen executes them or raises)
    balanced: bool = False            # the parallel grid is load-balanced (each unit steals when done)
    # prepacked inputs whose next top tile is software-prefetched: no cost term (it hides latency, the model
    # charges bandwidth; cost.estimate's docstring says why)
    prefetched: tuple[str, ...] = ()
    register_transposes: tuple[str, ...] = ()  # transposed packs copied in lanes x lanes register blocks
    # spatial axis whose grid loop is held out of the fused parallel loop (cost.held_grid_waves charges its waves)
    held_grid: str | None = None
    # reduce elements each lane of the register tile sums per instruction (roller.plan.dot): 4 where VNNI's
    # vpdpbusd runs a u8 x s8 matmul on a weight prepacked four deep; 1 otherwise
    dot_depth: int = 1
    # the register tile runs on AMX tile registers (roller.plan.dot.amx_tiles): 16-row int32 accumulator tiles
    # kept over the reduction of the tile above, tdpbusd 64 bytes deep; dot_depth stays 4 (the weight's layout)
    amx: bool = False
    predicted_seconds: float = math.nan
    compute_seconds: float = math.nan
    memory_seconds: Mapping[str, float] = field(default_factory=dict)  # level -> seconds to fill it
    footprint_bytes: Mapping[str, int] = field(default_factory=dict)   # level -> bytes one tile holds
    traffic_bytes: Mapping[str, int] = field(default_factory=dict)     # level -> bytes moved into it, whole op
    epsilon: float = 0.0
    # a GPU plan's choices beyond its tiles (roller.plan.gpuplan: its kind, threads, copy lanes, interleaved axes,
    # tensor-core fragments or block-reduction shape) and the model's view of its block; None on a CPU
    gpu: GpuPlan | None = None

    def tile(self, level: str) -> Mapping[str, int]:
        return self.tiles[self.levels.index(level)]

    @property
    def top(self) -> Mapping[str, int]:
        return self.tiles[-1]

    @property
    def key(self) -> tuple:
        """Identity of the plan: tiles and every layout choice (vector axis, packing, tails, partial sums,
        inlined padding stages, prepacked inputs), code generation's choices (balancing, prefetches, register
        transposes, the held grid loop, the dot depth, AMX) and a GPU plan's choices (``GpuPlan.key``)."""
        return (tuple(tuple(sorted(t.items())) for t in self.tiles), self.vector_axis, self.packed,
                tuple(sorted(self.storage_pad.items())), self.padded, self.predicated, self.partial_sums,
                tuple(sorted(self.layouts.items())), self.inlined, self.prepacked,
                self.balanced, self.prefetched, self.register_transposes, self.held_grid, self.dot_depth, self.amx) + \
            (() if self.gpu is None else (self.gpu.key,))

    def problem(self, axes: list[str]) -> str | None:
        """Why the plan breaks the tile contract for an expression with these axis names, or None:
        every level sizes every axis, with a positive multiple of the level below."""
        for lv, tile in zip(self.levels, self.tiles):
            missing = [a for a in axes if a not in tile]
            if missing:
                return (f"RProgram level {lv}: no tile size for axis(es) {missing}; "
                        f"every level must size every axis ({axes})")
        for a in axes:
            sizes = [t[a] for t in self.tiles]
            if any(s <= 0 for s in sizes) or any(hi % lo for lo, hi in zip(sizes, sizes[1:])):
                return (f"RProgram axis {a}: tile sizes {sizes} (levels {list(self.levels)}) must be "
                        f"positive and each a multiple of the previous level's")
        return None

    def to_dict(self) -> dict:
        d = {
            "levels": list(self.levels),
            "tiles": {lv: dict(t) for lv, t in zip(self.levels, self.tiles)},
            "grid": dict(self.grid), "units": self.units, "waves": self.waves,
            "vector_axis": self.vector_axis, "packed": list(self.packed), "storage_pad": dict(self.storage_pad),
            "padded": list(self.padded), "predicated": list(self.predicated), "partial_sums": self.partial_sums,
            "layouts": {k: list(v) for k, v in self.layouts.items()}, "inlined": list(self.inlined),
            "prepacked": list(self.prepacked), "constants": list(self.constants),
            "balanced": self.balanced, "prefetched": list(self.prefetched),
            "register_transposes": list(self.register_transposes), "held_grid": self.held_grid,
            "dot_depth": self.dot_depth, "amx": self.amx,
            "predicted_seconds": self.predicted_seconds, "compute_seconds": self.compute_seconds,
            "memory_seconds": dict(self.memory_seconds), "footprint_bytes": dict(self.footprint_bytes),
            "traffic_bytes": dict(self.traffic_bytes), "epsilon": self.epsilon,
        }
        if self.gpu is not None:
            d["gpu"] = self.gpu.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "RProgram":
        levels = tuple(d["levels"])
        return cls(
            levels=levels, tiles=tuple(dict(d["tiles"][lv]) for lv in levels), grid=dict(d["grid"]),
            units=int(d["units"]), waves=int(d["waves"]), vector_axis=d.get("vector_axis"),
            packed=tuple(d.get("packed", ())), storage_pad=dict(d.get("storage_pad", {})),
            padded=tuple(d.get("padded", ())), predicated=tuple(d.get("predicated", ())),
            partial_sums=bool(d.get("partial_sums", False)),
            layouts={k: tuple(v) for k, v in d.get("layouts", {}).items()}, inlined=tuple(d.get("inlined", ())),
            prepacked=tuple(d.get("prepacked", ())), constants=tuple(d.get("constants", ())),
            balanced=bool(d.get("balanced", False)), prefetched=tuple(d.get("prefetched", ())),
            register_transposes=tuple(d.get("register_transposes", ())), held_grid=d.get("held_grid"),
            dot_depth=int(d.get("dot_depth", 1)), amx=bool(d.get("amx", False)),
            predicted_seconds=float(d.get("predicted_seconds", math.nan)),
            compute_seconds=float(d.get("compute_seconds", math.nan)),
            memory_seconds=dict(d.get("memory_seconds", {})), footprint_bytes=dict(d.get("footprint_bytes", {})),
            traffic_bytes=dict(d.get("traffic_bytes", {})), epsilon=float(d.get("epsilon", 0.0)),
            gpu=GpuPlan.from_dict(d["gpu"]) if d.get("gpu") else None)

    def describe(self) -> str:
        """One line per level, e.g. ``L1: m=32 n=64 k=128``."""
        return "\n".join(f"{lv}: " + " ".join(f"{a}={s}" for a, s in t.items())
                         for lv, t in zip(self.levels, self.tiles))
