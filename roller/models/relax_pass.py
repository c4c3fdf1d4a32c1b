"""Whole models through Relax: every fused PrimFunc of an IRModule scheduled, roller first.

The pass has the shape of ``tvm.s_tir.dlight.ApplyDefaultSchedule``: it takes an IRModule after
legalization and fusion (``relax.get_pipeline("zero")``-style) and returns it with every PrimFunc that
was not yet scheduled scheduled and marked ``tirx.is_scheduled`` (later passes leave such functions
alone). Each function goes down a chain of rules, each ``apply(func, device) -> Schedule | None``:

1. ``RollerRule``: a function whose main block roller's analysis accepts (one reduction such as a
   convolution, a matmul, a pool or a mean, with its padding stage and its elementwise epilogues; or one
   elementwise block) is planned by roller's constructor (the model's top-1 plan, or the top-K profiled)
   and scheduled by roller's code generator; a function of several reductions run row by row (softmax,
   layer norm, RMS norm, a mean and what follows it) keeps its blocks and gets a row plan
   (:mod:`roller.plan.rows`, :mod:`roller.targets.cpu.rows`).
2. TVM's dlight CPU rules (``GEMV``, ``Reduction``) where they apply.
3. ``GenericRule``: every block's leading spatial loops fused and parallel, the innermost loop of an
   injective block vectorized (transposes, reshapes with a copy, broadcasts, what else is left).

A function none of them schedules stays as it is and the report says so (``scheduled_by: "none"``).
The report (:class:`FunctionReport`) gives per function the rule that scheduled it, the seconds spent
and why the rules before it declined. Structurally identical functions are scheduled once.
"""
from __future__ import annotations

import math

import time
from dataclasses import dataclass, field

from roller.device.spec import Device
from roller.errors import RollerError

SCHEDULED_ATTR = "tirx.is_scheduled"

# Profiling a whole model (ScheduleModule(profile=True)): roller's functions are profiled in order of
# their share of the model's predicted time (plan time x calls) until PROFILE_BUDGET_SECONDS are spent;
# functions under MIN_PROFILE_SHARE of it keep the model's first plan, and only plans predicted within
# PLAN_SPREAD times the first one's time are built (ResNet-50 with every function's top 10: 185 s).
PROFILE_BUDGET_SECONDS = 40.0
MIN_PROFILE_SHARE = 0.01
PLAN_SPREAD = 2.0


@dataclass
class FunctionReport:
    """How one PrimFunc of the module was scheduled.

    ``scheduled_by`` is ``"roller"``, a fallback rule's name (``"dlight.Reduction"``, ``"generic"``...)
    or ``"none"``; ``declined`` holds, per rule tried before it, why that rule did not apply.
    ``seconds`` is the time spent scheduling (planning included); ``reused`` names the structurally
    identical function whose schedule was reused (then ``seconds`` is only the lookup). ``plan``
    describes roller's plan (tiles per level, vector axis) when roller scheduled it.
    """

    name: str
    scheduled_by: str
    seconds: float
    declined: dict[str, str] = field(default_factory=dict)
    reused: str | None = None
    plan: dict | None = None
    notes: tuple[str, ...] = ()
    profiled: str | None = None  # with profiling: what it chose, or why the first plan stayed
    cache: str | None = None     # through the kernel cache (roller.models.function_cache): "hit", "miss" or "off"
    # parameter -> roller.plan.prepack.PackedLayout.to_dict(): constants the kernel takes packed (prepack_constants)
    prepacked: dict = field(default_factory=dict)

    @property
    def reason(self) -> str | None:
        """Why the function fell back: the first rule's (roller's) refusal, None if roller scheduled it."""
        return next(iter(self.declined.values()), None)

    def to_dict(self) -> dict:
        return {"name": self.name, "scheduled_by": self.scheduled_by, "seconds": self.seconds,
                "reason": self.reason, "declined": dict(self.declined), "reused": self.reused,
                "plan": self.plan, "notes": list(self.notes), "profiled": self.profiled,
                "cache": self.cache, "prepacked": dict(self.prepacked)}


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


