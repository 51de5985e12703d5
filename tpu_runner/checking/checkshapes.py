"""Which shapes correctness is checked at, and whether the program checked is the program timed.

In order of preference, for each production configuration:
1. the production shapes themselves, when running them in interpret mode fits the budget (elements, FLOPs,
   grid steps): the figure and the check are then about the same program;
2. the task's `get_test_inputs()`, when the candidate's program at those shapes covers its outputs;
3. shapes derived from the production ones: every dimension mapped by value (dimensions that must agree stay
   equal), kept a multiple of (and at least one of) the candidate's production blocks along it and of the
   (8, 128) tile, so a kernel with fixed tuned blocks is checked where its blocks fit.
A checked configuration that is not the production one must trace to the same program form
(`structure.differences`); the first derived shapes that do are taken, and if none do, the result is
`unverified`, naming what differs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import numpy as np

from tpu_runner.analysis import (
    ProgramForm,
    TrafficReport,
    differences,
    jaxpr_walk,
    output_coverage,
    pallas_traffic,
    program_form,
)
from tpu_runner.reports import Budget
from tpu_runner.tasks import Configuration

TILED_FACTORS = (64, 32, 16, 8, 4, 2, 1)
LEADING_FACTORS = (1, 2, 4, 8, 16)
# A reference's slices are left out of its form: JAX drops a slice that takes the whole array, so a reference
# cutting a table built for its production size (a causal mask for a static seq_len) to the inputs' length has
# one at smaller shapes only, and computes the same thing there.
REFERENCE_TRANSPARENT = frozenset({"slice"})
MAX_TRIALS = 8  # derived shapes traced per configuration before giving up on one with the same program


@dataclass
class CheckShape:
    name: str  # "production[0]", "test[1]", "derived[0]"
    config: Configuration
    why: str  # for people: which shapes, and why these
    differs: list[str] = field(default_factory=list)  # how the checked program differs from the timed one
    production: bool = False


@dataclass(frozen=True)
class Production:
    """What the candidate is at one production configuration (traced by the candidate's child)."""

    config: Configuration
    jaxpr: Any
    traffic: TrafficReport
    form: ProgramForm


def _flops(jaxpr: Any, dependent: list[bool]) -> float:
    """FLOPs of the dots and convolutions that depend on the inputs marked `dependent`: one of constants only (a
    model's fixed weights multiplied together) is folded by XLA before the program runs."""
    if hasattr(jaxpr, "jaxpr"):
        jaxpr = jaxpr.jaxpr
    live = {v for v, d in zip(jaxpr.invars, dependent, strict=True) if d}
    total = 0.0
    for eqn in jaxpr.eqns:
        uses = [not hasattr(v, "val") and v in live for v in eqn.invars]
        if not any(uses):
            continue
        total += jaxpr_walk.eqn_flops(eqn)
        for value in eqn.params.values():
            for sub in jaxpr_walk.sub_jaxprs(value):
                inner = sub.jaxpr if hasattr(sub, "jaxpr") else sub
                # A call passes its operands on in order; other nestings (loops, conds) count as all dependent.
                marks = uses if len(inner.invars) == len(uses) else [True] * len(inner.invars)
                total += _flops(inner, marks)
        live.update(eqn.outvars)
    return total


def dot_flops(closed_jaxpr: Any) -> float:
    """FLOPs of the dots and convolutions a traced program runs (elementwise work is not counted), leaving out
    those of constants alone, which XLA folds away."""
    inner = getattr(closed_jaxpr, "jaxpr", closed_jaxpr)
    return _flops(inner, [True] * len(inner.invars))


def _elements(config: Configuration, outputs: Any) -> int:
    return sum(math.prod(a.shape) for a in config.dynamic) + sum(math.prod(o.shape) for o in jax.tree.leaves(outputs))


def _steps(traffic: TrafficReport) -> int:
    return sum(c.grid_steps * c.multiplicity for c in traffic.calls)


def _abstract(config: Configuration) -> list[Any]:
    return [jax.ShapeDtypeStruct(a.shape, np.dtype(a.dtype)) for a in config.dynamic] + list(config.static)


def reference_cost(config: Configuration, ref_fn: Callable[..., Any]) -> tuple[int, float]:
    """The elements (inputs and outputs) and dot FLOPs of the reference at `config`: the interpret-mode budget's
    measure of a configuration, apart from the candidate's grid steps."""
    args = _abstract(config)
    ref_jaxpr = jax.make_jaxpr(ref_fn, static_argnums=config.static_argnums)(*args)
    outputs = jax.eval_shape(jax.jit(ref_fn, static_argnums=config.static_argnums), *args)
    return _elements(config, outputs), dot_flops(ref_jaxpr)


def cost_of(config: Configuration, ref_fn: Callable[..., Any], traffic: TrafficReport) -> tuple[int, float, int]:
    return (*reference_cost(config, ref_fn), _steps(traffic))


def _within(cost: tuple[int, float, int], budget: Budget) -> bool:
    elements, flops, steps = cost
    return elements <= budget.elements and flops <= budget.flops and steps <= budget.grid_steps


def _describe_cost(cost: tuple[int, float, int]) -> str:
    elements, flops, steps = cost
    return f"{elements / 1e6:.3g}M elements, {flops / 1e9:.3g} GFLOP, {steps} grid steps"


def _over_budget(cost: tuple[int, float, int], budget: Budget) -> str:
    elements, flops, steps = cost
    over = []
    if elements > budget.elements:
        over.append(f"{elements / 1e6:.3g}M elements > {budget.elements / 1e6:.3g}M")
    if flops > budget.flops:
        over.append(f"{flops / 1e9:.3g} GFLOP > {budget.flops / 1e9:.3g}")
    if steps > budget.grid_steps:
        over.append(f"{steps} grid steps > {budget.grid_steps}")
    return ", ".join(over)


# --- derived shapes -------------------------------------------------------------------------------------------


def block_multiples(traffic: TrafficReport) -> dict[int, int]:
    """For each dimension size blocked at production, the multiple every derived size of it must keep: the lcm
    of the blocks that tile it (a block as large as the dimension does not count: it follows the array)."""
    need: dict[int, int] = {}
    for call in traffic.calls:
        for op in call.operands:
            if op.in_hbm_manual or len(op.block_shape) != len(op.shape):
                continue
            for dim, block in zip(op.shape, op.block_shape, strict=True):
                if block is not None and 1 < block < dim:
                    need[dim] = math.lcm(need.get(dim, 1), block)
    return need


def tiled_sizes(config: Configuration) -> set[int]:
    """Sizes that are one of the last two dimensions of some input: the (8, 128) tile constrains those; leading
    dimensions (batch, heads, experts) only keep their blocks."""
    return {d for a in config.dynamic for d in a.shape[-2:]}


def _tile(d: int) -> int:
    return 128 if d % 128 == 0 else 8 if d % 8 == 0 else d


def _shrunk(d: int, factor: int, unit: int) -> int:
    """d / factor when that stays a whole multiple of `unit`, else d."""
    if factor == 1 or d % factor:
        return d
    small = d // factor
    return small if small >= unit and small % unit == 0 else d


def _mapped(config: Configuration, mapping: dict[int, int], ranges: Sequence[tuple[int, int] | None]) -> Configuration:
    specs = []
    for a, rng in zip(config.dynamic, ranges, strict=True):
        if rng is not None and rng[1] + 1 in mapping:  # indices into a dimension that shrank
            rng = (rng[0], min(rng[1], mapping[rng[1] + 1] - 1))
        specs.append(replace(a, shape=tuple(mapping[d] for d in a.shape), int_range=rng))
    return Configuration(tuple(specs), config.static)


def free_axes(config: Configuration, ref_fn: Callable[..., Any], ref_form: ReferenceForm) -> set[tuple[int, int]]:
    """Leading input axes (not one of an input's last two) the reference lets shrink on their own, to 1, and
    still computes the same there: a batch axis that merely has the size of an image's side, say. Mapping sizes
    by value would hold it at that side's tile. None for a task with integer inputs: an index into a leading
    axis would point past its end once it shrank, and an out-of-range gather is no check."""
    if any(np.issubdtype(np.dtype(a.dtype), np.integer) or np.dtype(a.dtype) == np.bool_ for a in config.dynamic):
        return set()
    free = set()
    for i, a in enumerate(config.dynamic):
        for j, d in enumerate(a.shape[:-2]):
            if d <= 1:
                continue
            shape = a.shape[:j] + (1,) + a.shape[j + 1:]
            trial = Configuration(tuple(replace(b, shape=shape) if k == i else b
                                        for k, b in enumerate(config.dynamic)), config.static)
            try:
                here = reference_form(trial, ref_fn)  # tracing it is the test of whether the reference accepts it
            except Exception:  # noqa: BLE001 - the reference refuses it: the axis is tied to another
                continue
            if not differences(here.form, ref_form.form, limit=1) and not new_broadcasts(here, ref_form):
                free.add((i, j))
    return free


def new_broadcasts(here: ReferenceForm, there: ReferenceForm) -> bool:
    """Does some operand broadcast a size-1 axis here that it did not there? (Axes that became 1 on both sides
    of an equation broadcast nothing; a per-channel bias meeting a single channel does.)"""
    if len(here.broadcasts) != len(there.broadcasts):
        return True
    return any(h and not t for a, b in zip(here.broadcasts, there.broadcasts, strict=True)
               for h, t in zip(a, b, strict=True))


def _with_free_axes(small: Configuration, config: Configuration, free: set[tuple[int, int]],
                    need: dict[int, int]) -> Configuration:
    """`small` with the free axes shrunk to 1 (or to the kernel's block along them)."""
    if not free:
        return small
    specs = []
    for i, (a, b) in enumerate(zip(small.dynamic, config.dynamic, strict=True)):
        shape = tuple(min(need.get(d, 1), d) if (i, j) in free else s
                      for j, (s, d) in enumerate(zip(a.shape, b.shape, strict=True)))
        specs.append(replace(a, shape=shape))
    return Configuration(tuple(specs), small.static)


def derived_candidates(config: Configuration, need: dict[int, int], ranges: Sequence[tuple[int, int] | None],
                       max_elements: int, free: set[tuple[int, int]] | None = None) -> list[Configuration]:
    """Smaller configurations, smallest first, within `max_elements` of input. Sizes are mapped by value, so
    equal dimensions stay equal; the tiled sizes (last two dimensions) and the leading ones each shrink by one
    factor, so ratios among the leading ones (query heads to kv heads) are kept too. With `free` axes
    (free_axes), each mapping is also tried with those at 1."""
    dims = sorted({d for a in config.dynamic for d in a.shape})
    tiled = tiled_sizes(config)
    seen: set[tuple[tuple[int, ...], ...]] = {tuple(a.shape for a in config.dynamic)}
    out = []
    for lead in LEADING_FACTORS:
        for factor in TILED_FACTORS:
            mapping = {d: _shrunk(d, factor, math.lcm(_tile(d), need.get(d, 1))) if d in tiled
                       else _shrunk(d, lead, need.get(d, 1)) for d in dims}
            mapped = _mapped(config, mapping, ranges)
            for small in (mapped, _with_free_axes(mapped, config, free or set(), need)):
                key = tuple(a.shape for a in small.dynamic)
                if key in seen or sum(math.prod(s) for s in key) > max_elements:
                    continue
                seen.add(key)
                out.append(small)

    out.sort(key=lambda c: sum(math.prod(a.shape) for a in c.dynamic))
    return out


def single_block(small: Configuration, config: Configuration, need: dict[int, int]) -> bool:
    """Did some blocked dimension shrink to one block? The kernel's steps across blocks go unchecked there."""
    return any(d in need and s < 2 * need[d] for a, b in zip(small.dynamic, config.dynamic, strict=True)
               for s, d in zip(a.shape, b.shape, strict=True))


def _tile_units(config: Configuration) -> list[list[int]]:
    """The (8, 128) tile's unit for each input axis (1 for leading axes)."""
    return [[_tile(d) if j >= len(a.shape) - 2 else 1 for j, d in enumerate(a.shape)] for a in config.dynamic]


def position_units(config: Configuration, traffic: TrafficReport) -> list[list[int]]:
    """For each input axis, the size every derived size of it must be a multiple of: the (8, 128) tile on the
    last two axes, and the block of the kernel operand that is this input (same shape and dtype) along it."""
    units = _tile_units(config)
    for call in traffic.calls:
        taken: set[int] = set()  # operands are matched to inputs in order, one each
        for op in call.operands:
            if op.role != "input" or op.in_hbm_manual or len(op.block_shape) != len(op.shape):
                continue
            match = next((i for i, a in enumerate(config.dynamic) if i not in taken and a.shape == op.shape
                          and np.dtype(a.dtype) == np.dtype(op.dtype)), None)
            if match is None:
                continue
            taken.add(match)
            for j, (d, b) in enumerate(zip(op.shape, op.block_shape, strict=True)):
                if b is not None and 1 < b < d:
                    units[match][j] = math.lcm(units[match][j], b)
    return units


def split_candidates(config: Configuration, traffic: TrafficReport, ranges: Sequence[tuple[int, int] | None],
                     max_elements: int) -> list[Configuration]:
    """Smaller configurations where equal sizes may part when the kernel blocks them differently: a square
    matmul's M, K and N are all 4096, but with blocks 1024 x 2048 (block_k 1024) the smallest shapes that keep
    every block are (1024, 1024) @ (1024, 2048). Axes of equal size and equal unit still move together, and an
    axis no kernel operand blocks (a bias the kernel reshapes before use) follows the blocked axes of its size:
    once as the largest of them and once as the smallest, since which one it goes with is not known here."""
    units = position_units(config, traffic)
    tiles = _tile_units(config)
    blocked = [(i, j, d) for i, a in enumerate(config.dynamic) for j, d in enumerate(a.shape)
               if units[i][j] != tiles[i][j]]
    out: list[Configuration] = []
    for level in range(4):
        shapes = [tuple(min(d, u * 2 ** level) if u < d else d for d, u in zip(a.shape, unit_row, strict=True))
                  for a, unit_row in zip(config.dynamic, units, strict=True)]
        for pick in (max, min):
            specs = []
            for i, (a, rng) in enumerate(zip(config.dynamic, ranges, strict=True)):
                shape = list(shapes[i])
                for j, d in enumerate(a.shape):
                    peers = {shapes[bi][bj] for bi, bj, bd in blocked if bd == d}
                    if units[i][j] == tiles[i][j] and peers:
                        shape[j] = pick(peers)
                specs.append(replace(a, shape=tuple(shape), int_range=rng))
            small = Configuration(tuple(specs), config.static)
            if sum(math.prod(a.shape) for a in small.dynamic) <= max_elements and small.dynamic != config.dynamic \
                    and small not in out:
                out.append(small)
    return out


# --- choosing ------------------------------------------------------------------------------------------------


@dataclass
class Trial:
    config: Configuration
    ok: bool
    problem: str = ""
    differs: list[str] = field(default_factory=list)
    cost: tuple[int, float, int] = (0, 0.0, 0)
    reference_only: bool = False  # refused on the reference's side: only the reference was traced


@dataclass(frozen=True)
class ReferenceForm:
    """What the reference computes at some shapes, sizes aside: its program form and, per equation operand of
    the output's rank, which axes are 1 where the result's are not (an implicit broadcast)."""

    form: ProgramForm
    broadcasts: tuple[tuple[bool, ...], ...]


def reference_form(config: Configuration, ref_fn: Callable[..., Any]) -> ReferenceForm:
    closed = jax.make_jaxpr(ref_fn, static_argnums=config.static_argnums)(*_abstract(config))
    broadcasts = []
    for eqn in jaxpr_walk.iter_eqns(closed):
        if eqn.primitive.name in REFERENCE_TRANSPARENT:
            continue
        shape = tuple(getattr(eqn.outvars[0].aval, "shape", ())) if eqn.outvars else ()
        for var in eqn.invars:
            dims = tuple(getattr(getattr(var, "aval", None), "shape", ()))
            if shape and len(dims) == len(shape):
                broadcasts.append(tuple(a == 1 and b != 1 for a, b in zip(dims, shape, strict=True)))
    return ReferenceForm(program_form(closed, REFERENCE_TRANSPARENT), tuple(broadcasts))


def try_shape(config: Configuration, ref_fn: Callable[..., Any], cand_fn: Callable[..., Any],
              production: Production, budget: Budget, ref_form: ReferenceForm | None = None) -> Trial:
    """Can the candidate be checked at `config`, and is its program there the one timed? With `ref_form` (the
    reference's form at the production shapes), a derived shape where the reference itself computes something
    else (a per-channel bias that now broadcasts one channel to many) is no check shape either."""
    args = _abstract(config)
    try:
        here = reference_form(config, ref_fn)  # one trace: whether the reference accepts it, and what it computes
    except Exception as exc:  # noqa: BLE001 - a shape the reference refuses is simply not a check shape
        return Trial(config, False, f"the reference does not accept it ({type(exc).__name__})", reference_only=True)
    if ref_form is not None:
        changed = differences(here.form, ref_form.form, limit=1)
        if changed or new_broadcasts(here, ref_form):
            return Trial(config, False, "the reference computes differently there ("
                         + (changed[0] if changed else "a size-1 axis now broadcasts against a larger one") + ")",
                         reference_only=True)
    try:
        jaxpr = jax.make_jaxpr(cand_fn, static_argnums=config.static_argnums)(*args)
    except Exception as exc:  # noqa: BLE001 - likewise for the candidate
        return Trial(config, False, f"the candidate does not accept it ({type(exc).__name__}: {str(exc)[:160]})")
    traffic = pallas_traffic(jaxpr)
    cost = cost_of(config, ref_fn, traffic)
    if not _within(cost, budget):
        return Trial(config, False, f"too large for interpret mode ({_over_budget(cost, budget)})", cost=cost)
    coverage = output_coverage(jaxpr)
    if not coverage.complete:
        return Trial(config, False, "the candidate's grid does not write all of its output there: "
                     + coverage.missing[0], cost=cost)
    return Trial(config, True, differs=differences(program_form(jaxpr), production.form), cost=cost)


def choose(*, production: list[Production], tests: list[Configuration], ref_fn: Callable[..., Any],
           cand_fn: Callable[..., Any], budget: Budget,
           int_ranges: list[list[tuple[int, int] | None]]) -> tuple[list[CheckShape], list[str]]:
    """The shapes to check at, and notes on the configurations that cannot be checked."""
    chosen: list[CheckShape] = []
    notes: list[str] = []
    pending: list[int] = []
    for i, prod in enumerate(production):
        cost = cost_of(prod.config, ref_fn, prod.traffic)
        if _within(cost, budget):
            chosen.append(CheckShape(f"production[{i}]", prod.config, f"production[{i}]: checked at the production "
                                     f"shapes ({prod.config.describe()}; {_describe_cost(cost)})", production=True))
        else:
            pending.append(i)
    if not pending:
        return chosen, notes
    why_not_prod = {i: _over_budget(cost_of(production[i].config, ref_fn, production[i].traffic), budget)
                    for i in pending}
    if tests:
        trials = [try_shape(t, ref_fn, cand_fn, _closest(production, pending, t), budget) for t in tests]
        if all(t.ok for t in trials):
            for j, trial in enumerate(trials):
                chosen.append(CheckShape(
                    f"test[{j}]", tests[j], f"test[{j}]: checked at get_test_inputs() ({tests[j].describe()}); the "
                    f"production shapes exceed the interpret-mode budget ({why_not_prod[pending[0]]})",
                    differs=trial.differs))
            return chosen, notes
        bad = next(t for t in trials if not t.ok)
        notes.append(f"get_test_inputs() ({bad.config.describe()}) cannot check this candidate: {bad.problem}; "
                     "derived shapes are used instead")
    for i in pending:
        prod = production[i]
        need = block_multiples(prod.traffic)
        fallback: Trial | None = None
        picked: Trial | None = None
        traced = 0
        ref_form = reference_form(prod.config, ref_fn)
        free = free_axes(prod.config, ref_fn, ref_form)
        candidates = derived_candidates(prod.config, need, int_ranges[i], budget.elements, free)
        candidates += [c for c in split_candidates(prod.config, prod.traffic, int_ranges[i], budget.elements)
                       if c not in candidates]
        # Those with two blocks or more along every blocked dimension first, so the steps across blocks are checked.
        candidates.sort(key=lambda c: single_block(c, prod.config, need))
        for small in candidates:
            if traced >= MAX_TRIALS:
                break
            trial = try_shape(small, ref_fn, cand_fn, prod, budget, ref_form)
            traced += not trial.reference_only
            if not trial.ok:
                continue
            if not trial.differs:
                picked = trial
                break
            fallback = fallback or trial
        picked = picked or fallback
        if picked is None:
            notes.append(f"configuration {i} ({prod.config.describe()}): no smaller configuration that both the "
                         "reference and the candidate accept, within the interpret-mode budget and a multiple of "
                         f"the kernel's blocks, was found; the production shapes exceed it ({why_not_prod[i]}); "
                         "correctness not checked")
            continue
        blocks = ", ".join(f"{d} in multiples of {m}" for d, m in sorted(need.items())) or "no blocked dimension"
        source = "the task has no get_test_inputs()" if not tests else "get_test_inputs() does not fit the kernel"
        chosen.append(CheckShape(
            f"derived[{i}]", picked.config,
            f"derived[{i}]: {source}; checked on ({picked.config.describe()}) derived from "
            f"({prod.config.describe()}), keeping the kernel's blocks ({blocks}); the production shapes exceed "
            f"the interpret-mode budget ({why_not_prod[i]})", differs=picked.differs))
    return chosen, notes


def _closest(production: list[Production], pending: list[int], test: Configuration) -> Production:
    """The production configuration a test configuration stands for: the first with the same static values."""
    for i in pending:
        if production[i].config.static == test.static:
            return production[i]
    return production[pending[0]]
