"""roller against PyTorch (oneDNN / MKL) and numpy on every named operator, in one run.

For each operator and shape: roller builds its kernel exactly as ``roller build`` does (construction,
top-10 profile, numpy check), then roller's kernel, PyTorch and numpy are timed alternately in this one
process on the same inputs (medians of several rounds), and the ratios are printed. PyTorch runs with
torch.set_num_threads(cores) and conv2d in channels_last (NHWC) memory format; numpy is single-threaded
for everything but matmul (OpenBLAS). OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are left as they are here:
use scripts/bench_matmul.py for the numpy GEMM comparison with those unset.

    python scripts/bench_ops.py [--rounds 5] [--ops matmul,conv2d,...]

PyTorch is not a dependency of roller; without it the PyTorch column is skipped. Uninstall it after
benchmarking: with torch installed, `import tvm` imports it too (about 2.5 s more), which shows in every
`roller build`'s wall time.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from benchutil import peers, time_alternately

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
    args = ap.parse_args(argv)

    import tvm

    import roller
    from roller import ops
    from roller.device import load_device

    device = load_device()
    try:
        import torch
        torch.set_num_threads(device.units.count)
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads", file=sys.stderr)
    except ImportError:
        print("torch not installed: PyTorch column skipped", file=sys.stderr)
    wanted = set(args.ops.split(",")) if args.ops else None
    for op, shape in CASES:
        if wanted and op not in wanted:
            continue
        spec = ops.OPS[op]
        full = ops.validate_shape(op, shape, "float32")
        res = roller.build_op(op, full, device=device)
        arrays = spec.inputs(full, "float32", np.random.default_rng(1))
        dev = tvm.cpu()
        targs = [tvm.runtime.tensor(a, dev) for a in arrays]
        targs.append(tvm.runtime.empty(spec.output_shape(full), "float32", dev))
        res.module["main"](*targs)
        np.testing.assert_allclose(targs[-1].numpy(), spec.reference(arrays, full), rtol=1e-4, atol=1e-4)
        found = peers(op, full, arrays, spec.output_shape(full))
        impls = [("roller", lambda: res.module["main"](*targs))] + [(p.name, p.run) for p in found]
        med = time_alternately(impls, rounds=args.rounds)
        flops = spec.flops(full)
        nbytes = sum(a.nbytes for a in arrays) + targs[-1].numpy().nbytes
        unit = (lambda s: f"{flops / s / 1e9:7.1f} GFLOP/s") if op in ("matmul", "batch_matmul", "conv2d") else \
               (lambda s: f"{nbytes / s / 1e9:7.1f} GB/s   ")
        shape_txt = ",".join(f"{k}={v}" for k, v in shape.items())
        print(f"{op:12s} {shape_txt:44s} " + "  ".join(f"{k} {unit(s)}" for k, s in med.items())
              + "  " + "  ".join(f"roller/{k} {med[k] / med['roller']:.2f}" for k in med if k != "roller"),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