def is_scheduled(func) -> bool:
    attrs = func.attrs
    return attrs is not None and SCHEDULED_ATTR in attrs and int(attrs[SCHEDULED_ATTR]) == 1


class ScheduleModule:
    """The module pass: ``ScheduleModule(device)(mod)`` returns a copy of ``mod`` with every PrimFunc
    scheduled by the first rule that applies and marked ``tirx.is_scheduled``; ``report`` then lists
    one :class:`FunctionReport` per PrimFunc (functions already scheduled are skipped and not listed).

    ``rules`` defaults to :func:`default_rules`. Functions are scheduled in name order, so the report
    and the reuse of identical functions (structural hash and equality) do not depend on dict order.
    With ``verify`` every scheduled function with static shapes is built and run on random inputs next to
    TVM's build of the unscheduled function (:func:`check_schedule`); a schedule that disagrees is
    declined and the next rule tried (two builds per distinct function: ~0.1-0.3 s each).
    With ``prepack`` (the default) the constants roller's functions read are packed once, here, in their
    plans' tiles (:func:`prepack_constants`), and the functions take them packed.
    """

    def __init__(self, device: Device, rules: list[Rule] | None = None, profile: bool = False, topk: int = 10,
                 verify: bool = False, profile_budget: float | None = PROFILE_BUDGET_SECONDS, prepack: bool = True):
        self.device = device
        self.prepack = prepack
        self.rules = rules if rules is not None else default_rules()
        self.verify = verify
        self.profile, self.topk, self.profile_budget = profile, topk, profile_budget
        self.report: list[FunctionReport] = []

    def __call__(self, mod):
        import tvm
        import tvm_ffi

        mod = mod.clone()
        self.report = []
        constants = constant_params(mod) if self.prepack else {}
        # (hash, constant parameters) -> (original, scheduled, name)
        done: dict[tuple, list[tuple[object, object, str]]] = {}
        items = sorted(((gv, f) for gv, f in mod.functions.items()
                        if isinstance(f, tvm.tirx.PrimFunc) and not is_scheduled(f)), key=lambda x: x[0].name_hint)
        for gv, func in items:
            t0 = time.perf_counter()
            consts = constants.get(gv.name_hint, frozenset())
            key = (tvm_ffi.structural_hash(func), consts)
            same = next((entry for entry in done.get(key, []) if tvm_ffi.structural_equal(entry[0], func)), None)
            if same is not None:
                _, scheduled, first = same
                earlier = next(r for r in self.report if r.name == first)
                self.report.append(FunctionReport(gv.name_hint, earlier.scheduled_by, time.perf_counter() - t0,
                                                  dict(earlier.declined), reused=first, plan=earlier.plan,
                                                  prepacked=dict(earlier.prepacked)))
                if scheduled is not None:
                    mod[gv] = scheduled
                continue
            scheduled, rep = self.schedule_function(gv.name_hint, func, consts)
            rep.seconds = time.perf_counter() - t0
            self.report.append(rep)
            done.setdefault(key, []).append((func, scheduled, gv.name_hint))
            if scheduled is not None:
                mod[gv] = scheduled
        if self.profile:
            self._profile(mod, dict(items))
        return prepack_constants(mod, self.report)

    def schedule_function(self, name: str, func, constants: frozenset[str] = frozenset()):
        """(the function scheduled by the first rule that applies and marked ``tirx.is_scheduled``, or
        None when none does; its :class:`FunctionReport`, ``seconds`` included). ``constants`` names the
        parameters that are constants at every call (:func:`constant_params`): the report's ``prepacked``
        says which of them the scheduled function takes packed."""
        t0 = time.perf_counter()
        declined: dict[str, str] = {}
        for rule in self.rules:
            sch, why = rule.attempt_with(func, self.device, constants)
            if sch is not None and self.verify:
                why = check_schedule(func, sch.mod["main"], self.device, prepacked=rule.prepacked)
                sch = None if why else sch
            if sch is not None:
                return (sch.mod["main"].with_attr(SCHEDULED_ATTR, True),
                        FunctionReport(name, rule.name, time.perf_counter() - t0, declined, plan=rule.plan,
                                       notes=rule.notes, prepacked=dict(rule.prepacked)))
            declined[rule.name] = why
        return None, FunctionReport(name, "none", time.perf_counter() - t0, declined)

    def _profile(self, mod, originals: dict) -> None:
        """Re-schedules roller's functions with their profiled plans, the largest share of the model's
        predicted time first, while less than ``profile_budget`` seconds are spent (the function being
        profiled then finishes; see PROFILE_BUDGET_SECONDS); each report's ``profiled`` says what
        happened."""
        counts = call_counts(mod)
        by_name = {gv.name_hint: gv for gv in originals}
        share = {r.name: (r.plan or {}).get("predicted_seconds", 0.0) * counts.get(r.name, 1)
                 for r in self.report if r.scheduled_by == "roller"}
        for r in self.report:  # a reused function's calls count for the one it reuses
            if r.reused is not None and r.reused in share:
                share[r.reused] += share.pop(r.name, 0.0)
        total = sum(share.values()) or 1.0
        rule = next((r for r in self.rules if isinstance(r, RollerRule)), RollerRule())
        constants = constant_params(mod) if self.prepack else {}
        t0 = time.perf_counter()
        for name in sorted(share, key=lambda n: -share[n]):
            rep = next(r for r in self.report if r.name == name)
            if rep.plan is None or "tiles" not in rep.plan:
                rep.profiled = "not profiled: a row-wise plan has no alternatives"
                continue
            if share[name] < MIN_PROFILE_SHARE * total:
                rep.profiled = f"not profiled: {share[name] / total:.1%} of the model's predicted time"
                continue
            spent = time.perf_counter() - t0
            if self.profile_budget is not None and spent > self.profile_budget:
                rep.profiled = f"not profiled: the profiling budget ({self.profile_budget:g} s) was spent"
                continue
            t = time.perf_counter()
            sch, rep.profiled = rule.profiled(originals[by_name[name]], self.device, self.topk,
                                              constants=constants.get(name, frozenset()))
            rep.seconds += time.perf_counter() - t
            if sch is not None and self.verify:
                why = check_schedule(originals[by_name[name]], sch.mod["main"], self.device, prepacked=rule.prepacked)
                if why:
                    sch, rep.profiled = None, f"profiled plan failed the check ({why}): the first plan stays"
            if sch is None:
                continue
            scheduled = sch.mod["main"].with_attr(SCHEDULED_ATTR, True)
            rep.plan, rep.notes = rule.plan, rule.notes
            for r in self.report:
                if r.name == name or r.reused == name:
                    mod[by_name[r.name]] = scheduled
                    r.prepacked = dict(rule.prepacked)
                    if r.reused == name:
                        r.plan = rule.plan
        for r in self.report:
            if r.reused in share:
                r.profiled = f"as {r.reused}"

    def summary(self) -> dict[str, int]:
        """How many functions each rule scheduled."""
        out: dict[str, int] = {}
        for r in self.report:
            out[r.scheduled_by] = out.get(r.scheduled_by, 0) + 1
        return out


