"""The persistent kernel cache: hits equal misses (checked against numpy), one compile per key across
processes and threads, atomic publication under SIGKILL, corrupt entries rebuilt, LRU eviction, the
CLI's --no-cache / "cache" field / `roller cache`."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import roller
from roller.cache import open_store
from roller.cache import store as kc
from roller.tir import ops
from roller.cli import main
from roller.measure.verify import fill_sentinel

REPO = Path(__file__).resolve().parents[1]
OP, SHAPE = "add_relu", {"M": 5, "N": 37}  # tiny: top-1 builds in well under a second


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    root = tmp_path / "kcache"
    monkeypatch.setenv(kc.CACHE_ENV, str(root))
    monkeypatch.delenv(kc.SIZE_ENV, raising=False)
    return root


def check_numpy(module, op=OP, shape=SHAPE, seed=11):
    """Runs ``module`` on fresh inputs and compares with the operator's numpy reference."""
    import tvm

    spec = ops.OPS[op]
    full = ops.validate_shape(op, shape, "float32")
    arrays = spec.inputs(full, "float32", np.random.default_rng(seed))
    dev = tvm.cpu()
    out = tvm.runtime.tensor(fill_sentinel(np.empty(spec.output_shape(full), "float32")), dev)
    module["main"](*[tvm.runtime.tensor(a, dev) for a in arrays], out)
    np.testing.assert_allclose(out.numpy(), spec.reference(arrays, full), rtol=1e-5, atol=1e-5)


def entries(root) -> list[Path]:
    d = Path(root) / "entries"
    return sorted(d.iterdir()) if d.is_dir() else []


def build(**kw):
    return roller.build_op(OP, SHAPE, profile=False, **kw)


# ---------------------------------------------------------------------------------------------
# Through the API.

@pytest.mark.build
def test_hit_after_miss_gives_the_same_kernel_and_numbers(cache_root):
    first = build()
    assert first.report["cache"] == "miss" and len(entries(cache_root)) == 1
    t = time.perf_counter()
    second = build()
    hit_seconds = time.perf_counter() - t
    assert second.report["cache"] == "hit" and second.report["cache_key"] == first.report["cache_key"]
    assert Path(second.library).parent == entries(cache_root)[0]
    assert second.program == first.program
    skip = {"cache", "build_seconds", "cached_build_seconds"}
    assert {k: v for k, v in second.report.items() if k not in skip} == \
           {k: v for k, v in first.report.items() if k not in skip}
    assert second.report["cached_build_seconds"] == first.report["build_seconds"]
    assert hit_seconds < first.report["build_seconds"]
    check_numpy(first.module)
    check_numpy(second.module)
    # another option set is another key
    third = build(cache=True, build_budget=None)  # top-1: the budget does not matter, same key
    assert third.report["cache"] == "hit"
    assert roller.build_op(OP, SHAPE, topk=2).report["cache"] == "miss"
    assert len(entries(cache_root)) == 2
    st = open_store().stats()
    assert (st["hits"], st["misses"], st["entries"]) == (2, 2, 2)


@pytest.mark.build
def test_wrong_arrays_are_an_error_on_a_hit_too(cache_root):
    func = ops.matmul(8, 8, 8)
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((8, 8)).astype("float32"), rng.standard_normal((8, 8)).astype("float32")
    res = roller.build(func, profile=False, inputs=[a, b], reference=a @ b)
    assert res.report["cache"] == "miss"
    with pytest.raises(roller.BuildError, match=r"input A must be an array of shape \(8, 8\)"):
        roller.build(func, profile=False, inputs=[a[:4], b])
    assert roller.build(func, profile=False).report["cache"] == "hit"


