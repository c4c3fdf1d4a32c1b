"""The Python interface end to end: every named operator built by construction + profiling, checked
against numpy (by the profiler, and again here on the returned module)."""
import os
import subprocess
import sys

import numpy as np
import pytest

import roller
from roller.tir import ops
from roller.errors import InvalidShapeError, UnsupportedExpressionError
from roller.measure.verify import fill_sentinel

CASES = [
    ("matmul", {"M": 1, "N": 1, "K": 1}),
    ("matmul", {"M": 17, "N": 1025, "K": 31}),
    ("batch_matmul", {"B": 3, "M": 7, "N": 33, "K": 129}),
    ("conv2d", {"N": 1, "H": 13, "W": 11, "C": 5, "K": 17, "R": 3, "S": 3, "stride": 2, "pad": 1}),
    ("reduce_sum", {"M": 3, "N": 1025}),
    ("add_relu", {"M": 17, "N": 33}),
]


def run_module(module, arrays, out_shape, dtype):
    import tvm
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in arrays] + [tvm.runtime.tensor(fill_sentinel(np.empty(out_shape, dtype)), dev)]
    module["main"](*args)
    return args[-1].numpy()


@pytest.mark.build
@pytest.mark.parametrize("op,shape", CASES, ids=[f"{o}-{'x'.join(map(str, s.values()))}" for o, s in CASES])
def test_build_op_matches_numpy(op, shape):
    res = roller.build_op(op, shape, topk=2)
    rep = res.report
    assert rep["verified"] and rep["kernel_seconds"] > 0 and rep["op"] == op
    spec = ops.OPS[op]
    full = ops.validate_shape(op, shape, "float32")
    arrays = spec.inputs(full, "float32", np.random.default_rng(7))  # fresh data, not the profiling inputs
    out = run_module(res.module, arrays, spec.output_shape(full), spec.out_dtype("float32"))
    np.testing.assert_allclose(out, spec.reference(arrays, full), rtol=1e-5, atol=1e-5)


# the operators added with string options, groups and dilation: top-1 only (no profiling), to stay fast
TOP1_CASES = [
    ("depthwise_conv2d", {"N": 1, "H": 9, "W": 7, "C": 5, "R": 3, "S": 3, "stride": 2, "pad": 1}, {}),
    ("depthwise_conv2d", {"N": 2, "H": 7, "W": 11, "C": 3, "R": 3, "S": 2, "pad": 2, "dilation": 2}, {}),
    ("pool2d", {"N": 1, "H": 9, "W": 7, "C": 5, "R": 3, "S": 3, "stride": 2, "pad": 1}, {}),
    ("pool2d", {"N": 1, "H": 9, "W": 7, "C": 5, "R": 3, "S": 3, "stride": 2, "pad": 1}, {"kind": "avg"}),
    ("pool2d", {"N": 2, "H": 13, "W": 1, "C": 17, "R": 2, "S": 1, "stride": 2}, {"kind": "max"}),
    ("conv2d", {"N": 1, "H": 9, "W": 7, "C": 6, "K": 9, "R": 3, "S": 3, "pad": 1, "groups": 3}, {}),
    ("conv2d", {"N": 1, "H": 11, "W": 9, "C": 3, "K": 5, "R": 3, "S": 3, "stride": 2, "pad": 2, "dilation": 2}, {}),
    ("matmul", {"M": 17, "N": 33, "K": 31}, {"layout": "nt"}),
]


@pytest.mark.build
@pytest.mark.parametrize("op,shape,options", TOP1_CASES,
                         ids=["-".join([o, *opt.values(), "x".join(map(str, s.values()))]) for o, s, opt in TOP1_CASES])
def test_build_op_top1_new_operators_match_numpy(op, shape, options):
    res = roller.build_op(op, shape, profile=False, **options)
    spec = ops.OPS[op].with_options(**options)
    rep = res.report
    assert rep["verified"] and rep["op"] == op and rep["options"] == spec.option_values
    assert list(rep)[:3] == ["op", "shape", "options"] and len(rep["candidates"]) == 1
    full = ops.validate_shape(spec, shape, "float32")
    arrays = spec.inputs(full, "float32", np.random.default_rng(7))  # fresh data, not the checking inputs
    out = run_module(res.module, arrays, spec.output_shape(full), spec.out_dtype("float32"))
    np.testing.assert_allclose(out, spec.reference(arrays, full), rtol=1e-5, atol=1e-5)


@pytest.mark.build
def test_build_any_primfunc_with_epilogue_against_numpy():
    from tvm import te, tirx
    A = te.placeholder((33, 20), name="A")
    B = te.placeholder((20, 40), name="B")
    bias = te.placeholder((40,), name="bias")
    k = te.reduce_axis((0, 20), name="k")
    C = te.compute((33, 40), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    D = te.compute((33, 40), lambda i, j: tirx.max(C[i, j] + bias[j], tirx.const(0, "float32")), name="D")
    func = te.create_prim_func([A, B, bias, D])
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(s).astype("float32") for s in ((33, 20), (20, 40), (40,)))
    ref = np.maximum(a @ b + c, 0)
    res = roller.build(func, topk=3, inputs=[a, b, c], reference=ref)
    assert res.report["verified"]
    np.testing.assert_allclose(run_module(res.module, [a, b, c], (33, 40), "float32"), ref, rtol=1e-5, atol=1e-5)


