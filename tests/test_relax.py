"""Whole models through Relax (roller.models.frontend, roller.compile_model, `roller compile`): outputs
against onnxruntime, the model's layout and exact math, a Relax module as input, shape nodes folded before
import, the torch.export path, and the command line with bad models and inputs.

The rule chain and its reports: tests/test_relax_rules.py; one kind of fused function at a time against
numpy, and profiling in models: tests/test_relax_functions.py."""
from __future__ import annotations

import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import roller  # noqa: E402
from roller import cli
from roller.models import frontend
from roller.tir.compile import target_for  # noqa: E402

import onnx_models  # noqa: E402  (tests/ is on sys.path under pytest)
from relax_helpers import _graph  # noqa: E402

pytestmark = pytest.mark.build


def _scheduled_by(cm) -> dict[str, str]:
    return {r.name: r.scheduled_by for r in cm.report}


# ---------------------------------------------------------------------------------------------
# Whole models against onnxruntime

@pytest.fixture(scope="module")
def cnn(device):
    model = onnx_models.small_cnn()
    return model, roller.compile_model(model, device)


@pytest.fixture(scope="module")
def transformer(device):
    model = onnx_models.transformer_block()
    return model, roller.compile_model(model, device)


def test_small_cnn_matches_onnxruntime(cnn):
    model, cm = cnn
    check = frontend.check_against_onnxruntime(cm, model, time_it=False)
    assert check["matches"], check
    assert check["max_abs_error"] < 1e-3
    by = _scheduled_by(cm)
    assert "none" not in by.values()
    convs = [n for n in by if "conv2d" in n]
    assert len(convs) == 4 and all(by[n] == "roller" for n in convs), by
    # pooling, global mean, the classifier and the batch norm + ReLU go through roller too
    assert by["max_pool2d"] == by["mean"] == "roller", by
    assert all(by[n] == "roller" for n in by if "matmul" in n or "batch_norm" in n), by


def test_transformer_block_matches_onnxruntime(transformer):
    model, cm = transformer
    check = frontend.check_against_onnxruntime(cm, model, time_it=False)
    assert check["matches"], check
    by = _scheduled_by(cm)
    assert "none" not in by.values()
    assert all(by[n] == "roller" for n in by if "matmul" in n), by  # QKV, scores, GELU MLP, residuals
    assert by["fast_softmax"] == by["layer_norm"] == "roller", by  # several reductions, row by row
    gelu = next(r for r in cm.report if "erf" in r.name)
    assert gelu.plan and gelu.plan["tiles"], gelu


def test_small_cnn_in_the_models_nchw_layout(device):
    model = onnx_models.small_cnn(size=16)
    cm = roller.compile_model(model, device, layout="NCHW")
    assert frontend.check_against_onnxruntime(cm, model, time_it=False)["matches"]
    by = _scheduled_by(cm)
    assert all(by[n] == "roller" for n in by if "conv2d" in n) and not any("transpose" in n for n in by), by


def test_exact_math_matches_onnxruntime(device):
    model = onnx_models.transformer_block()
    cm = roller.compile_model(model, device, fast_math=False)
    assert frontend.check_against_onnxruntime(cm, model, time_it=False)["matches"]
    names = [r.name for r in cm.report]
    assert "softmax" in names and any("_erf_" in n for n in names) and not any("fast" in n for n in names), names


def test_relax_module_input(device):
    """A Relax IRModule (what from_exported_program gives) compiles like an ONNX model."""
    model = onnx_models.small_cnn(size=16)
    mod = frontend.import_onnx(model, frontend.onnx_inputs(model))
    cm = roller.compile_model(mod, device, name="cnn_relax")
    assert cm.inputs == {"x": ((1, 3, 16, 16), "float32")}
    feeds = cm.random_inputs()
    reference = frontend.onnxruntime_session(model, 1).run(None, feeds)
    assert frontend.compare(cm.run(feeds), reference)["matches"]
    with pytest.raises(roller.ModelError, match="--input only with an ONNX model"):
        roller.compile_model(mod, device, inputs={"x": (1, 3, 16, 16)})


def test_other_seed_still_matches(transformer):
    model, cm = transformer
    assert frontend.check_against_onnxruntime(cm, model, seed=7, time_it=False)["matches"]


# ---------------------------------------------------------------------------------------------
# Shape nodes folded before import

