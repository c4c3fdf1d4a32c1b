"""One-time calibration of a device: measured peak compute and bandwidths replace datasheet figures.

``run_calibration`` measures the device with TVM kernels (package ``microbench``) in a worker process
(a GPU spec: ``microbench.gpu.calibrate_gpu``, CUDA kernels on that GPU through TVM's CUDA runtime),
``save_calibration`` writes the result to a per-user cache file keyed by device name and fingerprint,
and ``load_calibration`` (called by ``roller.device.load_device``) reads it back. A bad cache file is
ignored with one warning naming it, never fatal. ``roller calibrate`` is the command-line face.

File schema (``SCHEMA``): ``peak_gflops`` {dtype: GFLOP/s per unit}, ``bandwidth_gbps`` {level:
{"unit": GB/s, "total": GB/s, ...}} (what ``Device.with_calibration`` consumes), plus ``schema``,
``device``, ``fingerprint``, ``created``, ``seconds``, ``tvm_version``, ``threads``, ``peak_gflops_one``
(one unit alone), ``peak_gflops_all`` (all units together),
``small_transfer``, ``sweep``, ``skipped``, ``datasheet`` and ``warnings``.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Mapping

from .device import Device
from .output import atomic_write_bytes
from .errors import CalibrationError

SCHEMA = 1
CACHE_ENV = "ROLLER_CACHE_DIR"


class CalibrationWarning(UserWarning):
    """A calibration file was ignored, or a measured figure looks implausible."""


# ---------------------------------------------------------------------------------------------
# The cache file.

def cache_dir() -> Path:
    """roller's per-user cache folder: ``$ROLLER_CACHE_DIR`` if set, else the platform's cache dir."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    import platformdirs
    return Path(platformdirs.user_cache_dir("roller"))