def call_counts(mod) -> dict[str, int]:
    """How many calls each PrimFunc of ``mod`` gets from its Relax functions (by name)."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprVisitor, visitor

    counts: dict[str, int] = {}

    @visitor
    class _Count(PyExprVisitor):
        def visit_call_(self, call):
            for a in call.args:
                if isinstance(a, tvm.ir.GlobalVar):
                    counts[a.name_hint] = counts.get(a.name_hint, 0) + 1
            super().visit_call_(call)

    for _, f in mod.functions.items():
        if isinstance(f, relax.Function):
            _Count().visit_expr(f)
    return counts


def _tir_calls(mod):
    """(GlobalVar, call) for every ``call_tir`` in the Relax functions of ``mod``."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprVisitor, visitor

    call_tir = tvm.ir.Op.get("relax.call_tir")
    out = []

    @visitor
    class _Calls(PyExprVisitor):
        def visit_call_(self, call):
            if call.op.same_as(call_tir):
                out.append((call.args[0], call))
            super().visit_call_(call)

    for _, f in mod.functions.items():
        if isinstance(f, relax.Function):
            _Calls().visit_expr(f)
    return out


def constant_bytes(mod) -> int:
    """Bytes of the Relax constants (a model's weights) that the ``call_tir`` calls of ``mod`` pass."""
    import tvm
    from tvm import relax

    seen: dict = {}  # TVM objects hash and compare by identity: each constant once
    for _, call in _tir_calls(mod):
        args = call.args[1]
        for a in (args.fields if isinstance(args, relax.Tuple) else [args]):
            if isinstance(a, tvm.ir.expr.Constant):
                data = a.value
                seen[a] = math.prod(int(d) for d in data.shape) * tvm.DataType(str(data.dtype)).bits // 8
    return sum(seen.values())


