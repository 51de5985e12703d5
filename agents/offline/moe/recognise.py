"""Recognising a mixture of experts computed densely: every expert's MLP on every token - its first matmuls (a
gate's and an up-projection's, or one) against a stacked [experts, ...] weight, an elementwise chain, a last
matmul batched over the experts - and the outputs summed over the experts, each weighted by a routing weight
that a top-k made: zero for all but k experts of each token.

The routing weights are found by numbers: the reference's own ops after its top-k are evaluated with numpy on
drawn top-k results, and each token's weights must be zero outside the experts the top-k chose. Then only those
experts' work is needed, which is what the kernel does (the reference multiplies the others by zero).

A program without a top-k is of another kind (None); one with a top-k that is not such a mixture gets a
NotRecognised that says what differs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from agents.offline.expr import FLOAT_DTYPES, UNARY, NotRecognised
from agents.offline.moe.family import MoE
from agents.offline.moe.shape import ExpertIn
from agents.offline.positions import position_value
from agents.offline.program import Op, Program, Value

_LAYOUT = ("transpose", "convert_element_type")
_ARITHMETIC = ("add", "sub", "mul", "div", "max", "min", "pow")
CHAIN_PRIMS = frozenset(UNARY) - {"not", "is_finite", "sign"} | frozenset(_ARITHMETIC) \
    | {"integer_pow", "convert_element_type"}


def _input_index(program: Program, arg: Any) -> int | None:
    return next((i for i, v in enumerate(program.inputs) if isinstance(arg, Value) and v.id == arg.id), None)


def _labels(program: Program, value: Any) -> list[str] | None:
    """Each axis of `value` named by the input axis it is (`"i.j"`), through matmuls, transposes and casts; None
    where it is computed otherwise."""
    index = _input_index(program, value)
    if index is not None:
        return [f"{index}.{j}" for j in range(len(value.shape))]
    op = program.producer(value) if isinstance(value, Value) else None
    if op is None:
        return None
    if op.prim == "convert_element_type":
        return _labels(program, op.args[0])
    if op.prim == "transpose":
        inner = _labels(program, op.args[0])
        return None if inner is None else [inner[p] for p in op.params["permutation"]]
    if op.prim == "dot_general":
        lhs, rhs = (_labels(program, a) for a in op.args[:2])
        if lhs is None or rhs is None:
            return None
        (lc, rc), (lb, rb) = op.params["dimension_numbers"]
        free_l = [a for j, a in enumerate(lhs) if j not in tuple(lc) + tuple(lb)]
        free_r = [a for j, a in enumerate(rhs) if j not in tuple(rc) + tuple(rb)]
        return [lhs[j] for j in lb] + free_l + free_r
    return None


def _follow_layout(program: Program, dot: Op) -> tuple[Value, tuple[str, ...], list[Op]]:
    """From a matmul's output through its single users that are transposes and casts: the value reached, the
    dtypes it took on the way (the dot's first) and the ops passed."""
    value, rounds, passed = dot.out, [dot.out.dtype], [dot]
    while len(users := program.users(value)) == 1 and users[0].prim in _LAYOUT:
        value = users[0].out
        passed.append(users[0])
        if users[0].prim == "convert_element_type":
            rounds.append(value.dtype)
    return value, tuple(rounds), passed


def _expert_in(program: Program, dot: Op, tokens: int, weight: int) -> tuple[ExpertIn, list[Op]]:
    (lc, rc), _ = dot.params["dimension_numbers"]
    w_side = 0 if _input_index(program, dot.args[0]) == weight else 1
    w_contract = (tuple(lc), tuple(rc))[w_side]
    x_contract = (tuple(lc), tuple(rc))[1 - w_side]
    n_tok = len(program.inputs[tokens].shape)
    if x_contract != (n_tok - 1,) or w_contract not in ((1,), (2,)):
        raise NotRecognised("an expert's matmul does not contract the tokens' last axis with its weight's "
                            "[experts, model, ffn] (or [experts, ffn, model]) axis")
    value, rounds, passed = _follow_layout(program, dot)
    transposed = w_contract == (2,)
    ffn_axis = 1 if transposed else 2
    want = [f"{weight}.0", *(f"{tokens}.{j}" for j in range(n_tok - 1)), f"{weight}.{ffn_axis}"]
    if _labels(program, value) != want:
        raise NotRecognised("an expert's first matmul reaches its activation in another layout than "
                            "[experts, *tokens, ffn]")
    return ExpertIn(weight=weight, transposed=transposed, rounds=rounds, value=value), passed


def _chain(program: Program, hidden: Value, entries: set[int]) -> list[Op]:
    """The elementwise ops from the experts' first matmuls to the last one's operand, in program order."""
    found: dict[int, Op] = {}
    frontier = [hidden]
    while frontier:
        v = frontier.pop()
        if not isinstance(v, Value) or v.id in entries or v.id in found:
            continue
        op = program.producer(v)
        if op is None or op.prim not in CHAIN_PRIMS or \
                (op.prim == "convert_element_type" and op.out.dtype not in FLOAT_DTYPES):
            what = "an input" if op is None else op.prim
            raise NotRecognised(f"between the experts' matmuls the reference computes {what}; the offline brain "
                                "writes elementwise activations there")
        if any(isinstance(a, Value) and a.shape != hidden.shape for a in op.args):
            raise NotRecognised("the experts' activation broadcasts a value; the offline brain writes elementwise "
                                "activations of the matmuls' outputs and constants")
        found[v.id] = op
        frontier += list(op.args)
    return [op for op in program.ops if op.out.id in found]


def _combine_weights(program: Program, topk: tuple[Op, Op], combine: Value, experts: int, k: int) -> None:
    """Check by numbers that each token's routing weights are zero outside the experts its top-k chose."""
    values, indices = topk
    rng = np.random.default_rng(0)
    shape = values.out.shape
    drawn_values = -np.sort(-rng.normal(size=shape), axis=-1).astype(np.float32)
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    drawn_idx = np.stack([rng.permutation(experts)[:k] for _ in range(rows)]).reshape(shape).astype(np.int32)
    weights = position_value(program, combine, given={values.out.id: drawn_values, indices.out.id: drawn_idx})
    if weights is None:
        raise NotRecognised("the routing weights go through more than the offline brain evaluates on their way from "
                            "the top-k to the experts' outputs")
    weights = np.broadcast_to(np.asarray(weights), combine.shape).reshape(experts, rows)
    chosen = np.zeros((experts, rows), bool)
    np.put_along_axis(chosen.T, drawn_idx.reshape(rows, k), True, axis=1)
    if np.any((weights != 0) & ~chosen):
        raise NotRecognised("the routing weights are not zero outside each token's top-k experts: every expert's "
                            "output counts")


@dataclass(frozen=True)
class _Down:
    """The experts' last matmul: [experts, *tokens, ffn] @ [experts, ffn, model], batched over the experts."""

    op: Op
    weight: int  # its stacked weight's position among the inputs
    hidden: Value
    transposed: bool  # the weight stored [experts, model, ffn]
    model: int


def _down_matmul(program: Program, dots: list[Op]) -> _Down:
    downs = [d for d in dots if tuple(d.params["dimension_numbers"][1][0])]
    if len(downs) != 1:
        raise NotRecognised("a top-k without one matmul batched over the experts (a mixture of experts' last); the "
                            "offline brain writes mixtures of MLP experts computed densely and weighted by a top-k "
                            "routing")
    down = downs[0]
    (dl, dr), (bl, br) = down.params["dimension_numbers"]
    w_side = next((s for s in (0, 1) if (i := _input_index(program, down.args[s])) is not None
                   and len(program.inputs[i].shape) == 3), None)
    if w_side is None:
        raise NotRecognised("the experts' last matmul does not read a stacked [experts, ...] weight")
    weight = _input_index(program, down.args[w_side])
    assert weight is not None
    hidden = down.args[1 - w_side]
    h_contract, w_contract = ((tuple(dl), tuple(dr)) if w_side == 1 else (tuple(dr), tuple(dl)))
    h_batch, w_batch = ((tuple(bl), tuple(br)) if w_side == 1 else (tuple(br), tuple(bl)))
    if not isinstance(hidden, Value) or h_batch != (0,) or w_batch != (0,) \
            or h_contract != (len(hidden.shape) - 1,) or w_contract not in ((1,), (2,)):
        raise NotRecognised("the experts' last matmul is not [experts, *tokens, ffn] @ [experts, ffn, model] "
                            "batched over the experts")
    transposed = w_contract == (2,)
    return _Down(down, weight, hidden, transposed, program.inputs[weight].shape[1 if transposed else 2])


def _first_matmuls(program: Program, dots: list[Op], down: Op, experts: int) -> tuple[list[ExpertIn], list[Op], int]:
    """The expert MLP's one or two matmuls against stacked weights before the last (a gate and an up-projection):
    each one's input, the ops between it and its matmul, and the tokens' input they all read."""
    firsts = [d for d in dots if d is not down and not tuple(d.params["dimension_numbers"][1][0])
              and any((i := _input_index(program, a)) is not None and len(program.inputs[i].shape) == 3
                      and program.inputs[i].shape[0] == experts for a in d.args[:2])]
    if len(firsts) not in (1, 2):
        raise NotRecognised(f"{len(firsts)} matmuls against stacked expert weights before the last one; the offline "
                            "brain writes an MLP expert's one or two (a gate and an up-projection)")
    ins: list[ExpertIn] = []
    passed: list[Op] = []
    tokens_input: int | None = None
    for dot in firsts:
        sides = [_input_index(program, a) for a in dot.args[:2]]
        if any(s is None for s in sides):
            raise NotRecognised("an expert's first matmul reads a value computed inside the reference (a prologue)")
        weight = next(s for s in sides if s is not None and len(program.inputs[s].shape) == 3
                      and program.inputs[s].shape[0] == experts)
        tokens = next(s for s in sides if s != weight)
        assert tokens is not None
        if tokens_input not in (None, tokens):
            raise NotRecognised("the experts' first matmuls read different tokens")
        tokens_input = tokens
        expert_in, ops = _expert_in(program, dot, tokens, weight)
        ins.append(expert_in)
        passed += ops
    assert tokens_input is not None
    return ins, passed, tokens_input


@dataclass(frozen=True)
class _WeightedSum:
    """The output: the experts' outputs (rounded to the last matmul's dtype, then cast) times the routing weights,
    summed over the experts; `combine` is the routing weights' value, `ops` what carries the sum to the output."""

    combine: Value
    ops: tuple[Op, ...]


def _weighted_sum(program: Program, output: Value, down: Op, shape: tuple[int, ...]) -> _WeightedSum:
    experts, token_shape = shape[0], shape[1:-1]
    summed, casts = program.behind(output, ("convert_element_type",))
    total = program.producer(summed) if isinstance(summed, Value) else None
    if total is None or total.prim != "reduce_sum" or tuple(total.params["axes"]) != (0,):
        raise NotRecognised("the output is not the experts' outputs summed over the experts")
    product = program.producer(total.args[0]) if isinstance(total.args[0], Value) else None
    if product is None or product.prim != "mul":
        raise NotRecognised("the experts' outputs are summed without a routing weight each")
    sides = [program.behind(a, ("convert_element_type",)) for a in product.args]
    y_side = next((s for s in (0, 1) if isinstance(sides[s][0], Value) and sides[s][0].id == down.out.id), None)
    if y_side is None or down.out.shape != shape:
        raise NotRecognised("the routing weights multiply something else than the experts' outputs "
                            "[experts, *tokens, model]")
    combine, spread = program.behind(product.args[1 - y_side], ("broadcast_in_dim",))
    if not isinstance(combine, Value) or combine.shape not in ((experts, *token_shape), (experts, *token_shape, 1)):
        raise NotRecognised("the routing weights are not one per expert and token")
    return _WeightedSum(combine, (*casts, *sides[y_side][1], *spread, total, product))


def _top_k(program: Program, routing: list[Op], combine: Value, experts: int) -> int:
    """The routing's one top-k over the experts, its k; the weights checked to be zero outside each token's choice."""
    chosen = [op for op in routing if op.prim == "top_k"]
    values = [op for op in chosen if op.params.get("result") == 0]
    indices = [op for op in chosen if op.params.get("result") == 1]
    if len(values) != 1 or len(indices) != 1 or values[0].args[0].shape[-1] != experts:  # type: ignore[union-attr]
        raise NotRecognised("the routing weights do not come from one top-k over the experts")
    top_k = int(values[0].params["k"])
    _combine_weights(program, (values[0], indices[0]), combine, experts, top_k)
    return top_k


def recognise_moe(program: Program, output: Value) -> MoE | None:
    if not any(op.prim == "top_k" for op in program.ops):
        return None
    dots = [op for op in program.ops if op.prim == "dot_general"]
    down = _down_matmul(program, dots)
    hidden = down.hidden
    experts, ffn, model = hidden.shape[0], hidden.shape[-1], down.model
    ins, passed, tokens_input = _first_matmuls(program, dots, down.op, experts)
    x = program.inputs[tokens_input]
    token_shape = x.shape[:-1]
    if x.shape[-1] != program.inputs[ins[0].weight].shape[2 if ins[0].transposed else 1] \
            or hidden.shape != (experts, *token_shape, ffn):
        raise NotRecognised("the experts' matmuls do not chain as [*tokens, model] -> [experts, *tokens, ffn] -> "
                            "[experts, *tokens, model]")
    chain = _chain(program, hidden, {e.value.id for e in ins})
    weighted = _weighted_sum(program, output, down.op, (experts, *token_shape, model))
    combine = weighted.combine
    routing = [op for op in program.ops if op.out.id == combine.id or program.depends_on(combine, op.out)]
    behind = program.inputs_behind(combine)
    if behind & ({e.weight for e in ins} | {down.weight}) or tokens_input not in behind:
        raise NotRecognised("the routing weights are not computed from the tokens alone (and the router's weights)")
    top_k = _top_k(program, routing, combine, experts)

    accounted = {op.out.id for op in (*routing, *passed, *chain, *weighted.ops, down.op)}
    rest = [op.prim for op in program.ops if op.out.id not in accounted]
    if rest:
        raise NotRecognised(f"the reference computes more than a mixture of experts ({', '.join(sorted(set(rest)))})")
    dtypes = {program.inputs[i].dtype for i in (tokens_input, down.weight, *(e.weight for e in ins))}
    if len(dtypes) != 1 or x.dtype not in FLOAT_DTYPES:
        raise NotRecognised(f"the tokens and the experts' weights in {sorted(dtypes)}; the offline brain writes a "
                            "mixture of experts with one floating-point dtype")
    if experts < top_k or ffn % 128 or model % 128:
        raise NotRecognised(f"a mixture of experts with model {model} and ffn {ffn}: the kernel's tiles need "
                            "multiples of 128")
    return MoE(tokens_input=tokens_input, ins=tuple(ins), chain=tuple(chain), hidden=hidden, down=down.weight,
               down_transposed=down.transposed, down_dtype=down.op.out.dtype, routing=tuple(routing),
               combine=combine, tokens=math.prod(token_shape), model=model, ffn=ffn, experts=experts, top_k=top_k,
               dtype=x.dtype, out_dtype=output.dtype, inputs=tuple(program.inputs), n_inputs=len(program.inputs),
               n_static=len(program.static))