def test_shape_chains_are_folded_before_import(device):
    """A channel split whose Slice bounds come from Shape -> Gather -> Div (PyTorch's chunk) failed to
    legalize unfolded; folded by onnxruntime first it compiles, matches, and the report says so."""
    from roller.models.relax_steps import legalize_and_fuse

    model = onnx_models.chunk_shuffle()
    specs = frontend.onnx_inputs(model)
    with pytest.raises(AssertionError, match="ShapeExpr"):  # TVM's importer alone: the reason for the fold
        legalize_and_fuse(frontend.import_onnx(model, specs), target_for(device), "NHWC", True)
    cm = roller.compile_model(model, device)
    assert cm.folded and "folded by onnxruntime" in cm.folded and "0 shape nodes left" in cm.folded
    assert cm.to_dict()["graph_folded"] == cm.folded
    assert frontend.check_against_onnxruntime(cm, model, time_it=False)["matches"]


def test_scalar_constant_of_shape_is_folded(device):
    """ConstantOfShape of an empty shape (a scalar: GPT-2's exported mask) fails in TVM's converter;
    folded first, the model compiles and matches."""
    shape = numpy_helper.from_array(np.zeros((0,), np.int64), "empty")
    value = numpy_helper.from_array(np.array([2.5], np.float32), "value")
    nodes = [helper.make_node("ConstantOfShape", ["empty"], ["c"], value=value),
             helper.make_node("Mul", ["x", "c"], ["y"])]
    model = _graph(nodes, {"x": (2, 8)}, (2, 8))
    model.graph.initializer.append(shape)
    specs = frontend.onnx_inputs(model)
    with pytest.raises(roller.errors.ModelError, match="ConstantOfShape"):  # TVM's converter alone
        frontend.import_onnx(model, specs)
    cm = roller.compile_model(model, device)
    assert "ConstantOfShape 1" in cm.folded
    assert frontend.check_against_onnxruntime(cm, model, time_it=False)["matches"]


def test_graphs_without_shape_nodes_are_imported_as_they_are(cnn, device):
    model, cm = cnn
    assert cm.folded is None
    assert frontend.fold_shapes(model, frontend.onnx_inputs(model)) == (model, None)


def test_symbolic_input_is_folded_at_the_given_shape(device):
    """fold_shapes sets the shapes being compiled for before folding: a Shape of a symbolic input folds."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["r"]),
             helper.make_node("Relu", ["r"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folded, note = frontend.fold_shapes(model, {"x": ((3, 8), "float32")})
    assert "0 shape nodes left" in note
    assert [d.dim_value for d in folded.graph.input[0].type.tensor_type.shape.dim] == [3, 8]
    cm = roller.compile_model(model, device, inputs={"x": (3, 8)})
    assert frontend.check_against_onnxruntime(cm, model, time_it=False)["matches"]


# ---------------------------------------------------------------------------------------------
# roller compile: the command line

def _relu_model(shape=("N", 8)):
    return _graph([helper.make_node("Relu", ["x"], ["y"])], {"x": shape}, shape)


def test_cli_json_and_library(tmp_path, capsys):
    import tvm
    from tvm import relax

    path = tmp_path / "cnn.onnx"
    onnx.save(onnx_models.small_cnn(size=16, channels=8), str(path))
    rc = cli.main(["compile", str(path), "--no-profile", "--json", "--out", str(tmp_path / "out")])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0
    for key in ("model", "device", "compile_seconds", "latency_seconds", "onnxruntime_latency_seconds",
                "onnxruntime_over_roller", "max_abs_error", "max_rel_error", "matches", "functions"):
        assert key in report, key
    assert report["matches"] is True and report["latency_seconds"] > 0 and report["onnxruntime_latency_seconds"] > 0
    assert all({"name", "scheduled_by", "seconds"} <= set(f) for f in report["functions"])
    assert any(f["scheduled_by"] == "roller" for f in report["functions"])
    # the saved library runs in a VirtualMachine and gives onnxruntime's answer
    lib = tvm.runtime.load_module(report["saved"]["library"])
    vm = relax.VirtualMachine(lib, tvm.cpu())
    x = np.random.default_rng(3).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)
    ours = vm["main"](tvm.runtime.tensor(x, tvm.cpu())).numpy()
    import onnxruntime as ort
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-3, atol=1e-3)


def test_cli_symbolic_input_given(tmp_path, capsys):
    path = tmp_path / "relu.onnx"
    onnx.save(_relu_model(), str(path))
    assert cli.main(["compile", str(path), "--input", "x=3x8", "--no-profile"]) == 0
    out = capsys.readouterr().out
    assert "matches onnxruntime" in out and "yes" in out
    assert "x faster" in out or "x slower" in out  # which engine was faster, by how much


def _bad_models(tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not a protobuf \x00\xff\x17")
    dft = tmp_path / "dft.onnx"
    onnx.save(_graph([helper.make_node("DFT", ["x"], ["y"])], {"x": (1, 4, 2)}, (1, 4, 2)), str(dft))
    relu = tmp_path / "relu.onnx"
    onnx.save(_relu_model(), str(relu))
    return {
        "does not parse": ([str(junk)], "not a readable ONNX model"),
        "missing file": ([str(tmp_path / "none.onnx")], "no such file"),
        "unsupported operator": ([str(dft)], "DFT"),
        "symbolic, no --input": ([str(relu)], "--input x="),
        "unknown input name": ([str(relu), "--input", "z=2x8"], "no input named 'z'"),
        "wrong shape": ([str(relu), "--input", "x=2x9"], "does not fit"),
        "wrong rank": ([str(relu), "--input", "x=2x8x1"], "does not fit"),
        "malformed --input": ([str(relu), "--input", "x=2by8"], "expected NAME=DIMxDIMx"),
    }


@pytest.mark.parametrize("what", ["does not parse", "missing file", "unsupported operator", "symbolic, no --input",
                                  "unknown input name", "wrong shape", "wrong rank", "malformed --input"])
def test_cli_bad_input_one_line(what, tmp_path, capsys):
    argv, expected = _bad_models(tmp_path)[what]
    rc = cli.main(["compile", *argv, "--no-profile"])
    err = capsys.readouterr().err
    assert rc != 0
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("roller: error:"), err
    assert expected in lines[0] and "Traceback" not in err


def test_cli_importer_failure_is_one_line_naming_the_node(tmp_path, capsys):
    """A graph TVM's importer raises on (not an OpError): one line naming the ONNX node, nothing on stdout."""
    bad = tmp_path / "matmul.onnx"
    # a 1x8 input times a 5x3 weight: the shapes disagree, which TVM's MatMul converter raises on
    onnx.save(_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")], {"x": (1, 8)}, (1, 3),
                     inits=[("w", np.ones((5, 3)))]), str(bad))
    rc = cli.main(["compile", str(bad), "--no-profile", "--json"])
    out, err = capsys.readouterr()
    assert rc != 0 and out == ""
    lines = [ln for ln in err.splitlines() if ln.strip() and "Warning" not in ln]
    assert len(lines) == 1 and lines[0].startswith("roller: error: TVM's ONNX importer failed at ONNX node "
                                                   "MatMul 'proj'"), err
    assert "internal error" not in err and "Traceback" not in err


