"""The persistent kernel cache: keys (``store.kernel_key``), one store interface (``store.Store``), the local
directory (``store.LocalStore``), Redis a fleet shares (``redis_store.RedisStore``), and ``open_store`` that
picks one from ``$ROLLER_CACHE``."""
from roller.cache.open import open_store
from roller.cache.store import (CACHE_ENV, SIZE_ENV, CachedKernel, CacheWarning, CorruptEntry, EntryInfo, LocalStore,
                                Store, get_or_build, kernel_key, lookup)

__all__ = ["CACHE_ENV", "SIZE_ENV", "CacheWarning", "CachedKernel", "CorruptEntry", "EntryInfo", "LocalStore", "Store",
           "get_or_build", "kernel_key", "lookup", "open_store"]
