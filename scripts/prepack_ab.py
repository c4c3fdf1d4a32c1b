"""Constant weights packed once (roller.plan.prepack) against packed at every call, on one thread, per function.

    PYTHONPATH=$PWD:/path/to/torch python3 scripts/prepack_ab.py --model resnet50

Compiles the model twice in this process (``compile_model(prepack=True)`` and ``prepack=False``, the same
plans otherwise unless the model's ranking changed; the report says which functions differ), then times
in this thread's CPU time, the two alternating: every function that takes a constant packed, alone with
its arguments in the caches ("hot") and after a write of twice the last cache flushed them ("cold": a
weight read from memory, as in a whole model too large for the caches), and the whole model. Medians of
``--rounds``.
With ``--prefetch`` both builds prepack, and they differ in the prefetch of each prepacked weight's next
top-tile block (``roller.targets.cpu.prefetch``): with it / without it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "1")  # before TVM's thread pool starts
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from benchutil import ColdTimer, cpu_seconds, models  # noqa: E402
from model_breakdown import roller_functions  # noqa: E402

def cold_seconds(fn, cold: ColdTimer, calls: int = 15) -> float:
    """Median thread CPU seconds of ``fn`` called on cold caches."""
    return statistics.median(cold(fn, calls))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet50", help="one of: " + ", ".join(models()))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prefetch", action="store_true",
                   help="compare prepacked kernels with and without the prefetch of the next top tile's weights "
                        "(roller.targets.cpu.prefetch) instead")
    args = p.parse_args(argv)
    import contextlib

    import roller
    from benchutil import plans_with

    dev = roller.load_device()
    proto = models()[args.model]()
    cms = {}
    for k in (True, False):
        # the B side of --prefetch: the same plans with no prefetched input (RProgram.prefetched)
        with plans_with(prefetched=()) if args.prefetch and not k else contextlib.nullcontext():
            cms[k] = roller.compile_model(proto, dev, name=args.model, cache=False, prepack=k or args.prefetch)
    funcs = {k: dict((f["name"], (f, call)) for f, call in zip(*roller_functions(cm))) for k, cm in cms.items()}
    reports = {k: {r.name: r for r in cm.report} for k, cm in cms.items()}
    cold_timer = ColdTimer(time.thread_time)
    what = "prefetched / not" if args.prefetch else "prepacked / packed per call"
    print(f"{args.model}, 1 thread, thread CPU time, medians of {args.rounds} rounds (us): {what}")
    sums = {"hot": [0.0, 0.0], "cold": [0.0, 0.0]}
    for name, (f, call) in funcs[True].items():
        if not reports[True].get(name) or not reports[True][name].prepacked:
            continue
        other = funcs[False][name][1]
        hot = [[], []]
        cold = [[], []]
        for _ in range(args.rounds):
            for i, fn in enumerate((call, other)):
                hot[i].append(cpu_seconds(fn, 0.05))
                cold[i].append(cold_seconds(fn, cold_timer))
        h, c = [statistics.median(x) for x in hot], [statistics.median(x) for x in cold]
        same = all(reports[True][name].plan.get(k) == reports[False][name].plan.get(k) for k in ("tiles", "vector_axis"))
        for key, v in (("hot", h), ("cold", c)):
            sums[key][0] += v[0] * f["calls"]
            sums[key][1] += v[1] * f["calls"]
        print(f"{name:45s} x{f['calls']}{'' if same else ' (other plan)'}: hot {h[0] * 1e6:8.1f} / {h[1] * 1e6:8.1f}"
              f"  cold {c[0] * 1e6:8.1f} / {c[1] * 1e6:8.1f}")
    for key, (a, b) in sums.items():
        print(f"sum over calls, {key}: {a * 1e3:.2f} / {b * 1e3:.2f} ms")
    feeds = cms[True].random_inputs()
    runs = [cms[True].run_fn(feeds), cms[False].run_fn(feeds)]
    whole = [[], []]
    for _ in range(args.rounds):
        for i, fn in enumerate(runs):
            time.sleep(0.1)
            whole[i].append(cpu_seconds(fn, 0.3))
    a, b = (statistics.median(x) for x in whole)
    print(f"whole model: {a * 1e3:.2f} / {b * 1e3:.2f} ms; load {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
