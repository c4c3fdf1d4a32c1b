"""Times a few plans of one operator against each other and PyTorch, tightly alternated in one process.

The tool for "is the model's ranking right here?": it builds the constructed plans you name (by rank),
optionally edited (tile sizes per level, or a layout field), checks each against numpy and times them in
turn with PyTorch (when it imports). On a machine other work is loading, time on one thread
(``TVM_NUM_THREADS=1``; PyTorch is set to the same count) with ``--cpu-time``: each call is measured in
this thread's CPU seconds, so the other work shifts every implementation alike.

    python scripts/compare_plans.py depthwise_conv2d N=1,H=83,W=83,C=42,R=5,S=5,pad=2 0 1 "0:inlined=" \\
        "2:c=16,32,48"
    TVM_NUM_THREADS=1 python scripts/compare_plans.py pool2d N=1,H=83,W=83,C=84,R=3,S=3,pad=1 --options kind=avg \\
        0 "0:inlined=pad_temp" --cpu-time

A plan is ``RANK`` or ``RANK:EDIT;EDIT...``; an edit is ``AXIS=SIZE,SIZE,...`` (one size per memory level,
nearest compute first) or ``FIELD=NAME+NAME`` for ``padded``, ``predicated``, ``packed`` or ``inlined``
(empty: none), or ``storage_pad=NAME:ELEMENTS+...`` (row padding of the copies; empty: none). ``pred`` is the
model's prediction for the plan as edited (its tiles, vector axis, padded axes and inlined stages; the model
derives packing from the tiles itself, so an edited ``packed`` field is not reflected in it).

In a whole model the weights are constants, stored packed in the plan's tiles (``roller.plan.prepack``), and
other work between calls pushes them out of the caches. ``--constants W`` plans and builds as for a model
whose input ``W`` is a constant (the kernel takes it prepacked; the model charges no copy), and ``--cold``
times single calls each after a write of twice the last cache has flushed the caches, the weights then
coming from memory as they do inside a model (median of the calls; with ``--cpu-time`` in thread CPU
time).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

LIST_FIELDS = ("padded", "predicated", "packed", "inlined", "prefetched", "register_transposes")


def edited(program, spec: str):
    """The plan ``program`` with the edits of ``spec`` (see the module docstring) applied."""
    tiles = [dict(t) for t in program.tiles]
    fields = {}
    for item in filter(None, spec.split(";")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"cannot parse the edit {item!r}: write AXIS=SIZE,... or FIELD=NAME+NAME")
        if key in LIST_FIELDS:
            fields[key] = tuple(filter(None, value.split("+")))
            continue
        if key == "storage_pad":
            fields[key] = {n: int(k) for n, _, k in (p.partition(":") for p in filter(None, value.split("+")))}
            continue
        sizes = [int(s) for s in value.split(",")]
        if key not in tiles[0] or len(sizes) != len(tiles):
            raise SystemExit(f"{key}={value}: name an axis of {sorted(tiles[0])} and give {len(tiles)} sizes")
        for level, size in zip(tiles, sizes):
            level[key] = size
    return dataclasses.replace(program, tiles=tuple(tiles), **fields)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("op")
    ap.add_argument("shape", help="K=V,... as for roller build")
    ap.add_argument("plans", nargs="+", help="RANK or RANK:EDIT;EDIT (see the module docstring)")
    ap.add_argument("--options", default="", help="string options, e.g. kind=avg or layout=nt")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--cpu-time", action="store_true", help="measure this thread's CPU time (one thread)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--constants", default="", help="inputs that are constants (prepacked), e.g. W")
    ap.add_argument("--cold", action="store_true",
                    help="flush the caches (twice the last cache written) before each timed call")
    ap.add_argument("--device", default="host", help="host (default), a shipped CPU spec or a YAML path (an AVX2 "
                                                      "spec on an AVX-512 machine builds AVX2 code)")
    args = ap.parse_args()

    import numpy as np
    import roller
    from roller.tir import ops
    from roller.builder.api import analyze
    from roller.plan.cost import estimate
    from roller.tir.compile import set_threads
    from roller.targets import construct

    from bench_suite import parse_pairs
    from benchutil import ColdTimer, checked_plan, peers

    device = roller.load_device(args.device)
    set_threads(device.units.count)
    spec = ops.OPS[args.op].with_options(**parse_pairs(args.options, "--options", False))
    shape = spec.full_shape(parse_pairs(args.shape, "shape", True))
    expr, func = analyze(spec.make(shape))
    constants = frozenset(filter(None, args.constants.split(",")))
    unknown = constants - {t.name for t in expr.inputs}
    if unknown:
        raise SystemExit(f"--constants {','.join(sorted(unknown))}: not inputs of {expr.name} "
                         f"(its inputs: {', '.join(t.name for t in expr.inputs)})")
    ranked = construct(expr, device, topk=max(int(p.split(":")[0]) for p in args.plans) + 1,
                       constants=constants).programs
    arrays = spec.inputs(shape, "float32", np.random.default_rng(1))
    reference = spec.reference(arrays, shape)
    impls = []
    for text in args.plans:
        rank, _, edits = text.partition(":")
        program = edited(ranked[int(rank)], edits)
        t0 = time.perf_counter()
        call = checked_plan(func, expr, program, device, arrays, reference, text)
        pred = estimate(expr, program, device).seconds  # what the (edited) plan says, as given
        print(f"{text}: built in {time.perf_counter() - t0:.1f} s, right; pred {pred * 1e6:.1f} us; "
              + program.describe().replace("\n", " | "))
        impls.append((text, call))
    if not args.no_torch:
        try:
            import torch
            torch.set_num_threads(int(os.environ.get("TVM_NUM_THREADS", device.units.count)))
        except ImportError:
            pass
        impls += [(p.name, p.run) for p in peers(args.op, shape, arrays, reference.shape, spec.option_values)
                  if p.name == "torch"]
    clock = time.thread_time if args.cpu_time else time.perf_counter
    times: dict[str, list[float]] = {name: [] for name, _ in impls}
    if args.cold:
        cold = ColdTimer(clock)
        for _ in range(args.rounds):
            for name, fn in impls:
                times[name] += cold(fn)
    for _ in range(0 if args.cold else args.rounds):
        for name, fn in impls:
            start, calls = clock(), 0
            while clock() - start < 0.02:  # warm-up, and the number of calls for ~20 ms
                fn()
                calls += 1
            start = clock()
            for _ in range(calls):
                fn()
            times[name].append((clock() - start) / calls)
    for name, values in times.items():
        print(f"{name:40s} {statistics.median(values) * 1e6:10.1f} us")


if __name__ == "__main__":
    main()
