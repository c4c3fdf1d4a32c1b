"""Kernel-cache hit latency: from the call to a runnable (loaded) module, in a process that is running.

Builds one kernel into a temporary cache (never the user's), checks it against numpy, then times
cache hits three ways: ``roller.build(func, device)`` with a PrimFunc and a loaded Device,
``roller.build_op(...)`` with a loaded Device (it also makes the PrimFunc), and ``roller.build_op(...)``
without one (the host device is detected and its calibration read on every call). Prints medians.

    python3 scripts/cache_latency.py [--shape M=1024,N=1024,K=1024] [--op matmul] [--calls 30]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", default="matmul")
    ap.add_argument("--shape", default="M=1024,N=1024,K=1024")
    ap.add_argument("--calls", type=int, default=30)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="roller-cache-latency-")
    os.environ["ROLLER_CACHE"] = root
    try:
        return run(args)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(args) -> int:

    import numpy as np
    import tvm

    import roller
    from roller import ops

    spec = ops.get_op(args.op)
    shape = ops.parse_shape(spec, args.shape, "float32")
    dev = roller.load_device()
    first = roller.build_op(args.op, shape, device=dev, profile=False)
    assert first.report["cache"] == "miss"
    func = spec.make(shape, "float32")

    def timed(call) -> str:
        ts = []
        for _ in range(args.calls):
            t = time.perf_counter()
            res = call()
            ts.append(time.perf_counter() - t)
            assert res.report["cache"] == "hit"
        # the last hit's module computes the right thing
        arrays = spec.inputs(shape, "float32", np.random.default_rng(1))
        out = tvm.runtime.tensor(np.full(spec.output_shape(shape), np.nan, "float32"))
        res.module["main"](*[tvm.runtime.tensor(a) for a in arrays], out)
        np.testing.assert_allclose(out.numpy(), spec.reference(arrays, shape), rtol=1e-3, atol=1e-3)
        return f"median {statistics.median(ts) * 1e3:.2f} ms (min {min(ts) * 1e3:.2f}, max {max(ts) * 1e3:.2f})"

    print(f"{args.op} {args.shape}: first build (miss, top-1) {first.report['build_seconds']:.2f} s; "
          f"{args.calls} hits each, checked against numpy:")
    print(f"  roller.build(func, device)          {timed(lambda: roller.build(func, dev, profile=False))}")
    print(f"  roller.build_op(..., device=device) {timed(lambda: roller.build_op(args.op, shape, device=dev, profile=False))}")
    print(f"  roller.build_op(...) (no device)    {timed(lambda: roller.build_op(args.op, shape, profile=False))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
