"""Confirming attention by numbers: the reference and a plain model of attention with what was read off the
program run on the same small inputs, so anything that merely looks like attention is refused. Run only in the
sandboxed child that reads a task (agents.offline.reading); recognising and writing attention need no jax."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from agents.offline.attention.shape import ROLES, AttentionShape, final_shape
from agents.offline.expr import NotRecognised


def canonical(x: Any, order: tuple[str, ...], roles: tuple[str, ...] = ROLES) -> Any:
    """An array whose axes have the roles of `order` as the 4-D array of `roles` (size 1 for a role it lacks)."""
    import jax.numpy as jnp

    keep = [i for i, r in enumerate(order) if r != "1"]
    names = [order[i] for i in keep]
    x = jnp.reshape(x, [x.shape[i] for i in keep])
    present = [r for r in roles if r in names]
    x = jnp.transpose(x, [names.index(r) for r in present])
    return jnp.reshape(x, [x.shape[present.index(r)] if r in present else 1 for r in roles])


def model(inputs: Sequence[Any], spec: AttentionShape) -> Any:
    """Plain attention with what was read off the program, in f32 (what the reference must agree with)."""
    import jax.numpy as jnp  # run only in the sandboxed child; recognising and writing attention need no jax

    q = canonical(jnp.asarray(inputs[spec.q], jnp.float32), spec.q_order)
    k = canonical(jnp.asarray(inputs[spec.k], jnp.float32), spec.k_order)
    v = canonical(jnp.asarray(inputs[spec.v], jnp.float32), spec.v_order)
    group = q.shape[1] // k.shape[1]
    k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k)
    for op in spec.score_ops:
        if op.kind == "scale":
            s = s * op.value
        elif op.kind == "bias":
            assert spec.bias is not None
            s = s + canonical(jnp.asarray(inputs[spec.bias], jnp.float32), spec.bias_order, ("b", "h", "q", "k"))
        else:
            mask = jnp.arange(q.shape[2])[:, None] >= jnp.arange(k.shape[2])[None, :]
            s = jnp.where(mask, s, -jnp.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = jnp.exp(s)
    out = jnp.einsum("bhqk,bhkd->bhqd", p / p.sum(axis=-1, keepdims=True), v)
    return from_canonical(out, spec.out_order, spec.out_dims)


def from_canonical(x: Any, order: tuple[str, ...], dims: tuple[tuple[str, ...], ...]) -> Any:
    """A (b, h, s, d) array as the output: its roles in `order`, then reshaped to `dims`."""
    import jax.numpy as jnp

    names = [r for r in order if r != "1"]
    present = [r for r in ROLES if r in names]
    sizes = dict(zip(ROLES, x.shape, strict=True))
    x = jnp.reshape(x, [sizes[r] for r in present])
    return jnp.reshape(jnp.transpose(x, [present.index(r) for r in names]), final_shape(dims, sizes))


def confirm_attention(reference: Any, spec: AttentionShape, values: list[Any], static: tuple[Any, ...]) -> None:
    """Run the reference and the model on the same inputs; NotRecognised unless they agree."""
    import jax.numpy as jnp

    want = np.asarray(jnp.asarray(reference(*values, *static), jnp.float32))
    got = np.asarray(model(values, spec))
    tol = 2e-2 if "bfloat16" in (spec.dtype, spec.out_dtype) else 1e-4
    worst = float(np.max(np.abs(got - want) / (tol + tol * np.abs(want))))
    if not math.isfinite(worst) or worst > 1.0:
        raise NotRecognised(f"the reference looks like attention ({spec.describe()}) but does not compute it: it "
                            "differs from scaled dot-product attention with those parameters")

