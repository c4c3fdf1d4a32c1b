"""Construction on a GPU: scale up a thread tile in registers, then a block tile in shared memory, scale out
as blocks over the SMs, rank with the GPU model (``roller.targets.cuda.cost``).

The same steps as the CPU's (``roller.plan.construct``: aligned tiles grown along the axis of best data-reuse
score until the level is full, a few tiles per level carried on, plans ranked by the model, epsilon grown
only when too few exist), over the GPU's level rules (``roller.targets.cuda.rules``):

- thread tile: spatial axes only (each thread runs its whole reduction serially), grown by the reuse of
  operands loaded from shared memory into registers, within the registers a thread may use;
- block-level reductions (``roller.targets.cuda.reduce``) where rows are long and few: a block's threads share rows;
- tensor-core plans (``roller.targets.cuda.tensorcore``) for fp16 matmuls on sm_80+: warp tiles of 16 x 16 fragments;
- block tile: a whole number of thread tiles, contiguous extents in whole sectors, grown by the reuse of
  data loaded from global memory, within the block's shared memory and thread limit, never leaving fewer
  blocks than SMs when it had at least that many (scale-out; growing to a first whole warp is always
  allowed); kept only with a whole number of warps (growths also start from seeds grown along one axis to
  a first whole warp); the reduction step (the shared-memory fill) is then offered at a few lengths, which
  the model weighs (a longer step fewer barriers, more shared memory, fewer resident blocks).

It reuses the CPU's rTile arithmetic (footprint, traffic, next aligned size, reuse score), its ranking and
its epsilon loop (``construct.construct`` calls ``enumerate_programs`` here for a GPU); the growth loop is
its own: a GPU level's limits (threads, warps) are not the CPU's capacity-only ones.
"""
from __future__ import annotations

import functools
from typing import Mapping

from roller.device.spec import Device
from roller.plan.expr import REDUCE, Expr
from roller.targets.cuda.cost import GpuEstimate, estimate
from roller.targets.cuda.reduce import block_reduction_tiles, estimate_block_reduction
from roller.targets.cuda.tensorcore import ROW_PAD, TC_COPY_LANES, estimate_tensorcore, tensorcore_tiles
from roller.plan.construct import distinct_programs
from roller.plan.gpuplan import BlockReduction, GpuKind, GpuPlan, TensorCoreLayout
from roller.plan.cost import rank
from roller.targets.cuda.rules import (GpuLevelRules, bank_pad_elements, copy_lanes, interleaved_axes, shared_bytes,
                                       threads_per_block, warp_aligned)
from roller.plan.rprogram import RProgram
from roller.plan.rtile import (axis_step, ceil_div, exact_axes, footprint, next_aligned, reuse_score, tile_counts,
                               traffic)

REDUCE_VARIANTS = 3  # further reduction-step lengths offered per block tile
THREAD_TILES = 6     # thread tiles of the greedy growth offered (from its end)

# The paths of one construction (greedy, held axes, each epsilon) ask for the same sizes again and again,
# and one call costs O(extent / step) along an extent no aligned size divides (a fused 997 x 1009 axis).
_next_aligned = functools.lru_cache(maxsize=8192)(next_aligned)


def _grow(expr: Expr, rules: GpuLevelRules, tile: dict[str, int], seed: Mapping[str, int], eps: float,
          axes: list[str], fits, limits: Mapping[str, int], frozen: str | None = None) -> list[dict[str, int]]:
    """The greedy path from ``tile``: each step grows the axis (of ``axes``, never ``frozen``; at most to
    ``limits``) with the best reuse score among the aligned sizes that ``fits``; where no step saves traffic,
    a spatial axis contiguous in the most tensors grows (no reuse, but fewer, larger tiles) while one fits."""
    exact = exact_axes(expr)
    contiguity = {a: sum(a in t.innermost_axes() for t in expr.tensors) for a in axes}
    path = [tile]
    while True:
        best = fallback = None
        for a in axes:
            if a == frozen:
                continue
            nxt = _next_aligned(expr.axis(a).extent, tile[a], axis_step(expr, a, rules), seed.get(a, 1), eps,
                               limits[a], a in exact)
            if nxt is None:
                continue
            grown = {**tile, a: nxt}
            if not fits(grown, tile):
                continue
            score = reuse_score(expr, tile, grown, rules)
            if score > 0 and (best is None or score > best[0]):
                best = (score, grown)
            elif score <= 0 and expr.axis(a).kind != REDUCE and (fallback is None or contiguity[a] > fallback[0]):
                fallback = (contiguity[a], grown)
        step = best or fallback
        if step is None:
            return path
        tile = step[1]
        path.append(tile)


