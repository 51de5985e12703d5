"""Writes a constant that happens to be the mean of a softmax row: right on average, wrong everywhere."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_ROWS = 64


def computation(x):
    rows, cols = x.shape
    bm = min(BLOCK_ROWS, rows)
    return pl.pallas_call(
        _kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(rows // bm,),
        in_specs=[pl.BlockSpec((bm, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((bm, cols), lambda i: (i, 0)),
    )(x)


def _kernel(x_ref, o_ref):
    o_ref[...] = jnp.full(o_ref.shape, 1.0 / o_ref.shape[-1], o_ref.dtype)
