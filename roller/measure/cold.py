"""Timing calls on cold caches: each call right after a write large enough to push everything else out of
the caches, as a model's other layers leave a layer's weights in memory. Used by calibration's prefetch
probe and by the scripts (``scripts/benchutil.py`` re-exports it)."""
from __future__ import annotations

import glob
from typing import Any, Callable

import numpy as np


def last_cache_bytes() -> int:
    """Bytes of this machine's last-level cache as Linux reports it (0 where it does not). Not the device
    spec's L3: a VM's spec may give its share, and the host's whole cache keeps data between calls
    (here 300 MiB, where 64 MB written evicted none of ResNet-50's weights)."""
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        text = open(path).read().strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        try:
            sizes.append(int(text.rstrip("KMG")) * scale)
        except ValueError:
            continue
    return max(sizes, default=0)


def flush_bytes() -> int:
    """Bytes written between cold calls: twice the last-level cache, and at least 64 MB, so that a call finds
    none of its operands cached."""
    return max(64 << 20, 2 * last_cache_bytes())


class ColdTimer:
    """Times single calls of a function, each right after :func:`flush_bytes` written have pushed everything
    else out of the caches (a write of 600 MB takes ~0.1 s); ``clock`` is the clock to read
    (time.perf_counter, or time.thread_time on one thread)."""

    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self._flush = np.ones(flush_bytes() // 8)

    def __call__(self, fn: Callable[[], Any], calls: int = 5) -> list[float]:
        """Seconds of each of ``calls`` cold calls of ``fn``."""
        out = []
        for _ in range(calls):
            np.add(self._flush, 1.0, out=self._flush)
            start = self.clock()
            fn()
            out.append(self.clock() - start)
        return out
