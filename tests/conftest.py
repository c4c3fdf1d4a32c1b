"""Test-session defaults: the kernel cache lives in a temp dir, never in the user's cache; ``device`` is this
machine's device (a test file that plans for a shipped spec defines its own ``device`` fixture). The user's
cache folder (``ROLLER_CACHE_DIR``) is replaced by a temp one holding a copy of the user's calibrations only:
the device is this machine as calibrated, but a ``roller fidelity`` record (which sets how many plans a build
profiles) or a lock of the user's does not reach the tests.

The session shares that cache: a test about how kernels are built (workers, budgets, crashes) or one that
patches the policy or code generator and then builds must pass ``cache=False`` / ``--no-cache`` (the key
covers roller's source files, not patches made at run time), or a hit would skip what it tests."""
import os
import shutil

import pytest


@pytest.fixture(scope="session", autouse=True)
def _session_kernel_cache(tmp_path_factory):
    # os.environ, not monkeypatch: subprocesses the tests start (the CLI) must inherit it too
    saved = os.environ.get("ROLLER_CACHE")
    os.environ["ROLLER_CACHE"] = str(tmp_path_factory.mktemp("kernel-cache"))
    yield
    if saved is None:
        os.environ.pop("ROLLER_CACHE", None)
    else:
        os.environ["ROLLER_CACHE"] = saved


@pytest.fixture(scope="session", autouse=True)
def _session_cache_dir(tmp_path_factory):
    from roller.userdirs import CACHE_ENV, cache_dir

    saved = os.environ.get(CACHE_ENV)
    folder = tmp_path_factory.mktemp("cache-dir")
    if (cache_dir() / "calibration").is_dir():
        shutil.copytree(cache_dir() / "calibration", folder / "calibration",
                        ignore=shutil.ignore_patterns("*.lock", "*.tmp"))
    os.environ[CACHE_ENV] = str(folder)
    yield
    if saved is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = saved


@pytest.fixture(scope="session")
def device():
    """This machine's device (``roller.load_device()``), loaded once for the session."""
    from roller.device import load_device

    return load_device()
