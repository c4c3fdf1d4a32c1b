"""roller: fast tensor kernels in seconds, by construction instead of search (Roller, OSDI'22), on TVM.

The policy (roller.device, roller.plan) is plain Python and imports no compiler; TVM is
imported only when a function is analysed, scheduled, built or profiled.
"""
from roller.builder.api import BuildResult, analyze, build, build_op, construct
from roller.device.spec import Device
from roller.device.load import load_device
from roller.errors import (BuildError, CalibrationError, DeviceSpecError, InvalidShapeError, ModelError, RollerError,
                           UnsupportedExpressionError)
from roller.plan.expr import Expr, fuse_axes
from roller.plan.rprogram import RProgram

from roller.version import __version__

__all__ = [
    "BuildResult", "JIT", "analyze", "build", "build_op", "construct", "Device", "load_device", "Expr", "fuse_axes",
    "RProgram", "RollerError", "DeviceSpecError", "UnsupportedExpressionError", "InvalidShapeError",
    "BuildError", "CalibrationError", "ModelError", "compile_model", "__version__",
]


def compile_model(model, device=None, **options):
    """Compiles a whole model (an ONNX file / ModelProto, or a Relax IRModule) with every fused function
    scheduled, roller first; the options are :func:`roller.models.frontend.compile_model`'s (imports TVM on use)."""
    from roller.models.frontend import compile_model as _compile_model
    return _compile_model(model, device, **options)


def __getattr__(name):
    if name == "ops":  # imports TVM: only on first use
        from roller.tir import ops
        return ops
    if name == "JIT":  # (not imported with the package: `python -m roller.serve.jit` runs that module as a script)
        from roller.serve.jit import JIT
        return JIT
    raise AttributeError(name)
