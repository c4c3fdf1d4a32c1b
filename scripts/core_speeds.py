"""How fast each core runs, side by side, over time: one process per core, pinned there, times the same
one-thread work (a 256x256 float32 numpy matmul, 40 calls) over and over; prints each core's median per
time bucket.

    python3 scripts/core_speeds.py                  # 20 s, 0.5 s buckets, every core this process may use
    python3 scripts/core_speeds.py --seconds 40 --cores 0,1

On a shared VM the cores do not run at one speed: on the VM of 2026-11-26 one vCPU ran 1.5x slower than
the other for seconds at a time while the other kept its speed (a co-tenant on its host core, presumably).
A kernel that splits its grid evenly then waits for the slow core (see roller/codegen/balance.py). Run this
before quoting two-core figures: a bucket where one core is slower than the others flags that phase.
Numpy runs on one thread here (OPENBLAS_NUM_THREADS=1 is set for the workers).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

WORKER = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
import numpy as np
a = np.random.default_rng(0).random((256, 256), dtype=np.float32)
start, end = float(sys.argv[2]), float(sys.argv[2]) + float(sys.argv[3])
while time.time() < start:
    time.sleep(0.001)
while time.time() < end:
    t = time.perf_counter()
    for _ in range(40):
        a @ a
    print(time.time(), time.perf_counter() - t, flush=True)
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0, help="how long to measure (default 20)")
    p.add_argument("--bucket", type=float, default=0.5, help="seconds per printed bucket (default 0.5)")
    p.add_argument("--cores", default=None, help="comma-separated core ids (default: all this process may use)")
    args = p.parse_args(argv)
    allowed = sorted(os.sched_getaffinity(0))
    try:
        cores = [int(c) for c in args.cores.split(",")] if args.cores else allowed
    except ValueError:
        p.error(f"--cores {args.cores!r}: give core ids separated by commas, e.g. 0,1")
    if not set(cores) <= set(allowed):
        p.error(f"--cores {args.cores}: this process may use cores {allowed} only")
    if args.seconds <= 0 or args.bucket <= 0:
        p.error("--seconds and --bucket must be positive")
    start = time.time() + 2.0  # every worker has imported numpy by then
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    # each worker writes to a file of its own: through pipes read one after the other, a worker whose pipe
    # filled would stall while the first one was read
    outs = [tempfile.TemporaryFile("w+") for _ in cores]
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(c), str(start), str(args.seconds)],
                              stdout=out, text=True, env=env) for c, out in zip(cores, outs)]
    samples = {}
    for c, proc, out in zip(cores, procs, outs):
        if proc.wait():
            print(f"the worker on core {c} failed (exit {proc.returncode})", file=sys.stderr)
            return 1
        out.seek(0)
        samples[c] = [tuple(map(float, line.split())) for line in out if line.strip()]
    buckets = int(args.seconds / args.bucket)
    print(f"ms per 40 matmuls of 256x256 (one thread), median per {args.bucket:g} s; rows: cores")
    print("core " + " ".join(f"{i * args.bucket:5.1f}" for i in range(buckets)))
    for c in cores:
        cells = []
        for i in range(buckets):
            v = [d for t, d in samples[c] if i * args.bucket <= t - start < (i + 1) * args.bucket]
            cells.append(f"{statistics.median(v) * 1e3:5.1f}" if v else "    -")
        print(f"{c:4d} " + " ".join(cells))
    medians = {c: statistics.median(d for _, d in samples[c]) for c in cores if samples[c]}
    fast = min(medians.values())
    print("overall median: " + ", ".join(f"core {c} {m * 1e3:.1f} ms ({m / fast:.2f}x the fastest)"
                                         for c, m in medians.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
