"""Hand-written Exprs and synthetic devices for the policy tests (no TVM)."""
from roller.device.spec import device_from_dict
from roller.plan.expr import REDUCE, SPATIAL, Axis, Expr, TensorAccess


def acc(name, shape, *dims, dtype="float32"):
    """TensorAccess whose dims are given as dicts axis -> coefficient."""
    return TensorAccess(name, tuple(shape), dtype, tuple(tuple(d.items()) for d in dims))


def matmul(M, N, K, dtype="float32"):
    return Expr("matmul", (Axis("i", M, SPATIAL), Axis("j", N, SPATIAL), Axis("k", K, REDUCE)),
                (acc("A", (M, K), {"i": 1}, {"k": 1}, dtype=dtype), acc("B", (K, N), {"k": 1}, {"j": 1}, dtype=dtype)),
                acc("C", (M, N), {"i": 1}, {"j": 1}, dtype=dtype), zero_pad_axes=("k",))


def conv2d_nhwc(N, H, W, C, K, R, S, stride=1, dilation=1):
    """Input already padded: X[n, h*stride + r*dilation, w*stride + s*dilation, c]."""
    P = (H - 1) * stride + (R - 1) * dilation + 1
    Q = (W - 1) * stride + (S - 1) * dilation + 1
    axes = (Axis("n", N, SPATIAL), Axis("h", H, SPATIAL), Axis("w", W, SPATIAL), Axis("k", K, SPATIAL),
            Axis("r", R, REDUCE), Axis("s", S, REDUCE), Axis("c", C, REDUCE))
    x = acc("X", (N, P, Q, C), {"n": 1}, {"h": stride, "r": dilation}, {"w": stride, "s": dilation}, {"c": 1})
    w = acc("Wt", (R, S, C, K), {"r": 1}, {"s": 1}, {"c": 1}, {"k": 1})
    y = acc("Y", (N, H, W, K), {"n": 1}, {"h": 1}, {"w": 1}, {"k": 1})
    return Expr("conv2d", axes, (x, w), y, zero_pad_axes=("r", "s", "c"))


def elementwise(*shape):
    names = [f"a{i}" for i in range(len(shape))]
    dims = [{n: 1} for n in names]
    axes = tuple(Axis(n, e, SPATIAL) for n, e in zip(names, shape))
    return Expr("add", axes, (acc("A", shape, *dims), acc("B", shape, *dims)), acc("C", shape, *dims),
                flops_per_point=1)


def reduce_rows(M, N):
    return Expr("reduce_sum", (Axis("i", M, SPATIAL), Axis("k", N, REDUCE)),
                (acc("A", (M, N), {"i": 1}, {"k": 1}),), acc("S", (M,), {"i": 1}), flops_per_point=1,
                zero_pad_axes=("k",))


def cpu_spec(**over):
    """A synthetic AVX-512-like CPU spec as a dict (tests edit it to make bad specs)."""
    spec = {
        "name": "testcpu", "kind": "cpu", "target": {"kind": "llvm"},
        "units": {"count": 4, "vector_bytes": 64, "peak_gflops": {"float32": 100.0}},
        "levels": [
            {"name": "reg", "capacity": 2048, "usable_fraction": 0.875, "shared": False, "transaction_bytes": 64,
             "bandwidth_gbps": 1000.0, "storage_scope": "local"},
            {"name": "L1", "capacity": "32K", "usable_fraction": 0.5, "shared": False, "transaction_bytes": 64,
             "bandwidth_gbps": 200.0, "storage_scope": "global", "banks": 64, "bank_bytes": 64},
            {"name": "L2", "capacity": "1MiB", "usable_fraction": 0.5, "shared": False, "transaction_bytes": 64,
             "bandwidth_gbps": 100.0, "storage_scope": "global"},
            {"name": "L3", "capacity": "16MiB", "shared": True, "transaction_bytes": 64, "bandwidth_gbps": 40.0,
             "total_bandwidth_gbps": 80.0, "storage_scope": "global"},
            {"name": "DRAM", "capacity": "8GiB", "shared": True, "transaction_bytes": 64, "bandwidth_gbps": 10.0,
             "total_bandwidth_gbps": 20.0, "storage_scope": "global"},
        ],
    }
    spec.update(over)
    return spec


def cpu(**over):
    return device_from_dict(cpu_spec(**over), "test")


def spec_error(mutate, base: dict | None = None) -> str:
    """The DeviceSpecError message for a copy of ``base`` (default: cpu_spec()) changed by ``mutate``, read as
    ``bad.yaml``; fails the test when the spec is accepted."""
    import copy

    import pytest

    from roller.errors import DeviceSpecError

    spec = copy.deepcopy(base if base is not None else cpu_spec())
    mutate(spec)
    with pytest.raises(DeviceSpecError) as err:
        device_from_dict(spec, "bad.yaml")
    return str(err.value)
