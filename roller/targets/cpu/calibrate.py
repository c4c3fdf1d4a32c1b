"""One-time calibration of a device: measured peak compute and bandwidths replace datasheet figures.

``run_calibration`` measures the device with TVM kernels (package ``roller.targets.cpu.microbench``) in a worker process
(a GPU spec: ``roller.targets.cuda.microbench.calibrate_gpu``, CUDA kernels on that GPU through TVM's CUDA runtime),
``save_calibration`` writes the result to a per-user cache file keyed by device name and fingerprint,
and ``load_calibration`` (called by ``roller.device.load_device``) reads it back. A bad cache file is
ignored with one warning naming it, never fatal. ``roller calibrate`` is the command-line face.

File schema (``SCHEMA``): ``peak_gflops`` {dtype: GFLOP/s per unit}, where measured ``tensor_peak_gflops``
(the matrix unit's, AMX, by input dtype), ``bandwidth_gbps`` {level:
{"unit": GB/s, "total": GB/s, ...}} (what ``Device.with_calibration`` consumes), plus ``schema``,
``device``, ``fingerprint``, ``created``, ``seconds``, ``tvm_version``, ``threads``, ``peak_gflops_one``
(one unit alone), ``peak_gflops_all`` (all units together),
``small_transfer``, ``sweep``, ``skipped``, ``datasheet`` and ``warnings``.
"""
from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from roller.device.spec import Device
from roller.device.calibration import MEASURED_SOURCE, SCHEMA, figures
from roller.plan.overheads import cycle_seconds
from roller.errors import CalibrationError


# ---------------------------------------------------------------------------------------------
# The cache file.


# ---------------------------------------------------------------------------------------------
# Measuring.


