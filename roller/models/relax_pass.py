"""Whole models through Relax: every fused PrimFunc of an IRModule scheduled, roller first.

The pass has the shape of ``tvm.s_tir.dlight.ApplyDefaultSchedule``: it takes an IRModule after
legalization and fusion (``relax.get_pipeline("zero")``-style) and returns it with every PrimFunc that
was not yet scheduled scheduled and marked ``tirx.is_scheduled`` (later passes leave such functions
alone). Each function goes down a chain of rules (:mod:`roller.models.rules`), each
``apply(func, device, constants) -> Scheduled | Declined`` and keeping no state of its own:

1. ``RollerRule``: a function whose main block roller's analysis accepts (one reduction such as a
   convolution, a matmul, a pool or a mean, with its padding stage and its elementwise epilogues; or one
   elementwise block: the same path) is planned by roller's constructor (the model's top-1 plan, or the
   top-K profiled) and scheduled by roller's code generator.
2. ``RowWiseRule``: a function of several reductions run row by row (softmax, layer norm, RMS norm, a
   mean and what follows it) keeps its blocks and gets a row plan (:mod:`roller.plan.rows`,
   :mod:`roller.targets.cpu.rows`).
3. TVM's dlight CPU rules (``GEMV``, ``Reduction``) where they apply.
4. ``GenericRule``: every block's leading spatial loops fused and parallel, the innermost loop of an
   injective block vectorized (transposes, reshapes with a copy, broadcasts, what else is left).

A function none of them schedules stays as it is and the report says so (``scheduled_by: "none"``).
The report (:class:`FunctionReport`) gives per function the rule that scheduled it, the seconds spent
and why the rules before it declined. Structurally identical functions are scheduled once.

``ScheduleModule(device).as_pass()`` is the one driver, a ``tvm.transform`` module pass: it walks the
module's functions once and hands each to a per-function step (:class:`FunctionStep`; by default the
rule chain, :meth:`ScheduleModule.schedule_function`). The kernel cache's path supplies its own step
(:class:`roller.models.function_cache.CachedStep`: look up, or schedule, compile and publish), passed in
by :func:`roller.models.frontend.compile_model`; this module imports nothing of it. The constants the
scheduled functions take packed are packed by :mod:`roller.models.constants`.
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from roller.device.spec import Device
from roller.models.constants import call_counts, constant_params, prepack_constants
from roller.models.rules import (
    Declined,
    RollerRule,
    Rule,
    Scheduled,
    _first_line,
    _schedule_errors,
    default_rules,
)

SCHEDULED_ATTR = "tirx.is_scheduled"

# Profiling a whole model (ScheduleModule(profile=True)): roller's functions are profiled in order of
# their share of the model's predicted time (plan time x calls) until PROFILE_BUDGET_SECONDS are spent;
# functions under MIN_PROFILE_SHARE of it keep the model's first plan, and only plans predicted within
# PLAN_SPREAD times the first one's time are built (ResNet-50 with every function's top 10: 185 s), or within the
# device's profiling margin where a fidelity record speaks for its model (rules.RollerRule.profiled).
PROFILE_BUDGET_SECONDS = 40.0
# The interpreter's thread switch interval while functions are scheduled and compiled in threads (Python's
# default is 5 ms). A compile thread takes the GIL back between TVM's passes and calls, each time waiting for
# the scheduling thread, which holds it while it runs Python: compiles beside a thread running Python took 2x
# their time alone at 5 ms, 1.1x at 0.2 ms; DenseNet-121's cold compile 20.6 -> 19.9 s (docs/models.md,
# "Compile time").
SWITCH_INTERVAL_SECONDS = 0.0005
_switching = threading.Lock()
_switching_users = [0, None]  # compiles in threads now, the interval to restore after the last
MIN_PROFILE_SHARE = 0.01


@dataclass
class FunctionReport:
    """How one PrimFunc of the module was scheduled.

    ``scheduled_by`` is ``"roller"`` (either of roller's rules), a fallback rule's name
    (``"dlight.Reduction"``, ``"generic"``...) or ``"none"``; ``rule`` names the rule that scheduled it
    (``"roller"`` for one main block, ``"roller-rows"`` for a row-wise function, else as ``scheduled_by``;
    None when none did); ``declined`` holds, per rule tried before it, why that rule did not apply.
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
    rule: str | None = None

    @property
    def reason(self) -> str | None:
        """Why the function fell back: roller's rules' refusals (the first rule's when none of roller's
        rules was tried), None if roller scheduled it."""
        if self.scheduled_by == "roller" or not self.declined:
            return None
        mine = [(r, why) for r, why in self.declined.items() if r == "roller" or r.startswith("roller-")]
        if not mine:
            return next(iter(self.declined.values()))
        return "; ".join(why if i == 0 else f"{r}: {why}" for i, (r, why) in enumerate(mine))

    def to_dict(self) -> dict:
        return {"name": self.name, "scheduled_by": self.scheduled_by, "rule": self.rule, "seconds": self.seconds,
                "reason": self.reason, "declined": dict(self.declined), "reused": self.reused,
                "plan": self.plan, "notes": list(self.notes), "profiled": self.profiled,
                "cache": self.cache, "prepacked": dict(self.prepacked)}



class FunctionStep:
    """The driver's per-function step: ``step(sched, name, func, constants)`` returns (the function
    scheduled and marked ``tirx.is_scheduled``, or None to leave it as it is; its :class:`FunctionReport`).
    This one is the rule chain (:meth:`ScheduleModule.schedule_function`). With ``reuse`` the driver
    hands it each structurally identical function once and reuses the result; with ``workers`` > 1 it
    calls it from that many threads (the step is then thread-safe)."""

    reuse = True
    workers = 1

    def __call__(self, sched: "ScheduleModule", name: str, func, constants: frozenset[str]):
        return sched.schedule_function(name, func, constants)


@contextlib.contextmanager
def quick_thread_switches():
    """The interpreter switches threads every SWITCH_INTERVAL_SECONDS inside (never more slowly than it did),
    and as before once the last such block in the process ends."""
    with _switching:
        if _switching_users[0] == 0:
            _switching_users[1] = sys.getswitchinterval()
            if SWITCH_INTERVAL_SECONDS < _switching_users[1]:
                sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
        _switching_users[0] += 1
    try:
        yield
    finally:
        with _switching:
            _switching_users[0] -= 1
            if _switching_users[0] == 0 and SWITCH_INTERVAL_SECONDS < _switching_users[1]:
                sys.setswitchinterval(_switching_users[1])


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
    ``step`` (default :class:`FunctionStep`, the rule chain) turns each function into its scheduled
    version and report (the kernel cache's step: ``roller.models.function_cache.CachedStep``; profiling
    then re-schedules functions in the module only, so the cached path does not profile).
    """

    def __init__(self, device: Device, rules: list[Rule] | None = None, profile: bool = False, topk: int = 10,
                 verify: bool = False, profile_budget: float | None = PROFILE_BUDGET_SECONDS, prepack: bool = True,
                 step: FunctionStep | None = None):
        self.device = device
        self.step = step if step is not None else FunctionStep()
        self.prepack = prepack
        self.rules = rules if rules is not None else default_rules()
        self.verify = verify
        self.profile, self.topk, self.profile_budget = profile, topk, profile_budget
        self.report: list[FunctionReport] = []

    def as_pass(self):
        """This driver as a ``tvm.transform.ModulePass`` (name ``roller.ScheduleModule``, opt_level 0), for
        ``tvm.transform.Sequential`` or ``pass(mod)``; after it runs, this object's ``report`` is its."""
        import tvm

        return tvm.transform.module_pass(self.transform_module, opt_level=0, name="roller.ScheduleModule")

    def transform_module(self, mod, ctx=None):
        """The pass's body (``tvm.transform.module_pass``'s signature): :meth:`__call__`."""
        return self(mod)

    def __call__(self, mod):
        import tvm

        mod = mod.clone()
        self.report = []
        constants = constant_params(mod) if self.prepack else {}
        items = sorted(((gv, f) for gv, f in mod.functions.items()
                        if isinstance(f, tvm.tirx.PrimFunc) and not is_scheduled(f)), key=lambda x: x[0].name_hint)
        consts = {gv.name_hint: constants.get(gv.name_hint, frozenset()) for gv, _ in items}
        same, lookup = self._identical(items, consts) if self.step.reuse else ({}, {})
        todo = [(gv.name_hint, f, consts[gv.name_hint]) for gv, f in items if gv.name_hint not in same]
        if self.step.workers > 1:
            with quick_thread_switches(), ThreadPoolExecutor(max_workers=self.step.workers) as pool:
                done = list(pool.map(lambda item: self.run_step(*item), todo))
        else:
            done = [self.run_step(*item) for item in todo]
        results = {name: out for (name, _, _), out in zip(todo, done)}
        for gv, _ in items:
            name = gv.name_hint
            if name in same:
                scheduled, earlier = results[same[name]]
                rep = FunctionReport(name, earlier.scheduled_by, lookup[name], dict(earlier.declined),
                                     reused=same[name], plan=earlier.plan, prepacked=dict(earlier.prepacked),
                                     rule=earlier.rule)
            else:
                scheduled, rep = results[name]
            self.report.append(rep)
            if scheduled is not None:
                mod[gv] = scheduled
        if self.profile:
            self._profile(mod, dict(items))
        return prepack_constants(mod, self.report)

    def run_step(self, name: str, func, constants: frozenset[str] = frozenset()):
        """(scheduled function or None, report) of one function through ``self.step``; the report's
        ``seconds`` is the step's time (a cache lookup, or scheduling and what the step adds)."""
        t0 = time.perf_counter()
        scheduled, rep = self.step(self, name, func, constants)
        rep.seconds = time.perf_counter() - t0
        return scheduled, rep

    @staticmethod
    def _identical(items, consts: dict) -> tuple[dict[str, str], dict[str, float]]:
        """({function name: the earlier structurally identical function, with the same constant parameters,
        it reuses}, {such a name: the seconds its lookup took})."""
        import tvm_ffi

        seen: dict[tuple, list[tuple[object, str]]] = {}
        same: dict[str, str] = {}
        lookup: dict[str, float] = {}
        for gv, func in items:
            t0 = time.perf_counter()
            key = (tvm_ffi.structural_hash(func), consts[gv.name_hint])
            first = next((n for f, n in seen.get(key, []) if tvm_ffi.structural_equal(f, func)), None)
            if first is None:
                seen.setdefault(key, []).append((func, gv.name_hint))
            else:
                same[gv.name_hint], lookup[gv.name_hint] = first, time.perf_counter() - t0
        return same, lookup

    def schedule_function(self, name: str, func, constants: frozenset[str] = frozenset()):
        """(the function scheduled by the first rule that applies and marked ``tirx.is_scheduled``, or
        None when none does; its :class:`FunctionReport`, ``seconds`` included). ``constants`` names the
        parameters that are constants at every call (:func:`constant_params`): the report's ``prepacked``
        says which of them the scheduled function takes packed."""
        t0 = time.perf_counter()
        declined: dict[str, str] = {}
        for rule in self.rules:
            out = rule.apply(func, self.device, constants)
            if isinstance(out, Scheduled) and self.verify:
                why = check_schedule(func, out.schedule.mod["main"], self.device, prepacked=out.prepacked)
                out = Declined(why) if why else out
            if isinstance(out, Scheduled):
                return (out.schedule.mod["main"].with_attr(SCHEDULED_ATTR, True),
                        FunctionReport(name, rule.by, time.perf_counter() - t0, declined, plan=out.plan,
                                       notes=out.notes, prepacked=dict(out.prepacked), rule=rule.name))
            declined[rule.name] = out.reason
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
            out = rule.profiled(originals[by_name[name]], self.device, self.topk,
                                constants=constants.get(name, frozenset()))
            rep.seconds += time.perf_counter() - t
            if isinstance(out, Declined):
                rep.profiled = out.reason
                continue
            rep.profiled = out.detail
            if self.verify:
                why = check_schedule(originals[by_name[name]], out.schedule.mod["main"], self.device,
                                     prepacked=out.prepacked)
                if why:
                    rep.profiled = f"profiled plan failed the check ({why}): the first plan stays"
                    continue
            scheduled = out.schedule.mod["main"].with_attr(SCHEDULED_ATTR, True)
            rep.plan, rep.notes = out.plan, out.notes
            for r in self.report:
                if r.name == name or r.reused == name:
                    mod[by_name[r.name]] = scheduled
                    r.prepacked = dict(out.prepacked)
                    if r.reused == name:
                        r.plan = out.plan
        for r in self.report:
            if r.reused in share:
                r.profiled = f"as {r.reused}"

    def summary(self) -> dict[str, int]:
        """How many functions each rule scheduled."""
        out: dict[str, int] = {}
        for r in self.report:
            out[r.scheduled_by] = out.get(r.scheduled_by, 0) + 1
        return out



def check_schedule(func, scheduled, device: Device, seed: int = 0, prepacked: dict | None = None) -> str:
    """"" when ``scheduled`` computes what ``func`` computes, else why not (one line).

    Both are built for the device and run on the same random contents of every buffer parameter (the
    outputs' too, so an output element the schedule forgets to write shows); afterwards every buffer must
    agree within roller.measure.verify.TOLERANCE, its atol scaled to a buffer below 1 in magnitude
    (``verify.scaled_atol``; exactly for integers). ``scheduled`` takes the parameters named
    in ``prepacked`` (parameter -> PackedLayout dict) packed: it gets those contents packed, and only the
    other buffers are compared. Functions with symbolic shapes or scalar parameters are not checked ("")."""
    import numpy as np
    import tvm
    from tvm import tirx

    from roller.measure.verify import TOLERANCE, scaled_atol
    from roller.models.relax_steps import random_arrays
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
        atol = scaled_atol(want, atol)
        if not np.allclose(got, want, rtol=rtol, atol=atol):
            err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
            return f"wrong result: buffer {p.name} differs from the unscheduled build by up to {err:.3g}"
    return ""


def schedule_module(mod, device: Device, profile: bool = False, topk: int = 10, verify: bool = False):
    """(scheduled copy of ``mod``, report list): :class:`ScheduleModule` with the default rules."""
    sched = ScheduleModule(device, profile=profile, topk=topk, verify=verify)
    out = sched(mod)
    return out, sched.report

