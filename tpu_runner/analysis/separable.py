"""Along which axis a traced program computes its outputs independently: the slicings of its inputs under which
each slice of the outputs depends on the same slice of the inputs alone (the batch of an attention, its heads).

A reference too large to run whole in float64 (5p's scores are 4.3G values) can then be run slice by slice. Each
value of the program gets a tag: the axis it is sliced along (if any), and the axes it is constant along (a
broadcast, a size-1 dimension). Every primitive has a rule that keeps the sliced axis apart or says the program
mixes it (a reduction over it, a contraction, a reshape that merges it): no slicing then. Primitives without a
rule are taken to mix. `same_program` checks that the reference traced at a slice's shapes is the program analysed,
slice for slice, so no shape-dependent code can make the two differ."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jax.extend import core as jex_core

from tpu_runner.analysis.jaxpr_walk import INLINE_CALLS, iter_eqns

# The sliced axis (None: the value does not depend on the sliced inputs along any axis) and the axes it is
# constant along (broadcast there).
Tag = tuple[int | None, frozenset[int]]
UNSLICED: Tag = (None, frozenset())
MOST_CANDIDATES = 256  # input axis mappings tried per output axis

ELEMENTWISE = frozenset({
    "abs", "acos", "acosh", "add", "and", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "ceil", "clamp",
    "convert_element_type", "copy", "copy_p", "cos", "cosh", "div", "eq", "erf", "erf_inv", "erfc", "exp", "exp2",
    "expm1", "floor", "ge", "gt", "integer_pow", "is_finite", "le", "log", "log1p", "logistic", "lt", "max", "min",
    "mul", "ne", "neg", "nextafter", "not", "or", "pow", "reduce_precision", "rem", "round", "rsqrt", "select_n",
    "shift_left", "shift_right_arithmetic", "shift_right_logical", "sign", "sin", "sinh", "sqrt", "square",
    "stop_gradient", "sub", "tan", "tanh", "xor", "real", "imag",
})
REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
                        "reduce_xor", "argmax", "argmin"})
CUMULATIVE = frozenset({"cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"})


class Mixed(Exception):
    """The program mixes values along the sliced axis."""


@dataclass(frozen=True)
class Slicing:
    in_axes: tuple[int | None, ...]  # per dynamic input: the axis it is sliced along, or None (passed whole)
    out_axes: tuple[int, ...]  # per output leaf
    size: int  # the sliced axis's length
    shrinks: float  # the share of the program's intermediate bytes that are sliced (1: all work divides)

    def describe(self) -> str:
        axes = ", ".join("whole" if a is None else f"axis {a}" for a in self.in_axes)
        return f"{self.size} along the inputs' {axes}"


def _shape(atom: Any) -> tuple[int, ...]:
    return tuple(getattr(getattr(atom, "aval", None), "shape", ()))


def _unit_axes(shape: tuple[int, ...]) -> frozenset[int]:
    return frozenset(i for i, n in enumerate(shape) if n == 1)


class _Tags:
    """Tags of one analysis, by variable (nested programs' variables included)."""

    def __init__(self) -> None:
        self.of: dict[Any, Tag] = {}

    def read(self, atom: Any) -> Tag:
        if isinstance(atom, jex_core.Literal):
            return None, frozenset(range(len(_shape(atom))))
        return self.of.get(atom, UNSLICED)

    def run(self, jaxpr: Any, in_tags: Sequence[Tag]) -> list[Tag]:
        for var, tag in zip(jaxpr.invars, in_tags, strict=True):
            self.of[var] = tag
        for eqn in jaxpr.eqns:
            outs = _rule(self, eqn, [self.read(a) for a in eqn.invars])
            for var, tag in zip(eqn.outvars, outs, strict=True):
                self.of[var] = tag
        return [self.read(a) for a in jaxpr.outvars]


def _moved(tag: Tag, where: dict[int, int]) -> Tag:
    """The tag with its axes renumbered by `where` (axes not in it are gone)."""
    axis, constant = tag
    return (where[axis] if axis is not None else None), frozenset(where[c] for c in constant if c in where)


def _elementwise(eqn: Any, tags: list[Tag]) -> Tag:
    shapes = [_shape(a) for a in eqn.invars]
    axes = {a for a, _ in tags if a is not None}
    if len(axes) > 1:
        raise Mixed
    out = _shape(eqn.outvars[0])
    if not axes:
        constant = frozenset(range(len(out)))
        for (_, c), shape in zip(tags, shapes, strict=True):
            if shape:
                constant &= c | _unit_axes(shape)
        return None, constant
    axis = axes.pop()
    for (a, c), shape in zip(tags, shapes, strict=True):
        if shape and a is None and axis not in c | _unit_axes(shape):
            raise Mixed
    return axis, frozenset()


def _broadcast(eqn: Any, tag: Tag) -> Tag:
    shape, dims = eqn.params["shape"], eqn.params["broadcast_dimensions"]
    in_shape = _shape(eqn.invars[0])
    axis, constant = tag
    new = {i for i in range(len(shape)) if i not in dims}
    new |= {dims[j] for j, n in enumerate(in_shape) if n == 1 and shape[dims[j]] != 1}
    new |= {dims[j] for j in constant}
    if axis is None:
        return None, frozenset(new)
    if in_shape[axis] != shape[dims[axis]]:
        raise Mixed
    return dims[axis], frozenset(new - {dims[axis]})


def _reshape(eqn: Any, tag: Tag) -> Tag:
    axis, _ = tag
    if axis is None:
        return UNSLICED
    in_shape, new = _shape(eqn.invars[0]), eqn.params["new_sizes"]
    if eqn.params.get("dimensions") is not None:
        raise Mixed
    before = math.prod(in_shape[:axis])
    for j, n in enumerate(new):
        if n == in_shape[axis] and math.prod(new[:j]) == before:
            return j, frozenset()
    raise Mixed


def _without(tag: Tag, gone: Sequence[int], rank: int) -> Tag:
    """The tag after the axes `gone` are removed (reduced, squeezed); the sliced axis among them mixes."""
    if tag[0] is not None and tag[0] in gone:
        raise Mixed
    kept = [i for i in range(rank) if i not in gone]
    return _moved(tag, {old: new for new, old in enumerate(kept)})


def _dot(eqn: Any, lhs: Tag, rhs: Tag) -> Tag:
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lrank, rrank = len(_shape(eqn.invars[0])), len(_shape(eqn.invars[1]))
    lfree = [i for i in range(lrank) if i not in lc and i not in lb]
    rfree = [i for i in range(rrank) if i not in rc and i not in rb]
    if lhs[0] is not None and rhs[0] is not None:
        if lhs[0] in lb and rhs[0] in rb and lb.index(lhs[0]) == rb.index(rhs[0]):
            return lb.index(lhs[0]), frozenset()
        raise Mixed
    for (axis, _), (_, other_constant), other_shape, contract, batch, other_batch, free, offset in (
            (lhs, rhs, _shape(eqn.invars[1]), lc, lb, rb, lfree, len(lb)),
            (rhs, lhs, _shape(eqn.invars[0]), rc, rb, lb, rfree, len(lb) + len(lfree))):
        if axis is None:
            continue
        if axis in contract:
            raise Mixed
        if axis in batch:  # the other side's batch axis must not vary along it
            paired = other_batch[batch.index(axis)]
            if paired not in other_constant | _unit_axes(other_shape):
                raise Mixed
            return batch.index(axis), frozenset()
        return offset + free.index(axis), frozenset()
    return UNSLICED


def _conv(eqn: Any, lhs: Tag, rhs: Tag) -> Tag:
    """A convolution keeps the input's batch apart, and (ungrouped) the kernel's output features."""
    numbers, params = eqn.params["dimension_numbers"], eqn.params
    if lhs[0] is None and rhs[0] is None:
        return UNSLICED
    if params.get("batch_group_count", 1) == 1 and rhs[0] is None and lhs[0] == numbers.lhs_spec[0]:
        return numbers.out_spec[0], frozenset()
    if params.get("feature_group_count", 1) == 1 and params.get("batch_group_count", 1) == 1 \
            and lhs[0] is None and rhs[0] == numbers.rhs_spec[0]:
        return numbers.out_spec[1], frozenset()
    raise Mixed


def _rule(tags: _Tags, eqn: Any, ins: list[Tag]) -> list[Tag]:
    name, params = eqn.primitive.name, eqn.params
    rank = len(_shape(eqn.invars[0])) if eqn.invars else 0
    n_out = len(eqn.outvars)
    if name in INLINE_CALLS and params.get(INLINE_CALLS[name]) is not None:
        sub = params[INLINE_CALLS[name]]
        return tags.run(getattr(sub, "jaxpr", sub), ins)
    if all(t[0] is None for t in ins) and name not in ("broadcast_in_dim",) and name not in ELEMENTWISE:
        return [UNSLICED] * n_out  # nothing sliced flows in (an iota, a constant's arithmetic)
    if name in ELEMENTWISE:
        return [_elementwise(eqn, ins)] * n_out
    if name == "broadcast_in_dim":
        return [_broadcast(eqn, ins[0])]
    if name == "reshape":
        return [_reshape(eqn, ins[0])]
    if name == "squeeze":
        return [_without(ins[0], params["dimensions"], rank)]
    if name == "transpose":
        perm = params["permutation"]
        return [_moved(ins[0], {old: new for new, old in enumerate(perm)})]
    if name in REDUCTIONS:
        return [_without(ins[0], params["axes"], rank)] * n_out
    if name == "dot_general":
        return [_dot(eqn, ins[0], ins[1])]
    if name == "conv_general_dilated":
        return [_conv(eqn, ins[0], ins[1])]
    axis = next(t[0] for t in ins if t[0] is not None)
    if name in CUMULATIVE and params["axis"] != axis:
        return [(axis, frozenset())]
    if name == "slice" and params["start_indices"][axis] == 0 \
            and params["limit_indices"][axis] == _shape(eqn.invars[0])[axis] \
            and (params.get("strides") is None or params["strides"][axis] == 1):
        return [(axis, frozenset())]
    if name == "dynamic_slice" and ins[0][0] == axis and all(t[0] is None for t in ins[1:]) \
            and params["slice_sizes"][axis] == _shape(eqn.invars[0])[axis]:
        return [(axis, frozenset())]
    if name == "pad" and ins[1][0] is None and tuple(params["padding_config"][axis]) == (0, 0, 0):
        return [(axis, frozenset())]
    if name in ("concatenate", "sort", "split") and params.get("dimension", params.get("axis")) != axis \
            and all(a == axis or axis in c | _unit_axes(_shape(v)) for (a, c), v in zip(ins, eqn.invars, strict=True)):
        return [(axis, frozenset())] * n_out
    raise Mixed


def slicing_of(closed: Any, in_axes: Sequence[int | None]) -> Slicing | None:
    """The slicing of `closed` (a traced program) along `in_axes` when it is one (every output sliced), else None."""
    jaxpr = getattr(closed, "jaxpr", closed)
    sizes = {_shape(v)[a] for v, a in zip(jaxpr.invars, in_axes, strict=True) if a is not None}
    if len(sizes) != 1:
        return None
    tags = _Tags()
    try:
        outs = tags.run(jaxpr, [(a, frozenset()) for a in in_axes])
    except Mixed:
        return None
    if any(a is None for a, _ in outs):
        return None
    length = sizes.pop()
    sliced = total = 0
    for eqn in iter_eqns(jaxpr):
        for var in eqn.outvars:
            shape, (axis, constant) = _shape(var), tags.read(var)
            total += math.prod(shape)
            # sliced, or broadcast along an axis of that length (5p's causal mask, as long as the scores)
            if axis is not None or any(shape[c] == length for c in constant):
                sliced += math.prod(shape)
    return Slicing(tuple(in_axes), tuple(a for a, _ in outs if a is not None), length, sliced / max(total, 1))


def slicings(closed: Any) -> list[Slicing]:
    """Every slicing of the program found by trying, for each axis of its first output, the inputs' axes of that
    length (or none); the ones whose work divides best first (slicing an attention's value columns alone would
    compute all its scores for every slice)."""
    jaxpr = getattr(closed, "jaxpr", closed)
    if not jaxpr.outvars:
        return []
    found: dict[tuple[int | None, ...], Slicing] = {}
    out = _shape(jaxpr.outvars[0])
    for size in sorted({n for n in out if n > 1}, reverse=True):
        options = [[a for a, n in enumerate(_shape(v)) if n == size] + [None] for v in jaxpr.invars]
        combos = sorted(itertools.islice(itertools.product(*options), MOST_CANDIDATES),
                        key=lambda axes: sum(a is None for a in axes))
        for axes in combos:
            if axes not in found and (slicing := slicing_of(jaxpr, axes)) is not None:
                found[axes] = slicing
    return sorted(found.values(), key=lambda s: (-s.shrinks, -s.size))


def same_program(whole: Any, piece: Any, slicing: Slicing, pieces: int) -> bool:
    """Whether `piece` (the program traced at one slice's shapes) is `whole` computed on a slice: the same
    primitives in the same order with the same literals, every sliced value `pieces` times shorter along its
    axis and every other value the same shape (or shorter along an axis it is constant along)."""
    tags = _Tags()
    tags.run(getattr(whole, "jaxpr", whole), [(a, frozenset()) for a in slicing.in_axes])
    return _same(getattr(whole, "jaxpr", whole), getattr(piece, "jaxpr", piece), tags, pieces)


def _same(whole: Any, piece: Any, tags: _Tags, pieces: int) -> bool:
    if len(whole.eqns) != len(piece.eqns) or not _same_vars(whole.invars, piece.invars, tags, pieces):
        return False
    for a, b in zip(whole.eqns, piece.eqns, strict=True):
        if a.primitive.name != b.primitive.name or len(a.invars) != len(b.invars):
            return False
        for x, y in zip(a.invars, b.invars, strict=True):
            if isinstance(x, jex_core.Literal) != isinstance(y, jex_core.Literal):
                return False
            if isinstance(x, jex_core.Literal) and str(x.val) != str(y.val):
                return False
        if not _same_vars(a.outvars, b.outvars, tags, pieces):
            return False
        name = a.primitive.name
        if name in INLINE_CALLS and a.params.get(INLINE_CALLS[name]) is not None:
            sub_a, sub_b = a.params[INLINE_CALLS[name]], b.params[INLINE_CALLS[name]]
            if not _same(getattr(sub_a, "jaxpr", sub_a), getattr(sub_b, "jaxpr", sub_b), tags, pieces):
                return False
    return True


def _same_vars(whole: Sequence[Any], piece: Sequence[Any], tags: _Tags, pieces: int) -> bool:
    if len(whole) != len(piece):
        return False
    for x, y in zip(whole, piece, strict=True):
        axis, constant = tags.read(x)
        full, part = _shape(x), _shape(y)
        if len(full) != len(part):
            return False
        for i, (n, m) in enumerate(zip(full, part, strict=True)):
            shorter = n % pieces == 0 and m == n // pieces
            if i == axis and not shorter:
                return False
            if i != axis and m != n and not (i in constant and shorter):
                return False
    return True