def test_key_covers_function_device_and_options():
    f1 = ops.get_op("matmul").make({"M": 8, "N": 8, "K": 8}, "float32")
    f2 = ops.get_op("matmul").make({"M": 8, "N": 8, "K": 9}, "float32")
    _, n1 = roller.analyze(f1)
    _, n2 = roller.analyze(f2)
    dev = roller.load_device("x86-avx512")
    opts = {"profile": True, "topk": 2, "build_budget": 5.0}
    k1, parts = kc.kernel_key(n1, dev, opts)
    assert kc.kernel_key(roller.analyze(f1)[1], dev, opts)[0] == k1  # deterministic
    assert kc.kernel_key(n2, dev, opts)[0] != k1
    assert kc.kernel_key(n1, roller.load_device("x86-avx2"), opts)[0] != k1
    assert kc.kernel_key(n1, dev, dict(opts, topk=3))[0] != k1
    import dataclasses
    faster = dataclasses.replace(dev, levels=(dataclasses.replace(dev.levels[0], bandwidth_gbps=1.0),) + dev.levels[1:])
    assert faster.fingerprint == dev.fingerprint  # the calibration fingerprint misses bandwidths...
    assert kc.kernel_key(n1, faster, opts)[0] != k1  # ...the kernel key does not
    mattr = dataclasses.replace(dev, target=dict(dev.target, mattr=["+avx512vnni"]))
    assert kc.kernel_key(n1, mattr, opts)[0] != k1
    assert parts["code"].startswith(f"roller {roller.__version__}+") and "tvm 0.27" in parts["code"]


def test_identical_machines_sharing_a_calibration_file_share_keys(tmp_path):
    """What varies between identical machines (or processes) stays out of the device digest once they
    share one calibration file: the clock comes from it. What changes the code stays in."""
    import dataclasses

    from roller.device.host import _clock_ghz

    nowhere = tmp_path / "no-cpufreq"
    assert _clock_ghz({"model name": "Intel(R) Xeon(R) Gold 6140 CPU @ 2.30GHz", "cpu MHz": "3012.5"}, nowhere) == 2.3
    assert _clock_ghz({"model name": "Intel(R) Xeon(R) Processor", "cpu MHz": "2312.4"}, nowhere) == 2.3

    base = roller.load_device("x86-avx512", calibrated=False)
    cal = {"peak_gflops": {"float32": 190.0}, "bandwidth_gbps": {"L3": {"unit": 30.0, "total": 60.0}},
           "clock_ghz": 2.3, "created": "2026-11-24T19:01:10+00:00"}

    def machine(clock, calibration=cal, **target):
        units = dataclasses.replace(base.units, clock_ghz=clock)
        dev = dataclasses.replace(base, units=units, target=dict(base.target, **target))
        return dev.with_calibration(calibration)

    one = kc.device_digest(machine(2.31))
    assert kc.device_digest(machine(2.44)) == one            # a clock read at another moment
    assert kc.device_digest(machine(2.31, mattr=["+avx512vnni"])) != one               # other code
    assert kc.device_digest(machine(2.31, dict(cal, peak_gflops={"float32": 150.0}))) != one  # other figures
    assert kc.device_digest(machine(2.31, dict(cal, clock_ghz=2.0))) != one           # the model's clock
    old_file = {k: v for k, v in cal.items() if k != "clock_ghz"}  # (files written before it was recorded)
    assert kc.device_digest(machine(2.31, old_file)) != kc.device_digest(machine(2.44, old_file))


# ---------------------------------------------------------------------------------------------
# Many processes, many threads, SIGKILL.

