"""The roller command: bad input gives one clear line and a non-zero exit; builds report and save."""
import json
import subprocess
import sys

import numpy as np
import pytest

from roller.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv,needle", [
    (["build", "matmul", "--shape", "M=0,N=4,K=4"], "M"),
    (["build", "matmul", "--shape", "M=4,N=4"], "K"),
    (["build", "matmul", "--shape", "M=4,N=4,K=4,Q=3"], "Q"),
    (["build", "matmul", "--shape", "M=four,N=4,K=4"], "M"),
    (["build", "matmul", "--shape", "M=4,N=4,K=4", "--dtype", "complex64"], "complex64"),
    (["build", "matmul", "--shape", f"M={1 << 40},N=4,K=4"], "M"),
    (["build", "conv2d", "--shape", "N=1,H=2,W=2,C=1,K=1,R=5,S=5"], "R"),
    (["build", "matmul", "--shape", "M=4,N=4,K=4", "--device", "no-such-device"], "no-such-device"),
    (["build", "matmul", "--kind", "max", "--shape", "M=4,N=4,K=4"],
     "matmul has no option 'kind' (an option of pool2d)"),
    (["build", "conv2d", "--layout", "nt", "--shape", "N=1,H=4,W=4,C=1,K=1,R=1,S=1"], "conv2d has no option 'layout'"),
    (["build", "pool2d", "--kind", "min", "--shape", "N=1,H=4,W=4,C=1,R=2,S=2"], "use one of max, avg"),
    (["build", "matmul", "--layout", "tn", "--shape", "M=4,N=4,K=4"], "use one of nn, nt"),
    (["build", "pool2d", "--kind", "avg", "--dtype", "int8", "--shape", "N=1,H=4,W=4,C=1,R=2,S=2"], "floating-point"),
    (["build", "pool2d", "--shape", "N=1,H=4,W=4,C=1,R=2,S=2,pad=2"], "more than half the window"),
    (["build", "conv2d", "--shape", "N=1,H=4,W=4,C=3,K=4,R=1,S=1,groups=2"], "C=3 is not divisible by groups=2"),
])
def test_bad_input_is_one_line_and_nonzero(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code != 0
    assert err.startswith("roller: error: ") and err.count("\n") == 1, err
    assert needle in err
    assert "Traceback" not in err and out == ""


def test_bad_device_file(capsys, tmp_path):
    spec = tmp_path / "dev.yaml"
    spec.write_text("name: x\nkind: cpu\n")
    code, _, err = run(capsys, "build", "matmul", "--shape", "M=4,N=4,K=4", "--device", str(spec))
    assert code != 0 and "dev.yaml" in err and "target" in err


def test_unknown_operator_and_bad_topk_are_usage_errors(capsys):
    for argv in (["build", "softmax", "--shape", "M=4"], ["build", "matmul", "--shape", "M=4,N=4,K=4", "--topk", "0"],
                 ["build", "matmul", "--shape", "M=4,N=4,K=4", "--build-budget", "-1"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
    assert "usage" in capsys.readouterr().err


def test_devices_lists_host_and_shipped_specs(capsys):
    code, out, _ = run(capsys, "devices", "--json")
    assert code == 0
    names = [d["name"] for d in json.loads(out)]
    assert names[0] == "host" and "x86-avx512" in names and "x86-avx2" in names


@pytest.mark.build
def test_build_json_keys_and_saved_kernel_matches_numpy(capsys, tmp_path):
    code, out, err = run(capsys, "build", "matmul", "--shape", "M=33,N=70,K=17", "--topk", "3", "--json",
                         "--out", str(tmp_path))
    assert code == 0, err
    rep = json.loads(out)
    for key in ("op", "shape", "dtype", "device", "construct_seconds", "build_seconds", "kernel_seconds",
                "gflops", "verified", "chosen", "candidates"):
        assert key in rep
    assert rep["op"] == "matmul" and rep["shape"] == {"M": 33, "N": 70, "K": 17} and rep["verified"] is True
    assert 1 <= len(rep["candidates"]) <= 3 and rep["kernel_seconds"] > 0
    for c in rep["candidates"]:
        assert set(c) >= {"tiles", "predicted_seconds", "measured_seconds", "footprint_bytes", "traffic_bytes"}
        assert set(c["tiles"]) == {"reg", "L1", "L2"}
    # the saved library is the verified kernel: run it again on fresh data against numpy
    import tvm
    lib = tvm.runtime.load_module(str(tmp_path / "matmul.so"))
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((33, 17)).astype("float32"), rng.standard_normal((17, 70)).astype("float32")
    dev = tvm.cpu()
    c = tvm.runtime.tensor(np.full((33, 70), np.nan, "float32"), dev)  # unwritten elements fail
    lib["main"](tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev), c)
    np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-4, atol=1e-4)
    assert json.loads((tmp_path / "matmul.json").read_text())["program"]["levels"] == ["reg", "L1", "L2"]


@pytest.mark.build
def test_build_options_in_json_and_human_output(capsys):
    code, out, err = run(capsys, "build", "pool2d", "--kind", "avg", "--no-profile", "--json",
                         "--shape", "N=1,H=7,W=9,C=3,R=3,S=3,stride=2,pad=1")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["op"] == "pool2d" and rep["options"] == {"kind": "avg"} and rep["verified"] is True
    assert rep["shape"] == {"N": 1, "H": 7, "W": 9, "C": 3, "R": 3, "S": 3, "stride": 2, "pad": 1}
    code, out, err = run(capsys, "build", "matmul", "--layout", "nt", "--shape", "M=9,N=17,K=5", "--no-profile")
    assert code == 0, err
    assert out.startswith("roller build matmul M=9,N=17,K=5 --layout nt float32") and "numpy: yes" in out


@pytest.mark.build
def test_console_script_human_output():
    proc = subprocess.run([sys.executable, "-m", "roller.cli", "build", "add_relu", "--shape", "M=17,N=33",
                           "--no-profile"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "chosen rTiles" in proc.stdout and "verified against numpy: yes" in proc.stdout


def test_out_that_is_a_file_fails_before_building(capsys, tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    code, out, err = run(capsys, "build", "matmul", "--shape", "M=4,N=4,K=4", "--out", str(f / "sub"))
    assert code != 0 and err.startswith("roller: error: --out") and err.count("\n") == 1


def test_written_files_follow_the_umask_not_mkstemps_0600(tmp_path):
    import os

    from roller.output import atomic_write_bytes
    old = os.umask(0o027)
    try:
        atomic_write_bytes(tmp_path / "a.json", b"{}")
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o640
    atomic_write_bytes(tmp_path / "b.json", b"{}")
    assert (tmp_path / "b.json").stat().st_mode & 0o777 == 0o666 & ~old
