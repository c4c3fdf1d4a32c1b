"""Timing implementations alternately on a shared, noisy machine: the benchmark scripts' method, also
used by roller.models.frontend to time a compiled model against onnxruntime."""
from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable, Sequence


def median_seconds(fn: Callable[[], Any], target: float = 0.05, repeats: int = 3) -> float:
    """Median seconds per call of ``fn`` over ``repeats`` timed batches of ~``target`` seconds each.

    A warm-up of ~``target`` seconds (at least 3 calls) comes first: first calls pay for JIT compilation,
    primitive caches (oneDNN) and page faults, and sizing the batches from one of those would make
    each batch a single slow call."""
    best, n, end = math.inf, 0, time.perf_counter() + target
    while n < 3 or time.perf_counter() < end:
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
        n += 1
    number = max(1, int(target / max(best, 1e-7)))
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
                measure: Callable[[Callable[[], Any]], float] | None = None) -> dict[str, list[float]]:
    """Seconds per call of each (name, fn) in each of ``rounds`` rounds, every implementation timed in turn
    in each round, this process; see :func:`time_alternately` for why. ``measure(fn)`` times one (default:
    :func:`median_seconds` with ``target`` and ``repeats``; the scripts pass a thread-CPU-time one)."""
    if measure is None:
        def measure(fn):
            return median_seconds(fn, target, repeats)
    times: dict[str, list[float]] = {name: [] for name, _ in impls}
    for _ in range(rounds):
        for name, fn in impls:
            if settle:
                time.sleep(settle)
            times[name].append(measure(fn))
    return times


def time_alternately(impls: Sequence[tuple[str, Callable[[], Any]]], rounds: int = 5, target: float = 0.05,
                     repeats: int = 3, settle: float = SETTLE_SECONDS,
                     measure: Callable[[Callable[[], Any]], float] | None = None) -> dict[str, float]:
    """Median seconds per call of each (name, fn), timed in turn ``rounds`` times in this process.

    Alternating (rather than timing one implementation, then the next) exposes every implementation to
    the same drift of a shared machine (other jobs, clock changes). Each timing starts ``settle`` seconds
    after the previous one: a thread pool keeps its threads spinning for a while after its last call
    (PyTorch's OpenMP, OpenBLAS, TVM's own pool) and steals the cores from whatever runs next: measured
    here, roller's conv2d 56x56x64 ran at 1.59 ms right after PyTorch's conv and 1.15 ms after a pause
    (and PyTorch with OMP_WAIT_POLICY=PASSIVE 2x slower, so the pause, not a passive policy, is fair)."""
    times = time_rounds(impls, rounds, target, repeats, settle, measure)
    return {k: statistics.median(v) for k, v in times.items()}


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> float:
    """The median over rounds of one round's ratio (two lists of per-round seconds, :func:`time_rounds`).
    Where the machine's speed moves between rounds (on a VM whose neighbours share its cores, by up to 1.6x
    within seconds) the two times of one round saw the same speed, and their ratio cancels it; the ratio of
    the two medians does not, as each median may fall in a round of another speed."""
    return statistics.median(n / d for n, d in zip(numerator, denominator, strict=True))
