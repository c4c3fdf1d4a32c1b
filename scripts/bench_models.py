"""Whole models: roller against the best CPU runtimes (onnxruntime, OpenVINO, PyTorch eager) and TVM's default Relax pipeline, in one run.

    python3 scripts/bench_models.py                      # resnet50, bert (12 layers, seq 128), small ones
    python3 scripts/bench_models.py --models resnet50,bert --batch 1,8   # one row per (model, batch)
    python3 scripts/bench_models.py --models resnet50 --profile   # also roller with top-10 profiling
    python3 scripts/bench_models.py --models cnn,block --tvm-runs 3
    PYTHONPATH=/path/to/openvino python3 scripts/bench_models.py   # with OpenVINO as a peer
    PYTHONPATH=/path/to/torch python3 scripts/bench_models.py   # with a PyTorch eager column

Models are built in code with random weights (tests/onnx_models.py through benchutil.models; nothing is
downloaded): ResNet-50 v1.5 at 224x224 (batch norm folded), a BERT-base-like encoder (12 pre-norm layers,
768 wide, 12 heads, MLP 3072, GELU, sequence 128), MobileNetV2 at 224x224, GPT-2 small's 12 decoder blocks
for one new token over a 32-token KV cache, the small CNN and transformer block of the tests, and that CNN
statically quantized (``cnn_qdq``: onnxruntime's ``quantize_static`` in the QDQ format; ``--qdq`` quantizes
every model so, a file included). ``--batch``
(comma-separated, default 1) builds each model at each batch size (the leading dimension of every input;
GPT-2: that many sequences decoded at once, each over its own cache), compiles and times it: one row per
(model, batch).

Per row: roller's compile seconds (``--no-profile``, and top-10 profiled with ``--profile``), its latency,
and its peers' latencies with as many threads: onnxruntime; OpenVINO's CPU plugin where ``openvino``
imports (roller.models.frontend.openvino_runner, as check_against_onnxruntime; ``--no-openvino`` skips it;
without it the script runs as before and says OpenVINO was not available); PyTorch eager running the same
graph node by node (scripts/torch_eager.py; where torch is importable and not ``--no-torch``; the faster of
one thread and the device's cores). Every output is checked against onnxruntime's
(roller.models.frontend.compare at tolerance_for the graph: relative to the output's scale, QUANTIZED_TOLERANCE
for a quantized one); a peer whose outputs differ is not timed (OpenVINO, with the reason) or not a peer
(PyTorch).

The timing: roller and every peer are timed alternately in the same rounds of this process (``--rounds``,
roller.measure.timing.time_rounds), each after a settle pause (SETTLE_SECONDS: the previous one's thread
pool stops spinning) and a warm-up, never beside each other's threads; with ``--threads 1`` each latency is
this thread's CPU time per run. Latencies are medians over the rounds. The fastest peer is the one of lowest
median latency, and ``peer / roller`` its paired ratio to roller (the median over the rounds of the round's
ratio, roller.measure.timing.paired_ratio and fastest_peer; > 1: roller is faster). TVM's default pipeline
(``tvm.compile`` of the imported module: legalized, fused, unscheduled) is timed apart, from
``--tvm-runs`` runs, since it is slow.

Prints a Markdown table and writes it with a JSON file to ``--out`` (default build/bench_models/); each
JSON row has ``model``, ``batch``, ``peers``, ``fastest_peer``, ``fastest_peer_over_roller``, each
peer's ``*_latency_seconds`` (``openvino_over_roller`` and ``ort_over_roller`` paired too) and
``openvino_skipped`` where OpenVINO was left out, with why. Models are the ones built in code and ONNX
files given by path: batch N is the file NAME_bN.onnx beside NAME.onnx (exported at that batch by
scripts/export_models.py ``--batch N``), never a rewrite of the batch-1 graph.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # onnx_models: the test models, one definition


from benchutil import cpu_seconds, model_name, models  # noqa: E402
from roller.measure.timing import fastest_peer, paired_ratio, time_rounds  # noqa: E402


def _torch_runner(proto, threads: int):
    """scripts/torch_eager's runner of ``proto``, or None when torch is not importable."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    from torch_eager import torch_runner

    return torch_runner(proto, threads)