def constants_device(mod, device: Device) -> Device:
    """``device`` to schedule ``mod``'s functions for: where the module's constants outgrow what a unit
    finds in the caches (``Device.largest_cached_bytes``), the other layers evict a layer's weights
    between its calls, and it reads them from memory (``Device.constants_level``: the last level); else
    ``device`` itself. ResNet-50 (100 MB of weights), two threads, alternating in one process: 30.93 ->
    30.23 ms with its weights charged from memory; MobileNetV2's 14 MB stay cached (3.27 -> 3.46 ms when
    charged from memory)."""
    import dataclasses

    if not device.levels[-1].keeps_data or constant_bytes(mod) <= device.largest_cached_bytes():
        return device
    return dataclasses.replace(device, constants_level=device.levels[-1].name)


def constant_params(mod) -> dict[str, frozenset[str]]:
    """PrimFunc name -> its parameters (by name) that every call of it (``call_tir``) passes a Relax
    constant; a function called any other way too (``call_tir_inplace``...), or not at all, has none."""
    import tvm
    from tvm import relax

    called: dict[str, list] = {}
    for gv, call in _tir_calls(mod):
        args = call.args[1]
        called.setdefault(gv.name_hint, []).append(list(args.fields) if isinstance(args, relax.Tuple) else None)
    referenced = call_counts(mod)  # every call naming the function
    out = {}
    for gv, f in mod.functions.items():
        sites = called.get(gv.name_hint)
        if (not isinstance(f, tvm.tirx.PrimFunc) or not sites or any(s is None for s in sites)
                or referenced.get(gv.name_hint) != len(sites)):
            continue
        names = [str(p.name) for p in f.params]
        out[gv.name_hint] = frozenset(n for i, n in enumerate(names)
                                      if all(i < len(s) and isinstance(s[i], tvm.ir.expr.Constant) for s in sites))
    return out


