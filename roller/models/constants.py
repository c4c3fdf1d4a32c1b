"""A Relax module's constants (a model's weights) as its fused functions see them: which parameters of
which PrimFunc are constants at every call, how many bytes they take, and packing them once, ahead of
the kernels, in the layouts the scheduled functions read (``FunctionReport.prepacked``)."""
from __future__ import annotations

import math

from roller.device.spec import Device
from roller.models.relax_rewrite import mutate_functions


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
    ``device`` itself (docs/design-notes.md#constants-constants_device)."""
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
    return mutate_functions(pack, base)
