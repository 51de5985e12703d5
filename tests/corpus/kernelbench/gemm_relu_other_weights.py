"""A rewrite that draws its own weights with another seed: right code, wrong numbers."""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _kernel(x_ref, w_ref, b_ref, s_ref, o_ref):
    acc = jnp.dot(x_ref[...], w_ref[...].T, preferred_element_type=jnp.float32)
    o_ref[...] = jnp.maximum(acc + b_ref[...], 0.0) * s_ref[0, 0]


class ModelNew:
    def __init__(self, in_features, out_features):
        key = jax.random.PRNGKey(7)
        self.weight = jax.random.normal(key, (out_features, in_features), jnp.float32) * 0.05
        self.bias = jnp.zeros((out_features,), jnp.float32) + 0.1

    def set_weights(self, weights):
        for name, value in weights.items():
            setattr(self, name, value)

    def forward(self, x, scale):
        m, n = x.shape[0], self.weight.shape[0]
        return pl.pallas_call(_kernel, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype))(
            x, self.weight, self.bias.reshape(1, n), jnp.reshape(scale, (1, 1)).astype(jnp.float32))
