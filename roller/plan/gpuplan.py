"""GpuPlan: a GPU plan's choices beyond its tiles, as typed plain data (``RProgram.gpu``).

A GPU RProgram (``roller.targets.cuda.construct``) has a thread (or warp) tile and a block tile; how the code
generator turns them into a kernel depends on the plan's kind:

- ``GpuKind.TILES``: each thread computes its tile's elements, running their reduction serially; every input
  is staged in shared memory per reduction step by a cooperative copy (``copy_lanes``: elements per load);
  the thread's tile is strided by the block's threads along ``interleaved`` (virtual threads);
- ``GpuKind.BLOCK_REDUCTION``: the threads of a block share rows (``BlockReduction``: ``rows`` rows a
  block, ``threads`` threads along the reduction), nothing staged;
- ``GpuKind.TENSOR_CORE``: fp16 WMMA fragments (``TensorCoreLayout``: warps of a block, fragments of a warp
  and of a reduction step), inputs staged with the copy lanes of ``copy_lanes``.

``key`` holds what changes the generated code (kind, threads a block, copy lanes, interleaved axes, the
fragment layout, the reduction shape); ``model`` holds what the model predicted for the block (registers,
shared memory, occupancy, reduction steps), which is not part of the plan's identity. Pure data, no TVM.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Mapping


class GpuKind(Enum):
    """How a GPU plan's tiles become a kernel (see module doc)."""

    TILES = "tiles"
    BLOCK_REDUCTION = "block_reduction"
    TENSOR_CORE = "tensor_core"


@dataclass(frozen=True)
class TensorCoreLayout:
    """A tensor-core plan's fragments (``roller.targets.cuda.tensorcore``): ``warps_m`` x ``warps_n`` warps a
    block, ``frags_m`` x ``frags_n`` 16 x 16 fragments a warp, ``frags_k`` fragments of reduction a step."""

    warps_m: int
    warps_n: int
    frags_m: int
    frags_n: int
    frags_k: int

    def to_dict(self) -> dict:
        return {"warps_m": self.warps_m, "warps_n": self.warps_n, "frags_m": self.frags_m,
                "frags_n": self.frags_n, "frags_k": self.frags_k}

    @classmethod
    def from_dict(cls, d: Mapping) -> "TensorCoreLayout":
        return cls(**{k: int(d[k]) for k in ("warps_m", "warps_n", "frags_m", "frags_n", "frags_k")})


@dataclass(frozen=True)
class BlockReduction:
    """A block-level reduction's shape (``roller.targets.cuda.reduce``): ``rows`` rows a block, each reduced by
    ``threads`` threads (whole warps)."""

    threads: int
    rows: int

    def to_dict(self) -> dict:
        return {"threads": self.threads, "rows": self.rows}

    @classmethod
    def from_dict(cls, d: Mapping) -> "BlockReduction":
        return cls(threads=int(d["threads"]), rows=int(d["rows"]))


@dataclass(frozen=True)
class BlockModel:
    """The block as the model sees it (predictions, not choices): registers a thread (the model's estimate),
    shared bytes, blocks and warps resident per SM and what limits them, reduction steps of a block."""

    registers: int
    shared_bytes: int
    blocks_per_sm: int
    warps_per_sm: int
    limited_by: str
    reduction_steps: int

    def to_dict(self) -> dict:
        return {"registers": self.registers, "shared_bytes": self.shared_bytes, "blocks_per_sm": self.blocks_per_sm,
                "warps_per_sm": self.warps_per_sm, "limited_by": self.limited_by,
                "reduction_steps": self.reduction_steps}

    @classmethod
    def from_dict(cls, d: Mapping) -> "BlockModel":
        return cls(registers=int(d["registers"]), shared_bytes=int(d["shared_bytes"]),
                   blocks_per_sm=int(d["blocks_per_sm"]), warps_per_sm=int(d["warps_per_sm"]),
                   limited_by=str(d["limited_by"]), reduction_steps=int(d["reduction_steps"]))


@dataclass(frozen=True)
class GpuPlan:
    """A GPU plan's choices and the model's view of its block (see module doc). ``tensor_core`` is set exactly
    for a TENSOR_CORE plan, ``reduction`` exactly for a BLOCK_REDUCTION plan."""

    kind: GpuKind
    threads: int                                                      # threads a block
    model: BlockModel
    copy_lanes: Mapping[str, int] = field(default_factory=dict)      # staged input -> elements a load
    interleaved: tuple[str, ...] = ()                                 # axes a thread's tile is strided along
    tensor_core: TensorCoreLayout | None = None
    reduction: BlockReduction | None = None

    def __post_init__(self):
        if not isinstance(self.kind, GpuKind):
            raise TypeError(f"GpuPlan.kind must be a GpuKind, got {self.kind!r}")
        if (self.tensor_core is not None) != (self.kind is GpuKind.TENSOR_CORE):
            raise ValueError(f"GpuPlan of kind {self.kind.value}: a tensor-core layout goes with (and only with) "
                             f"kind tensor_core, got {self.tensor_core}")
        if (self.reduction is not None) != (self.kind is GpuKind.BLOCK_REDUCTION):
            raise ValueError(f"GpuPlan of kind {self.kind.value}: a block-reduction shape goes with (and only "
                             f"with) kind block_reduction, got {self.reduction}")

    @property
    def key(self) -> tuple:
        """The choices the generated code depends on (not the model's predictions)."""
        return (self.kind.value, self.threads, tuple(sorted(self.copy_lanes.items())), self.interleaved,
                None if self.tensor_core is None else tuple(self.tensor_core.to_dict().values()),
                None if self.reduction is None else (self.reduction.threads, self.reduction.rows))

    def to_dict(self) -> dict:
        d = {"kind": self.kind.value, "threads": self.threads, "copy_lanes": dict(self.copy_lanes),
             "interleaved": list(self.interleaved)}
        if self.tensor_core is not None:
            d["tensor_core"] = self.tensor_core.to_dict()
        if self.reduction is not None:
            d["reduction"] = self.reduction.to_dict()
        d["model"] = self.model.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "GpuPlan":
        return cls(kind=GpuKind(d["kind"]), threads=int(d["threads"]), model=BlockModel.from_dict(d["model"]),
                   copy_lanes={k: int(v) for k, v in d.get("copy_lanes", {}).items()},
                   interleaved=tuple(d.get("interleaved", ())),
                   tensor_core=TensorCoreLayout.from_dict(d["tensor_core"]) if d.get("tensor_core") else None,
                   reduction=BlockReduction.from_dict(d["reduction"]) if d.get("reduction") else None)
