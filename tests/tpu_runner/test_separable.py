"""Slicings of a program: the axes along which it computes its outputs independently, found from its equations,
and the check that the reference traced at a slice's shapes is the same program."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest

from tpu_runner.analysis.separable import same_program, slicings


def _biased_attention(q, k, v, bias):
    """5p's reference: a bias per head shared by the batch, causal, in bf16."""
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1]) + bias[None]
    causal = jnp.arange(q.shape[2])[:, None] >= jnp.arange(k.shape[2])[None, :]
    p = jax.nn.softmax(jnp.where(causal, s, jnp.finfo(s.dtype).min), axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", p, v)


def _spec(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.bfloat16)


def _found(fn, *args) -> list[tuple[int | None, ...]]:
    return [s.in_axes for s in slicings(jax.make_jaxpr(fn)(*args))]


def test_an_attention_slices_by_head_first_then_by_batch() -> None:
    qkv, bias = _spec(2, 4, 64, 16), _spec(4, 64, 64)
    found = slicings(jax.make_jaxpr(_biased_attention)(qkv, qkv, qkv, bias))
    # Heads slice every input (the bias along its first axis) and all the work; the batch leaves the bias whole;
    # v's columns alone would compute every score in every slice: last.
    assert [s.in_axes for s in found] == [(1, 1, 1, 0), (0, 0, 0, None), (None, None, 3, None)]
    assert found[0].size == 4 and found[0].out_axes == (1,) and found[-1].shrinks < 0.2 < found[1].shrinks
    whole = jax.make_jaxpr(_biased_attention)(qkv, qkv, qkv, bias)
    piece = jax.make_jaxpr(_biased_attention)(_spec(2, 2, 64, 16), _spec(2, 2, 64, 16), _spec(2, 2, 64, 16),
                                              _spec(2, 64, 64))
    assert same_program(whole, piece, found[0], 2)


def test_what_mixes_an_axis_is_never_sliced_along_it() -> None:
    x, w = jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((16, 16), jnp.float32)
    assert (0,) not in _found(lambda x: x - x.mean(0), x)  # a reduction over it
    assert (1,) not in _found(lambda x: jnp.cumsum(x, 1), x)  # a scan along it
    assert _found(lambda x: jnp.tanh(x @ x.T), x) == []  # both sides of a product
    assert (0, None) in _found(lambda x, w: x @ w, x, w) and (1, None) not in _found(lambda x, w: x @ w, x, w)
    assert (0,) not in _found(lambda x: x * jnp.arange(8.0)[:, None], x)  # a value that varies along it
    assert (0,) not in _found(lambda x: x.reshape(128), x)  # merged with another axis


def test_a_reference_that_traces_otherwise_at_a_slices_shapes_is_not_sliced() -> None:
    """`x / x.shape[0]` analyses as separable along axis 0, but a slice's program divides by another number."""
    def by_rows(x):
        return x / x.shape[0]

    whole = jax.make_jaxpr(by_rows)(jax.ShapeDtypeStruct((8, 16), jnp.float32))
    rows = next(s for s in slicings(whole) if s.in_axes == (0,))
    assert not same_program(whole, jax.make_jaxpr(by_rows)(jax.ShapeDtypeStruct((4, 16), jnp.float32)), rows, 2)
    columns = next(s for s in slicings(whole) if s.in_axes == (1,))
    assert same_program(whole, jax.make_jaxpr(by_rows)(jax.ShapeDtypeStruct((8, 8), jnp.float32)), columns, 2)


@pytest.mark.parametrize("task_dir", ["tasks/causal_attention", "tasks/layer_norm",
                                      "benchmarks/measured/39k_Conv2d_GELU_GlobalAvgPool"])
def test_a_truth_made_in_slices_is_the_whole_truth_for_real_references(task_dir: str) -> None:
    """At a small shape each of these references is sliced (heads, rows, a convolution's output channels) and its
    float64 truth made in slices equals the one made whole."""
    import numpy as np

    from tests.conftest import REPO
    from tpu_runner.checking import (
        derived_candidates,
        free_axes,
        reference_form,
        sliced_widened_program,
        widened_program,
    )
    from tpu_runner.tasks import EVALUATOR_CASES, abstract_configurations, case_inputs, import_reference, load_task

    task = load_task(REPO / task_dir)
    fn = import_reference(task).computation
    config = abstract_configurations(task)[0]
    free = free_axes(config, fn, reference_form(config, fn))
    small = next(iter(derived_candidates(config, {}, [None] * len(config.dynamic), 1 << 18, free)))
    host = case_inputs(small, EVALUATOR_CASES[1])
    assert host is not None
    run, need = widened_program(fn, small.static, host, np.float64)
    whole = jax.tree.leaves(run())
    room = need * 3 // 4 + sum(x.size * 8 for x in whole)  # the whole program would not fit: slices must
    sliced = sliced_widened_program(fn, small.static, host, np.float64, room, need)
    assert sliced is not None, [a.shape for a in small.dynamic]
    parts = jax.tree.leaves(sliced[0]())
    assert "slices of" in sliced[1]
    for a, b in zip(whole, parts, strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-10, atol=1e-12)
