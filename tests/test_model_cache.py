"""Whole models through the kernel cache and the JIT (roller.models.function_cache): every fused function one
cache entry, a second process loads them all and compiles none; outputs against onnxruntime."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import roller  # noqa: E402
from roller.cache import open_store  # noqa: E402
from roller.cache import store as kc  # noqa: E402
from roller.models import frontend  # noqa: E402
from roller.serve.jit import JIT  # noqa: E402

import onnx_models  # noqa: E402  (tests/ is on sys.path under pytest)

pytestmark = pytest.mark.build
REPO = Path(__file__).resolve().parent.parent

# one process: compile the CNN (a Relax module, through the JIT), check it against onnxruntime, print
# each function's cache status as JSON
CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import onnx_models
from roller.models import frontend
from roller.serve.jit import JIT
model = onnx_models.small_cnn(size=16)
mod = frontend.import_onnx(model, frontend.onnx_inputs(model))
cm = JIT(background=0)(mod)
feeds = cm.random_inputs(3)
reference = frontend.onnxruntime_session(model, 1).run(None, feeds)
check = frontend.compare(cm.run(feeds), reference)
print(json.dumps({"matches": check["matches"], "cache": [r.cache for r in cm.report],
                  "rules": [r.scheduled_by for r in cm.report], "seconds": cm.seconds}))
"""


def _run_child(env):
    out = subprocess.run([sys.executable, "-c", CHILD, str(REPO / "tests")], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_compiling_the_model_loads_every_function_from_the_cache(tmp_path):
    log = tmp_path / "builds.jsonl"
    env = dict(os.environ, PYTHONPATH=str(REPO), ROLLER_CACHE=str(tmp_path / "kc"), ROLLER_BUILD_LOG=str(log))
    first = _run_child(env)
    assert first["matches"] and set(first["cache"]) == {"miss"} and "roller" in first["rules"], first
    compiled = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(compiled) == len(first["cache"]) == len({c["key"] for c in compiled})  # one compile per function

    second = _run_child(env)
    assert second["matches"] and set(second["cache"]) == {"hit"}, second
    assert second["rules"] == first["rules"]
    assert len(log.read_text().splitlines()) == len(compiled)  # the second process compiled nothing


def test_the_jit_memoizes_a_model_and_refuses_the_profiled_tier(tmp_path, monkeypatch):
    monkeypatch.setenv(kc.CACHE_ENV, str(tmp_path / "kc"))
    model = onnx_models.transformer_block()
    mod = frontend.import_onnx(model, frontend.onnx_inputs(model))
    jit = JIT(background=0)
    cm = jit(mod)
    assert jit(mod) is cm and jit(mod.clone()) is cm and jit.kernels() == 1
    check = frontend.check_against_onnxruntime(cm, model, time_it=False)
    assert check["matches"], check
    with pytest.raises(roller.RollerError, match="top-1 tier only"):
        jit(mod, tier="profiled")


def test_a_model_of_cached_kernels_exports_one_self_contained_library(tmp_path, monkeypatch):
    """The executable calls the cached libraries by name; export compiles them into the one library,
    which plain TVM loads and runs (in a fresh process: nothing registered there)."""
    monkeypatch.setenv(kc.CACHE_ENV, str(tmp_path / "kc"))
    model = onnx_models.small_cnn(size=16)
    cm = roller.compile_model(model, roller.load_device())
    assert cm.calls_cache and {r.cache for r in cm.report} <= {"hit", "miss"}
    paths = cm.export(tmp_path / "out")
    feeds = cm.random_inputs(1)
    np.save(tmp_path / "x.npy", feeds["x"])
    script = f"""
import numpy as np, tvm
from tvm import relax
vm = relax.VirtualMachine(tvm.runtime.load_module({paths['library']!r}), tvm.cpu())
np.save({str(tmp_path / 'y.npy')!r}, vm["main"](tvm.runtime.tensor(np.load({str(tmp_path / 'x.npy')!r}))).numpy())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    reference = frontend.onnxruntime_session(model, 1).run(None, feeds)
    assert frontend.compare([np.load(tmp_path / "y.npy")], reference)["matches"]


def test_without_the_cache_the_model_is_compiled_whole(tmp_path, monkeypatch):
    monkeypatch.setenv(kc.CACHE_ENV, str(tmp_path / "kc"))
    model = onnx_models.small_cnn(size=16)
    cm = roller.compile_model(model, roller.load_device(), cache=False)
    assert not cm.calls_cache and {r.cache for r in cm.report} == {None}
    assert open_store().stats()["entries"] == 0
    assert frontend.check_against_onnxruntime(cm, model, time_it=False)["matches"]
