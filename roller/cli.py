"""The ``roller`` command: ``roller build``, ``roller compile``, ``roller devices``, ``roller calibrate``,
``roller fidelity``, ``roller cache``.

Errors exit non-zero with one line on stderr (``--debug`` shows the traceback).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
import warnings

from roller.errors import RollerError
from roller.builder.farm import BUILD_BUDGET_SECONDS, SKIPPED
from roller.models.relax_pass import PROFILE_BUDGET_SECONDS

EXIT_ERROR = 2


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def _fmt_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.2f} us"
    return f"{s * 1e3:.3f} ms" if s < 1 else f"{s:.2f} s"


def _print_build(report: dict, saved: dict | None) -> None:
    chosen = report["candidates"][report["chosen"]]
    shape = ",".join(f"{k}={v}" for k, v in report["shape"].items())
    shape += "".join(f" --{k} {v}" for k, v in report.get("options", {}).items())
    cal = "calibrated" if report.get("device_calibrated") else "datasheet figures (run `roller calibrate`)"
    print(f"roller build {report['op']} {shape} {report['dtype']} on {report['device']} "
          f"({report['threads']} threads, model: {cal})")
    print("chosen rTiles (per memory level, nearest compute first):")
    for level, tile in chosen["tiles"].items():
        print(f"  {level:>5}: " + " ".join(f"{a}={s}" for a, s in tile.items()))
    if chosen["packed"]:
        print(f"  packed inputs: {', '.join(chosen['packed'])}")
    print(f"  grid over {chosen['units']} units in {chosen['waves']} waves")
    print(f"predicted {_fmt_seconds(chosen['predicted_seconds'])}, measured {_fmt_seconds(report['kernel_seconds'])}"
          + (f", {report['gflops']:.1f} GFLOP/s" if report.get("gflops") else "")
          + f", verified against numpy: {'yes' if report['verified'] else 'NO'}")
    n_ok = sum(1 for c in report["candidates"] if c["verified"])
    skipped = sum(1 for c in report["candidates"] if c["error"] == SKIPPED)
    margin = report.get("profile_margin")
    print(f"{len(report['candidates'])} candidates"
          + (f" (the top-10 predicted within {margin:.1%} of the first: the profiling margin `roller fidelity` "
             f"measured)" if margin is not None else "")
          + f" ({n_ok} verified"
          + (f", {skipped} not built: the build budget of {report['build_budget']:g} s was spent" if skipped else "")
          + f"), chose #{report['chosen']}; "
          + (f"from the kernel cache in {_fmt_seconds(report['build_seconds'])} (built in "
             f"{report['cached_build_seconds']:.2f} s, construct {report['construct_seconds']:.3f} s)"
             if report.get("cache") == "hit" else
             f"construct {report['construct_seconds']:.3f} s, whole build {report['build_seconds']:.2f} s"))
    if saved:
        print(f"wrote {saved['library']} and {saved['report']}")


def _print_gpu_build(report: dict, saved: dict | None) -> None:
    """A GPU build: the chosen tiles, then per candidate the model's resources beside ptxas's."""
    chosen = report["candidates"][report["chosen"]]
    shape = ",".join(f"{k}={v}" for k, v in report["shape"].items())
    print(f"roller build {report['op']} {shape} {report['dtype']} on {report['device']} ({report['arch']}, "
          f"compiled offline)")
    print("chosen rTiles: " + "; ".join(f"{lv} " + " ".join(f"{a}={s}" for a, s in t.items())
                                        for lv, t in chosen["tiles"].items())
          + f"; {chosen['kind']} plan, {chosen['model']['threads']} threads a block, grid of "
          + "x".join(str(g) for g in chosen["grid"].values()) + f" blocks in {chosen['waves']} waves")
    print(f"predicted {_fmt_seconds(chosen['predicted_seconds'])} ({report['predicted_gflops']:.0f} GFLOP/s, "
          f"{report['peak_fraction']:.0%} of the spec's peak); ranking: {report['ranking']}")
    print(f"verified: {'yes' if report['verified'] else 'no' if report['verified'] is False else '-'} "
          f"({report['verified_by']})")
    if report["timed"]:
        print(f"measured {_fmt_seconds(report['kernel_seconds'])} ({report['gflops']:.0f} GFLOP/s)")
    print(f"{'#':>3} {'threads':>7} {'regs model/ptxas':>16} {'spill B':>7} {'smem model/ptxas':>17} "
          f"{'blocks/SM':>9} {'predicted':>10} {'measured':>10}  status")
    for i, c in enumerate(report["candidates"]):
        m, x = c["model"], c["ptxas"] or {}
        spill = (x.get("spill_store_bytes", 0) + x.get("spill_load_bytes", 0)) if x else "-"
        status = ("chosen" if i == report["chosen"] else
                  "dropped: " + "; ".join(c["problems"] or [c["error"] or ""]) if c["dropped"] else "")
        print(f"{i:>3} {m['threads']:>7} {m['registers']:>7}/{x.get('registers', '-'):<8} {spill:>7} "
              f"{m['shared_bytes']:>8}/{x.get('shared_bytes', '-'):<8} {m['blocks_per_sm']:>9} "
              f"{_fmt_seconds(c['predicted_seconds']):>10} "
              f"{_fmt_seconds(c['measured_seconds']):>10}  {status}")
    print(f"construct {report['construct_seconds']:.3f} s, whole build {report['build_seconds']:.2f} s")
    if saved:
        print("wrote " + ", ".join(saved.values()))


def _kernel_request(args) -> dict:
    """build_op's arguments from parsed kernel arguments (see _add_kernel_args), validated: one clear
    error line before anything is built."""
    from roller.tir import ops

    options = {k: getattr(args, k) for k in ops.option_names() if getattr(args, k, None) is not None}
    spec = ops.get_op(args.op).with_options(**options)  # `matmul --kind max`: one clear line, before building
    return dict(op=args.op, shape=ops.parse_shape(spec, args.shape, args.dtype), dtype=args.dtype,
                device=args.device, topk=args.topk, profile=not args.no_profile,
                build_budget=args.build_budget or None, **options)


def cmd_build(args) -> int:
    from roller.builder import api
    from roller.output import check_out_dir

    request = _kernel_request(args)
    if args.out:
        check_out_dir(args.out)  # fail before the build, not after it
    if args.plot:
        from roller.builder.plot import check_plot_path
        from roller.device.load import load_device
        from roller.targets import target_of
        if target_of(load_device(args.device)).offline:
            raise RollerError(f"--plot draws measured candidates; nothing is timed on {args.device} without its GPU: "
                              f"leave --plot out")
        check_plot_path(args.plot)  # matplotlib and the path too
    result = api.build_op(**request, progress=not args.json and sys.stderr.isatty(), cache=not args.no_cache)
    saved = result.save(args.out) if args.out else None
    if args.json:
        print(json.dumps(result.report))
    elif "arch" in result.report:  # a target that builds offline (GpuBuildResult): its architecture, limits
        _print_gpu_build(result.report, saved)
    else:
        _print_build(result.report, saved)
    if args.plot:
        from roller.builder.plot import plot_build
        print(f"wrote the roofline {plot_build(result, args.plot)}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _parse_inputs(items: list[str] | None) -> dict[str, tuple[int, ...]]:
    """``NAME=1x3x224x224`` items -> {name: shape}; ModelError for a malformed item."""
    from roller.errors import ModelError

    out = {}
    for item in items or []:
        name, sep, dims = item.partition("=")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x")) if sep and name and dims else None
        except ValueError:
            shape = None
        if shape is None:
            raise ModelError(f"--input {item!r}: expected NAME=DIMxDIMx..., e.g. --input x=1x3x224x224")
        if name in out:
            raise ModelError(f"--input {name} is given twice")
        out[name] = shape
    return out


def cmd_compile(args) -> int:
    from roller.models import frontend
    from roller.output import check_out_dir

    shapes = _parse_inputs(args.input)
    if args.out:
        check_out_dir(args.out)
    cm = frontend.compile_model(args.model, args.device, shapes, profile=not args.no_profile, topk=args.topk,
                                layout=args.layout, fast_math=not args.exact_math, verify=args.verify,
                                profile_budget=args.profile_budget or None, cache=not args.no_cache,
                                prepack=not args.no_prepack)
    check = frontend.check_against_onnxruntime(cm, args.model)
    saved = cm.export(args.out) if args.out else None
    report = {**cm.to_dict(), **check}
    if saved:
        report["saved"] = saved
    if args.json:
        print(json.dumps(report))
    else:
        _print_compile(report)
    return 0 if check["matches"] else 1


def _print_compile(r: dict) -> None:
    by: dict[str, int] = {}
    for f in r["functions"]:
        by[f["scheduled_by"]] = by.get(f["scheduled_by"], 0) + 1
    print(f"roller compile {r['model']} on {r['device']}: {len(r['functions'])} fused functions ("
          + ", ".join(f"{n} {k}" for k, n in sorted(by.items())) + ")")
    if r.get("graph_folded"):
        print(r["graph_folded"])
    for f in r["functions"]:
        why = f" [{f['reason'][:100]}]" if f["scheduled_by"] != "roller" and f["reason"] else ""
        same = f" (same as {f['reused']})" if f["reused"] else ""
        prof = f" [{f['profiled']}]" if f.get("profiled") else ""
        cached = f" (cache {f['cache']})" if f.get("cache") else ""
        packed = f" (prepacked {', '.join(f['prepacked'])})" if f.get("prepacked") else ""
        rule = f.get("rule") or f["scheduled_by"]  # roller's rules by name: roller (one main block), roller-rows
        print(f"  {f['name']:<48} {rule:<17} {_fmt_seconds(f['seconds']):>10}{cached}{same}{packed}{why}{prof}")
    ph = r["phases"]
    print(f"compile {_fmt_seconds(r['compile_seconds'])} (import {_fmt_seconds(ph['import'])}, legalize+fuse "
          f"{_fmt_seconds(ph['legalize'])}, schedule {_fmt_seconds(ph['schedule'])}, build {_fmt_seconds(ph['build'])})")
    peers = []
    for peer in r.get("peers", ["onnxruntime"]):
        ratio = r[f"{peer}_over_roller"]
        verdict = f"roller is {ratio:.2f}x faster" if ratio >= 1 else f"roller is {1 / ratio:.2f}x slower"
        peers.append(f"{peer} {_fmt_seconds(r[f'{peer}_latency_seconds'])}: {verdict}")
    fastest = f"; fastest peer {r['fastest_peer']}" if len(peers) > 1 else ""
    print(f"latency {_fmt_seconds(r['latency_seconds'])}, " + ", ".join(peers)
          + f" (medians and paired ratios of {r['timing']['rounds']} alternating rounds{fastest})")
    if r.get("openvino_error"):
        print(f"openvino: {r['openvino_error']}")
    tol = r["tolerance"]["tol_by_dtype"]["float32"]
    err = {k: "-" if r[k] is None else f"{r[k]:.3g}" for k in ("max_abs_error", "max_rel_error")}
    print(f"max abs error {err['max_abs_error']}, max rel error {err['max_rel_error']}; matches onnxruntime "
          f"(max|error| <= {tol:g} x max|onnxruntime| per output for float32): {'yes' if r['matches'] else 'NO'}")
    if r.get("saved"):
        print(f"wrote {r['saved']['library']} and {r['saved']['report']}")


def cmd_devices(args) -> int:
    from roller.device.load import load_device
    from roller.device.spec import shipped_specs
    from roller.device.calibration import MEASURED_SOURCE

    names = ["host"] + list(shipped_specs())
    rows = []
    for name in names:
        try:
            dev = load_device(name)
        except RollerError as e:
            rows.append({"name": name, "error": str(e)})
            continue
        row = dev.to_dict()
        spec_model = ((dev.calibration or {}).get("datasheet") or {}).get("model") or {}
        for name, value in spec_model.items():  # the spec's value of each term a calibration probe measured
            if name in row["model"]:
                row["model"][name]["spec_value"] = value
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for d in rows:
        if "error" in d:
            print(f"{d['name']}: unavailable: {d['error']}")
            continue
        u = d["units"]
        peaks = ", ".join(f"{k} {v:.0f}" for k, v in u["peak_gflops"].items())
        print(f"{d['name']}: {d['description']}")
        print(f"  units: {u['count']}, peak GFLOP/s per unit: {peaks} "
              f"[{'calibrated' if d['calibrated'] else 'datasheet'}]")
        g = d.get("gpu")
        if g:
            print(f"  GPU limits: {g['max_threads_per_block']} threads per block, {g['max_threads_per_sm']} threads and "
                  f"{g['max_blocks_per_sm']} blocks per SM, {g['registers_per_sm']} registers per SM (at most "
                  f"{g['max_registers_per_thread']} per thread), shared memory {_fmt_bytes(g['shared_per_block'])} "
                  f"per block ({_fmt_bytes(g['shared_per_block_optin'])} opt-in), "
                  f"{_fmt_bytes(g['shared_per_sm'])} per SM; warp {u['warp_threads']}")
        # a GPU's per-unit levels hold one thread's registers and one block's shared memory
        holders = iter(("per thread", "per block") if g else ())
        for lv in d["levels"]:
            where = "shared" if lv["shared"] else next(holders, "per unit")
            print(f"  {lv['name']:>5}: {_fmt_bytes(lv['capacity_bytes'])} {where}, "
                  f"{lv['bandwidth_gbps']:.0f} GB/s per unit, {lv['total_bandwidth_gbps']:.0f} GB/s all units")
        model = d.get("model") or {}
        if model:
            # terms a calibration probe measured are marked; the spec's value is in the calibration's datasheet
            print("  model: " + ", ".join(f"{k} {e['value']:g}" + (
                f" [measured; spec {e['spec_value']:g}]" if "spec_value" in e else " [measured]"
                if e["source"].startswith(MEASURED_SOURCE) else "") for k, e in model.items())
                  + " (sources: roller devices --json)")
        print(f"  source: {d['source']}")
    return 0


def _cache_location() -> str:
    from roller.cache import open_store
    return open_store().location


def cmd_cache_list(args) -> int:
    from roller.cache import open_store

    rows = [e.to_dict() for e in open_store().entries()]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        shape = ",".join(f"{k}={v}" for k, v in (r["shape"] or {}).items())
        shape += "".join(f" --{k} {v}" for k, v in r["op_options"].items())
        built = r["build_options"]
        tier = f"top-{built.get('topk')} profiled" if built.get("profile") else "top-1"
        used = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["last_used"]))
        print(f"{r['key'][:16]}  {r['op'] or '?'} {shape} {r['dtype'] or ''} on {r['device']}  {tier}  {_fmt_bytes(r['bytes'])}  "
              f"last used {used}")
    print(f"{len(rows)} kernels in {_cache_location()}")
    return 0


def cmd_cache_stats(args) -> int:
    from roller.cache import open_store

    st = open_store().stats()
    if args.json:
        print(json.dumps(st))
        return 0
    rate = "-" if st["hit_rate"] is None else f"{st['hit_rate']:.0%}"
    print(f"{st['location']}: {st['entries']} kernels, {_fmt_bytes(st['bytes'])} of {_fmt_bytes(st['max_bytes'])}; "
          f"{st['hits']} hits, {st['misses']} misses (hit rate {rate}), {st['corrupt']} corrupt entries rebuilt, "
          f"{st['evictions']} evicted")
    return 0


def cmd_cache_clear(args) -> int:
    from roller.cache import open_store

    store = open_store()
    n = store.clear()
    print(json.dumps({"removed": n, "location": store.location}) if args.json
          else f"removed {n} kernels from {store.location}")
    return 0


class _LineParser(argparse.ArgumentParser):
    """Parses one line of a warm file: errors are raised (and named by line), not printed and exited."""

    def error(self, message):
        raise RollerError(message)


def _check_limits(args) -> str | None:
    if args.topk is not None and args.topk < 1:
        return "--topk must be at least 1"
    if args.build_budget < 0:
        return "--build-budget must be 0 (no limit) or more seconds"
    return None


def cmd_cache_warm(args) -> int:
    """Builds every kernel listed in a file (one `OP --shape ... [options]` line each) into the cache.
    Every line is checked before the first build; a build that fails is reported and the rest go on."""
    import shlex
    from pathlib import Path

    from roller.builder import api

    try:
        lines = Path(args.file).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise RollerError(f"{args.file}: cannot be read ({getattr(e, 'strerror', None) or e}); "
                          f"give a text file of `OP --shape NAME=V,...` lines") from None
    parser = _LineParser(prog="roller cache warm line", add_help=False)
    _add_kernel_args(parser)
    requests = []
    for n, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            parsed = parser.parse_args(shlex.split(text))
            problem = _check_limits(parsed)
            if problem:
                raise RollerError(problem)
            requests.append((n, text, _kernel_request(parsed)))
        except (RollerError, ValueError) as e:
            raise RollerError(f"{args.file}:{n}: {e}") from None
    if not requests:
        raise RollerError(f"{args.file}: no kernels listed; give one `OP --shape NAME=V,...` line per kernel")
    failed = 0
    for n, text, request in requests:
        try:
            report = api.build_op(**request).report
        except RollerError as e:
            failed += 1
            print(f"roller: error: {args.file}:{n}: {text}: {e}", file=sys.stderr)
            continue
        print(json.dumps({"line": n, "kernel": text, "cache": report["cache"], "key": report["cache_key"],
                          "seconds": report["build_seconds"]}) if args.json
              else f"{report['cache']:>4}  {text}  ({_fmt_seconds(report['build_seconds'])})")
    if not args.json:
        print(f"{len(requests) - failed} of {len(requests)} kernels in the cache {_cache_location()}")
    return EXIT_ERROR if failed else 0


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    return f"roller: warning: {message}\n"


def _add_kernel_args(b: argparse.ArgumentParser) -> None:
    """The arguments that say which kernel to build (roller build, and each line of roller cache warm)."""
    from roller.tir.ops import OPS, option_names

    b.add_argument("op", choices=sorted(OPS), help="operator")
    b.add_argument("--shape", required=True,
                   help="sizes as NAME=V,...: " + "; ".join(f"{n}: {','.join(s.shape_keys)}"
                                                           + (f" [+{','.join(s.optional_keys)}]" if s.optional_keys else "")
                                                           for n, s in sorted(OPS.items())))
    for opt, owners in option_names().items():  # validated by the operator (one error line), not by argparse
        allowed = OPS[owners[0]].options[opt]
        b.add_argument(f"--{opt}", metavar="|".join(allowed),
                       help=f"{', '.join(owners)} only: {' or '.join(allowed)} (default {allowed[0]})")
    b.add_argument("--dtype", default="float32", help="element type (default float32)")
    b.add_argument("--device", default=None, help="'host' (default), a shipped spec name, or a YAML spec path")
    b.add_argument("--topk", type=int, default=None,
                   help="candidates to build and time (default: those of the top 10 the model predicts within its "
                        "profiling margin of the first, as `roller fidelity` last measured it on this device; all 10 "
                        "where it has not)")
    b.add_argument("--no-profile", action="store_true", help="build only the model's first plan (still verified)")
    b.add_argument("--build-budget", type=float, default=BUILD_BUDGET_SECONDS, metavar="SECONDS",
                   help="seconds of compiling after which candidates not yet started are skipped "
                        f"(default {BUILD_BUDGET_SECONDS:g}; 0: build all top-k)")


def _print_table(device, cal: dict, path) -> None:
    from roller.device.calibration import calibration_summary

    print(f"{device.name} ({device.description or device.source}), fingerprint {device.fingerprint}, "
          f"{cal['threads']} threads, {cal['seconds']:.1f} s")
    print(f"  {'field':<28} {'datasheet':>10} {'measured':>10}")
    for field, ds, got in calibration_summary(device.with_calibration(cal)):
        fmt = "10.4g" if field.startswith("model.") else "10.1f"  # a term may be 7.5e-08 seconds
        shown = f"{got:{fmt}}" if got is not None else f"{'-':>10}"
        print(f"  {field:<28} {ds:{fmt}} {shown}")
    for dt, v in cal["peak_gflops_one"].items():
        print(f"  {'peak_gflops_one_alone.' + dt:<28} {'':>10} {v:10.1f}")
    for dt, v in cal["peak_gflops_all"].items():
        print(f"  {'peak_gflops_all_units.' + dt:<28} {'':>10} {v:10.1f}")
    for dt, v in (cal.get("tensor_peak_gflops_all") or {}).items():
        print(f"  {'tensor_peak_all_units.' + dt:<28} {'':>10} {v:10.1f}")
    for dt, why in cal["skipped"].items():
        print(f"  {dt}: not measured: {why}")
    st = cal["small_transfer"]
    rows = ", ".join(f"{r['bytes']} B {r['gbps']:.2f}" for r in st["rows"])
    print(f"  small transfer ({st['level']}, rows {st['stride_bytes']} B apart, GB/s useful): {rows}; "
          f"contiguous {st['contiguous_gbps']:.1f}")
    for w in cal["warnings"]:
        print(f"  warning: {w}")
    print(f"  written to {path}")


def cmd_calibrate(args) -> int:
    """``roller calibrate``: measure, save, print a table (or one JSON object with --json)."""
    from roller.device import load_device
    from roller.device.calibration import save_calibration
    from roller.measure.alone import measuring_alone
    from roller.targets import target_of

    device = load_device(args.device, calibrated=False)
    if args.check and target_of(device).offline:  # before calibrating, not after
        raise RollerError(f"--check times kernels on this machine's CPU; {device.name!r} is a {device.kind} device: "
                          f"leave --check out")
    with measuring_alone():  # the device's own microbenchmarks (a GPU spec: on that GPU; one-line error without it)
        cal = target_of(device).calibrate(device, quick=args.quick, progress=not args.json and sys.stderr.isatty())
        path = save_calibration(device, cal, args.out)
    check = None
    if args.check:  # the quick fidelity on the figures just measured (also where --out put them elsewhere)
        from roller.builder import fidelity

        shapes, selection = fidelity.select_shapes(quick=True)
        if not args.json:
            _print_table(device, cal, path)
            print("checking the model on the new figures: roller fidelity --quick", flush=True)
        check = _run_fidelity(device.with_calibration(cal), shapes, selection, quick=True,
                              samples=fidelity.QUICK_SAMPLES, topk=fidelity.TOPK, rounds=fidelity.ROUNDS,
                              text=not args.json)
    if args.json:
        out = {"device": cal["device"], "fingerprint": cal["fingerprint"], "path": str(path),
               "seconds": cal["seconds"], "threads": cal["threads"], "quick": cal["quick"],
               "peak_gflops": cal["peak_gflops"], "peak_gflops_one": cal["peak_gflops_one"],
               "peak_gflops_all": cal["peak_gflops_all"],
               **{k: cal[k] for k in ("tensor_peak_gflops", "tensor_peak_gflops_one", "tensor_peak_gflops_all")
                  if k in cal},
               "bandwidth_gbps": {lv: m["unit"] for lv, m in cal["bandwidth_gbps"].items()},
               "bandwidth_total_gbps": {lv: m["total"] for lv, m in cal["bandwidth_gbps"].items()},
               "small_transfer": cal["small_transfer"], "skipped": cal["skipped"], "warnings": cal["warnings"],
               "model": {name: e["value"] for name, e in (cal.get("model") or {}).items()}}
        if check is not None:
            out["fidelity"] = check
        print(json.dumps(out))
    elif check is None:
        _print_table(device, cal, path)
    return 0


def _run_fidelity(device, shapes, selection: str, *, quick: bool, samples: int, topk: int, rounds: int,
                  text: bool, verbose: bool = False, dump: str | None = None) -> dict:
    """Runs the fidelity study with the machine to itself, saves its record; prints each shape and the
    summary when ``text`` (progress bars on stderr when it is a terminal). Returns the record with its path."""
    from roller.builder import fidelity
    from roller.device.fidelity_record import save_fidelity
    from roller.measure.alone import measuring_alone

    fidelity.check_request(device, shapes, samples, topk, rounds)  # one error line before anything is printed
    if text:
        cal = (f"calibrated {device.calibration.get('created', '')}".rstrip() if device.calibrated
               else "DATASHEET figures (run `roller calibrate`)")
        print(f"roller fidelity on {device.name} (fingerprint {device.fingerprint}; model: {cal}; "
              f"{device.units.count} threads): {len(shapes)} shapes, top-{topk} + {samples} random plans each, "
              f"every plan timed in {rounds} round{'s' if rounds > 1 else ''} (each a median of repeats)", flush=True)

    def on_shape(s) -> None:
        if text:
            print(fidelity.shape_line(s), flush=True)
            if verbose:
                print("\n".join(fidelity.verbose_lines(s)), flush=True)

    with measuring_alone():
        record, studies = fidelity.run(device, shapes, samples=samples, topk=topk, rounds=rounds, quick=quick,
                                       selection=selection, progress=text and sys.stderr.isatty(), on_shape=on_shape)
    path = save_fidelity(device, record)
    if text:  # before the dump: a dump that cannot be written loses no figure
        print("\n".join(fidelity.summary_lines(record)))
        print(f"wrote {path} ({record['seconds']:.0f} s)", flush=True)
    if dump:
        fidelity.write_dump(studies, dump)
        if text:
            print(f"wrote {dump}")
    return {**record, "path": str(path)}


def cmd_fidelity(args) -> int:
    """``roller fidelity``: how well the cost model ranks plans on this device (roller.builder.fidelity)."""
    from roller.builder import fidelity
    from roller.device import load_device

    shapes, selection = fidelity.select_shapes(args.quick, args.shapes, args.shape)
    if args.list:
        for op, s in shapes:
            print(fidelity.label(op, s))
        return 0
    if not shapes:
        raise RollerError(f"no shape matches {' '.join(args.shapes)}; `roller fidelity --list` shows the labels")
    samples = args.samples if args.samples is not None else (fidelity.QUICK_SAMPLES if args.quick else fidelity.SAMPLES)
    if args.dump:
        fidelity.check_dump(args.dump)  # fail now, not after minutes of measuring
    device = load_device(args.device)
    record = _run_fidelity(device, shapes, selection, quick=args.quick, samples=samples, topk=args.topk,
                           rounds=args.rounds, text=not args.json, verbose=args.verbose, dump=args.dump)
    if args.json:
        print(json.dumps(record))
    return 0


def _add_fidelity(subparsers) -> argparse.ArgumentParser:
    """Adds ``fidelity`` to the ``roller`` command's subparsers (handler in ``func``)."""
    from roller.builder import fidelity

    p = subparsers.add_parser(
        "fidelity", help="how well the cost model ranks plans on this device (predicted against measured)",
        description="Per shape, builds the model's top-K plans and random valid ones, checks each against numpy "
                    "and times it; prints Spearman's correlation of predicted and measured time, the model's "
                    "first plan against the measured best, and the model's relative error, against issue 33's "
                    f"targets (first plan within {fidelity.FIRST_WITHIN - 1:.0%} of the best on "
                    f"{fidelity.FIRST_SHARE:.0%} of shapes, mean Spearman >= {fidelity.MEAN_SPEARMAN}); saves the "
                    "summary beside the device's calibration.")
    p.add_argument("--device", default=None, metavar="NAME|PATH",
                   help="'host' (default), a shipped spec name or a YAML spec (a CPU: kernels run here)")
    p.add_argument("--quick", action="store_true",
                   help=f"{len(fidelity.QUICK)} shapes (two compute-bound, two memory-bound), "
                        f"{fidelity.QUICK_SAMPLES} random plans each")
    p.add_argument("--shapes", nargs="+", metavar="SUBSTRING",
                   help="only the shapes whose label contains one of these (see --list)")
    p.add_argument("--shape", action="append", metavar="OP:K=V,...",
                   help="study this shape instead of the built-in list (repeat for more), any operator of "
                        "`roller build`, e.g. matmul:M=64,N=64,K=64")
    p.add_argument("--list", action="store_true", help="print the shapes' labels and exit")
    p.add_argument("--samples", type=int, default=None,
                   help=f"random plans per shape on top of the top-K (default {fidelity.SAMPLES}; "
                        f"{fidelity.QUICK_SAMPLES} with --quick)")
    p.add_argument("--topk", type=int, default=fidelity.TOPK,
                   help=f"the constructor's plans per shape (default {fidelity.TOPK})")
    p.add_argument("--rounds", type=int, default=fidelity.ROUNDS,
                   help=f"timing rounds over all candidates, their median (default {fidelity.ROUNDS})")
    p.add_argument("--json", action="store_true", help="print one JSON object (the saved record and its path)")
    p.add_argument("--verbose", action="store_true",
                   help="print the model's first plan, the measured best and every candidate's times")
    p.add_argument("--dump", metavar="FILE", help="write every candidate (plan, predicted, measured) as JSON")
    p.set_defaults(func=cmd_fidelity)
    return p


