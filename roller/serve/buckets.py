"""Functions with symbolic dimensions (batch, sequence length), served by kernels specialised on buckets.

A request's concrete value of each dimension is rounded up to a bucket (:class:`BucketPolicy`); the
inputs are zero-padded up to it, the bucket's kernel runs, and the output is cropped. The number of
kernels then grows with the logarithm of the range, not with it (1..512: 35 kernels instead of 512),
at a bounded padding cost (``scripts/bucket_cost.py`` measures it against one kernel per value).

Padding must not change the values kept: true where the dimension is a spatial axis (extra rows are
computed and cropped) or a sum over zero-padded products; false for a mean, a max over negatives, a
softmax. :class:`DynamicKernel` probes each dimension once, numerically: the function at a small size
against the same function zero-padded to a larger one, on negative and on positive data, each built
unscheduled by TVM. A dimension that fails the probe is served exactly (one kernel per value) and
``DynamicKernel.exact`` names it.

    from roller.serve.jit import JIT
    dyn = JIT().dynamic(func)          # func: a PrimFunc / TE tensors with symbolic dims
    out = dyn(a, b)                    # numpy inputs of any allowed size -> numpy output
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from roller.errors import RollerError

PROBE_SMALL, PROBE_PADDED, PROBE_OTHER = 3, 5, 4  # the probe's sizes: value, its bucket, other dims


@dataclass(frozen=True)
class BucketPolicy:
    """Rounds a dimension's value up to its bucket: powers of two up to ``align`` (1, 2, 4, 8), above it
    multiples of a step that doubles with the value (``align`` at least, at most ``epsilon`` of the value),
    so that a bucket pads by less than ``epsilon`` above ``align / epsilon`` and by less than ``align``
    elements below; every bucket above ``align`` is a multiple of ``align``. About ``1 / epsilon`` buckets
    per doubling of the range."""

    epsilon: float = 0.125
    align: int = 8

    def __post_init__(self):
        if not 0 < self.epsilon <= 1 or self.align < 1:
            raise RollerError(f"BucketPolicy: epsilon must be in (0, 1] and align at least 1, got "
                              f"epsilon={self.epsilon}, align={self.align}")

    def bucket(self, n: int) -> int:
        """The smallest bucket holding ``n`` (n >= 1)."""
        if n < 1:
            raise RollerError(f"BucketPolicy: a dimension's value must be at least 1, got {n}")
        if n <= self.align:
            return 1 << (n - 1).bit_length()
        step = max(self.align, 1 << max(0, math.floor(math.log2(n * self.epsilon))))
        return -(-n // step) * step

    def buckets(self, lo: int, hi: int) -> list[int]:
        """The distinct buckets of the values lo..hi."""
        return sorted({self.bucket(n) for n in range(lo, hi + 1)})


def symbolic_vars(func) -> list:
    """The symbolic variables of a PrimFunc's parameter shapes, in order of first appearance."""
    from tvm.tirx import Var

    out = []
    for p in func.params:
        for d in p.shape:
            if isinstance(d, Var) and not any(d.same_as(v) for v in out):
                out.append(d)
    return out


def specialize(func, values: dict):
    """``func`` with its symbolic dims set to ``values`` ({var name: int}), by specialising, per variable,
    the first parameter that has it as a whole dimension."""
    from tvm import tirx

    done, binds = set(), {}
    for p in func.params:
        names = [d.name for d in p.shape if isinstance(d, tirx.Var)]
        if not names or set(names) <= done:
            continue
        if any(n not in values for n in names):
            missing = sorted(set(names) - set(values))
            raise RollerError(f"dynamic {func_name(func)}: no value for {', '.join(missing)}")
        shape = [values[d.name] if isinstance(d, tirx.Var) else int(d) for d in p.shape]
        binds[p] = tirx.decl_buffer(shape, p.dtype, name=p.name)
        done.update(names)
    return func.specialize(binds)


def func_name(func) -> str:
    attrs = func.attrs
    return str(attrs["global_symbol"]) if attrs is not None and "global_symbol" in attrs else "function"


def _shape(param) -> tuple[int, ...]:
    return tuple(int(d) for d in param.shape)