def _openvino(proto, threads: int, feeds, reference):
    """(OpenVINO's no-argument call on ``feeds``, None), or (None, why it is left out): not importable,
    failing to compile or run, or outputs that differ from onnxruntime's (``reference``). The runner is
    roller.models.frontend.openvino_runner, the one check_against_onnxruntime times."""
    from roller.models import frontend

    try:
        bind = frontend.openvino_runner(proto, threads)
        if bind is None:
            return None, "not available (the openvino package does not import)"
        call = bind(feeds)
        check = frontend.compare(call(), reference, frontend.tolerance_for(proto))
    except Exception as e:  # noqa: BLE001  (an optional peer that fails is left out, and says why)
        return None, f"failed: {type(e).__name__}: {e}"[:300]
    if not check["matches"]:
        return None, f"its outputs differ from onnxruntime's (max rel error {check['max_rel_error']:.2g}): not timed"
    return call, None


def _tvm_default(proto, specs, target, runs: int, feeds) -> dict:
    """TVM's default Relax pipeline for the CPU: compile seconds, median latency of ``runs`` runs, outputs."""
    import tvm
    from tvm import relax

    from roller.models import frontend

    t = time.perf_counter()
    ex = tvm.compile(frontend.import_onnx(proto, specs), target)
    compile_s = time.perf_counter() - t
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(feeds[n], tvm.cpu()) for n in specs]
    times, out = [], None
    for _ in range(runs):
        t = time.perf_counter()
        out = vm["main"](*args)
        times.append(time.perf_counter() - t)
    return {"compile_seconds": compile_s, "latency_seconds": statistics.median(times),
            "outputs": frontend.outputs_to_numpy(out)}


def bench(name: str, proto, args, batch: int = 1) -> dict:
    import roller
    from roller.models import frontend
    from roller.tir.compile import target_for

    dev = roller.load_device(args.device)
    row = {"model": name, "batch": batch}
    cm = roller.compile_model(proto, dev, name=name)
    row["compile_seconds"] = cm.compile_seconds
    row["phases"] = cm.seconds
    row["functions"] = len(cm.report)
    row["by_rule"] = {}
    for r in cm.report:
        row["by_rule"][r.scheduled_by] = row["by_rule"].get(r.scheduled_by, 0) + 1
    feeds = cm.random_inputs()
    threads = args.threads or dev.units.count
    sess = frontend.onnxruntime_session(proto, threads)
    reference = sess.run(None, feeds)
    tolerance = frontend.tolerance_for(proto)  # a quantized graph's outputs: QUANTIZED_TOLERANCE
    row.update(frontend.compare(cm.run(feeds), reference, tolerance))
    impls = [("roller", cm.run_fn(feeds)), ("onnxruntime", lambda: sess.run(None, feeds))]
    if args.ab_prepack:  # the same plans' kernels packing their constant inputs at every call
        cu = roller.compile_model(proto, dev, name=name, prepack=False)
        row["unpacked_matches"] = frontend.compare(cu.run(feeds), reference, tolerance)["matches"]
        impls.append(("roller_unpacked", cu.run_fn(feeds)))
    if args.ab_balance:  # the same plans' kernels with TVM's fixed split of the grid (in-process, uncached)
        from benchutil import plans_with
        with plans_with(balanced=False):
            cs = roller.compile_model(proto, dev, name=name, cache=False)
        row["static_matches"] = frontend.compare(cs.run(feeds), reference, tolerance)["matches"]
        impls.append(("roller_static", cs.run_fn(feeds)))
    if args.profile:
        cp = roller.compile_model(proto, dev, name=name, profile=True, topk=args.topk)
        row["profiled_compile_seconds"] = cp.compile_seconds
        row["profiled_matches"] = frontend.compare(cp.run(feeds), reference, tolerance)["matches"]
        impls.append(("roller_profiled", cp.run_fn(feeds)))
    if args.no_openvino:
        ov_call, row["openvino_skipped"] = None, "left out (--no-openvino)"
    else:
        ov_call, why = _openvino(proto, threads, feeds, reference)
        if ov_call is None:
            row["openvino_skipped"] = why
        else:  # timed in the same rounds, after onnxruntime
            impls.append(("openvino", ov_call))
    torch_run = None if args.no_torch else _torch_runner(proto, threads)
    if torch_run is not None:
        row["torch_matches"] = frontend.compare(torch_run(feeds), reference, tolerance)["matches"]
        # PyTorch on the device's cores and on one: on a loaded 2-core machine its OpenMP threads wait
        # for each other at every operator (GPT-2 decode, 2 blocks: 172 ms on 2 threads, 4.1 ms on 1)
        impls += [(f"torch_{t}", torch_run.timed(feeds, t)) for t in sorted({1, threads})]
    if threads == 1:  # everything runs on this thread: its CPU time leaves out the other jobs on the machine
        rounds = time_rounds(impls, rounds=args.rounds, measure=lambda fn: cpu_seconds(fn, 0.2))
    else:
        rounds = time_rounds(impls, rounds=args.rounds, target=0.05, repeats=3)
    times = {k: statistics.median(v) for k, v in rounds.items()}
    # the ratio within each round (both saw the same machine speed), its median over the rounds
    row["ort_over_roller"] = paired_ratio(rounds["onnxruntime"], rounds["roller"])
    row["latency_seconds"] = times["roller"]
    row["onnxruntime_latency_seconds"] = times["onnxruntime"]
    if ov_call is not None:
        row["openvino_latency_seconds"] = times["openvino"]
        row["openvino_over_roller"] = paired_ratio(rounds["openvino"], rounds["roller"])
    # the peers: every other runtime timed in these rounds whose outputs match onnxruntime's
    peers = ["onnxruntime"] + (["openvino"] if ov_call is not None else []) + \
        ([k for k in times if k.startswith("torch_")] if torch_run is not None and row["torch_matches"] else [])
    row["peers"] = peers
    row["fastest_peer"], row["fastest_peer_over_roller"] = fastest_peer(rounds, peers)
    row["fastest_peer_latency_seconds"] = times[row["fastest_peer"]]
    if torch_run is not None:
        row["torch_threads"] = min((k for k in times if k.startswith("torch_")), key=times.get)[len("torch_"):]
        row["torch_latency_seconds"] = times["torch_" + row["torch_threads"]]
        row["torch_latency_by_threads"] = {k[len("torch_"):]: v for k, v in times.items() if k.startswith("torch_")}
    if args.profile:
        row["profiled_latency_seconds"] = times["roller_profiled"]
    if args.ab_prepack:
        row["unpacked_latency_seconds"] = times["roller_unpacked"]
    if args.ab_balance:
        row["static_latency_seconds"] = times["roller_static"]
        row["static_over_roller"] = paired_ratio(rounds["roller_static"], rounds["roller"])
    if args.tvm_runs > 0:
        tv = _tvm_default(proto, cm.inputs, target_for(dev), args.tvm_runs, feeds)
        row["tvm_compile_seconds"] = tv["compile_seconds"]
        row["tvm_latency_seconds"] = tv["latency_seconds"]
        row["tvm_matches"] = frontend.compare(tv["outputs"], reference, tolerance)["matches"]
    return row


