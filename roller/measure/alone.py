"""One measurement at a time on a machine: calibrations (and anything else that needs the cores to itself)
wait for each other through a file lock in the user's cache folder."""
from __future__ import annotations

import contextlib
import sys

from roller.errors import CalibrationError
from roller.userdirs import cache_dir


MEASURE_LOCK_SECONDS = 900.0  # how long a calibration waits for another one on this machine


@contextlib.contextmanager
def measuring_alone():
    """Holds this machine's calibration lock (``calibrate.lock`` in :func:`cache_dir`): calibrations run
    one after the other, each with the cores to itself (two at once measured 30 and 50 GB/s of DRAM
    bandwidth against 55 alone, and the last to save won). Says so on stderr when it has to wait."""
    from filelock import FileLock, Timeout

    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(folder / "calibrate.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"roller: waiting for another calibration on this machine to end ({folder / 'calibrate.lock'})",
              file=sys.stderr)
        try:
            lock.acquire(timeout=MEASURE_LOCK_SECONDS)
        except Timeout:
            raise CalibrationError(f"another calibration has held {folder / 'calibrate.lock'} for over "
                                   f"{MEASURE_LOCK_SECONDS:g} s; wait for it or delete the lock file") from None
    try:
        yield
    finally:
        lock.release()
