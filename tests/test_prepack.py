"""Constant inputs packed once, at compile time (roller.plan.prepack): the layout's index maps and its numpy
packing agree, the model charges no copy for a prepacked input, and a whole model whose convolution
weight is prepacked matches onnxruntime with a kernel that has no pack stage."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import roller
from roller.tir import ops
from roller.builder.api import analyze
from roller.targets import construct
from roller.errors import BuildError
from roller.plan.prepack import PackedLayout
from roller.models.constants import _tir_calls
from roller.plan.tails import copy_bytes
from roller.tir.layout import index_maps, pack_constant


@pytest.mark.parametrize("layout", [
    PackedLayout((3, 3, 8, 20), ((3, 3, 8, 8),), ((0, 1, 2, 3), (0, 1, 2, 3))),      # tiles overhang 20 by 8
    PackedLayout((6, 10), ((4, 10),), ((0, 1), (1, 0))),                          # transposed within a tile
    PackedLayout((5, 12), ((5, 8),), ((0, 1), (0, 1)), row_pad=3),                # padded rows
    PackedLayout((3, 8, 20), ((3, 8, 12), (1, 4, 4), (1, 2, 4)),                  # three levels of blocks
                 ((0, 1, 2), (2, 0, 1), (0, 1, 2), (2, 1, 0))),
    PackedLayout((8, 6), ((8, 6), (4, 3)), ((0, 1), (1, 0), (1, 0)), row_pad=2),  # transposed, padded rows
    PackedLayout((16, 32), ((16, 32), (4, 16)), ((0, 1), (1, 0), (0, 1)), dot=4, dot_dim=0),  # [k/4, n, 4]
    PackedLayout((24, 32), ((8, 32), (8, 16)), ((0, 1), (1, 0), (0, 1)), dot=4, dot_dim=0),  # 2 dot steps a tile
])
def test_layout_apply_follows_its_index_maps(layout):
    src = np.arange(1, np.prod(layout.shape) + 1, dtype=np.float32).reshape(layout.shape)
    dst = pack_constant(layout, src)
    seen = np.zeros(dst.shape, bool)
    for idx in itertools.product(*map(range, layout.shape)):
        at = list(idx)
        for m in index_maps(layout):
            at = [int(i) for i in m.map_indices(at)]
        assert dst[tuple(at)] == src[idx]
        seen[tuple(at)] = True
    assert not dst[~seen].any()  # padding is zero
    outer = (layout.shape,) + layout.tiles
    single = layout.dot > 1 and layout.tiles[-1][layout.dot_dim] == layout.dot  # one dot step a tile: no index
    assert dst.ndim == (sum(t < o for tile, up in zip(layout.tiles, outer) for t, o in zip(tile, up))
                        + len(layout.shape) + bool(layout.row_pad) + (layout.dot > 1) - single)
    assert type(layout).from_dict(layout.to_dict()) == layout


def test_layout_apply_rejects_another_shape():
    with pytest.raises(BuildError, match="shape"):
        pack_constant(PackedLayout((4, 4), ((2, 4),), ((0, 1), (0, 1))), np.zeros((4, 5), np.float32))


def test_constant_weight_is_prepacked_and_not_charged(device):
    expr, _ = analyze(ops.conv2d_nhwc(1, 14, 14, 64, 128, 3, 3, pad=1))
    plain = next(p for p in construct(expr, device, 10).programs if "weight" in p.packed)  # a plan packing it
    assert not plain.prepacked
    plan = construct(expr, device, 1, frozenset({"weight"})).programs[0]
    assert plan.prepacked == ("weight",)
    assert "prepacked" in plan.to_dict() and type(plan).from_dict(plan.to_dict()).key == plan.key
    # a pack that top tiles re-copy is charged, unless it arrives packed
    top = dict(plan.tiles[-1], h=7)
    assert copy_bytes(expr, top, (), ("weight",), (), ("weight",)) < copy_bytes(expr, top, (), ("weight",))


def test_kernel_reads_the_prepacked_weight(device):
    import tvm

    from roller.targets import schedule
    from roller.plan.prepack import program_layouts
    from roller.tir.compile import target_for

    func = ops.conv2d_nhwc(1, 14, 14, 64, 128, 3, 3, pad=1)
    expr, norm = analyze(func)
    plan = construct(expr, device, 1, frozenset({"weight"})).programs[0]
    assert plan.prepacked == ("weight",)
    sch = schedule(norm, expr, plan, device)
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert not any(n.startswith("weight_") and "assumptions" not in n for n in names), names  # no pack stage
    layout = program_layouts(expr, plan, device)["weight"]
    weight = next(p for p in sch.mod["main"].params if str(p.name) == "weight")
    assert [int(d) for d in weight.shape] == list(pack_constant(layout, np.zeros(layout.shape, np.float32)).shape)
    rng = np.random.default_rng(0)
    args = [rng.uniform(-1, 1, [int(d) for d in p.shape]).astype(np.float32) for p in norm.params]
    want = ops.get_op("conv2d").reference(args[:2], dict(N=1, H=14, W=14, C=64, K=128, R=3, S=3, pad=1))
    ex = tvm.compile(sch.mod, target_for(device))
    dev = tvm.cpu()
    out = tvm.runtime.empty(want.shape, "float32", dev)
    ex["main"](tvm.runtime.tensor(args[0], dev), tvm.runtime.tensor(pack_constant(layout, args[1]), dev), out)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)


def test_cache_key_tells_prepacked_signatures_apart(device):
    from roller.models.function_cache import function_key

    func = ops.conv2d_nhwc(1, 8, 8, 32, 64, 3, 3, pad=1)
    assert function_key(func, device, False)[0] != function_key(func, device, False, frozenset({"weight"}))[0]


def _two_convs():
    """An ONNX model: two 3x3 convolutions of 32 channels on 12x12, each with its own weight, and ReLUs."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [rng.normal(0, 0.1, (32, 32, 3, 3)).astype(np.float32) for _ in range(2)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 12, 12])],
        initializer=[numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)]),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.mark.build