def _pad(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``array`` zero-padded at the high end of each dimension up to ``shape``."""
    if array.shape == shape:
        return array
    out = np.zeros(shape, array.dtype)
    out[tuple(slice(0, s) for s in array.shape)] = array
    return out


def _numpy(array) -> np.ndarray:
    return array.numpy() if hasattr(array, "numpy") else np.asarray(array)


def padding_preserves(func, var, others) -> bool:
    """True if zero-padding ``var`` from PROBE_SMALL to PROBE_PADDED leaves the output's first elements
    unchanged, on negative and on positive data (TVM's unscheduled builds of both sizes)."""
    import tvm

    sizes = {v.name: PROBE_OTHER for v in others}
    small = specialize(func, dict(sizes, **{var.name: PROBE_SMALL}))
    padded = specialize(func, dict(sizes, **{var.name: PROBE_PADDED}))
    try:
        run_small = tvm.compile(tvm.IRModule({"main": small}), "llvm")["main"]
        run_padded = tvm.compile(tvm.IRModule({"main": padded}), "llvm")["main"]
    except Exception:  # noqa: BLE001 -- a size the function does not allow: serve this dimension exactly
        return False
    rng = np.random.default_rng(0)
    for sign in (-1, 1):
        ins = []
        for p in small.params[:-1]:
            if "float" in str(p.dtype):
                ins.append((sign * rng.uniform(0.1, 2.0, _shape(p))).astype(str(p.dtype)))
            else:
                ins.append((sign * rng.integers(1, 5, _shape(p))).astype(str(p.dtype)))
        outs = []
        for f, run, arrays in ((small, run_small, ins),
                               (padded, run_padded, [_pad(a, _shape(q)) for a, q in zip(ins, padded.params)])):
            out = tvm.runtime.tensor(np.zeros(_shape(f.params[-1]), str(f.params[-1].dtype)))
            run(*[tvm.runtime.tensor(a) for a in arrays], out)
            outs.append(out.numpy())
        kept = outs[1][tuple(slice(0, s) for s in outs[0].shape)]
        if kept.shape != outs[0].shape or not np.allclose(kept, outs[0], rtol=1e-5, atol=1e-6):
            return False
    return True


class DynamicKernel:
    """A function with symbolic dimensions, called with numpy inputs of any allowed size: each call is
    served by the kernel of its buckets (see the module), from ``jit``. Thread-safe."""

    def __init__(self, jit, func, policy: BucketPolicy | None = None, tier: str = "any"):
        from tvm import tirx

        self.jit = jit
        self.func = func
        self.policy = policy or BucketPolicy()
        self.tier = tier
        self.vars = symbolic_vars(func)
        if not self.vars:
            raise RollerError(f"dynamic {func_name(func)}: no symbolic dimension in its parameters; "
                              f"call the JIT itself for a function with concrete shapes")
        # dims that zero padding would change are served exactly, one kernel per value
        self.exact = tuple(v.name for v in self.vars
                           if not padding_preserves(func, v, [o for o in self.vars if not o.same_as(v)]))
        self._kernels: dict[tuple, object] = {}
        self._lock = threading.Lock()
        # the parameters' dims as plain data, read on every call: a var's name, an int, or None (an expression)
        self._dims = [tuple(d.name if isinstance(d, tirx.Var) else int(d) if isinstance(d, tirx.IntImm) else None
                            for d in p.shape) for p in func.params]

    def values(self, inputs) -> dict[str, int]:
        """{var name: value} read from the inputs' shapes; RollerError for an input that does not fit."""
        dims = self._dims[:-1]
        if len(inputs) != len(dims):
            names = ", ".join(p.name for p in self.func.params[:-1])
            raise RollerError(f"dynamic {func_name(self.func)}: {len(dims)} inputs expected ({names}), "
                              f"got {len(inputs)}")
        found: dict[str, int] = {}
        for p, want, a in zip(self.func.params, dims, inputs):
            shape = tuple(a.shape)
            if len(shape) != len(want):
                raise RollerError(f"dynamic {func_name(self.func)}: input {p.name} has {len(want)} dimensions "
                                  f"({list(p.shape)}), got shape {shape}")
            for i, (d, n) in enumerate(zip(want, shape)):
                if isinstance(d, str):
                    if found.setdefault(d, n) != n:
                        raise RollerError(f"dynamic {func_name(self.func)}: {d} is {found[d]} in an "
                                          f"earlier input but {n} in {p.name} (dimension {i})")
                elif d is not None and d != n:
                    raise RollerError(f"dynamic {func_name(self.func)}: input {p.name} dimension {i} must be "
                                      f"{d}, got {n}")
        return found

    def buckets(self, values: dict[str, int]) -> dict[str, int]:
        """The bucket of each value (the value itself for a dimension served exactly)."""
        return {k: n if k in self.exact else self.policy.bucket(n) for k, n in values.items()}

    def _entry(self, buckets: dict[str, int]) -> tuple:
        """(Kernel, input shapes, output shape) of these bucket values, specialised and built on first use."""
        ident = tuple(sorted(buckets.items()))
        entry = self._kernels.get(ident)
        if entry is None:
            func = specialize(self.func, buckets)
            kernel = self.jit(func, tier=self.tier)
            with self._lock:
                entry = self._kernels.setdefault(ident, (kernel, [_shape(p) for p in func.params]))
        return entry

    def kernel(self, buckets: dict[str, int]):
        """The JIT's Kernel for these bucket values (specialised and built on first use)."""
        return self._entry(buckets)[0]

    def kernels(self) -> int:
        """How many bucket kernels this function holds."""
        return len(self._kernels)

    def held(self) -> list[dict[str, int]]:
        """The bucket values of the kernels this function holds (a snapshot)."""
        with self._lock:
            return [dict(k) for k in self._kernels]

    def output_shape(self, values: dict[str, int]) -> tuple[int, ...]:
        """The output's shape for these values of the symbolic dims."""
        dims = self._dims[-1]
        if None not in dims:
            return tuple(values[d] if isinstance(d, str) else d for d in dims)
        from tvm import sym

        analyzer = sym.Analyzer()
        for v in self.vars:
            analyzer.bind(v, values[v.name])
        return tuple(int(analyzer.simplify(d)) for d in self.func.params[-1].shape)

    def __call__(self, *inputs) -> np.ndarray:
        """The output (numpy) for these inputs, the function's input parameters in order: numpy arrays,
        or TVM tensors (a weight kept on the device: passed as it is unless it needs padding)."""
        import tvm

        values = self.values(inputs)
        buckets = self.buckets(values)
        kernel, shapes = self._entry(buckets)
        args = [a if isinstance(a, tvm.runtime.Tensor) and tuple(a.shape) == s
                else tvm.runtime.tensor(np.ascontiguousarray(_pad(_numpy(a), s))) for a, s in zip(inputs, shapes)]
        out = tvm.runtime.empty(shapes[-1], str(self.func.params[-1].dtype))
        kernel(*args, out)
        result = out.numpy()
        if buckets == values:
            return result
        return result[tuple(slice(0, s) for s in self.output_shape(values))]
