"""The host side of a GPU kernel, read from TVM's lowering: which kernels the host function calls, with
which buffers in which order, on which grid. Shared by the CUDA build (its report) and the OpenCL runner.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Mapping

from roller.errors import BuildError


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel call of the host function: kernel name, buffers passed (by name, in argument order), and
    the extent of each launch axis (``blockIdx.x``, ``threadIdx.x``, ...)."""

    kernel: str
    buffers: tuple[str, ...]
    extents: Mapping[str, int]

    def sizes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(global size, local size) per dimension x, y, z for OpenCL's NDRange."""
        dims = [d for d in "xyz" if f"blockIdx.{d}" in self.extents or f"threadIdx.{d}" in self.extents]
        local = tuple(self.extents.get(f"threadIdx.{d}", 1) for d in dims)
        glob = tuple(self.extents.get(f"blockIdx.{d}", 1) * n for d, n in zip(dims, local))
        return glob or (1,), local or (1,)


def lower(mod, target):
    """``mod`` lowered for ``target`` as ``tvm.tirx.build`` lowers it before code generation: (the host
    IRModule, {target: device IRModule})."""
    import tvm

    build = importlib.import_module("tvm.tirx.build")  # the module, not the function tvm.tirx.build
    mod = tvm.tirx.transform.BindTarget(target)(mod)
    pipeline, _, _ = tvm.tirx.get_default_tir_pipeline(target)
    return build.split_host_device_mods(pipeline(mod))


_DATA = re.compile(r"^(\w+?)(?:_\d+)?\.data$")


def kernel_launches(host_mod) -> tuple[KernelLaunch, ...]:
    """The kernel calls (``call_ffi_kernel``) of a lowered host module, in program order."""
    found: list[KernelLaunch] = []

    def walk(node):
        if type(node).__name__ == "Call":
            if getattr(node.op, "name", "") == "tirx.call_ffi_kernel":
                found.append(_launch(node))
            return
        for name in ("body", "seq", "then_case", "else_case", "value"):
            child = getattr(node, name, None)
            if child is None:
                continue
            for c in (child if type(child).__name__ in ("Array", "list", "tuple") else [child]):
                walk(c)

    for func in host_mod.functions.values():
        walk(func.body)
    return tuple(found)


def _launch(call) -> KernelLaunch:
    params = [str(p) for p in call.attrs.launch_params]
    args = list(call.args)
    name = str(args[0].value)
    extents = args[len(args) - len(params):]
    buffers = []
    for a in args[1:len(args) - len(params)]:
        m = _DATA.match(str(a))
        if m is None:
            raise BuildError(f"kernel {name}: argument {a} is not a buffer; roller's OpenCL runner passes buffers only")
        buffers.append(m.group(1))
    sizes = {}
    for p, e in zip(params, extents):
        if type(e).__name__ != "IntImm":
            raise BuildError(f"kernel {name}: launch extent {p} = {e} is not a constant")
        sizes[p] = int(e.value)
    return KernelLaunch(name, tuple(buffers), sizes)