def calibration_path(device: Device) -> Path:
    """Where ``device``'s calibration lives: ``<cache>/calibration/<name>-<fingerprint>.json``."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", device.name) or "device"
    return cache_dir() / "calibration" / f"{name}-{device.fingerprint or 'nofingerprint'}.json"


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def validate_calibration(data: Any, device: Device | None = None) -> str | None:
    """What is wrong with a calibration dict (None if usable): schema, fingerprint, figures."""
    if not isinstance(data, Mapping):
        return "not a JSON object"
    if data.get("schema") != SCHEMA:
        return f"schema {data.get('schema')!r}, this roller reads schema {SCHEMA}"
    if device is not None and data.get("fingerprint") != device.fingerprint:
        return (f"it is for fingerprint {data.get('fingerprint')!r}, the device has {device.fingerprint!r} "
                f"(the hardware or spec changed)")
    peaks = data.get("peak_gflops")
    if not isinstance(peaks, Mapping) or not peaks:
        return "peak_gflops is missing or empty"
    for dt, v in peaks.items():
        if not _positive(v):
            return f"peak_gflops.{dt} is {v!r}, expected a positive number"
    if data.get("clock_ghz") is not None and not _positive(data["clock_ghz"]):
        return f"clock_ghz is {data['clock_ghz']!r}, expected a positive number (or none)"
    bws = data.get("bandwidth_gbps")
    if not isinstance(bws, Mapping):
        return "bandwidth_gbps is missing"
    for lv, m in bws.items():
        if not isinstance(m, Mapping) or not _positive(m.get("unit")) or not _positive(m.get("total")):
            return f"bandwidth_gbps.{lv} needs positive 'unit' and 'total' GB/s, got {m!r}"
        if device is not None and lv not in {x.name for x in device.levels}:
            return f"bandwidth_gbps.{lv}: the device has no level {lv!r}"
    return None


def load_calibration(device: Device) -> dict | None:
    """The cached calibration of ``device``, or None when there is none or it is unusable.

    An unreadable, corrupt, truncated, wrong-schema or other-fingerprint file gives one
    CalibrationWarning naming the file and saying to rerun ``roller calibrate``; never an exception.
    """
    path = calibration_path(device)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        _warn_bad(path, f"cannot be read ({e.strerror or e})")
        return None
    except UnicodeDecodeError:
        _warn_bad(path, "is not text (binary garbage: corrupt)")
        return None
    try:
        data = json.loads(text)
    except ValueError as e:
        _warn_bad(path, f"is not valid JSON ({e}; truncated or corrupt)")
        return None
    problem = validate_calibration(data, device)
    if problem:
        _warn_bad(path, problem)
        return None
    return data


def _warn_bad(path: Path, why: str) -> None:
    warnings.warn(f"ignoring calibration file {path}: {why}; using datasheet figures, "
                  f"rerun `roller calibrate` to measure the device again", CalibrationWarning, stacklevel=3)


def save_calibration(device: Device, data: Mapping, path: str | os.PathLike | None = None) -> Path:
    """Writes ``data`` atomically (temp file + os.replace, under a file lock); returns the path.

    Concurrent savers never leave a partial file: each writes its own temp file and the rename is
    atomic; the lock orders them. CalibrationError if the data is unusable or the folder unwritable.
    """
    from filelock import FileLock, Timeout

    problem = validate_calibration(data, None)
    if problem:
        raise CalibrationError(f"refusing to save a calibration for {device.name!r}: {problem}")
    target = Path(path) if path is not None else calibration_path(device)
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(target) + ".lock", timeout=60):
            atomic_write_bytes(target, text.encode())
    except Timeout:
        raise CalibrationError(f"{target}: another process holds {target}.lock for over 60 s; "
                               f"wait for it or delete the lock file") from None
    except OSError as e:
        raise CalibrationError(f"{target}: cannot write the calibration ({e.strerror or e}); "
                               f"pick a writable --out or set {CACHE_ENV}") from None
    return target


# ---------------------------------------------------------------------------------------------
# Measuring.

MEASURE_LOCK_SECONDS = 900.0  # how long a calibration waits for another one on this machine


@contextlib.contextmanager
def measuring_alone():
    """Holds this machine's calibration lock (``calibrate.lock`` in :func:`cache_dir`): calibrations run
    one after the other, each with the cores to itself (two at once measured 30 and 50 GB/s of DRAM
    bandwidth against 55 alone, and the last to save won). Says so on stderr when it has to wait."""
    from filelock import FileLock, Timeout

    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(folder / "calibrate.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"roller: waiting for another calibration on this machine to end ({folder / 'calibrate.lock'})",
              file=sys.stderr)
        try:
            lock.acquire(timeout=MEASURE_LOCK_SECONDS)
        except Timeout:
            raise CalibrationError(f"another calibration has held {folder / 'calibrate.lock'} for over "
                                   f"{MEASURE_LOCK_SECONDS:g} s; wait for it or delete the lock file") from None
    try:
        yield
    finally:
        lock.release()

def _run_worker(plan: dict, progress: bool) -> dict:
    """Runs microbench.runner in a fresh process with the plan's thread count; its result dict."""
    from tqdm import tqdm

    env = dict(os.environ, TVM_NUM_THREADS=str(plan["threads"]))
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "microbench.runner"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, env=env, text=True)
        proc.stdin.write(json.dumps(plan))
        proc.stdin.close()
        bar = tqdm(total=None, desc="calibrate", file=sys.stderr, disable=not progress, leave=False)
        result, error = None, None
        try:
            for line in proc.stdout:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue  # stray output from a library: not ours
                if ev.get("event") == "start":
                    bar.reset(total=ev["total"])
                elif ev.get("event") == "more":
                    bar.total = (bar.total or 0) + ev["steps"]
                elif ev.get("event") == "progress":
                    bar.set_postfix_str(ev.get("what", ""), refresh=False)
                    bar.update(1)
                elif ev.get("event") == "result":
                    result = ev["data"]
                elif ev.get("event") == "error":
                    error = ev["message"]
        finally:
            bar.close()
            proc.stdout.close()
            code = proc.wait()
        if error:
            raise CalibrationError(f"calibration of {plan['device']['name']!r} failed: {error}")
        if result is None:
            err.seek(0)
            tail = " | ".join(err.read().strip().splitlines()[-3:])
            raise CalibrationError(f"the microbench worker exited with code {code} before reporting "
                                   f"({tail or 'no output'}); rerun with --quick or report this")
    return result


def _sanity(device: Device, raw: dict, levels: list[str], threads: int) -> list[str]:
    """Warnings about implausible figures: slower level above a faster one, peaks off their bounds."""
    out = []
    bws = raw["levels"]
    for upper, lower in zip(levels, levels[1:]):
        a, b = bws[upper]["one"]["read"]["value"], bws[lower]["one"]["read"]["value"]
        if a <= b:
            out.append(f"{upper} read {a:.1f} GB/s is not faster than {lower} {b:.1f} GB/s (one unit): "
                       f"its working set may not fit it on this machine (see the sweep), or the machine was busy")
    for dt, p in raw["peak"].items():
        if "skipped" in p:
            continue
        one, allu = p["one"]["value"], p["all"]["value"]
        floor = 0.25 * device.units.peak(dt)
        if one < floor:
            out.append(f"peak {dt} {one:.0f} GFLOP/s per unit is under a quarter of the datasheet "
                       f"({device.units.peak(dt):.0f}): the machine was busy or the kernel is not vectorized")
        clock = device.units.clock_ghz
        if clock and device.units.vector_bytes:
            bound = device.units.lanes(dt) * 2 * 2 * clock
            if one > bound:
                out.append(f"peak {dt} {one:.0f} GFLOP/s is above lanes x 2 FMA x 2 x {clock:.2f} GHz = "
                           f"{bound:.0f}: the core runs faster than the detected clock (turbo)")
        if threads > 1 and allu < 0.6 * threads * one:
            out.append(f"peak {dt} on {threads} units is {allu / one:.2f}x one unit (expected about {threads}x): "
                       f"other processes held cores, per-unit figures are low; rerun when the machine is idle")
    return out


