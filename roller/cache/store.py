"""The persistent kernel cache: a built, verified kernel (library + report) keyed by what determines it.

Key (:func:`kernel_key`): sha256 over
  - the normalized PrimFunc, serialized with ``tvm.ir.save_json`` (deterministic across processes, and a
    256-bit digest of it cannot collide in practice; ``structural_hash`` is 64 bits, and a collision
    would silently serve a wrong kernel; a renamed but identical function only misses),
  - the whole device (:func:`device_digest`: every spec figure, the calibration, the resolved target
    string with mcpu and mattr),
  - roller's version and a digest of its own source files (the version string is not bumped with
    every change to the policy or the code generator), TVM's and tvm-ffi's versions,
  - the build options that change the result (profiled or top-1, top-k, build budget).

Value: ``entries/<key>/`` holding the library (``<sha16>.so``, named by its checksum so that a rebuilt
entry is never confused with a library already loaded from the same path), ``report.json`` and
``meta.json`` (sha256 of both, size, the key's ingredients). An entry is written into ``tmp/``, synced,
and renamed into place: readers see a whole entry or none. One compile per key across threads and
processes: ``locks/<key>.lock`` (filelock) is held while building; waiters read the result. A corrupt,
truncated or bit-flipped entry fails its checksum: one warning, then it is rebuilt. The store keeps
its size under a bound by evicting the least recently used entries (last use = meta.json's mtime).

:class:`Store` is the interface; :class:`LocalStore` is the directory, ``roller.cache.redis_store.RedisStore``
the store a fleet shares. :func:`get_or_build` is the protocol (look up, lock, look again, build, publish).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
import warnings
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from roller.errors import RollerError

CACHE_ENV = "ROLLER_CACHE"            # a directory, or redis://host:port/db (roller.cache.redis_store)
SIZE_ENV = "ROLLER_CACHE_SIZE"        # bytes, or 512M / 2GiB
DEFAULT_MAX_BYTES = 2 << 30
LOCK_TIMEOUT_SECONDS = 900.0          # past this, build without the cache rather than wait forever
STALE_TMP_SECONDS = 3600.0            # temp dirs older than this are leftovers of killed builders
RECOUNT_SECONDS = 60.0                # a local store's entries are counted again at least this often
SCHEMA = 1
# One byte per event appended to the stats file (O_APPEND writes of one byte are atomic: no lock).
EVENTS = {"hit": b"h", "miss": b"m", "corrupt": b"c", "evict": b"e"}


class CacheWarning(UserWarning):
    """A cache entry was unreadable and is rebuilt, or the cache could not be used for one build."""


class CorruptEntry(RollerError):
    """A cache entry failed its checksum or could not be read; the message names it and why."""


def warn(message: str) -> None:
    warnings.warn(message, CacheWarning, stacklevel=2)


# ---------------------------------------------------------------------------------------------
# The key.

def package_root() -> Path:
    """The ``roller`` package folder (this module lies in roller/cache/)."""
    return Path(__file__).resolve().parents[1]


def source_files() -> list[Path]:
    """Every Python source of the roller package, in a fixed order: what :func:`code_version` digests, so
    that a change anywhere (code generation, the model, the analysis) misses the kernels built before it."""
    return sorted(package_root().rglob("*.py"))


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """roller's version plus a digest of its source files, TVM's and tvm-ffi's versions (once per process)."""
    import tvm
    import tvm_ffi

    from roller.version import __version__

    h = hashlib.sha256()
    pkg = package_root()
    for path in source_files():
        h.update(str(path.relative_to(pkg)).encode())
        h.update(path.read_bytes())
    return f"roller {__version__}+{h.hexdigest()[:12]} tvm {tvm.__version__} tvm-ffi {tvm_ffi.__version__}"