def test_cli_legalization_failure_is_one_line_naming_the_operator(tmp_path, capsys, monkeypatch):
    """The channel split unfolded (as without onnxruntime's folding) fails in TVM's legalization of a
    reshape: a ModelError naming it, not 'roller: internal error'."""
    path = tmp_path / "shuffle.onnx"
    onnx.save(onnx_models.chunk_shuffle(), str(path))
    monkeypatch.setattr(frontend, "fold_shapes", lambda proto, inputs: (proto, None))
    rc = cli.main(["compile", str(path), "--no-profile"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and "Warning" not in ln]
    assert rc != 0 and len(lines) == 1, err
    assert lines[0].startswith("roller: error: legalizing and fusing the model") and "reshape" in lines[0], err
    assert "internal error" not in err


# ---------------------------------------------------------------------------------------------
# PyTorch: torch.export -> Relax -> roller (skipped where torch is not importable: CI does not install it)

def test_torch_export_path(device):
    torch = pytest.importorskip("torch", reason="torch is not installed (optional: the torch.export path)")
    from tvm.relax.frontend.torch import from_exported_program

    class Net(torch.nn.Module):
        """conv + ReLU, global pool, layer norm, linear, softmax: convs, row-wise and matmul functions."""

        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
            self.norm = torch.nn.LayerNorm(16)
            self.fc = torch.nn.Linear(16, 10)

        def forward(self, x):
            h = torch.relu(self.conv(x)).mean((2, 3))
            return torch.softmax(self.fc(self.norm(h)), -1)

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(1, 3, 12, 12)
    with torch.no_grad():
        want = net(x).numpy()
        mod = from_exported_program(torch.export.export(net, (x,)))
    cm = roller.compile_model(mod, device, name="torch_net")
    (got,) = cm.run({name: x.numpy() for name in cm.inputs})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    by = _scheduled_by(cm)
    assert "none" not in by.values()
    assert any("conv2d" in n and r == "roller" for n, r in by.items()), by
    assert any("softmax" in n and r == "roller" for n, r in by.items()), by


def test_squeeze_excitation_block_matches_onnxruntime(device):
    """EfficientNet's MBConv: SiLU's sigmoid becomes 1 / (1 + fast_exp(-x)) (a scalar libm exp per lane
    made these convolutions 3-8x slower), and the outputs still match at O(1) scale; the excitation's
    multiply of the feature map by the gate is kept out of the gate's convolution (fused, roller declined
    it and dlight.Reduction took it), so every convolution and the multiply are roller kernels."""
    model = onnx_models.mbconv_se(size=12)
    cm = roller.compile_model(model, device, cache=False)
    check = frontend.check_against_onnxruntime(cm, model, time_it=False)
    assert check["matches"], check
    names = [r.name for r in cm.report]
    assert not any("sigmoid" in n for n in names) and any("fast_exp" in n for n in names), names
    by = _scheduled_by(cm)
    assert all(by[n] == "roller" for n in by if "conv2d" in n or "multiply" in n), by
    assert sum(n.endswith("_apart") for n in by) == 1, by  # the excitation's multiply, on its own


@pytest.mark.parametrize("groups", [6, 2, 12])
def test_grouped_convolution_is_a_roller_kernel(device, groups):
    """TOPI's grouped convolution reads input channel k // (K/groups) * (C/groups) + c, which roller cannot
    analyse (RegNet's went to dlight.Reduction); roller.models.legalize gives it affine indices, as the operator
    conv2d has them: 8 and 24 channels a group iterate the group and the channel within it as two axes, the
    bias + ReLU epilogue reading the merged channel; 4 a group (12 groups) copy each group's inputs per output
    channel."""
    model = onnx_models.grouped_conv(groups=groups)
    cm = roller.compile_model(model, device, cache=False)
    check = frontend.check_against_onnxruntime(cm, model, time_it=False)
    assert check["matches"], check
    by = _scheduled_by(cm)
    assert [by[n] for n in by if "group_conv2d" in n] == ["roller"], by


def test_index_arithmetic_on_static_shapes_is_folded_before_legalization():
    """PyTorch's exporter computes Gather indices from shapes (ViT: shape_of -> shape_to_tensor -> take,
    where(i < 0, i + n, i)); folded with numpy they leave no kernel for FoldConstant to build (ViT's 148
    such kernels took 4 s)."""
    import tvm
    from tvm import relax

    from roller.models.relax_steps import _fold_layout_constants

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3, 5, 7), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            dims = bb.emit(relax.op.shape_to_tensor(bb.emit(relax.op.shape_of(x))))
            i = relax.const(-1, "int64")
            fixed = bb.emit(relax.op.where(relax.op.less(i, relax.const(0, "int64")), relax.op.add(i, relax.const(3, "int64")), i))
            n = bb.emit(relax.op.take(dims, fixed, axis=0))
            out = bb.emit_output(relax.op.add(relax.op.astype(n, "float32"), x))
        bb.emit_func_output(out)
    folded = _fold_layout_constants(bb.get(), None)
    calls = {b.value.op.name: b.value for blk in folded["main"].body.blocks for b in blk.bindings
             if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)}
    # (the shape_of left unused goes at DeadCodeElimination)
    assert set(calls) <= {"relax.shape_of", "relax.astype", "relax.add"}, calls
    bound = {b.var: b.value for blk in folded["main"].body.blocks for b in blk.bindings}
    value = bound.get(calls["relax.astype"].args[0], calls["relax.astype"].args[0])
    assert isinstance(value, tvm.ir.expr.Constant) and int(value.value.numpy()) == 7, value


def test_threads_switch_quickly_while_functions_compile_and_as_before_after():
    """Scheduling and compiling in threads lowers the interpreter's switch interval (compile threads wait
    less for the GIL) and restores the caller's once the last such block ends, nested or not."""
    import sys

    from roller.models.relax_pass import SWITCH_INTERVAL_SECONDS, quick_thread_switches

    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.004)
        slow = sys.getswitchinterval()
        with quick_thread_switches():
            quick = sys.getswitchinterval()
            assert abs(quick - SWITCH_INTERVAL_SECONDS) < 1e-5
            with quick_thread_switches():
                assert sys.getswitchinterval() == quick
            assert sys.getswitchinterval() == quick  # the outer block still runs
        assert sys.getswitchinterval() == slow
        sys.setswitchinterval(SWITCH_INTERVAL_SECONDS / 10)  # never slower than the caller had it
        low = sys.getswitchinterval()  # as the interpreter holds it (in its own units)
        with quick_thread_switches():
            assert sys.getswitchinterval() == low < SWITCH_INTERVAL_SECONDS
        assert sys.getswitchinterval() == low
    finally:
        sys.setswitchinterval(before)
