"""What profiling that trusts the model buys and costs on the suite: each case built the way `roller build` does
without --topk (the top-10 plans predicted within the device's profiling margin of the first, from its last
`roller fidelity`) and with --topk 10 forced, neither from the kernel cache.

    python3 scripts/profile_margin_ab.py [--cases REGEX] [--rounds 7] [--device host] [--margin M]

Per case: plans profiled and build seconds both ways, and where the two builds chose different plans, both
kernels (checked against numpy) timed in turn for --rounds rounds; the median of the rounds' top-10 / margin
ratios (``roller.measure.timing.paired_ratio``: < 1, the top-10 build's kernel is faster). ``--margin`` sets the
margin instead of the device's record (a what-if; the record is left as it is). Summary: median plans, median
and largest build seconds both ways, cases that chose alike, the geomean of the ratios over all cases (1 where
alike).
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

from bench_suite import matching_specs  # noqa: E402  (same folder)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", metavar="REGEX", help="only the suite cases whose name matches")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--device", default="host", help="host (default), a shipped CPU spec or a YAML path")
    ap.add_argument("--margin", type=float, default=None,
                    help="use this profiling margin instead of the device's fidelity record's")
    args = ap.parse_args(argv)

    import numpy as np

    import roller
    from roller.builder import api
    from roller.measure.timing import paired_ratio, time_rounds
    from roller.tir.compile import set_threads

    from benchutil import checked_plan

    from roller.builder.farm import warm_up

    device = roller.load_device(args.device)
    set_threads(device.units.count)
    warm_up()  # the build server starts before the first case: neither way pays for it
    margin = args.margin
    if margin is None:
        _, margin = api.profiled_plans(None, device)
    if margin is None:
        print(f"no roller fidelity record speaks for {device.name} as it runs now (run `roller fidelity`, or pass "
              f"--margin): a build without --topk profiles all {api.AUTO_TOPK} plans, as --topk 10 does")
        return 2
    print(f"device {device.name} ({'calibrated' if device.calibrated else 'datasheet figures'}), profiling margin "
          f"{margin:.1%}; {device.units.count} threads", flush=True)
    rows = []
    for case, spec, skipped in matching_specs(args.cases):
        if skipped:
            print(f"{case.name}: skipped ({skipped})")
            continue
        func = spec.make(case.shape, "float32")
        expr, norm = api.analyze(func)
        arrays = spec.inputs(case.shape, "float32", np.random.default_rng(1))
        reference = spec.reference(arrays, case.shape)
        built = {}
        ways = [("margin", margin), ("top-10", None)]
        for label, cut in ways if len(rows) % 2 == 0 else ways[::-1]:  # each way first in every other case
            t0 = time.perf_counter()
            res = api._build_uncached(norm, expr, device, api.AUTO_TOPK, True, arrays, reference, False, None, {},
                                      t0, margin=cut)
            built[label] = (res.program, len(res.report["candidates"]), time.perf_counter() - t0)
            res.close()
        (pm, nm, sm), (pk, nk, sk) = built["margin"], built["top-10"]
        ratio = 1.0
        if pm.key != pk.key:
            impls = [(label, checked_plan(norm, expr, prog, device, arrays, reference, f"{case.name} {label}"))
                     for label, prog in (("top-10", pk), ("margin", pm))]
            times = time_rounds(impls, rounds=args.rounds)
            ratio = paired_ratio(times["top-10"], times["margin"])
        rows.append((nm, sm, sk, pm.key == pk.key, ratio))
        print(f"{case.name}: margin {nm} plan{'s' if nm > 1 else ''} in {sm:.1f} s, top-10 in {sk:.1f} s, "
              + ("same plan" if pm.key == pk.key else f"top-10/margin paired {ratio:.3f}"), flush=True)
    if rows:
        print(f"{len(rows)} cases: plans profiled median {statistics.median(r[0] for r in rows):g} (top-10: "
              f"{api.AUTO_TOPK}); build seconds median {statistics.median(r[1] for r in rows):.1f} / largest "
              f"{max(r[1] for r in rows):.1f} with the margin, {statistics.median(r[2] for r in rows):.1f} / "
              f"{max(r[2] for r in rows):.1f} top-10; same plan on {sum(r[3] for r in rows)}; kernel time top-10 / "
              f"margin geomean {math.exp(statistics.fmean(math.log(r[4]) for r in rows)):.3f}, worst "
              f"{min(r[4] for r in rows):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
