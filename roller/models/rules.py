"""The rules that schedule one fused PrimFunc of a Relax module (:mod:`roller.models.relax_pass` tries them in order).

1. ``RollerRule``: roller's analysis, constructor and code generator: a function with one main block
   (a reduction with its padding and epilogues, or one elementwise block), or one of several reductions
   run row by row (softmax, layer norm...).
2. ``DlightRule``: one of TVM's dlight CPU rules (GEMV, Reduction).
3. ``GenericRule``: the fallback: leading spatial loops fused and parallel, injective blocks vectorized.
"""
from __future__ import annotations

from roller.device.spec import Device
from roller.errors import RollerError

# RollerRule.profiled builds only the plans predicted within PLAN_SPREAD times the first plan's time
PLAN_SPREAD = 2.0


class Rule:
    """A scheduling rule: ``apply(func, device)`` returns a ``tvm.s_tir.Schedule`` or None.

    Subclasses implement :meth:`attempt`, which also says why the rule declined; a rule never raises for
    a function it cannot schedule. ``plan`` / ``notes`` / ``prepacked`` describe the last successful
    attempt (reports).
    """

    name = "rule"

    def __init__(self):
        self.plan: dict | None = None
        self.notes: tuple[str, ...] = ()
        self.prepacked: dict[str, dict] = {}

    def attempt(self, func, device: Device):
        """(Schedule, "") when the rule schedules ``func``, else (None, why not)."""
        raise NotImplementedError

    def attempt_with(self, func, device: Device, constants: frozenset[str]):
        """:meth:`attempt`, where the parameters named in ``constants`` are constants at every call: a rule
        may then take some of them packed (its ``prepacked``: parameter -> layout). By default it does not."""
        self.prepacked = {}
        return self.attempt(func, device)

    def apply(self, func, device: Device):
        return self.attempt(func, device)[0]


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
    A function the one-block analysis declines is tried as a row-wise function (several reductions);
    its row plan has no alternatives to profile."""

    name = "roller"

    def attempt(self, func, device: Device):
        return self.attempt_with(func, device, frozenset())

    def attempt_with(self, func, device: Device, constants: frozenset[str]):
        """The model's first plan; the constants it packs arrive packed (``roller.plan.prepack``)."""
        from roller.builder.api import analyze
        from roller.targets import target_of

        self.plan, self.notes, self.prepacked = None, (), {}
        try:
            expr, norm = analyze(func)
        except RollerError as e:
            return self._attempt_rows(func, device, str(e))
        try:
            program = target_of(device).construct(expr, device, 1, constants).programs[0]
        except _schedule_errors() as e:
            return None, f"not planned: {_first_line(e)}"
        return self._schedule(norm, expr, program, device)

    def _schedule(self, norm, expr, program, device: Device):
        from roller.targets import schedule
        from roller.plan.prepack import program_layouts

        notes: list[str] = []
        try:
            sch = schedule(norm, expr, program, device, notes)
            prepacked = {n: layout.to_dict() for n, layout in program_layouts(expr, program, device).items()}
        except _schedule_errors() as e:
            return None, f"planned but not scheduled: {_first_line(e)}"
        self.prepacked = prepacked
        self.plan = {"expr": expr.name, "axes": {a.name: a.extent for a in expr.axes},
                     "tiles": {lv: dict(t) for lv, t in zip(program.levels, program.tiles)},
                     "vector_axis": program.vector_axis, "predicted_seconds": program.predicted_seconds}
        self.notes = tuple(notes)
        return sch, ""

    def profiled(self, func, device: Device, topk: int, spread: float = PLAN_SPREAD,
                 constants: frozenset[str] = frozenset()):
        """(Schedule or None, what happened): the plans among the model's top ``topk`` predicted within
        ``spread`` times the first plan's time are built, checked against TVM's unscheduled build and timed
        in worker processes (:func:`roller.builder.api.build`, through the kernel cache), and the fastest is
        scheduled, taking the ``constants`` it can packed (timed with their packing in the kernel: the
        tiles it chose are what profiling decides). None (the first plan stays) when fewer than two plans
        are that close."""
        import dataclasses

        from roller.builder.api import analyze, build
        from roller.plan.prepack import prepackable
        from roller.targets import target_of
        from roller.plan.rtile import compute_lanes

        self.plan, self.notes, self.prepacked = None, (), {}
        expr, norm = analyze(func)
        programs = target_of(device).construct(expr, device, topk).programs
        first = programs[0].predicted_seconds
        k = sum(1 for p in programs if p.predicted_seconds <= first * spread)
        if k < 2:
            nxt = f"{programs[1].predicted_seconds / first:.1f}x" if len(programs) > 1 else "no"
            return None, f"not profiled: the model's next plan is predicted {nxt} slower"
        try:
            result = build(norm.with_attr("global_symbol", "main"), device, topk=k, profile=True, name=expr.name)
        except _schedule_errors() as e:
            return None, f"not profiled: {_first_line(e)}"
        measured = [c["measured_seconds"] for c in result.report["candidates"]]
        chosen = result.report["chosen"]
        program = result.program
        if constants:
            program = dataclasses.replace(program, prepacked=prepackable(
                expr, program.tiles, program.vector_axis, compute_lanes(expr, device), program.padded, constants))
        sch, why = self._schedule(norm, expr, program, device)
        if sch is None:
            return None, f"profiled plan not scheduled: {why}"
        base = f"{measured[0] * 1e6:.3g} us" if measured[0] else "failed"
        return sch, (f"top-{k} profiled ({result.report.get('cache', 'off')}): plan {chosen} "
                     f"{measured[chosen] * 1e6:.3g} us, first plan {base}")

    def _attempt_rows(self, func, device: Device, why_not_one: str):
        """A function with several reductions run row by row (:mod:`roller.plan.rows`); declined with both
        analyses' reasons when it is not one."""
        from roller.tir.analysis import analyze_rows
        from roller.targets.cpu.rows import schedule_rows
        from roller.plan.rows import plan_rows

        try:
            fn, norm = analyze_rows(func)
        except RollerError as e:
            return None, f"{why_not_one}; as a row-wise function: {e}"
        plan = plan_rows(fn, device)
        notes: list[str] = []
        try:
            sch = schedule_rows(norm, plan, notes)
        except _schedule_errors() as e:
            return None, f"row-wise plan not scheduled: {_first_line(e)}"
        self.plan = {"expr": fn.name, "rows": fn.rows, "cols": fn.cols, **plan.to_dict(),
                     "blocks_exprs": {b.name: {"kind": b.kind, "axes": {a.name: a.extent for a in b.expr.axes},
                                               "flops_per_point": b.expr.flops_per_point} for b in fn.blocks}}
        self.notes = tuple(notes)
        return sch, ""