def prepack_constants(mod, reports) -> object:
    """``mod`` with the constants that scheduled functions take packed (each report's ``prepacked``:
    parameter -> :class:`roller.plan.prepack.PackedLayout` dict) packed at every call, once, with numpy."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    from roller.plan.prepack import PackedLayout
    from roller.tir.layout import pack_constant

    layouts = {r.name: {n: PackedLayout.from_dict(d) for n, d in r.prepacked.items()} for r in reports if r.prepacked}
    if not layouts:
        return mod
    call_tir = tvm.ir.Op.get("relax.call_tir")
    params = {gv.name_hint: [str(p.name) for p in f.params] for gv, f in mod.functions.items()
              if gv.name_hint in layouts}
    # each function whose signature changed is added again, under a new GlobalVar: the old one keeps the
    # old signature's type, against which Relax checks the calls
    changed = {gv: f for gv, f in mod.functions_items() if gv.name_hint in layouts}
    base = tvm.IRModule({gv: f for gv, f in mod.functions_items() if gv not in changed}, attrs=mod.attrs,
                        global_infos=mod.global_infos)

    @mutator
    class _Pack(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not call.op.same_as(call_tir) or call.args[0] not in fresh:
                return call
            name = call.args[0].name_hint
            args = list(call.args[1].fields)
            for i, p in enumerate(params[name]):
                if p in layouts[name]:
                    data = args[i].value.numpy()
                    args[i] = relax.const(pack_constant(layouts[name][p], data), str(data.dtype))
            return relax.Call(call.op, [fresh[call.args[0]], relax.Tuple(args)] + list(call.args[2:]), call.attrs,
                              call.ty_args, call.span)

    pack = _Pack(base)
    fresh = {gv: pack.builder_.add_func(f, gv.name_hint) for gv, f in changed.items()}
    for gv, func in base.functions_items():
        if isinstance(func, relax.Function):
            pack.builder_.update_func(gv, pack.visit_expr(func))
    return pack.builder_.get()


def check_schedule(func, scheduled, device: Device, seed: int = 0, prepacked: dict | None = None) -> str:
    """"" when ``scheduled`` computes what ``func`` computes, else why not (one line).

    Both are built for the device and run on the same random contents of every buffer parameter (the
    outputs' too, so an output element the schedule forgets to write shows); afterwards every buffer must
    agree within roller.builder.farm.TOLERANCE (exactly for integers). ``scheduled`` takes the parameters named
    in ``prepacked`` (parameter -> PackedLayout dict) packed: it gets those contents packed, and only the
    other buffers are compared. Functions with symbolic shapes or scalar parameters are not checked ("")."""
    import numpy as np
    import tvm
    from tvm import tirx

    from roller.models.relax_steps import random_arrays
    from roller.measure.verify import TOLERANCE
    from roller.tir.compile import compile_for, target_for

    params = list(func.params)
    if not all(isinstance(getattr(p, "ty", None), tirx.buffer.BufferType)
               and all(isinstance(d, tirx.IntImm) for d in p.shape) for p in params):
        return ""
    arrays = list(random_arrays({str(i): (tuple(int(d) for d in p.shape), str(p.dtype))
                                 for i, p in enumerate(params)}, seed).values())
    from roller.plan.prepack import PackedLayout
    from roller.tir.layout import pack_constant

    layouts = {n: PackedLayout.from_dict(d) for n, d in (prepacked or {}).items()}
    packed = [pack_constant(layouts[str(p.name)], a) if str(p.name) in layouts else a for p, a in zip(params, arrays)]
    target, dev = target_for(device), tvm.cpu()
    results = []
    for f, given in ((func, arrays), (scheduled, packed)):
        try:
            ex = compile_for(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}), target)
        except _schedule_errors() as e:
            return f"does not build: {_first_line(e)}"
        bufs = [tvm.runtime.tensor(a.copy(), dev) for a in given]
        ex["main"](*bufs)
        results.append([b.numpy() for b in bufs])
    for p, want, got in zip(params, *results):
        if str(p.name) in layouts:
            continue  # an input, read in another layout
        rtol, atol = TOLERANCE.get(str(p.dtype), (0, 0))
        if not np.allclose(got, want, rtol=rtol, atol=atol):
            err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
            return f"wrong result: buffer {p.name} differs from the unscheduled build by up to {err:.3g}"
    return ""


def schedule_module(mod, device: Device, profile: bool = False, topk: int = 10, verify: bool = False):
    """(scheduled copy of ``mod``, report list): :class:`ScheduleModule` with the default rules."""
    sched = ScheduleModule(device, profile=profile, topk=topk, verify=verify)
    out = sched(mod)
    return out, sched.report

