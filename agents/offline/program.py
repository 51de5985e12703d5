"""The reference as a flat program: its jaxpr at the production shapes, with every nested call inlined.

Arrays the reference makes itself, from no input (weights drawn with `jax.random` inside it, a table it closes
over), are computed here once and become inputs of their own after the reference's (`Program.given` says where
those end): the kernel takes them as it takes the reference's inputs, and its wrapper supplies them
(`emit.with_drawn`). The offline brain recognises kernel families on this form; nothing here knows about families.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tpu_runner.hardware import bind_equation
from tpu_runner.tasks import Configuration, Task, import_reference

_NESTED = ("jaxpr", "call_jaxpr", "fun_jaxpr")
DRAWN_BYTES = 1 << 18  # the most bytes of the reference's own arrays a kernel's source carries, per configuration


@dataclass(frozen=True)
class Value:
    id: int
    shape: tuple[int, ...]
    dtype: str  # numpy name: float32, bfloat16, int32, bool

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1


Arg = Value | float | int | bool  # a literal is a Python scalar

# Operations of several results the program keeps, as one op per result (`params["result"]` says which): a top-k's
# values and indices (a mixture of experts' routing).
MULTI_RESULT = frozenset({"top_k"})
CASTS = ("convert_element_type", "copy", "copy_p")  # ops that change a value's dtype or buffer, not its values' place
DRAWS = ("_normal", "_uniform")  # jax.random's draws (the names of their jitted bodies) a wrapper repeats


@dataclass(frozen=True)
class Draw:
    """`jax.random.<fn>(key, shape, dtype, *extra)` with a key made from its data (the default implementation)."""

    fn: str  # normal | uniform
    key_data: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    extra: tuple[float, ...] = ()  # uniform's minval and maxval


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
    given: int | None = None  # inputs[:given] are the reference's; the rest its own arrays (`drawn`, in order)
    # Each of those arrays: its value, or the Value of `prologue` that computes it again from `draws`.
    drawn: list[Any] = field(default_factory=list)
    draws: dict[int, Draw] = field(default_factory=dict)  # random draws the prologue starts from, by value id
    prologue: list[Op] = field(default_factory=list)  # XLA ops on them, as the reference has them

    def producer(self, value: Value) -> Op | None:
        return next((op for op in self.ops if op.out.id == value.id), None)

    def users(self, value: Value) -> list[Op]:
        return [op for op in self.ops if any(isinstance(a, Value) and a.id == value.id for a in op.args)]

    def behind(self, value: Any, through: tuple[str, ...] = CASTS) -> tuple[Any, list[Op]]:
        """`value` traced back through the ops of `through` (casts by default), and the ops passed, outermost
        first."""
        passed: list[Op] = []
        while isinstance(value, Value) and (op := self.producer(value)) is not None and op.prim in through:
            passed.append(op)
            value = op.args[0]
        return value, passed

    def input_index(self, value: Any, through: tuple[str, ...] = CASTS) -> int | None:
        """The position of the input `value` is, looking through the ops of `through`; None when it is computed."""
        value = self.behind(value, through)[0]
        return next((i for i, v in enumerate(self.inputs) if isinstance(value, Value) and v.id == value.id), None)

    def depends_on(self, later: Any, earlier: Value) -> bool:
        """Whether `later` is computed from `earlier`."""
        frontier, seen = [later], set()
        while frontier:
            v = frontier.pop()
            if not isinstance(v, Value) or v.id in seen:
                continue
            if v.id == earlier.id:
                return True
            seen.add(v.id)
            producer = self.producer(v)
            if producer is not None:
                frontier += list(producer.args)
        return False

    def inputs_behind(self, value: Any) -> set[int]:
        """The positions of the inputs a value is computed from (empty: from constants and positions only)."""
        found, frontier, seen = set(), [value], set()
        ids = {v.id: i for i, v in enumerate(self.inputs)}
        while frontier:
            v = frontier.pop()
            if not isinstance(v, Value) or v.id in seen:
                continue
            seen.add(v.id)
            if v.id in ids:
                found.add(ids[v.id])
                continue
            producer = self.producer(v)
            if producer is not None:
                frontier += list(producer.args)
        return found


@dataclass(frozen=True)
class _Made:
    """A value the reference makes from no input (a random key, what is drawn from it): computed, not traced."""

    value: Any
    recipe: Arg | None = None  # how a wrapper computes it again: a Value of the prologue (or a literal)


def _is_key(aval: Any) -> bool:
    import jax

    return jax.dtypes.issubdtype(getattr(aval, "dtype", None), jax.dtypes.prng_key)


class _Builder:
    def __init__(self, rewritable: frozenset[str]) -> None:
        self.rewritable = rewritable  # the primitives a wrapper can write again (the tail's)
        self.ops: list[Op] = []
        self.consts: dict[int, Any] = {}
        self.made: list[Value] = []  # the constants' values, in the order they were made
        self.recipes: dict[int, Arg | None] = {}  # by a made constant's id: how to compute it again, if known
        self.draws: dict[int, Draw] = {}
        self.prologue: list[Op] = []
        self.next_id = 0

    def value(self, aval: Any) -> Value:
        self.next_id += 1
        return Value(self.next_id, tuple(int(d) for d in aval.shape), np.dtype(aval.dtype).name)

    def literal_or_value(self, const: Any, aval: Any, recipe: Arg | None = None) -> Arg:
        if _is_key(aval):
            raise NotImplementedError("a random key the reference makes reaches its work on the inputs (as "
                                      "dropout's would); the offline brain writes kernels of deterministic programs")
        array = np.asarray(const)
        if array.ndim == 0 or array.size == 1:
            scalar = array.reshape(()).item()
            return scalar
        v = self.value(aval)
        self.consts[v.id] = array
        self.made.append(v)
        self.recipes[v.id] = recipe
        return v

    def recipe(self, eqn: Any, known: list[_Made], results: list[Any]) -> Arg | None:
        """How a wrapper computes a folded equation's one result again with public JAX, or None: a draw of
        jax.random (checked here to give the same numbers) or an XLA op on such results."""
        import jax

        if len(results) != 1 or _is_key(eqn.outvars[0].aval):
            return None
        aval = eqn.outvars[0].aval
        name = str(eqn.params.get("name", ""))
        if name in DRAWS and known and _is_key(eqn.invars[0].aval) and np.ndim(known[0].value) == 0:
            extra = tuple(float(k.value) for k in known[1:])
            draw = Draw(name.lstrip("_"), tuple(int(d) for d in np.asarray(jax.random.key_data(known[0].value))),
                        tuple(int(d) for d in aval.shape), np.dtype(aval.dtype).name, extra)
            if str(jax.random.key_impl(known[0].value)) != "threefry2x32" or not np.array_equal(
                    np.asarray(draw_again(draw)), np.asarray(results[0])):
                return None
            v = self.value(aval)
            self.draws[v.id] = draw
            return v
        args: list[Arg] = []
        for a, k in zip(eqn.invars, known, strict=True):
            if k.recipe is not None:
                args.append(k.recipe)
            elif hasattr(a, "val") and np.ndim(a.val) == 0:
                args.append(np.asarray(a.val).item())
            else:
                return None
        if eqn.primitive.name not in self.rewritable or any(k in eqn.params for k in _NESTED):
            return None
        v = self.value(aval)
        params = {k: p for k, p in eqn.params.items() if k not in ("out_sharding", "sharding")}
        self.prologue.append(Op(eqn.primitive.name, tuple(args), params, v))
        return v

    def inline(self, jaxpr: Any, consts: list[Any], args: list[Arg | _Made]) -> list[Arg | _Made]:
        env: dict[Any, Arg | _Made] = {}
        for var, const in zip(jaxpr.constvars, consts, strict=True):
            env[var] = _Made(const) if _is_key(var.aval) else self.literal_or_value(const, var.aval)
        for var, arg in zip(jaxpr.invars, args, strict=True):
            env[var] = arg

        def made(atom: Any) -> _Made | None:
            """The atom as a computed value, when it is a literal or one; None for a traced value."""
            if hasattr(atom, "val"):  # a Literal
                return _Made(atom.val)
            found = env[atom]
            return found if isinstance(found, _Made) else None

        def read(atom: Any) -> Arg:
            found = made(atom)
            return self.literal_or_value(found.value, atom.aval, found.recipe) if found is not None \
                else env[atom]  # type: ignore[return-value]

        for eqn in jaxpr.eqns:
            known = [made(a) for a in eqn.invars]
            keyed = any(_is_key(v.aval) for v in [*eqn.invars, *eqn.outvars])
            scalar = all(math.prod(v.aval.shape) == 1 for v in eqn.outvars)
            if all(k is not None for k in known) and (keyed or scalar or any(
                    isinstance(env.get(a), _Made) for a in eqn.invars if not hasattr(a, "val"))):
                # Made from no input, with a random key on the way or a scalar: computed here, once (a chain of
                # literals into an array, an iota or a broadcast, stays ops: families read those as positions).
                results = bind_equation(eqn, [k.value for k in known if k is not None])
                recipe = self.recipe(eqn, [k for k in known if k is not None], results)
                for var, out in zip(eqn.outvars, results, strict=True):
                    env[var] = _Made(out, recipe)
                continue
            inner = next((eqn.params[k] for k in _NESTED if k in eqn.params), None)
            if inner is not None:
                closed_consts = list(getattr(inner, "consts", []))
                body = getattr(inner, "jaxpr", inner)
                # A made value goes in as one; a literal as the literal it is (a chain of literals stays ops).
                outs = self.inline(body, closed_consts, [env[a] if not hasattr(a, "val") else read(a)
                                                         for a in eqn.invars])
            else:
                ins = [read(a) for a in eqn.invars]
                out_values = [self.value(v.aval) for v in eqn.outvars]
                if len(out_values) != 1 and eqn.primitive.name not in MULTI_RESULT:
                    raise NotImplementedError(f"the reference uses {eqn.primitive.name}, an operation with "
                                              f"{len(out_values)} results, which the offline brain does not write "
                                              "kernels for")
                params = {k: v for k, v in eqn.params.items() if k not in ("out_sharding", "sharding")}
                for i, out_value in enumerate(out_values):  # one op per result, `result` saying which
                    extra = {"result": i} if len(out_values) > 1 else {}
                    self.ops.append(Op(eqn.primitive.name, tuple(ins), params | extra, out_value))
                outs = out_values
            for var, out in zip(eqn.outvars, outs, strict=True):
                env[var] = out
        return [env[v] if not hasattr(v, "val") and isinstance(env[v], _Made) else read(v) for v in jaxpr.outvars]


def trace(task: Task, config: Configuration, rewritable: frozenset[str]) -> Program:
    """The reference's program for one configuration (static arguments folded in as literals). An array the
    reference makes itself from a random draw and `rewritable` primitives is drawn again by the wrapper."""
    import jax  # only the sandboxed child traces: the offline brain's other modules import this one without jax

    fn = import_reference(task).computation
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in config.dynamic]
    closed = jax.make_jaxpr(lambda *dyn: fn(*dyn, *config.static))(*args)
    builder = _Builder(rewritable)
    inputs = [builder.value(v.aval) for v in closed.jaxpr.invars]
    outs = builder.inline(closed.jaxpr, list(closed.consts), list(inputs))
    outputs = [builder.literal_or_value(o.value, v.aval, o.recipe) if isinstance(o, _Made) else o
               for o, v in zip(outs, closed.jaxpr.outvars, strict=True)]
    # A wrapper draws again what it can (exact, and nothing to carry); the rest it carries, up to DRAWN_BYTES.
    drawn = [builder.recipes[v.id] if isinstance(builder.recipes[v.id], Value) else builder.consts[v.id]
             for v in builder.made]
    size = sum(a.nbytes for a in drawn if isinstance(a, np.ndarray))
    if size > DRAWN_BYTES:
        raise NotImplementedError(f"the reference makes {size / 2**20:.1f} MiB of arrays itself (its own weights or "
                                  f"tables); a kernel of the offline brain carries at most {DRAWN_BYTES >> 10} KiB of "
                                  "them: pass them to the reference as inputs")
    # The reference's own arrays become inputs after its own, in the order it made them.
    return Program(inputs=inputs + builder.made, ops=builder.ops, outputs=outputs, static=tuple(config.static),
                   given=len(inputs), drawn=drawn, draws=builder.draws, prologue=builder.prologue)


def draw_again(draw: Draw) -> Any:
    """The draw made again as a wrapper makes it (what `emit.with_drawn` writes, run here)."""
    import jax
    import jax.numpy as jnp

    key = jax.random.wrap_key_data(jnp.asarray(draw.key_data, jnp.uint32))
    return getattr(jax.random, draw.fn)(key, draw.shape, jnp.dtype(draw.dtype), *draw.extra)
