"""TE building blocks the operator definitions of :mod:`roller.tir.ops` share.

The multiply in the accumulation type, the zero-padding stage ``pad_temp``, a kernel window's reduction
axes and pixel, and the layout merge of a grouped convolution's output. TVM is imported inside each
function: the policy half of roller must not need it.
"""
from __future__ import annotations


def _mul_acc(a, b, out_dtype: str):
    """a * b in the accumulation type (casts only when it differs, so float ops stay cast-free)."""
    if str(a.dtype) != out_dtype:
        a, b = a.astype(out_dtype), b.astype(out_dtype)
    return a * b


def _pad_hw(data, pad: int, value):
    """``data`` (NHWC) padded by ``pad`` on H and W with ``value``, as its own stage ``pad_temp`` (code
    generation decides where to compute it; the analysis keeps it); ``data`` itself when ``pad == 0``."""
    from tvm import te, tirx

    if pad == 0:
        return data
    N, H, W, C = (int(d) for d in data.shape)
    return te.compute(
        (N, H + 2 * pad, W + 2 * pad, C),
        lambda n, h, w, c: tirx.if_then_else(
            tirx.all(h >= pad, h < H + pad, w >= pad, w < W + pad), data[n, h - pad, w - pad, c], value),
        name="pad_temp")


def _window(src, R: int, S: int, stride: int, dilation: int = 1):
    """The reduction axes (r, s) of an R x S kernel window and ``pixel(n, h, w, c)``: the value of ``src``
    (the padded input) that offset (r, s) of the window of output point (h, w) meets."""
    from tvm import te

    r, s = te.reduce_axis((0, R), name="r"), te.reduce_axis((0, S), name="s")

    def pixel(n, h, w, c):
        return src[n, h * stride + r * dilation, w * stride + s * dilation, c]

    return r, s, pixel


def _zero(dtype: str):
    from tvm import tirx

    return tirx.const(0, dtype)


def _merge_last_two(func, block: str, inner: int):
    """``func`` with the buffer ``block`` writes stored with its last two dimensions (o, i) merged into one,
    index o * inner + i: the output keeps its plain layout while the block iterates both axes."""
    import tvm
    from tvm import s_tir

    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    sch.transform_layout(sch.get_sblock(block), ("write", 0), lambda *i: (*i[:-2], i[-2] * inner + i[-1]))
    return sch.mod["main"]
