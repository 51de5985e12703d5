"""A kernel's tunable parameters: module-level constants it declares in a `TUNABLE` dict.

    TUNABLE = {"DEFAULT_BLOCK_M": (256, 512, 1024), "DEFAULT_BLOCK_K": (256, 512)}
    DEFAULT_BLOCK_M = 512
    DEFAULT_BLOCK_K = 512

Each name is a module-level constant assigned once; its values are literals. The autotuner and the search's
parametric strategies make variants by rewriting those assignments, so any kernel - written by a person, an
LLM or the offline brain - can be tuned without a brain. Which variants are valid is for the evaluator to say.
"""

from __future__ import annotations

import ast
import itertools
import random
from typing import Any

from tpu_runner.tasks import parse as parse_source

Params = dict[str, Any]
Space = dict[str, tuple[Any, ...]]


class TunableError(ValueError):
    """The TUNABLE declaration is malformed."""


def _module(code: str) -> ast.Module:
    try:
        return parse_source(code)
    except SyntaxError as exc:
        raise TunableError(f"the kernel does not parse: {exc}") from exc


def _assignments(tree: ast.Module) -> dict[str, list[ast.Assign]]:
    found: dict[str, list[ast.Assign]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found.setdefault(node.targets[0].id, []).append(node)
    return found


_ARITHMETIC = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
               ast.FloorDiv: lambda a, b: a // b, ast.Pow: lambda a, b: a ** b}


def _constant(node: ast.expr) -> Any:
    """A literal, with integer arithmetic allowed anywhere inside it (64 * 1024 * 1024)."""
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        return _ARITHMETIC[type(node.op)](_constant(node.left), _constant(node.right))
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_constant(e) for e in node.elts)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_constant(k): _constant(v) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[arg-type]
    return ast.literal_eval(node)


def space(code: str) -> Space:
    """The declared space, in declaration order; empty when the kernel declares none."""
    tree = _module(code)
    assigns = _assignments(tree)
    if "TUNABLE" not in assigns:
        return {}
    node = assigns["TUNABLE"][-1]
    try:
        declared = _constant(node.value)
    except (ValueError, TypeError) as exc:
        raise TunableError(f"TUNABLE (line {node.lineno}) must be a literal dict of literal value lists") from exc
    if not isinstance(declared, dict) or not declared:
        raise TunableError(f"TUNABLE (line {node.lineno}) must be a non-empty dict of name -> values")
    out: Space = {}
    for name, values in declared.items():
        if not isinstance(name, str) or not isinstance(values, (list, tuple)) or not values:
            raise TunableError(f"TUNABLE[{name!r}] must list at least one value")
        if name not in assigns:
            raise TunableError(f"TUNABLE names {name!r}, which the module does not assign")
        if len(assigns[name]) > 1:
            raise TunableError(f"{name} is assigned more than once at module level; tunables are assigned once")
        out[name] = tuple(values)
    return out


def current(code: str) -> Params:
    """The values the kernel's tunables have now (None where the assignment is not a literal)."""
    assigns = _assignments(_module(code))
    values: Params = {}
    for name in space(code):
        try:
            values[name] = _constant(assigns[name][0].value)
        except (ValueError, TypeError):
            values[name] = None
    return values


def with_params(code: str, params: Params) -> str:
    """The kernel with its tunables set to `params` (names not given keep their value)."""
    declared = space(code)
    unknown = set(params) - set(declared)
    if unknown:
        raise TunableError(f"not tunable in this kernel: {', '.join(sorted(unknown))}")
    assigns = _assignments(_module(code))
    lines = code.splitlines(keepends=True)
    # Replace from the bottom up so earlier line numbers stay valid.
    for name in sorted(params, key=lambda n: assigns[n][0].lineno, reverse=True):
        node = assigns[name][0]
        first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
        tail = lines[last][node.end_col_offset:] if node.end_col_offset is not None else "\n"
        lines[first:last + 1] = [f"{lines[first][:node.col_offset]}{name} = {params[name]!r}{tail}"]
    return "".join(lines)


def role(name: str) -> str:
    """What a tunable controls, independent of the kernel's naming: DEFAULT_BLOCK_M -> BLOCK_M."""
    return name.upper().removeprefix("DEFAULT_")


def step(params: Params, declared: Space, roles: tuple[str, ...], direction: int) -> Params | None:
    """Move every tunable whose role ends with one of `roles` one value along its list; None if none moved."""
    moved = dict(params)
    for name, values in declared.items():
        if not role(name).endswith(roles) or params.get(name) not in values:
            continue
        i = values.index(params[name]) + direction
        if 0 <= i < len(values):
            moved[name] = values[i]
    return moved if moved != params else None


def size(declared: Space) -> int:
    n = 1
    for values in declared.values():
        n *= len(values)
    return n


def sample(declared: Space, n: int, rng: random.Random, exclude: tuple[Params, ...] = ()) -> list[Params]:
    """Up to n distinct points of the space, uniformly at random (the whole space, shuffled, when it is small)."""
    names = list(declared)
    seen = {tuple(p.get(k) for k in names) for p in exclude}
    if size(declared) <= 4096:
        points = [p for p in itertools.product(*declared.values()) if p not in seen]
        rng.shuffle(points)
        return [dict(zip(names, p, strict=True)) for p in points[:n]]
    out: list[Params] = []
    for _ in range(n * 20):
        if len(out) >= n:
            break
        point = tuple(rng.choice(declared[k]) for k in names)
        if point not in seen:
            seen.add(point)
            out.append(dict(zip(names, point, strict=True)))
    return out
