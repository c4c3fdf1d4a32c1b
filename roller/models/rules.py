"""The rules that schedule one fused PrimFunc of a Relax module (:mod:`roller.models.relax_pass` tries them in order).

1. ``RollerRule``: roller's analysis, constructor and code generator for a function with one main block:
   a reduction with its padding and epilogues, or one elementwise block (elementwise functions are this
   rule's one-main-block case, not a path of their own: the analysis describes both as one ``Expr``).
2. ``RowWiseRule``: roller's row plan for a function of several reductions run row by row (softmax,
   layer norm...).
3. ``DlightRule``: one of TVM's dlight CPU rules (GEMV, Reduction).
4. ``GenericRule``: the fallback: leading spatial loops fused and parallel, injective blocks vectorized.

A rule's ``name`` keys the report's ``declined`` and is its ``rule``; its ``scheduled_by`` (the name
unless a rule says otherwise) is what the report's ``scheduled_by`` says: both of roller's rules say
``"roller"``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from roller.device.spec import Device
from roller.errors import RollerError

# RollerRule.profiled builds only the plans predicted within PLAN_SPREAD times the first plan's time, where the
# device has no fidelity record that speaks for its model (roller.builder.api.profiled_plans: then 1 + its margin)
PLAN_SPREAD = 2.0


@dataclass(frozen=True)
class Scheduled:
    """A rule scheduled the function: ``schedule`` (a ``tvm.s_tir.Schedule``), roller's ``plan`` (tiles per
    level, vector axis; None from the other rules), ``notes`` on what the schedule left out, the constant
    parameters it takes packed (``prepacked``: parameter -> ``roller.plan.prepack.PackedLayout.to_dict()``)
    and, from :meth:`RollerRule.profiled`, what profiling chose (``detail``)."""

    schedule: object
    plan: dict | None = None
    notes: tuple[str, ...] = ()
    prepacked: dict = field(default_factory=dict)
    detail: str = ""


@dataclass(frozen=True)
class Declined:
    """A rule did not schedule the function, and ``reason`` says why (one line)."""

    reason: str


class Rule:
    """A scheduling rule: ``apply(func, device, constants)`` returns :class:`Scheduled` or :class:`Declined`,
    never raising for a function it cannot schedule. A rule keeps no state between calls (nothing is
    written on it), so one instance may serve several threads.

    ``constants`` names the parameters that are constants at every call: a rule may then take some of them
    packed (``Scheduled.prepacked``). By default it does not.
    """

    name = "rule"
    scheduled_by: str | None = None  # what the report's scheduled_by says (None: the rule's name)

    def apply(self, func, device: Device, constants: frozenset[str] = frozenset()) -> Scheduled | Declined:
        raise NotImplementedError

    @property
    def by(self) -> str:
        """The report's ``scheduled_by`` for a function this rule scheduled."""
        return self.scheduled_by or self.name


def _schedule_errors() -> tuple[type, ...]:
    """What a rule turns into 'declined': roller's own errors and TVM's refusals (ScheduleError and
    the internal checks of its primitives, both RuntimeErrors)."""
    return (RollerError, RuntimeError)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"[:400]


