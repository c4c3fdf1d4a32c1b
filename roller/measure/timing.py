"""Timing implementations alternately on a shared, noisy machine: the benchmark scripts' method, also
used by roller.models.frontend to time a compiled model against onnxruntime."""
from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable, Sequence

WARMUP_SECONDS = 0.2  # untimed calls right before each timed batch (see warm_up)
WARMUP_SPEEDUP = 1.1  # the warm-up goes on while its last quarter ran this much faster than the one before


def warm_up(fn: Callable[[], Any], seconds: float = WARMUP_SECONDS, min_calls: int = 3) -> float:
    """Calls ``fn`` for ``seconds`` (and at least ``min_calls`` times), in quarters, and returns the last
    quarter's seconds per call; it goes on, up to twice as long, while the calls are still getting faster
    (the last quarter more than WARMUP_SPEEDUP times faster than the one before).

    An engine called after a pause runs its first calls slower, for tens of milliseconds or longer:
    its thread pool's workers are asleep and must be woken (at every parallel section until they spin
    again), the cores may have been handed to other work or clocked down. A timed batch that starts
    right after the pause measures that instead of the engine."""
    quarter = seconds / 4
    calls, means = 0, []
    start = time.perf_counter()
    while True:
        t0, k = time.perf_counter(), 0
        while k < 1 or time.perf_counter() - t0 < quarter:
            fn()
            k += 1
        means.append((time.perf_counter() - t0) / k)
        calls += k
        elapsed = time.perf_counter() - start
        if calls < min_calls or elapsed < seconds:
            continue
        if elapsed >= 2 * seconds or len(means) < 2 or means[-1] * WARMUP_SPEEDUP >= means[-2]:
            return means[-1]


def median_seconds(fn: Callable[[], Any], target: float = 0.05, repeats: int = 3,
                   warmup: float = WARMUP_SECONDS) -> float:
    """Median seconds per call of ``fn`` over ``repeats`` timed batches of ~``target`` seconds each (as
    many calls as fit in ``target`` at the warm-up's last speed, at least one), right after a warm-up of
    ``max(warmup, target)`` seconds and at least 3 calls (:func:`warm_up`).

    The warm-up also takes first calls' JIT compilation, primitive caches (oneDNN) and page faults out
    of the batches; sizing the batches from one of those would make each batch a single slow call.
    Sizing them from the fastest call instead made them up to 4x longer than ``target`` on a loaded
    machine, where a few calls ran far faster than the rest."""
    per_call = warm_up(fn, max(warmup, target))
    number = max(1, math.ceil(target / max(per_call, 1e-7)))
    res = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        res.append((time.perf_counter() - t) / number)
    return statistics.median(res)


SETTLE_SECONDS = 0.25  # pause before timing the next implementation (see time_alternately)


def time_rounds(impls: Sequence[tuple[str, Callable[[], Any]]], rounds: int = 5, target: float = 0.05,
                repeats: int = 3, settle: float = SETTLE_SECONDS,
                measure: Callable[[Callable[[], Any]], float] | None = None,
                warmup: float = WARMUP_SECONDS) -> dict[str, list[float]]:
    """Seconds per call of each (name, fn) in each of ``rounds`` rounds, every implementation timed in turn
    in each round, this process; see :func:`time_alternately` for why. ``measure(fn)`` times one (default:
    :func:`median_seconds` with ``target``, ``repeats`` and ``warmup``, so that each implementation is
    warmed up right before its own batches; the scripts pass a thread-CPU-time one)."""
    if measure is None:
        def measure(fn):
            return median_seconds(fn, target, repeats, warmup)
    times: dict[str, list[float]] = {name: [] for name, _ in impls}
    for _ in range(rounds):
        for name, fn in impls:
            if settle:
                time.sleep(settle)
            times[name].append(measure(fn))
    return times


def time_alternately(impls: Sequence[tuple[str, Callable[[], Any]]], rounds: int = 5, target: float = 0.05,
                     repeats: int = 3, settle: float = SETTLE_SECONDS,
                     measure: Callable[[Callable[[], Any]], float] | None = None,
                     warmup: float = WARMUP_SECONDS) -> dict[str, float]:
    """Median seconds per call of each (name, fn), timed in turn ``rounds`` times in this process.

    Alternating (rather than timing one implementation, then the next) exposes every implementation to
    the same drift of a shared machine (other jobs, clock changes). Each timing starts ``settle`` seconds
    after the previous one: a thread pool keeps its threads spinning for a while after its last call
    (PyTorch's OpenMP, OpenBLAS, TVM's own pool) and steals the cores from whatever runs next: measured
    here, roller's conv2d 56x56x64 ran at 1.59 ms right after PyTorch's conv and 1.15 ms after a pause
    (and PyTorch with OMP_WAIT_POLICY=PASSIVE 2x slower, so the pause, not a passive policy, is fair).
    After the pause each implementation is warmed up again (``warmup`` seconds, :func:`warm_up`) before
    its timed batches: the pause leaves its own thread pool asleep too."""
    times = time_rounds(impls, rounds, target, repeats, settle, measure, warmup)
    return {k: statistics.median(v) for k, v in times.items()}


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> float:
    """The median over rounds of one round's ratio (two lists of per-round seconds, :func:`time_rounds`).
    Where the machine's speed moves between rounds (on a VM whose neighbours share its cores, by up to 1.6x
    within seconds) the two times of one round saw the same speed, and their ratio cancels it; the ratio of
    the two medians does not, as each median may fall in a round of another speed."""
    return statistics.median(n / d for n, d in zip(numerator, denominator, strict=True))


def fastest_peer(rounds: dict[str, Sequence[float]], peers: Sequence[str], base: str = "roller") -> tuple[str, float]:
    """Of ``peers`` (names in ``rounds``, :func:`time_rounds`), the one of lowest median seconds over the
    rounds, and its :func:`paired_ratio` to ``base`` (peer / base per round, their median: > 1, ``base`` is
    the faster). The choice is by medians, the ratio by rounds; a tie goes to the first peer listed."""
    if not peers:
        raise ValueError("no peers to choose from")
    best = min(peers, key=lambda name: statistics.median(rounds[name]))
    return best, paired_ratio(rounds[best], rounds[base])
