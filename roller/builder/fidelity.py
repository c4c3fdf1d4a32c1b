"""How well does the cost model rank kernels on this device? Predicted against measured time over varied plans
(``roller fidelity``).

For each shape (compute-bound GEMMs and convolutions, and irregular / memory-bound ones: odd channel counts,
a strided convolution, a matrix-vector product, row sums, an elementwise op), the candidates are the
constructor's top-K plus random valid plans (aligned, nested, fitting every level:
``roller.plan.construct.sample_programs``), so that good and bad kernels are both present. Every candidate
is built in worker processes and checked against numpy (``roller.builder.farm.profile`` without timing and
without a build budget: every one is built); the verified ones are built again here and every one of them
is timed the same way: ``rounds`` rounds over all candidates in turn, each a median of
``roller.measure.finalists.REPEATS`` repeats, on the same buffers, and the median over rounds is the
candidate's time.

Per shape and pooled: Spearman's rank correlation between predicted and measured time, how far the
model's first choice is from the measured best (the pair re-timed alternately, CONFIRM_ROUNDS more times:
the best of many noisy timings is biased low), and the model's relative error: per shape,
r_i = log(measured_i / predicted_i) less the shape's median of r (ranking ignores a per-shape scale),
pooled over every shape's candidates; the error is exp(90th percentile of |r|) - 1. The model's first
choice is taken among *all* candidates (the model's own order: prediction, then its tie-breaks); when it
fails to build or verify, the shape counts as a miss.
"""
from __future__ import annotations

import datetime
import json
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from roller.device.spec import Device
from roller.errors import BuildError, InvalidShapeError, RollerError
from roller.plan.rprogram import RProgram

SHAPES: list[tuple[str, dict[str, int]]] = [
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
    ("depthwise_conv2d", {"N": 1, "H": 28, "W": 28, "C": 256, "R": 3, "S": 3, "pad": 2, "dilation": 2}),
    ("depthwise_conv2d", {"N": 1, "H": 83, "W": 83, "C": 42, "R": 5, "S": 5, "pad": 2}),
    ("batch_matmul", {"B": 8, "M": 256, "N": 64, "K": 256}),
    ("add_relu", {"M": 100, "N": 3001}),
    ("matmul", {"M": 1, "N": 1000, "K": 1280}),
    ("reduce_sum", {"M": 4096, "N": 7}),
    ("reduce_sum", {"M": 4096, "N": 4096}),
]
# two compute-bound, two memory-bound / irregular: matmul 512^3, the 1x1 conv at 71x71, add_relu, reduce_sum 4096x7
QUICK = [SHAPES[1], SHAPES[8], SHAPES[13], SHAPES[15]]
SAMPLES = 30  # random plans per shape on top of the top-K
QUICK_SAMPLES = 10
TOPK = 10
ROUNDS = 3  # timing rounds over all candidates
CONFIRM_ROUNDS = 5  # alternate re-timings of the model's first plan and the measured best

# issue 33's targets
FIRST_WITHIN = 1.10  # the model's first plan within 10% of the measured best ...
FIRST_SHARE = 0.90  # ... on at least 90% of shapes
MEAN_SPEARMAN = 0.8
ERROR_PERCENTILE = 90  # the model's relative error: this percentile of the centred |log(measured / predicted)|


def label(op: str, shape: dict) -> str:
    """``op:K=V,...``, as ``--list`` prints it and ``--shape`` reads it."""
    return f"{op}:" + ",".join(f"{k}={v}" for k, v in shape.items())


def parse_label(text: str) -> tuple[str, dict[str, int]]:
    """``matmul:M=64,N=64,K=64`` -> (op, validated shape) for any operator of roller.tir.ops.OPS
    (InvalidShapeError naming what is wrong)."""
    from roller.tir import ops

    op, sep, shape = text.partition(":")
    if not sep:
        raise RollerError(f"--shape {text!r}: write OP:K=V,..., e.g. matmul:M=64,N=64,K=64 (operators: "
                          f"{', '.join(ops.OPS)})")
    try:
        return op.strip(), ops.parse_shape(op.strip(), shape)
    except InvalidShapeError as e:
        raise InvalidShapeError(f"--shape {text!r}: {e}") from None


