"""Roller's own legalizations of Relax operators whose TOPI form roller cannot analyse.

A grouped convolution (ResNeXt, RegNet; not a depthwise one) in TOPI reads input channel
``k // (K/groups) * (C/groups) + c``: not affine in the output channel k, so roller's rule declined every
one (RegNet-Y-400MF: 7 functions to dlight.Reduction). Legalized with
:func:`roller.tir.ops.replicated_group_conv` instead, the convolution reads a per-output-channel copy of
its group's inputs at affine indices, the form roller's own grouped convolution has.
"""
from __future__ import annotations


def _ints(values) -> list[int]:
    return [int(v) for v in values]


def _conv2d(bb, call):
    """relax.nn.conv2d: a grouped NHWC/HWIO convolution with square stride, dilation and symmetric
    padding through roller's formulation; everything else through TVM's own legalization."""
    import tvm

    from roller.tir.ops import replicated_group_conv
    from roller.tir.teutil import _pad_hw, _zero

    a = call.attrs
    weight_shape = getattr(call.args[1].ty, "shape", None)
    groups = int(a.groups)
    stride, dilation, pad = _ints(a.strides), _ints(a.dilation), _ints(a.padding)
    plain = (groups == 1 or a.data_layout != "NHWC" or a.kernel_layout != "HWIO"
             or a.out_layout not in ("", "NHWC") or weight_shape is None or int(weight_shape[2]) == 1
             or len(set(stride)) != 1 or len(set(dilation)) != 1 or len(set(pad)) != 1)
    if plain:  # TOPI's, as registered (depthwise convolutions read affine indices there)
        return tvm.ir.Op.get("relax.nn.conv2d").get_attr("FLegalize")(bb, call)
    out_dtype = str(a.out_dtype) if str(a.out_dtype) not in ("", "None", "void") else str(call.args[0].ty.dtype)

    def compute(data, weight):
        src = _pad_hw(data, pad[0], _zero(str(data.dtype)))
        return replicated_group_conv(src, weight, groups, stride[0], dilation[0], out_dtype, name="group_conv2d")

    return bb.call_te(compute, call.args[0], call.args[1], primfunc_name_hint="group_conv2d")


def legalize_map() -> dict:
    """``relax.transform.LegalizeOps(customize_legalize_map=...)``'s map."""
    return {"relax.nn.conv2d": _conv2d}