def _run_worker(plan: dict, progress: bool) -> dict:
    """Runs roller.targets.cpu.microbench.runner in a fresh process with the plan's thread count; its result dict."""
    from tqdm import tqdm

    env = dict(os.environ, TVM_NUM_THREADS=str(plan["threads"]))
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "roller.targets.cpu.microbench.runner"], stdin=subprocess.PIPE,
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
            raise CalibrationError(f"the roller.targets.cpu.microbench worker exited with code {code} before reporting "
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


def model_terms(device: Device, probes: dict, day: str) -> dict:
    """The cost model's terms the probes measured, in a spec's ``model:`` shape (name -> value, source, probe):
    pool launch and join in cycles of the model's clock, a line two units write in seconds, an accumulator
    vector moved through L1 in cycles, and the speedup software prefetch of a prepacked weight gives. A
    difference that came out below zero (noise around a free term) is 0."""
    hz = 1 / cycle_seconds(device)  # the model's clock
    out = {}
    if "launch" in probes:
        p = probes["launch"]
        out["parallel_launch_cycles"] = {
            "value": int(round(max(0.0, p["value"]) * hz)), "probe": p,
            "source": f"{MEASURED_SOURCE} {day}: a parallel loop of one tiny write a unit against the "
                      f"same loop serial, {p['value'] * 1e6:.2f} us a call"}
    if "false_sharing" in probes:
        p = probes["false_sharing"]
        out["false_sharing_seconds"] = {
            "value": max(0.0, p["value"]), "probe": p,
            "source": f"{MEASURED_SOURCE} {day}: every unit writing its slice of 256 lines against "
                      f"lines of its own, {p['value'] * 1e9:.1f} ns a line"}
    if "accumulator" in probes:
        p = probes["accumulator"]
        t = p["tile"]
        out["accumulator_cycles"] = {
            "value": max(0.0, p["value"]) * hz, "probe": p,
            "source": f"{MEASURED_SOURCE} {day}: a {t['mr']} x {t['nv']}-vector register tile's "
                      f"accumulators loaded and stored at each of {t['chunks']} chunks of {t['chunk']} steps against "
                      f"held in registers, {p['value'] * hz:.2f} cycles a vector moved"}
    if "prefetch" in probes:
        p = probes["prefetch"]
        shape = " x ".join(str(p["shape"][k]) for k in ("M", "N", "K"))
        with_, without = (statistics.median(r[i] for r in p["seconds"]) for i in (0, 1))
        out["software_prefetch_gain"] = {
            "value": max(1e-3, p["value"]), "probe": p,
            "source": f"{MEASURED_SOURCE} {day}: a {shape} GEMM, its weight prepacked and from memory, "
                      f"{without * 1e3:.2f} ms without software prefetch / {with_ * 1e3:.2f} ms with"}
    return out


def summarize(device: Device, plan: dict, raw: dict, seconds: float) -> dict:
    """The calibration dict (see the module docstring) from a worker's raw measurements."""
    n = plan["threads"]
    measured = {dt: p for dt, p in raw["peak"].items() if "skipped" not in p}
    peaks = {dt: per_unit(p["all"]["value"], n) for dt, p in measured.items()}
    tensor = {dt: p for dt, p in (raw.get("tensor_peak") or {}).items() if "skipped" not in p}
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
    if plan["quick"]:
        warns.append("quick: the cost model's terms were not probed; the spec's values stand (roller calibrate "
                     "without --quick measures them)")
    elif plan["threads"] > 1 and "launch" not in (raw.get("probes") or {}):
        warns.append("other processes held cores: the pool launch and false-sharing probes were skipped and the "
                     "spec's values stand; rerun when the machine is idle")
    if raw["tvm_num_threads"] != plan["threads"]:
        warns.append(f"TVM ran {raw['tvm_num_threads']} threads, the plan asked {plan['threads']}")
    if plan["threads"] != device.units.count:
        warns.append(f"device has {device.units.count} units but this machine runs {plan['threads']}: "
                     f"all-units figures are for {plan['threads']}")
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    terms = model_terms(device, raw.get("probes") or {}, created[:10])
    return {
        "schema": SCHEMA, "device": device.name, "fingerprint": device.fingerprint,
        "created": created,
        "seconds": round(seconds, 2), "quick": plan["quick"], "tvm_version": raw["tvm_version"],
        "target": raw["target"], "threads": plan["threads"],
        "clock_ghz": device.units.clock_ghz,  # the model's clock from now on: a fleet sharing this file shares it
        "peak_gflops": peaks,
        "peak_gflops_one": {dt: p["one"]["value"] for dt, p in measured.items()},
        "peak_gflops_all": {dt: p["all"]["value"] for dt, p in measured.items()},
        "skipped": {dt: p["skipped"] for dt, p in raw["peak"].items() if "skipped" in p},
        # the matrix unit's (AMX) peaks by input dtype, where the target has one
        **({"tensor_peak_gflops": {dt: per_unit(p["all"]["value"], n) for dt, p in tensor.items()},
            "tensor_peak_gflops_one": {dt: p["one"]["value"] for dt, p in tensor.items()},
            "tensor_peak_gflops_all": {dt: p["all"]["value"] for dt, p in tensor.items()}} if tensor else {}),
        "bandwidth_gbps": bws, "small_transfer": small, "sweep": sweep,
        "model": terms,
        "datasheet": dict(figures(device), model={n: getattr(device.model, n) for n in terms}), "warnings": warns,
    }


def run_calibration(device: Device, quick: bool = False, progress: bool = True) -> dict:
    """Measures ``device`` (this machine) and returns the calibration dict; does not save it.

    Peaks per dtype on one unit and all units, read/write/read+write bandwidth at each level's
    working set and over a sweep, the small-transfer cost. About 25 s here (``quick``: about 10 s).
    """
    from roller.targets.cpu.microbench.plan import make_plan

    from roller.device.host import cpu_count

    t0 = time.perf_counter()
    threads = max(1, min(device.units.count, cpu_count()))
    plan = make_plan(device, threads, quick=quick)
    raw = _run_worker(plan, progress)
    return summarize(device, plan, raw, time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------------
# Reporting and the command line.