CHILD = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import roller, roller.builder.api as api, roller.cache.store as kc
    from roller import ops
    marker = sys.argv[1]
    original = api._build_uncached
    def counted(*a, **k):
        with open(marker, "a") as f:
            f.write(f"{os.getpid()}\\n")
        if os.environ.get("CHILD_MODE") == "hang":
            time.sleep(120)  # killed here, mid-compile, holding the key's lock
        return original(*a, **k)
    api._build_uncached = counted
    if os.environ.get("CHILD_MODE") == "die-publishing":
        kc._fsync_dir = lambda path: os.kill(os.getpid(), 9)  # files written into tmp/, not yet renamed
    while time.time() < float(os.environ.get("CHILD_START", "0")):
        time.sleep(0.005)
    import tvm
    spec = ops.OPS["add_relu"]
    rows = [int(m) for m in os.environ.get("CHILD_ROWS", "5").split(",")]  # one kernel (key) per row count
    for m in rows:
        r = roller.build_op("add_relu", {"M": m, "N": 37}, profile=False)
        full = ops.validate_shape("add_relu", {"M": m, "N": 37}, "float32")
        arrays = spec.inputs(full, "float32", np.random.default_rng(os.getpid()))
        out = tvm.runtime.tensor(np.full((m, 37), np.nan, "float32"))
        r.module["main"](*[tvm.runtime.tensor(a) for a in arrays], out)
        np.testing.assert_allclose(out.numpy(), spec.reference(arrays, full), rtol=1e-5, atol=1e-5)
        threads = tvm.get_global_func("runtime.NumThreads")()  # the pool started with the kernel's first run
        print(r.report["cache"], r.report["cache_key"], threads, r.device.units.count, flush=True)