def select_shapes(quick: bool = False, substrings: Sequence[str] | None = None,
                  given: Sequence[str] | None = None) -> tuple[list[tuple[str, dict]], str]:
    """The shapes to study and how they were picked (``"quick"``, ``"full"`` or ``"custom"``): ``given``
    labels (:func:`parse_label`) if any, else QUICK or SHAPES; kept only where the label contains one of
    ``substrings`` when given."""
    if given:
        shapes = [parse_label(t) for t in given]
        selection = "custom"
    else:
        shapes = list(QUICK if quick else SHAPES)
        selection = "quick" if quick else "full"
    if substrings:
        shapes = [(op, s) for op, s in shapes if any(sub in label(op, s) for sub in substrings)]
        selection = "custom"
    return shapes, selection


# ---------------------------------------------------------------------------------------------
# Statistics (pure)


def ranks(x) -> np.ndarray:
    """Ranks from 1, ties sharing their average rank."""
    x = np.asarray(x, float)
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
    """Spearman's rank correlation of ``x`` and ``y`` (ties averaged); NaN when either is constant or fewer
    than two values."""
    if len(x) != len(y):
        raise ValueError(f"spearman: {len(x)} values against {len(y)}")
    if len(x) < 2:
        return math.nan
    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def centred_log_errors(predicted, measured) -> np.ndarray:
    """r_i = log(measured_i / predicted_i) less their median: the model's error on one shape once its scale
    on that shape is set aside (ranking cannot see a common factor)."""
    r = np.log(np.asarray(measured, float) / np.asarray(predicted, float))
    return r - np.median(r) if len(r) else r


def relative_error(shapes: Iterable[tuple[Sequence[float], Sequence[float]]],
                   percentile: float = ERROR_PERCENTILE) -> float:
    """The model's relative error over (predicted, measured) lists, one pair of lists per shape:
    exp(``percentile`` of |r| pooled over every shape's candidates) - 1, r from :func:`centred_log_errors`;
    NaN when there is no candidate."""
    pooled = np.concatenate([np.abs(centred_log_errors(p, m)) for p, m in shapes] or [np.empty(0)])
    if not len(pooled):
        return math.nan
    return float(math.expm1(np.percentile(pooled, percentile)))


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


# ---------------------------------------------------------------------------------------------
# Building and timing


@dataclass
class ShapeStudy:
    """One shape's candidates, what the model predicted for each and what was measured."""

    op: str
    shape: dict  # as given (the label's); the operator's defaults fill in the rest
    candidates: list[RProgram]
    timed: list[int]  # indices of the candidates that built, verified and were timed
    measured: list[float]  # seconds a call, in the order of ``timed``
    errors: dict[int, str]  # why each other candidate failed
    first: int  # the model's first choice among all candidates
    best: int | None  # the measured best
    first_over_best: float  # in the timing pass; inf when the first plan failed
    first_over_best_retimed: float  # the pair re-timed alternately
    best_gflops: float
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    top: int = 0  # candidates[:top] are the constructor's top-k, the plans profiling chooses among

    @property
    def label(self) -> str:
        return label(self.op, self.shape)

    @property
    def predicted(self) -> list[float]:
        return [self.candidates[i].predicted_seconds for i in self.timed]

    @property
    def spearman(self) -> float:
        return spearman(self.predicted, self.measured) if len(self.timed) >= 3 else math.nan

    @property
    def relative_error(self) -> float:
        return relative_error([(self.predicted, self.measured)])

    @property
    def top_margin(self) -> float:
        """How much slower than the first plan the model predicted the constructor's plans that ran faster
        than it (by ``WIN_MARGIN``, the margin by which profiling replaces the first plan): the largest
        predicted_j / predicted_first - 1 among them, 0 where none did; NaN where the first plan was not timed.
        Profiling that builds the plans predicted within this margin of the first would have found them."""
        from roller.measure.finalists import WIN_MARGIN

        meas = dict(zip(self.timed, self.measured))
        if self.first not in meas:
            return math.nan
        pf = self.candidates[self.first].predicted_seconds
        beat = [self.candidates[i].predicted_seconds / pf - 1 for i in self.timed
                if i < self.top and meas[i] <= meas[self.first] * (1 - WIN_MARGIN)]
        return max([0.0] + beat)

    def to_dict(self) -> dict:
        """The shape's figures (JSON-safe: a NaN or infinite figure is null)."""
        return {"label": self.label, "op": self.op, "shape": dict(self.shape), "candidates": len(self.candidates),
                "measured": len(self.timed), "failed": len(self.errors),
                "spearman": _finite(self.spearman),
                "first_over_best": _finite(self.first_over_best),
                "first_over_best_retimed": _finite(self.first_over_best_retimed),
                "first_within": bool(self.first_over_best_retimed <= FIRST_WITHIN),
                "model_first": self.first, "measured_best": self.best,
                "model_first_error": self.errors.get(self.first),
                "relative_error": _finite(self.relative_error), "top_margin": _finite(self.top_margin),
                "best_gflops": _finite(self.best_gflops), "seconds": round(self.seconds, 3),
                "errors": {str(i): e.strip().splitlines()[-1][:300] if e.strip() else "?"
                           for i, e in sorted(self.errors.items())}}

    def dump(self) -> dict:
        """Every candidate: its plan, predicted and measured seconds (None where it failed) and its error."""
        meas = dict(zip(self.timed, self.measured))
        return {"op": self.op, "shape": self.shape, "model_first": self.first, "measured_best": self.best,
                "model_first_error": self.errors.get(self.first),
                "candidates": [{"program": p.to_dict(), "predicted": p.predicted_seconds, "measured": meas.get(i),
                                "error": self.errors.get(i)} for i, p in enumerate(self.candidates)]}


