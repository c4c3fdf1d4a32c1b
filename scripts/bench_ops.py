"""roller against PyTorch (oneDNN / MKL) and numpy on every named operator, in one run.

For each operator and shape: roller builds its kernel exactly as ``roller build`` does (construction,
top-10 profile, numpy check), then roller's kernel, PyTorch and numpy are timed alternately in this one
process on the same inputs (medians of several rounds), and the ratios are printed. Every result (roller's
and the peers') is checked against numpy's float64 reference first.

Like with like: every implementation writes into an output it was given once (roller's preallocated
buffer; ``out=`` for numpy and PyTorch where the function has it, and relu in place), so no one pays for
allocating temporaries the others do not. The thread counts are printed: roller runs on TVM_NUM_THREADS
threads (the device's cores unless set), PyTorch with torch.set_num_threads(cores), conv2d in
channels_last (NHWC) memory format; numpy's elementwise ops and reductions run on ONE thread (the column
says "numpy[1 thread]"), its matmul in OpenBLAS on its own threads ("numpy[OpenBLAS]"; the header line
names OpenBLAS's kernel and thread count). OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are
left as they are here: use scripts/bench_matmul.py for the numpy GEMM comparison with those unset.

    python scripts/bench_ops.py [--rounds 5] [--ops matmul,conv2d,...]

PyTorch is not a dependency of roller; without it the PyTorch column is skipped. Uninstall it after
benchmarking: with torch installed, `import tvm` imports it too (about 2.5 s more), which shows in every
`roller build`'s wall time.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from benchutil import openblas_info, peers, time_alternately

SMOKE = [("add_relu", {"M": 64, "N": 256})]
CASES = [
    ("matmul", {"M": 1024, "N": 1024, "K": 1024}),
    ("batch_matmul", {"B": 8, "M": 256, "N": 256, "K": 256}),
    ("conv2d", {"N": 1, "H": 56, "W": 56, "C": 64, "K": 64, "R": 3, "S": 3, "pad": 1}),
    ("conv2d", {"N": 1, "H": 14, "W": 14, "C": 256, "K": 256, "R": 3, "S": 3, "pad": 1}),
    ("reduce_sum", {"M": 4096, "N": 4096}),
    ("add_relu", {"M": 4096, "N": 4096}),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ops", default=None, help="comma-separated operator names (default: all)")
    ap.add_argument("--smoke", action="store_true", help="one tiny case (add_relu 64x256, top-1): the CI check")
    args = ap.parse_args(argv)

    import tvm

    import roller
    from roller.tir import ops
    from roller.device.load import load_device

    from roller.measure.verify import TOLERANCE, fill_sentinel
    from roller.tir.compile import set_threads

    device = load_device()
    set_threads(device.units.count)  # before any kernel runs; a TVM_NUM_THREADS of the user's wins
    threads = [f"roller (TVM) {os.environ['TVM_NUM_THREADS']} threads",
               "numpy elementwise / reductions 1 thread, matmul in OpenBLAS (" + openblas_info() + ")"]
    try:
        import torch
        torch.set_num_threads(device.units.count)
        threads.insert(1, f"torch {torch.__version__} {torch.get_num_threads()} threads")
    except ImportError:
        print("torch not installed: PyTorch column skipped", file=sys.stderr)
    print("threads: " + "; ".join(threads), flush=True)
    wanted = set(args.ops.split(",")) if args.ops else None
    for op, shape in (SMOKE if args.smoke else CASES):
        if wanted and op not in wanted:
            continue
        spec = ops.OPS[op]
        full = ops.validate_shape(op, shape, "float32")
        res = roller.build_op(op, full, device=device, **({"profile": False} if args.smoke else {}))
        arrays = spec.inputs(full, "float32", np.random.default_rng(1))
        ref = spec.reference(arrays, full)
        rtol, atol = TOLERANCE["float32"]
        dev = tvm.cpu()
        targs = [tvm.runtime.tensor(a, dev) for a in arrays]
        targs.append(tvm.runtime.tensor(fill_sentinel(np.empty(ref.shape, ref.dtype)), dev))
        res.module["main"](*targs)
        np.testing.assert_allclose(targs[-1].numpy(), ref, rtol=rtol, atol=atol, err_msg=f"roller {op}")
        found = peers(op, full, arrays, spec.output_shape(full))
        for p in found:  # the peers compute the same thing
            np.testing.assert_allclose(p.to_numpy(p.run()), ref, rtol=rtol, atol=atol, err_msg=f"{p.name} {op}")
        # each peer's column says how it runs (benchutil's note: "1 thread" for numpy's elementwise ops
        # and sums, "OpenBLAS" for its matmul)
        main = res.module["main"]  # looked up once (a lookup per call costs ~1 us)
        impls = [("roller", lambda: main(*targs))] + \
                [(f"{p.name}[{p.note}]" if p.note else p.name, p.run) for p in found]
        med = time_alternately(impls, rounds=args.rounds)
        flops = spec.flops(full)
        nbytes = sum(a.nbytes for a in arrays) + ref.nbytes
        unit = (lambda s: f"{flops / s / 1e9:7.1f} GFLOP/s") if op in ("matmul", "batch_matmul", "conv2d") else \
               (lambda s: f"{nbytes / s / 1e9:7.1f} GB/s   ")
        shape_txt = ",".join(f"{k}={v}" for k, v in shape.items())
        print(f"{op:12s} {shape_txt:44s} " + "  ".join(f"{k} {unit(s)}" for k, s in med.items())
              + "  " + "  ".join(f"roller/{k} {med[k] / med['roller']:.2f}" for k in med if k != "roller"),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
