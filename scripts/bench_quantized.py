"""A dynamically quantized transformer: roller against onnxruntime's int8, in one process.

    python3 scripts/bench_quantized.py                       # BERT-like: 12 layers, 768 wide, sequence 128
    python3 scripts/bench_quantized.py --ab-widened --fp32   # also roller on the importer's int32 matmuls,
                                                             # and both engines on the float32 model
    python3 scripts/bench_quantized.py --layers 1 --seq 16 --dim 32 --heads 2 --hidden 64 --rounds 1
    python3 scripts/bench_quantized.py --matmuls 128x768x768,128x768x3072   # also MatMulInteger alone (MxKxN)

The model is tests/onnx_models.py's pre-norm encoder (random weights; BERT-base's sizes by default) through
onnxruntime's ``quantize_dynamic`` (tests/onnx_models.quantized_dynamic: DynamicQuantizeLinear +
MatMulInteger u8 x s8 -> s32 for every MatMul with a constant weight; the attention's two activation
matmuls stay float32). roller compiles it with ``--no-profile`` (roller.compile_model); its outputs are
checked against onnxruntime's on the same quantized graph (roller.models.frontend.compare at
QUANTIZED_TOLERANCE: 2% of the output's largest magnitude; frontend.py and docs/models.md, "Quantized
graphs", say why).

``--ab-widened`` adds roller on the graph as TVM's importer writes it (both matmul operands widened to
int32 tensors first: roller.models.quantized.narrow_integer_matmuls switched off for that compile);
``--fp32`` adds roller and onnxruntime on the float32 model before quantization. ``--matmuls`` adds one
MatMulInteger per shape (tests/onnx_models.matmul_integer: a uint8 activation [1, M, K] with a zero point,
a constant int8 weight [K, N]; int32 out, checked exactly), roller against onnxruntime, timed alike.

The timing is bench_models.py's: every engine timed in turn in each of ``--rounds`` rounds of this process
(roller.measure.timing.time_rounds: a settle pause, a warm-up, three batches of ~50 ms), ``--threads`` each
(default: the device's cores); latencies are medians over the rounds and ``ort / roller`` the median of
the rounds' ratios (roller.measure.timing.paired_ratio; > 1: roller is faster). Prints one line per
engine and writes a JSON row to ``--out`` (default build/bench_quantized/).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # onnx_models: the test models and their quantization

from roller.measure.timing import paired_ratio, time_rounds  # noqa: E402


@contextlib.contextmanager
def _widened():
    """roller's compile of the importer's graph as it is: the integer matmuls keep their int32 operands
    (switched off where ``legalize_and_fuse`` calls it: relax_steps holds its own name for it)."""
    from roller.models import relax_steps

    keep = relax_steps.narrow_integer_matmuls
    relax_steps.narrow_integer_matmuls = lambda mod: (mod, 0)
    try:
        yield
    finally:
        relax_steps.narrow_integer_matmuls = keep


def _matmul_engines(shape: str, dev, threads: int, row: dict) -> list:
    """(name, call) of roller and onnxruntime on one MatMulInteger of ``shape`` (MxKxN); the int32 outputs
    must be equal (row["matmul_checks"])."""
    import numpy as np
    import onnx_models

    import roller
    from roller.models import frontend

    m, k, n = (int(x) for x in shape.split("x"))
    rng = np.random.default_rng(0)
    model = onnx_models.matmul_integer(rng.integers(-127, 128, (k, n)).astype(np.int8), za=True, m=m)
    cm = roller.compile_model(model, dev, name=f"matmul_integer_{shape}")
    feeds = {"a": rng.integers(0, 256, (1, m, k)).astype(np.uint8)}
    sess = frontend.onnxruntime_session(model, threads)
    exact = bool(np.array_equal(cm.run(feeds)[0], sess.run(None, feeds)[0]))
    row.setdefault("matmul_checks", {})[shape] = exact
    if not exact:
        raise SystemExit(f"MatMulInteger {shape}: roller's int32 output differs from onnxruntime's")
    return [(f"roller_mm_{shape}", cm.run_fn(feeds)), (f"onnxruntime_mm_{shape}", lambda: sess.run(None, feeds))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=3072)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="threads of every engine (default: the device's cores)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--ab-widened", action="store_true", help="also roller on the importer's int32 matmuls")
    ap.add_argument("--fp32", action="store_true", help="also both engines on the float32 model")
    ap.add_argument("--matmuls", default="", help="also MatMulInteger alone, comma-separated MxKxN shapes")
    ap.add_argument("--out", default="build/bench_quantized")
    args = ap.parse_args(argv)

    import onnx_models

    import roller
    from roller.models import frontend

    dev = roller.load_device(args.device)
    threads = args.threads or dev.units.count
    if args.threads:
        os.environ["TVM_NUM_THREADS"] = str(threads)
    fp32 = onnx_models.transformer_encoder(args.layers, seq=args.seq, dim=args.dim, heads=args.heads,
                                           hidden=args.hidden, name="encoder")
    q = onnx_models.quantized_dynamic(fp32)
    ops = sorted({n.op_type for n in q.graph.node})
    row = {"model": f"encoder {args.layers}x{args.dim}, seq {args.seq}, quantize_dynamic", "threads": threads,
           "onnx_ops": ops}
    cm = roller.compile_model(q, dev, name="encoder_int8")
    row["compile_seconds"] = cm.compile_seconds
    row["by_rule"] = {}
    for r in cm.report:
        row["by_rule"][r.scheduled_by] = row["by_rule"].get(r.scheduled_by, 0) + 1
    feeds = cm.random_inputs()
    sess = frontend.onnxruntime_session(q, threads)
    reference = sess.run(None, feeds)
    row["check"] = frontend.compare(cm.run(feeds), reference, frontend.QUANTIZED_TOLERANCE)
    impls = [("roller", cm.run_fn(feeds)), ("onnxruntime", lambda: sess.run(None, feeds))]
    if args.ab_widened:
        with _widened():
            cw = roller.compile_model(q, dev, name="encoder_int8_widened")
        row["widened_check"] = frontend.compare(cw.run(feeds), reference, frontend.QUANTIZED_TOLERANCE)
        impls.append(("roller_widened", cw.run_fn(feeds)))
    if args.fp32:
        cf = roller.compile_model(fp32, dev, name="encoder_fp32")
        sf = frontend.onnxruntime_session(fp32, threads)
        row["fp32_check"] = frontend.compare(cf.run(feeds), sf.run(None, feeds))
        impls += [("roller_fp32", cf.run_fn(feeds)), ("onnxruntime_fp32", lambda: sf.run(None, feeds))]
    for shape in filter(None, args.matmuls.split(",")):
        impls += _matmul_engines(shape, dev, threads, row)
    times = time_rounds(impls, rounds=args.rounds, target=0.05, repeats=3)
    row["latency_seconds"] = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
    row["ort_over_roller"] = paired_ratio(times["onnxruntime"], times["roller"])
    print(f"{row['model']}, {threads} threads, {args.rounds} rounds; roller compiled in "
          f"{row['compile_seconds']:.1f} s, functions by rule {row['by_rule']}")
    print(f"outputs against onnxruntime's int8: max rel error {row['check']['max_rel_error']:.2g}, "
          f"matches: {row['check']['matches']}")
    for name, s in row["latency_seconds"].items():
        # the MatMulInteger engines pair with roller's of their shape
        base = name.replace("onnxruntime_mm_", "roller_mm_") if "_mm_" in name else "roller"
        paired = "" if name == base else f"  ({name} / {base} paired {paired_ratio(times[name], times[base]):.3f})"
        print(f"{name:28s} {s * 1e3:9.3f} ms{paired}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_quantized.json").write_text(json.dumps(row, indent=2))
    return 0 if row["check"]["matches"] else 1


if __name__ == "__main__":
    sys.exit(main())
