"""GpuPlan (roller.plan.gpuplan): a GPU plan's choices as typed fields of RProgram.gpu, part of its key; the
JSON round trip of each kind; tensor-core, block-reduction and plain plans with the same tiles kept apart;
code generation refusing a plan it cannot honour."""
import dataclasses
import json

import pytest

from roller.builder.api import analyze
from roller.device.load import load_device
from roller.errors import BuildError
from roller.plan.construct import distinct_programs
from roller.plan.gpuplan import BlockModel, BlockReduction, GpuKind, GpuPlan, TensorCoreLayout
from roller.plan.rprogram import RProgram
from roller.targets import construct
from roller.tir import ops

A100 = load_device("a100", calibrated=False)


def _analyzed(op, shape, dtype, **options):
    return analyze(ops.get_op(op).with_options(**options).make(shape, dtype))


def _plans(op, shape, dtype, topk=50):
    expr, func = _analyzed(op, shape, dtype)
    return expr, func, construct(expr, A100, topk=topk).programs


def _first(plans, kind):
    return next(p for p in plans if p.gpu.kind is kind)


MODEL = BlockModel(registers=40, shared_bytes=4096, blocks_per_sm=4, warps_per_sm=32, limited_by="threads",
                   reduction_steps=8)


@pytest.mark.parametrize("kind,op,shape,dtype", [
    (GpuKind.TILES, "matmul", {"M": 64, "N": 64, "K": 64}, "float16"),
    (GpuKind.TENSOR_CORE, "matmul", {"M": 64, "N": 64, "K": 64}, "float16"),
    (GpuKind.BLOCK_REDUCTION, "reduce_sum", {"M": 100, "N": 3001}, "float32"),
])
def test_each_kind_round_trips_through_json(kind, op, shape, dtype):
    _, _, plans = _plans(op, shape, dtype)
    p = _first(plans, kind)
    d = json.loads(json.dumps(p.to_dict()))
    assert d["gpu"]["kind"] == kind.value and set(d["gpu"]["model"]) == {
        "registers", "shared_bytes", "blocks_per_sm", "warps_per_sm", "limited_by", "reduction_steps"}
    assert ("tensor_core" in d["gpu"]) == (kind is GpuKind.TENSOR_CORE)
    assert ("reduction" in d["gpu"]) == (kind is GpuKind.BLOCK_REDUCTION)
    back = RProgram.from_dict(d)
    assert back == p and back.key == p.key and back.gpu.kind is kind
    assert isinstance(back.gpu.model, BlockModel)
    if kind is GpuKind.TENSOR_CORE:
        assert isinstance(back.gpu.tensor_core, TensorCoreLayout)
    if kind is GpuKind.BLOCK_REDUCTION:
        assert back.gpu.reduction == BlockReduction(threads=p.tiles[1]["n"], rows=p.tiles[1]["m"])
    # a CPU plan has no gpu part, in either direction
    cpu = dataclasses.replace(p, gpu=None)
    assert "gpu" not in cpu.to_dict() and RProgram.from_dict(cpu.to_dict()).gpu is None


def test_the_kind_goes_with_its_shape():
    with pytest.raises(ValueError, match="tensor-core layout"):
        GpuPlan(kind=GpuKind.TENSOR_CORE, threads=128, model=MODEL)
    with pytest.raises(ValueError, match="block-reduction shape"):
        GpuPlan(kind=GpuKind.TILES, threads=128, model=MODEL, reduction=BlockReduction(threads=128, rows=1))
    with pytest.raises(TypeError, match="GpuKind"):
        GpuPlan(kind="tiles", threads=128, model=MODEL)