def test_cli_says_what_is_prepacked(tmp_path, capsys):
    import json

    import onnx

    from roller import cli

    path = tmp_path / "convs.onnx"
    onnx.save(_two_convs(), str(path))
    assert cli.main(["compile", str(path), "--no-profile"]) == 0
    assert "(prepacked " in capsys.readouterr().out
    assert cli.main(["compile", str(path), "--no-profile", "--no-prepack", "--json"]) == 0
    assert not any(f["prepacked"] for f in json.loads(capsys.readouterr().out)["functions"])


@pytest.mark.build
@pytest.mark.parametrize("cache", [False, True])
def test_conv_model_with_prepacked_weights_matches_onnxruntime(device, cache):
    """Two convolutions of one shape with their own weights (one function, or two identical ones built
    once): each call gets its weight packed, the kernel reads it packed, the outputs match onnxruntime."""
    from roller.models import frontend

    model = _two_convs()
    cm = roller.compile_model(model, device, cache=cache, verify=not cache)  # verify: checked packed, too
    convs = [r for r in cm.report if "conv2d" in r.name]
    assert convs and all(r.scheduled_by == "roller" and r.prepacked for r in convs), convs
    calls = [(gv.name_hint, c) for gv, c in _tir_calls(cm.module) if "conv2d" in gv.name_hint]
    assert len(calls) == 2
    by_name = {r.name: r for r in convs}
    for name, call in calls:
        func = cm.module[name]
        names = [str(p.name) for p in func.params]
        for param, layout in by_name[name].prepacked.items():
            shape = list(pack_constant(PackedLayout.from_dict(layout), np.zeros(layout["shape"], np.float32)).shape)
            assert [int(d) for d in func.params[names.index(param)].shape] == shape  # the kernel takes it packed
            assert list(call.args[1].fields[names.index(param)].value.shape) == shape  # the call passes it packed
    check = frontend.check_against_onnxruntime(cm, model, time_it=False)
    assert check["matches"], check
    if cache:  # from the cache, the layouts come with the kernels
        again = roller.compile_model(model, device)
        assert all(r.cache == "hit" for r in again.report if "conv2d" in r.name)
        assert [r.prepacked for r in again.report] == [r.prepacked for r in cm.report]
        assert frontend.check_against_onnxruntime(again, model, time_it=False)["matches"]
    unpacked = roller.compile_model(model, device, cache=cache, prepack=False)
    assert not any(r.prepacked for r in unpacked.report)
    assert frontend.check_against_onnxruntime(unpacked, model, time_it=False)["matches"]


