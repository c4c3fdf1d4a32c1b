"""The latencies `roller compile` reports (roller.frontend.check_against_onnxruntime, roller.timing) against
the engines timed alone, and the output check's tolerance at tiny output scales."""
from __future__ import annotations

import statistics
import time

import numpy as np
import pytest

from roller import frontend, timing


class _Engine:
    """An engine whose first calls after a pause are slow, on a clock of its own that roller.timing reads in
    place of time.perf_counter (monkeypatched): each call advances it by the call's duration, so that the
    test neither waits nor depends on the machine's load. ``slow`` seconds a call for the first
    ``seconds`` seconds (with ``ramp``, from ``slow`` down to ``fast`` over them), then ``fast``."""

    def __init__(self, slow: float, fast: float, seconds: float, ramp: bool = False):
        self.slow, self.fast, self.seconds, self.ramp = slow, fast, seconds, ramp
        self.now, self.start = 0.0, None

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s

    def __call__(self) -> None:
        if self.start is None:
            self.start = self.now
        age = self.now - self.start
        if age >= self.seconds:
            self.now += self.fast
        else:
            self.now += self.slow + (self.fast - self.slow) * age / self.seconds if self.ramp else self.slow


def test_median_seconds_times_the_steady_state_after_slow_first_calls(monkeypatch):
    """Calls 4x slower for their first 0.1 s (an engine's thread pool waking after a pause): the warm-up
    takes them; a batch of 0.02 s after a warm-up of 0.02 s (the check's former method) measured them."""
    engine = _Engine(4e-3, 1e-3, 0.1)
    monkeypatch.setattr(timing, "time", engine)
    assert timing.median_seconds(engine, target=0.05, repeats=3) == pytest.approx(1e-3)
    engine = _Engine(4e-3, 1e-3, 0.1)
    monkeypatch.setattr(timing, "time", engine)
    assert timing.median_seconds(engine, target=0.02, repeats=1, warmup=0.0) == pytest.approx(4e-3)


def test_warm_up_goes_on_while_the_calls_speed_up(monkeypatch):
    """Calls getting faster over 0.3 s, longer than the 0.2 s warm-up: the warm-up goes on (up to 0.4 s)
    while its last quarter is faster than the one before, and the batch sees the steady state; it stops
    at twice its length where the calls go on speeding up."""
    engine = _Engine(4e-3, 1e-3, 0.3, ramp=True)
    monkeypatch.setattr(timing, "time", engine)
    assert timing.median_seconds(engine, target=0.05, repeats=3, warmup=0.2) == pytest.approx(1e-3)
    engine = _Engine(8e-3, 1e-3, 0.5, ramp=True)
    monkeypatch.setattr(timing, "time", engine)
    timing.warm_up(engine, 0.2)
    assert 0.4 <= engine.now < 0.45  # eight quarters, each ending at its first call past 0.05 s


def test_warm_up_calls_a_slow_function_at_least_three_times(monkeypatch):
    engine = _Engine(1.0, 1.0, 0.0)
    monkeypatch.setattr(timing, "time", engine)
    assert timing.warm_up(engine, 0.2) == 1.0 and engine.now == 3.0


def test_tiny_outputs_must_match_at_their_own_scale():
    """Outputs ~1e-14 (a network with random weights) are compared at their scale: 3x the right answer
    no longer matches (an absolute atol of 1e-3 passed it), float32 rounding still does."""
    ref = (np.linspace(-1, 1, 64, dtype=np.float32) * 1e-14).reshape(8, 8)
    wrong = frontend.compare([ref * 3], [ref])
    assert not wrong["matches"] and wrong["max_rel_error"] == pytest.approx(2.0, rel=1e-5)
    assert wrong["max_abs_error"] < 1e-13  # what an absolute tolerance looked at
    close = frontend.compare([ref * np.float32(1 + 1e-6)], [ref])
    assert close["matches"] and close["max_rel_error"] < 1e-5
    # one output tiny and wrong, another large and right: no match
    big = np.ones((3,), np.float32)
    assert not frontend.compare([big, ref * 3], [big, ref])["matches"]


def test_compare_scale_edges():
    """A reference of zeros needs zeros; integer outputs must be equal; a NaN never matches."""
    z = np.zeros((4,), np.float32)
    assert frontend.compare([z], [z])["matches"]
    assert not frontend.compare([z + 1e-30], [z])["matches"]
    i = np.arange(4, dtype=np.int64)
    assert frontend.compare([i], [i])["matches"] and not frontend.compare([i + 1], [i])["matches"]
    nan = np.array([1.0, np.nan], np.float32)
    res = frontend.compare([nan], [np.array([1.0, 2.0], np.float32)])
    assert not res["matches"] and np.isnan(res["max_rel_error"])
