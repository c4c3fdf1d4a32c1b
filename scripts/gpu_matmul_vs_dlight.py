"""Matmul on a GPU spec, offline: roller's chosen tiles and predicted time beside TVM dlight's gpu.Matmul for
the same target, with the registers / shared memory / spills ptxas reports for both kernels.

    python3 scripts/gpu_matmul_vs_dlight.py                     # 4096^3 fp32 on the a100 spec
    python3 scripts/gpu_matmul_vs_dlight.py --device h100 --shape 1024,1024,1024

No GPU is used: nothing is timed. "predicted" is roller's model, for dlight's tiles too (its thread tile
micro_size_x x micro_size_y, its block tile that times the thread grid, micro_size_k a step). Needs the
cuda extra (pip install -e ".[cuda]").
"""
from __future__ import annotations

import argparse
import sys


def _product(values) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="a100", help="a GPU spec (default a100)")
    ap.add_argument("--shape", default="4096,4096,4096", help="M,N,K (default 4096,4096,4096)")
    ap.add_argument("--topk", type=int, default=10, help="roller candidates compiled (default 10)")
    args = ap.parse_args(argv)
    m, n, k = (int(x) for x in args.shape.split(","))

    import tvm
    import tvm.s_tir.dlight as dl

    from roller.targets.cuda import toolchain as cudatools, construct as gpu_construct
    from roller.tir import ops
    from roller.builder.api import analyze
    from roller.targets.cuda.schedule import CudaBuild
    from roller.targets.cuda.launch import kernel_launches, lower
    from roller.device.load import load_device
    from roller.targets.cuda.build import build_gpu
    from roller.tir.compile import target_for

    reason = cudatools.missing()
    if reason:
        print(f"cannot compile CUDA here: {reason}", file=sys.stderr)
        return 2
    dev = load_device(args.device)
    func = ops.matmul(m, n, k)
    expr, _ = analyze(func)
    peak = dev.units.peak("float32") * dev.units.count
    print(f"matmul {m}x{n}x{k} float32 on {dev.name} ({dev.target['arch']}, {dev.units.count} SMs, "
          f"fp32 peak {peak / 1e3:.1f} TFLOP/s from the spec); nothing is timed (no GPU)")

    res = build_gpu(func, dev, args.topk, {"op": "matmul"})
    p, b = res.program, res.build
    r = b.main()
    thread, block = p.tiles

    def line(name, thread, block, threads, grid, predicted, r):
        print(f"{name:<7} thread tile {thread['m']}x{thread['n']}, block tile {block['m']}x{block['n']}x{block['k']}, "
              f"{threads} threads, {grid} blocks | predicted {predicted * 1e3:.3f} ms = "
              f"{expr.flops / predicted / 1e12:.1f} TFLOP/s = {expr.flops / predicted / 1e9 / peak:.0%} of peak | "
              f"ptxas: {r.registers} registers, {r.shared_bytes} B shared, "
              f"{r.spill_store_bytes + r.spill_load_bytes} B spilled")

    line("roller", thread, block, p.gpu.threads, _product(p.grid.values()), p.predicted_seconds, r)
    print(f"        model: {p.gpu.model.registers} registers (estimate), {p.gpu.model.shared_bytes} B shared, "
          f"{p.gpu.model.blocks_per_sm} blocks per SM ({p.gpu.model.limited_by}), {p.waves} waves; "
          f"{len(res.report['dropped'])} of {len(res.report['candidates'])} candidates dropped by ptxas's counts")

    target = target_for(dev)
    mod = tvm.IRModule({"main": func})
    with target:
        scheduled = dl.ApplyDefaultSchedule(dl.gpu.Matmul())(mod.clone())
    cfg = dl.gpu.Matmul().get_configs(target)
    src = tvm.compile(scheduled, target).mod.imports[0].inspect_source("")
    ptx = cudatools.to_ptx(src, b.arch)
    cubin, resources = cudatools.assemble(ptx, b.arch)
    launches = kernel_launches(lower(scheduled, target)[0])
    dres = CudaBuild(b.arch, src, ptx, cubin, tuple(resources), launches, ()).main()
    (launch,) = [la for la in launches if la.kernel == dres.kernel]
    d_thread = {"m": cfg.micro_size_x, "n": cfg.micro_size_y, "k": 1}
    d_block = {"m": cfg.block_size_x * cfg.micro_size_x * cfg.vthread_x,
               "n": cfg.block_size_y * cfg.micro_size_y * cfg.vthread_y, "k": cfg.micro_size_k}
    d_plan = gpu_construct.plan(expr, [d_thread, d_block], dev)
    threads = _product(v for key, v in launch.extents.items() if key.startswith("threadIdx"))
    blocks = _product(v for key, v in launch.extents.items() if key.startswith("blockIdx"))
    line("dlight", d_thread, d_block, threads, blocks, d_plan.predicted_seconds, dres)
    print(f"        dlight config: {cfg}; launch {launch.extents}")
    print(f"        roller's model for dlight's tiles: {d_plan.gpu.model.registers} registers (estimate), "
          f"{d_plan.gpu.model.shared_bytes} B shared (without dlight's own padding), "
          f"{d_plan.gpu.model.blocks_per_sm} blocks per SM, {d_plan.waves} waves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
