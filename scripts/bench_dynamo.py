"""PyTorch models through ``torch.compile(model, backend="roller")`` against PyTorch eager, ``torch.compile``'s
default backend (inductor) and onnxruntime, in one run (issue 31: "latency is reported against eager and against
torch.compile's default backend").

    PYTHONPATH=$PWD:/work/torchenv python3 scripts/bench_dynamo.py                    # ResNet-50, batch 1
    PYTHONPATH=$PWD:/work/torchenv python3 scripts/bench_dynamo.py --models resnet50,mobilenet_v2,tiny_bert
    PYTHONPATH=$PWD:/work/torchenv python3 scripts/bench_dynamo.py --models tiny_bert --engines eager,roller

Models: scripts/export_models.py's (torchvision classifiers at 1x3x224x224, ``weights=None``, eval mode; its
Hugging Face encoders where transformers is installed), built the same way, and ``tiny_resnet`` / ``tiny_bert``,
the small modules of tests/test_dynamo.py (tests/torch_models.py). Random weights from seed 0, nothing downloaded.

Engines (``--engines``), each with ``--threads`` threads (default: the device's cores): ``eager`` (PyTorch,
``torch.set_num_threads``), ``inductor`` (``torch.compile(model)``: the default backend; it needs a C++
compiler), ``roller`` (``roller.models.dynamo.compile``: ``torch.compile(model, backend="roller",
dynamic=False)``; TVM's pool set by roller.tir.compile.set_threads) and ``onnxruntime`` on the same model
exported by scripts/export_models.write_onnx (``torch.onnx.export``, ``dynamo=False``, opset 17), the issue's
reference, and ``roller_onnx``: roller's own ONNX path (roller.compile_model, as ``roller compile``) on that
export, which tells the TorchDynamo frontend's cost from the kernels'. A compiled engine's compile seconds are its first call's. Every engine's output is compared with
eager's (roller.models.frontend.compare: relative to the output's scale) before timing; an engine that fails to
compile, whose output differs, or (roller) that ran any graph eagerly instead is reported with why and not timed.

Timing: roller.measure.timing.time_rounds, every engine in turn in each of ``--rounds`` rounds of this process,
each after a settle pause (the previous engine's threads stop spinning) and its own warm-up; with ``--threads 1``
a latency is this thread's CPU time per call (benchutil.cpu_seconds, as scripts/bench_models.py), which leaves out
the other jobs of a shared machine. Latencies are the medians over the rounds; ``engine / roller`` is the paired ratio (the median of the rounds' ratios,
roller.measure.timing.paired_ratio: > 1, roller is faster), steadier than the ratio of medians on a shared
machine. Prints a Markdown table and writes it with a JSON file to ``--out`` (default build/bench_dynamo/).

torch is not one of roller's dependencies: without it this script says so in one line and exits 2.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # torch_models: the tests' small modules, one definition

from benchutil import cpu_seconds  # noqa: E402
from export_models import MODELS, MissingDependency, build, import_torch, write_onnx  # noqa: E402
from roller.measure.timing import paired_ratio, time_rounds  # noqa: E402

TINY = {"tiny_resnet": ("TinyResNet", (1, 3, 32, 32)), "tiny_bert": ("TinyBert", (1, 16, 32))}
ENGINES = ["eager", "inductor", "roller", "onnxruntime", "roller_onnx"]
BASE = "roller"


def make(name: str):
    """(model in eval mode, example inputs, input names) for ``name``."""
    torch = import_torch()
    if name not in TINY:
        return build(name)
    import torch_models

    cls, shape = TINY[name]
    torch.manual_seed(0)
    return getattr(torch_models, cls)().eval(), (torch.randn(*shape),), ["x"]


def arrays(out) -> list:
    """An engine's output (torch tensors, numpy arrays, TVM tensors, or tuples/lists/dicts of them) as numpy
    arrays, in order."""
    from roller.models.frontend import outputs_to_numpy

    if isinstance(out, np.ndarray):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [a for o in out for a in arrays(o)]
    return outputs_to_numpy(out)  # a torch or TVM tensor (both have .numpy())


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300] if text else ''}"


def engine(kind: str, model, example, names, threads: int):
    """A no-argument callable running ``model`` on ``example`` with engine ``kind``, built (and, for the compiled
    engines, called once) here. Raises with the reason where it cannot be built."""
    torch = import_torch()
    if kind == "eager":
        return lambda: model(*example)
    if kind == "inductor":
        fn = torch.compile(model)
    elif kind == "roller":
        import roller.models.dynamo as rd

        rd.register()
        fn = torch.compile(model, backend=rd.BACKEND_NAME, dynamic=False)
    elif kind in ("onnxruntime", "roller_onnx"):
        import onnx

        from roller.models import frontend

        buf = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
            write_onnx(model, example, names, buf)
        proto = onnx.load_from_string(buf.getvalue())
        feeds = {n: t.numpy() for n, t in zip(names, example)}
        if kind == "roller_onnx":  # roller's ONNX path (roller compile) on the same export
            return frontend.compile_model(proto, name="torch_export").run_fn(feeds)
        sess = frontend.onnxruntime_session(proto, threads)
        return lambda: sess.run(None, feeds)
    else:
        raise ValueError(f"unknown engine {kind!r}")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fn(*example)  # compiles
    fell_back = [str(w.message) for w in record if str(w.message).startswith("roller:")]
    if fell_back:  # timing it would time eager under roller's name
        raise RuntimeError(f"{len(fell_back)} graph(s) ran eagerly: {fell_back[0]}")
    return lambda: fn(*example)


def bench(name: str, engines: list[str], threads: int, rounds: int, target: float) -> dict:
    from roller.models.frontend import compare

    model, example, names = make(name)
    reference = arrays(model(*example))
    row: dict = {"model": name, "inputs": [list(t.shape) for t in example], "threads": threads, "engines": {}}
    timed = []
    for kind in engines:
        info: dict = {}
        row["engines"][kind] = info
        t0 = time.perf_counter()
        try:
            fn = engine(kind, model, example, names, threads)
        except Exception as e:
            info["skipped"] = f"failed to build: {_first_line(e)}"
            print(f"{name} {kind}: {info['skipped']}", file=sys.stderr, flush=True)
            continue
        if kind != "eager":
            info["compile_seconds"] = time.perf_counter() - t0  # first call (the ONNX ones: export + build)
        check = compare(arrays(fn()), reference)
        info.update(max_rel_error=check["max_rel_error"], matches=check["matches"])
        if not check["matches"]:
            info["skipped"] = f"output differs from eager's: {check.get('detail') or check['max_rel_error']}"
        else:
            timed.append((kind, fn))
        print(f"{name} {kind}: built in {time.perf_counter() - t0:.1f} s, max rel error vs eager "
              f"{check['max_rel_error']}", file=sys.stderr, flush=True)
    if threads == 1:  # every engine runs on this thread: its CPU time leaves out the other jobs on the machine
        times = time_rounds(timed, rounds=rounds, measure=lambda fn: cpu_seconds(fn, max(target, 0.2)))
    else:
        times = time_rounds(timed, rounds=rounds, target=target)
    for kind, per_round in times.items():
        info = row["engines"][kind]
        info["latency_seconds"] = statistics.median(per_round)
        info["rounds_seconds"] = per_round
        if BASE in times:
            info["over_roller"] = paired_ratio(per_round, times[BASE])
    return row


def _ms(s) -> str:
    return "" if s is None else f"{s * 1e3:.2f}"


def table(rows) -> str:
    lines = ["| model | engine | compile s | ms (median) | engine / roller (paired) | max rel error vs eager |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        for kind, i in r["engines"].items():
            compile_s = f"{i['compile_seconds']:.1f}" if "compile_seconds" in i else ""
            ms = _ms(i.get("latency_seconds")) or f"not timed: {i['skipped']}"
            ratio = f"{i['over_roller']:.2f}" if "over_roller" in i else ""
            err = f"{i['max_rel_error']:.1e}" if i.get("max_rel_error") is not None else ""
            lines.append(f"| {r['model']} | {kind} | {compile_s} | {ms} | {ratio} | {err} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet50", help="comma-separated: " + ",".join(MODELS + list(TINY)))
    p.add_argument("--engines", default=",".join(ENGINES), help="comma-separated, of " + ",".join(ENGINES))
    p.add_argument("--threads", type=int, default=None, help="threads of every engine (default: the device's cores)")
    p.add_argument("--rounds", type=int, default=7, help="alternating timing rounds (default 7)")
    p.add_argument("--target", type=float, default=0.1, help="seconds per timed batch (default 0.1)")
    p.add_argument("--device", default=None, help="roller's device spec (default: this machine)")
    p.add_argument("--out", default="build/bench_dynamo")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS and n not in TINY]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS + list(TINY))}")
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not engines or set(engines) - set(ENGINES):
        p.error(f"--engines takes some of {', '.join(ENGINES)}, not {args.engines!r}")
    try:
        torch = import_torch()
        import roller
        from roller.tir.compile import set_threads

        threads = args.threads or roller.load_device(args.device).units.count
        set_threads(threads)  # before TVM's runtime starts its pool
        torch.set_num_threads(threads)
        torch.set_grad_enabled(False)  # inference: every engine runs without autograd
        rows = []
        for n in names:
            print(f"== {n}", file=sys.stderr, flush=True)
            rows.append(bench(n, engines, threads, args.rounds, args.target))
    except MissingDependency as e:
        print(f"bench_dynamo: {e}", file=sys.stderr)
        return 2
    text = table(rows)
    print(text)
    load = os.getloadavg()
    print(f"\nthreads: {threads} for every engine (TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS')}, torch "
          f"{torch.get_num_threads()}, onnxruntime intra-op {threads}); latency = median of {args.rounds} alternating "
          f"rounds ({'thread CPU time' if threads == 1 else 'wall time'}); load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}")
    print("engine / roller: the engine's per-round latency over roller's, median over the rounds (> 1: roller is faster)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_dynamo.md").write_text(text + "\n")
    meta = {"load": load, "torch": torch.__version__, "rounds": args.rounds, "threads": threads}
    (out / "bench_dynamo.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=float))
    print(f"wrote {out / 'bench_dynamo.md'} and {out / 'bench_dynamo.json'}", file=sys.stderr)
    # 1 where an engine's output differs or roller's was not timed (inductor failing to build is reported only)
    ok = all(i.get("matches", True) for r in rows for i in r["engines"].values())
    ok = ok and all("latency_seconds" in r["engines"][BASE] for r in rows if BASE in r["engines"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
