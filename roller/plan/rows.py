"""Row-wise functions with several reductions (softmax, layer norm, RMS norm, a mean and what follows it):
the function as plain data and its plan. No compiler here; :func:`roller.tir.analysis.analyze_rows` fills a
:class:`RowFunction` from a PrimFunc and :mod:`roller.targets.cpu.rows` executes a :class:`RowPlan`.

Such a function keeps its blocks (one :class:`roller.plan.expr.Expr` per block): unlike a convolution's
epilogue they cannot be folded into one main block, since each reduction must finish a row before the
next block reads its result. The plan runs every block row by row at the last block's row loop, rows
over the cores, columns in vectors: the only choices are which elementwise blocks to inline, which
reductions keep vector partial sums, and which column loops end in a partial vector.
"""
from __future__ import annotations

from dataclasses import dataclass

from roller.device.spec import Device
from roller.plan.expr import Expr
from roller.plan.cost import cycle_seconds, launch_seconds

ELEMENTWISE, REDUCTION, PER_ROW, PROLOGUE = "elementwise", "reduction", "per_row", "prologue"

# An intermediate elementwise block read by several blocks is inlined into them only while it is at most
# this many flops a point (a subtraction, a cast); dearer ones (exp: ~20) are computed once into the
# row buffer and read back from L1.
INLINE_FLOPS = 2
# Cycles a reduction spends on each step of summing its partial sums across the lanes (a dependent
# shuffle and add, :func:`lane_tree`); once per row.
LANE_STEP_CYCLES = 4.0


@dataclass(frozen=True)
class RowBlock:
    """One block of a row-wise function, in execution order.

    ``kind`` is ELEMENTWISE (over rows and columns), REDUCTION (over the columns, one value a row) or
    PER_ROW (a value a row from per-row values: ``sum / n``, ``rsqrt``) or PROLOGUE (elementwise over
    something else than the rows, e.g. a weight's cast: always inlined). ``expr`` describes the block
    alone (its axes, accesses and flops); ``readers`` counts the blocks reading what it writes (0 for
    the block writing the function's output); ``output_ndim`` is the rank of the buffer it writes.
    """

    name: str
    kind: str
    expr: Expr
    readers: int
    output_ndim: int
    writes_output: bool = False


@dataclass(frozen=True)
class RowFunction:
    """A function whose blocks share their leading ``row_axes`` spatial axes (``rows`` points) and run
    over the remaining ``cols`` points of each row; ``params_bytes`` is what it reads and writes in
    memory (its parameters), ``dtype`` the output's."""

    name: str
    row_axes: int
    rows: int
    cols: int
    dtype: str
    blocks: tuple[RowBlock, ...]
    params_bytes: int

    @property
    def reductions(self) -> tuple[RowBlock, ...]:
        return tuple(b for b in self.blocks if b.kind == REDUCTION)

    def block(self, name: str) -> RowBlock:
        return next(b for b in self.blocks if b.name == name)


@dataclass(frozen=True)
class RowPlan:
    """Everything the generated code of a row-wise function depends on.

    ``blocks`` are the blocks left after inlining ``inlined`` (execution order, the last writes the
    output). Elementwise blocks run in vectors of ``lanes``; where a row is not a whole number of them
    (``tail``) lowering splits the last, partial vector off. ``vector_reductions`` keep
    ``reduction_lanes`` partial sums (rfactor) in a buffer of rank ``reduction_ndim[name] + 1`` (lanes
    last). Where ``reduction_cols`` exceeds the row, the reductions run over that many columns, whole
    vectors, the padding lanes reading the reduction's identity (a partial last vector would need a
    predicate, which TVM's compute_at drops). The other reductions run scalar. ``parallel``: the fused
    row loop runs over the cores (``row_axes == 0``: one row, no row loop).
    """

    row_axes: int
    lanes: int
    blocks: tuple[str, ...]
    inlined: tuple[str, ...]
    reductions: tuple[str, ...]
    vector_reductions: tuple[str, ...]
    reduction_lanes: int
    reduction_cols: int
    reduction_ndim: dict
    tail: bool
    parallel: bool
    predicted_seconds: float

    def to_dict(self) -> dict:
        return {"row_axes": self.row_axes, "lanes": self.lanes, "blocks": list(self.blocks),
                "inlined": list(self.inlined), "vector_reductions": list(self.vector_reductions),
                "reduction_lanes": self.reduction_lanes, "reduction_cols": self.reduction_cols,
                "tail": self.tail, "parallel": self.parallel, "predicted_seconds": self.predicted_seconds}