class RollerRule(Rule):
    """roller's analysis, constructor and code generator (:mod:`roller.tir.analysis`, :mod:`roller.plan.construct`,
    :mod:`roller.targets`) with the model's first plan (milliseconds to a second per function, nothing
    built); :meth:`profiled` builds and times the top plans of a function (ScheduleModule's profiling).
    Its functions have one main block: one reduction with its padding and epilogues, or one elementwise
    block (the same path: one ``Expr``). A function of several reductions is :class:`RowWiseRule`'s."""

    name = "roller"

    def apply(self, func, device: Device, constants: frozenset[str] = frozenset()) -> Scheduled | Declined:
        """The model's first plan for a function with one main block; the constants it packs arrive packed
        (``roller.plan.prepack``)."""
        from roller.builder.api import analyze
        from roller.targets import target_of

        try:
            expr, norm = analyze(func)
        except RollerError as e:
            return Declined(str(e))
        try:
            program = target_of(device).construct(expr, device, 1, constants).programs[0]
        except _schedule_errors() as e:
            return Declined(f"not planned: {_first_line(e)}")
        return self._schedule(norm, expr, program, device)

    @staticmethod
    def _schedule(norm, expr, program, device: Device) -> Scheduled | Declined:
        from roller.plan.prepack import program_layouts
        from roller.targets import schedule

        notes: list[str] = []
        try:
            sch = schedule(norm, expr, program, device, notes)
            prepacked = {n: layout.to_dict() for n, layout in program_layouts(expr, program, device).items()}
        except _schedule_errors() as e:
            return Declined(f"planned but not scheduled: {_first_line(e)}")
        plan = {"expr": expr.name, "axes": {a.name: a.extent for a in expr.axes},
                "tiles": {lv: dict(t) for lv, t in zip(program.levels, program.tiles)},
                "vector_axis": program.vector_axis, "dot_depth": program.dot_depth, "amx": program.amx,
                "grid": dict(program.grid), "packed": list(program.packed), "inlined": list(program.inlined),
                "padded": list(program.padded), "predicated": list(program.predicated),
                "balanced": program.balanced, "prefetched": list(program.prefetched),
                "predicted_seconds": program.predicted_seconds}
        return Scheduled(sch, plan, tuple(notes), prepacked)

    def profiled(self, func, device: Device, topk: int, spread: float | None = None,
                 constants: frozenset[str] = frozenset()) -> Scheduled | Declined:
        """:class:`Scheduled` (its ``detail`` says what profiling chose) or :class:`Declined` (why the first
        plan stays): the plans among the model's top ``topk`` predicted within
        ``spread`` times the first plan's time (default: 1 + the device's profiling margin, where its last
        ``roller fidelity`` speaks for its model; else PLAN_SPREAD) are built, checked against TVM's unscheduled build and timed
        in worker processes (:func:`roller.builder.api.build`, through the kernel cache), and the fastest is
        scheduled, taking the ``constants`` it can packed (timed with their packing in the kernel: the
        tiles it chose are what profiling decides). Declined when fewer than two plans are that close."""
        import dataclasses

        from roller.builder.api import analyze, build, profiled_plans
        from roller.plan.construct import replanned
        from roller.targets import target_of

        if spread is None:
            margin = profiled_plans(None, device)[1]
            spread = PLAN_SPREAD if margin is None else 1 + margin
        expr, norm = analyze(func)
        programs = target_of(device).construct(expr, device, topk).programs
        first = programs[0].predicted_seconds
        k = sum(1 for p in programs if p.predicted_seconds <= first * spread)
        if k < 2:
            nxt = f"{programs[1].predicted_seconds / first:.2f}x" if len(programs) > 1 else "no"
            return Declined(f"not profiled: the model's next plan is predicted {nxt} slower (spread {spread:.2f})")
        try:
            result = build(norm.with_attr("global_symbol", "main"), device, topk=k, profile=True, name=expr.name)
        except _schedule_errors() as e:
            return Declined(f"not profiled: {_first_line(e)}")
        measured = [c["measured_seconds"] for c in result.report["candidates"]]
        chosen = result.report["chosen"]
        program = result.program
        if constants and target_of(device).kind == "cpu":
            # the profiled plan with its constants prepacked, decided and predicted as construction does (the
            # GPU's code generation prepacks nothing)
            program = replanned(expr, program, device, constants)
        out = self._schedule(norm, expr, program, device)
        if isinstance(out, Declined):
            return Declined(f"profiled plan not scheduled: {out.reason}")
        base = f"{measured[0] * 1e6:.3g} us" if measured[0] else "failed"
        return dataclasses.replace(out, detail=(f"top-{k} profiled ({result.report.get('cache', 'off')}): plan "
                                                f"{chosen} {measured[chosen] * 1e6:.3g} us, first plan {base}"))


class RowWiseRule(Rule):
    """roller's row plan (:mod:`roller.plan.rows`, :mod:`roller.targets.cpu.rows`) for a function of several
    reductions run row by row (softmax, layer norm, RMS norm, a mean and what follows it): it keeps its
    blocks, one ``Expr`` each (:func:`roller.tir.rowwise.analyze_rows`). A row plan has no alternatives
    to profile. Placed after :class:`RollerRule`; the report says ``scheduled_by: "roller"``, ``rule:
    "roller-rows"``."""

    name = "roller-rows"
    scheduled_by = "roller"

    def apply(self, func, device: Device, constants: frozenset[str] = frozenset()) -> Scheduled | Declined:
        from roller.plan.rows import plan_rows
        from roller.targets.cpu.rows import schedule_rows
        from roller.tir.analysis import analyze_rows

        try:
            fn, norm = analyze_rows(func)
        except RollerError as e:
            return Declined(str(e))
        row_plan = plan_rows(fn, device)
        notes: list[str] = []
        try:
            sch = schedule_rows(norm, row_plan, notes)
        except _schedule_errors() as e:
            return Declined(f"row-wise plan not scheduled: {_first_line(e)}")
        plan = {"expr": fn.name, "rows": fn.rows, "cols": fn.cols, **row_plan.to_dict(),
                "blocks_exprs": {b.name: {"kind": b.kind, "axes": {a.name: a.extent for a in b.expr.axes},
                                          "flops_per_point": b.expr.flops_per_point} for b in fn.blocks}}
        return Scheduled(sch, plan, tuple(notes))


