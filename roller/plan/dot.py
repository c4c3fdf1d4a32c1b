"""Dot-product lanes for 8-bit matmuls: where the CPU has VNNI, each int32 lane sums 4 products a step.

A u8 x s8 -> s32 matmul (what ``roller.models.quantized`` makes of MatMulInteger) otherwise does one
multiply-add per int32 lane, the float32 rate. VNNI's ``vpdpbusd`` multiplies 4 unsigned bytes of the
activation (one int32 broadcast to every lane) by 4 signed bytes of the weight per lane and adds their sum
to the lane: 4 multiply-adds a lane, the spec's ``peak_gflops.int8`` (calibrated by the VNNI microbenchmark).
A plan that runs its register tile so (``RProgram.dot_depth``) splits the reduction by :data:`DOT_DEPTH`
innermost, reads the weight prepacked with those 4 bytes last (``prepack.PackedLayout.dot``: each
vector's 4 x lanes bytes contiguous, as the instruction reads them), and the model charges the int8 peak.

Where the CPU also has AMX (:func:`has_amx`), a plan's register tile may instead be tiles of AMX's tile
registers (:func:`amx_layout`, ``RProgram.amx``): 16-row int32 accumulator tiles kept over a chunk of the
reduction, ``tdpbusd`` on the same 4-deep packed weight, at the matrix unit's peak
(``units.tensor_peak_gflops``) times :func:`amx_efficiency`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from roller.plan.expr import REDUCE, Expr, TensorAccess, plain_dim

DOT_DEPTH = 4  # products each int32 lane sums per vpdpbusd
# AMX (Sapphire Rapids and later): 8 tile registers of 16 rows x 64 bytes; tdpbusd adds to a tile of 16 x 16
# int32 the products of a 16 x 64 u8 tile and a 64-deep s8 tile laid out [16, 16, 4] (VNNI's 4-deep packing)
AMX_FEATURES = ("+amx-tile", "+amx-int8")
AMX_ROWS = 16     # rows of a tile register
AMX_COLUMNS = 16  # int32 accumulators in a tile row (64 bytes)
AMX_DEPTH = 64    # reduce elements one tdpbusd sums into each accumulator
# register tiles (rows in full tiles, columns) the 8 tile registers hold with their operands' tiles
AMX_SHAPES = ((32, 32), (32, 16), (16, 32), (16, 16))
# Measured on a Sapphire Rapids core (one thread, operands in L1; docs/models.md, "AMX tiles"): a tdpbusd on
# tiles it fills in part (fewer rows, a shallower step) takes AMX_PARTIAL_BASE + (1 - AMX_PARTIAL_BASE) x the
# share of a full one's time; a register tile's accumulator loads and stores take AMX_ACCUMULATOR_MOVES
# tdpbusd times over its accumulator tiles, at least one a tile (one tile: its loads, product and store wait
# on each other).
AMX_PARTIAL_BASE = 0.5
AMX_ACCUMULATOR_MOVES = 3.0
# The smallest tiles a plan takes: rows of a tile, reduce elements a step (below them VNNI's lanes run the
# operator: a squeeze-and-excitation block's 1x1 convolution on one pixel has one row)
AMX_MIN_ROWS = 4
AMX_MIN_STEP = 16

# LLVM target features (the device's target mattr) with which vpdpbusd exists at a vector width (bytes):
# AVX-512 VNNI for zmm; AVX-VNNI (or AVX-512 VNNI with VL) for ymm
VNNI_FEATURES = {64: ("+avx512vnni",), 32: ("+avxvnni", "+avx512vnni")}


def target_features(device) -> frozenset[str]:
    """The LLVM features the device's target names (``mattr``: a list, or one comma-separated string)."""
    mattr = device.target.get("mattr", ())
    if isinstance(mattr, str):
        mattr = mattr.split(",")
    return frozenset(str(f).strip() for f in mattr)


def has_vnni(device) -> bool:
    """Whether the device's target runs vpdpbusd on its vectors (a CPU whose mattr has VNNI at its width)."""
    if device.kind != "cpu":
        return False
    return bool(target_features(device) & set(VNNI_FEATURES.get(device.units.vector_bytes, ())))


