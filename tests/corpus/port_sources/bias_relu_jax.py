"""Fused bias + ReLU: y = max(x + bias, 0) over f32 x [64, 256] and bias [256]."""

import jax
import jax.numpy as jnp


def computation(x, bias):
    return jnp.maximum(x + bias[None, :], 0.0)


def get_inputs():
    kx, kb = jax.random.split(jax.random.key(0))
    return [jax.random.normal(kx, (64, 256), jnp.float32), 0.5 * jax.random.normal(kb, (256,), jnp.float32)], []
