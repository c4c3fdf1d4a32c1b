"""A roofline of a build's candidates (``roller build ... --plot FILE.png``), drawn with matplotlib.

matplotlib is optional (``pip install 'roller[plot]'``); it is imported only when a plot is drawn, and
without it the error says what to install.

What is drawn, from the build report (the dict ``roller build --json`` prints) and the Device:

- roofs: the compute roof ``units.peak(dtype) x units`` and one bandwidth roof per memory level,
  ``bandwidth_gbps x units`` for a per-unit level and ``total_bandwidth_gbps`` for a shared one, where
  ``units`` is the number of execution units the chosen plan runs on (a small operator may use fewer
  than the device has);
- x, arithmetic intensity: the operator's flops over the candidate's ``traffic_bytes`` at the top
  per-unit level, i.e. the bytes that plan moves from the level the data lives in (the shared level
  whose roof is drawn bold) into the units. Plans of one operator differ in x by their reuse;
- y, GFLOP/s: for each candidate the model's prediction (open marker) and the measurement (filled),
  joined by a vertical line, the winner a star. Without profiling only the chosen plan is measured.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

from roller.device.spec import Device
from roller.errors import RollerError

FORMATS = (".png", ".svg", ".pdf")


def check_plot_path(path) -> Path:
    """Fails before a build (not after it) when the plot cannot be written: matplotlib missing, an
    unknown extension, or a folder that does not exist."""
    p = Path(path)
    if p.suffix.lower() not in FORMATS:
        raise RollerError(f"--plot {path}: write a {', '.join(FORMATS)} file (the extension picks the format)")
    if not p.parent.is_dir():
        raise RollerError(f"--plot {path}: the folder {p.parent} does not exist")
    _matplotlib()
    return p


def _matplotlib():
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise RollerError("plotting needs matplotlib: install roller[plot] (pip install 'roller[plot]')") from None
    return Figure


def roofs(device: Device, dtype: str, units: int) -> tuple[float, dict[str, float]]:
    """(peak GFLOP/s, {level: GB/s}) for a plan running on ``units`` execution units: the peak and a
    per-unit level's bandwidth scale with the units; a shared level gives its total bandwidth."""
    peak = device.units.peak(dtype) * units
    bws = {lv.name: lv.total_bandwidth_gbps if lv.shared else lv.bandwidth_gbps * units for lv in device.levels}
    return peak, bws


def report_flops(report: Mapping) -> float:
    """The operator's flops, from the report's predicted GFLOP/s and the chosen plan's predicted time."""
    chosen = report["candidates"][report["chosen"]]
    return report["predicted_gflops"] * 1e9 * chosen["predicted_seconds"]


def candidate_points(report: Mapping) -> list[dict]:
    """Per candidate: its index, arithmetic intensity (flops per byte moved into the top per-unit
    level), predicted and measured GFLOP/s (None when not measured), and whether it won."""
    flops = report_flops(report)
    points = []
    for i, c in enumerate(report["candidates"]):
        traffic = list(c["traffic_bytes"].values())[-1]  # the top per-unit level: bytes from the data's level
        pred, meas = c.get("predicted_seconds"), c.get("measured_seconds")
        if i == report["chosen"] and meas is None:
            meas = report.get("kernel_seconds")
        points.append({
            "index": i, "intensity": flops / traffic if traffic else None,
            "predicted_gflops": flops / pred / 1e9 if pred else None,
            "measured_gflops": flops / meas / 1e9 if meas else None,
            "winner": i == report["chosen"]})
    return [p for p in points if p["intensity"]]


