"""This process's build folder and the kernel libraries compiled into it.

Every library roller compiles goes under :func:`build_root` (``roller-builds-<pid>`` in the temp dir), which
goes with the process; a :class:`KernelLibrary` is one library its holder owns and may delete sooner. The
profiler (:mod:`roller.builder.farm`) and the model function cache both build there.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

_BUILD_ROOT: dict[int, str] = {}  # pid -> this process's build folder
_BUILD_ROOT_LOCK = threading.Lock()
BUILD_ROOT_PREFIX = "roller-builds-"


def build_root() -> str:
    """This process's folder for the libraries it compiles (``roller-builds-<pid>`` in the temp dir):
    removed when the process exits normally; folders of processes that no longer run are removed when
    another process makes its own."""
    pid = os.getpid()
    with _BUILD_ROOT_LOCK:
        root = _BUILD_ROOT.get(pid)
        if root is None:
            base = Path(tempfile.gettempdir())
            for old in base.glob(f"{BUILD_ROOT_PREFIX}*"):
                other = old.name[len(BUILD_ROOT_PREFIX):]
                if other.isdigit() and int(other) != pid and not _alive(int(other)):
                    shutil.rmtree(old, ignore_errors=True)
            root = str(base / f"{BUILD_ROOT_PREFIX}{pid}")
            os.makedirs(root, exist_ok=True)
            _BUILD_ROOT[pid] = root
            atexit.register(_remove_build_root, pid, root)
        return root


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_build_root(pid: int, root: str) -> None:
    if os.getpid() == pid:  # never from a forked child that inherited the handler
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class KernelLibrary:
    """A compiled kernel's shared library, owned by whoever holds this object: :meth:`close` deletes its
    folder (a module already loaded from it keeps working). A library never closed goes with its
    process's :func:`build_root` at exit."""

    path: str
    folder: str

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    @property
    def closed(self) -> bool:
        return not os.path.exists(self.path)
