"""Test-session defaults: the kernel cache lives in a temp dir, never in the user's cache."""
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