def per_unit(total: float, units: int) -> float:
    """A unit's figure: its share of what all units reached together.

    roller's kernels run on all units, and a lone unit is no guide to that: on this kind of machine
    (virtual CPUs that may be SMT siblings) one unit alone jumps between two speed levels from run to
    run while the all-units share holds steady. The one-unit figures are kept as ``*_one`` / ``unit_alone``.
    """
    return total / units


def summarize(device: Device, plan: dict, raw: dict, seconds: float) -> dict:
    """The calibration dict (see the module docstring) from a worker's raw measurements."""
    n = plan["threads"]
    measured = {dt: p for dt, p in raw["peak"].items() if "skipped" not in p}
    peaks = {dt: per_unit(p["all"]["value"], n) for dt, p in measured.items()}
    bws = {}
    for name, m in raw["levels"].items():
        one, allu = m["one"], m["all"]
        shared = device.level(name).shared
        # One unit cannot saturate a shared level: its per-unit figure is what one unit alone gets.
        unit = one["read"]["value"] if shared else per_unit(allu["read"]["value"], n)
        bws[name] = {"unit": unit, "total": allu["read"]["value"], "unit_alone": one["read"]["value"],
                     "write_unit": one["write"]["value"], "write_total": allu["write"]["value"],
                     "rw_unit": one["rw"]["value"], "rw_total": allu["rw"]["value"],
                     "working_set_unit": one["bytes"], "working_set_total": allu["bytes"]}
    names = list(raw["levels"])
    contiguous = bws[names[-1]]["unit"]
    small = dict(raw["small_transfer"], level=names[-1], contiguous_gbps=contiguous)
    small["rows"] = [{"bytes": r["bytes"], "gbps": r["gbps"]["value"],
                      "efficiency": r["gbps"]["value"] / contiguous} for r in small["rows"]]
    sweep = {mode: [{"bytes": p["bytes"], **{k: p[k]["value"] for k in ("read", "write", "rw")}}
                    for p in pts] for mode, pts in raw["bandwidth"].items()}
    warns = list(plan["warnings"]) + _sanity(device, raw, names, plan["threads"])
    if raw["tvm_num_threads"] != plan["threads"]:
        warns.append(f"TVM ran {raw['tvm_num_threads']} threads, the plan asked {plan['threads']}")
    if plan["threads"] != device.units.count:
        warns.append(f"device has {device.units.count} units but this machine runs {plan['threads']}: "
                     f"all-units figures are for {plan['threads']}")
    return {
        "schema": SCHEMA, "device": device.name, "fingerprint": device.fingerprint,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(seconds, 2), "quick": plan["quick"], "tvm_version": raw["tvm_version"],
        "target": raw["target"], "threads": plan["threads"],
        "clock_ghz": device.units.clock_ghz,  # the model's clock from now on: a fleet sharing this file shares it
        "peak_gflops": peaks,
        "peak_gflops_one": {dt: p["one"]["value"] for dt, p in measured.items()},
        "peak_gflops_all": {dt: p["all"]["value"] for dt, p in measured.items()},
        "skipped": {dt: p["skipped"] for dt, p in raw["peak"].items() if "skipped" in p},
        "bandwidth_gbps": bws, "small_transfer": small, "sweep": sweep,
        "datasheet": _figures(device), "warnings": warns,
    }


def _figures(device: Device) -> dict:
    """The device's current peaks and bandwidths in the calibration file's shape."""
    return {"peak_gflops": dict(device.units.peak_gflops),
            "bandwidth_gbps": {lv.name: {"unit": lv.bandwidth_gbps, "total": lv.total_bandwidth_gbps}
                               for lv in device.levels}}


