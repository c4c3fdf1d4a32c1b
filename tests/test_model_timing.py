"""The latencies `roller compile` reports (roller.models.frontend.check_against_onnxruntime, roller.measure.timing) against
the engines timed alone, and the output check's tolerance at tiny output scales."""
from __future__ import annotations

import statistics
import time

import numpy as np
import pytest

from roller.models import frontend
from roller.measure import timing


class _Clock:
    """A clock that roller.measure.timing reads in place of the time module (monkeypatched) and that the fake
    engines advance by their calls' durations: the tests neither wait nor depend on the machine's load."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


class _Engine:
    """An engine whose first calls are slow: ``slow`` seconds a call for the first ``seconds`` seconds
    (with ``ramp``, from ``slow`` down to ``fast`` over them), then ``fast``; with ``after_pause``, again
    after every pause longer than that (an engine's thread pool falling asleep when it is not called)."""

    def __init__(self, slow: float, fast: float, seconds: float, ramp: bool = False,
                 after_pause: float | None = None, clock: _Clock | None = None):
        self.slow, self.fast, self.seconds, self.ramp, self.after_pause = slow, fast, seconds, ramp, after_pause
        self.clock = clock or _Clock()
        self.start = self.last = None

    @property
    def now(self) -> float:
        return self.clock.now

    def __call__(self) -> None:
        c = self.clock
        if self.start is None or (self.after_pause is not None and c.now - self.last > self.after_pause):
            self.start = c.now
        age = c.now - self.start
        if age >= self.seconds:
            c.now += self.fast
        else:
            c.now += self.slow + (self.fast - self.slow) * age / self.seconds if self.ramp else self.slow
        self.last = c.now


def test_median_seconds_times_the_steady_state_after_slow_first_calls(monkeypatch):
    """Calls 4x slower for their first 0.1 s (an engine's thread pool waking after a pause): the warm-up
    takes them; a batch of 0.02 s after a warm-up of 0.02 s (the check's former method) measured them."""
    engine = _Engine(4e-3, 1e-3, 0.1)
    monkeypatch.setattr(timing, "time", engine.clock)
    assert timing.median_seconds(engine, target=0.05, repeats=3) == pytest.approx(1e-3)
    engine = _Engine(4e-3, 1e-3, 0.1)
    monkeypatch.setattr(timing, "time", engine.clock)
    assert timing.median_seconds(engine, target=0.02, repeats=1, warmup=0.0) == pytest.approx(4e-3)


def test_warm_up_goes_on_while_the_calls_speed_up(monkeypatch):
    """Calls getting faster over 0.3 s, longer than the 0.2 s warm-up: the warm-up goes on (up to 0.4 s)
    while its last quarter is faster than the one before, and the batch sees the steady state; it stops
    at twice its length where the calls go on speeding up."""
    engine = _Engine(4e-3, 1e-3, 0.3, ramp=True)
    monkeypatch.setattr(timing, "time", engine.clock)
    assert timing.median_seconds(engine, target=0.05, repeats=3, warmup=0.2) == pytest.approx(1e-3)
    engine = _Engine(8e-3, 1e-3, 0.5, ramp=True)
    monkeypatch.setattr(timing, "time", engine.clock)
    timing.warm_up(engine, 0.2)
    assert 0.4 <= engine.now < 0.45  # eight quarters, each ending at its first call past 0.05 s


def test_warm_up_calls_a_slow_function_at_least_three_times(monkeypatch):
    engine = _Engine(1.0, 1.0, 0.0)
    monkeypatch.setattr(timing, "time", engine.clock)
    assert timing.warm_up(engine, 0.2) == 1.0 and engine.now == 3.0


class _Output:
    def numpy(self):
        return np.ones(4, np.float32)


class _FakeModel:
    """What check_against_onnxruntime reads of a CompiledModel, running a fake engine."""

    def __init__(self, engine: _Engine):
        self.engine = engine
        self.device = type("D", (), {"units": type("U", (), {"count": 2})()})()

    def random_inputs(self, seed: int = 0) -> dict:
        return {}

    def run_fn(self, feeds):
        return lambda: (self.engine(), _Output())[1]

    def run(self, feeds):
        return [self.run_fn(feeds)().numpy()]


def _fake_onnxruntime(monkeypatch, clock, engine):
    """The check's onnxruntime session and the timing's clock replaced: the session runs ``engine`` (an
    _Engine on ``clock``) and returns one output the fake roller model's output matches."""
    class Session:
        def run(self, names, feeds):
            engine()
            return [np.ones(4, np.float32)]

    monkeypatch.setattr(timing, "time", clock)
    monkeypatch.setattr(frontend, "load_onnx", lambda model: model)
    monkeypatch.setattr(frontend, "onnxruntime_session", lambda proto, threads: Session())


def test_check_times_each_engine_after_its_warm_up(monkeypatch):
    """check_against_onnxruntime against two fake engines, each 4x slower (onnxruntime) or 2x slower
    (roller) for 0.1 s after every pause of over 50 ms: both latencies are the steady 1 ms and the paired
    ratio 1. The check's former constants (a 0.02 s warm-up, then a 0.02 s batch, 7 rounds) reported
    onnxruntime at 4 ms here."""
    clock = _Clock()
    ours = _Engine(2e-3, 1e-3, 0.1, after_pause=0.05, clock=clock)
    theirs = _Engine(4e-3, 1e-3, 0.1, after_pause=0.05, clock=clock)
    _fake_onnxruntime(monkeypatch, clock, theirs)
    check = frontend.check_against_onnxruntime(_FakeModel(ours), "model.onnx", openvino=False)
    assert check["matches"]
    assert check["onnxruntime_latency_seconds"] == pytest.approx(1e-3, rel=0.01)
    assert check["latency_seconds"] == pytest.approx(1e-3, rel=0.01)
    assert check["onnxruntime_over_roller"] == pytest.approx(1.0, rel=0.01)
    assert check["peers"] == ["onnxruntime"] and check["fastest_peer"] == "onnxruntime"


def _fake_peers(monkeypatch, openvino_runner):
    """roller at 2 ms and onnxruntime at 1 ms on a fake clock; OpenVINO from ``openvino_runner(clock)``."""
    clock = _Clock()
    ours = _Engine(2e-3, 2e-3, 0.0, clock=clock)
    theirs = _Engine(1e-3, 1e-3, 0.0, clock=clock)
    _fake_onnxruntime(monkeypatch, clock, theirs)
    monkeypatch.setattr(frontend, "openvino_runner", openvino_runner(clock))
    return frontend.check_against_onnxruntime(_FakeModel(ours), "model.onnx")


def test_openvino_is_a_second_peer_where_it_runs(monkeypatch):
    """A peer at 0.5 ms: timed in the same rounds, the fastest peer; ratios paired per round."""
    def runner(clock):
        def call():
            clock.now += 0.5e-3
            return [np.ones(4, np.float32)]
        return lambda proto, threads: lambda feeds: call

    check = _fake_peers(monkeypatch, runner)
    assert check["peers"] == ["onnxruntime", "openvino"] and check["fastest_peer"] == "openvino"
    assert check["openvino_matches"] and check["openvino_latency_seconds"] == pytest.approx(0.5e-3, rel=0.01)
    assert check["openvino_over_roller"] == pytest.approx(0.25, rel=0.01)
    assert check["onnxruntime_over_roller"] == pytest.approx(0.5, rel=0.01)


def test_openvino_that_fails_or_disagrees_is_left_out(monkeypatch):
    def fails(proto, threads):
        raise RuntimeError("Unsupported operator: Foo")
    check = _fake_peers(monkeypatch, lambda clock: fails)
    assert check["peers"] == ["onnxruntime"] and "Unsupported operator" in check["openvino_error"]

    wrong = lambda proto, threads: lambda feeds: lambda: [np.zeros(4, np.float32)]
    check = _fake_peers(monkeypatch, lambda clock: wrong)
    assert check["peers"] == ["onnxruntime"] and check["openvino_matches"] is False
    assert "differ" in check["openvino_error"]

    check = _fake_peers(monkeypatch, lambda clock: lambda proto, threads: None)  # not importable
    assert check["peers"] == ["onnxruntime"] and "openvino_error" not in check


@pytest.mark.build
def test_openvino_peer_on_a_real_model():
    """Where openvino is installed (it is no dependency of roller, nor of its tests): OpenVINO compiles the
    small CNN from its ONNX bytes, matches onnxruntime and is timed as a peer."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    pytest.importorskip("openvino")
    import onnx_models  # tests/ is on sys.path under pytest

    import roller

    model = onnx_models.small_cnn()
    cm = roller.compile_model(model, profile=False)
    check = frontend.check_against_onnxruntime(cm, model, rounds=3)
    assert check["matches"] and check["openvino_matches"], check
    assert check["peers"] == ["onnxruntime", "openvino"] and check["openvino_latency_seconds"] > 0
    assert check["fastest_peer"] in check["peers"]


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


def _steady_seconds(fn, warmup: float = 0.5, batch: float = 0.1, batches: int = 5) -> float:
    """Seconds per call of ``fn`` in a steady loop: a pause (no other thread pool spinning), ``warmup``
    seconds of calls, then the median of ``batches`` back-to-back batches of ~``batch`` seconds."""
    time.sleep(timing.SETTLE_SECONDS)
    n, start = 0, time.perf_counter()
    while n < 3 or time.perf_counter() - start < warmup:
        fn()
        n += 1
    number = max(1, int(batch * n / (time.perf_counter() - start)))
    res = []
    for _ in range(batches):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        res.append((time.perf_counter() - t) / number)
    return statistics.median(res)


@pytest.mark.build
def test_onnxruntime_latency_in_the_report_is_its_steady_speed():
    """The onnxruntime figure of the check is within 1.3x of onnxruntime timed alone in a steady loop, in
    this process, on its own session, with roller's VM idle. The alone figure is taken before and after
    the check, and the check's figure must fall within 1.3x of that bracket (the machine's speed may move
    between the two)."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    import onnx_models  # tests/ is on sys.path under pytest

    import roller
    model = onnx_models.small_cnn(size=96, channels=32)  # ~0.3-0.5 ms on 2 cores
    cm = roller.compile_model(model, profile=False)
    feeds = cm.random_inputs(0)
    sess = frontend.onnxruntime_session(model, cm.device.units.count)
    alone = [_steady_seconds(lambda: sess.run(None, feeds))]
    check = frontend.check_against_onnxruntime(cm, model, time_it=True)
    alone.append(_steady_seconds(lambda: sess.run(None, feeds)))
    ort = check["onnxruntime_latency_seconds"]
    assert check["matches"], check
    assert min(alone) / 1.3 <= ort <= 1.3 * max(alone), (ort, alone)