def reduction_lanes(cols: int, lanes: int) -> tuple[int, int]:
    """(partial sums per row, columns the reduction runs over): the largest divisor of the row that is
    at most one vector and at least half of one, over the row (the whole row when it is shorter than a
    vector); where there is none, one vector over the row padded to whole vectors."""
    if cols <= lanes:
        return cols, cols
    d = next((d for d in range(lanes, lanes // 2 - 1, -1) if cols % d == 0), None)
    return (d, cols) if d else (lanes, -(-cols // lanes) * lanes)


def lane_tree(lanes: int) -> tuple[int, ...]:
    """The partial sums left after each vector step of summing ``lanes`` of them across the lanes: the
    upper half added onto the lower while they are an even number of at least 4 (16 -> 8, 4, 2); the
    last ones are summed in scalar."""
    steps = []
    while lanes >= 4 and lanes % 2 == 0:
        lanes //= 2
        steps.append(lanes)
    return tuple(steps)


def plan_rows(fn: RowFunction, device: Device) -> RowPlan:
    """The plan of ``fn`` on ``device`` (see the module docstring) and its predicted time."""
    lanes = device.units.lanes(fn.dtype)
    inlined = tuple(b.name for b in fn.blocks[:-1]
                    if b.kind == PROLOGUE or (b.kind == ELEMENTWISE and not b.writes_output
                                              and (b.readers == 1 or b.expr.flops_per_point <= INLINE_FLOPS)))
    kept = tuple(b.name for b in fn.blocks if b.name not in inlined)
    reductions = tuple(b.name for b in fn.reductions)
    red_lanes, red_cols = reduction_lanes(fn.cols, lanes)
    if red_cols > fn.cols and any(len(b.expr.reduce_axes) != 1 for b in fn.reductions):
        red_lanes, red_cols = 1, fn.cols  # padding extends a single reduction loop only
    vector = reductions if red_lanes > 1 else ()
    return RowPlan(row_axes=fn.row_axes, lanes=lanes, blocks=kept, inlined=inlined, reductions=reductions,
                   vector_reductions=vector, reduction_lanes=red_lanes, reduction_cols=red_cols,
                   reduction_ndim={b.name: b.output_ndim for b in fn.reductions},
                   tail=fn.cols > lanes and fn.cols % lanes != 0, parallel=fn.rows > 1,
                   predicted_seconds=predict_rows(fn, device, inlined, vector, red_lanes, red_cols))


def predict_rows(fn: RowFunction, device: Device, inlined: tuple[str, ...], vector: tuple[str, ...],
                 red_lanes: int, red_cols: int) -> float:
    """The model's time for a plan: the parameters move once between memory and the cores (the
    intermediate rows stay in L1), the flops of every block (an inlined block's once per reader) run
    in vectors of lanes where the plan vectorizes them (a vector reduction's over its padded row), the
    partial sums are summed across lanes once per row (a dependent step each of :func:`lane_tree`), the
    rows spread over the cores."""
    units = max(1, min(device.units.count, fn.rows))
    lanes = device.units.lanes(fn.dtype)
    # the shared level the data lives in: the first whose usable capacity holds the parameters
    source = next((lv for lv in device.shared_levels if fn.params_bytes <= lv.usable_bytes), device.shared_levels[-1])
    bw = min(source.bandwidth_gbps * units, source.total_bandwidth_gbps)
    memory = fn.params_bytes / (bw * 1e9)
    scalar_rate = device.units.peak(fn.dtype) * 1e9 / (2 * lanes)  # one op a cycle-lane slot, no FMA pairing
    work = 0.0
    for b in fn.blocks:
        times = b.readers if b.name in inlined else 1
        flops = b.expr.flops * times * (red_cols / fn.cols if b.name in vector else 1)
        width = min(lanes, fn.cols) if b.kind == ELEMENTWISE else red_lanes if b.name in vector else 1
        work += flops / (scalar_rate * width)
    tree = lane_tree(red_lanes)
    steps = len(tree) + (tree[-1] if tree else red_lanes)
    lane_sums = len(vector) * fn.rows * steps * LANE_STEP_CYCLES * cycle_seconds(device)
    compute = (work + lane_sums) / units
    return max(memory, compute) + launch_seconds(device, units)
