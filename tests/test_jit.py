"""roller.serve.jit: the top-1 kernel at once, the profiled one from a background process, the memo, the
cache, several threads at once. Every kernel is run on fresh data and checked against numpy."""
import json
import os
import threading

import numpy as np
import pytest

import roller
import roller.builder.api as api
from roller.cache import open_store
from roller.cache import store as kc
from roller.tir import ops
from roller.cli import main
from roller.serve.jit import JIT, Kernel
from roller.measure.verify import fill_sentinel

pytestmark = pytest.mark.build


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    root = tmp_path / "kcache"
    monkeypatch.setenv(kc.CACHE_ENV, str(root))
    return root


def matmul(m, n=48, k=40):
    return ops.get_op("matmul").make({"M": m, "N": n, "K": k}, "float32")


def check(kernel: Kernel, m, n=48, k=40, seed=5):
    """Runs the kernel on fresh data; compares with numpy."""
    import tvm

    rng = np.random.default_rng(seed)
    a, b = rng.uniform(-1, 1, (m, k)).astype("float32"), rng.uniform(-1, 1, (k, n)).astype("float32")
    out = tvm.runtime.tensor(fill_sentinel(np.empty((m, n), "float32")))
    kernel(tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-4)


@pytest.fixture
def compiles(monkeypatch):
    """Counts the compiles of this process (outside the cache): (function's M, tier) per build."""
    seen = []
    lock = threading.Lock()
    original = api._build_uncached

    def counted(norm, expr, dev, topk, profile, *a, **k):
        with lock:
            seen.append((int(norm.params[0].shape[0]), "profiled" if profile else "top1"))
        return original(norm, expr, dev, topk, profile, *a, **k)

    monkeypatch.setattr(api, "_build_uncached", counted)
    return seen


def test_top1_at_once_then_the_profiled_kernel_replaces_it(cache_root, compiles, tmp_path, monkeypatch):
    log = tmp_path / "builds.jsonl"
    monkeypatch.setenv(api.BUILD_LOG_ENV, str(log))
    jit = JIT(topk=2)
    k = jit(matmul(24))
    assert k.tier == "top1" and k.report["cache"] == "miss" and k.report["tier"] == "top1"
    check(k, 24)
    assert k.wait(timeout=180), k._slot.error
    assert k.tier == "profiled" and k.report["candidates"][0]["measured_seconds"] > 0
    check(k, 24)  # the same handle now runs the profiled kernel
    assert compiles == [(24, "top1")]  # the profiled one was compiled by the background process...
    lines = [json.loads(line) for line in log.read_text().splitlines()]  # ...which logged its compile
    assert [(x["tier"], x["pid"] == os.getpid()) for x in lines] == [("top1", True), ("profiled", False)]
    assert lines[1]["key"] == k.report["cache_key"] != lines[0]["key"]
    # a structurally equal function (made again) is the memo's: nothing built, nothing looked up
    again = jit(matmul(24))
    assert again._slot is k._slot and again.tier == "profiled" and jit.kernels() == 1
    # another process (a fresh JIT: empty memo) finds the profiled kernel in the cache at once
    other = JIT(topk=2)
    k2 = other(matmul(24))
    assert k2.tier == "profiled" and k2.report["cache"] == "hit"
    assert k2.report["cache_key"] == k.report["cache_key"]
    check(k2, 24)
    assert compiles == [(24, "top1")]
    st = open_store().stats()
    assert st["entries"] == 2  # the top-1 and the profiled entry
    jit.close()
    other.close()


def test_tiers_top1_only_and_waiting_for_the_profiled(cache_root, compiles):
    jit = JIT(topk=2)
    k = jit(matmul(8), tier="top1")
    assert k.tier == "top1" and not k._slot.queued  # nothing started in the background
    check(k, 8)
    p = jit(matmul(8), tier="profiled", timeout=180)
    assert p.tier == "profiled"
    check(p, 8)
    assert k.tier == "top1"  # a top1 handle stays on the top-1 kernel
    assert compiles == [(8, "top1")]
    with pytest.raises(roller.RollerError, match="tier must be one of any, top1, profiled"):
        jit(matmul(8), tier="fast")
    off = JIT(background=0)
    with pytest.raises(roller.BuildError, match="background profile failed: background profiling is off"):
        off(matmul(9), tier="profiled", timeout=60)
    jit.close()


