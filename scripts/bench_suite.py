"""The cliff benchmark suite: roller against numpy and PyTorch on ~60 real layer shapes, one run.

The cases (scripts/suite.csv) are layers of ResNet-50, MobileNetV2, NASNet/Inception-style networks
(odd channel counts, 83x83 / 165x165 maps), BERT-base, ViT-B/16, GPT-2 decode GEMVs, classifier heads,
prime and narrow sizes, and the cliff cases of issue 6: shapes where a compiler that is fast on
1024^3 can fall off a cliff. For each case, in this one process and on the same inputs:

- roller top-1: ``build_op(..., profile=False)``, the model's first plan, built and verified;
- roller top-10: ``build_op(..., topk=10)``, what ``roller build`` does (top-3 with ``--quick``);
- numpy (matmul, batch_matmul, reduce_sum, add_relu; ``out=`` preallocated; numpy's elementwise ops
  and sums run on ONE thread, only its matmul (OpenBLAS) is threaded);
- PyTorch (every operator; conv / depthwise / pooling on channels_last tensors; ``out=`` where the
  function has it; ``torch.set_num_threads(device cores)``); optional: without torch, numpy only.

They are timed alternately (several rounds: every implementation sees the same drift of a shared
machine), and each ratio is the median of the rounds' ratios: on a VM whose speed moves by up to 1.6x
within seconds (presumably other tenants of the host) two medians may come from rounds of different
speeds. The top-1 / top-10 ratio comes from the two kernels alone, back to back in short batches. Both
roller kernels are verified by the build and their outputs re-checked here against the numpy reference;
a peer whose output differs from the reference is reported, not compared.

Per case: times, ratio = best peer time / roller top-10 time (> 1: roller is faster), top-1 / top-10
time, GFLOP/s and, for memory-bound cases (arithmetic intensity over all tensors below the device's
balance), GB/s against the calibrated bandwidth of where the data lives between calls (the L2s, the
shared level, or a mix of the two near the L2s' capacity: ``roller.plan.cost.source_bandwidth``). At the end
a Markdown table, a CSV (``--out DIR``) and one summary line:
cases, verified, worst ratio, geomean ratio, share >= 0.9x, median and max build seconds, top-1/top-10
(median, and cases within 10%), memory-bound cases at >= 80% of their level's bandwidth, measured/model,
and the machine's speed during the run (``benchutil.SpeedProbe``: the calibration's peak kernel timed
before each case, as a share of the calibrated peak; the model's predictions assume 100%).

    python scripts/bench_suite.py [--cases REGEX] [--quick] [--out DIR] [--no-torch] [--suite CSV] [--device SPEC]

numpy's GEMM: OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (this machine sets CORETYPE=Haswell) pin OpenBLAS to
a slower kernel and are read when numpy loads, so the script re-executes itself once without them
(``--keep-openblas-env`` keeps them) and prints which OpenBLAS kernel ran. Operators or options roller
does not have yet are reported as skipped. PyTorch is not a dependency of roller (``pip install
-e ".[bench]"``); uninstall it after benchmarking: while it is installed every ``import tvm`` imports it
too, ~2.5 s more per ``roller build``. The whole suite takes ~15-20 minutes on 2 cores.
"""
from __future__ import annotations

import os
import sys

REEXEC_MARK = "ROLLER_BENCH_SUITE_UNSET"  # set in the re-executed process: what was unset
OPENBLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")  # pin OpenBLAS's kernel; read when numpy loads


def _reexec_without_openblas_overrides() -> None:
    """Runs this script again without the OpenBLAS kernel overrides; they must be gone before numpy
    loads, and only this process (not the caller's shell) should lose them."""
    if REEXEC_MARK in os.environ or "--keep-openblas-env" in sys.argv:
        return
    found = [f"{v}={os.environ[v]}" for v in OPENBLAS_OVERRIDES if v in os.environ]
    if not found:
        return
    env = {k: v for k, v in os.environ.items() if k not in OPENBLAS_OVERRIDES}
    env[REEXEC_MARK] = " ".join(found)
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]], env)


if __name__ == "__main__" and "numpy" not in sys.modules:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    _reexec_without_openblas_overrides()

import argparse  # noqa: E402
import csv  # noqa: E402
import itertools  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

import numpy as np  # noqa: E402

from benchutil import SpeedProbe, openblas_info, peers  # noqa: E402
from roller.measure.timing import SETTLE_SECONDS, paired_ratio, time_rounds  # noqa: E402

