"""The software-prefetch probe: whether prefetching a prepacked weight's next top tile pays on this device.

A model's weights arrive packed in the plan's tiles (``roller.plan.prepack``), and code generation can
prefetch the next top tile's block of each while a top tile computes (``roller.targets.cpu.prefetch``). Whether
that pays depends on the core's own prefetchers: it paid on a Sapphire Rapids VM and cost on a Zen 4 one
(docs/cost-constants.md, ``software_prefetch_gain``). The probe builds the constructor's first plan of a GEMM
whose weight is prepacked, with and without the prefetches, and times single calls of the two in turn, each
after a write of twice the last cache has flushed the weight to memory (``roller.measure.cold``), as between
the layers of a model. The figure is the time without over the time with: above 1, prefetching pays.
"""
from __future__ import annotations

import dataclasses
import statistics
import time

import numpy as np

from roller.errors import CalibrationError
from roller.measure.cold import ColdTimer
from roller.measure.verify import TOLERANCE, fill_sentinel, wrong_result

CALLS = 7  # single cold calls a round, of each kernel


def prefetch_probe(device, shape: dict, rounds: int) -> dict:
    """{"value": seconds without / seconds with, "seconds": [[with, without] per round], "shape": shape}: the
    medians of ``CALLS`` cold calls of each kernel a round, over ``rounds`` rounds (the median of the rounds'
    ratios). Both kernels are checked against numpy first; CalibrationError where the plan has no prefetch
    to compare (the spec's figure then stays)."""
    import tvm

    from roller.plan.construct import construct
    from roller.plan.prepack import program_layouts
    from roller.targets.cpu.codegen import schedule
    from roller.tir import ops
    from roller.tir.compile import compile_for, target_for
    from roller.tir.analysis import analyze
    from roller.tir.layout import pack_constant

    spec = ops.OPS["matmul"]
    full = spec.full_shape(shape)
    analysed = analyze(spec.make(full))
    expr, func = analysed.expr, analysed.func
    # the plan as the spec's default (prefetching) would have it, whatever this device's figure says now
    model = dataclasses.replace(device.model, software_prefetch_gain=None)
    plan = construct(expr, dataclasses.replace(device, model=model), topk=1, constants=frozenset({"B"})).programs[0]
    if "B" not in plan.prefetched:
        raise CalibrationError(f"the prefetch probe's GEMM {full} got no prefetch of B in its first plan")
    rng = np.random.default_rng(3)
    arrays = spec.inputs(full, "float32", rng)
    reference = spec.reference(arrays, full)
    layouts = program_layouts(expr, plan, device)
    names = [b.name for b in func.params][:len(arrays)]
    args = [tvm.runtime.tensor(pack_constant(layouts[n], a) if n in layouts else a) for n, a in zip(names, arrays)]
    kernels = []
    for program in (plan, dataclasses.replace(plan, prefetched=())):
        kernel = compile_for(schedule(func, expr, program, device).mod, target_for(device))["main"]
        out = tvm.runtime.tensor(fill_sentinel(np.empty(reference.shape, "float32")))
        kernel(*args, out)
        why = wrong_result(out.numpy(), reference, *TOLERANCE["float32"])
        if why:
            raise CalibrationError(f"the prefetch probe's GEMM computed a {why}")
        kernels.append((kernel, out))
    cold = ColdTimer(time.perf_counter)  # the weight leaves the caches before each call
    seconds = [[statistics.median(cold(lambda: kernel(*args, out), CALLS)) for kernel, out in kernels]
               for _ in range(rounds)]
    ratio = statistics.median(without / with_ for with_, without in seconds)
    return {"value": ratio, "seconds": seconds, "shape": dict(shape)}