def time_all(mods: dict, args, rounds: int) -> dict[int, float]:
    """Seconds per call of every module, all timed the same way: ``rounds`` rounds over the modules in turn
    (so drift hits all alike), each a median of REPEATS repeats; the median over rounds."""
    import tvm

    from roller.builder.farm import time_module
    from roller.measure.finalists import REPEATS

    dev = tvm.cpu()
    times: dict[int, list[float]] = {i: [] for i in mods}
    for _ in range(rounds):
        for i, mod in mods.items():
            times[i].append(time_module(mod, dev, args, repeats=REPEATS))
    return {i: float(np.median(t)) for i, t in times.items()}


def candidates_for(expr, device: Device, samples: int, topk: int) -> tuple[list[RProgram], int, int]:
    """The constructor's top-``topk`` plus up to ``samples`` random valid plans not among them, the index
    of the model's first choice among them all (its own order: prediction, then its tie-breaks), and how many
    of them (the first ones) are the constructor's."""
    from roller.plan.construct import rank_programs, sample_programs
    from roller.targets import construct

    cons = construct(expr, device, topk)
    cands = list(cons.programs)
    keys = {p.key for p in cands}
    for p in sample_programs(expr, device, samples + topk, seed=1, epsilon=cons.epsilon):
        if p.key not in keys and len(cands) < len(cons.programs) + samples:
            keys.add(p.key)
            cands.append(p)
    best = rank_programs(expr, cands)[0]
    first = next(i for i, p in enumerate(cands) if p is best)
    return cands, first, len(cons.programs)


def study(op: str, shape: dict, device: Device, samples: int = SAMPLES, topk: int = TOPK, rounds: int = ROUNDS,
          progress: bool = False) -> ShapeStudy:
    """Builds, verifies and times the candidates of one shape (see the module's docstring)."""
    import tvm

    from roller.builder.api import analyze
    from roller.builder.farm import profile
    from roller.measure.verify import TOLERANCE, fill_sentinel, wrong_result
    from roller.targets import build
    from roller.tir import ops

    t0 = time.perf_counter()
    spec = ops.get_op(op)
    full = ops.validate_shape(spec, shape, "float32")
    func = spec.make(full, "float32")
    expr, norm = analyze(func)
    cands, first, top = candidates_for(expr, device, samples, topk)
    inputs = spec.inputs(full, "float32", np.random.default_rng(0))
    ref = spec.reference(inputs, full)
    # build and verify every candidate in worker processes (a TVM crash fails one candidate only); no build
    # budget: a candidate skipped for time would count as a failure of the model
    try:
        prof = profile(norm, expr, cands, device, inputs, ref, progress=progress, time_kernels=False,
                       build_budget=None)
        errors = {i: c.error or "not verified" for i, c in enumerate(prof.candidates) if not c.verified}
        prof.cleanup()
    except BuildError as e:  # none verified
        lines = (e.details or "").splitlines()
        errors = {i: (lines[i] if i < len(lines) else str(e)) for i in range(len(cands))}
    dev = tvm.cpu()
    out = np.empty(ref.shape, ref.dtype)
    args = [tvm.runtime.tensor(a, dev) for a in inputs] + [tvm.runtime.tensor(fill_sentinel(out), dev)]
    rtol, atol = TOLERANCE.get(str(ref.dtype), (0.0, 0.0))
    mods = {}
    for i, prog in enumerate(cands):
        if i in errors:
            continue
        mod = build(norm, expr, prog, device).mod  # the same plan again, here: verified again before it is timed
        args[-1].copyfrom(fill_sentinel(out))
        mod["main"](*args)
        wrong = wrong_result(args[-1].numpy(), ref, rtol, atol)
        if wrong:
            errors[i] = f"built again in this process: {wrong}"
        else:
            mods[i] = mod
    meas = time_all(mods, args, rounds)
    timed = sorted(meas)
    best = min(meas, key=meas.get) if meas else None
    best_seconds = meas[best] if meas else math.nan
    if first in errors:
        top1 = retimed = math.inf  # the model's first plan did not build or verify: a miss
    elif first == best:
        top1 = retimed = 1.0
    else:
        top1 = meas[first] / best_seconds
        pair = time_all({0: mods[first], 1: mods[best]}, args, CONFIRM_ROUNDS)
        retimed = pair[0] / pair[1]
    return ShapeStudy(op=op, shape=dict(shape), candidates=cands, timed=timed, measured=[meas[i] for i in timed],
                      errors=errors, first=first, best=best, first_over_best=top1, first_over_best_retimed=retimed,
                      best_gflops=spec.flops(full) / best_seconds / 1e9, seconds=time.perf_counter() - t0, top=top)


