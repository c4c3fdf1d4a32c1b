"""Times the first plans of two plan snapshots against each other: the check that a policy change which
moved a first plan made it faster, not just different.

    python3 scripts/cpu_plans_snapshot.py --write /tmp/before.json    # before the change
    python3 scripts/cpu_plans_snapshot.py --write /tmp/after.json     # after it
    python3 scripts/ab_first_plans.py /tmp/before.json /tmp/after.json            # every case that moved
    python3 scripts/ab_first_plans.py /tmp/before.json /tmp/after.json rx50_gconv3x3_56_g32 --rounds 11

For each case (those named, else every suite case whose first plan differs between the two snapshots)
both plans are built in this process and checked against numpy, then timed in turn for ``--rounds``
rounds (``roller.measure.timing.time_rounds``). It prints both medians, both predictions and the median of the
rounds' old/new ratios (``roller.measure.timing.paired_ratio``: > 1, the new plan is faster), which cancels the
machine's speed moving between rounds, as medians taken apart do not. Plans are compared whole (tiles,
layout, padding); the snapshots' predicted and measured figures are left out of the comparison.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from bench_suite import SUITE, case_spec, Skip, load_cases  # noqa: E402  (same folder)

# fields of RProgram.to_dict that describe the model's figures, not the plan
FIGURES = ("predicted_seconds", "compute_seconds", "memory_seconds", "traffic_bytes", "footprint_bytes",
           "epsilon")


def plan_key(plan: dict) -> str:
    """The plan's choices as one string, every field at its default where the snapshot has none (a snapshot
    written before RProgram gained a field compares equal to one written after, where the plan did not use it)."""
    from roller.plan.rprogram import RProgram

    full = RProgram.from_dict(plan).to_dict()
    return json.dumps({k: v for k, v in full.items() if k not in FIGURES}, sort_keys=True)


def moved(before: dict, after: dict) -> list[str]:
    """The cases whose first plan differs between the snapshots (skipped cases left out)."""
    return [name for name in before if isinstance(before[name], list) and isinstance(after.get(name), list)
            and plan_key(before[name][0]) != plan_key(after[name][0])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", help="snapshot written before the change (cpu_plans_snapshot.py --write)")
    ap.add_argument("after", help="snapshot written after it")
    ap.add_argument("cases", nargs="*", help="suite cases to time (default: every case whose first plan moved)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--suite", type=Path, default=SUITE,
                    help="the suite CSV both snapshots were taken of (cpu_plans_snapshot.py --suite)")
    ap.add_argument("--device", default="host",
                    help="the device both snapshots were taken for (cpu_plans_snapshot.py --device): host, a shipped "
                         "CPU spec or a YAML path")
    args = ap.parse_args(argv)

    import numpy as np

    import roller
    from roller.builder import api
    from roller.plan.rprogram import RProgram
    from roller.measure.timing import paired_ratio, time_rounds
    from roller.tir.compile import set_threads

    from benchutil import checked_plan

    with open(args.before) as f:
        before = json.load(f)
    with open(args.after) as f:
        after = json.load(f)
    names = args.cases or moved(before, after)
    cases = {c.name: c for c in load_cases(args.suite)}
    unknown = [n for n in names if n not in cases or not isinstance(before.get(n), list)
               or not isinstance(after.get(n), list)]
    if unknown:
        raise SystemExit(f"not a case of both snapshots: {', '.join(unknown)}")
    if not names:
        print("no first plan moved")
        return 0
    device = roller.load_device(args.device)
    set_threads(device.units.count)
    for name in names:
        case = cases[name]
        try:
            spec = case_spec(case)
        except Skip as e:
            print(f"{name}: skipped ({e})")
            continue
        expr, func = api.analyze(spec.make(case.shape, "float32"))
        arrays = spec.inputs(case.shape, "float32", np.random.default_rng(1))
        reference = spec.reference(arrays, case.shape)
        impls, predicted = [], {}
        for label, snapshot in (("old", before), ("new", after)):
            plan = RProgram.from_dict(snapshot[name][0])
            impls.append((label, checked_plan(func, expr, plan, device, arrays, reference, f"{name} {label}")))
            predicted[label] = plan.predicted_seconds
        times = time_rounds(impls, rounds=args.rounds)
        med = {label: statistics.median(v) for label, v in times.items()}
        print(f"{name}: old {med['old'] * 1e6:.1f} us (predicted {predicted['old'] * 1e6:.1f}), "
              f"new {med['new'] * 1e6:.1f} us (predicted {predicted['new'] * 1e6:.1f}), "
              f"old/new paired {paired_ratio(times['old'], times['new']):.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
