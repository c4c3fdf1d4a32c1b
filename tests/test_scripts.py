"""Every script in scripts/ runs, in a smoke form: the smallest meaningful arguments, exit code 0 and a line
that shows it did its work. A new script without an entry in SMOKE fails test_every_script_has_a_smoke_run.

scripts/benchutil.py is the scripts' library: it is tested through its users. Scripts that need what this
machine may lack (a CUDA toolchain, PyTorch) run ``--help`` and are skipped, naming what is missing."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
LIBRARIES = {"benchutil"}  # imported by the scripts, not run
CASE = "bert_rowsum_128x768"  # a small suite case: one 128x768 row sum

# name -> (arguments (TMP: a temporary folder), regular expression the output must contain, slow)
SMOKE: dict[str, tuple[list[str], str, bool]] = {
    "ab_first_plans": (["TMP/plans.json", "TMP/plans.json", CASE, "--rounds", "1", "--suite", str(SCRIPTS / "suite.csv")],
                       r"old/new paired \d", True),
    "bench_dynamo": (["--models", "tiny_resnet", "--engines", "eager,roller,onnxruntime", "--rounds", "1", "--target",
                      "0.01", "--out", "TMP/bd"], r"\| tiny_resnet \| roller \| [\d.]+ \| [\d.]+ \| 1\.00 \|", True),
    "bench_matmul": (["--procs", "1", "--size", "128", "--plan", "hand"], r"ratio|GFLOP/s", True),
    "bench_models": (["--models", "cnn,cnn_qdq", "--rounds", "1", "--no-torch", "--batch", "1,2", "--out", "TMP/bm"],
                     r"\| cnn \| 2 \|[^\n]*\| (onnxruntime|OpenVINO) \| \d[^\n]*\n[^\n]*\| cnn_qdq \| 1 \|[^\n]*\| yes \|",
                     True),  # batch 2's row names its fastest peer; the quantized CNN's outputs match
    "bench_quantized": (["--layers", "1", "--seq", "16", "--dim", "32", "--heads", "2", "--hidden", "64", "--rounds", "1",
                         "--out", "TMP/bq"], r"onnxruntime\s+[\d.]+ ms", True),
    "bench_ops": (["--smoke", "--rounds", "1"], r"add_relu", True),
    "bench_rows": (["--cases", "^softmax", "--rounds", "1"], r"softmax", True),
    "bench_suite": (["--cases", CASE, "--quick", "--no-torch", "--out", "TMP/bs", "--device", "x86-avx2"], CASE, True),
    "bucket_cost": (["--k", "64", "--n", "64", "--max-seq", "16", "--rounds", "1"], r"ratio|median", True),
    "cache_latency": (["--shape", "M=64,N=64,K=64", "--calls", "3"], r"median|us|ms", True),
    "compare_plans": (["matmul", "M=64,N=64,K=64", "0", "1", "--rounds", "1", "--no-torch", "--constants", "B"], r"\d",
                      True),  # --constants: the prepacked path (benchutil.checked_plan) too
    "core_speeds": (["--seconds", "1", "--bucket", "0.5"], r"\d", False),
    "cpu_plans_snapshot": (["--check", "TMP/plans.json", "--cases", CASE, "--suite", str(SCRIPTS / "suite.csv")],
                           r"identical: 1 cases", False),
    "export_models": (["--list"], r"resnet50\ttorchvision", False),  # --list needs no torch
    "gpu_matmul_vs_dlight": (["--shape", "256,256,256", "--topk", "1"], r"dlight", True),
    "gpu_suite": (["--cases", CASE, "--topk", "1"], CASE, False),
    "model_breakdown": (["--model", "cnn", "--rounds", "1", "--ort-runs", "1"], r"conv", True),
    "prepack_ab": (["--model", "cnn", "--rounds", "1"], r"\d", True),
    "profile_margin_ab": (["--cases", CASE, "--rounds", "1", "--margin", "0.05"], r"1 cases: plans profiled median",
                          True),
    "residency": (["--n", "256", "--rows", "8,16", "--rounds", "1"], r"\d", True),
    "serve_sim": (["--procs", "1", "--seconds", "1", "--max-seq", "16", "--k", "32", "--n", "32", "--topk", "1"],
                  r"requests: \d+", True),
    "torch_eager": ([], "", False),  # a library of bench_models' PyTorch column: needs torch
}
# scripts that need something this machine may lack: name -> a function returning why (None: nothing lacks)


def _no_torch():
    try:
        import torch  # noqa: F401
    except ImportError as e:
        return f"PyTorch is not installed ({e})"
    return None


def _no_cuda_toolchain():
    from roller.targets.cuda import toolchain

    reason = toolchain.missing()
    return f"no CUDA toolchain: {reason}" if reason else None


NEEDS = {"torch_eager": _no_torch, "gpu_matmul_vs_dlight": _no_cuda_toolchain}
# scripts that, lacking what they need, say so in one line and exit 2: without it their smoke run checks that
MISSING_EXIT = {"bench_dynamo": _no_torch}


def run(name: str, args: list[str], tmp: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    args = [a.replace("TMP", str(tmp)) for a in args]
    return subprocess.run([sys.executable, str(SCRIPTS / f"{name}.py"), *args], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_every_script_has_a_smoke_run():
    names = {p.stem for p in SCRIPTS.glob("*.py")} - LIBRARIES
    assert names == set(SMOKE), f"scripts without a smoke run: {sorted(names - set(SMOKE))}; " \
                                f"entries without a script: {sorted(set(SMOKE) - names)}"


def test_no_private_or_mutual_imports():
    scripts = {p.stem for p in SCRIPTS.glob("*.py")}
    imports: dict[str, set[str]] = {}
    for p in SCRIPTS.glob("*.py"):
        text = p.read_text()
        assert not re.search(r"from roller[\w.]* import .*\b_[a-z]", text), f"{p.name} imports a private name"
        assert not re.search(r"from \w+ import .*\b_[a-z]\w*", text), f"{p.name} imports a private name"
        assert not re.search(r"\b(dyn|roller[\w.]*)\._[a-z]", text), f"{p.name} uses a private attribute"
        imports[p.stem] = {m for m in re.findall(r"^\s*(?:from|import) (\w+)", text, re.M) if m in scripts}
    for a, deps in imports.items():
        for b in deps:
            assert a not in imports.get(b, ()), f"{a} and {b} import each other"


@pytest.mark.parametrize("name", ["bench_suite", "bench_models", "compare_plans"])
def test_user_scripts_help(name, tmp_path):
    r = run(name, ["--help"], tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "usage:" in r.stdout
    doc = (SCRIPTS / f"{name}.py").read_text().split('"""')[1]
    assert f"scripts/{name}.py" in doc, f"{name}'s docstring does not say how to run it"