def test_the_key_holds_the_choices_not_the_predictions():
    plain = GpuPlan(kind=GpuKind.TILES, threads=128, model=MODEL, copy_lanes={"A": 4, "B": 4})
    assert dataclasses.replace(plain, model=dataclasses.replace(MODEL, registers=99)).key == plain.key
    assert dataclasses.replace(plain, copy_lanes={"A": 4, "B": 1}).key != plain.key
    assert dataclasses.replace(plain, interleaved=("i",)).key != plain.key
    reduction = GpuPlan(kind=GpuKind.BLOCK_REDUCTION, threads=128, model=MODEL,
                        reduction=BlockReduction(threads=128, rows=1))
    assert reduction.key != plain.key
    assert dataclasses.replace(reduction, reduction=BlockReduction(threads=64, rows=2)).key != reduction.key
    tc = TensorCoreLayout(warps_m=2, warps_n=2, frags_m=1, frags_n=2, frags_k=2)
    assert (GpuPlan(kind=GpuKind.TENSOR_CORE, threads=128, model=MODEL, tensor_core=tc).key
            != GpuPlan(kind=GpuKind.TENSOR_CORE, threads=128, model=MODEL,
                       tensor_core=dataclasses.replace(tc, frags_k=1)).key)


def test_plans_with_the_same_tiles_but_another_kind_stay_distinct():
    # a tensor-core plan of an fp16 matmul, and the same tiles, packing and padding as a plain plan: the old
    # key (tiles and layout choices only) made them one candidate; with the GpuPlan in the key both are kept
    _, _, plans = _plans("matmul", {"M": 64, "N": 64, "K": 64}, "float16")
    tc = _first(plans, GpuKind.TENSOR_CORE)
    plain = dataclasses.replace(tc, gpu=GpuPlan(kind=GpuKind.TILES, threads=tc.gpu.threads, model=tc.gpu.model,
                                                copy_lanes=tc.gpu.copy_lanes))
    assert plain.key[:-1] == tc.key[:-1] and plain.key != tc.key
    assert distinct_programs([tc, plain], lambda p: p, lambda p: None) == [tc, plain]
    # the same choices with other predictions are still one plan
    again = dataclasses.replace(tc, gpu=dataclasses.replace(tc.gpu, model=dataclasses.replace(tc.gpu.model,
                                                                                             registers=1)))
    assert distinct_programs([tc, again], lambda p: p, lambda p: None) == [tc]


def test_a_half_precision_matmul_keeps_tensor_core_and_plain_plans():
    expr, _, plans = _plans("matmul", {"M": 64, "N": 64, "K": 64}, "float16")
    kinds = {p.gpu.kind for p in plans}
    assert kinds == {GpuKind.TENSOR_CORE, GpuKind.TILES}
    assert len({p.key for p in plans}) == len(plans)
    for p in plans:
        assert (p.gpu.tensor_core is not None) == (p.gpu.kind is GpuKind.TENSOR_CORE) and p.gpu.reduction is None
    # a reduction over few long rows: block-level reductions and plain plans side by side
    _, _, rows = _plans("reduce_sum", {"M": 100, "N": 3001}, "float32")
    assert {p.gpu.kind for p in rows} == {GpuKind.BLOCK_REDUCTION, GpuKind.TILES}


def test_code_generation_refuses_a_plan_it_cannot_honour():
    from roller.targets.cuda.schedule import schedule_cuda

    expr, func, plans = _plans("matmul", {"M": 64, "N": 64, "K": 64}, "float16")
    tc = _first(plans, GpuKind.TENSOR_CORE)
    layout = tc.gpu.tensor_core
    wrong = dataclasses.replace(tc, gpu=dataclasses.replace(tc.gpu, tensor_core=dataclasses.replace(
        layout, frags_k=layout.frags_k * 2)))
    with pytest.raises(BuildError, match="makes block tiles"):
        schedule_cuda(func, expr, wrong, A100)
    lanes = dataclasses.replace(tc, gpu=dataclasses.replace(tc.gpu, copy_lanes={"A": 2, "B": 2}))
    with pytest.raises(BuildError, match="copies 4 halves a load"):
        schedule_cuda(func, expr, lanes, A100)

    expr, func, plans = _plans("reduce_sum", {"M": 100, "N": 3001}, "float32")
    red = _first(plans, GpuKind.BLOCK_REDUCTION)
    shape = red.gpu.reduction
    more_rows = dataclasses.replace(red, gpu=dataclasses.replace(red.gpu, reduction=dataclasses.replace(
        shape, rows=shape.rows * 2)))
    with pytest.raises(BuildError, match="rows a block"):
        schedule_cuda(func, expr, more_rows, A100)
    with pytest.raises(BuildError, match="not a GPU plan"):
        schedule_cuda(func, expr, dataclasses.replace(red, gpu=None), A100)
