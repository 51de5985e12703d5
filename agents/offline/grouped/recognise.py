"""Recognising a grouped matmul: a `ragged_dot_general` of rows ragged along their first axis by weights grouped
along theirs, contracting the rows' last axis with the weights' middle or last one, followed by casts only. The
group sizes must be an input (the kernel's schedule is made from them on the device)."""

from __future__ import annotations

from agents.offline.expr import NotRecognised
from agents.offline.grouped.family import Grouped
from agents.offline.program import CASTS, Program, Value


def _input(program: Program, value: object, what: str) -> int:
    if (index := program.input_index(value)) is not None:
        return index
    raise NotRecognised(f"the grouped matmul's {what} is computed inside the reference; the offline brain reads it "
                        "as an input")


def recognise_grouped(program: Program, output: Value) -> Grouped | None:
    ops = [op for op in program.ops if op.prim in ("ragged_dot_general", "ragged_dot")]
    if not ops:
        return None
    if len(ops) > 1:
        raise NotRecognised(f"the reference has {len(ops)} grouped matmuls; the offline brain writes one")
    (op,) = ops
    numbers = op.params.get("ragged_dot_dimension_numbers")
    lhs, rhs, sizes = op.args[:3]
    if numbers is None or not all(isinstance(a, Value) for a in (lhs, rhs, sizes)):
        raise NotRecognised("the grouped matmul's dimension numbers cannot be read")
    (contract_l, contract_r), (batch_l, batch_r) = numbers.dot_dimension_numbers
    if op.params.get("group_offset") is not None:
        raise NotRecognised("the grouped matmul has a group offset (a shard of the groups); the offline brain "
                            "writes all groups")
    if len(lhs.shape) != 2 or len(rhs.shape) != 3 or batch_l or batch_r \
            or tuple(numbers.lhs_ragged_dimensions) != (0,) or tuple(numbers.rhs_group_dimensions) != (0,) \
            or tuple(contract_l) != (1,) or tuple(contract_r) not in ((1,), (2,)):
        raise NotRecognised("the offline brain writes grouped matmuls of rows [m, k] ragged along m by weights "
                            "[groups, k, n] or [groups, n, k]")
    value = output
    while value.id != op.out.id:
        producer = program.producer(value)
        if producer is None or producer.prim not in CASTS or not isinstance(producer.args[0], Value):
            raise NotRecognised(f"the grouped matmul is followed by {producer.prim if producer else 'nothing'}; "
                                "the offline brain writes it followed by casts only")
        value = producer.args[0]
    transposed = tuple(contract_r) == (2,)
    m, k = lhs.shape
    groups = rhs.shape[0]
    n = rhs.shape[1] if transposed else rhs.shape[2]
    if m % 8:
        raise NotRecognised(f"the grouped matmul has {m} rows; the kernel tiles them by multiples of 8")
    return Grouped(lhs=_input(program, lhs, "rows"), rhs=_input(program, rhs, "weights"),
                   sizes=_input(program, sizes, "group sizes"), m=m, k=k, n=n, groups=groups,
                   transposed=transposed, dtype=lhs.dtype, rhs_dtype=rhs.dtype, out_dtype=output.dtype,
                   n_inputs=len(program.inputs), n_static=len(program.static))
