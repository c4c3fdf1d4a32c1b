"""Where a whole model's time goes: each fused function roller built, timed alone, beside onnxruntime's
own per-node profile of the same layers.

    PYTHONPATH=$PWD python3 scripts/model_breakdown.py --model mobilenet_v2
    PYTHONPATH=$PWD python3 scripts/model_breakdown.py --model resnet50 --rounds 5 --json out.json
    PYTHONPATH=$PWD python3 scripts/model_breakdown.py --model resnet50 --cold   # also on cold caches

Roller's side: the model is compiled as ``roller compile --no-profile`` does; every distinct PrimFunc of
the built library is called alone on random arguments of its real shapes (warm caches: its inputs stay in
L2 between calls, unlike in the model) and timed in rounds (every function once a round, median of the
rounds); "roller us" is that times its calls. With ``--cold`` each is also timed in single calls right
after a write of twice the last cache (``benchutil.ColdTimer``): all its operands, weights and
activations, from memory. "In the model" is each function's time inside whole runs of the model (the
Relax VM's instrument around every call), on the caches the model leaves it, as onnxruntime's profiled
nodes are: compare onnxruntime with that column.

onnxruntime's side: a session with ``enable_profiling`` (same threads as roller, default optimizations)
runs the model ``--ort-runs`` times, in turns with roller's rounds; each node's median duration is taken
from the profile. Layers are
matched by what they compute, not by name: an anchor (convolution, matmul, pool, mean, softmax, layer
norm) is keyed by (kind, output elements, elements of its second input (weights) or its input), which
does not depend on layout (NCHW, NHWC, NCHWc) or fusion. onnxruntime's elementwise nodes are charged to
the anchor they follow in the ONNX graph (through elementwise nodes on their first input), as roller fuses
them there; its nodes that follow no anchor (layout reorders, transposes, reshapes) are listed apart, as
are roller's functions without an anchor (layout transforms, copies, unfused elementwise work).

Also printed: the model end to end (roller's VM and a plain onnxruntime session, timed alternately in
this process), so the sums of the parts show the VM's and onnxruntime's overhead between functions.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # onnx_models: the test models, one definition
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

from benchutil import ColdTimer, cpu_seconds, models  # noqa: E402
from roller.measure.timing import SETTLE_SECONDS, median_seconds, time_alternately  # noqa: E402

# Anchor kinds: roller's fused-function names start with TVM's operator name, ONNX nodes have op types
# (onnxruntime's fused ones included).
ROLLER_KIND = {"conv2d": "conv", "matmul": "matmul", "max_pool2d": "pool", "avg_pool2d": "pool",
               "adaptive_avg_pool2d": "mean", "mean": "mean", "softmax": "softmax", "fast_softmax": "softmax",
               "layer_norm": "layer_norm"}
ONNX_KIND = {"Conv": "conv", "FusedConv": "conv", "MatMul": "matmul", "FusedMatMul": "matmul", "Gemm": "matmul",
             "MaxPool": "pool", "AveragePool": "pool", "GlobalAveragePool": "mean", "ReduceMean": "mean",
             "Softmax": "softmax", "LayerNormalization": "layer_norm", "SkipLayerNormalization": "layer_norm"}
WEIGHTED = ("conv", "matmul")  # keyed by their second input (the weights, or the other matrix)
# ONNX operators charged to the anchor before them (roller fuses them into its function)
ELEMENTWISE = {"Add", "Mul", "Sub", "Div", "Relu", "Clip", "Erf", "Gelu", "BiasGelu", "FastGelu", "Sigmoid",
               "Tanh", "BatchNormalization", "Sqrt", "Pow", "Max", "Min"}


def _numel(shape) -> int:
    return int(np.prod([int(d) for d in shape], dtype=np.int64))


def anchor_key(kind: str, out_shape, in_shapes) -> tuple:
    """(kind, output elements, elements of the input, of the weights (conv, matmul; 0 otherwise)): the
    input tells a strided convolution from one with the same output and weights."""
    weights = _numel(in_shapes[1]) if kind in WEIGHTED and len(in_shapes) > 1 else 0
    return (kind, _numel(out_shape), _numel(in_shapes[0]), weights)


def roller_kind(name: str) -> str | None:
    """The anchor kind of a fused function from its name (``fused_conv2d3_add2_relu`` -> conv), or None."""
    first = re.sub(r"^fused_", "", name).split("_")
    for n in (3, 2, 1):  # longest operator name first: adaptive_avg_pool2d, max_pool2d, conv2d
        op = re.sub(r"\d+$", "", "_".join(first[:n]))
        if op in ROLLER_KIND:
            return ROLLER_KIND[op]
    return None


# ---------------------------------------------------------------------------------------------
# roller

def roller_functions(cm) -> tuple[list[dict], list]:
    """Each distinct PrimFunc the model calls, in call order (name, calls, rule, key, shapes), and a
    no-argument callable per function running it alone on random arguments of its shapes."""
    import tvm

    from roller.models.frontend import random_arrays
    from roller.models.constants import call_counts

    counts = call_counts(cm.module)
    lib = cm.executable.mod.imports[0]
    by_name = {r.name: r for r in cm.report}
    rows, calls = [], []
    for name, n in counts.items():
        func = cm.module[name]
        params = [(tuple(int(d) for d in p.shape), str(p.dtype)) for p in func.params]
        arrays = random_arrays({str(i): s for i, s in enumerate(params)}, seed=1)
        args = [tvm.runtime.tensor(a, tvm.cpu()) for a in arrays.values()]
        fn = lib.get_function(name)
        kind = roller_kind(name)
        shapes = [s for s, _ in params]
        rep = by_name.get(name)
        rows.append({"name": name, "calls": n, "kind": kind, "scheduled_by": rep.scheduled_by if rep else "?",
                     "key": anchor_key(kind, shapes[-1], shapes[:-1]) if kind else None,
                     "shapes": [list(s) for s in shapes]})
        calls.append(lambda fn=fn, args=args: fn(*args))
    return rows, calls


# ---------------------------------------------------------------------------------------------
# onnxruntime

def _named(proto):
    """A copy of ``proto`` whose nodes all have unique names (the profile names nodes by them)."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for i, node in enumerate(out.graph.node):
        node.name = f"n{i}_{node.op_type}"
    return out


