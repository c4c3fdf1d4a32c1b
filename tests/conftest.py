"""Test-session defaults: the kernel cache lives in a temp dir, never in the user's cache; ``device`` is this
machine's device (a test file that plans for a shipped spec defines its own ``device`` fixture).

The session shares that cache: a test about how kernels are built (workers, budgets, crashes) or one that
patches the policy or code generator and then builds must pass ``cache=False`` / ``--no-cache`` (the key
covers roller's source files, not patches made at run time), or a hit would skip what it tests."""
import os

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


@pytest.fixture(scope="session")
def device():
    """This machine's device (``roller.load_device()``), loaded once for the session."""
    from roller.device import load_device

    return load_device()