def summarize(device: Device, studies: Sequence[ShapeStudy], *, quick: bool, selection: str, samples: int,
              topk: int, rounds: int, seconds: float) -> dict:
    """The run's record (roller.device.fidelity_record's schema): per shape figures and the pooled ones."""
    from roller.device.fidelity_record import SCHEMA

    rhos = [s.spearman for s in studies if not math.isnan(s.spearman)]
    mean_rho = float(np.mean(rhos)) if rhos else math.nan
    within = sum(s.first_over_best_retimed <= FIRST_WITHIN for s in studies)
    within_pass = sum(s.first_over_best <= FIRST_WITHIN for s in studies)
    err = relative_error([(s.predicted, s.measured) for s in studies])
    margins = [s.top_margin for s in studies if not math.isnan(s.top_margin)]
    n = len(studies)
    cal = device.calibration or {}
    return {
        "schema": SCHEMA, "device": device.name, "fingerprint": device.fingerprint, "calibrated": device.calibrated,
        "calibration_created": cal.get("created") if device.calibrated else None,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "quick": quick, "selection": selection, "samples": samples, "topk": topk, "rounds": rounds,
        "threads": device.units.count,
        "targets": {"first_within": FIRST_WITHIN, "first_share": FIRST_SHARE, "mean_spearman": MEAN_SPEARMAN,
                    "error_percentile": ERROR_PERCENTILE},
        "shapes": [s.to_dict() for s in studies],
        "shape_count": n, "spearman_shapes": len(rhos), "mean_spearman": _finite(mean_rho),
        "first_within": within, "first_within_timing_pass": within_pass,
        "first_share": within / n if n else None,
        "relative_error": _finite(err), "candidates_timed": sum(len(s.timed) for s in studies),
        # profiling builds the plans predicted within this of the first (roller.builder.api.trusted_programs)
        "profile_margin": _finite(float(np.percentile(margins, ERROR_PERCENTILE))) if margins else None,
        "meets": {"mean_spearman": bool(rhos) and mean_rho >= MEAN_SPEARMAN - 1e-9,
                  "first_within": n > 0 and within >= FIRST_SHARE * n},
        "seconds": round(seconds, 1),
    }


def check_request(device: Device, shapes: Sequence, samples: int, topk: int, rounds: int) -> None:
    """RollerError (one line) where :func:`run` cannot do what is asked: a device whose kernels are not run
    here, no shape, a count out of range."""
    from roller.targets import target_of

    if target_of(device).offline:
        raise RollerError(f"roller fidelity times kernels on this machine's CPU; {device.name!r} is a "
                          f"{device.kind} device whose kernels are compiled offline: give a CPU device")
    if samples < 0 or topk < 1 or rounds < 1:
        raise RollerError(f"fidelity: --samples must be >= 0, --topk and --rounds >= 1 (got {samples}, {topk}, "
                          f"{rounds})")
    if not shapes:
        raise RollerError("fidelity: no shape to study (see --list)")


