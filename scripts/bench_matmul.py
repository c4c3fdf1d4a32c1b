"""Headline benchmark: roller's matmul 1024^3 float32 against numpy ``A @ B``, GFLOP/s and ratio.

Each measurement runs in its own process, roller and numpy alternating, and medians over the processes
are quoted (timings on a shared machine vary 5-20% between processes). numpy runs with
OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed from its environment (so OpenBLAS picks its own kernel,
the AVX-512 one on an AVX-512 machine); roller runs with TVM_NUM_THREADS = the device's cores.

    python scripts/bench_matmul.py [--procs 5] [--size 1024] [--plan hand|api]

``--plan api`` (the default) builds through ``roller.builder.api.build(func, device, topk=10)``: construction
plus the top-10 profile, what ``roller build`` does. ``--plan hand`` builds one hand-written plan (the best
found by hand on this machine), a reference for what the code generator can reach. The wall time of the
whole ``roller build`` command (top-10 profiled, a fresh process) is measured once per process too.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

DEFAULT_PLAN = "api"
MEASURE_SECONDS = 0.3   # per timed repeat
REPEATS = 5


def hand_program(expr):
    """The plan that won the hand search on a 2-core AVX-512 machine: an 8x32 register tile (16 zmm
    accumulators), L1 tile 128x32x256, L2 (per-core) tile 128x256x256, B packed per tile with 16 floats
    of row padding against cache-set conflicts."""
    from roller.plan.rprogram import RProgram
    from roller.plan.rtile import default_vector_axis

    m, n, k = (a.name for a in expr.axes)
    tiles = ({m: 8, n: 32, k: 1}, {m: 128, n: 32, k: 256}, {m: 128, n: 256, k: 256})
    return RProgram(levels=("reg", "L1", "L2"), tiles=tiles, grid={}, units=2, waves=1,
                    vector_axis=default_vector_axis(expr), packed=("B",), storage_pad={"B": 16})


def make_kernel(func, device, plan: str):
    """(callable module, description) of roller's kernel for ``func``."""
    if plan == "api":
        from roller.builder.api import build_op
        size = int(func.params[0].shape[0])
        res = build_op("matmul", {"M": size, "N": size, "K": size}, device=device, topk=10,
                       cache=False)  # a fresh build: its time is what is reported
        return res.module, (f"roller.builder.api.build_op topk=10 (as roller build), construct {res.report['construct_seconds']:.3f} s, "
                            f"chosen #{res.report.get('chosen')}: {res.program.describe()}")
    from roller.tir.analysis import analyze
    from roller.targets import build as codegen_build
    an = analyze(func)
    prog = hand_program(an.expr)
    return codegen_build(an.func, an.expr, prog, device).mod, f"hand plan: {prog.describe()}"


def child_roller(size: int, plan: str) -> dict:
    import numpy as np
    import tvm

    from roller.tir import ops
    from roller.device.load import load_device
    from roller.tir.compile import set_threads

    device = load_device("host")
    set_threads(device.units.count)
    shape = dict(M=size, N=size, K=size)
    func = ops.matmul(size, size, size)
    t0 = time.perf_counter()
    mod, desc = make_kernel(func, device, plan)
    build_s = time.perf_counter() - t0
    ins = ops.OPS["matmul"].inputs(shape)
    ref = ops.OPS["matmul"].reference(ins, shape)
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in ins] + [tvm.runtime.empty(ref.shape, "float32", dev)]
    mod["main"](*args)
    np.testing.assert_allclose(args[-1].numpy(), ref, rtol=1e-4, atol=1e-4)
    t1 = time.perf_counter()
    mod["main"](*args)
    number = max(1, int(MEASURE_SECONDS / max(time.perf_counter() - t1, 1e-6)))
    res = mod.time_evaluator("main", dev, number=number, repeat=REPEATS)(*args).results
    return {"seconds": statistics.median(res), "build_seconds": build_s, "desc": desc,
            "threads": os.environ.get("TVM_NUM_THREADS")}


def child_numpy(size: int) -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.random((size, size), dtype=np.float32)
    b = rng.random((size, size), dtype=np.float32)
    a @ b
    t1 = time.perf_counter()
    a @ b
    number = max(1, int(MEASURE_SECONDS / max(time.perf_counter() - t1, 1e-6)))
    res = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        for _ in range(number):
            a @ b
        res.append((time.perf_counter() - t) / number)
    from benchutil import openblas_info
    return {"seconds": statistics.median(res), "openblas": openblas_info()}


def _run_child(kind: str, args) -> dict:
    env = dict(os.environ)
    if kind == "numpy":
        env.pop("OPENBLAS_CORETYPE", None)
        env.pop("OPENBLAS_L2_SIZE", None)
    else:
        from roller.device.host import cpu_count
        env["TVM_NUM_THREADS"] = str(cpu_count())
    out = subprocess.run([sys.executable, __file__, "--child", kind, "--size", str(args.size), "--plan", args.plan],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cli_wall_seconds(size: int) -> float:
    """Wall time of the whole `roller build` command in a fresh process (imports included)."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "roller.cli", "build", "matmul", "--shape", f"M={size},N={size},K={size}",
                    "--json", "--no-cache"], capture_output=True, text=True, check=True)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=5, help="processes per side (medians are quoted)")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--plan", choices=("hand", "api"), default=DEFAULT_PLAN)
    ap.add_argument("--child", choices=("roller", "numpy"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        r = child_roller(args.size, args.plan) if args.child == "roller" else child_numpy(args.size)
        print(json.dumps(r))
        return
    flops = 2 * args.size ** 3
    rol, nps = [], []
    walls = []
    for i in range(args.procs):
        walls.append(_cli_wall_seconds(args.size))
        rol.append(_run_child("roller", args))
        nps.append(_run_child("numpy", args))
        print(f"process {i + 1}/{args.procs}: roller {flops / rol[-1]['seconds'] / 1e9:7.1f} GFLOP/s   "
              f"numpy {flops / nps[-1]['seconds'] / 1e9:7.1f} GFLOP/s", flush=True)
    g_r = statistics.median(flops / r["seconds"] / 1e9 for r in rol)
    g_n = statistics.median(flops / r["seconds"] / 1e9 for r in nps)
    print(f"\nmatmul {args.size}^3 float32, medians over {args.procs} processes each")
    print(f"roller: {g_r:7.1f} GFLOP/s  (TVM_NUM_THREADS={rol[0]['threads']}, build {rol[0]['build_seconds']:.2f} s, "
          f"{rol[0]['desc'].replace(chr(10), '; ')})")
    print(f"numpy : {g_n:7.1f} GFLOP/s  (OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset; {nps[0]['openblas']})")
    print(f"ratio roller/numpy: {g_r / g_n:.2f}")
    print(f"`roller build matmul` wall time (top-10 profiled, whole process): median {statistics.median(walls):.2f} s "
          f"over {len(walls)} runs (max {max(walls):.2f} s)")


if __name__ == "__main__":
    main()
