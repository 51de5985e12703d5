"""AlphaFold's triangle multiplicative update ("outgoing" edges) on a pair representation, without its layer norms.

x [1536, 1536, 128] (i, j, channels), mask [1536, 1536, 1]; the four [128, 128] projections are, in order, the
left and right values and the left and right sigmoid gates; then the norm scale [128], the output projection and
the output gate [128, 128]. left = mask * (x @ W_left) * sigmoid(x @ W_left_gate), right likewise;
t[i, j, c] = sum_k left[i, k, c] * right[j, k, c]; t is RMS-normalised over the channels in f32 (eps 1e-5), cast
back to bf16 and scaled;
out = (t @ W_out) * sigmoid(x @ W_out_gate). All bfloat16. Output bf16 [1536, 1536, 128].
"""

import jax
import jax.numpy as jnp

N_RES, CHANNELS = 1536, 128
EPS = 1e-5


def computation(x, mask, w_left, w_right, w_left_gate, w_right_gate, norm_scale, w_out, w_out_gate):
  left = mask * (x @ w_left) * jax.nn.sigmoid(x @ w_left_gate)
  right = mask * (x @ w_right) * jax.nn.sigmoid(x @ w_right_gate)
  t = jnp.einsum("ikc,jkc->ijc", left, right)
  t32 = t.astype(jnp.float32)
  t = (t32 * jax.lax.rsqrt(jnp.mean(jnp.square(t32), axis=-1, keepdims=True) + EPS)).astype(x.dtype) * norm_scale
  return (t @ w_out) * jax.nn.sigmoid(x @ w_out_gate)


def get_inputs():
  keys = jax.random.split(jax.random.PRNGKey(0), 9)
  x = jax.random.normal(keys[0], (N_RES, N_RES, CHANNELS), dtype=jnp.bfloat16)
  mask = (jax.random.uniform(keys[1], (N_RES, N_RES, 1)) > 0.1).astype(jnp.bfloat16)
  proj = [(jax.random.normal(k, (CHANNELS, CHANNELS), dtype=jnp.float32)
           / jnp.sqrt(jnp.float32(CHANNELS))).astype(jnp.bfloat16) for k in keys[2:6]]
  norm_scale = (1.0 + 0.1 * jax.random.normal(keys[6], (CHANNELS,), dtype=jnp.float32)).astype(jnp.bfloat16)
  w_out, w_out_gate = [(jax.random.normal(k, (CHANNELS, CHANNELS), dtype=jnp.float32)
                        / jnp.sqrt(jnp.float32(CHANNELS))).astype(jnp.bfloat16) for k in keys[7:9]]
  return [x, mask, *proj, norm_scale, w_out, w_out_gate], []
