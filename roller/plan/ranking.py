"""The model's prediction for one plan (``Estimate``) and how plans are ranked by it (``rank``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence


@dataclass(frozen=True)
class Estimate:
    """What the model predicts for one plan; memory and traffic figures are per private level."""

    seconds: float
    compute_seconds: float
    memory_seconds: Mapping[str, float] = field(default_factory=dict)
    traffic_bytes: Mapping[str, int] = field(default_factory=dict)
    footprint_bytes: Mapping[str, int] = field(default_factory=dict)
    tiles: int = 1
    units: int = 1
    waves: int = 1
    base_seconds: float = 0.0  # seconds before the wait for the slowest unit (residency.imbalance_seconds)
    tile_seconds: float = 0.0  # one top tile's time (the slowest of compute and each level's memory, overheads)


TIE = 1.02  # predictions closer than this ratio are a tie: the model is not that precise


def rank(items: Sequence, seconds, memory_seconds, body_runs=None) -> list:
    """``items`` best first by the model: the fastest prediction, except that among predictions within
    TIE of it the plan with the least total memory time (traffic over bandwidth, summed over levels)
    goes first, and among those equal in that too the one whose register tile's body runs the fewest times
    (``body_runs(item)``, when given): its loop control and bounds checks serve more vectors, which the
    model does not count (docs/design-notes.md#ranking-rank).
    ``seconds(item)`` and ``memory_seconds(item)`` (level -> seconds) read an item."""
    remaining = sorted(items, key=seconds)
    out = []
    while remaining:
        bound = seconds(remaining[0]) * TIE
        tied = [x for x in remaining if seconds(x) <= bound]
        pick = min(tied, key=lambda x: (sum(memory_seconds(x).values()), body_runs(x) if body_runs else 0))
        out.append(pick)
        remaining.remove(pick)
    return out
