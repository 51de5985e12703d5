"""The reference run as a TPU computes it and in float64, on programs with calls inside (jax.nn.relu is a
custom_jvp call): each equation rewritten, the rest bound as jax itself binds it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tpu_runner.checking import as_on_tpu, in_float64


def _dense_relu(x: jax.Array, w: jax.Array, precision: lax.Precision | None = None) -> jax.Array:
    return jax.nn.relu(jnp.dot(x, w, precision=precision)) + jax.nn.softplus(x[:, :1])


def _inputs() -> list[np.ndarray]:
    kx, kw = jax.random.split(jax.random.PRNGKey(0))
    return [np.asarray(jax.random.normal(kx, (64, 96), jnp.float32)),
            np.asarray(jax.random.normal(kw, (96, 32), jnp.float32))]


def test_a_default_precision_f32_dot_before_a_custom_jvp_call_gets_bf16_operands() -> None:
    x, w = _inputs()
    got = np.asarray(as_on_tpu(_dense_relu, ())(x, w))
    rounded = [np.asarray(jnp.asarray(a).astype(jnp.bfloat16).astype(jnp.float32)) for a in (x, w)]
    want = np.maximum(rounded[0].astype(np.float64) @ rounded[1], 0) + np.log1p(np.exp(x[:, :1]))
    assert got.dtype == np.float32 and got.shape == (64, 32)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    full = np.asarray(_dense_relu(jnp.asarray(x), jnp.asarray(w), lax.Precision.HIGHEST))
    assert np.abs(got - full).max() > 1e-3  # the rounding is there: bf16 operands are not f32 ones


def test_highest_precision_is_left_as_the_reference_wrote_it() -> None:
    x, w = _inputs()
    def fn(a: jax.Array, b: jax.Array) -> jax.Array:
        return _dense_relu(a, b, lax.Precision.HIGHEST)
    np.testing.assert_array_equal(np.asarray(as_on_tpu(fn, ())(x, w)), np.asarray(jax.jit(fn)(x, w)))


def test_the_float64_truth_runs_through_a_custom_jvp_call() -> None:
    x, w = _inputs()
    wide = np.asarray(in_float64(_dense_relu, (), [x, w]))
    assert wide.dtype == np.float64
    want = np.maximum(x.astype(np.float64) @ w.astype(np.float64), 0) + np.log1p(np.exp(x[:, :1].astype(np.float64)))
    np.testing.assert_allclose(wide, want, rtol=1e-12, atol=1e-12)
