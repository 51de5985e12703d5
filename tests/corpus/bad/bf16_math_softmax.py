"""Softmax computed in bfloat16 inside the kernel of an f32 task. libtpu's static profiler aborts on this bf16
code for v6e, but libtpu compiles it: the verdict is the kernel's own - its bf16 arithmetic misses the task's
f32 tolerance - and never a compile_error."""

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
    x = x_ref[...].astype(jnp.bfloat16)
    m = jnp.max(x, axis=-1, keepdims=True)
    e = jnp.exp(x - m)
    o_ref[...] = (e / jnp.sum(e, axis=-1, keepdims=True)).astype(o_ref.dtype)