SUITE = Path(__file__).with_name("suite.csv")
BUSY_LOAD = 1.0  # 1-minute load average above which the machine is not ours alone (warned in the report)
FAR = 0.9  # the summary's share of cases where roller is at least this fast relative to the best peer
TOP1_WITHIN = 0.10  # ... of cases whose top-1 (no profiling) is within this of the top-K
PAIRED_ROUNDS = 9  # rounds of the tight top-1 / top-K alternation
BANDWIDTH_SHARE = 0.8  # ... of memory-bound cases at this share of their data level's calibrated bandwidth


@dataclass(frozen=True)
class Case:
    """One line of suite.csv: integer shape keys (incl. stride/pad/groups) and string options."""

    name: str
    op: str
    shape: dict
    options: dict
    network: str

    @property
    def shape_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.shape.items())

    @property
    def options_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.options.items())


def parse_pairs(text: str, where: str, integer: bool) -> dict:
    """``K=V,K=V`` as a dict (values as ints with ``integer``); exits naming ``where`` on a bad pair."""
    out = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = (s.strip() for s in item.partition("="))
        if not sep or not key or not value:
            raise SystemExit(f"{where}: cannot parse {item!r}: write KEY=VALUE pairs separated by commas")
        if integer:
            try:
                value = int(value)
            except ValueError:
                raise SystemExit(f"{where}: {key}={value!r} is not an integer") from None
        out[key] = value
    return out


def load_cases(path: Path) -> list[Case]:
    """The cases of a suite CSV (lines starting with # are comments); exits naming the line on errors."""
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    reader = csv.DictReader(lines)
    need = {"case", "op", "shape", "options", "network"}
    if not need <= set(reader.fieldnames or ()):
        raise SystemExit(f"{path}: the header must name the columns {', '.join(sorted(need))}")
    cases, seen = [], set()
    for i, row in enumerate(reader, start=2):
        where = f"{path}: case line {i} ({row['case']})"
        if row["case"] in seen:
            raise SystemExit(f"{where}: the case name is used twice")
        seen.add(row["case"])
        cases.append(Case(row["case"], row["op"].strip(), parse_pairs(row["shape"], where, True),
                          parse_pairs(row["options"] or "", where, False), (row["network"] or "").strip()))
    return cases


class Skip(Exception):
    """The case uses an operator or option roller does not have (yet)."""


def case_spec(case: Case):
    """The OpSpec of the case with its options set; Skip when roller lacks the operator or option."""
    from roller.tir import ops
    from roller.errors import InvalidShapeError

    spec = ops.OPS.get(case.op)
    if spec is None:
        raise Skip(f"unknown operator {case.op}")
    try:
        spec = spec.with_options(**case.options)
    except InvalidShapeError as e:
        raise Skip(f"unknown option: {e}") from None
    try:
        ops.validate_shape(spec, case.shape)
    except InvalidShapeError as e:
        if "unknown shape key" in str(e):
            raise Skip(f"unknown option: {e}") from None
        raise
    return spec


def matching_specs(pattern: str | None, path: Path = SUITE):
    """(case, its OpSpec or None, why it is skipped or None) for every case of the suite CSV at ``path`` whose name
    matches the regular expression ``pattern`` (all where None): the loop the plan scripts share."""
    for case in load_cases(path):
        if pattern and not re.search(pattern, case.name):
            continue
        try:
            yield case, case_spec(case), None
        except Skip as e:
            yield case, None, str(e)


def _build(case: Case, device, **kwargs):
    """roller.build_op for the case, its options passed through."""
    import roller

    # no kernel cache: the suite reports build seconds
    return roller.build_op(case.op, case.shape, "float32", device, cache=False, **kwargs, **case.options)


@dataclass
class Row:
    """One case's results (seconds; None where not measured)."""

    case: Case
    status: str = "ok"
    verified: bool = False
    top1: float | None = None
    topk: float | None = None
    peers: dict = field(default_factory=dict)       # peer name -> seconds
    peer_notes: list = field(default_factory=list)
    build1: float | None = None
    buildk: float | None = None
    chosen: int | None = None
    flops: int = 0
    nbytes: int = 0
    memory_bound: bool = False
    level: str = ""
    level_gbps: float | None = None
    peak_gflops: float | None = None
    predicted: float | None = None   # the model's prediction for the top-K's chosen plan
    ratio: float | None = None        # best peer / roller top-K, the median of the rounds' ratios
    top1_over_topk: float | None = None  # the median of the ratios of a tight alternation of the two
    machine: float | None = None  # the machine's speed before the case's timings, share of its calibrated peak

    @property
    def over_model(self) -> float | None:
        """The chosen kernel's measured time over the model's prediction for it."""
        return self.topk / self.predicted if self.topk and self.predicted else None

    @property
    def best_peer(self) -> tuple[str, float] | None:
        return min(self.peers.items(), key=lambda kv: kv[1]) if self.peers else None

    def gflops(self, seconds: float | None) -> float | None:
        return self.flops / seconds / 1e9 if seconds else None

    def gbps(self, seconds: float | None) -> float | None:
        return self.nbytes / seconds / 1e9 if seconds else None