def thread_tiles(expr: Expr, device: Device, eps: float) -> list[dict[str, int]]:
    """Thread tiles for the model to weigh: the greedy path's tiles from its end (up to THREAD_TILES: a
    smaller tile leaves more threads and blocks, which small operators need), the ends of the growths with
    one axis held at 1, and the single point."""
    rules = GpuLevelRules.of(device, 0, expr)
    start = {a.name: 1 for a in expr.axes}
    spatial = [a.name for a in expr.axes if a.kind != REDUCE]

    def fits(t, _prev):
        return footprint(expr, t, rules) <= rules.capacity

    limits = dict.fromkeys(spatial, max(1, rules.capacity // min(t.elem_bytes for t in expr.tensors)))

    def gains(path):  # only steps that save traffic: the fallback growth buys a thread nothing
        return [t for t in path if t is path[0] or traffic(expr, t, rules) < traffic(expr, path[0], rules)]

    path = gains(_grow(expr, rules, start, {}, eps, spatial, fits, limits))
    held = [gains(_grow(expr, rules, start, {}, eps, spatial, fits, limits, a))[-1]
            for a in spatial if len(spatial) > 1]
    out: list[dict[str, int]] = []
    for t in path[::-1][:THREAD_TILES] + held + [start]:
        if t not in out:
            out.append(t)
    return out


def block_tiles(expr: Expr, device: Device, thread: Mapping[str, int], eps: float) -> list[dict[str, int]]:
    """Block tiles over ``thread``: warp-aligned tiles of the greedy growth and of the growths with one axis
    held, each also with longer reduction steps (see module doc)."""
    rules = GpuLevelRules.of(device, 1, expr)
    exact = exact_axes(expr)
    start = {}
    for a in expr.axes:
        size = _next_aligned(a.extent, thread[a.name] - 1, axis_step(expr, a.name, rules), thread[a.name], eps,
                            None, a.name in exact)
        if size is None:
            return []
        start[a.name] = size
    sms, warp = device.units.count, device.units.warp_threads

    def fits(t, prev):
        if shared_bytes(expr, t, device) > rules.capacity:
            return False
        threads = threads_per_block(expr, thread, t)
        if threads > device.gpu.max_threads_per_block:
            return False
        # growing to a first whole warp is always allowed: a block needs one even where it leaves SMs idle
        return threads <= warp or tile_counts(expr, t)[1] >= min(sms, tile_counts(expr, prev)[1])

    if not fits(start, start):
        return []
    names = [a.name for a in expr.axes]
    spatial = [a.name for a in expr.axes if a.kind != REDUCE]
    # a block spans at most max_threads_per_block thread tiles; a reduction step at most what shared memory holds
    per_elem = max(1, rules.capacity // min(t.elem_bytes for t in expr.tensors))
    limits = {a.name: thread[a.name] * device.gpu.max_threads_per_block if a.kind != REDUCE else per_elem
              for a in expr.axes}
    # Growth along the best reuse can stop at a thread count no warp divides (7 x 8 threads over a 7-wide
    # axis); seeds grown along one spatial axis to a first whole warp give every growth an aligned start.
    seeds = [start]
    for a in reversed(spatial):
        seed = start
        while seed is not None and not warp_aligned(threads_per_block(expr, thread, seed), device):
            nxt = _next_aligned(expr.axis(a).extent, seed[a], axis_step(expr, a, rules), thread[a], eps, limits[a],
                                a in exact)
            seed = {**seed, a: nxt} if nxt is not None and fits({**seed, a: nxt}, seed) else None
        if seed is not None and seed not in seeds:
            seeds.append(seed)
    paths = []
    for seed in seeds:
        paths.append(_grow(expr, rules, seed, thread, eps, spatial, fits, limits))
        paths += [_grow(expr, rules, seed, thread, eps, spatial, fits, limits, a) for a in spatial if len(spatial) > 1]
    picks: list[dict[str, int]] = []
    for path in paths:
        aligned = [t for t in path if warp_aligned(threads_per_block(expr, thread, t), device)]
        picks += aligned
    out: list[dict[str, int]] = []
    for t in picks:
        variants = [t]
        for a in names:
            if expr.axis(a).kind != REDUCE:
                continue
            cur = t
            for _ in range(REDUCE_VARIANTS):
                nxt = _next_aligned(expr.axis(a).extent, cur[a], axis_step(expr, a, rules), thread[a], eps,
                                   limits[a], a in exact)
                if nxt is None or not fits({**cur, a: nxt}, cur):
                    break
                cur = {**cur, a: nxt}
                variants.append(cur)
        out += [v for v in variants if v not in out]
    return out


def _program(expr: Expr, tiles: list[dict[str, int]], device: Device, eps: float, est: GpuEstimate,
             shape: BlockReduction | TensorCoreLayout | None = None) -> RProgram:
    """The RProgram of one plan: thread and block tiles (``shape`` None), a block-level reduction
    (``shape`` a BlockReduction, ``roller.targets.cuda.reduce``: no input staged in shared memory, the reduction
    spread over its threads) or a tensor-core plan (``shape`` a TensorCoreLayout,
    ``roller.targets.cuda.tensorcore``: inputs staged with its fixed row padding)."""
    thread, block = tiles
    rules = GpuLevelRules.of(device, 1, expr)
    reduction = shape if isinstance(shape, BlockReduction) else None
    tensor_core = shape if isinstance(shape, TensorCoreLayout) else None
    if shape is not None and reduction is None and tensor_core is None:
        raise TypeError(f"{expr.name}: a GPU plan's shape is a BlockReduction or a TensorCoreLayout, got {shape!r}")
    staged = () if reduction else tuple(t.name for t in expr.inputs)
    if tensor_core:
        pads = dict.fromkeys(staged, ROW_PAD)
        lanes = dict.fromkeys(staged, TC_COPY_LANES)
    else:
        pads = {t.name: p for t in expr.inputs if t.name in staged and (p := bank_pad_elements(t, block, rules))}
        lanes = {t.name: copy_lanes(t, block, pads.get(t.name, 0)) for t in expr.inputs if t.name in staged}
    e = est.estimate
    kind = (GpuKind.TENSOR_CORE if tensor_core else GpuKind.BLOCK_REDUCTION if reduction else GpuKind.TILES)
    gpu = GpuPlan(kind=kind, threads=est.threads, model=est.block_model(), copy_lanes=lanes,
                  interleaved=() if tensor_core else interleaved_axes(expr, thread), tensor_core=tensor_core,
                  reduction=reduction)
    return RProgram(
        levels=tuple(lv.name for lv in device.private_levels), tiles=(dict(thread), dict(block)),
        grid={a.name: ceil_div(a.extent, block[a.name]) for a in expr.axes if a.kind != REDUCE},
        units=e.units, waves=e.waves, vector_axis=None, packed=staged,
        storage_pad=pads, predicated=tuple(a.name for a in expr.axes if a.extent % block[a.name]),
        predicted_seconds=e.seconds, compute_seconds=e.compute_seconds, memory_seconds=dict(e.memory_seconds),
        footprint_bytes=dict(e.footprint_bytes), traffic_bytes=dict(e.traffic_bytes), epsilon=eps, gpu=gpu)


def plan(expr: Expr, tiles: list[Mapping[str, int]], device: Device, epsilon: float = 0.0) -> RProgram:
    """The GPU plan with these (thread, block) tiles, as construction would record it (for tests and
    comparisons with other schedulers' tiles)."""
    tiles = [dict(t) for t in tiles]
    return _program(expr, tiles, device, epsilon, estimate(expr, tiles, device))


def enumerate_programs(expr: Expr, device: Device, epsilon: float, axes: tuple[str, ...] | None = None,
                       constants: frozenset[str] = frozenset(), limit: int | None = None) -> list[RProgram]:
    """Every GPU plan at one epsilon that fits an SM, ranked by the model (best first; the best ``limit``
    with ``limit``). GPU plans have no vector axis: ``axes`` (the vector axes construction still wants
    plans for) being empty asks for none. They pack nothing ahead of the kernel: ``constants`` is unused."""
    if axes is not None and not axes:
        return []
    found = []
    for thread in thread_tiles(expr, device, epsilon):
        for block in block_tiles(expr, device, thread, epsilon):
            est = estimate(expr, [thread, block], device)
            if est.occupancy.blocks_per_sm:
                found.append(([thread, block], est, None))
    for thread, block, shape in block_reduction_tiles(expr, device):  # rows long and few (roller.targets.cuda.reduce)
        est = estimate_block_reduction(expr, thread, block, shape, device)
        if est.occupancy.blocks_per_sm:
            found.append(([thread, block], est, shape))
    for warp, block, layout in tensorcore_tiles(expr, device):  # fp16 matmuls on sm_80+ (roller.targets.cuda.tensorcore)
        est = estimate_tensorcore(expr, warp, block, layout, device)
        if est.occupancy.blocks_per_sm:
            found.append(([warp, block], est, layout))
    ranked = rank(found, lambda x: x[1].estimate.seconds, lambda x: x[1].estimate.memory_seconds)

    def build(item):
        tiles, est, shape = item
        return _program(expr, tiles, device, epsilon, est, shape)
    # plain, block-reduction and tensor-core plans with the same tiles are distinct (the GpuPlan is in the key)
    return distinct_programs(ranked, build, lambda item: None, limit)


def vector_candidates(expr: Expr) -> tuple[str, ...]:
    """GPU threads compute scalars: no plan waits on a vector axis."""
    return ()
