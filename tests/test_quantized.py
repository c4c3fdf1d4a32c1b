"""Quantized graphs (onnxruntime.quantization's): every output against onnxruntime's on the same quantized
graph. The integer parts (MatMulInteger, the quantizers) must agree exactly on equal inputs; whole models'
float outputs within roller.models.frontend.QUANTIZED_TOLERANCE (one rounding step moved by float noise
cascades: see its comment). The integer matmuls must read their 8-bit operands and be roller's kernels
(roller.models.quantized), with VNNI's dot-product lanes where the host has them (roller.plan.dot)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime.quantization")

import onnx_models  # noqa: E402

import roller  # noqa: E402
from roller.models import frontend  # noqa: E402
from roller.plan.dot import has_vnni  # noqa: E402


def _run_both(model, device):
    cm = roller.compile_model(model, device)
    feeds = cm.random_inputs()
    ref = frontend.onnxruntime_session(model, device.units.count).run(None, feeds)
    return cm, cm.run(feeds), ref


def _integer_matmul_params(cm) -> list[tuple[str, list[str]]]:
    """(function name, its parameters' dtypes) of each fused function holding an int32 matmul."""
    import tvm

    out = []
    for gv, f in cm.module.functions_items():
        if isinstance(f, tvm.tirx.PrimFunc) and "matmul" in gv.name_hint:
            dtypes = [str(p.dtype) for p in f.params]
            if "int32" in dtypes:
                out.append((gv.name_hint, dtypes))
    return out


@pytest.mark.parametrize("case", ["s8", "s8-za", "s8-zb-per-column", "u8-zb128", "u8-wide"])
def test_matmul_integer_exact(case, device):
    """MatMulInteger alone, int32 out: exactly onnxruntime's. Where b - zb fits 8 bits the matmul reads
    uint8 x int8/uint8 and roller schedules it; "u8-wide" (b - zb spans -255..255) keeps the importer's
    widened int32 matmul, still exact."""
    rng = np.random.default_rng(1)
    k, n = 40, 48
    if case.startswith("s8"):
        w = rng.integers(-120, 121, (k, n)).astype(np.int8)  # b - zb within int8
        zb = {"s8": None, "s8-za": None, "s8-zb-per-column": rng.integers(-3, 4, n)}[case]
    else:
        w = rng.integers(0, 256, (k, n)).astype(np.uint8)
        zb = 128 if case == "u8-zb128" else 250
    model = onnx_models.matmul_integer(w, zb, za=case != "s8")
    cm, ours, ref = _run_both(model, device)
    assert ours[0].dtype == np.int32
    np.testing.assert_array_equal(ours[0], ref[0])
    funcs = _integer_matmul_params(cm)
    assert funcs, [r.name for r in cm.report]
    narrowed = any({"uint8", "int8"} & set(d) for _, d in funcs)  # the widened matmul takes int32 only
    assert narrowed == (case != "u8-wide"), funcs
    by = {r.name: r.scheduled_by for r in cm.report}
    assert all(by[name] == "roller" for name, _ in funcs), by
    if case.startswith("s8"):  # u8 x s8: VNNI's dot-product lanes where the host has them (tests/test_vnni.py)
        assert _dot_depths(cm, funcs) == {4 if has_vnni(device) else 1}


def _dot_depths(cm, funcs) -> set[int]:
    """The plans' dot depths (roller.plan.dot) of these functions."""
    plans = {r.name: r.plan or {} for r in cm.report}
    return {plans[name].get("dot_depth") for name, _ in funcs}


def test_dynamic_quantized_transformer(device):
    """quantize_dynamic's transformer block (DynamicQuantizeLinear, MatMulInteger, float rescales): outputs
    and its quantized activations equal onnxruntime's; every MatMulInteger is a roller kernel reading uint8
    activations and int8 weights."""
    import onnx

    q = onnx_models.quantized_dynamic(onnx_models.transformer_block(seq=16, dim=32, heads=2, hidden=64))
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= {n.op_type for n in q.graph.node}
    q = onnx.shape_inference.infer_shapes(q)
    info = {v.name: v for v in q.graph.value_info}
    quantized = [n.output[0] for n in q.graph.node if n.op_type == "DynamicQuantizeLinear"]
    q.graph.output.extend(info[n] for n in quantized)  # the uint8 activations: exact
    cm, ours, ref = _run_both(q, device)
    for name, a, b in zip(["y", *quantized], ours, ref):
        if a.dtype == np.uint8:
            np.testing.assert_array_equal(a, b, err_msg=name)
    check = frontend.compare(ours[:1], ref[:1])  # the float output: at the float tolerance, this small
    assert check["matches"], check
    funcs = _integer_matmul_params(cm)
    assert len(funcs) >= 4 and all("uint8" in d and "int8" in d for _, d in funcs), funcs
    by = {r.name: r.scheduled_by for r in cm.report}
    assert all(by[name] == "roller" for name, _ in funcs), by
    assert _dot_depths(cm, funcs) == {4 if has_vnni(device) else 1}
    result = frontend.check_against_onnxruntime(cm, q, time_it=False)
    assert result["matches"] and result["tolerance"]["quantized_graph"], result


@pytest.mark.parametrize("channels,per_channel,dot", [(8, False, True), (16, True, True), (16, True, False)])
def test_qdq_cnn(device, channels, per_channel, dot):
    """quantize_static's QDQ CNN (QuantizeLinear / DequantizeLinear around every conv, pool, add, gemm): its
    dequantized output within one step of the output's quantization scale of onnxruntime's. On a device
    with VNNI (``dot``) every convolution is an integer kernel on the uint8 activation and the int8 weight
    (roller.models.qdq), with dot-product lanes where the channels allow (16 out); without (the
    host's target with its VNNI features removed) they compute in float32."""
    import dataclasses

    from onnx import numpy_helper

    if not dot:
        mattr = [f for f in device.target.get("mattr", ()) if "vnni" not in f]
        device = dataclasses.replace(device, target={**device.target, "mattr": mattr})
    elif not has_vnni(device):
        pytest.skip("this host has no VNNI: its QDQ convolutions compute in float32 (the dot=False case)")
    q = onnx_models.quantized_qdq(onnx_models.small_cnn(size=16, channels=channels), per_channel=per_channel)
    ops = {n.op_type for n in q.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops
    last = next(n for n in q.graph.node if n.output[0] == q.graph.output[0].name)
    assert last.op_type == "DequantizeLinear"
    scale = float(numpy_helper.to_array(next(i for i in q.graph.initializer if i.name == last.input[1])))
    cm, ours, ref = _run_both(q, device)
    assert float(np.max(np.abs(ours[0] - ref[0]))) <= scale * 1.001
    assert all(r.scheduled_by != "none" for r in cm.report)
    convs = _integer_conv_params(cm)
    assert len(convs) == sum(n.op_type == "Conv" for n in q.graph.node), convs
    integer = [(name, d) for name, d in convs if {"uint8", "int8"} <= set(d)]
    assert len(integer) == (len(convs) if dot else 0), convs
    by = {r.name: r.scheduled_by for r in cm.report}
    assert all(by[name] == "roller" for name, _ in convs), by
    if dot and channels % 16 == 0:  # every one, the image's 3 channels padded to 4 (whole dot steps)
        assert _dot_depths(cm, convs) == {4}, [(r.name, (r.plan or {}).get("dot_depth")) for r in cm.report]


def test_qdq_conv_after_conv_pads_apart(device):
    """A QDQ convolution whose input (another convolution's output) has a nonzero zero point: its padding
    (the zero point) is a function of its own, not the first convolution's epilogue (which roller's rule
    would decline: roller.models.fusion_barriers); every function roller's, the output within a step."""
    from onnx import numpy_helper

    q = onnx_models.quantized_qdq(onnx_models.conv_chain(), per_channel=True)
    cm, ours, ref = _run_both(q, device)
    last = next(n for n in q.graph.node if n.output[0] == q.graph.output[0].name)
    scale = float(numpy_helper.to_array(next(i for i in q.graph.initializer if i.name == last.input[1])))
    assert float(np.max(np.abs(ours[0] - ref[0]))) <= scale * 1.001
    assert {r.scheduled_by for r in cm.report} == {"roller"}, [(r.name, r.declined) for r in cm.report]
    if has_vnni(device):
        assert any("pad" in r.name and "conv2d" not in r.name for r in cm.report), [r.name for r in cm.report]


def _integer_conv_params(cm) -> list[tuple[str, list[str]]]:
    """(function name, its parameters' dtypes) of each fused function holding a convolution."""
    import tvm

    return [(gv.name_hint, [str(p.dtype) for p in f.params]) for gv, f in cm.module.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and "conv2d" in gv.name_hint]


def test_narrowing_leaves_other_matmuls(device):
    """A float graph has no integer matmul: the pass changes nothing."""
    from roller.models.frontend import import_onnx, onnx_inputs
    from roller.models.quantized import narrow_integer_matmuls

    model = onnx_models.transformer_block(seq=8, dim=16, heads=2, hidden=32)
    mod = import_onnx(model, onnx_inputs(model))
    _, count = narrow_integer_matmuls(mod)
    assert count == 0