def _recheck(module, arrays, out_shape, reference, tol) -> tuple[bool, object]:
    """Runs a built kernel on the benchmark's arrays; (output matches the reference, its argument list)."""
    import tvm

    from roller.measure.verify import fill_sentinel  # NaNs: a kernel that skips part of its output cannot pass

    dev = tvm.cpu()
    targs = [tvm.runtime.tensor(a, dev) for a in arrays]
    targs.append(tvm.runtime.tensor(fill_sentinel(np.empty(tuple(out_shape), reference.dtype)), dev))
    module["main"](*targs)
    return bool(np.allclose(targs[-1].numpy(), reference, rtol=tol[0], atol=tol[1])), targs


def _cycling(main, placements: list) -> Callable[[], object]:
    """A call of ``main`` on the next of ``placements`` (argument lists) at each call."""
    turn = itertools.cycle(placements)
    return lambda: main(*next(turn))


def run_case(case: Case, device, args, probe: SpeedProbe | None = None) -> Row:
    """Builds, checks and times one case (see the module docstring)."""
    from roller.errors import RollerError
    from roller.plan.cost import resident_share, shared_source, source_bandwidth
    from roller.measure.verify import TOLERANCE
    from roller.builder.farm import placed_copies, placement_count

    row = Row(case)
    try:
        spec = case_spec(case)
        res1 = _build(case, device, profile=False)
        resk = _build(case, device, topk=args.topk)
    except Skip as e:
        row.status = f"skipped: {e}"
        return row
    except RollerError as e:
        row.status = f"failed: {type(e).__name__}: {str(e).splitlines()[0]}"
        return row
    full = dict(resk.report["shape"])
    arrays = spec.inputs(full, "float32", np.random.default_rng(1))  # not the build's inputs (seed 0)
    reference = spec.reference(arrays, full)
    out_shape = spec.output_shape(full)
    tol = TOLERANCE["float32"]
    ok1, args1 = _recheck(res1.module, arrays, out_shape, reference, tol)
    okk, argsk = _recheck(resk.module, arrays, out_shape, reference, tol)
    row.verified = bool(res1.report["verified"] and resk.report["verified"] and ok1 and okk)
    if not (ok1 and okk):
        row.status = "failed: re-check against numpy: " + ", ".join(
            n for n, ok in (("top-1", ok1), (f"top-{args.topk}", okk)) if not ok) + " wrong"
    row.build1, row.buildk = res1.report["build_seconds"], resk.report["build_seconds"]
    row.chosen = resk.report["chosen"]
    row.predicted = resk.report["candidates"][row.chosen]["predicted_seconds"]
    row.flops = spec.flops(full)
    row.nbytes = sum(a.nbytes for a in arrays) + reference.nbytes
    # where the data lives between calls: the L2s, the shared level, or a mix of the two (its bandwidth the
    # blend the model uses, model.source_bandwidth)
    share = resident_share(resk.expr, device)
    shared = shared_source(resk.expr, device).name
    row.level = (device.private_levels[-1].name if share >= 1 else shared if share <= 0
                 else f"{share:.0%} {device.private_levels[-1].name} + {shared}")
    row.level_gbps = source_bandwidth(resk.expr, device)
    row.peak_gflops = device.units.peak("float32") * device.units.count
    # memory-bound: fewer flops per byte of all tensors than the device can do per byte from that level
    row.memory_bound = row.flops / row.nbytes < row.peak_gflops / row.level_gbps

    opts = spec.option_values
    # the kernels' functions are looked up once, as a server holds them: a lookup per call (~1 us through
    # TVM's FFI) is a fifth of a 4 us kernel
    main1, maink = res1.module["main"], resk.module["main"]
    impls = [("top1", lambda: main1(*args1)), ("topk", lambda: maink(*argsk))]
    for p in peers(case.op, full, arrays, out_shape, opts, use_torch=not args.no_torch):
        got = p.to_numpy(p.run())
        if np.allclose(got, reference, rtol=tol[0], atol=tol[1]):
            impls.append((p.name, p.run))
        else:
            row.peer_notes.append(f"{p.name} computes something else here: not compared")
    if probe is not None:
        time.sleep(SETTLE_SECONDS)  # the peers' thread pools, which ran their check just now, stop spinning
        row.machine = probe.speed()
    rounds = time_rounds(impls, rounds=args.rounds, target=args.target)
    med = {k: statistics.median(v) for k, v in rounds.items()}
    row.top1, row.topk = med.pop("top1"), med.pop("topk")
    row.peers = med
    if med:
        row.ratio = paired_ratio([min(r) for r in zip(*(rounds[p] for p in med))], rounds["topk"])
    # top-1 against top-K alone, back to back without a pause (one thread pool, no other library's threads
    # to wait for) in short batches: the machine's speed moves within a second, and the two kernels differ
    # by a few percent where they differ at all
    # ... each call on the next of the same few placements of the buffers (profile.placed_copies, one seed
    # for both): a kernel's speed can depend on where its tensors sit within a page, and on one placement
    # each, the same plan built twice (top-10 keeping the model's first) differed by up to 1.38x
    count = placement_count(args1)
    placed = [(name, _cycling(main, placed_copies(targs, count)))
              for name, main, targs in (("top1", main1, args1), ("topk", maink, argsk))]
    time.sleep(SETTLE_SECONDS)  # the peers' thread pools stop spinning
    tight = time_rounds(placed, rounds=PAIRED_ROUNDS, target=args.target / 2, settle=0)
    row.top1_over_topk = paired_ratio(tight["top1"], tight["topk"])
    return row


