"""roller build --plot: the roofs' arithmetic, the candidates' points, errors, and a real PNG."""
import sys

import pytest

from policy_exprs import cpu
from roller.cli import main
from roller.errors import RollerError
from roller.builder.plot import candidate_points, check_plot_path, roofs


def test_roofs_scale_private_levels_with_units_and_keep_shared_totals():
    dev = cpu()  # 4 units, 100 GFLOP/s each; reg 1000, L1 200, L2 100 GB/s per unit; L3 80, DRAM 20 in total
    peak, bws = roofs(dev, "float32", units=3)
    assert peak == pytest.approx(300.0)
    assert bws == pytest.approx({"reg": 3000.0, "L1": 600.0, "L2": 300.0, "L3": 80.0, "DRAM": 20.0})
    assert roofs(dev, "float64", units=1)[0] == pytest.approx(100.0)  # no float64 peak: float32's


def _report(**over):
    cand = {"predicted_seconds": 1e-3, "measured_seconds": 2e-3, "units": 2,
            "traffic_bytes": {"reg": 10 ** 9, "L1": 10 ** 8, "L2": 10 ** 7}}
    report = {"op": "matmul", "shape": {"M": 8}, "dtype": "float32", "device": "t", "chosen": 1,
              "predicted_gflops": 100.0, "kernel_seconds": 4e-3,
              "candidates": [dict(cand), dict(cand, predicted_seconds=2e-3, measured_seconds=4e-3,
                                              traffic_bytes={"reg": 1, "L1": 1, "L2": 2 * 10 ** 7})]}
    report.update(over)
    return report


def test_points_use_the_top_level_traffic_and_the_operator_flops():
    pts = candidate_points(_report())  # flops = 100 GFLOP/s x 2 ms (the chosen plan's prediction) = 2e8
    assert [p["intensity"] for p in pts] == pytest.approx([20.0, 10.0])
    assert [p["predicted_gflops"] for p in pts] == pytest.approx([200.0, 100.0])
    assert [p["measured_gflops"] for p in pts] == pytest.approx([100.0, 50.0])
    assert [p["winner"] for p in pts] == [False, True]


def test_unprofiled_candidates_have_no_measured_point_but_the_chosen_one_has_the_kernel_time():
    report = _report()
    for c in report["candidates"]:
        c["measured_seconds"] = None
    pts = candidate_points(report)
    assert pts[0]["measured_gflops"] is None
    assert pts[1]["measured_gflops"] == pytest.approx(50.0)  # 2e8 flops in kernel_seconds 4 ms


def test_bad_plot_paths_fail_before_building(tmp_path):
    with pytest.raises(RollerError, match=r"\.png"):
        check_plot_path(tmp_path / "roof.jpg")
    with pytest.raises(RollerError, match="does not exist"):
        check_plot_path(tmp_path / "no" / "roof.png")


def test_missing_matplotlib_is_one_line_naming_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails as if not installed
    code = main(["build", "matmul", "--shape", "M=4,N=4,K=4", "--plot", str(tmp_path / "r.png")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "roller[plot]" in err, err


@pytest.mark.build
def test_build_writes_a_png_roofline(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "roof.png"
    code = main(["build", "matmul", "--shape", "M=64,N=64,K=64", "--topk", "2", "--plot", str(path)])
    out = capsys.readouterr().out
    assert code == 0 and f"wrote the roofline {path}" in out
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
