"""How much of an operator's data the cores' private caches still hold at its next call, against its size:
the measurement behind ``roller.plan.cost.RESIDENT_FULL`` / ``RESIDENT_NONE``.

    PYTHONPATH=$PWD python3 scripts/residency.py --op add_relu --n 3001 --rows 40,60,80,100,120,140,180
    PYTHONPATH=$PWD python3 scripts/residency.py --op reduce_sum --n 3001 --rows 110,230,300,340,400,560

Builds the top-1 kernel (no profiling) of ``OP`` on M x N for each M, calls each on the same tensors again
and again (as a server calls a layer, or the suite times it), all timed alternately in one process (median
of the rounds), and prints per size: its bytes as a share of all the units' outermost private caches
(``fill``), the time, the GB/s it moved, the model's prediction and, from the time, the share of the bytes
that came from the private caches (solving bytes / (share / private + (1 - share) / shared) for the
calibrated bandwidths, after the model's launch cost) beside the model's ``resident_share``.
"""
from __future__ import annotations

import argparse

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", default="add_relu", help="a roller operator with M, N shape keys (default add_relu)")
    ap.add_argument("--n", type=int, default=3001, help="N (default 3001)")
    ap.add_argument("--rows", default="40,60,80,100,120,140,180", help="the values of M, comma-separated")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)

    import tvm

    from roller.tir import ops
    from roller.builder.api import build_op
    from roller.plan.cost import launch_seconds, private_fill, resident_share, shared_source, tensor_bytes
    from roller.measure.timing import time_alternately

    dev = tvm.cpu()
    impls, built = [], {}
    for m in (int(x) for x in args.rows.split(",")):
        r = build_op(args.op, {"M": m, "N": args.n}, profile=False, cache=False)
        spec, full = ops.get_op(args.op), dict(r.report["shape"])
        arrays = spec.inputs(full, "float32", np.random.default_rng(0))
        arrays.append(np.zeros(spec.output_shape(full), "float32"))
        tensors = [tvm.runtime.tensor(a, dev) for a in arrays]
        main_fn = r.module["main"]
        impls.append((str(m), lambda f=main_fn, a=tensors: f(*a)))
        built[str(m)] = r
    times = time_alternately(impls, rounds=args.rounds, target=0.03)
    print(f"{args.op} M x {args.n}, top-1 kernels, median of {args.rounds} alternated rounds")
    print("     M   fill      MB       us    GB/s  model us  meas/model  private share: measured  model")
    for m, t in times.items():
        r = built[m]
        device, expr = r.device, r.expr
        private = device.private_levels[-1]
        nbytes = tensor_bytes(expr)
        fill = private_fill(expr, device)
        hi, lo = private.total_bandwidth_gbps * 1e9, shared_source(expr, device).total_bandwidth_gbps * 1e9
        moving = max(t - launch_seconds(device, device.units.count), 1e-9)
        share = (1 / lo - moving / nbytes) / (1 / lo - 1 / hi)
        pred = r.program.predicted_seconds
        print(f"{m:>6} {fill:6.2f} {nbytes / 1e6:7.2f} {t * 1e6:8.1f} {nbytes / t / 1e9:7.1f} {pred * 1e6:9.1f}"
              f" {t / pred:11.2f} {min(max(share, 0.0), 1.0):24.2f} {resident_share(expr, device):6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