# ---------------------------------------------------------------------------------------------
# Reporting

def _t(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def throughput(row: Row) -> str:
    """roller top-K's GFLOP/s (share of peak), or for memory-bound cases its GB/s (share of the
    bandwidth of the level the data lives in)."""
    if not row.topk:
        return "-"
    if row.memory_bound:
        gbps = row.gbps(row.topk)
        return f"{gbps:.1f} GB/s ({gbps / row.level_gbps:.0%} of {row.level} {row.level_gbps:.0f})"
    g = row.gflops(row.topk)
    return f"{g:.1f} GFLOP/s ({g / row.peak_gflops:.0%} of peak)"


def markdown(rows: list[Row], topk: int, peer_names: list[str]) -> str:
    head = (["case", "op", "shape", "roller top-1", f"roller top-{topk}", *peer_names, "ratio", f"top-1/top-{topk}",
             f"roller top-{topk} throughput", "measured/model", "build s (top-1 / top-k)", "verified", "notes"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        c = r.case
        shape = c.shape_text + (f" {c.options_text}" if c.options else "")
        notes = "; ".join(([] if r.status == "ok" else [r.status]) + r.peer_notes)
        cells = [c.name, c.op, shape, _t(r.top1), _t(r.topk), *(_t(r.peers.get(p)) for p in peer_names),
                 _f(r.ratio), _f(r.top1_over_topk), throughput(r), _f(r.over_model),
                 f"{_f(r.build1, '{:.1f}')} / {_f(r.buildk, '{:.1f}')}" if r.buildk else "-",
                 "-" if r.status.startswith("skipped") else ("yes" if r.verified else "NO"), notes]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


CSV_FIELDS = ["case", "network", "op", "shape", "options", "status", "verified", "top1_seconds", "topk_seconds",
              "numpy_seconds", "torch_seconds", "best_peer", "ratio", "top1_over_topk", "gflops", "gbps",
              "memory_bound", "data_level", "level_gbps", "build_top1_seconds", "build_topk_seconds", "chosen",
              "predicted_seconds", "measured_over_model", "machine_speed", "notes"]


def write_csv(rows: list[Row], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in rows:
            best = r.best_peer
            w.writerow({
                "case": r.case.name, "network": r.case.network, "op": r.case.op, "shape": r.case.shape_text,
                "options": r.case.options_text, "status": r.status, "verified": r.verified,
                "top1_seconds": r.top1, "topk_seconds": r.topk, "numpy_seconds": r.peers.get("numpy"),
                "torch_seconds": r.peers.get("torch"), "best_peer": best[0] if best else "", "ratio": r.ratio,
                "top1_over_topk": r.top1_over_topk, "gflops": r.gflops(r.topk), "gbps": r.gbps(r.topk),
                "memory_bound": r.memory_bound, "data_level": r.level, "level_gbps": r.level_gbps,
                "build_top1_seconds": r.build1, "build_topk_seconds": r.buildk, "chosen": r.chosen,
                "predicted_seconds": r.predicted, "measured_over_model": r.over_model, "machine_speed": r.machine,
                "notes": "; ".join(r.peer_notes)})


def summary(rows: list[Row], topk: int) -> str:
    """cases, verified, worst ratio, geomean ratio, share >= 0.9x, median and max build seconds,
    top-1/top-K (median, within TOP1_WITHIN), memory-bound cases at BANDWIDTH_SHARE, measured/model."""
    built = [r for r in rows if r.topk is not None]
    skipped = sum(r.status.startswith("skipped") for r in rows)
    failed = sum(r.status.startswith("failed") for r in rows)
    ratios = [(r.ratio, r.case.name) for r in built if r.ratio is not None]
    builds = [(r.buildk, r.case.name) for r in rows if r.buildk is not None]
    t1k = [r.top1_over_topk for r in built if r.top1_over_topk is not None]
    om = [(r.over_model, r.case.name) for r in built if r.over_model is not None]
    parts = [f"cases {len(rows)} ({len(built)} run, {skipped} skipped, {failed} failed)",
             f"verified {sum(r.verified for r in rows)}/{len(rows) - skipped}"]
    if ratios:
        worst = min(ratios)
        geo = math.exp(statistics.fmean(math.log(x) for x, _ in ratios))
        share = sum(x >= FAR for x, _ in ratios) / len(ratios)
        parts += [f"worst ratio {worst[0]:.2f} ({worst[1]})", f"geomean ratio {geo:.2f}",
                  f"share >= {FAR}x {share:.0%} of {len(ratios)}"]
    if builds:
        most = max(builds)
        parts.append(f"build seconds (top-{topk}) median {statistics.median(b for b, _ in builds):.1f} "
                     f"max {most[0]:.1f} ({most[1]})")
    if t1k:  # the target: top-1 within 10% of top-K on >= 90% of cases
        parts.append(f"top-1/top-{topk} median {statistics.median(t1k):.2f}, "
                     f"within {TOP1_WITHIN:.0%} {sum(x <= 1 + TOP1_WITHIN for x in t1k)}/{len(t1k)}")
    bw = [r.gbps(r.topk) / r.level_gbps for r in built if r.memory_bound and r.level_gbps and r.gbps(r.topk)]
    if bw:  # the target: memory-bound operators at >= 80% of their data level's calibrated bandwidth
        parts.append(f"memory-bound at >= {BANDWIDTH_SHARE:.0%} of their level's bandwidth "
                     f"{sum(x >= BANDWIDTH_SHARE for x in bw)}/{len(bw)}")
    if om:  # the target: every chosen kernel within 2x of the model's prediction (either way)
        off = max(om, key=lambda x: max(x[0], 1 / x[0]))
        within = sum(0.5 <= x <= 2 for x, _ in om)
        parts.append(f"measured/model within 2x {within}/{len(om)} (furthest {off[0]:.2f}, {off[1]})")
    speeds = sorted(r.machine for r in built if r.machine is not None)
    if speeds:  # context for the figures above: the model is calibrated in one phase of the machine
        parts.append(f"machine at {speeds[0]:.0%}-{speeds[-1]:.0%} of its calibrated peak "
                     f"(median {statistics.median(speeds):.0%})")
    return "summary: " + ", ".join(parts)


def _progress(row: Row, topk: int) -> str:
    c = row.case
    if row.topk is None:
        return f"{c.name}: {row.status}"
    peers_txt = "  ".join(f"{k} {_t(v)}" for k, v in row.peers.items())
    return (f"{c.name}: top-1 {_t(row.top1)}  top-{topk} {_t(row.topk)}  {peers_txt}  ratio {_f(row.ratio)}  "
            f"{throughput(row)}  build {row.buildk:.1f} s"
            + (f"  machine {row.machine:.0%}" if row.machine is not None else "")
            + ("" if row.verified else "  NOT VERIFIED")
            + "".join(f"  [{n}]" for n in row.peer_notes))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", metavar="REGEX", help="only cases whose name matches (re.search: a substring works)")
    ap.add_argument("--quick", action="store_true", help="top-1 and top-3 (not top-10), 3 rounds of shorter timings")
    ap.add_argument("--out", metavar="DIR", default="build/bench_suite",
                    help="where suite.md and suite.csv go (default build/bench_suite)")
    ap.add_argument("--no-torch", action="store_true", help="compare with numpy only")
    ap.add_argument("--suite", type=Path, default=SUITE, help=f"the cases (default {SUITE.name} beside this script)")
    ap.add_argument("--device", default="host",
                    help="host (default), a shipped CPU spec or a YAML path: on an AVX-512 machine, a copy of x86-avx2 "
                         "with this machine's core count builds AVX2 code (pair it with ONEDNN_MAX_CPU_ISA=AVX2, "
                         "ATEN_CPU_CAPABILITY=avx2, OPENBLAS_CORETYPE=Haswell and --keep-openblas-env for the peers)")
    ap.add_argument("--keep-openblas-env", action="store_true",
                    help="keep OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (default: re-run without them)")
    args = ap.parse_args(argv)
    args.topk, args.rounds, args.target = (3, 3, 0.02) if args.quick else (10, 5, 0.05)

    cases = load_cases(args.suite)
    if args.cases:
        try:
            pattern = re.compile(args.cases)
        except re.error as e:
            ap.error(f"--cases {args.cases!r} is not a regular expression: {e}")
        cases = [c for c in cases if pattern.search(c.name)]
        if not cases:
            ap.error(f"--cases {args.cases!r} matches no case of {args.suite}")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    from roller.device.load import load_device
    from roller.tir.compile import set_threads

    device = load_device(args.device)
    if device.kind != "cpu":
        ap.error(f"--device {args.device}: a {device.kind} spec; the suite times CPU kernels")
    set_threads(device.units.count)
    info = [f"device {device.name} ({device.units.count} cores, "
            f"{'calibrated' if device.calibrated else 'datasheet figures: run `roller calibrate`'}), "
            f"TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS')}",
            f"numpy {np.__version__}: {openblas_info()}; "
            + (f"unset for this run: {os.environ[REEXEC_MARK]}" if REEXEC_MARK in os.environ
               else "OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE as in the environment")
            + "; numpy elementwise ops and sums run on one thread"]
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            args.no_torch = True
            info.append("torch not installed: comparing with numpy only (pip install -e '.[bench]')")
        else:
            torch.set_num_threads(device.units.count)
            info.append(f"torch {torch.__version__}, {torch.get_num_threads()} threads. Note: installed torch makes "
                        f"every `import tvm` ~2.5 s slower: `pip uninstall -y torch` after benchmarking")
    if device.units.count > (os.cpu_count() or 1):
        info.append(f"WARNING: the device has {device.units.count} cores and this machine {os.cpu_count()} CPUs: "
                    f"roller's threads share them; use a spec with count: {os.cpu_count()}")
    load = os.getloadavg()[0]
    if load >= BUSY_LOAD:
        info.append(f"WARNING: load average {load:.1f} on {os.cpu_count()} CPUs before the suite started: other "
                    f"processes compete for the cores and threaded kernels (roller's and the peers') slow down "
                    f"unevenly; rerun on a quiet machine before quoting ratios")
    for line in info:
        print(line, file=sys.stderr, flush=True)

    probe = SpeedProbe(device) if device.calibrated else None
    t0 = time.perf_counter()
    rows = []
    for i, case in enumerate(cases, 1):
        row = run_case(case, device, args, probe)
        rows.append(row)
        print(f"[{i}/{len(cases)}] {_progress(row, args.topk)}", file=sys.stderr, flush=True)
    peer_names = [p for p in ("numpy", "torch") if any(p in r.peers for r in rows)]
    table = markdown(rows, args.topk, peer_names)
    line = summary(rows, args.topk)
    head = "\n".join(f"- {x}" for x in info) + (
        f"\n- ratio = best peer time / roller top-{args.topk} time (> 1: roller faster), the median of the ratios "
        f"of {args.rounds} alternating rounds (times: medians); top-1/top-{args.topk}: the median ratio of "
        f"{PAIRED_ROUNDS} rounds of the two alone, back to back; suite ran {time.perf_counter() - t0:.0f} s; "
        f"load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    text = f"# roller cliff suite\n\n{head}\n\n{table}\n\n{line}\n"
    (out_dir / "suite.md").write_text(text)
    write_csv(rows, out_dir / "suite.csv")
    print(table)
    print()
    print(line)
    print(f"wrote {out_dir / 'suite.md'} and {out_dir / 'suite.csv'}", file=sys.stderr)
    return 0 if all(r.verified or r.status.startswith("skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
