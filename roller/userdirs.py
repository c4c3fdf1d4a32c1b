"""roller's per-user folders: the cache folder that calibration files, kernels and toolchain files live in."""
from __future__ import annotations

import os
from pathlib import Path


CACHE_ENV = "ROLLER_CACHE_DIR"


def cache_dir() -> Path:
    """roller's per-user cache folder: ``$ROLLER_CACHE_DIR`` if set, else the platform's cache dir."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    import platformdirs
    return Path(platformdirs.user_cache_dir("roller"))
