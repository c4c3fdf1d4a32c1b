"""VNNI's vpdpbusd as a TVM tensor intrinsic: ``C[lanes] += sum_4 u8 A[4] x s8 B[lanes, 4]`` in int32.

The register tile of a plan with dot-product lanes (``RProgram.dot_depth``, ``roller.plan.dot``) is
tensorized with it: 4 bytes of the activation (one int32) broadcast to every lane, a vector of the weight
prepacked ``[.., lanes, 4]`` (4 x lanes contiguous bytes), one instruction for 4 multiply-adds a lane.
TVM's own ``dot_16x4_vnni`` is the same computation for 16 lanes in global memory; this one takes the
lanes (16 on AVX-512, 8 on AVX-VNNI's ymm) and the accumulator's storage scope (the register tile's stack
array, or the microbenchmark's local buffer). Registered once per process and shape.
"""
from __future__ import annotations

DEPTH = 4  # bytes each lane multiplies and sums per instruction (roller.plan.dot.DOT_DEPTH)
_LLVM_INTRINSIC = {16: "llvm.x86.avx512.vpdpbusd.512", 8: "llvm.x86.avx512.vpdpbusd.256"}


def register_vnni(lanes: int = 16, scope: str = "global") -> str:
    """The name of the u8 x s8 -> s32 ``lanes`` x 4 dot-product intrinsic on an accumulator in ``scope``,
    registered on first use. BuildError for a vector width vpdpbusd has not."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    from roller.errors import BuildError

    if lanes not in _LLVM_INTRINSIC:
        raise BuildError(f"vpdpbusd runs 8 or 16 int32 lanes, not {lanes}")
    name = f"roller_vnni_{lanes}x{DEPTH}_{scope}"
    if TensorIntrin.get(name, allow_missing=True) is not None:
        return name
    width = lanes * DEPTH

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle):
        A = T.match_buffer(a, (DEPTH,), "uint8", offset_factor=1)
        B = T.match_buffer(b, (lanes, DEPTH), "int8", offset_factor=1)
        C = T.match_buffer(c, (lanes,), "int32", offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:DEPTH], B[0:lanes, 0:DEPTH])
            T.writes(C[0:lanes])
            for i, k in T.grid(lanes, DEPTH):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + T.Cast("int32", A[vk]) * T.Cast("int32", B[vi, vk])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle):
        A = T.match_buffer(a, (DEPTH,), "uint8", offset_factor=1)
        B = T.match_buffer(b, (lanes, DEPTH), "int8", offset_factor=1)
        C = T.match_buffer(c, (lanes,), "int32", offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:DEPTH], B[0:lanes, 0:DEPTH])
            T.writes(C[0:lanes])
            a4 = T.reinterpret(A.vload([0], "uint8x4"), dtype="int32")
            # LLVM's vpdpbusd takes its two byte operands as <4 x lanes x i8>
            C[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(_LLVM_INTRINSIC[lanes]),
                C.vload([0], dtype=f"int32x{lanes}"), T.reinterpret(T.broadcast(a4, lanes), dtype=f"int8x{width}"),
                B.vload([0, 0], dtype=f"int8x{width}"), dtype=f"int32x{lanes}")

    TensorIntrin.register(name, desc, impl)
    return name