class DlightRule(Rule):
    """One of TVM's dlight CPU rules (``tvm.s_tir.dlight.cpu``), by class name: GEMV or Reduction."""

    def __init__(self, rule_name: str):
        self.name = f"dlight.{rule_name}"
        self._rule_name = rule_name

    def apply(self, func, device: Device, constants: frozenset[str] = frozenset()) -> Scheduled | Declined:
        from tvm.s_tir.dlight import cpu

        from roller.tir.compile import target_for

        rule = getattr(cpu, self._rule_name)()
        try:
            sch = rule.apply(func, target_for(device), False)
        except _schedule_errors() as e:
            return Declined(_first_line(e))
        if isinstance(sch, list):
            sch = sch[0] if sch else None
        return Scheduled(sch) if sch is not None else Declined("pattern not matched")


class GenericRule(Rule):
    """The last resort: after inlining what can be inlined, each block's leading spatial loops are fused
    and run in parallel over the cores; an injective block's innermost loop is vectorized when its
    extent is constant and either at most one vector or a multiple of the vector width (no tail).
    Reduction loops stay serial (vectorizing them needs rfactor: roller's rule does that)."""

    name = "generic"

    def apply(self, func, device: Device, constants: frozenset[str] = frozenset()) -> Scheduled | Declined:
        import tvm
        from tvm.s_tir.dlight import normalize_prim_func, try_inline

        sch = tvm.s_tir.Schedule(func)
        try:
            blocks = normalize_prim_func(sch)
            if blocks is None:
                return Declined("blocks are not in a normal form (opaque or nested blocks)")
            blocks = try_inline(sch, blocks)
            notes: list[str] = []
            for b in blocks:
                dtype = str(sch.get(b.block_rv).writes[0].source.dtype) if sch.get(b.block_rv).writes else "float32"
                self._schedule_block(sch, b, device.units.lanes(dtype), notes)
        except _schedule_errors() as e:
            return Declined(_first_line(e))
        return Scheduled(sch, notes=tuple(notes))

    @staticmethod
    def _schedule_block(sch, info, lanes: int, notes: list[str]) -> None:
        kinds = info.dom_kind()
        loops = info.get_loops()
        lead = len(kinds) - len(kinds.lstrip("S"))
        if lead == 0:
            notes.append(f"{info.name}: no leading spatial loop, runs serially")
            return
        spatial = loops[:lead]
        if info.is_injective():
            inner = spatial[-1]
            n = _const_extent(sch, inner)
            if n is not None and n > 1:
                if n > lanes and n % lanes == 0:
                    spatial[-1], vec = sch.split(inner, [None, lanes])
                    sch.vectorize(vec)
                elif n <= lanes:
                    spatial = spatial[:-1]
                    sch.vectorize(inner)
                else:
                    notes.append(f"{info.name}: innermost extent {n} has a tail, not vectorized")
        if not spatial:
            return
        outer = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
        n = _const_extent(sch, outer)
        if n is None or n > 1:  # a symbolic extent (a batch of n) is parallel too
            sch.parallel(outer)


def _const_extent(sch, loop) -> int | None:
    """The loop's extent, None when it is symbolic."""
    from tvm import tirx

    ext = sch.get(loop).extent
    return int(ext) if isinstance(ext, tirx.IntImm) else None


def default_rules() -> list[Rule]:
    """roller's rules first (one main block, then row-wise), then dlight's CPU GEMV and Reduction rules,
    then the generic schedule."""
    return [RollerRule(), RowWiseRule(), DlightRule("GEMV"), DlightRule("Reduction"), GenericRule()]