def _ms(s):
    return "-" if s is None else f"{s * 1e3:.2f}"


def _peer_name(peer: str) -> str:
    return f"PyTorch {peer[len('torch_'):]}t" if peer.startswith("torch_") else {"openvino": "OpenVINO"}.get(peer, peer)


def table(rows) -> str:
    head = ("| model | batch | roller compile s | roller ms | onnxruntime ms | OpenVINO ms | PyTorch eager ms (threads) "
            "| fastest peer | peer / roller "
            "| roller top-10: compile s, ms | TVM default: compile s, ms | max abs err | matches | functions (by rule) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        prof = (f"{r['profiled_compile_seconds']:.1f}, {_ms(r['profiled_latency_seconds'])}"
                if "profiled_compile_seconds" in r else "-")
        tvm = (f"{r['tvm_compile_seconds']:.1f}, {_ms(r['tvm_latency_seconds'])}"
               + ("" if r.get("tvm_matches", True) else " (WRONG)") if "tvm_compile_seconds" in r else "-")
        rules = ", ".join(f"{k} {v}" for k, v in sorted(r["by_rule"].items()))
        torch = (f"{_ms(r['torch_latency_seconds'])} ({r['torch_threads']}t)" + ("" if r["torch_matches"] else " (WRONG)")
                 if "torch_latency_seconds" in r else "-")
        lines.append(f"| {r['model']} | {r.get('batch', 1)} | {r['compile_seconds']:.1f} | {_ms(r['latency_seconds'])} | "
                     f"{_ms(r['onnxruntime_latency_seconds'])} | {_ms(r.get('openvino_latency_seconds'))} | {torch} | "
                     f"{_peer_name(r['fastest_peer'])} | {r['fastest_peer_over_roller']:.2f} | {prof} | {tvm} | "
                     f"{r['max_abs_error']:.2g} | {'yes' if r['matches'] else 'NO'} | {r['functions']} ({rules}) |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet50,bert,mobilenet_v2,gpt2_decode,cnn,block", help="comma-separated: " + ",".join(models())
                   + ", or paths of ONNX files (scripts/export_models.py; batch N from NAME_bN.onnx beside each)")
    p.add_argument("--device", default=None)
    p.add_argument("--profile", action="store_true", help="also compile with top-K profiling (minutes)")
    p.add_argument("--topk", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5, help="alternating timing rounds (default 5)")
    p.add_argument("--tvm-runs", type=int, default=1,
                   help="runs of TVM's default (unscheduled) build to time; 0 skips it (default 1: it is slow)")
    p.add_argument("--batch", default="1", help="comma-separated batch sizes, each model compiled and timed at each "
                                                "(one row per model and batch; default 1)")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch eager column even if torch imports")
    p.add_argument("--no-openvino", action="store_true", help="skip the OpenVINO peer even if openvino imports")
    p.add_argument("--ab-prepack", action="store_true",
                   help="also time roller without prepacked constants (compile_model(prepack=False)), alternately")
    p.add_argument("--ab-balance", action="store_true",
                   help="also time roller with TVM's fixed split of each parallel grid (roller.targets.cpu.balance off)")
    p.add_argument("--qdq", action="store_true",
                   help="time each model through onnxruntime's quantize_static instead (QDQ: uint8 activations, int8 "
                        "weights; calibrated on 2 random inputs), named NAME_qdq; the peers run the same graph")
    p.add_argument("--per-channel", action="store_true", help="with --qdq: one weight scale per output channel")
    p.add_argument("--threads", type=int, default=None,
                   help="threads for roller and onnxruntime (default: the device's cores); with 1 the latencies are "
                        "this thread's CPU time per run, steadier on a shared machine")
    p.add_argument("--out", default="build/bench_models")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    makers = models(files=names)
    unknown = [n for n in names if n not in makers]
    if unknown:
        p.error(f"unknown model(s) {unknown}; choose from {', '.join(makers)}")
    try:
        batches = [int(b) for b in args.batch.split(",") if b.strip()]
    except ValueError:
        p.error(f"--batch takes comma-separated integers, not {args.batch!r}")
    if not batches or min(batches) < 1:
        p.error(f"--batch takes positive batch sizes, not {args.batch!r}")
    from roller.tir.compile import set_threads
    import roller
    set_threads(args.threads or roller.load_device(args.device).units.count)
    rows = []
    for n, b in [(n, b) for n in names for b in batches]:  # one row per (model, batch)
        print(f"== {n} batch {b}", file=sys.stderr)
        try:
            proto = models(b, files=names)[n]()
        except FileNotFoundError as e:
            p.error(str(e))
        if args.qdq:
            from onnx_models import quantized_qdq

            proto = quantized_qdq(proto, samples=2, per_channel=args.per_channel)
        rows.append(bench(model_name(n) + ("_qdq" if args.qdq else ""), proto, args, b))
        print(table(rows[-1:]).splitlines()[-1], file=sys.stderr)
        if args.ab_prepack:
            r = rows[-1]
            print(f"{n}: prepacked {_ms(r['latency_seconds'])} ms, unpacked {_ms(r['unpacked_latency_seconds'])} ms "
                  f"(matches: {r['unpacked_matches']}), load {os.getloadavg()[0]:.2f}", file=sys.stderr)
        if args.ab_balance:
            r = rows[-1]
            print(f"{n}: balanced grid {_ms(r['latency_seconds'])} ms, fixed split {_ms(r['static_latency_seconds'])} ms "
                  f"(paired fixed / balanced {r['static_over_roller']:.3f}; matches: {r['static_matches']})",
                  file=sys.stderr)
    text = table(rows)
    threads = os.environ.get("TVM_NUM_THREADS")
    print(text)
    clock = "thread CPU time" if args.threads == 1 else "wall time"
    print(f"\nthreads: roller/TVM {threads}, onnxruntime intra-op {args.threads or roller.load_device(args.device).units.count}; "
          f"latency = median of {args.rounds} alternating rounds ({clock}); TVM default = median of {args.tvm_runs} run(s); "
          f"load {os.getloadavg()[0]:.2f}")
    reasons = {r["openvino_skipped"] for r in rows if "openvino_skipped" in r}
    if len(reasons) == 1 and all("openvino_skipped" in r for r in rows):  # e.g. not installed: said once
        print(f"OpenVINO: {reasons.pop()}")
    else:
        for r in rows:
            if "openvino_skipped" in r:
                print(f"OpenVINO, {r['model']} batch {r['batch']}: {r['openvino_skipped']}")
    print("peer / roller: the fastest peer's (lowest median) per-round ratio to roller, median over the rounds "
          "(> 1: roller is faster); peers are the runtimes whose outputs match onnxruntime's")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_models.md").write_text(text + "\n")
    (out / "bench_models.json").write_text(json.dumps(rows, indent=2, default=float))
    print(f"wrote {out / 'bench_models.md'} and {out / 'bench_models.json'}", file=sys.stderr)
    return 0 if all(r["matches"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