class DlightRule(Rule):
    """One of TVM's dlight CPU rules (``tvm.s_tir.dlight.cpu``), by class name: GEMV or Reduction."""

    def __init__(self, rule_name: str):
        super().__init__()
        self.name = f"dlight.{rule_name}"
        self._rule_name = rule_name

    def attempt(self, func, device: Device):
        from tvm.s_tir.dlight import cpu

        from roller.tir.compile import target_for

        rule = getattr(cpu, self._rule_name)()
        try:
            sch = rule.apply(func, target_for(device), False)
        except _schedule_errors() as e:
            return None, _first_line(e)
        if isinstance(sch, list):
            sch = sch[0] if sch else None
        return (sch, "") if sch is not None else (None, "pattern not matched")


class GenericRule(Rule):
    """The last resort: after inlining what can be inlined, each block's leading spatial loops are fused
    and run in parallel over the cores; an injective block's innermost loop is vectorized when its
    extent is constant and either at most one vector or a multiple of the vector width (no tail).
    Reduction loops stay serial (vectorizing them needs rfactor: roller's rule does that)."""

    name = "generic"

    def attempt(self, func, device: Device):
        import tvm
        from tvm.s_tir.dlight import normalize_prim_func, try_inline

        self.notes = ()
        sch = tvm.s_tir.Schedule(func)
        try:
            blocks = normalize_prim_func(sch)
            if blocks is None:
                return None, "blocks are not in a normal form (opaque or nested blocks)"
            blocks = try_inline(sch, blocks)
            notes: list[str] = []
            for b in blocks:
                dtype = str(sch.get(b.block_rv).writes[0].source.dtype) if sch.get(b.block_rv).writes else "float32"
                self._schedule_block(sch, b, device.units.lanes(dtype), notes)
        except _schedule_errors() as e:
            return None, _first_line(e)
        self.notes = tuple(notes)
        return sch, ""

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
    """roller first, then dlight's CPU GEMV and Reduction rules, then the generic schedule."""
    return [RollerRule(), DlightRule("GEMV"), DlightRule("Reduction"), GenericRule()]
