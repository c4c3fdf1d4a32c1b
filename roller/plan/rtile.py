"""rTiles: tile shapes over an expression's axes, and what they cost at one memory level.

Everything here is static arithmetic over the Expr's affine access maps (see DESIGN.md, "rTile"):
- the region each tensor's tile covers (a sliding window for convolution),
- the footprint at a level: regions rounded to the level's transaction length, plus storage padding,
- the traffic into a level when the whole operator runs at this tile's granularity,
- the next aligned size along an axis (nesting in the lower level's tile, SIMD width at the level nearest
  compute, transaction length above it, tensor shape within the padding bound epsilon),
- the data-reuse score S_i = (Q(T) - Q(T'_i)) / (F(T'_i) - F(T)).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Mapping

from roller.device.spec import Device, MemoryLevel
from roller.dtypes import dtype_bytes
from roller.plan.dot import dot_axis, dot_depth
from roller.plan.expr import REDUCE, Expr, TensorAccess, plain_dim


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def clamp_tiles(extent: int, sizes: list[int]) -> tuple[int, ...]:
    """Tile sizes (reg first) clamped so that no level is larger than needed to cover ``extent``.

    Keeps each level a multiple of the one below it: a level that already covers the extent becomes
    the smallest multiple of the level below that does.
    """
    out: list[int] = []
    for s in sizes:
        if s <= 0:
            raise ValueError(f"tile size {s} is not positive")
        if not out:
            out.append(min(s, extent))
            continue
        prev = out[-1]
        if s % prev and prev == sizes[len(out) - 1]:
            raise ValueError(f"tile sizes {sizes}: {s} is not a multiple of the level below ({prev})")
        out.append(min(s, math.ceil(extent / prev) * prev) if prev < extent else prev)
    return tuple(out)


def padding_waste(extent: int, tile: int) -> float:
    """Fraction of padded work when ``extent`` is covered by tiles of ``tile``: (S - N mod S) / N."""
    return (round_up(extent, tile) - extent) / extent


def compute_lanes(expr: Expr, device: Device) -> int:
    """SIMD lanes of the arithmetic: the accumulation type's (an int8 product accumulates in int32
    lanes), as code generation emits it."""
    return device.units.lanes(expr.compute_dtype)


def transposes(expr: Expr, axis: str) -> tuple[str, ...] | None:
    """The inputs a plan vectorizing ``axis`` packs in a transposed layout (its dimension last), so that
    no tensor gathers; None when some tensor would still gather (the output, or a window dimension).
    Only a spatial axis transposes (outer-product lanes); a reduced axis needs contiguous data as stored."""
    out = []
    for t in expr.tensors:
        if axis in t.axes and axis not in t.innermost_axes():
            if t is expr.output or expr.axis(axis).kind == REDUCE or plain_dim(t, axis) is None:
                return None
            out.append(t.name)
    return tuple(out)


def gathers(expr: Expr, axis: str) -> bool:
    """Whether vectorizing ``axis`` gathers: some tensor is indexed by it outside its contiguous
    dimension and no transposed packed copy can fix that, so each of its vectors takes one load per lane."""
    return transposes(expr, axis) is None


def layout_expr(expr: Expr, axis: str | None) -> Expr:
    """``expr`` as a plan vectorizing ``axis`` sees it: each input ``transposes`` names becomes its packed
    copy, with ``axis``'s dimension moved last (``TensorAccess.packed_order``). Idempotent."""
    names = transposes(expr, axis) if axis is not None else None
    if not names:
        return expr
    inputs = []
    for t in expr.inputs:
        if t.name in names and not t.packed_order:
            d = plain_dim(t, axis)
            order = tuple(i for i in range(len(t.shape)) if i != d) + (d,)
            t = replace(t, shape=tuple(t.shape[i] for i in order), index=tuple(t.index[i] for i in order),
                        packed_order=order)
        inputs.append(t)
    return replace(expr, inputs=tuple(inputs))