def run_calibration(device: Device, quick: bool = False, progress: bool = True) -> dict:
    """Measures ``device`` (this machine) and returns the calibration dict; does not save it.

    Peaks per dtype on one unit and all units, read/write/read+write bandwidth at each level's
    working set and over a sweep, the small-transfer cost. About 25 s here (``quick``: about 10 s).
    """
    from microbench.plan import make_plan

    from .host import cpu_count

    t0 = time.perf_counter()
    threads = max(1, min(device.units.count, cpu_count()))
    plan = make_plan(device, threads, quick=quick)
    raw = _run_worker(plan, progress)
    return summarize(device, plan, raw, time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------------
# Reporting and the command line.

def calibration_summary(device: Device) -> list[tuple[str, float, float | None]]:
    """Rows ``(field, datasheet, calibrated)`` for ``device`` (calibrated None when not measured).

    Uses ``device.calibration`` if the device carries one, else its cached calibration if any.
    """
    cal = device.calibration
    if cal is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CalibrationWarning)  # load_device already warned once
            cal = load_calibration(device)
    ds = (cal or {}).get("datasheet") or _figures(device)
    rows: list[tuple[str, float, float | None]] = []
    peaks = (cal or {}).get("peak_gflops", {})
    for dt, v in ds["peak_gflops"].items():
        rows.append((f"peak_gflops.{dt}", float(v), peaks.get(dt)))
    bws = (cal or {}).get("bandwidth_gbps", {})
    for lv in device.levels:  # nearest compute first, as the device lists them
        m = ds["bandwidth_gbps"].get(lv.name) or {"unit": lv.bandwidth_gbps, "total": lv.total_bandwidth_gbps}
        got = bws.get(lv.name) or {}
        rows.append((f"bandwidth_gbps.{lv.name}.unit", float(m["unit"]), got.get("unit")))
        rows.append((f"bandwidth_gbps.{lv.name}.total", float(m["total"]), got.get("total")))
    return rows


def _print_table(device: Device, cal: dict, path: Path) -> None:
    print(f"{device.name} ({device.description or device.source}), fingerprint {device.fingerprint}, "
          f"{cal['threads']} threads, {cal['seconds']:.1f} s")
    print(f"  {'field':<28} {'datasheet':>10} {'measured':>10}")
    for field, ds, got in calibration_summary(device.with_calibration(cal)):
        shown = f"{got:10.1f}" if got is not None else f"{'-':>10}"
        print(f"  {field:<28} {ds:10.1f} {shown}")
    for dt, v in cal["peak_gflops_one"].items():
        print(f"  {'peak_gflops_one_alone.' + dt:<28} {'':>10} {v:10.1f}")
    for dt, v in cal["peak_gflops_all"].items():
        print(f"  {'peak_gflops_all_units.' + dt:<28} {'':>10} {v:10.1f}")
    for dt, why in cal["skipped"].items():
        print(f"  {dt}: not measured: {why}")
    st = cal["small_transfer"]
    rows = ", ".join(f"{r['bytes']} B {r['gbps']:.2f}" for r in st["rows"])
    print(f"  small transfer ({st['level']}, rows {st['stride_bytes']} B apart, GB/s useful): {rows}; "
          f"contiguous {st['contiguous_gbps']:.1f}")
    for w in cal["warnings"]:
        print(f"  warning: {w}")
    print(f"  written to {path}")


def cmd_calibrate(args: argparse.Namespace) -> int:
    """``roller calibrate``: measure, save, print a table (or one JSON object with --json)."""
    from .device import load_device

    device = load_device(args.device, calibrated=False)
    with measuring_alone():
        if device.kind == "gpu":  # CUDA kernels on the spec's GPU (microbench.gpu); one-line error without it
            from microbench.gpu import calibrate_gpu

            cal = calibrate_gpu(device, quick=args.quick)
        else:
            cal = run_calibration(device, quick=args.quick, progress=not args.json and sys.stderr.isatty())
        path = save_calibration(device, cal, args.out)
    if args.json:
        out = {"device": cal["device"], "fingerprint": cal["fingerprint"], "path": str(path),
               "seconds": cal["seconds"], "threads": cal["threads"], "quick": cal["quick"],
               "peak_gflops": cal["peak_gflops"], "peak_gflops_one": cal["peak_gflops_one"],
               "peak_gflops_all": cal["peak_gflops_all"],
               "bandwidth_gbps": {lv: m["unit"] for lv, m in cal["bandwidth_gbps"].items()},
               "bandwidth_total_gbps": {lv: m["total"] for lv, m in cal["bandwidth_gbps"].items()},
               "small_transfer": cal["small_transfer"], "skipped": cal["skipped"], "warnings": cal["warnings"]}
        print(json.dumps(out))
    else:
        _print_table(device, cal, path)
    return 0


def register_cli(subparsers) -> argparse.ArgumentParser:
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
    p.set_defaults(func=cmd_calibrate)
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m roller.calibrate [options]``: the same as ``roller calibrate [options]``."""
    from .cli import main as cli_main

    return cli_main(["calibrate", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
