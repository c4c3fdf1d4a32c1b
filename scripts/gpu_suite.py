"""The suite's operators (scripts/suite.csv) on a GPU spec: the model's prediction for each, and, on a machine
with that NVIDIA GPU, the measured time of the top-k plans (checked against numpy) beside it.

    python3 scripts/gpu_suite.py                        # a100 spec; --device h100, --cases REGEX, --topk 3

Without a GPU it says so, prints the predictions only (nothing is measured) and exits 0. The measuring path
is roller.targets.cuda.profile on TVM's CUDA runtime (the code the tests drive on the OpenCL twin); it has not been
run on a GPU yet (none was reachable where it was written).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from bench_suite import matching_specs  # noqa: E402  (same folder)


def _measure(func, expr, programs, device, runtime, inputs, reference):
    """(seconds, index) of the fastest plan whose output matches ``reference`` on the GPU (roller.targets.cuda.profile:
    the CPU profiling's checks and alternated timing), or (None, None)."""
    from roller.targets.cuda.schedule import schedule_cuda
    from roller.targets.cuda.profile import profile_gpu

    modules = {i: schedule_cuda(func, expr, p, device).mod for i, p in enumerate(programs)}
    timings = profile_gpu(modules, runtime, [str(p.name) for p in func.params], inputs, reference)
    for i, t in timings.items():
        if not t.verified:
            print(f"    plan {i}: {t.error}, not timed", file=sys.stderr)
    timed = [i for i, t in timings.items() if t.verified]
    if not timed:
        return None, None
    best = min(timed, key=lambda i: timings[i].measured_seconds)
    return timings[best].measured_seconds, best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="a100", help="a GPU spec (default a100)")
    ap.add_argument("--cases", default=None, metavar="REGEX", help="only the cases whose name matches")
    ap.add_argument("--topk", type=int, default=3, help="plans built and timed per case on a GPU (default 3)")
    args = ap.parse_args(argv)

    from roller.builder.api import analyze
    from roller.targets import construct
    from roller.device.load import load_device

    device = load_device(args.device)
    if device.kind != "gpu":
        print(f"{args.device} is not a GPU spec", file=sys.stderr)
        return 2
    from roller.targets.cuda.build import default_runtime

    runtime = default_runtime(device)
    present = runtime is not None
    print(f"device spec {device.name} ({device.target.get('arch')}): "
          + ("a GPU is present: the top-k plans are built, checked against numpy and timed" if present else
             "NO GPU on this machine: predictions only, nothing is measured"))
    peak = device.units.peak("float32") * device.units.count * 1e9
    print(f"{'case':<28} {'block tile':<34} {'thr':>4} {'predicted':>10} {'of peak':>7} {'measured':>10} "
          f"{'meas/pred':>9}")
    for case, spec, skipped in matching_specs(args.cases):
        if skipped:
            print(f"{case.name:<28} skipped: {skipped}")
            continue
        expr, func = analyze(spec.make(case.shape, "float32"))
        plans = construct(expr, device, topk=args.topk).programs
        p = plans[0]
        measured = None
        if present:
            inputs = spec.inputs(case.shape, "float32", np.random.default_rng(0))
            measured, _ = _measure(func, expr, plans, device, runtime, inputs, spec.reference(inputs, case.shape))
        block = " ".join(f"{a}={s}" for a, s in p.tiles[1].items())
        ratio = f"{measured / p.predicted_seconds:.2f}" if measured else "-"
        print(f"{case.name:<28} {block[:34]:<34} {p.gpu.threads:>4} {p.predicted_seconds * 1e6:>8.1f}us "
              f"{expr.flops / p.predicted_seconds / peak:>7.0%} "
              f"{(f'{measured * 1e6:.1f}us' if measured else '-'):>10} {ratio:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
