"""What bucketing a symbolic dimension costs: a bucket's kernel (inputs zero-padded, output cropped)
against a kernel specialised on the exact value, for a linear layer [seq, K] x [K, N] whose sequence
length varies, timed alternately in this process (top-1 kernels; a temporary kernel cache).

Per sampled length: both end-to-end times (the activation in numpy, the weight a TVM tensor made once,
the output back in numpy: what a server pays, padding and copies included) and their ratio, and both kernels alone (TVM tensors made beforehand, the bucket's inputs
already padded) and their ratio; then the median and worst ratio, and how many kernels each policy needs for
every length in 1..--max-seq with their compile seconds (measured for the sampled ones).

    python3 scripts/bucket_cost.py [--k 512 --n 512] [--max-seq 512] [--epsilon 0.125] [--align 8]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

# lengths just above bucket edges (the most padding) and a few in between, over 1..512
SAMPLES = (1, 3, 5, 9, 17, 33, 47, 65, 100, 129, 200, 257, 300, 400, 511)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=512)
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--max-seq", type=int, default=512)
    ap.add_argument("--epsilon", type=float, default=0.125)
    ap.add_argument("--align", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="roller-bucket-cost-")
    os.environ["ROLLER_CACHE"] = root
    try:
        return run(args)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(args) -> int:
    import numpy as np
    import tvm

    from benchutil import dynamic_linear
    from roller.serve.buckets import BucketPolicy, specialize
    from roller.serve.jit import JIT
    from roller.measure.timing import time_alternately

    func = dynamic_linear(args.k, args.n)
    policy = BucketPolicy(args.epsilon, args.align)
    jit = JIT(background=0)
    dyn = jit.dynamic(func, policy)
    rng = np.random.default_rng(0)
    weight = rng.uniform(-1, 1, (args.k, args.n)).astype("float32")

    weight_tvm = tvm.runtime.tensor(weight)  # a server keeps its weights as TVM tensors

    def exact_call(kernel, m):
        def call(x):
            out = tvm.runtime.empty((m, args.n), "float32")
            kernel(tvm.runtime.tensor(x), weight_tvm, out)
            return out.numpy()
        return call

    rows, ratios, build = [], [], {"exact": 0.0, "bucket": 0.0}
    for m in (s for s in SAMPLES if s <= args.max_seq):
        x = rng.uniform(-1, 1, (m, args.k)).astype("float32")
        t = time.perf_counter()
        exact = exact_call(jit(specialize(func, {"seq": m}), tier="top1"), m)
        build["exact"] += time.perf_counter() - t
        t = time.perf_counter()
        got = dyn(x, weight_tvm)  # builds the bucket's kernel on first use
        build["bucket"] += time.perf_counter() - t
        ref = x @ weight
        np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(exact(x), ref, rtol=1e-3, atol=1e-3)
        b = policy.bucket(m)
        exact_args = [tvm.runtime.tensor(x), tvm.runtime.tensor(weight), tvm.runtime.empty((m, args.n), "float32")]
        padded = np.zeros((b, args.k), "float32")
        padded[:m] = x
        bucket_args = [tvm.runtime.tensor(padded), tvm.runtime.tensor(weight),
                       tvm.runtime.empty((b, args.n), "float32")]
        exact_kernel, bucket_kernel = jit(specialize(func, {"seq": m}), tier="top1"), dyn.kernel({"seq": b})
        times = time_alternately([("exact", lambda: exact(x)), ("bucket", lambda: dyn(x, weight_tvm)),
                                  ("exact kernel", lambda: exact_kernel(*exact_args)),
                                  ("bucket kernel", lambda: bucket_kernel(*bucket_args))],
                                 rounds=args.rounds, target=0.03, settle=0.1)
        ratio = times["bucket"] / times["exact"]
        ratios.append(ratio)
        rows.append((m, b, times, ratio, times["bucket kernel"] / times["exact kernel"]))

    print(f"linear [seq, {args.k}] x [{args.k}, {args.n}] float32, top-1 kernels; "
          f"policy epsilon={args.epsilon} align={args.align}; medians of {args.rounds} alternating rounds")
    print("| seq | bucket | padding | exact, end to end | bucket, end to end | bucket / exact | "
          "exact kernel alone | bucket kernel alone | bucket / exact (kernels) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for m, b, t, ratio, kratio in rows:
        print(f"| {m} | {b} | {(b - m) / m:.0%} | {t['exact'] * 1e6:.1f} us | {t['bucket'] * 1e6:.1f} us | "
              f"{ratio:.2f} | {t['exact kernel'] * 1e6:.1f} us | {t['bucket kernel'] * 1e6:.1f} us | {kratio:.2f} |")
    n_buckets = len(policy.buckets(1, args.max_seq))
    kratios = [row[4] for row in rows]
    print(f"summary: bucket/exact end to end median {statistics.median(ratios):.2f}, worst {max(ratios):.2f} "
          f"(seq {rows[ratios.index(max(ratios))][0]}); kernels alone median {statistics.median(kratios):.2f}, "
          f"worst {max(kratios):.2f}; kernels for 1..{args.max_seq}: {n_buckets} bucketed "
          f"against {args.max_seq} exact; first-call build seconds over the {len(rows)} samples: "
          f"exact {build['exact']:.1f}, bucketed {build['bucket']:.1f} ({dyn.kernels()} kernels)")
    jit.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
