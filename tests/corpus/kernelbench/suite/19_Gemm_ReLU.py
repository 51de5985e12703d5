"""A linear layer and a ReLU, as JAX ports of KernelBench write it."""
import jax
import jax.numpy as jnp

batch_size = 256
in_features = 512
out_features = 384


class Model:
    def __init__(self, in_features, out_features):
        key = jax.random.PRNGKey(0)
        self.weight = jax.random.normal(key, (out_features, in_features), jnp.float32) * 0.05
        self.bias = jnp.zeros((out_features,), jnp.float32) + 0.1

    def forward(self, x, scale):
        return jnp.maximum(x @ self.weight.T + self.bias, 0.0) * scale


def get_inputs():
    return [jax.random.normal(jax.random.PRNGKey(1), (batch_size, in_features), jnp.float32), 2.0]


def get_init_inputs():
    return [in_features, out_features]
