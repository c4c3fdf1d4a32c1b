"""Dumps roller.plan.construct's top-10 plans (RProgram.to_dict) for every case of suite.csv (or --suite) on a CPU device, or
checks that a dump made earlier is byte-identical: the guard that a policy change left the CPU's plans alone.

    python3 scripts/cpu_plans_snapshot.py --write /tmp/cpu_plans.json     # before the change
    python3 scripts/cpu_plans_snapshot.py --check /tmp/cpu_plans.json     # after it: exit 1 on any difference
    python3 scripts/cpu_plans_snapshot.py --check /tmp/cpu_plans.json --ignore-keys balanced,prefetched
                                                                          # fields added since the dump left out

The device is the host (as calibrated) unless --device names a spec; the dump is taken and checked on the
same machine.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench_suite import SUITE, matching_specs  # noqa: E402  (same folder)


def dump(device_name: str, cases: str | None = None, suite: Path = SUITE) -> str:
    from roller.builder import api
    from roller import load_device

    device = load_device(device_name)
    out = {}
    for case, spec, skipped in matching_specs(cases, suite):
        if skipped:
            out[case.name] = f"skipped: {skipped}"
            continue
        func = spec.make(case.shape, "float32")
        cons = api.construct(func, device, topk=10)
        out[case.name] = [p.to_dict() for p in cons.programs]
    return json.dumps(out, indent=1, sort_keys=True, default=str)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", metavar="JSON", help="write the dump here")
    group.add_argument("--check", metavar="JSON", help="compare with the dump written here before")
    ap.add_argument("--device", default="host", help="host (default), a shipped CPU spec or a YAML path")
    ap.add_argument("--cases", metavar="REGEX", help="only the cases whose name matches (a quick check)")
    ap.add_argument("--suite", type=Path, default=SUITE,
                    help="the suite CSV (default scripts/suite.csv; scripts/gemm_suite.csv: issue 32's GEMM shapes)")
    ap.add_argument("--ignore-keys", metavar="KEYS", default="",
                    help="comma-separated plan keys left out of the comparison (fields added since the dump)")
    args = ap.parse_args(argv)
    text = dump(args.device, args.cases, args.suite)
    if args.write:
        Path(args.write).write_text(text)
        print(f"wrote {args.write} ({len(json.loads(text))} cases)")
        return 0
    before = Path(args.check).read_text()
    if before == text:
        print(f"identical: {len(json.loads(text))} cases")
        return 0
    old, new = json.loads(before), json.loads(text)
    ignore = {k for k in args.ignore_keys.split(",") if k}
    if ignore:
        def strip(v):
            return [{k: x for k, x in p.items() if k not in ignore} for p in v] if isinstance(v, list) else v
        old, new = ({c: strip(v) for c, v in d.items()} for d in (old, new))
        if old == new:
            print(f"identical but for {sorted(ignore)}: {len(new)} cases")
            return 0
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    print(f"DIFFERENT in {len(changed)} case(s): {', '.join(changed)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
