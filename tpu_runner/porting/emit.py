"""A traced JAX program written back as Python source: the pure-JAX `computation` of a ported task.

Each equation of the (inlined) jaxpr becomes one `lax.<primitive>_p.bind(...)` line with the equation's own
parameters, so the written function traces to the very program that was traced - exact by construction, and
readable by the offline brain (which reads the reference's jaxpr) and by an LLM. Calls (`jit`, `custom_jvp_call`,
`custom_vjp_call`) are inlined; anything whose parameters cannot be written as source (control flow, opaque
objects) is refused, naming the primitive.
"""

from __future__ import annotations

import dataclasses
import enum
import keyword
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

MAX_CONSTANT_ELEMENTS = 4096
_INLINED = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
            "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr",
            "remat": "jaxpr", "checkpoint": "jaxpr"}
_CONTROL_FLOW = {"scan", "while", "cond", "fori_loop"}


class EmitError(ValueError):
    """The program holds something that cannot be written as source; the message names it."""


def identifier(name: str, taken: set[str]) -> str:
    """A Python identifier for a weight or input name (`lin.weight` -> `lin_weight`), unique among `taken`."""
    base = re.sub(r"\W", "_", name).strip("_") or "arg"
    if base[0].isdigit() or keyword.iskeyword(base):
        base = f"arg_{base}"
    candidate, n = base, 1
    while candidate in taken:
        n += 1
        candidate = f"{base}_{n}"
    taken.add(candidate)
    return candidate


def _dtype(dtype: Any) -> str:
    return f"jnp.dtype({np.dtype(dtype).name!r})"


def literal(value: Any, where: str) -> str:
    """Python source that evaluates to `value` (a parameter of an equation)."""
    from jax import lax

    if value is None or isinstance(value, bool | str):
        return repr(value)
    if isinstance(value, int | np.integer):
        return repr(int(value))
    if isinstance(value, float | np.floating):
        f = float(value)
        return repr(f) if math.isfinite(f) else f"float({str(f)!r})"
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return _dtype(value)
    if isinstance(value, enum.Enum):
        if getattr(lax, type(value).__name__, None) is type(value):
            return f"lax.{type(value).__name__}.{value.name}"
        raise EmitError(f"{where}: the value {value!r} cannot be written as source")
    if hasattr(value, "_fields") and getattr(lax, type(value).__name__, None) is type(value):  # a lax namedtuple
        fields = ", ".join(f"{f}={literal(getattr(value, f), where)}" for f in value._fields)
        return f"lax.{type(value).__name__}({fields})"
    if dataclasses.is_dataclass(value) and getattr(lax, type(value).__name__, None) is type(value):
        fields = ", ".join(f"{f.name}={literal(getattr(value, f.name), where)}" for f in dataclasses.fields(value))
        return f"lax.{type(value).__name__}({fields})"
    if isinstance(value, tuple | list):
        items = [literal(v, where) for v in value]
        if isinstance(value, list):
            return "[" + ", ".join(items) + "]"
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if isinstance(value, np.ndarray) and value.size <= MAX_CONSTANT_ELEMENTS:
        return f"np.array({literal(value.tolist(), where)}, dtype={_dtype(value.dtype)})"
    raise EmitError(f"{where}: a parameter of type {type(value).__name__} cannot be written as source")


@dataclasses.dataclass
class _Writer:
    lines: list[str] = dataclasses.field(default_factory=list)
    constants: list[str] = dataclasses.field(default_factory=list)
    counter: int = 0

    def fresh(self) -> str:
        self.counter += 1
        return f"v{self.counter}"

    def constant(self, value: Any) -> str:
        array = np.asarray(value)
        if array.size > MAX_CONSTANT_ELEMENTS:
            raise EmitError(f"the forward creates a constant tensor of {array.size} elements (shape "
                            f"{array.shape}); make it a parameter or a registered buffer of the module")
        name = f"_C{len(self.constants)}"
        values = literal(array.tolist(), "a constant") if array.ndim else literal(array.item(), "a constant")
        self.constants.append(f"{name} = np.array({values}, dtype={_dtype(array.dtype)})")
        return name


def _atom(atom: Any, env: dict[Any, str], writer: _Writer) -> str:
    from jax.extend.core import Literal

    if isinstance(atom, Literal):
        value = np.asarray(atom.val)
        if value.ndim == 0:
            return f"np.array({literal(value.item(), 'a literal')}, dtype={_dtype(atom.aval.dtype)})"
        return writer.constant(value)
    return env[atom]


def _emit(jaxpr: Any, consts: Sequence[Any], args: list[str], writer: _Writer) -> list[str]:
    """Write `jaxpr`'s equations with its inputs bound to the names `args`; returns the names of its outputs."""
    from jax.extend.core import Literal

    env: dict[Any, str] = {}
    for var, value in zip(jaxpr.constvars, consts, strict=True):
        env[var] = writer.constant(value)
    for var, name in zip(jaxpr.invars, args, strict=True):
        env[var] = name
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        inputs = [_atom(a, env, writer) for a in eqn.invars]
        if name in _INLINED:
            inner = eqn.params[_INLINED[name]]
            inner_jaxpr = getattr(inner, "jaxpr", inner)
            inner_consts = getattr(inner, "consts", ())
            outputs = _emit(inner_jaxpr, inner_consts, inputs, writer)
            for var, out in zip(eqn.outvars, outputs, strict=True):
                env[var] = out
            continue
        if name in _CONTROL_FLOW:
            raise EmitError(f"the program uses control flow ({name}): loops and branches on tensors cannot be "
                            "ported yet")
        from jax import lax

        if not hasattr(lax, f"{name}_p"):
            raise EmitError(f"the primitive {name} has no public lax counterpart to write")
        params = ", ".join(f"{k}={literal(v, f'{name}.{k}')}" for k, v in sorted(eqn.params.items()))
        call = f"lax.{name}_p.bind({', '.join(inputs)}{', ' if inputs and params else ''}{params})"
        outs = [writer.fresh() for _ in eqn.outvars]
        target = outs[0] if not eqn.primitive.multiple_results else ", ".join(outs) + ("," if len(outs) == 1 else "")
        writer.lines.append(f"    {target} = {call}")
        for var, out in zip(eqn.outvars, outs, strict=True):
            env[var] = out
    return [_atom(a, env, writer) if isinstance(a, Literal) else env[a] for a in jaxpr.outvars]


def emit_computation(closed_jaxpr: Any, arg_names: list[str], *, tuple_output: bool) -> str:
    """`def computation(<arg_names>): ...` (and the constants it needs) for a closed jaxpr."""
    writer = _Writer()
    outputs = _emit(closed_jaxpr.jaxpr, closed_jaxpr.consts, list(arg_names), writer)
    result = ", ".join(outputs) + ("," if len(outputs) == 1 else "") if tuple_output else outputs[0]
    body = "\n".join(writer.lines) or "    pass"
    constants = "\n".join(writer.constants)
    return (f"{constants}\n\n\n" if constants else "") + (
        f"def computation({', '.join(arg_names)}):\n{body}\n    return {result}\n")