def onnx_anchors(proto) -> tuple[dict, dict]:
    """(ONNX node name -> anchor key of the anchor it belongs to, tensor name -> producing node name).
    An elementwise node belongs to the latest anchor (in graph order) reached through elementwise nodes
    on its inputs: where Relax's fusion puts it (a residual add joins the matmul before it)."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(proto)
    shapes = {i.name: list(i.dims) for i in proto.graph.initializer}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        shapes.setdefault(vi.name, [d.dim_value for d in vi.type.tensor_type.shape.dim])
    producer = {o: n for n in proto.graph.node for o in n.output}
    owner: dict[str, tuple | None] = {}  # node -> (position of its anchor, anchor key) or None
    for pos, n in enumerate(proto.graph.node):  # topological order
        kind = ONNX_KIND.get(n.op_type)
        if kind:
            owner[n.name] = (pos, anchor_key(kind, shapes[n.output[0]], [shapes.get(i, [0]) for i in n.input]))
        elif n.op_type in ELEMENTWISE:
            found = [owner.get(producer[i].name) for i in n.input if i in producer]
            owner[n.name] = max((f for f in found if f), default=None)
        else:
            owner[n.name] = None
    return {n: o[1] if o else None for n, o in owner.items()}, {t: n.name for t, n in producer.items()}


class OrtProfile:
    """An onnxruntime session with ``enable_profiling`` (threads as roller's, default optimizations):
    :meth:`run` runs the model, :meth:`nodes` reads the profile once the runs are done."""

    WARMUP = 3

    def __init__(self, proto, threads: int):
        import onnxruntime as ort

        from roller.models.frontend import onnx_inputs, random_arrays

        self.proto = _named(proto)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        opts.enable_profiling = True
        opts.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
        self.sess = ort.InferenceSession(self.proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        self.feeds = random_arrays(onnx_inputs(self.proto), seed=1)
        self.runs, self.wall, self.cpu = 0, 0.0, 0.0
        for _ in range(self.WARMUP):
            self.sess.run(None, self.feeds)

    def run(self, times: int) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        for _ in range(times):
            self.sess.run(None, self.feeds)
        self.wall += time.perf_counter() - wall
        self.cpu += time.thread_time() - cpu
        self.runs += times

    @property
    def cpu_share(self) -> float:
        """The calling thread's CPU time over the wall time of the profiled runs: with one thread, the share
        of the core the other jobs on the machine left to onnxruntime."""
        return self.cpu / self.wall if self.wall else 1.0

    def nodes(self) -> list[dict]:
        """Each node onnxruntime ran: name, op, median us per run (warm-up runs dropped), anchor key (its
        own for an anchor, the anchor it follows for an elementwise node, None otherwise)."""
        owner, node_of = onnx_anchors(self.proto)
        events = json.load(open(self.sess.end_profiling()))
        durations: dict[str, list[float]] = defaultdict(list)
        info: dict[str, dict] = {}
        for e in events:
            if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
                continue
            name = e["name"][: -len("_kernel_time")]
            durations[name].append(float(e["dur"]))
            info[name] = e["args"]
        rows = []
        for name, ds in durations.items():
            a = info[name]
            op = a.get("op_name", "?")
            kind = ONNX_KIND.get(op)
            ins = [list(next(iter(s.values()))) for s in a.get("input_type_shape", [])]
            outs = [list(next(iter(s.values()))) for s in a.get("output_type_shape", [])]
            # an ONNX node by name, or a fused one named after its output tensor (r0_nchwc): the ONNX
            # graph's shapes (the profile's are onnxruntime's own: NCHWc pads 24 channels to 32)
            # (graph transformers name a node after the one they replace: n5_MatMul/MatMulAddFusion)
            base = name.split("/")[0]
            base = base[: -len("_nchwc")] if base.endswith("_nchwc") else base
            base = base if base in owner else node_of.get(base, "")
            if base in owner:
                key = owner[base]
            else:
                key = anchor_key(kind, outs[0], ins) if kind and ins and outs else None
            rows.append({"name": name, "op": op, "key": key, "us": statistics.median(ds[-self.runs:])})
        return rows


# ---------------------------------------------------------------------------------------------
# The table

def in_model_us(cm, feeds, runs: int, clock) -> tuple[dict[str, float], float]:
    """Microseconds each of the model's functions takes per run inside the model (all its calls), timed by
    the Relax VM's instrument around every call: unlike the functions timed alone, on the caches the
    model leaves them (its weights streamed from L3 or memory), as onnxruntime's profiled nodes are. Also
    the median over ``runs`` of (a plain run) - (the calls of the instrumented run right after it): what
    the VM spends beyond its calls, from runs next to each other (on a shared VM, runs apart differ by
    more than that: at 2026-11-26 17:46 ResNet-50 ran 39.2 ms plain and 40.0 ms in its calls)."""
    vm, spent, start = cm.vm(), defaultdict(float), {}

    def instrument(func, name, before, ret, *args):
        if before:
            start[name] = clock()
        else:
            spent[name] += clock() - start.pop(name)
        return 0  # run the call normally

    run = cm.run_fn(feeds)
    run()  # warm
    beyond = []
    for _ in range(runs):
        t0 = clock()
        run()
        plain = clock() - t0
        before = sum(spent.values())
        vm.set_instrument(instrument)
        try:
            run()
        finally:
            vm.set_instrument(None)
        beyond.append(plain - (sum(spent.values()) - before))
    return {name: t / runs * 1e6 for name, t in spent.items()}, statistics.median(beyond) * 1e6


def breakdown(model: str, rounds: int, ort_runs: int, target: float, device=None, threads: int | None = None,
              cold: bool = False) -> dict:
    import roller
    from roller.models import frontend
    from roller.tir.compile import set_threads

    dev = roller.load_device(device)
    threads = threads or dev.units.count
    set_threads(threads)  # (unless TVM_NUM_THREADS is set)
    proto = models(files=[model])[model]()
    cm = roller.compile_model(proto, dev, name=model, cache=False)  # every function in the one library
    funcs, calls = roller_functions(cm)
    prof = OrtProfile(proto, threads)
    times: list[list[float]] = [[] for _ in funcs]
    # one thread: TVM and onnxruntime run on this thread, so its CPU time is immune to the other jobs on a
    # shared machine (onnxruntime's profiled node times stay wall times: under load, ResNet-50's summed to
    # its end-to-end CPU time while its runs got 55% of the core: the preemption fell outside its nodes)
    one = threads == 1
    cold_timer = ColdTimer(time.thread_time if one else time.perf_counter) if cold else None
    cold_times: list[list[float]] = [[] for _ in funcs]
    for r in range(rounds):  # roller's functions and onnxruntime's profiled runs alternate
        time.sleep(SETTLE_SECONDS)  # each after the other's thread pool went idle (roller.measure.timing)
        for t, c, call in zip(times, cold_times, calls):
            t.append(cpu_seconds(call, target) if one else median_seconds(call, target, repeats=1))
            if cold_timer is not None:  # the same function on caches that hold none of its operands
                c += cold_timer(call, 3)
        time.sleep(SETTLE_SECONDS)
        prof.run(ort_runs // rounds + (r < ort_runs % rounds))
    for f, t, c in zip(funcs, times, cold_times):
        f["us"] = statistics.median(t) * 1e6
        f["cold_us"] = statistics.median(c) * 1e6 if c else None
    nodes = prof.nodes()
    feeds = cm.random_inputs()
    sess = frontend.onnxruntime_session(proto, threads)
    impls = [("roller", cm.run_fn(feeds)), ("onnxruntime", lambda: sess.run(None, feeds))]
    ends = time_alternately(impls, rounds=rounds, target=0.1, repeats=1,
                            measure=(lambda fn: cpu_seconds(fn, 0.1)) if one else None)
    inside, vm_beyond = in_model_us(cm, feeds, rounds, time.thread_time if one else time.perf_counter)
    for f in funcs:
        f["model_us"] = inside.get(f["name"])
    ort_by_key: dict[tuple, list[dict]] = defaultdict(list)
    for n in nodes:
        if n["key"] is not None:
            ort_by_key[n["key"]].append(n)
    roller_calls_by_key: dict[tuple, int] = defaultdict(int)
    for f in funcs:
        if f["key"] is not None:
            roller_calls_by_key[f["key"]] += f["calls"]
    for f in funcs:
        f["total_us"] = f["us"] * f["calls"]
        matched = ort_by_key.get(f["key"], []) if f["key"] else []
        if matched:  # functions sharing a key (same layer shape, different epilogue) share its ORT time
            share = f["calls"] / roller_calls_by_key[f["key"]]
            f["ort_us"] = sum(n["us"] for n in matched) * share
            f["ort_ops"] = sorted({n["op"] for n in matched})
        else:
            f["ort_us"], f["ort_ops"] = None, []
    matched_keys = {f["key"] for f in funcs if f["key"] in ort_by_key}
    ort_alone: dict[str, list[float]] = defaultdict(list)
    for n in nodes:
        if n["key"] not in matched_keys:
            ort_alone[n["op"]].append(n["us"])
    return {"model": model, "device": dev.name, "load": os.getloadavg(), "threads": threads, "functions": funcs,
            "ort_unmatched": {op: {"nodes": len(v), "us": sum(v)} for op, v in ort_alone.items()},
            "roller_sum_us": sum(f["total_us"] for f in funcs), "ort_sum_us": sum(n["us"] for n in nodes),
            "roller_model_us": ends["roller"] * 1e6, "ort_model_us": ends["onnxruntime"] * 1e6,
            "roller_vm_beyond_us": vm_beyond,
            "rounds": rounds, "ort_runs": ort_runs, "clock": "thread CPU time" if one else "wall",
            "ort_cpu_share": prof.cpu_share}


def table(res: dict) -> str:
    funcs = sorted(res["functions"], key=lambda f: -f["total_us"])
    total = res["roller_sum_us"] or 1.0
    cold = any(f.get("cold_us") for f in funcs)
    lines = [f"### {res['model']} (device {res['device']}, {res['threads']} thread(s), load {res['load'][0]:.2f})", "",
             "| function | rule | calls | roller us/call |" + (" cold us/call |" if cold else "")
             + " roller us | roller us in the model | onnxruntime us (nodes) "
             "| ort / roller | ort / roller in the model | share of roller |",
             "|---|---|---|---|" + ("---|" if cold else "") + "---|---|---|---|---|---|"]
    for f in funcs:
        ort = f"{f['ort_us']:.0f} ({', '.join(f['ort_ops'])})" if f["ort_us"] is not None else "- (no node)"
        ratio = f"{f['ort_us'] / f['total_us']:.2f}" if f["ort_us"] is not None and f["total_us"] else "-"
        inside = f.get("model_us")
        ratio_in = f"{f['ort_us'] / inside:.2f}" if f["ort_us"] is not None and inside else "-"
        cold_col = (f" {f['cold_us']:.1f} |" if f.get("cold_us") else " - |") if cold else ""
        lines.append(f"| {f['name']} | {f['scheduled_by']} | {f['calls']} | {f['us']:.1f} |{cold_col} "
                     f"{f['total_us']:.0f} | "
                     f"{f'{inside:.0f}' if inside is not None else '-'} | {ort} | {ratio} | {ratio_in} | {f['total_us'] / total:.1%} |")
    glue = [f for f in funcs if f["ort_us"] is None]
    lines += ["", f"roller functions with no onnxruntime counterpart (layout transforms, copies, unfused "
                  f"elementwise): {len(glue)} functions, {sum(f['calls'] for f in glue)} calls, "
                  f"{sum(f['total_us'] for f in glue):.0f} us ({sum(f['total_us'] for f in glue) / total:.1%})"]
    un = res["ort_unmatched"]
    lines.append("onnxruntime nodes matched to no roller function: "
                 + (", ".join(f"{op} x{v['nodes']} {v['us']:.0f} us" for op, v in sorted(un.items())) or "none"))
    lines += [f"clock: {res['clock']}" + (f" for roller's functions and both models end to end; onnxruntime's nodes "
                                          f"as profiled (wall; its runs got {res['ort_cpu_share']:.0%} of the core)"
                                          if res["clock"] != "wall" else ""),
              f"sum of parts: roller {res['roller_sum_us']:.0f} us alone, "
              + (f"{sum(f['cold_us'] * f['calls'] for f in funcs if f.get('cold_us')):.0f} us alone on cold caches, "
                 if cold else "")
              + f"{sum(f.get('model_us') or 0 for f in res['functions']):.0f} us in the model, "
              f"onnxruntime {res['ort_sum_us']:.0f} us "
              f"(profiled run; median of {res['ort_runs']})",
              f"end to end (alternated, median of {res['rounds']}): roller {res['roller_model_us']:.0f} us, "
              f"onnxruntime {res['ort_model_us']:.0f} us, ort / roller {res['ort_model_us'] / res['roller_model_us']:.2f}; "
              f"roller end to end beyond its parts alone {res['roller_model_us'] - res['roller_sum_us']:+.0f} us "
              f"(its VM beyond its calls, paired runs: {res['roller_vm_beyond_us']:+.0f} us; the rest is the caches "
              f"and the machine's phase), "
              f"onnxruntime beyond its nodes {res['ort_model_us'] - res['ort_sum_us']:+.0f} us"]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mobilenet_v2", help="one of: " + ", ".join(models()) + ", or an ONNX file's path")
    p.add_argument("--device", default=None)
    p.add_argument("--rounds", type=int, default=5, help="timing rounds over all functions (median)")
    p.add_argument("--ort-runs", type=int, default=20, help="profiled onnxruntime runs (median per node)")
    p.add_argument("--target", type=float, default=0.01, help="seconds per function per round")
    p.add_argument("--threads", type=int, default=None,
                   help="threads for roller and onnxruntime (default: the device's cores; 1 is steadier on a shared machine)")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    p.add_argument("--cold", action="store_true",
                   help="also time each function alone on cold caches (benchutil.ColdTimer: 3 calls a round, "
                        "each after a write of twice the last cache): neither weights nor activations cached")
    args = p.parse_args(argv)
    if args.model not in models(files=[args.model]):
        p.error(f"unknown model {args.model!r}; choose from {', '.join(models())}")
    t = time.perf_counter()
    if args.threads:
        os.environ.setdefault("TVM_NUM_THREADS", str(args.threads))
    res = breakdown(args.model, args.rounds, args.ort_runs, args.target, args.device, args.threads, args.cold)
    print(table(res))
    print(f"({time.perf_counter() - t:.0f} s; TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS')})")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=list))
    return 0


if __name__ == "__main__":
    sys.exit(main())
