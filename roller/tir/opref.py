"""The numpy references of roller's operators and the window geometry they share with the shape rules.

Each reference takes the inputs (widened to float64 or int64 by :meth:`roller.tir.ops.OpSpec.reference`)
and the operator's parameters, and computes the result the kernels are checked against; nothing here
needs TVM. ``conv_out_size`` and ``_conv_out`` give a window operator's output extents, which the TE
definitions, the shape rules and the references in :mod:`roller.tir.ops` all use.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

Shape = Mapping[str, int]
Params = Mapping[str, object]  # a full shape plus the options' values


def conv_out_size(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    """Output extent of a convolution along one spatial dimension (<= 0 when the kernel does not fit)."""
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


def _conv_out(s: Params) -> tuple[int, int]:
    """(OH, OW) of a window operator (pooling has no dilation key: 1)."""
    d = s.get("dilation", 1)
    return (conv_out_size(s["H"], s["R"], s["stride"], s["pad"], d),
            conv_out_size(s["W"], s["S"], s["stride"], s["pad"], d))


def _windows(data: np.ndarray, s: Params, fill=0):
    """Yields (r, q, view): for each kernel offset, the [N, OH, OW, C] input values it meets, the input
    padded with ``fill``."""
    p, st, d = s["pad"], s["stride"], s.get("dilation", 1)
    x = np.pad(data, ((0, 0), (p, p), (p, p), (0, 0)), constant_values=fill)
    oh, ow = _conv_out(s)
    for r in range(s["R"]):
        for q in range(s["S"]):
            yield r, q, x[:, r * d: r * d + (oh - 1) * st + 1: st, q * d: q * d + (ow - 1) * st + 1: st, :]


def _conv_reference(arrays, s: Params) -> np.ndarray:
    data, weight = arrays
    g, cg, kg = s["groups"], s["C"] // s["groups"], s["K"] // s["groups"]
    out = np.zeros((s["N"], *_conv_out(s), s["K"]), dtype=data.dtype)
    for r, q, view in _windows(data, s):
        for i in range(g):  # one matmul per group (and a single one without groups)
            out[..., i * kg:(i + 1) * kg] += view[..., i * cg:(i + 1) * cg] @ weight[r, q, :, i * kg:(i + 1) * kg]
    return out


def _depthwise_reference(arrays, s: Params) -> np.ndarray:
    data, weight = arrays
    out = np.zeros((s["N"], *_conv_out(s), s["C"]), dtype=data.dtype)
    for r, q, view in _windows(data, s):
        out += view * weight[r, q]
    return out


def _pool_reference(arrays, s: Params) -> np.ndarray:
    (data,) = arrays
    if s["kind"] == "max":
        low = -np.inf if data.dtype.kind == "f" else np.iinfo(data.dtype).min
        return np.maximum.reduce([view for _, _, view in _windows(data, s, fill=low)])
    return sum(view for _, _, view in _windows(data, s)) / (s["R"] * s["S"])


def _nhwc(s: Params) -> tuple[int, ...]:
    return (s["N"], s["H"], s["W"], s["C"])


def _window_points(s: Params) -> int:
    """Output points times window size: the multiply-adds of a depthwise convolution, per channel."""
    return s["N"] * math.prod(_conv_out(s)) * s["R"] * s["S"]
