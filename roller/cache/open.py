"""Opening the kernel store ``$ROLLER_CACHE`` names: a local directory, or Redis shared by a fleet with this
machine's directory as its copy and its fallback. One store per setting and process."""
from __future__ import annotations

import os
import threading
from pathlib import Path

from roller.cache.store import CACHE_ENV, LocalStore, Store, default_root, max_bytes_from_env, warn


_STORES: dict[tuple, Store] = {}


_STORES_LOCK = threading.Lock()


def open_store(root: str | os.PathLike | None = None) -> Store:
    """The kernel store: ``root``, or what ``$ROLLER_CACHE`` says: a directory, or a ``redis://`` URL
    (roller.cache.redis_store: Redis shared by a fleet, with this machine's default root as its local copy).
    One store per setting and process, so that a Redis connection and its state (down: warned once)
    last between builds."""
    env = os.environ.get(CACHE_ENV, "")
    url = env if root is None and "://" in env else None
    local_root = Path(root) if root is not None else default_root()
    ident = (url, str(local_root), max_bytes_from_env())
    with _STORES_LOCK:
        store = _STORES.get(ident)
        if store is None:
            store = _STORES[ident] = _open(url, LocalStore(local_root, ident[2]))
        return store


def _open(url: str | None, local: LocalStore) -> Store:
    if url is None:
        return local
    if not url.startswith(("redis://", "rediss://", "unix://")):
        warn(f"{CACHE_ENV}={url}: not a directory nor a redis:// URL; using the local cache {local.location}")
        return local
    try:
        from roller.cache.redis_store import RedisStore
        return RedisStore(url, local)
    except ImportError:
        warn(f"{CACHE_ENV}={url}: the redis client is not installed (pip install redis); using the local "
             f"cache {local.location}")
    except ValueError as e:  # a malformed URL
        warn(f"{CACHE_ENV}={url}: {e}; using the local cache {local.location}")
    return local
