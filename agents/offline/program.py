"""The reference as a flat program: its jaxpr at the production shapes, with every nested call inlined.

The offline brain recognises kernel families on this form; nothing here knows about families.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tpu_runner.tasks import Configuration, Task, import_reference

_NESTED = ("jaxpr", "call_jaxpr", "fun_jaxpr")


@dataclass(frozen=True)
class Value:
    id: int
    shape: tuple[int, ...]
    dtype: str  # numpy name: float32, bfloat16, int32, bool

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1


Arg = Value | float | int | bool  # a literal is a Python scalar


def itemsize(dtype: str) -> int:
    """Bytes per element of a numpy dtype name (bfloat16 included, which plain numpy does not know)."""
    return {"bfloat16": 2, "float16": 2, "float64": 8, "int8": 1, "uint8": 1, "bool": 1}.get(dtype, 4)


@dataclass(frozen=True)
class Op:
    prim: str
    args: tuple[Arg, ...]
    params: dict[str, Any]
    out: Value


@dataclass
class Program:
    inputs: list[Value]
    ops: list[Op]
    outputs: list[Arg]
    static: tuple[Any, ...] = ()
    consts: dict[int, Any] = field(default_factory=dict)  # non-scalar constants, by value id

    def producer(self, value: Value) -> Op | None:
        return next((op for op in self.ops if op.out.id == value.id), None)

    def users(self, value: Value) -> list[Op]:
        return [op for op in self.ops if any(isinstance(a, Value) and a.id == value.id for a in op.args)]


class _Builder:
    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.consts: dict[int, Any] = {}
        self.next_id = 0

    def value(self, aval: Any) -> Value:
        self.next_id += 1
        return Value(self.next_id, tuple(int(d) for d in aval.shape), np.dtype(aval.dtype).name)

    def literal_or_value(self, const: Any, aval: Any) -> Arg:
        array = np.asarray(const)
        if array.ndim == 0 or array.size == 1:
            scalar = array.reshape(()).item()
            return scalar
        v = self.value(aval)
        self.consts[v.id] = array
        return v

    def inline(self, jaxpr: Any, consts: list[Any], args: list[Arg]) -> list[Arg]:
        env: dict[Any, Arg] = {}
        for var, const in zip(jaxpr.constvars, consts, strict=True):
            env[var] = self.literal_or_value(const, var.aval)
        for var, arg in zip(jaxpr.invars, args, strict=True):
            env[var] = arg

        def read(atom: Any) -> Arg:
            if hasattr(atom, "val"):  # a Literal
                return self.literal_or_value(atom.val, atom.aval)
            return env[atom]

        for eqn in jaxpr.eqns:
            inner = next((eqn.params[k] for k in _NESTED if k in eqn.params), None)
            ins = [read(a) for a in eqn.invars]
            if inner is not None:
                closed_consts = list(getattr(inner, "consts", []))
                body = getattr(inner, "jaxpr", inner)
                outs = self.inline(body, closed_consts, ins)
            else:
                out_values = [self.value(v.aval) for v in eqn.outvars]
                if len(out_values) != 1:
                    raise NotImplementedError(f"the reference uses {eqn.primitive.name}, an operation with "
                                              f"{len(out_values)} results, which the offline brain does not write "
                                              "kernels for")
                params = {k: v for k, v in eqn.params.items() if k not in ("out_sharding", "sharding")}
                self.ops.append(Op(eqn.primitive.name, tuple(ins), params, out_values[0]))
                outs = out_values
            for var, out in zip(eqn.outvars, outs, strict=True):
                env[var] = out
        return [read(v) for v in jaxpr.outvars]


def trace(task: Task, config: Configuration) -> Program:
    """The reference's program for one configuration (static arguments folded in as literals)."""
    import jax  # only the sandboxed child traces: the offline brain's other modules import this one without jax

    fn = import_reference(task).computation
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in config.dynamic]
    closed = jax.make_jaxpr(lambda *dyn: fn(*dyn, *config.static))(*args)
    builder = _Builder()
    inputs = [builder.value(v.aval) for v in closed.jaxpr.invars]
    outputs = builder.inline(closed.jaxpr, list(closed.consts), list(inputs))
    return Program(inputs=inputs, ops=builder.ops, outputs=outputs, static=tuple(config.static),
                   consts=builder.consts)