def test_construct_is_plain_data_without_building():
    cons = roller.construct(ops.matmul(256, 256, 256), roller.load_device("x86-avx512", calibrated=False), topk=3)
    assert len(cons.programs) == 3
    d = cons.programs[0].to_dict()
    assert set(d["tiles"]) == {"reg", "L1", "L2"}


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(InvalidShapeError, match="unknown operator 'nosuch'"):
        roller.build_op("nosuch", {"M": 1})
    with pytest.raises(InvalidShapeError, match="M"):
        roller.build_op("matmul", {"M": 0, "N": 1, "K": 1})
    with pytest.raises(InvalidShapeError, match=r"matmul has no option 'kind' \(an option of pool2d\)"):
        roller.build_op("matmul", {"M": 1, "N": 1, "K": 1}, kind="max")
    with pytest.raises(InvalidShapeError, match="kind='median' is not allowed: use one of max, avg"):
        roller.build_op("pool2d", {"N": 1, "H": 4, "W": 4, "C": 1, "R": 2, "S": 2}, kind="median")
    with pytest.raises(InvalidShapeError, match="kind=avg needs a floating-point dtype"):
        roller.build_op("pool2d", {"N": 1, "H": 4, "W": 4, "C": 1, "R": 2, "S": 2}, "int8", kind="avg")
    from tvm import te
    A = te.placeholder((8,), name="A")
    idx = te.placeholder((8,), name="idx", dtype="int32")
    G = te.compute((8,), lambda i: A[idx[i]], name="G")
    with pytest.raises(UnsupportedExpressionError):
        roller.construct(te.create_prim_func([A, idx, G]))


@pytest.mark.build
def test_script_without_main_guard_builds(tmp_path):
    """Worker processes must not re-run the caller's script (no `if __name__ == "__main__"` needed).
    No kernel cache: a hit would start no workers."""
    import subprocess
    import sys
    script = tmp_path / "user_script.py"
    script.write_text("import roller\n"
                      "r = roller.build_op('matmul', {'M': 20, 'N': 33, 'K': 9}, topk=2, cache=False)\n"
                      "print('verified', r.report['verified'], len(r.report['candidates']))\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "verified True 2"
    assert "died" not in proc.stderr


def test_wrong_input_arrays_and_device_kind_are_clear_errors(tmp_path):
    from roller.errors import BuildError
    with pytest.raises(BuildError, match=r"input A must be an array of shape \(8, 8\) and dtype float32"):
        roller.build(ops.matmul(8, 8, 8), topk=1, inputs=[np.zeros((4, 4), "float32"), np.zeros((8, 8), "float32")])
    import yaml
    spec = yaml.safe_load((roller.device.spec_dir() / "x86-avx512.yaml").read_text())
    spec.update(name="somegpu", kind="gpu", target={"kind": "cuda"})
    spec["units"].pop("vector_bytes")
    spec["units"]["warp_threads"] = 32
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(spec))
    # a GPU spec needs the GPU limits (tests/test_gpu_policy.py); with them the policy plans without a GPU
    with pytest.raises(roller.errors.DeviceSpecError, match="gpu: expected a mapping"):
        roller.build(ops.matmul(8, 8, 8), device=str(path))
    assert roller.construct(ops.matmul(8, 8, 8), "a100", topk=1).programs


THREADS_CHILD = """
import os, sys
import numpy as np
import roller, tvm
r = roller.build_op("add_relu", {"M": 64, "N": 512}, profile=False, cache=False)
a, b = (np.random.default_rng(i).standard_normal((64, 512)).astype("float32") for i in (0, 1))
out = tvm.runtime.tensor(np.zeros((64, 512), "float32"))
r.module["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
np.testing.assert_allclose(out.numpy(), np.maximum(a + b, 0), rtol=1e-6)
allowed = set()
for task in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{task}/status") as f:
        allowed |= {line.split()[1] for line in f if line.startswith("Cpus_allowed_list")}
print(os.environ["TVM_BIND_THREADS"], tvm.get_global_func("runtime.NumThreads")(), " ".join(sorted(allowed)))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and at least two CPUs")
@pytest.mark.parametrize("preset", [None, "1"])
def test_kernels_run_on_unpinned_threads_unless_the_user_pins_them(preset):
    """roller starts TVM's pool with its workers unpinned (TVM_BIND_THREADS=0): pinned, a worker whose core
    other work keeps busy held up every parallel region (ShuffleNet 348 ms a call against 3.9). A user's own
    TVM_BIND_THREADS stands: TVM then pins its workers, each to one CPU."""
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_BIND_THREADS", "TVM_NUM_THREADS")}
    if preset is not None:
        env["TVM_BIND_THREADS"] = preset
    r = subprocess.run([sys.executable, "-c", THREADS_CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    bind, threads, *allowed = r.stdout.split()
    everywhere = f"{min(os.sched_getaffinity(0))}-{max(os.sched_getaffinity(0))}"
    assert int(threads) == roller.load_device("host").units.count
    if preset is None:
        assert bind == "0" and allowed == [everywhere], r.stdout  # no thread restricted to fewer CPUs
    else:
        assert bind == "1" and len(allowed) > 1, r.stdout  # the workers each on a CPU of their own