def device_digest(device) -> str:
    """sha256 of everything about a device that can change a kernel: every field of the spec (peaks,
    bandwidths, usable fractions, capacities...), the calibration, and the resolved TVM target string
    (mcpu of ``host`` resolved, mattr). Only ``source`` (where the spec file lies) is left out."""
    from roller.tir.compile import target_for

    data = dataclasses.asdict(device)
    data.pop("source", None)
    data["resolved_target"] = str(target_for(device))
    text = json.dumps(data, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def kernel_key(func, device, options: Mapping[str, Any]) -> tuple[str, dict]:
    """(key, ingredients) of a normalized PrimFunc built for ``device`` with ``options`` (the build
    options that change the result). The ingredients are stored with the entry for `roller cache list`."""
    import tvm

    parts = {
        "func_sha256": hashlib.sha256(tvm.ir.save_json(func).encode()).hexdigest(),
        "device": device.name,
        "device_sha256": device_digest(device),
        "code": code_version(),
        "options": dict(sorted(options.items())),
    }
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:40]
    return key, parts


# ---------------------------------------------------------------------------------------------
# Stores.

@dataclass(frozen=True)
class CachedKernel:
    """A verified cache entry: ``library`` is a loadable path, ``report`` the build's report."""

    key: str
    library: str
    report: dict


