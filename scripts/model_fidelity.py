"""How well does the micro model rank kernels? Predicted vs measured time over varied candidates.

For each shape (compute-bound GEMMs and convolutions, and irregular / memory-bound ones: odd channel
counts, a strided convolution, a matrix-vector product, row sums, an elementwise op), the candidates are
the constructor's top-K plus random valid plans (aligned, nested, fitting every level:
``roller.plan.construct.sample_programs``), so that good and bad kernels are both present. Every candidate is
built in worker processes and checked against numpy (``roller.builder.farm.profile`` without timing); the
verified ones are built again here and every one of them is timed the same way: ``--rounds`` rounds
over all candidates in turn, each a median of ``roller.builder.farm.REPEATS`` repeats, on the same buffers,
and the median over rounds is the candidate's time. Printed per shape and pooled: Spearman's rank
correlation between predicted and measured time, and how far the model's first choice is from the
measured best. The model's first choice is taken among *all* candidates (the model's own order:
prediction, then its tie-break); when it fails to build or verify, the shape counts as a miss.

    python scripts/model_fidelity.py [--device host] [--samples 30] [--topk 10] [--rounds 3]
                                     [--quick] [--shapes SUBSTRING ...] [--list]

``--quick`` runs four shapes (two compute-bound, two memory-bound / irregular) with 10 random plans each;
``--shapes`` keeps the shapes whose label (as ``--list`` prints it, e.g. ``add_relu:M=100,N=3001``)
contains any of the given substrings. The device's calibration (``roller calibrate``) is used when
present; the output says which figures fed the model. Kernels run with TVM_NUM_THREADS = the device's
cores.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

SHAPES = [
    ("matmul", {"M": 256, "N": 256, "K": 256}),
    ("matmul", {"M": 512, "N": 512, "K": 512}),
    ("matmul", {"M": 1024, "N": 1024, "K": 1024}),
    ("matmul", {"M": 384, "N": 768, "K": 512}),
    ("matmul", {"M": 1000, "N": 1000, "K": 1000}),
    ("conv2d", {"N": 1, "H": 56, "W": 56, "C": 64, "K": 64, "R": 3, "S": 3, "pad": 1}),
    ("conv2d", {"N": 1, "H": 28, "W": 28, "C": 128, "K": 128, "R": 3, "S": 3, "pad": 1}),
    ("conv2d", {"N": 1, "H": 14, "W": 14, "C": 256, "K": 256, "R": 3, "S": 3, "pad": 1}),
    # irregular and memory-bound
    ("conv2d", {"N": 1, "H": 71, "W": 71, "C": 36, "K": 36, "R": 1, "S": 1}),
    ("conv2d", {"N": 1, "H": 57, "W": 57, "C": 64, "K": 64, "R": 3, "S": 3, "stride": 2}),
    ("batch_matmul", {"B": 8, "M": 256, "N": 64, "K": 256}),
    ("add_relu", {"M": 100, "N": 3001}),
    ("matmul", {"M": 1, "N": 1000, "K": 1280}),
    ("reduce_sum", {"M": 4096, "N": 7}),
    ("reduce_sum", {"M": 4096, "N": 4096}),
]
QUICK = [SHAPES[1], SHAPES[8], SHAPES[11], SHAPES[13]]
QUICK_SAMPLES = 10
ROUNDS = 5  # alternate re-timings of the model's first plan and the measured best


def label(op: str, shape: dict) -> str:
    return f"{op}:" + ",".join(f"{k}={v}" for k, v in shape.items())


def ranks(x: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing their average rank."""
    order = np.argsort(x, kind="mergesort")
    r = np.empty(len(x))
    sx = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sx[j + 1] == sx[i]:
            j += 1
        r[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(x, y) -> float:
    rx, ry = ranks(np.asarray(x, float)), ranks(np.asarray(y, float))
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def fresh_output(ref: np.ndarray):
    """A TVM output buffer filled with the profiler's sentinel (NaN / the integer minimum), so that an
    element a kernel does not write fails the check."""
    import tvm

    from roller.measure.verify import fill_sentinel

    return tvm.runtime.tensor(fill_sentinel(np.empty(ref.shape, ref.dtype)), tvm.cpu())


def check(mod, args, ref: np.ndarray) -> None:
    from roller.measure.verify import TOLERANCE, fill_sentinel

    args[-1].copyfrom(fill_sentinel(np.empty(ref.shape, ref.dtype)))
    mod["main"](*args)
    rtol, atol = TOLERANCE.get(str(ref.dtype), (0.0, 0.0))
    np.testing.assert_allclose(args[-1].numpy(), ref, rtol=rtol, atol=atol)


def time_all(mods: dict, args, rounds: int) -> dict[int, float]:
    """Seconds per call of every module, all timed the same way: ``rounds`` rounds over the modules in
    turn (so drift hits all alike), each a median of REPEATS repeats; the median over rounds."""
    import tvm

    from roller.measure.finalists import REPEATS
    from roller.builder.farm import time_module

    dev = tvm.cpu()
    times: dict[int, list[float]] = {i: [] for i in mods}
    for _ in range(rounds):
        for i, mod in mods.items():
            times[i].append(time_module(mod, dev, args, repeats=REPEATS))
    return {i: float(np.median(t)) for i, t in times.items()}


def confirm(first, best, args, ref, rounds: int = ROUNDS) -> float:
    """Median time of the model's first plan over that of the measured best, the pair timed alternately
    ``rounds`` more times: the best of many noisy timings is biased low (the fastest of many draws), so
    the pair is re-measured on equal terms before it is compared."""
    t = time_all({0: first, 1: best}, args, rounds)
    return t[0] / t[1]


def study(op: str, shape: dict, device, samples: int, topk: int, rounds: int) -> dict:
    import tvm

    from roller.tir import ops
    from roller.builder.api import analyze
    from roller.targets import build
    from roller.targets import construct
    from roller.plan.construct import sample_programs
    from roller.errors import BuildError
    from roller.plan.cost import rank
    from roller.builder.farm import profile

    spec = ops.OPS[op]
    full = ops.validate_shape(op, shape, "float32")
    func = spec.make(full, "float32")
    expr, norm = analyze(func)
    cons = construct(expr, device, topk)
    cands = list(cons.programs)
    keys = {p.key for p in cands}
    for p in sample_programs(expr, device, samples + topk, seed=1, epsilon=cons.epsilon):
        if p.key not in keys and len(cands) < samples + topk:
            keys.add(p.key)
            cands.append(p)
    # the model's first choice among all candidates, built or not
    first = rank(list(range(len(cands))), lambda i: cands[i].predicted_seconds, lambda i: cands[i].memory_seconds)[0]
    inputs = spec.inputs(full, "float32", np.random.default_rng(0))
    ref = spec.reference(inputs, full)
    # build and verify every candidate in worker processes (a TVM crash fails one candidate only)
    try:
        prof = profile(norm, expr, cands, device, inputs, ref, progress=sys.stderr.isatty(), time_kernels=False)
        errors = {i: c.error for i, c in enumerate(prof.candidates) if not c.verified}
        prof.cleanup()
    except BuildError as e:  # none verified
        errors = {i: str(e) for i in range(len(cands))}
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in inputs] + [fresh_output(ref)]
    mods = {}
    for i, prog in enumerate(cands):
        if i in errors:
            continue
        mods[i] = build(norm, expr, prog, device).mod
        check(mods[i], args, ref)
    meas = time_all(mods, args, rounds)
    timed = sorted(meas)
    pred = [cands[i].predicted_seconds for i in timed]
    ibest = min(meas, key=meas.get) if meas else None
    best = meas[ibest] if meas else math.nan
    if first in errors:
        top1 = confirmed = math.inf  # the model's first plan did not build or verify: a miss
    elif first == ibest:
        top1 = confirmed = 1.0
    else:
        top1 = meas[first] / best
        confirmed = confirm(mods[first], mods[ibest], args, ref)
    return {
        "op": op, "shape": full, "candidates": len(cands), "measured": len(meas), "failed": len(errors),
        "spearman": spearman(pred, [meas[i] for i in timed]) if len(timed) >= 3 else math.nan,
        "model_top1_over_best": top1, "confirmed_top1_over_best": confirmed,
        "model_first_error": errors.get(first),
        "best_gflops": spec.flops(full) / best / 1e9, "pred": pred, "meas": [meas[i] for i in timed],
        "model_first": cands[first], "measured_best": cands[ibest] if ibest is not None else None,
        "progs": [cands[i] for i in timed],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--samples", type=int, default=None,
                    help=f"random plans per shape on top of the top-K (default 30; {QUICK_SAMPLES} with --quick)")
    ap.add_argument("--topk", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds over all candidates (median)")
    ap.add_argument("--quick", action="store_true", help=f"{len(QUICK)} shapes, fewer random plans")
    ap.add_argument("--shapes", nargs="+", metavar="SUBSTRING",
                    help="only the shapes whose label contains one of these (see --list)")
    ap.add_argument("--list", action="store_true", help="print the shapes' labels and exit")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--verbose", action="store_true", help="print the model's first plan and the measured best")
    ap.add_argument("--dump", metavar="FILE", help="write every candidate (plan, predicted, measured) as JSON")
    args = ap.parse_args(argv)

    shapes = QUICK if args.quick else SHAPES
    if args.shapes:
        shapes = [(op, s) for op, s in shapes if any(sub in label(op, s) for sub in args.shapes)]
    if args.list:
        for op, s in shapes:
            print(label(op, s))
        return 0
    if not shapes:
        print(f"no shape matches {args.shapes}; --list shows the labels", file=sys.stderr)
        return 2
    samples = args.samples if args.samples is not None else (QUICK_SAMPLES if args.quick else 30)

    from roller.device.load import load_device
    from roller.tir.compile import set_threads

    device = load_device(args.device)
    set_threads(device.units.count)
    print(f"device {device.name}: {'calibrated' if device.calibrated else 'DATASHEET figures (run roller calibrate)'}; "
          f"{device.units.count} threads; every candidate timed {args.rounds} rounds x median of repeats",
          file=sys.stderr)
    t0 = time.perf_counter()
    results = []
    for op, shape in shapes:
        r = study(op, shape, device, samples, args.topk, args.rounds)
        results.append(r)
        top1 = ("FAILED" if math.isinf(r["model_top1_over_best"]) else f"{r['model_top1_over_best']:.2f}")
        conf = ("miss" if math.isinf(r["confirmed_top1_over_best"]) else f"{r['confirmed_top1_over_best']:.2f}")
        print(f"{op:12s} {','.join(f'{k}={v}' for k, v in r['shape'].items()):58s} n={r['measured']:3d} "
              f"failed={r['failed']:2d} spearman={r['spearman']:.2f} model-top1/best={top1} "
              f"(re-timed pair {conf}) best={r['best_gflops']:.1f} GFLOP/s", flush=True)
        if r["model_first_error"]:
            print(f"    the model's first plan failed: {r['model_first_error'][:300]}")
        if args.verbose:
            for key in ("model_first", "measured_best"):
                p = r[key]
                if p is not None:
                    print(f"    {key}: predicted {p.predicted_seconds * 1e3:.3f} ms, packed {list(p.packed)}: "
                          + p.describe().replace("\n", " | "))
            order = sorted(range(len(r["meas"])), key=lambda i: r["meas"][i])
            print("    measured ms (fastest first) / predicted ms: "
                  + " ".join(f"{r['meas'][i] * 1e3:.3f}/{r['pred'][i] * 1e3:.3f}" for i in order))
    within = sum(r["model_top1_over_best"] <= 1.15 for r in results)
    within_confirmed = sum(r["confirmed_top1_over_best"] <= 1.15 for r in results)
    rhos = [r["spearman"] for r in results if not math.isnan(r["spearman"])]
    pooled = float(np.mean(rhos)) if rhos else math.nan
    print(f"mean Spearman {pooled:.2f} over {len(rhos)} shapes (target >= 0.7); model's top-1 within 15% of the "
          f"measured best on {within}/{len(results)} shapes in the timing pass, {within_confirmed}/{len(results)} "
          f"with the pair re-timed {ROUNDS}x alternately (target >= 80%; a first plan that fails counts as a miss); "
          f"{time.perf_counter() - t0:.0f} s")
    if args.dump:
        with open(args.dump, "w") as f:
            json.dump([{"op": r["op"], "shape": r["shape"], "model_first": r["model_first"].to_dict(),
                        "model_first_error": r["model_first_error"],
                        "candidates": [{"program": p.to_dict(), "predicted": pr, "measured": m}
                                       for p, pr, m in zip(r["progs"], r["pred"], r["meas"])]}
                       for r in results], f)
    if args.json:
        drop = ("pred", "meas", "model_first", "measured_best", "progs")
        print(json.dumps([{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                           for k, v in r.items() if k not in drop} for r in results]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
