"""Row-wise functions with several reductions: roller's schedule against dlight's Reduction rule and
onnxruntime, timed alternately in one process.

    python3 scripts/bench_rows.py                 # softmax, layer norm, RMS norm at model sizes
    python3 scripts/bench_rows.py --cases softmax --rounds 7

Each case is one ONNX operator (random input), imported and fused by roller.models.frontend like a whole model;
its one fused PrimFunc is scheduled by roller's rule (roller.plan.rows) and by dlight's CPU Reduction rule,
both are built, checked against numpy, and timed with onnxruntime running the same operator. Prints a
Markdown table (median microseconds; dlight / roller and ort / roller above 1: roller is faster).
"""
from __future__ import annotations

import argparse
import re
import sys

import numpy as np

from benchutil import time_alternately


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layer_norm(x, g, b):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + b


def _rms_norm(x, g):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * g


def cases():
    """name -> (ONNX op, input shape); attention softmaxes of BERT-base and of the tests' block, a
    classifier's, a GPT-2 decode step's over a 33-token KV, ViT-B/16's over 197 tokens and Swin-T's over
    49-token windows (prime rows); layer / RMS norms of 768 and 4096 wide rows and Swin-T's 96 channels."""
    return {
        "softmax_bert_12x128x128": ("Softmax", (1, 12, 128, 128)),
        "softmax_block_3x77x77": ("Softmax", (1, 3, 77, 77)),
        "softmax_classifier_1000": ("Softmax", (1, 1000)),
        "softmax_decode_12x1x33": ("Softmax", (1, 12, 1, 33)),
        "softmax_vit_12x197x197": ("Softmax", (1, 12, 197, 197)),
        "softmax_swin_192x49x49": ("Softmax", (64, 3, 49, 49)),
        "layer_norm_128x768": ("LayerNormalization", (1, 128, 768)),
        "layer_norm_swin_3136x96": ("LayerNormalization", (1, 3136, 96)),
        "layer_norm_decode_768": ("LayerNormalization", (1, 1, 768)),
        "rms_norm_128x768": ("RMSNormalization", (1, 128, 768)),
        "rms_norm_decode_4096": ("RMSNormalization", (1, 1, 4096)),
    }


def model_and_reference(op: str, shape, rng):
    from onnx import TensorProto, helper, numpy_helper

    width = shape[-1]
    g, b = rng.uniform(0.5, 1.5, width).astype(np.float32), rng.normal(size=width).astype(np.float32)
    inits = []
    weights = {"Softmax": [], "LayerNormalization": [g, b], "RMSNormalization": [g]}[op]
    if op == "Softmax":
        node, ref = helper.make_node(op, ["x"], ["y"], axis=-1), _softmax
    elif op == "LayerNormalization":
        inits = [numpy_helper.from_array(g, "g"), numpy_helper.from_array(b, "b")]
        node, ref = helper.make_node(op, ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5), lambda x: _layer_norm(x, g, b)
    else:
        inits = [numpy_helper.from_array(g, "g")]
        node, ref = helper.make_node(op, ["x", "g"], ["y"], axis=-1, epsilon=1e-5), lambda x: _rms_norm(x, g)
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)) for n in ("x", "y")]
    model = helper.make_model(helper.make_graph([node], "g", io[:1], io[1:], initializer=inits),
                              opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    return model, ref, weights


def bench(name: str, op: str, shape, dev, args) -> dict:
    import tvm

    from roller.models import frontend
    from roller.models.rules import Declined, DlightRule, RowWiseRule
    from roller.tir.compile import target_for

    rng = np.random.default_rng(0)
    model, ref, weights = model_and_reference(op, shape, rng)
    target = target_for(dev)
    mod = frontend.legalize_and_fuse(frontend.import_onnx(model, frontend.onnx_inputs(model)), target)
    (func,) = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    x = (rng.normal(size=shape) * 3).astype(np.float32)
    want = ref(x.astype(np.float64))
    row = {"case": name, "op": op, "shape": "x".join(map(str, shape))}
    impls = []
    for label, rule in (("roller", RowWiseRule()), ("dlight", DlightRule("Reduction"))):
        got = rule.apply(func, dev)
        if isinstance(got, Declined):
            row[label] = f"declined: {got.reason}"
            continue
        sch = got.schedule
        ex = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}), target)
        # the function's parameters: x, the weights (constants of the model), the output
        a = [tvm.runtime.tensor(v, tvm.cpu()) for v in [x] + weights]
        y = tvm.runtime.empty(shape, "float32", tvm.cpu())
        ex["main"](*a, y)
        err = float(np.max(np.abs(y.numpy() - want)))
        row[f"{label}_error"] = err
        if err > 1e-4:
            row[label] = f"WRONG (max abs error {err:.2g})"
            continue
        fn = ex["main"]
        impls.append((label, lambda fn=fn, a=a, y=y: fn(*a, y)))
    sess = frontend.onnxruntime_session(model, dev.units.count)
    impls.append(("onnxruntime", lambda: sess.run(None, {"x": x})))
    row.update(time_alternately(impls, rounds=args.rounds, target=0.02, repeats=3))
    return row


def _us(v):
    return f"{v * 1e6:.1f}" if isinstance(v, float) else str(v)


def table(rows) -> str:
    lines = ["| case | roller us | dlight us | onnxruntime us | dlight / roller | ort / roller |", "|---|---|---|---|---|---|"]
    for r in rows:
        ratio = (lambda k: f"{r[k] / r['roller']:.2f}"
                 if isinstance(r.get(k), float) and isinstance(r.get("roller"), float) else "-")
        lines.append(f"| {r['case']} | {_us(r.get('roller'))} | {_us(r.get('dlight'))} | {_us(r.get('onnxruntime'))} "
                     f"| {ratio('dlight')} | {ratio('onnxruntime')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="", help="regular expression over the case names")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--device", default=None)
    args = p.parse_args(argv)
    import roller
    from roller.tir.compile import set_threads

    dev = roller.load_device(args.device)
    set_threads(dev.units.count)
    rows = []
    for name, (op, shape) in cases().items():
        if re.search(args.cases, name):
            rows.append(bench(name, op, shape, dev, args))
            print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(table(rows))
    return 0 if all(isinstance(r.get("roller"), float) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