def dot_operands(expr: Expr, vector_axis: str | None) -> tuple[TensorAccess, TensorAccess] | None:
    """(activation, weight) of a matmul-class u8 x s8 reduction accumulating in int32 (an epilogue may follow)
    that dot-product lanes can run with ``vector_axis`` as the lanes, else None: two inputs, the uint8
    activation without the vector axis and contiguous along a reduced axis (the dot axis,
    :func:`dot_axis`: 4 consecutive bytes make the broadcast), the int8 weight indexed by the dot axis, the
    vector axis and the other reduced axes each in a dimension of its own (a matmul's [K, N], a
    convolution's [KH, KW, C, O], whose activation window the other reduced axes walk); the vector axis is
    the output's contiguous one."""
    reduce = {a.name for a in expr.reduce_axes}
    if (not reduce or expr.compute_dtype != "int32" or expr.flops_per_point != 2
            or vector_axis is None or len(expr.inputs) < 2):
        return None
    if expr.axis(vector_axis).kind == REDUCE or expr.output.innermost_axes() != (vector_axis,):
        return None
    main = [t for t in expr.inputs if t.axes & reduce]
    if len(main) != 2:
        return None
    act = next((t for t in main if t.dtype == "uint8"), None)
    weight = next((t for t in main if t.dtype == "int8"), None)
    if act is None or weight is None or vector_axis in act.axes:
        return None
    inner = act.innermost_axes()
    if len(inner) != 1 or inner[0] not in reduce or plain_dim(act, inner[0]) != len(act.index) - 1:
        return None
    if not {inner[0], vector_axis} <= weight.axes or weight.axes - reduce - {vector_axis} \
            or any(plain_dim(weight, a) is None for a in weight.axes):
        return None
    return act, weight


def dot_axis(expr: Expr, vector_axis: str | None) -> str | None:
    """The reduced axis dot-product lanes step along (the activation's contiguous one), else None."""
    operands = dot_operands(expr, vector_axis)
    return None if operands is None else operands[0].innermost_axes()[0]


def dot_depth(expr: Expr, device, vector_axis: str | None) -> int:
    """:data:`DOT_DEPTH` where plans vectorizing ``vector_axis`` may run dot-product lanes on ``device``
    (VNNI at its width, :func:`dot_operands`, the dot axis a whole number of dot steps and the vector axis
    of whole vectors), else 1. Tiles then step by it along the dot axis at the register level."""
    if not has_vnni(device):
        return 1
    k = dot_axis(expr, vector_axis)
    if k is None:
        return 1
    lanes = device.units.lanes(expr.compute_dtype)
    if expr.axis(k).extent % DOT_DEPTH or expr.axis(vector_axis).extent % lanes:
        return 1
    return DOT_DEPTH


def program_dot_depth(expr: Expr, tiles: Sequence[Mapping[str, int]], device, vector_axis: str | None,
                      prepacked: Sequence[str], overhanging: Sequence[str], inlined: Sequence[str] = ()) -> int:
    """The dot depth a plan with these tiles runs (``RProgram.dot_depth``): :func:`dot_depth` where the weight
    arrives prepacked (the layout vpdpbusd reads is made once, with the constant), the register tile takes
    whole dot steps, neither the dot axis nor the vector axis overhangs (``overhanging``: the plan's padded
    and predicated axes; a bound inside the dot step or the vector would need lanes the instruction has not),
    and the activation is read as stored (not ``inlined``: a convolution's padding inlined makes each read
    a guarded value, no 4 bytes to broadcast)."""
    depth = dot_depth(expr, device, vector_axis)
    if depth == 1:
        return 1
    act, weight = dot_operands(expr, vector_axis)
    k = act.innermost_axes()[0]  # the dot axis
    if (weight.name not in prepacked or act.name in inlined or tiles[0][k] % depth
            or {k, vector_axis} & set(overhanging)):
        return 1
    return depth


def has_amx(device) -> bool:
    """Whether the device's target runs AMX's int8 tiles (its mattr names amx-tile and amx-int8)."""
    return device.kind == "cpu" and set(AMX_FEATURES) <= target_features(device)


@dataclass(frozen=True)
class AmxLayout:
    """How an expression's register tile sits on AMX's tiles (:func:`amx_layout`): rows along ``rows`` (the
    activation's dimension right above its reduced contiguous one, each row ``row_step`` elements of that
    dimension after the previous: a strided convolution's stride), ``tile_rows`` rows a tile, and ``step``
    reduce elements (bytes of a tile row of the activation) a tdpbusd; the tile configuration follows."""

    rows: str
    row_step: int
    tile_rows: int
    step: int

    def efficiency(self) -> float:
        """Fraction of the matrix unit's peak a tdpbusd on these tiles reaches: the share of a full one's (16
        rows, 64 deep) products it makes over the share of its time it takes (:data:`AMX_PARTIAL_BASE`)."""
        fill = self.tile_rows / AMX_ROWS * self.step / AMX_DEPTH
        return fill / (AMX_PARTIAL_BASE + (1 - AMX_PARTIAL_BASE) * fill)


def _largest_divisor(extent: int, most: int, unit: int = 1) -> int:
    return max((d for d in range(unit, most + 1, unit) if extent % d == 0), default=0)