@pytest.fixture(scope="module")
def plans_snapshot(tmp_path_factory):
    """One case's plan snapshot (cpu_plans_snapshot --write), read by its --check and by ab_first_plans."""
    tmp = tmp_path_factory.mktemp("snapshot")
    r = run("cpu_plans_snapshot", ["--write", "TMP/plans.json", "--cases", CASE], tmp)
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stdout and "(1 cases)" in r.stdout
    return tmp


def _params():
    for name, (_, _, slow) in sorted(SMOKE.items()):
        yield pytest.param(name, marks=[pytest.mark.build] if slow else [])


@pytest.mark.parametrize("name", _params())
def test_smoke(name, tmp_path, request):
    args, expect, _ = SMOKE[name]
    if any("plans.json" in a for a in args):
        tmp_path = request.getfixturevalue("plans_snapshot")
    missing = MISSING_EXIT.get(name)
    if missing and missing():
        r = run(name, args, tmp_path, timeout=60)
        assert r.returncode == 2, r.stdout + r.stderr
        assert r.stdout == "" and re.fullmatch(rf"{name}: needs [^\n]*\n", r.stderr), r.stderr
        return
    need = NEEDS.get(name)
    reason = need() if need else None
    if reason:
        if name in LIBRARIES or name == "torch_eager":
            pytest.skip(reason)
        r = run(name, ["--help"], tmp_path, timeout=60)
        assert r.returncode == 0, r.stderr
        pytest.skip(f"--help only: {reason}")
    r = run(name, args, tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert re.search(expect, out), out[-3000:]


def test_bench_models_fastest_peer_from_rounds(monkeypatch):
    """bench_models' fastest peer: of the peers listed (a runtime whose outputs differ is not one), the
    lowest median over the rounds, not the lowest single round; its ratio to roller is paired (the median
    of the rounds' ratios), not the ratio of the medians. Fake rounds: no timing."""
    import importlib.util

    from roller.measure.timing import fastest_peer

    rounds = {"roller": [1.0, 2.0, 1.5],
              "onnxruntime": [2.0, 2.0, 2.0],
              "openvino": [1.2, 3.0, 1.0],  # median 1.2: the fastest peer
              "torch_1": [0.5, 9.0, 9.0],  # the fastest single round, a slow median
              "roller_profiled": [0.1, 0.1, 0.1]}  # timed in the rounds, not a peer
    peer, ratio = fastest_peer(rounds, ["onnxruntime", "openvino", "torch_1"])
    assert peer == "openvino"
    assert ratio == pytest.approx(1.2)  # rounds' ratios 1.2, 1.5, 0.67; the medians' ratio would be 0.8
    assert fastest_peer(rounds, ["onnxruntime"]) == ("onnxruntime", pytest.approx(4 / 3))
    assert fastest_peer({"roller": [1.0], "a": [2.0], "b": [2.0]}, ["b", "a"])[0] == "b"  # a tie: the first listed
    with pytest.raises(ValueError):
        fastest_peer(rounds, [])
    # the table names it and gives the ratio
    monkeypatch.syspath_prepend(str(SCRIPTS))
    spec = importlib.util.spec_from_file_location("bench_models_under_test", SCRIPTS / "bench_models.py")
    bm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bm)
    row = {"model": "m", "batch": 8, "compile_seconds": 1.0, "latency_seconds": 1.5e-3, "by_rule": {"roller": 1},
           "onnxruntime_latency_seconds": 2e-3, "openvino_latency_seconds": 1.2e-3, "fastest_peer": peer,
           "fastest_peer_over_roller": ratio, "max_abs_error": 0.0, "matches": True, "functions": 1}
    assert "| m | 8 | 1.0 | 1.50 | 2.00 | 1.20 | - | OpenVINO | 1.20 |" in bm.table([row])
    assert "| PyTorch 1t |" in bm.table([dict(row, fastest_peer="torch_1")])