def vector_candidates(expr: Expr) -> tuple[str, ...]:
    """The axes a plan may vectorize: the axes that index some tensor's contiguous dimension with
    coefficient 1 and gather from no tensor (lanes load contiguous data, or broadcast one element; an
    input that would gather along a spatial axis is packed transposed, ``layout_expr``), most tensor
    bytes first (ties: spatial, then the output's). Only when every such axis gathers (a transpose) are
    they all candidates. Construction builds plans for each; the model ranks them."""
    weight: dict[str, tuple[int, int, int]] = {}
    for t in expr.tensors:
        for a in t.innermost_axes():
            w, _, _ = weight.get(a, (0, 0, 0))
            weight[a] = (w + math.prod(t.shape), int(expr.axis(a).kind != REDUCE),
                         int(a in expr.output.innermost_axes()))
    ranked = sorted(weight, key=lambda a: weight[a], reverse=True)
    return tuple([a for a in ranked if not gathers(expr, a)] or ranked)


def default_vector_axis(expr: Expr) -> str | None:
    """The first vector-axis candidate (:func:`vector_candidates`): the axis contiguous in the most tensor
    bytes. A default for reports and tests; plans carry their own choice."""
    cands = vector_candidates(expr)
    return cands[0] if cands else None


@dataclass(frozen=True)
class LevelRules:
    """The alignment and storage facts of one memory level that tiles held there must follow.

    ``index`` is the level's position (0 = nearest compute). At level 0 the minimum schedulable unit
    applies (``lanes`` along the plan's ``vector_axis``) and regions are counted in elements; above it
    every tensor row is rounded to the transaction length and padded against bank / cache-set conflicts.
    When the vector axis is reduced (a row sum's, a dot product's), each output element holds a whole
    vector of partial sums (``partial_sums`` names the output) at every level, lanes times its bytes: the
    code keeps them in a buffer of their own over the top tile and sums the lanes once, at its end.
    """

    index: int
    level: MemoryLevel
    lanes: int
    vector_axis: str | None
    partial_sums: str | None = None
    dot: int = 1  # reduce elements each lane sums a step (roller.plan.dot): the register tile's step along k
    dot_axis: str | None = None  # that k (roller.plan.dot.dot_axis) where dot is above 1
    # (output name, bytes an element of its accumulator takes) where the main block accumulates in a wider
    # dtype than the output's (an int32 convolution whose epilogue quantizes to uint8): the output's tile is
    # held as accumulators until its write-back, so it occupies the accumulator's bytes at every level
    accumulator: tuple[str, int] | None = None

    @classmethod
    def of(cls, device: Device, index: int, expr: Expr, vector_axis: str | None = None) -> "LevelRules":
        """The rules of private level ``index`` for plans vectorizing ``vector_axis`` (default: the first
        candidate)."""
        if vector_axis is None:
            vector_axis = default_vector_axis(expr)
        # made once per Expr, device, level and vector axis: construction asks ~10^5 times
        made = expr.__dict__.setdefault("_level_rules", {})
        key = (id(device), index, vector_axis)
        hit = made.get(key)
        if hit is not None and hit[0] is device:
            return hit[1]
        reduced = vector_axis is not None and expr.axis(vector_axis).kind == REDUCE
        dot = dot_depth(expr, device, vector_axis)
        wide = dtype_bytes(expr.compute_dtype)
        rules = cls(index, device.private_levels[index], compute_lanes(expr, device), vector_axis,
                    expr.output.name if reduced else None, dot, dot_axis(expr, vector_axis) if dot > 1 else None,
                    (expr.output.name, wide) if expr.reduce_axes and wide != expr.output.elem_bytes else None)
        made[key] = (device, rules)
        return rules

    @cached_property
    def key(self) -> tuple:
        """What a tensor's footprint at this level depends on besides its tile (see tensor_footprint)."""
        return (self.index, self.level.transaction_bytes, self.lanes, self.vector_axis, self.partial_sums,
                self.accumulator)

    @property
    def capacity(self) -> int:
        return self.level.usable_bytes

    def row_bytes(self, t: TensorAccess, inner: int, moved: bool = False) -> int:
        """Bytes one row (contiguous innermost run) of a tensor tile takes at this level.

        Above level 0 a row occupies and moves whole transactions (cache lines). At level 0 a row
        occupies its own bytes, but moving it costs whole loads: vector loads along the vector axis,
        and one load (a broadcast) per element for a tensor whose rows run along another axis.
        """
        raw = inner * t.elem_bytes
        if not moved and self.accumulator is not None and t.name == self.accumulator[0]:
            raw = inner * self.accumulator[1]  # held as accumulators (see ``accumulator``)
        if self.index == 0:
            if not moved:
                return raw * self.lanes if t.name == self.partial_sums else raw
            if self.vector_axis not in t.innermost_axes():
                return inner * self.level.transaction_bytes
        if t.name == self.partial_sums:
            raw *= self.lanes  # the partial sums live in their own buffer across the tile's reduction
        return round_up(raw, self.level.transaction_bytes)

    def storage_pad_bytes(self, row_bytes: int) -> int:
        """Padding per row of a stored tile so that rows spread over all banks / cache sets.

        With rows ``row_bytes`` apart, a column of the tile touches only banks / gcd(row_bytes / bank_bytes,
        banks) of the banks (GPU shared-memory banks, CPU cache sets): one bank of padding per row makes
        the stride odd and the column touch them all.
        """
        lv = self.level
        if self.index == 0 or not lv.banks or not lv.bank_bytes or row_bytes % lv.bank_bytes:
            return 0
        return lv.bank_bytes if math.gcd(row_bytes // lv.bank_bytes, lv.banks) > 1 else 0


def tensor_footprint(t: TensorAccess, tile: Mapping[str, int], rules: LevelRules, moved: bool = False) -> int:
    """Bytes a tensor's tile region occupies at a level (rows rounded to transactions); with ``moved``,
    the bytes that filling it transfers (see LevelRules.row_bytes). Storage padding of packed tiles is
    added by the constructor, which decides the packing."""
    # memoized per tensor (it depends on the tile's sizes along the tensor's own axes only): construction
    # asks ~10^6 times, mostly for tiles that differ from one seen before along another tensor's axis
    memos = t.__dict__.get("_footprints")
    if memos is None:
        memos = {}
        object.__setattr__(t, "_footprints", memos)
    memo = memos.get((rules.key, moved))  # one table per level's rules: the key below is the tile alone
    if memo is None:
        memo = memos[(rules.key, moved)] = {}
    key = tuple(map(tile.__getitem__, t.axis_order))
    hit = memo.get(key)
    if hit is not None:
        return hit
    region = t.region(tile, distinct=rules.index == 0)  # registers load the elements read, not their span
    out = math.prod(region[:-1]) * rules.row_bytes(t, region[-1], moved) if region else t.elem_bytes
    memo[key] = out
    return out


def rereads(expr: Expr, t: TensorAccess, tile: Mapping[str, int], lower: Mapping[str, int]) -> bool:
    """Whether the loops inside ``tile`` (over ``lower`` tiles) read an input tensor's data more than once:
    some axis that does not index it takes several steps inside the tile."""
    return any(a.name not in t.axes and tile[a.name] > lower[a.name] for a in expr.axes)


def epilogue_inputs(expr: Expr) -> frozenset[str]:
    """The inputs of a reduction shaped like its output (every output axis longer than 1, no reduction
    axis): a fused epilogue's residual, or a GEMV's bias. They are read once per output point when the
    finished accumulators are written back, not held or re-read during the reduction; counted in the
    register tile they halved the tiles of BERT's and ResNet's residual matmuls and convs and of the
    classifiers' GEMVs. So are inputs of one element (a QDQ graph's scale as a [1, 1, 1, 1]
    tensor: eight of them made the model predict a QDQ convolution 2x slower and pick half its register tile).
    A bias of a longer output (some output axes only) stays counted: excluding it too was net neutral
    (docs/design-notes.md#rtile-epilogue_inputs)."""
    found = expr.__dict__.get("_epilogue_inputs")  # once per Expr: construction asks per tile
    if found is None:
        found = frozenset()
        if expr.reduce_axes:
            reduce = {a.name for a in expr.reduce_axes}
            out = {a.name for a in expr.axes if a.name in expr.output.axes and a.extent > 1}
            found = frozenset(t.name for t in expr.inputs
                              if t.index and not (t.axes & reduce) and (t.axes >= out or math.prod(t.shape) == 1))
        object.__setattr__(expr, "_epilogue_inputs", found)
    return found


def _register_streamed(expr: Expr) -> frozenset[str]:
    """The inputs a register tile does not hold: the epilogue inputs and, beside a reduction, every input
    without a reduction axis (once per Expr: construction asks per tile)."""
    found = expr.__dict__.get("_register_streamed")
    if found is None:
        reduce = {a.name for a in expr.reduce_axes}
        found = epilogue_inputs(expr) | frozenset(t.name for t in expr.inputs if reduce and not t.axes & reduce)
        object.__setattr__(expr, "_register_streamed", found)
    return found


def footprint(expr: Expr, tile: Mapping[str, int], rules: LevelRules) -> int:
    """F(T): bytes all tensors' regions occupy at the level (the whole tile is held there); epilogue
    inputs stream through at the write-back and hold nothing (:func:`epilogue_inputs`). In the registers no
    input without a reduction axis (a bias) is held either: it is loaded at the write-back, when the
    reduction's operands have left them (docs/design-notes.md#rtile-footprint)."""
    streamed = _register_streamed(expr) if rules.index == 0 else epilogue_inputs(expr)
    return sum(tensor_footprint(t, tile, rules) for t in expr.tensors if t.name not in streamed)


def level_footprints(expr: Expr, tiles: list[Mapping[str, int]], device: Device,
                     vector_axis: str | None = None) -> list[int]:
    """The footprint of each level's tile of a full plan (nearest compute first). A panel's L1 tile
    (:func:`streamed_axes`) holds its resident input whole and the others one register tile's rows at a time:
    they stream past it."""
    streamed = streamed_axes(expr, tiles)
    out = []
    for i, tile in enumerate(tiles):
        if i == 1 and streamed:
            tile = {**tile, **{a: tiles[0][a] for a in streamed}}
        out.append(footprint(expr, tile, LevelRules.of(device, i, expr, vector_axis)))
    return out


def streamed_axes(expr: Expr, tiles: list[Mapping[str, int]]) -> frozenset[str]:
    """The spatial axes along which the plan's L1 tile is a panel (``roller.plan.panels``): a reduction along
    one axis longer than 1, whose L1 tile spans the next level's tile, beyond the register tile, along these
    (the loop over them runs inside L1's tile, the inputs they index streaming past the others) and is the
    register tile's along the other spatial axes; empty for other plans."""
    if len(tiles) < 3 or sum(a.extent > 1 for a in expr.reduce_axes) != 1:
        return frozenset()
    reg, l1, above = tiles[0], tiles[1], tiles[2]
    spans = frozenset(a.name for a in expr.axes if a.kind != REDUCE and l1[a.name] == above[a.name] > reg[a.name])
    # along every other spatial axis the panel is one register tile wide
    if not spans or any(l1[a.name] != reg[a.name] for a in expr.axes if a.kind != REDUCE and a.name not in spans):
        return frozenset()
    return spans


def tile_counts(expr: Expr, tile: Mapping[str, int]) -> tuple[int, int]:
    """(all tiles, spatial tiles) when the operator is covered by ``tile`` (overhang rounds up)."""
    total = spatial = 1
    for a in expr.axes:
        n = -(-a.extent // tile[a.name])  # ceil_div, inline: construction calls this ~10^5 times
        total *= n
        if a.kind != REDUCE:
            spatial *= n
    return total, spatial


def traffic(expr: Expr, tile: Mapping[str, int], rules: LevelRules,
            parent: Mapping[str, int] | None = None) -> int:
    """Q(T): bytes moved into the level for the whole operator at this tile's granularity.

    Each tile loads every input region once. The output region stays at the level across the
    reduction inside one ``parent`` tile (the next level's; reduction loops are innermost within a
    level): it is written once per spatial tile, and read back and written again for each further
    reduction chunk of the parent. Without a parent the whole reduction is one chunk. (A plan with partial
    sums runs the top tile's whole reduction inside its spatial loops instead, see codegen/cpu; its
    input traffic at the middle levels is then larger than counted here: not modelled yet.)
    """
    total, spatial = tile_counts(expr, tile)
    streamed = epilogue_inputs(expr)  # read once per spatial tile, at the write-back
    q = sum(tensor_footprint(t, tile, rules, moved=True) * (spatial if t.name in streamed else total)
            for t in expr.inputs)
    chunks = 1
    if parent is not None:
        chunks = math.prod(ceil_div(a.extent, parent[a.name]) for a in expr.reduce_axes)
    return q + tensor_footprint(expr.output, tile, rules, moved=True) * spatial * (2 * chunks - 1)


# ---------------------------------------------------------------------------------------------
# Alignment: the sizes a tile may take along an axis.

def axis_step(expr: Expr, axis: str, rules: LevelRules) -> int:
    """The granule of a tile along ``axis`` at a level, before nesting and shape rules.

    Level 0: the vector axis moves in whole SIMD vectors / warps, the dot axis in whole dot steps where the
    plans run dot-product lanes (``LevelRules.dot``, ``roller.plan.dot``). Above: an axis that indexes some
    tensor's contiguous dimension moves in whole transactions of that tensor's dtype; with dot-product lanes
    the vector and dot axes take any size the tile below divides, since they may not overhang (exact_axes).
    """
    if rules.index == 0:
        if axis == rules.vector_axis:
            return rules.lanes
        return rules.dot if rules.dot > 1 and axis == rules.dot_axis else 1
    if rules.dot > 1 and axis in (rules.vector_axis, rules.dot_axis):
        return 1  # never overhanging (exact_axes): any divisor of the extent nesting the tile below
    step = 1
    for t in aligning_tensors(expr):
        if axis in t.innermost_axes():
            step = math.lcm(step, max(1, rules.level.transaction_bytes // t.elem_bytes))
    return step


ALIGN_SHARE = 1 / 16  # a tensor holding less of the operator's bytes than this does not set alignment


def aligning_tensors(expr: Expr) -> list[TensorAccess]:
    """The tensors whose rows set the transaction alignment above level 0: all but those holding less than
    ALIGN_SHARE of the operator's bytes. A misaligned tile row costs at most one transaction more, which is
    nothing for a tiny tensor (a row sum's output: 100 sums beside 100 x 3001 inputs), while aligning to it
    forbade splitting its 100 rows over 2 cores (tiles of 16 or all 100: the plan ran on one core)."""
    sizes = [math.prod(t.shape) * t.elem_bytes for t in expr.tensors]
    return [t for t, b in zip(expr.tensors, sizes) if b >= ALIGN_SHARE * sum(sizes)]


ODD_EXTENT_EPSILON = 0.02  # padding waste always allowed along an extent with no divisor from 2 to 16
UNALIGNED_EXTENT_EPSILON = 0.05  # ... and along one that no multiple of its alignment unit divides


def axis_epsilon(extent: int, epsilon: float, unit: int = 1) -> float:
    """The padding waste allowed along one axis: ``epsilon``, but at least ODD_EXTENT_EPSILON along an
    extent with no divisor from 2 to 16 (a prime such as 71 or 3001, or 5041 = 71 x 71), and at least
    UNALIGNED_EXTENT_EPSILON along one that no multiple of the alignment ``unit`` divides (168 channels in
    cache lines of 16 floats): there every tile but the whole extent overhangs, so a bound of 0 leaves
    only useless tiles (a 1x1 convolution over 168 channels kept one accumulator and ran at 0.4x)."""
    if extent > 16 and not any(extent % d == 0 for d in range(2, 17)):
        epsilon = max(epsilon, ODD_EXTENT_EPSILON)
    if 1 < unit < extent and extent % unit:  # (a multiple of unit divides extent only if unit does)
        epsilon = max(epsilon, UNALIGNED_EXTENT_EPSILON)
    return epsilon


def size_allowed(extent: int, size: int, lower: int, epsilon: float) -> bool:
    """Whether a tile of ``size`` may cover an axis of ``extent`` (see ``next_aligned``)."""
    if size == extent:
        return extent % lower == 0
    return padding_waste(extent, size) <= epsilon


def exact_axes(expr: Expr, rules: LevelRules | None = None) -> frozenset[str]:
    """Axes that index an output dimension together with another axis (a grouped convolution's
    ``g * K/groups + j``): a tile overhanging one would write into its neighbour's elements, and neither
    padding (pad_einsum needs plain indices) nor bounds (the accumulator's write-back region spans the
    combined index) can stop that, so their tiles never overhang. Under ``rules`` with dot-product lanes,
    also the vector and dot axes: an overhang there leaves the plan one lane a step
    (``dot.program_dot_depth``; EfficientNet's 672 channels in tiles of 64 did)."""
    out = frozenset(a for dim in expr.output.index if len(dim) > 1 for a, _ in dim)
    if rules is not None and rules.dot > 1:
        out |= {rules.vector_axis, rules.dot_axis}
    return out


def next_aligned(extent: int, current: int, step: int, lower: int, epsilon: float,
                 limit: int | None = None, exact: bool = False) -> int | None:
    """The next size after ``current`` along an axis under the alignment rules, or None at the end.

    A size is a multiple of ``lower`` (the lower level's tile: tiles nest) and of ``step`` (alignment),
    and may overhang the extent only while the padding waste stays within ``epsilon`` (``axis_epsilon``). The full extent
    is allowed when it nests, aligned or not: it covers the whole dimension. Sizes past the first one
    that covers the extent, or past ``limit``, are never returned. With ``exact`` no size overhangs.
    """
    if current >= extent:
        return None
    unit = math.lcm(step, lower)
    epsilon = 0.0 if exact else axis_epsilon(extent, epsilon, unit)
    s = (current // unit + 1) * unit
    top = extent if limit is None else min(limit, extent)
    while s < extent:
        if s > top:
            return None
        if s > current and padding_waste(extent, s) <= epsilon:
            # the exact extent, when allowed and smaller, comes first (it is not a multiple of unit)
            if current < extent < s and size_allowed(extent, extent, lower, epsilon):
                return extent
            return s
        s += unit
    # s is the first multiple of unit that covers the extent
    if limit is not None and limit < extent:
        return None
    candidates = [x for x in (extent, s) if x > current and size_allowed(extent, x, lower, epsilon)]
    return min(candidates) if candidates else None


def aligned_sizes(extent: int, step: int, lower: int, epsilon: float, limit: int | None = None,
                  exact: bool = False) -> list[int]:
    """Every size ``next_aligned`` would step through, ascending (for tests and reports)."""
    out, cur = [], 0
    while (cur := next_aligned(extent, cur, step, lower, epsilon, limit, exact)) is not None:
        out.append(cur)
    return out


def reuse_score(expr: Expr, tile: Mapping[str, int], grown: Mapping[str, int], rules: LevelRules,
                child: Mapping[str, int] | None = None, child_rules: LevelRules | None = None,
                traffic_of=None, footprint_of=None) -> float:
    """S_i = (Q(T) - Q(T')) / (F(T') - F(T)): traffic saved per byte of extra footprint.

    With the tile of the level below (``child`` and its rules), the saving also counts that level's
    traffic: a longer reduction here reloads the child's output tile fewer times. ``traffic_of(t,
    parent=None)`` and ``footprint_of(t)`` may stand for ``traffic`` / ``footprint`` at this level (and
    the child's traffic under parent ``t``), e.g. memoized by the constructor.
    """
    if traffic_of is None:
        def traffic_of(t, parent=None):
            return traffic(expr, t, rules) if parent is None else traffic(expr, t, child_rules, parent)
    if footprint_of is None:
        def footprint_of(t):
            return footprint(expr, t, rules)
    dq = traffic_of(tile) - traffic_of(grown)
    if child is not None and child_rules is not None:
        dq += traffic_of(child, tile) - traffic_of(child, grown)
    df = footprint_of(grown) - footprint_of(tile)
    if df <= 0:
        return math.inf if dq > 0 else 0.0
    return dq / df


def packing(expr: Expr, tiles: list[Mapping[str, int]], device: Device,
            vector_axis: str | None = None, inlined: tuple[str, ...] = ()) -> tuple[tuple[str, ...], dict[str, int]]:
    """Inputs worth copying into a contiguous buffer per top tile, and the row padding (elements) of every
    buffer copied per top tile (the packed inputs and the padding stages not ``inlined``).

    An input in a transposed layout (``layout_expr``) is always packed. Another is packed when, inside the
    top tile, the innermost loops walk across its rows (none of the
    reduced axes runs along its contiguous dimension), its rows are strided (the top tile covers part of
    the contiguous dimension) and the top tile re-reads it (a panel re-reads its resident input inside its
    L1 tile: :func:`panel_rereads`): the copy is paid once and every re-read then
    streams a dense block; unless its rows as stored start on lines that spread over the cache sets
    (:func:`rows_spread`), which read in place as well. A copy's rows are padded to whole vectors where they
    run along the vector axis (``vector_row_pad``), and further when the lower tile reads part of each row and
    the row stride would map a column onto few cache sets.
    """
    if len(tiles) < 2:
        return (), {}
    top, under = tiles[-1], tiles[-2]
    rules = LevelRules.of(device, len(tiles) - 2, expr, vector_axis)
    reduced = {a.name for a in expr.reduce_axes}
    packed, pads = [], {}

    def row_pad(t: TensorAccess, region: tuple[int, ...]) -> int:
        # whole vectors, then one cache line more where the lower tile reads part of each row and the row
        # stride would map a column onto few cache sets (a staged window too;
        # docs/design-notes.md#rtile-packing)
        row = region[-1] + vector_row_pad(t, region, rules.vector_axis, rules.lanes)
        pad = rules.storage_pad_bytes(row * t.elem_bytes) if t.region(under)[-1] < region[-1] else 0
        return row - region[-1] + (max(1, pad // t.elem_bytes) if pad else 0)

    for t in expr.inputs:
        region = t.region(top)
        if not t.packed_order:  # a transposed layout is always a packed copy
            if len(region) < 2 or region[-1] >= t.shape[-1] or not reduced or reduced & set(t.innermost_axes()):
                pad = row_pad(t, region) if len(region) >= 2 and t.name in copied_stages(expr, inlined) else 0
                if pad:
                    pads[t.name] = pad  # the staged window
                continue
            if not rereads(expr, t, top, under) and not panel_rereads(expr, t, tiles):
                continue
            if rows_spread(t, rules):
                continue
        packed.append(t.name)
        pad = row_pad(t, region)
        if pad:
            pads[t.name] = pad
    return tuple(packed), pads


def rows_spread(t: TensorAccess, rules: LevelRules) -> bool:
    """Whether the rows of ``t`` as stored start on a line each and spread over all the sets of the level
    below the top (``rules``): their stride is a whole number of transactions, and no storage padding would
    spread them further (``LevelRules.storage_pad_bytes``). Such rows read as fast in place as from a copy,
    which would only add its own time (docs/design-notes.md#rtile-rows_spread). A stride of a power of two
    lines (a GEMM's B of 4096 columns) maps a column onto one set, and an unaligned one splits vector loads."""
    row = t.shape[-1] * t.elem_bytes
    return row % rules.level.transaction_bytes == 0 and not rules.storage_pad_bytes(row)


def panel_rereads(expr: Expr, t: TensorAccess, tiles: list[Mapping[str, int]]) -> bool:
    """Whether the plan's first cache level holds ``t`` as a panel (``roller.plan.panels``) and re-reads it
    there: one of the panel's :func:`streamed_axes` does not index ``t``."""
    return any(a not in t.axes for a in streamed_axes(expr, tiles))


def copied_stages(expr: Expr, inlined: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The inputs whose zero-padding stage (``Expr.inlinable``) a plan copies per top tile: those it does
    not read in place (``inlined``)."""
    return tuple(n for n in expr.inlinable if n not in inlined)


def vector_row_pad(t: TensorAccess, region: tuple[int, ...], vector_axis: str | None, lanes: int) -> int:
    """Elements that pad each row of a copy of ``t`` to whole vectors, where its rows run along the vector
    axis and are longer than one vector without being a whole number of them: otherwise the rows start at
    every offset and most vector loads straddle two cache lines
    (docs/design-notes.md#rtile-vector_row_pad)."""
    row = region[-1]
    if t.index[-1] != ((vector_axis, 1),) or row <= lanes or row % lanes == 0:
        return 0
    return lanes - row % lanes


def packing_bytes(expr: Expr, tiles: list[Mapping[str, int]], device: Device, vector_axis: str | None = None) -> int:
    """Extra bytes the top level holds for the plan's packed inputs: the copy streams each packed region
    through the level next to its packed buffer (so it counts twice), plus the buffer's row padding."""
    if len(tiles) < 2:
        return 0
    packed, pads = packing(expr, tiles, device, vector_axis)
    rules = LevelRules.of(device, len(tiles) - 1, expr, vector_axis)
    extra = 0
    for t in expr.inputs:
        if t.name in packed:
            region = t.region(tiles[-1])
            extra += tensor_footprint(t, tiles[-1], rules)
            extra += math.prod(region[:-1]) * pads.get(t.name, 0) * t.elem_bytes
    return extra