def amx_layout(expr: Expr, device, vector_axis: str | None) -> AmxLayout | None:
    """Where ``expr`` can run on AMX tiles with ``vector_axis`` as the columns, how (:class:`AmxLayout`), else
    None: the device has AMX and VNNI's dot lanes (:func:`dot_depth`), the columns are whole tiles (16), and
    the activation's dimension right above the dot axis is indexed by one spatial axis (the rows, read in
    place at the activation's stride) besides reduced ones (a window's, looped above the register tile), which
    indexes the output's dimension right above the columns. A tile takes the largest divisor of the rows'
    extent up to 16 rows (a 7x7 feature map's 7) and of the dot axis's up to 64 bytes deep, at least
    :data:`AMX_MIN_ROWS` and :data:`AMX_MIN_STEP`. Made once per Expr, device and vector axis (construction
    asks at every growth step of every level)."""
    made = expr.__dict__.setdefault("_amx_layout", {})
    key = (id(device), vector_axis)
    hit = made.get(key)
    if hit is not None and hit[0] is device:
        return hit[1]
    layout = _amx_layout(expr, device, vector_axis)
    made[key] = (device, layout)
    return layout


def _amx_layout(expr: Expr, device, vector_axis: str | None) -> AmxLayout | None:
    if not has_amx(device) or dot_depth(expr, device, vector_axis) != DOT_DEPTH:
        return None
    if expr.axis(vector_axis).extent % AMX_COLUMNS:
        return None
    act, _ = dot_operands(expr, vector_axis)
    k = expr.axis(act.innermost_axes()[0])
    if len(act.index) < 2:
        return None
    above = [(a, c) for a, c in act.index[-2] if expr.axis(a).kind != REDUCE]
    if len(above) != 1:
        return None
    rows, stride = above[0]
    out = expr.output
    if (plain_dim(out, rows) != len(out.index) - 2
            or any(expr.axis(a).kind != REDUCE and a != rows and expr.axis(a).extent > 1
                   for a, _ in act.index[-2])):
        return None
    tile_rows = _largest_divisor(expr.axis(rows).extent, AMX_ROWS)
    depth = _largest_divisor(k.extent, AMX_DEPTH, DOT_DEPTH)
    if tile_rows < AMX_MIN_ROWS or depth < AMX_MIN_STEP:
        return None
    return AmxLayout(rows, stride, tile_rows, depth)


def amx_register_tiles(expr: Expr, device, vector_axis: str | None, l1_bytes: int) -> list[dict[str, int]]:
    """The register tiles an AMX plan may take (``RProgram.amx``): one or two tiles of rows by one or two of
    16 columns (:data:`AMX_SHAPES` in tiles) that divide the axes, every other axis but the dot axis 1, and
    along the dot axis a whole number of steps that divides it (the tile registers run it in one tensorized
    unit, the activation's rows and the weight's columns streaming from L1: their bytes within half of
    ``l1_bytes``), steps times powers of two and the whole axis."""
    layout = amx_layout(expr, device, vector_axis)
    if layout is None:
        return []
    act, _ = dot_operands(expr, vector_axis)
    k = expr.axis(act.innermost_axes()[0])
    n = expr.axis(vector_axis).extent
    m = expr.axis(layout.rows).extent
    out = []
    for tr, tc in AMX_SHAPES:
        r, c = tr // AMX_ROWS * layout.tile_rows, tc
        if m % r or n % c:
            continue
        depths = sorted({d for d in [layout.step << i for i in range(12)] + [k.extent]
                         if k.extent % d == 0 and (r * layout.row_step + c) * d <= l1_bytes // 2})
        for d in depths:
            tile = {a.name: 1 for a in expr.axes}
            tile.update({layout.rows: r, vector_axis: c, k.name: d})
            out.append(tile)
    return out


def is_amx_tile(expr: Expr, device, vector_axis: str | None, reg: Mapping[str, int]) -> bool:
    """Whether a register tile is one :func:`amx_register_tiles` makes: the plans whose register tile runs on
    AMX's tile registers (``RProgram.amx``), decided by the tile alone."""
    layout = amx_layout(expr, device, vector_axis)
    if layout is None:
        return False
    k = dot_axis(expr, vector_axis)
    r = layout.tile_rows
    return (reg[layout.rows] in (r, 2 * r) and reg[vector_axis] in (AMX_COLUMNS, 2 * AMX_COLUMNS)
            and reg[k] % layout.step == 0
            and all(v == 1 for a, v in reg.items() if a not in (layout.rows, vector_axis, k)))


def amx_efficiency(expr: Expr, device, vector_axis: str | None, reg: Mapping[str, int]) -> float:
    """Fraction of the matrix unit's peak an AMX register tile issues: its tiles' (:meth:`AmxLayout.efficiency`)
    over its steps and the accumulator tiles' loads and stores once per register tile
    (:data:`AMX_ACCUMULATOR_MOVES`)."""
    layout = amx_layout(expr, device, vector_axis)
    tiles = reg[layout.rows] // layout.tile_rows * (reg[vector_axis] // AMX_COLUMNS)
    steps = reg[dot_axis(expr, vector_axis)] // layout.step
    return layout.efficiency() * steps / (steps + max(1.0, AMX_ACCUMULATOR_MOVES / tiles))
