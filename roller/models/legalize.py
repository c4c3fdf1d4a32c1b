"""Roller's own legalizations of Relax operators whose TOPI form roller cannot analyse.

A grouped convolution (ResNeXt, RegNet; not a depthwise one) in TOPI reads input channel
``k // (K/groups) * (C/groups) + c``: not affine in the output channel k, so roller's rule declined every
one (RegNet-Y-400MF: 7 functions to dlight.Reduction). Legalized with
:func:`roller.tir.ops.grouped_conv_func` instead, the form roller's own grouped convolution has: a block
over the group and the channel within it as two axes (from 8 channels a group; the output stays NHWK),
or below that a per-output-channel copy of the group's inputs read at affine indices.
"""
from __future__ import annotations


def _ints(values) -> list[int]:
    return [int(v) for v in values]


def _conv2d(bb, call):
    """relax.nn.conv2d: a grouped NHWC/HWIO convolution with square stride, dilation and symmetric
    padding through roller's formulation; everything else through TVM's own legalization."""
    import tvm
    from tvm import relax, te

    from roller.tir.ops import grouped_conv_func
    from roller.tir.teutil import _pad_hw, _zero

    a = call.attrs
    weight_shape = getattr(call.args[1].ty, "shape", None)
    groups = int(a.groups)
    stride, dilation, pad = _ints(a.strides), _ints(a.dilation), _ints(a.padding)
    plain = (groups == 1 or a.data_layout != "NHWC" or a.kernel_layout != "HWIO"
             or a.out_layout not in ("", "NHWC") or weight_shape is None or int(weight_shape[2]) == 1
             or len(set(stride)) != 1 or len(set(dilation)) != 1 or len(set(pad)) != 1
             or not all(isinstance(d, tvm.tirx.IntImm) for arg in call.args[:2] for d in arg.ty.shape))
    if plain:  # TOPI's, as registered (depthwise convolutions read affine indices there)
        return tvm.ir.Op.get("relax.nn.conv2d").get_attr("FLegalize")(bb, call)
    out_dtype = str(a.out_dtype) if str(a.out_dtype) not in ("", "None", "void") else str(call.args[0].ty.dtype)
    data_ty, weight_ty = call.args[0].ty, call.args[1].ty
    data = te.placeholder(_ints(data_ty.shape), str(data_ty.dtype), name="data")
    weight = te.placeholder(_ints(weight_ty.shape), str(weight_ty.dtype), name="weight")
    src = _pad_hw(data, pad[0], _zero(str(data.dtype)))
    func = grouped_conv_func(data, weight, src, groups, stride[0], dilation[0], out_dtype, name="group_conv2d",
                             index_dtype="int64")
    gv = bb.add_func(func.without_attr("global_symbol"), "group_conv2d")
    return relax.call_tir(gv, list(call.args[:2]), relax.TensorType(call.ty.shape, out_dtype))


def legalize_map() -> dict:
    """``relax.transform.LegalizeOps(customize_legalize_map=...)``'s map."""
    return {"relax.nn.conv2d": _conv2d}