def plot_roofline(report: Mapping, device: Device, path, source_level: str | None = None) -> Path:
    """Draws the roofline of ``report``'s candidates on ``device`` into ``path`` (.png, .svg or .pdf).
    ``source_level`` (the level the operator's data lives in, see roller.plan.cost.data_source) gets the
    bold roof. Returns the path written."""
    Figure = _matplotlib()
    path = Path(path)
    chosen = report["candidates"][report["chosen"]]
    units = chosen.get("units") or device.units.count
    peak, bws = roofs(device, report.get("out_dtype", report["dtype"]), units)  # the dtype the model used
    pts = candidate_points(report)

    xs = [p["intensity"] for p in pts]
    ys = [v for p in pts for v in (p["predicted_gflops"], p["measured_gflops"]) if v]
    ridges = [peak / bw for bw in bws.values()]
    x_lo = min(xs + ridges) / 4
    x_hi = max(xs + ridges) * 4
    y_lo = min(ys + [peak]) / 4
    y_hi = peak * 2.5

    fig = Figure(figsize=(11, 6), layout="constrained")
    ax = fig.add_subplot()
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.axhline(peak, color="black", lw=1.8, label=f"peak {report['dtype']} {peak:.0f} GFLOP/s ({units} units)")
    colors = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
    for (name, bw), color in zip(bws.items(), colors * 4):
        ridge = peak / bw
        is_source = name == source_level
        ax.plot([x_lo, ridge], [bw * x_lo, peak], color=color, lw=2.6 if is_source else 1.2,
                ls="-" if is_source else "--",
                label=f"{name} {bw:.0f} GB/s" + (" (data lives here)" if is_source else ""))
    labels: dict[tuple[str, str], tuple[tuple[float, float], list[str]]] = {}
    for p in pts:
        x, yp, ym = p["intensity"], p["predicted_gflops"], p["measured_gflops"]
        if yp and ym:
            ax.plot([x, x], [yp, ym], color="0.6", lw=1, zorder=2)
        if yp:
            ax.scatter([x], [yp], facecolors="none", edgecolors="tab:orange", s=45, zorder=3)
        if ym:
            ax.scatter([x], [ym], color="tab:red", s=30, zorder=4)
        spot = (x, ym or yp)
        labels.setdefault((f"{spot[0]:.3g}", f"{spot[1]:.2g}"), (spot, []))[1].append(f"#{p['index']}")
    for spot, names in labels.values():  # plans that land on one spot share one label
        ax.annotate(",".join(names), spot, textcoords="offset points", xytext=(7, -3), fontsize=7, color="0.3")
    ax.scatter([], [], facecolors="none", edgecolors="tab:orange", s=45, label="candidate, predicted")
    ax.scatter([], [], color="tab:red", s=30, label="candidate, measured")
    win = next(p for p in pts if p["winner"]) if any(p["winner"] for p in pts) else None
    if win:
        y = win["measured_gflops"] or win["predicted_gflops"]
        ax.scatter([win["intensity"]], [y], marker="*", s=260, color="gold", edgecolors="black", zorder=5,
                   label=f"winner #{win['index']}: {y:.1f} GFLOP/s")
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, y_hi)
    ax.set_xlabel("arithmetic intensity (flops per byte moved from the data's level into the units)")
    ax.set_ylabel("GFLOP/s")
    # sizes (upper case) before stride / pad / dilation (lower case), as one types them
    shape = ",".join(f"{k}={v}" for k, v in sorted(report["shape"].items(), key=lambda kv: kv[0].islower()))
    opts = "".join(f" {k}={v}" for k, v in (report.get("options") or {}).items())
    ax.set_title(f"roller {report['op']} {shape}{opts} {report['dtype']} on {report['device']}\n"
                 f"{len(report['candidates'])} candidates; roofs for {units} units "
                 f"({'calibrated' if report.get('device_calibrated') else 'datasheet'} figures)", fontsize=10)
    _plain_ticks(ax)
    ax.grid(True, which="both", lw=0.3, color="0.85")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: the points stay visible
    fig.savefig(path, dpi=120)
    return path


def _plain_ticks(ax) -> None:
    """Tick labels as plain numbers (200, 0.1; not 2x10^2); on an axis spanning few decades the 2, 3
    and 5 between powers of ten are labelled too."""
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    some = FuncFormatter(lambda v, _: f"{v:g}" if round(v / 10 ** math.floor(math.log10(v) + 1e-9)) in (2, 3, 5) else "")
    for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(some if math.log10(hi / lo) < 2.5 else FuncFormatter(lambda v, _: ""))


def plot_build(result, path) -> Path:
    """The roofline of a :class:`roller.builder.api.BuildResult` (its report and device; the bold roof is the
    level its data lives in)."""
    from roller.plan.cost import data_source

    return plot_roofline(result.report, result.device, path, source_level=data_source(result.expr, result.device).name)