def _add_calibrate(subparsers) -> argparse.ArgumentParser:
    """Adds ``calibrate`` to the ``roller`` command's subparsers (handler in ``func``)."""
    p = subparsers.add_parser("calibrate", help="measure this machine's peak compute and bandwidths once",
                              description="Measure peak GFLOP/s per dtype and the bandwidth of every memory "
                                          "level with TVM microbenchmarks (for a GPU spec: CUDA kernels on that "
                                          "GPU, which must be in this machine); the result replaces the "
                                          "datasheet figures of the device from then on.")
    p.add_argument("--device", default=None, metavar="NAME|PATH",
                   help="'host' (default), a shipped spec name or a YAML spec describing this machine")
    p.add_argument("--out", default=None, metavar="PATH", help="write the calibration here instead of the cache")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats (about 10 s instead of 25 s)")
    p.add_argument("--check", action="store_true",
                   help="then run `roller fidelity --quick` on the new figures and print its summary (minutes)")
    p.set_defaults(func=cmd_calibrate)
    return p


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="roller", description="Fast tensor kernels by construction (Roller) on TVM.")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="construct, build, verify and time a kernel for an operator")
    _add_kernel_args(b)
    b.add_argument("--no-cache", action="store_true",
                   help="build afresh, neither reading nor writing the kernel cache ($ROLLER_CACHE)")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.add_argument("--out", metavar="DIR", help="write the kernel library and the report into DIR")
    b.add_argument("--plot", metavar="FILE", help="draw a roofline of the candidates (predicted and measured) "
                                                  "into FILE.png / .svg / .pdf; needs roller[plot] (matplotlib)")
    b.set_defaults(func=cmd_build)

    c = sub.add_parser("compile", help="compile a whole ONNX model, check it against onnxruntime, time both")
    c.add_argument("model", help="an .onnx file")
    c.add_argument("--device", default=None, help="'host' (default), a shipped spec name, or a YAML spec path")
    c.add_argument("--input", action="append", metavar="NAME=1x3x224x224",
                   help="an input's shape (repeat per input); needed for symbolic dimensions")
    c.add_argument("--no-profile", action="store_true",
                   help="use the model's first plan per function (default: profile the top --topk)")
    c.add_argument("--topk", type=int, default=10,
                   help="plans considered per roller function (default 10): of them, those predicted within the "
                        "device's profiling margin of the first (`roller fidelity`; within 2x without a record) are "
                        "built and timed")
    c.add_argument("--profile-budget", type=float, default=PROFILE_BUDGET_SECONDS, metavar="SECONDS",
                   help="profile functions, largest predicted share of the model first, until SECONDS are "
                        f"spent (default {PROFILE_BUDGET_SECONDS:g}; 0: no limit)")
    c.add_argument("--layout", choices=("NHWC", "NCHW"), default="NHWC",
                   help="convolutions' activation layout (default NHWC; NCHW keeps the model's)")
    c.add_argument("--exact-math", action="store_true",
                   help="keep erf/exp/tanh/softmax exact (default: TVM's fast approximations, within ~1e-7)")
    c.add_argument("--verify", action="store_true",
                   help="check each scheduled function against TVM's unscheduled build (falls back if wrong)")
    c.add_argument("--no-cache", action="store_true",
                   help="with --no-profile: compile the model whole, neither reading nor writing the kernel "
                        "cache (default: each fused function from the cache, or compiled alone into it)")
    c.add_argument("--no-prepack", action="store_true",
                   help="kernels copy their constant inputs per call (default: weights packed once, at compile "
                        "time, in each kernel's tiles)")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.add_argument("--out", metavar="DIR", help="write the model library (relax.VirtualMachine) and the report")
    c.set_defaults(func=cmd_compile)

    d = sub.add_parser("devices", help="list the devices roller knows (host and shipped specs)")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_devices)

    c = sub.add_parser("cache", help="the persistent kernel cache: list, stats, clear, warm")
    csub = c.add_subparsers(dest="cache_command", required=True)
    for cmd, fn, text in (("list", cmd_cache_list, "the cached kernels, most recently used first"),
                          ("stats", cmd_cache_stats, "entries, size, bound, hits and misses"),
                          ("clear", cmd_cache_clear, "remove every cached kernel and the statistics")):
        cp = csub.add_parser(cmd, help=text)
        cp.add_argument("--json", action="store_true")
        cp.set_defaults(func=fn)
    cw = csub.add_parser("warm", help="build the kernels a file lists (one `OP --shape ... [options]` line each, "
                                      "'#' comments) into the cache, e.g. at deploy time")
    cw.add_argument("file")
    cw.add_argument("--json", action="store_true", help="one JSON object per kernel")
    cw.set_defaults(func=cmd_cache_warm)

    _add_calibrate(sub)
    _add_fidelity(sub)
    # --debug is accepted after the subcommand too; SUPPRESS keeps a --debug given before it
    for parser in [*sub.choices.values(), *csub.choices.values()]:
        parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors")
    return p


def main(argv=None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.command == "build" and _check_limits(args):
        parser.error(_check_limits(args))
    warnings.formatwarning = _one_line_warning  # roller's warnings are messages to the user, not code sites
    try:
        return args.func(args)
    except RollerError as e:
        if args.debug:
            traceback.print_exc()
            if getattr(e, "details", ""):
                print(e.details, file=sys.stderr)
        print(f"roller: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("roller: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug of ours: still one line, the traceback on request
        if args.debug:
            traceback.print_exc()
        print(f"roller: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
