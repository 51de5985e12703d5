"""The share of each input a reference's outputs can depend on (the roofline's compulsory traffic): structural, so
only a select with an input-free predicate drops elements; a value-dependent choice keeps everything."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest

from tpu_runner.analysis.liveness import read_fractions
from tpu_runner.reference.child import used_inputs


def _fractions(fn, *shapes: tuple[int, ...]) -> list[float]:  # noqa: ANN001
    closed = jax.make_jaxpr(jax.jit(fn))(*(jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in shapes))
    return read_fractions(closed, used_inputs(closed))


def _biased_causal(q, k, v, bias, unused):  # noqa: ANN001, ANN202 - 5p's form, with an input it never reads
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1]) + bias[None]
    n = q.shape[2]
    causal = (jnp.arange(n)[:, None] >= jnp.arange(n)[None, :])
    s = jnp.where(causal, s, jnp.finfo(s.dtype).min)
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)


def test_a_causal_mask_leaves_the_bias_below_the_diagonal_and_an_ignored_input_nothing() -> None:
    q, bias = (2, 4, 256, 128), (4, 256, 256)
    fractions = _fractions(_biased_causal, q, q, q, bias, (8,))
    assert fractions[:3] == [1.0, 1.0, 1.0]  # q, k and v reach every output through the matmuls
    assert fractions[3] == pytest.approx(257 / 512)  # the diagonal and below
    assert fractions[4] == 0.0


def test_a_mask_made_from_the_inputs_or_a_sliced_away_part_is_told_apart() -> None:
    # A predicate computed from an input is a choice by value: every element can reach the output.
    assert _fractions(lambda x, y: jnp.where(x > 0, x, y), (64, 128), (64, 128)) == [1.0, 1.0]
    # A constant predicate (a captured constant): the first half of the rows of x, the second of y's rows 32..63.
    rows = jnp.arange(64)[:, None] < 32

    def halves(x, y):  # noqa: ANN001, ANN202
        return jnp.where(rows, x, y[1:].sum(axis=0, keepdims=True) + y[:-1])

    x_share, y_share = _fractions(halves, (64, 128), (65, 128))
    assert x_share == pytest.approx(0.5)
    assert y_share == pytest.approx(64 / 65)  # the sum reaches every row but the first, which no row chooses
    # Without the sum, only y's rows 32..63 (of 65) are chosen.
    assert _fractions(lambda x, y: jnp.where(rows, x, y[:-1]), (64, 128), (65, 128))[1] == pytest.approx(32 / 65)