def run(device: Device, shapes: Sequence[tuple[str, dict]], *, samples: int = SAMPLES, topk: int = TOPK,
        rounds: int = ROUNDS, quick: bool = False, selection: str = "custom", progress: bool = False,
        on_shape: Callable[[ShapeStudy], None] | None = None) -> tuple[dict, list[ShapeStudy]]:
    """Studies every shape on ``device`` (a CPU device: kernels are timed here); returns the record
    (:func:`summarize`) and the studies. ``on_shape`` is called after each shape."""
    from roller.tir.compile import set_threads

    check_request(device, shapes, samples, topk, rounds)
    set_threads(device.units.count)
    t0 = time.perf_counter()
    studies = []
    for op, shape in shapes:
        s = study(op, shape, device, samples, topk, rounds, progress=progress)
        studies.append(s)
        if on_shape is not None:
            on_shape(s)
    return summarize(device, studies, quick=quick, selection=selection, samples=samples, topk=topk,
                     rounds=rounds, seconds=time.perf_counter() - t0), studies


def check_dump(path) -> None:
    """OutputError (one line) unless a file can be made in ``path``'s folder (a temporary one is, and removed)."""
    import tempfile
    from pathlib import Path

    from roller.output import OutputError

    folder = Path(path).parent
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise OutputError(f"--dump {path}: cannot write in {folder} ({e.strerror or e})") from None


def write_dump(studies: Sequence[ShapeStudy], path) -> None:
    """Writes every candidate of every shape (plan, predicted, measured, error) as JSON to ``path``."""
    from roller.output import OutputError, atomic_write_bytes

    try:
        atomic_write_bytes(path, json.dumps([s.dump() for s in studies]).encode())
    except OSError as e:
        raise OutputError(f"--dump {path}: cannot write ({e.strerror or e})") from None


def _ratio(x: float) -> str:
    return "FAILED" if math.isinf(x) else f"{x:.2f}"


def shape_line(s: ShapeStudy) -> str:
    """One line per shape as ``roller fidelity`` prints it."""
    rho = "-" if math.isnan(s.spearman) else f"{s.spearman:.2f}"
    err = "-" if math.isnan(s.relative_error) else f"{s.relative_error:.0%}"
    line = (f"{s.op:12s} {','.join(f'{k}={v}' for k, v in s.shape.items()):52s} n={len(s.timed):3d} "
            f"failed={len(s.errors):2d} spearman={rho:>5} first/best={_ratio(s.first_over_best)} "
            f"(re-timed {_ratio(s.first_over_best_retimed)}) error={err:>4} best={s.best_gflops:.1f} GFLOP/s "
            f"({s.seconds:.0f} s)")
    if s.first in s.errors:
        line += f"\n    the model's first plan failed: {s.errors[s.first].strip()[:300]}"
    return line


def verbose_lines(s: ShapeStudy) -> list[str]:
    """The model's first plan and the measured best, and every timed candidate (measured / predicted)."""
    out = []
    for name, i in (("model_first", s.first), ("measured_best", s.best)):
        if i is not None:
            p = s.candidates[i]
            out.append(f"    {name} #{i}: predicted {p.predicted_seconds * 1e3:.3f} ms, packed {list(p.packed)}: "
                       + p.describe().replace("\n", " | "))
    order = sorted(range(len(s.timed)), key=lambda k: s.measured[k])
    out.append("    measured ms (fastest first) / predicted ms: "
               + " ".join(f"{s.measured[k] * 1e3:.3f}/{s.predicted[k] * 1e3:.3f}" for k in order))
    return out


def summary_lines(record: dict) -> list[str]:
    """The pooled figures against issue 33's targets."""
    n = record["shape_count"]
    rho = record["mean_spearman"]
    err = record["relative_error"]
    margin = record.get("profile_margin")
    yes = {True: "met", False: "NOT met"}
    return [
        f"mean Spearman {'-' if rho is None else f'{rho:.2f}'} over {record['spearman_shapes']} shapes "
        f"(target >= {MEAN_SPEARMAN}: {yes[record['meets']['mean_spearman']]})",
        f"first plan within {FIRST_WITHIN - 1:.0%} of the measured best on {record['first_within']}/{n} shapes, "
        f"the pair re-timed {CONFIRM_ROUNDS}x alternately ({record['first_within_timing_pass']}/{n} in the timing "
        f"pass; a first plan that fails counts as a miss) (target >= {FIRST_SHARE:.0%}: "
        f"{yes[record['meets']['first_within']]})",
        f"model's relative error {'-' if err is None else f'{err:.0%}'}: exp(p{ERROR_PERCENTILE} of "
        f"|log(measured/predicted)| less each shape's median) - 1, over {record['candidates_timed']} plans",
        f"profiling margin {'-' if margin is None else f'{margin:.0%}'}: top-{record['topk']} plans that ran faster "
        f"than the first were predicted up to this much slower (p{ERROR_PERCENTILE} over shapes); a build without "
        f"--topk profiles the plans predicted within it of the first",
    ]
