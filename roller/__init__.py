"""roller: fast tensor kernels in seconds, by construction instead of search (Roller, OSDI'22), on TVM.

The policy (device, expr, rtile, model, construct) is plain Python and imports no compiler; TVM is
imported only when a function is analysed, scheduled, built or profiled.
"""
from .api import BuildResult, analyze, build, build_op, construct
from .device import Device, load_device
from .errors import (BuildError, CalibrationError, DeviceSpecError, InvalidShapeError, RollerError,
                     UnsupportedExpressionError)
from .expr import Expr, fuse_axes
from .rprogram import RProgram

__version__ = "0.1.0"

__all__ = [
    "BuildResult", "analyze", "build", "build_op", "construct", "Device", "load_device", "Expr", "fuse_axes",
    "RProgram", "RollerError", "DeviceSpecError", "UnsupportedExpressionError", "InvalidShapeError",
    "BuildError", "CalibrationError",
]


def __getattr__(name):
    if name == "ops":  # imports TVM: only on first use
        import importlib
        return importlib.import_module(".ops", __name__)
    raise AttributeError(name)
