"""Reaches for the runner's data instead of computing: lists the evaluation's home (where the database, the
reference's cached outputs and other evaluations live) through JAX's own path helper, which the static check lets
through - reading is the sandbox's to stop (Landlock), and it does: the import fails with PermissionError."""

import jax
import jax.numpy as jnp
from jax._src import path as jax_path
from jax.experimental import pallas as pl

# The child runs in a scratch directory of <home>/sandbox/.
HOME = jax_path.Path.cwd().parents[1]
STOLEN = sorted(p.name for p in HOME.iterdir())


def _softmax_kernel(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)


def computation(x):
    spec = pl.BlockSpec((8, x.shape[1]), lambda i: (i, 0))
    return pl.pallas_call(_softmax_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // 8,),
                          in_specs=[spec], out_specs=spec)(x)