@pytest.mark.parametrize("csv_name", ["suite.csv", "gemm_suite.csv"])
def test_every_suite_case_names_an_operator_roller_builds(csv_name):
    """The suites bench_suite.py reads (--suite) parse, and each case is an operator and shape roller has: a case
    that no longer does would only show as skipped in a benchmark nobody runs in CI."""
    import sys as _sys

    _sys.path.insert(0, str(SCRIPTS))
    from bench_suite import case_spec, load_cases

    cases = load_cases(SCRIPTS / csv_name)
    assert cases
    for case in cases:
        spec = case_spec(case)  # raises Skip where roller lacks the operator or an option
        assert spec.full_shape(case.shape), case.name


def test_ab_first_plans_compares_plans_with_fields_at_their_defaults():
    """A snapshot written before RProgram gained a field compares equal to one written after where the plan
    leaves the field at its default: ab_first_plans then times only the cases whose first plan moved."""
    sys.path.insert(0, str(SCRIPTS))
    from ab_first_plans import moved, plan_key

    new = {"levels": ["reg"], "tiles": {"reg": {"i": 4}}, "grid": {"i": 1}, "units": 1, "waves": 1,
           "register_transposes": [], "amx": False, "predicted_seconds": 1e-6}
    old = {k: v for k, v in new.items() if k not in ("register_transposes", "amx", "predicted_seconds")}
    assert plan_key(old) == plan_key(new)
    other = dict(new, tiles={"reg": {"i": 8}})
    assert moved({"a": [old], "b": [old]}, {"a": [new], "b": [other]}) == ["b"]