""")


def _child(marker, env_extra, cache_root):
    env = dict(os.environ, PYTHONPATH=str(REPO), ROLLER_CACHE=str(cache_root), **env_extra)
    env.pop("TVM_NUM_THREADS", None)  # (this process may have set it) the kernel must get roller's count itself
    return subprocess.Popen([sys.executable, "-c", CHILD, str(marker)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.build
def test_processes_building_the_same_keys_at_once_compile_each_once(cache_root, tmp_path):
    marker = tmp_path / "compiles"
    start = str(time.time() + 4.0)  # all three past their imports, then they ask at the same moment
    orders = ["5,6", "6,5", "5,6"]  # two keys, met in different orders
    procs = [_child(marker, {"CHILD_START": start, "CHILD_ROWS": rows}, cache_root) for rows in orders]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    lines = [line.split() for o in outs for line in o[0].splitlines()]
    assert len(lines) == 6 and len({line[1] for line in lines}) == 2
    for key in {line[1] for line in lines}:
        assert sorted(line[0] for line in lines if line[1] == key) == ["hit", "hit", "miss"], outs
    # exactly one compile per key, counted outside the cache's own statistics
    assert len(marker.read_text().split()) == 2
    # a kernel loaded from the cache runs on every core of the device, as a fresh build does
    assert all(line[2] == line[3] for line in lines), outs
    st = open_store().stats()
    assert (st["misses"], st["hits"], st["entries"]) == (2, 4, 2)


def test_threads_building_one_key_at_once_compile_it_once(tmp_path):
    store = kc.LocalStore(tmp_path / "c")
    compiles = []
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"\x7fELF" + os.urandom(2000))

    def build():
        compiles.append(threading.get_ident())
        time.sleep(0.3)  # long enough for every thread to be waiting on the lock
        return "built", str(lib), {"op": "x"}

    results = []
    barrier = threading.Barrier(6)

    def worker():
        barrier.wait()
        results.append(kc.get_or_build(store, "k" * 40, {}, build, lambda e: Path(e.library).read_bytes()))

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(compiles) == 1
    assert sorted(s for s, _ in results) == ["hit"] * 5 + ["miss"]
    assert all(v == lib.read_bytes() for s, v in results if s == "hit")


def test_a_lock_held_too_long_or_an_unwritable_cache_builds_without_it(tmp_path):
    class Impatient(kc.LocalStore):
        def lock(self, key, timeout=kc.LOCK_TIMEOUT_SECONDS):
            return super().lock(key, timeout=0.2)

    store = Impatient(tmp_path / "c")
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"library")
    built = []

    def build():
        built.append(1)
        return "fresh", str(lib), {"op": "x"}

    with store.lock("k" * 40):  # another builder holds the key (for longer than this caller waits)
        with pytest.warns(kc.CacheWarning, match="cannot lock .* building without the cache"):
            assert kc.get_or_build(store, "k" * 40, {}, build, lambda e: "cached") == ("miss", "fresh")
    assert built == [1] and store.entries() == []
    blocked = tmp_path / "file"
    blocked.write_text("")
    with warnings.catch_warnings(record=True) as seen:  # the root is a file: one warning, a build
        warnings.simplefilter("always")
        assert kc.get_or_build(kc.LocalStore(blocked / "c"), "k" * 40, {}, build, lambda e: "cached")[0] == "miss"
    assert len(seen) == 1 and "building without the cache" in str(seen[0].message)
    assert built == [1, 1]


@pytest.mark.build
@pytest.mark.parametrize("mode", ["hang", "die-publishing"])
def test_a_build_killed_midway_leaves_no_entry_and_the_next_caller_rebuilds(cache_root, tmp_path, mode):
    marker = tmp_path / "compiles"
    proc = _child(marker, {"CHILD_MODE": mode}, cache_root)
    if mode == "hang":
        deadline = time.time() + 60
        while not marker.exists() and time.time() < deadline:  # it is compiling, holding the lock
            time.sleep(0.05)
        assert marker.exists()
        proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert entries(cache_root) == []
    leftovers = list((cache_root / "tmp").iterdir()) if (cache_root / "tmp").exists() else []
    assert (len(leftovers) == 1) == (mode == "die-publishing")  # its temp dir, never seen as an entry
    for d in leftovers:  # ... and swept once stale
        os.utime(d, (time.time() - 2 * kc.STALE_TMP_SECONDS,) * 2)
    res = build()  # the lock died with the process: no wait
    assert res.report["cache"] == "miss" and len(entries(cache_root)) == 1
    check_numpy(res.module)
    assert build().report["cache"] == "hit"
    assert list((cache_root / "tmp").iterdir()) == []


@pytest.mark.build
@pytest.mark.parametrize("damage", ["truncate-library", "flip-library", "flip-report", "garbage-meta",
                                    "valid-checksum-not-a-library"])
def test_a_damaged_entry_is_detected_warned_about_once_and_rebuilt(cache_root, damage):
    first = build()
    entry = entries(cache_root)[0]
    lib = next(entry.glob("*.so"))
    if damage == "truncate-library":
        lib.write_bytes(lib.read_bytes()[: lib.stat().st_size // 2])
    elif damage.startswith("flip"):
        f = lib if damage == "flip-library" else entry / "report.json"
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0x10
        f.write_bytes(bytes(data))
    elif damage == "garbage-meta":
        (entry / "meta.json").write_bytes(b"\x00\xff garbage")
    else:  # a whole, checksummed entry whose library is no library (as if built for another runtime)
        store = open_store()
        fake = cache_root / "fake.so"
        fake.write_bytes(b"not an ELF file")
        meta = json.loads((entry / "meta.json").read_text())
        store.put(entry.name, fake, json.loads((entry / "report.json").read_text()), meta["parts"])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        again = build()
    cache_warnings = [w for w in seen if issubclass(w.category, kc.CacheWarning)]
    assert len(cache_warnings) == 1 and "rebuilding" in str(cache_warnings[0].message), [str(w.message) for w in seen]
    if damage == "valid-checksum-not-a-library":
        assert "does not load" in str(cache_warnings[0].message)
    assert again.report["cache"] == "miss"
    check_numpy(again.module)
    assert build().report["cache"] == "hit"  # the rebuilt entry is whole
    assert open_store().stats()["corrupt"] == 1
    assert first.report["cache_key"] == again.report["cache_key"]


# ---------------------------------------------------------------------------------------------
# The size bound.

def test_eviction_keeps_the_bound_and_drops_the_least_recently_used(tmp_path):
    store = kc.LocalStore(tmp_path / "c", max_bytes=3500)
    lib = tmp_path / "lib.so"
    lib.write_bytes(os.urandom(1000))
    now = time.time()
    keys = [f"{i:040d}" for i in range(4)]
    for i, key in enumerate(keys[:3]):
        store.put(key, lib, {"op": f"op{i}"}, {})
        os.utime(tmp_path / "c" / "entries" / key / "meta.json", (now - 100 + i, now - 100 + i))
    assert store.get(keys[0]) is not None  # used now: key 1 becomes the least recently used
    store.put(keys[3], lib, {"op": "op3"}, {})
    left = [e.key for e in store.entries()]
    assert sorted(left) == sorted([keys[0], keys[2], keys[3]])
    assert store.stats()["bytes"] <= 3500 and store.stats()["evictions"] == 1
    assert store.get(keys[1]) is None


def test_puts_count_the_entries_again_only_near_the_bound_or_when_the_count_is_stale(tmp_path, monkeypatch):
    """Counting reads every entry's meta.json (0.4-0.5 s at 12,000 entries, each put of a compile paying it
    made DenseNet-121's compile 65 s against 24 with an empty cache): a put counts again only where its
    running total would pass the bound, or after RECOUNT_SECONDS (other processes publish too)."""
    store = kc.LocalStore(tmp_path / "c", max_bytes=10_000)
    lib = tmp_path / "lib.so"
    lib.write_bytes(os.urandom(1000))
    counts = []
    real = store._sizes
    monkeypatch.setattr(store, "_sizes", lambda: counts.append(1) or real())
    for i in range(5):
        store.put(f"{i:040d}", lib, {"op": f"op{i}"}, {})
    assert len(counts) == 1  # ~5.1 KB of 10 KB: counted at the first put only
    for i in range(5, 12):
        store.put(f"{i:040d}", lib, {"op": f"op{i}"}, {})
    assert 1 < len(counts) and store.stats()["bytes"] <= 10_000 and store.stats()["evictions"] > 0
    before = len(counts)
    monkeypatch.setattr(kc, "RECOUNT_SECONDS", 0.0)  # a stale count: the next put counts again
    store.put(f"{12:040d}", lib, {"op": "op12"}, {})
    assert len(counts) == before + 1 and store.stats()["bytes"] <= 10_000


def test_size_bound_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(kc.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv(kc.SIZE_ENV, "64M")
    assert open_store().max_bytes == 64 << 20
    monkeypatch.setenv(kc.SIZE_ENV, "lots")
    with pytest.raises(roller.RollerError, match="ROLLER_CACHE_SIZE"):
        open_store()


# ---------------------------------------------------------------------------------------------
# The command line.

def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.build
def test_cli_cache_field_hit_and_out_from_a_hit(cache_root, capsys, tmp_path):
    argv = ["build", OP, "--shape", "M=5,N=37", "--no-profile", "--json"]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    assert json.loads(out)["cache"] == "miss"
    code, out, err = run(capsys, *argv, "--out", str(tmp_path / "o"))
    rep = json.loads(out)
    assert code == 0 and rep["cache"] == "hit" and rep["verified"] is True
    import tvm
    check_numpy(tvm.runtime.load_module(str(tmp_path / "o" / f"{OP}.so")))  # the library saved from a hit
    code, out, err = run(capsys, "build", OP, "--shape", "M=5,N=37", "--no-profile")
    assert code == 0 and "from the kernel cache" in out

    code, out, _ = run(capsys, "cache", "list", "--json")
    rows = json.loads(out)
    assert code == 0 and len(rows) == 1 and rows[0]["op"] == OP and rows[0]["shape"] == SHAPE
    assert rows[0]["key"] == rep["cache_key"] and rows[0]["bytes"] > 1000
    code, out, _ = run(capsys, "cache", "list")
    assert code == 0 and f"{OP} M=5,N=37 float32 on host  top-1" in out
    code, out, _ = run(capsys, "cache", "stats", "--json")
    st = json.loads(out)
    assert (st["entries"], st["hits"], st["misses"]) == (1, 2, 1) and st["location"] == str(cache_root)
    code, out, _ = run(capsys, "cache", "clear")
    assert code == 0 and out.startswith("removed 1 kernels")
    assert entries(cache_root) == [] and open_store().stats()["hits"] == 0


@pytest.mark.build
def test_no_cache_never_touches_the_cache(cache_root, capsys):
    code, out, err = run(capsys, "build", OP, "--shape", "M=5,N=37", "--no-profile", "--json", "--no-cache")
    assert code == 0, err
    assert json.loads(out)["cache"] == "off"
    assert not cache_root.exists()
    res = build(cache=False)
    assert res.report["cache"] == "off" and not cache_root.exists()
    check_numpy(res.module)


def test_debug_is_accepted_after_the_subcommand(capsys):
    code, out, err = run(capsys, "build", "matmul", "--shape", "M=0,N=4,K=4", "--debug")
    assert code == 2 and "Traceback" in err and err.strip().splitlines()[-1].startswith("roller: error:")
    code, out, err = run(capsys, "--debug", "build", "matmul", "--shape", "M=0,N=4,K=4")
    assert code == 2 and "Traceback" in err
    code, out, err = run(capsys, "build", "matmul", "--shape", "M=0,N=4,K=4")
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1


@pytest.mark.build
def test_cache_warm_builds_each_line_once_and_checks_every_line_first(cache_root, capsys, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("add_relu --shape M=5,N=37 --no-profile\nmatmul --shape M=4,N=4\n")
    code, out, err = run(capsys, "cache", "warm", str(bad))
    assert code == 2 and err.startswith(f"roller: error: {bad}:2:") and "K" in err and err.count("\n") == 1
    assert not cache_root.exists()  # nothing built before every line was checked
    good = tmp_path / "warm.txt"
    good.write_text("# kernels of the service\nadd_relu --shape M=5,N=37 --no-profile\n\n"
                    "pool2d --kind avg --shape N=1,H=5,W=5,C=3,R=2,S=2 --no-profile  # avg pooling\n")
    code, out, err = run(capsys, "cache", "warm", str(good), "--json")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["line"], r["cache"]) for r in rows] == [(2, "miss"), (4, "miss")]
    code, out, err = run(capsys, "cache", "warm", str(good))
    assert code == 0 and out.count(" hit  ") == 2 and "2 of 2 kernels" in out
    check_numpy(build().module)  # what warm stored is what a build then gets
    assert build().report["cache"] == "hit"
    code, out, _ = run(capsys, "cache", "list", "--json")
    assert sorted(r["op"] for r in json.loads(out)) == ["add_relu", "pool2d"]
    assert {r["build_options"].get("profile") for r in json.loads(out)} == {False}
    assert [r["op_options"] for r in json.loads(out) if r["op"] == "pool2d"] == [{"kind": "avg"}]


def test_the_test_session_never_uses_the_users_cache():
    import platformdirs
    root = kc.default_root().resolve()
    assert not root.is_relative_to(Path(platformdirs.user_cache_dir("roller")).resolve())
    assert os.environ[kc.CACHE_ENV] == str(kc.default_root())  # set by conftest for the whole session


@pytest.mark.build
def test_report_dtype_is_the_one_asked_for(cache_root, capsys):
    code, out, err = run(capsys, "build", "matmul", "--shape", "M=3,N=17,K=5", "--dtype", "int8", "--no-profile",
                         "--json")
    assert code == 0, err
    rep = json.loads(out)
    assert (rep["dtype"], rep["out_dtype"], rep["verified"]) == ("int8", "int32", True)
    code, out, err = run(capsys, "build", "matmul", "--shape", "M=3,N=17,K=5", "--dtype", "int8", "--no-profile",
                         "--json")
    assert (json.loads(out)["cache"], json.loads(out)["dtype"]) == ("hit", "int8")



def test_code_version_digests_the_whole_package():
    """The key's code digest covers every source of roller, not only the cache's own folder (after the
    package moved into layers it covered roller/cache/*.py alone, and a code generation fix kept serving
    the kernels built before it)."""
    from roller.cache.store import package_root, source_files

    names = {p.relative_to(package_root()).as_posix() for p in source_files()}
    assert {"targets/cpu/codegen.py", "tir/analysis.py", "plan/cost.py", "models/frontend.py",
            "cache/store.py"} <= names, sorted(names)[:10]