@dataclass(frozen=True)
class EntryInfo:
    """One entry as listed: its key, size in bytes, last use (epoch seconds), what its report says it is
    (operator, shape, dtype, device, the operator's options) and the build options it was made with."""

    key: str
    bytes: int
    last_used: float
    op: str | None
    shape: dict | None
    dtype: str | None
    device: str | None
    op_options: dict
    build_options: dict

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class Store(ABC):
    """Where kernels live. get/put/lock are the build protocol; the rest serves `roller cache`."""

    location: str

    @abstractmethod
    def get(self, key: str) -> CachedKernel | None:
        """The entry, checksum-verified and marked used; None if absent; CorruptEntry if unreadable."""

    @abstractmethod
    def put(self, key: str, library: str | os.PathLike, report: Mapping, parts: Mapping) -> CachedKernel:
        """Publishes an entry atomically (replacing any corrupt one), then keeps the size bound."""

    @abstractmethod
    def lock(self, key: str, timeout: float = LOCK_TIMEOUT_SECONDS) -> AbstractContextManager:
        """A lock (acquire / release) held while ``key`` is built, across threads, processes (and machines,
        for a shared store); acquire raises TimeoutError past ``timeout``, OSError if the store is unusable."""

    @abstractmethod
    def entries(self) -> list[EntryInfo]:
        """Every readable entry, most recently used first."""

    @abstractmethod
    def clear(self) -> int:
        """Removes every entry and the statistics; returns the number of entries removed."""

    @abstractmethod
    def record(self, event: str) -> None:
        """Counts one event of :data:`EVENTS`."""

    @abstractmethod
    def stats(self) -> dict:
        """Counts of events, entries, bytes, bound."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def report_json(report: Mapping) -> bytes:
    """A report as stored (the same bytes in every store: its checksum travels with it)."""
    return (json.dumps(report, indent=1) + "\n").encode()


def entry_meta(key: str, lib_bytes: bytes, report_bytes: bytes, parts: Mapping) -> dict:
    """An entry's meta.json: the library's file name (by its checksum), both checksums, size, origin."""
    lib_sha = _sha256(lib_bytes)
    return {"schema": SCHEMA, "key": key, "library": f"{lib_sha[:16]}.so", "library_sha256": lib_sha,
            "report_sha256": _sha256(report_bytes), "bytes": len(lib_bytes) + len(report_bytes),
            "created": time.time(), "parts": dict(parts)}


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalStore(Store):
    """A cache directory: ``entries/<key>/``, ``locks/``, ``tmp/`` (entries being written or removed),
    ``stats`` (one byte per event). Safe for many threads and processes on one machine."""

    def __init__(self, root: str | os.PathLike, max_bytes: int = DEFAULT_MAX_BYTES):
        self.root = Path(root)
        self.location = str(self.root)
        self.max_bytes = int(max_bytes)
        self._entries = self.root / "entries"
        self._locks = self.root / "locks"
        self._tmp = self.root / "tmp"
        self._stats = self.root / "stats"
        # (when, bytes) of this store's last count of its entries, plus the bytes it published since: the
        # eviction's count reads every entry's meta.json (0.4-0.5 s at 12,000 entries), so a put counts again
        # only when that total would pass the bound or the count is RECOUNT_SECONDS old (other processes
        # publish too; the bound is kept within their last minute of entries)
        self._counted: tuple[float, int] | None = None
        self._counting = threading.Lock()

    def _ensure(self) -> None:
        for d in (self._entries, self._locks, self._tmp):
            d.mkdir(parents=True, exist_ok=True)

    # -- the build protocol

    def get(self, key: str) -> CachedKernel | None:
        entry = self._entries / key
        meta_path = entry / "meta.json"
        try:
            meta_bytes = meta_path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):  # (the latter: the cache root is not a folder)
            if entry.is_dir():  # publication is one rename: a folder without its meta was damaged
                raise CorruptEntry(f"kernel cache entry {entry} has no meta.json") from None
            return None
        except OSError as e:
            raise CorruptEntry(f"kernel cache entry {entry} cannot be read ({e.strerror or e})") from None
        try:
            meta = json.loads(meta_bytes)
            if meta["library"] != f"{meta['library_sha256'][:16]}.so":  # never a path out of the entry
                raise CorruptEntry(f"kernel cache entry {entry}: meta.json names library {meta['library']!r}")
            lib = entry / meta["library"]
            lib_bytes = lib.read_bytes()
            report_bytes = (entry / "report.json").read_bytes()
            if _sha256(lib_bytes) != meta["library_sha256"]:
                raise CorruptEntry(f"kernel cache entry {entry}: the library fails its checksum")
            if _sha256(report_bytes) != meta["report_sha256"]:
                raise CorruptEntry(f"kernel cache entry {entry}: the report fails its checksum")
            report = json.loads(report_bytes)
        except CorruptEntry:
            raise
        except FileNotFoundError:
            if not entry.exists():  # evicted or replaced while we read: a plain miss
                return None
            raise CorruptEntry(f"kernel cache entry {entry} is missing a file") from None
        except (ValueError, KeyError, TypeError, OSError) as e:
            raise CorruptEntry(f"kernel cache entry {entry} is unreadable ({type(e).__name__}: {e})") from None
        try:
            os.utime(meta_path)  # last use, for least-recently-used eviction
        except OSError:
            pass
        return CachedKernel(key=key, library=str(lib), report=report)

    def put(self, key: str, library: str | os.PathLike, report: Mapping, parts: Mapping) -> CachedKernel:
        return self.put_bytes(key, Path(library).read_bytes(), report, parts)

    def put_bytes(self, key: str, lib_bytes: bytes, report: Mapping, parts: Mapping) -> CachedKernel:
        """:meth:`put` of a library given as bytes (a copy fetched from a shared store)."""
        self._ensure()
        self._sweep_tmp()
        report_bytes = report_json(report)
        meta = entry_meta(key, lib_bytes, report_bytes, parts)
        tmp = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=self._tmp))
        try:
            _write_synced(tmp / meta["library"], lib_bytes)
            _write_synced(tmp / "report.json", report_bytes)
            _write_synced(tmp / "meta.json", (json.dumps(meta, indent=1) + "\n").encode())
            _fsync_dir(tmp)
            final = self._entries / key
            if final.exists():  # a corrupt entry being replaced (the caller holds the key's lock)
                self._discard(final)
            os.rename(tmp, final)
            _fsync_dir(self._entries)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._evict(keep=key, added=int(meta["bytes"]))
        return CachedKernel(key=key, library=str(final / meta["library"]), report=dict(report))

    def lock(self, key: str, timeout: float = LOCK_TIMEOUT_SECONDS):
        from filelock import FileLock

        self._ensure()
        return FileLock(str(self._locks / f"{key}.lock"), timeout=timeout)

    # -- upkeep

    def _discard(self, entry: Path) -> None:
        """Takes an entry out of view with one rename (readers see it whole or not at all), then deletes it."""
        dead = self._tmp / f"dead.{entry.name}.{uuid.uuid4().hex[:8]}"
        try:
            os.rename(entry, dead)
        except FileNotFoundError:
            return
        shutil.rmtree(dead, ignore_errors=True)

    def _sweep_tmp(self) -> None:
        """Deletes temp dirs left by builders killed while publishing (older than STALE_TMP_SECONDS)."""
        now = time.time()
        for d in self._tmp.iterdir():
            try:
                if now - d.stat().st_mtime > STALE_TMP_SECONDS:
                    shutil.rmtree(d, ignore_errors=True)
            except FileNotFoundError:
                continue

    def _sizes(self) -> list[tuple[float, int, str]]:
        """(last use, bytes, key) of every entry; a damaged one counts its files' sizes and its folder's
        mtime; one removed while this runs is left out."""
        out = []
        if not self._entries.is_dir():
            return out
        for d in self._entries.iterdir():
            meta = d / "meta.json"
            try:
                try:
                    st = meta.stat()
                    size = int(json.loads(meta.read_bytes())["bytes"])
                except (ValueError, KeyError, TypeError, OSError):
                    size, st = sum(f.stat().st_size for f in d.iterdir() if f.is_file()), d.stat()
            except OSError:  # discarded meanwhile
                continue
            out.append((st.st_mtime, size, d.name))
        return out

    def _evict(self, keep: str, added: int = 0) -> None:
        """Removes least recently used entries (never ``keep``, the one just published, of ``added`` bytes)
        until the total size is within the bound; one evictor at a time. The entries are counted only where
        the last count plus what this store published since would pass the bound, or is stale (``_counted``)."""
        from filelock import FileLock

        with self._counting:
            if self._counted is not None:
                when, total = self._counted
                if total + added <= self.max_bytes and time.monotonic() - when < RECOUNT_SECONDS:
                    self._counted = (when, total + added)
                    return
        when = time.monotonic()
        with FileLock(str(self._locks / ".evict.lock"), timeout=LOCK_TIMEOUT_SECONDS):
            sizes = sorted(self._sizes())
            total = sum(s for _, s, _ in sizes)
            for _, size, key in sizes:
                if total <= self.max_bytes:
                    break
                if key == keep:
                    continue
                self._discard(self._entries / key)
                self.record("evict")
                total -= size
        with self._counting:
            self._counted = (when, total)

    # -- what `roller cache` shows

    def entries(self) -> list[EntryInfo]:
        out = []
        for last, size, key in sorted(self._sizes(), reverse=True):
            try:
                report = json.loads((self._entries / key / "report.json").read_bytes())
            except (OSError, ValueError):
                report = {}
            out.append(EntryInfo(key=key, bytes=size, last_used=last, op=report.get("op"),
                                 shape=report.get("shape"), dtype=report.get("dtype"), device=report.get("device"),
                                 op_options=dict(report.get("options") or {}),
                                 build_options=dict(report.get("cache_options") or {})))
        return out

    def clear(self) -> int:
        n = 0
        if self._entries.is_dir():
            for d in list(self._entries.iterdir()):
                self._discard(d)
                n += 1
        if self._tmp.is_dir():
            self._sweep_tmp()
        self._stats.unlink(missing_ok=True)
        return n

    def record(self, event: str) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._stats, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, EVENTS[event])
            finally:
                os.close(fd)
        except OSError:
            pass  # statistics never fail a build

    def stats(self) -> dict:
        try:
            data = self._stats.read_bytes()
        except OSError:
            data = b""
        counts = {name: data.count(b) for name, b in EVENTS.items()}
        sizes = self._sizes()
        lookups = counts["hit"] + counts["miss"]
        return {"location": self.location, "entries": len(sizes), "bytes": sum(s for _, s, _ in sizes),
                "max_bytes": self.max_bytes, "hits": counts["hit"], "misses": counts["miss"],
                "hit_rate": counts["hit"] / lookups if lookups else None,
                "corrupt": counts["corrupt"], "evictions": counts["evict"]}


# ---------------------------------------------------------------------------------------------
# Opening the store and the protocol.

def default_root() -> Path:
    """``$ROLLER_CACHE`` if it is set to a directory, else ``kernels/`` in roller's per-user cache
    folder (which ``ROLLER_CACHE_DIR`` moves, see roller.targets.cpu.calibrate.cache_dir)."""
    env = os.environ.get(CACHE_ENV)
    if env and "://" not in env:
        return Path(env).expanduser()
    from roller.userdirs import cache_dir
    return cache_dir() / "kernels"


def max_bytes_from_env() -> int:
    """The size bound: ``$ROLLER_CACHE_SIZE`` (bytes, or 512M / 2GiB) or DEFAULT_MAX_BYTES."""
    from roller.device.spec import parse_size

    env = os.environ.get(SIZE_ENV)
    if not env:
        return DEFAULT_MAX_BYTES
    n = parse_size(int(env) if env.isdigit() else env)
    if n is None:
        raise RollerError(f"{SIZE_ENV}={env!r} is not a size: give bytes or a size like 512M or 2GiB")
    return n


def _read(store: Store, key: str, load: Callable[[CachedKernel], Any]) -> tuple[bool, Any, str | None]:
    """(found, load(entry), None), (False, None, None) when absent, (False, None, why) when unreadable."""
    try:
        entry = store.get(key)
        return (False, None, None) if entry is None else (True, load(entry), None)
    except CorruptEntry as e:
        return False, None, str(e)
    except (RuntimeError, OSError, ValueError, KeyError, TypeError) as e:
        # passed its checksum but does not load (TVM's errors are RuntimeErrors; a report without a plan)
        return False, None, f"kernel cache entry {key} does not load ({type(e).__name__}: {e})"


def lookup(store: Store, key: str, load: Callable[[CachedKernel], Any]) -> Any | None:
    """load(the entry of ``key``), or None when the store holds none; an unreadable entry is one
    warning and None (whoever builds the key next replaces it). Counts a hit, never a miss."""
    found, value, problem = _read(store, key, load)
    if problem:
        warn(f"{problem}; it will be rebuilt")
        store.record("corrupt")
    if found:
        store.record("hit")
    return value


def get_or_build(store: Store, key: str, parts: Mapping, build: Callable[[], tuple[Any, str, dict]],
                 load: Callable[[CachedKernel], Any],
                 published: Callable[[Any, CachedKernel], Any] | None = None) -> tuple[str, Any]:
    """("hit", load(entry)) or ("miss", the value of build()); never fails because of the cache.
    ``published(value, entry)``, once the built value is stored, gives the value returned (its library
    can then be the entry's, the cache its owner).

    ``build()`` returns (value, library path, report); its library and report are published under
    ``key`` while the key's lock is held, so concurrent callers of the same key compile once: the
    others wait for the lock and then load the published entry. A corrupt entry, or one whose library
    does not load, is reported in one warning and rebuilt; a cache that cannot be written or locked
    gives one warning and the build's own result.
    """
    warned = False

    def lookup() -> tuple[bool, Any]:
        nonlocal warned
        found, value, problem = _read(store, key, load)
        if problem and not warned:
            warned = True
            warn(f"{problem}; rebuilding it")
            store.record("corrupt")
        return found, value

    found, value = lookup()
    if found:
        store.record("hit")
        return "hit", value
    try:
        lock = store.lock(key)
        lock.acquire()
    except OSError as e:  # TimeoutError (filelock.Timeout) included
        warn(f"kernel cache {store.location}: cannot lock {key} ({type(e).__name__}: {e}); building without the cache")
        value, _, _ = build()
        return "miss", value
    try:
        found, value = lookup()  # someone built it while we waited
        if found:
            store.record("hit")
            return "hit", value
        store.record("miss")
        value, library, report = build()
        try:
            entry = store.put(key, library, report, parts)
        except (OSError, TypeError, ValueError) as e:  # full disk, read-only folder, a report JSON cannot hold
            warn(f"kernel cache {store.location}: cannot store {key} ({type(e).__name__}: {e}); "
                 f"the kernel is not cached")
            return "miss", value
        return "miss", value if published is None else published(value, entry)
    finally:
        lock.release()

