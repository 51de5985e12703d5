import jax.numpy as jnp

def computation(x:
    return jnp.exp(x)
