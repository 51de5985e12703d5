"""Walk a traced program: every equation at any depth, for policy checks on candidates."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from jax.extend import core as jex_core

KERNEL_PRIMITIVES = frozenset({"pallas_call", "mpmd_map"})  # mpmd_map: pl.kernel / core_map
CALLBACK_PRIMITIVES = frozenset({"pure_callback", "io_callback", "debug_callback", "callback", "host_callback"})
# Calls whose body runs inline, by the parameter that holds it: program rewrites and analyses go into them.
INLINE_CALLS = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
                "remat": "jaxpr", "checkpoint": "jaxpr", "custom_jvp_call": "call_jaxpr",
                "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr"}


def closed_jaxpr(jaxpr: Any) -> jex_core.ClosedJaxpr:
    """A jaxpr as a closed one (without constants where it has none)."""
    return jaxpr if isinstance(jaxpr, jex_core.ClosedJaxpr) else jex_core.ClosedJaxpr(jaxpr, ())


def inline_body(eqn: Any) -> Any | None:
    """The body of an inline call that takes the call's arguments one for one (its invars are the eqn's), or None
    for any other equation."""
    key = INLINE_CALLS.get(eqn.primitive.name)
    inner = eqn.params.get(key) if key else None
    if inner is None or len(getattr(inner, "jaxpr", inner).invars) != len(eqn.invars):
        return None
    return inner


def sub_jaxprs(value: Any) -> Iterator[Any]:
    if isinstance(value, jex_core.ClosedJaxpr):
        yield value.jaxpr
    elif isinstance(value, jex_core.Jaxpr):
        yield value
    elif isinstance(value, tuple | list):
        for item in value:
            yield from sub_jaxprs(item)


def eqn_flops(eqn: Any) -> float:
    """FLOPs of one equation if it is a dot or a convolution (elementwise work is not counted), else 0."""
    name = eqn.primitive.name
    if name == "dot_general":
        (lc, _), _ = eqn.params["dimension_numbers"]
        lhs = eqn.invars[0].aval.shape
        return 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in lc)
    if name == "conv_general_dilated":
        rhs = eqn.invars[1].aval.shape
        spec = eqn.params["dimension_numbers"].rhs_spec  # (out feature, in feature, *spatial)
        return 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(rhs[d] for d in spec[1:])
    return 0.0


def iter_eqns(jaxpr: Any) -> Iterator[Any]:
    """Every equation, depth first, including those inside jit, cond, scan, custom_jvp and kernel bodies."""
    if isinstance(jaxpr, jex_core.ClosedJaxpr):
        jaxpr = jaxpr.jaxpr
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in sub_jaxprs(value):
                yield from iter_eqns(sub)


def pallas_calls(jaxpr: Any) -> list[Any]:
    return [e for e in iter_eqns(jaxpr) if e.primitive.name in KERNEL_PRIMITIVES]


def vmem_limit(eqn: Any) -> int | None:
    params = eqn.params.get("compiler_params") or {}
    values = params.values() if isinstance(params, dict) else [params]
    for p in values:
        limit = getattr(p, "vmem_limit_bytes", None)
        if limit:
            return int(limit)
    return None


def callbacks(jaxpr: Any) -> list[str]:
    return sorted({e.primitive.name for e in iter_eqns(jaxpr) if e.primitive.name in CALLBACK_PRIMITIVES})


def aliased_calls(jaxpr: Any) -> list[str]:
    return [str(e.params.get("name") or "pallas_call") for e in pallas_calls(jaxpr)
            if e.params.get("input_output_aliases")]



def kernel_definitions(jaxpr: Any, filename: str) -> list[tuple[str, int]]:
    """(kernel function, line) for each Pallas kernel body defined in `filename`."""
    found = []
    for eqn in pallas_calls(jaxpr):
        body = eqn.params.get("jaxpr")
        where = getattr(getattr(body, "debug_info", None), "func_src_info", None) or ""
        name, _, location = where.partition(" at ")
        path, _, line = location.rpartition(":")
        if path == filename and line.isdigit():
            found.append((name, int(line)))
    return found
