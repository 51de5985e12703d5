"""Top-2-of-8 mixture of SwiGLU experts, every expert computed densely on every token, combined by routing weights.

x [2, 4096, 4096] (batch, seq, model); router W_r [4096, 8]; expert weights W_gate, W_up [8, 4096, 14336] and
W_down [8, 14336, 4096]; static top_k = 2. logits = x @ W_r; the top 2 logits of each token are softmaxed into its
two routing weights (f32); every expert e computes (silu(x @ W_gate[e]) * (x @ W_up[e])) @ W_down[e] for all tokens
(no dispatch: the CSV's FLOPs are 8 experts' worth), and each token's output is the routing-weighted sum of its two
experts' outputs: each expert's output times its (f32) weight, zero for the other six, summed over the 8 experts
in f32 and cast back. All bfloat16 except the routing weights and that sum. Output bf16 [2, 4096, 4096].
"""

import jax
import jax.numpy as jnp

BATCH, SEQ, D_MODEL, D_FF, EXPERTS, TOP_K = 2, 4096, 4096, 14336, 8, 2


def computation(x, w_router, w_gate, w_up, w_down, top_k):
  num_experts = w_router.shape[1]
  logits = x @ w_router  # [b, s, experts]
  top_logits, top_idx = jax.lax.top_k(logits, top_k)  # [b, s, k]
  top_w = jax.nn.softmax(top_logits.astype(jnp.float32), axis=-1)
  combine = jnp.sum(jax.nn.one_hot(top_idx, num_experts, dtype=jnp.float32) * top_w[..., None], axis=-2)
  combine = jnp.moveaxis(combine, -1, 0)[..., None]  # [experts, b, s, 1] f32
  gate = jnp.einsum("bsd,edf->ebsf", x, w_gate)
  up = jnp.einsum("bsd,edf->ebsf", x, w_up)
  h = jax.nn.silu(gate) * up  # [experts, b, s, d_ff]
  y = jnp.einsum("ebsf,efd->ebsd", h, w_down)  # [experts, b, s, d_model]
  return jnp.sum(y * combine, axis=0).astype(x.dtype)


def get_inputs():
  kx, kr, kg, ku, kd = jax.random.split(jax.random.PRNGKey(0), 5)
  x = jax.random.normal(kx, (BATCH, SEQ, D_MODEL), dtype=jnp.bfloat16)
  w_router = (jax.random.normal(kr, (D_MODEL, EXPERTS), dtype=jnp.float32)
              / jnp.sqrt(jnp.float32(D_MODEL))).astype(jnp.bfloat16)
  w_gate = (jax.random.normal(kg, (EXPERTS, D_MODEL, D_FF), dtype=jnp.float32)
            / jnp.sqrt(jnp.float32(D_MODEL))).astype(jnp.bfloat16)
  w_up = (jax.random.normal(ku, (EXPERTS, D_MODEL, D_FF), dtype=jnp.float32)
          / jnp.sqrt(jnp.float32(D_MODEL))).astype(jnp.bfloat16)
  w_down = (jax.random.normal(kd, (EXPERTS, D_FF, D_MODEL), dtype=jnp.float32)
            / jnp.sqrt(jnp.float32(D_FF))).astype(jnp.bfloat16)
  return [x, w_router, w_gate, w_up, w_down], [TOP_K]