def test_threads_asking_at_once_compile_each_function_once(cache_root, compiles):
    jit = JIT(background=0)
    sizes = [5, 6, 7, 5, 6, 7, 5, 6]  # three functions, each asked by several threads, compiled concurrently
    barrier = threading.Barrier(len(sizes))
    errors, kernels = [], {}

    def ask(i, m):
        try:
            barrier.wait()
            k = jit(matmul(m), tier="top1")
            check(k, m, seed=i)
            kernels[i] = k
        except Exception as e:  # noqa: BLE001 -- reported by the assertion below
            errors.append(repr(e))

    threads = [threading.Thread(target=ask, args=(i, m)) for i, m in enumerate(sizes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(compiles) == [(5, "top1"), (6, "top1"), (7, "top1")]
    assert jit.kernels() == 3 and len({id(k._slot) for k in kernels.values()}) == 3
    # separate JITs (as separate servers in one process) share the cache, not the memo
    others = [JIT(background=0) for _ in range(3)]
    hits = []
    threads = [threading.Thread(target=lambda j=j: hits.append(j(matmul(7), tier="top1").report["cache"]))
               for j in others]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert hits == ["hit"] * 3 and len(compiles) == 3


def test_cli_build_json_says_the_tier(cache_root, capsys):
    assert main(["build", "add_relu", "--shape", "M=3,N=20", "--no-profile", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["tier"] == "top1" and rep["verified"] and rep["schema"] == api.REPORT_SCHEMA == 1
    assert main(["build", "add_relu", "--shape", "M=3,N=20", "--topk", "2", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["tier"] == "profiled" and rep["cache"] == "miss"


def test_a_background_build_process_that_dies_leaves_the_top1_kernel_and_is_replaced(cache_root):
    import time

    jit = JIT(topk=2)
    k = jit(matmul(11))
    time.sleep(0.5)
    assert not jit._procs  # nothing runs in the background before a first response
    check(k, 11)           # ... which this is
    deadline = time.time() + 60
    while not jit._procs and time.time() < deadline:  # the build process has started
        time.sleep(0.01)
    want = os.getpriority(os.PRIO_PROCESS, 0) + roller.serve.jit.BACKGROUND_NICE
    for proc in jit._procs:  # below the server's priority (its first statement, once Python has started)
        while os.getpriority(os.PRIO_PROCESS, proc.pid) != want and time.time() < deadline:
            time.sleep(0.01)
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == want
    with pytest.warns(roller.serve.jit.JITWarning, match="profiling .* failed, its top-1 kernel stays"):
        for proc in list(jit._procs):
            proc.kill()  # as a TVM crash would end it
        assert not k.wait(timeout=120)
    assert k.tier == "top1" and "background build process died" in k._slot.error
    check(k, 11)
    k2 = jit(matmul(12))  # the next function gets a new build process
    assert k2.wait(timeout=180) and k2.tier == "profiled"
    check(k2, 12)
    jit.close()


def _record_pid_and_hang(index, program):
    """Worker hook: notes the worker's pid, then compiles "forever"."""
    import time
    with open(os.environ["HANG_PIDS"], "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(120)


HANGING_CALLER = """
import numpy as np, roller
from roller import ops
from roller.builder.farm import profile
from test_jit import _record_pid_and_hang
func = ops.get_op("add_relu").make({"M": 4, "N": 16}, "float32")
expr, norm = roller.analyze(func)
plans = roller.construct(expr, roller.load_device(), 2).programs
ins = [np.ones((4, 16), "float32")] * 2
profile(norm, expr, plans, roller.load_device(), ins, progress=False, _worker_hook=_record_pid_and_hang)
"""


def test_profiling_workers_end_with_a_caller_that_was_killed(tmp_path):
    """The JIT kills its background build process on close (and a TVM crash ends it): the profile's
    worker processes must not outlive it (forkserver workers otherwise wait for work forever)."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    pids = tmp_path / "pids"
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, HANG_PIDS=str(pids), PYTHONPATH=f"{repo}{os.pathsep}{repo / 'tests'}")
    caller = subprocess.Popen([sys.executable, "-c", HANGING_CALLER], env=env)
    deadline = time.time() + 90
    while (not pids.exists() or len(pids.read_text().split()) < 2) and time.time() < deadline:
        time.sleep(0.05)
    workers = [int(p) for p in pids.read_text().split()]
    assert len(workers) == 2  # both workers are compiling
    caller.send_signal(signal.SIGKILL)
    caller.wait()
    deadline = time.time() + 20
    alive = workers
    while alive and time.time() < deadline:
        time.sleep(0.1)
        alive = [p for p in workers if _running(p)]
    assert not alive, f"workers {alive} outlived their caller"


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_the_memo_keeps_the_most_recently_used_functions_within_its_bound(cache_root, compiles):
    jit = JIT(background=0, memo_size=2)
    k4, k5 = jit(matmul(4), tier="top1"), jit(matmul(5), tier="top1")
    jit(matmul(4), tier="top1")                 # 4 is now the most recently used: 5 goes first
    k6 = jit(matmul(6), tier="top1")
    assert jit.kernels() == 2 and compiles == [(4, "top1"), (5, "top1"), (6, "top1")]
    assert jit(matmul(4), tier="top1")._slot is k4._slot   # still held: no lookup, no compile
    again = jit(matmul(5), tier="top1")          # dropped: found in the persistent cache, not compiled
    assert again._slot is not k5._slot and again.result.report["cache"] == "hit"
    assert len(compiles) == 3 and jit.kernels() == 2
    for k, m in ((k4, 4), (k5, 5), (k6, 6), (again, 5)):  # handles of dropped functions keep working
        check(k, m)
    with pytest.raises(roller.RollerError, match="memo_size"):
        JIT(memo_size=0)