def test_constant_params_only_where_every_call_passes_a_constant():
    from tvm import relax, te

    from roller.models.constants import constant_params

    def module(second):
        """``add`` (one PrimFunc, deduplicated by the builder) called twice: (x, constant), then (y, second(y))."""
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType((4,), "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                y = bb.emit_te(lambda a, b: te.compute((4,), lambda i: a[i] + b[i], name="c"), x,
                               relax.const(np.ones(4, np.float32)), primfunc_name_hint="add")
                z = bb.emit_output(bb.emit_te(lambda a, b: te.compute((4,), lambda i: a[i] + b[i], name="c"), y,
                                              second(y), primfunc_name_hint="add"))
            bb.emit_func_output(z)
        return bb.get()

    mod = module(lambda y: relax.const(np.zeros(4, np.float32)))
    (name,) = [gv.name_hint for gv in mod.get_global_vars() if gv.name_hint != "main"]
    params = [str(p.name) for p in mod[name].params]
    assert constant_params(mod) == {name: frozenset({params[1]})}
    mixed = module(lambda y: y)  # the second call passes a variable where the first passed a constant
    assert constant_params(mixed) == {name: frozenset()}


@pytest.mark.build
@pytest.mark.parametrize("enabled", [True, False])
def test_kernel_prefetches_the_next_top_tiles_weights(device, enabled):
    """A prepacked weight's next top-tile block is prefetched while a tile computes (roller.targets.cpu.prefetch)
    on a device where that pays (``model.software_prefetch_gain`` above 1; below, the plan prefetches nothing):
    the kernel carries the prefetches, outside the register tile's loop, and still matches numpy."""
    import tvm

    import dataclasses

    from roller.plan.choices import MIN_BLOCK_BYTES
    from roller.targets import schedule
    from roller.plan.prepack import program_layouts
    from roller.tir.compile import target_for

    shape = dict(N=1, H=7, W=7, C=256, K=512, R=1, S=1)
    func = ops.get_op("conv2d").make(shape)
    expr, norm = analyze(func)

    def with_gain(gain):  # this machine's calibration may have measured that prefetching does not pay here
        return dataclasses.replace(device, model=dataclasses.replace(device.model, software_prefetch_gain=gain))
    assert construct(expr, with_gain(0.97), 1, frozenset({"weight"})).programs[0].prefetched == ()
    device = with_gain(1.1)
    plan = construct(expr, device, 1, frozenset({"weight"})).programs[0]
    assert plan.prefetched == ("weight",)  # the plan decides (roller.plan.choices.prefetched_inputs)
    plan = dataclasses.replace(plan, prefetched=plan.prefetched if enabled else ())  # the A/B of the field
    layout = program_layouts(expr, plan, device)["weight"]
    assert layout.block_elements() * 4 >= MIN_BLOCK_BYTES
    text = schedule(norm, expr, plan, device).mod.script()
    assert ("llvm.prefetch" in text) == enabled
    rng = np.random.default_rng(0)
    args = [rng.uniform(-1, 1, [int(d) for d in p.shape]).astype(np.float32) for p in norm.params]
    want = ops.get_op("conv2d").reference(args[:2], shape)
    ex = tvm.compile(schedule(norm, expr, plan, device).mod, target_for(device))
    out = tvm.runtime.tensor(np.full(want.shape, np.nan, np.float32))
    ex["main"](tvm.runtime.tensor(args[0]), tvm.runtime.tensor(pack_constant(layout, args[1])), out)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)


def test_block_elements_counts_padded_rows():
    assert PackedLayout((6, 10), ((4, 10),), ((0, 1), (1, 0))).block_elements() == 40
    # rows of 8 padded by 3 to 11: a 5x8 top tile stores 5 rows of 11
    assert PackedLayout((5, 12), ((5, 8),), ((0, 1), (0, 1)), row_pad=3).block_elements() == 55


def test_a_scalar_constant_is_not_prepacked():
    """A 0-d constant input (an attention scale, say) has no layout to pack: packed_layout declines it. It
    raised the IndexError at ``row = sizes[last[-1]][-1]`` that issue 31 reports for BERT and DistilBERT."""
    from policy_exprs import acc, matmul

    from roller.plan.prepack import packed_layout, prepackable
    from roller.plan.expr import Expr

    e = matmul(64, 64, 64)
    scaled = Expr("matmul_scale", e.axes, e.inputs + (acc("s", ()),), e.output, zero_pad_axes=e.zero_pad_axes)
    tiles = [{"i": 4, "j": 16, "k": 1}, {"i": 16, "j": 64, "k": 64}, {"i": 64, "j": 64, "k": 64}]
    assert packed_layout(scaled, scaled.inputs[-1], tiles, "j", 16) is None
    assert "s" not in prepackable(scaled, tiles, "j", 16, (), frozenset({"B", "s"}))
