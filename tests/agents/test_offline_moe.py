"""A mixture of experts as references write it (benchmarks/measured/10p's form at small sizes: a router, a top-2
of 8 experts' logits softmaxed, every expert's SwiGLU computed densely, the outputs weighted by a one-hot of the
chosen experts and summed). It is recognised op by op, its routing weights checked by numbers to be zero outside
each token's top-k, and the kernel, which computes only the chosen experts, is ok; a routing that keeps every
expert's output is refused with what it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.offline.brain import analyse
from agents.offline.emit import source
from agents.offline.expr import NotRecognised
from agents.offline.moe import MoE
from agents.offline.params import choose
from agents.offline.reading import read_tasks
from storage.settings import Settings
from tests.support.reference_tasks import reference_task
from tpu_runner.evaluation import EvalRequest, evaluate_many
from tpu_runner.hardware import get_chip

V5E = get_chip("v5e")

MOE = """import jax
import jax.numpy as jnp


def computation(x, w_router, w_gate, w_up, w_down, top_k):
    logits = x @ w_router
    top_logits, top_idx = jax.lax.top_k(logits, top_k)
    top_w = jax.nn.softmax(top_logits.astype(jnp.float32), axis=-1)
    combine = jnp.sum(jax.nn.one_hot(top_idx, w_router.shape[1], dtype=jnp.float32) * top_w[..., None], axis=-2)
    combine = jnp.moveaxis(combine, -1, 0)[..., None]
    gate = jnp.einsum("bsd,edf->ebsf", x, w_gate)
    up = jnp.einsum("bsd,edf->ebsf", x, w_up)
    y = jnp.einsum("ebsf,efd->ebsd", jax.nn.silu(gate) * up, w_down)
    return jnp.sum(y * combine, axis=0).astype(x.dtype)


def get_inputs():
    kx, kr, kg, ku, kd = jax.random.split(jax.random.PRNGKey(0), 5)
    d, f, e = 256, 512, 8
    x = jax.random.normal(kx, (2, 96, d), dtype=jnp.bfloat16)
    w_router = (jax.random.normal(kr, (d, e), dtype=jnp.float32) / 16.0).astype(jnp.bfloat16)
    w_gate = (jax.random.normal(kg, (e, d, f), dtype=jnp.float32) / 16.0).astype(jnp.bfloat16)
    w_up = (jax.random.normal(ku, (e, d, f), dtype=jnp.float32) / 16.0).astype(jnp.bfloat16)
    w_down = (jax.random.normal(kd, (e, f, d), dtype=jnp.float32) / 22.6).astype(jnp.bfloat16)
    return [x, w_router, w_gate, w_up, w_down], [2]
"""


@pytest.mark.slow
def test_a_dense_mixture_of_experts_gets_an_ok_kernel_of_its_chosen_experts(
        tmp_path: Path, settings: Settings, verdict_settings: Settings) -> None:
    task = reference_task(tmp_path, "moe", MOE, description="a dense top-2 mixture of experts")
    spec = analyse(read_tasks([task], settings)[task.digest], V5E)
    assert isinstance(spec, MoE)
    assert (spec.tokens, spec.model, spec.ffn, spec.experts, spec.top_k, len(spec.ins)) == (192, 256, 512, 8, 2, 2)
    assert [op.prim for op in spec.chain] == ["logistic", "mul", "mul"]
    params, reasons = choose(spec, V5E)
    assert "all 8 experts on every token" in reasons[0] and "the top-2 experts' work" in reasons[0]
    # Tiles smaller than an expert's rows, so tiles are padded and some past the routed rows do nothing.
    params = params | {"BLOCK_ROWS": 128, "BLOCK_FFN": 256, "BLOCK_FFN_DOWN": 256}
    kernel = tmp_path / "moe_kernel.py"
    kernel.write_text(source(spec, params))
    [result] = evaluate_many([EvalRequest(task.path, kernel, "v5e")], verdict_settings)
    assert result.verdict == "ok", result.message
    assert result.correctness is not None and result.correctness.status == "passed"
    # The roofline counts the matmul work the kernel can do (11 tiles of 128 rows at most, against the 8 x 192 rows
    # the reference multiplies), not the unchosen experts' the reference weights by zero.
    dense, most = (2 * rows * 256 * 512 * 3 for rows in (8 * 192, 11 * 128))
    assert result.performance is not None and most <= result.performance.flops < dense


def test_a_routing_that_keeps_every_expert_is_refused(tmp_path: Path, settings: Settings) -> None:
    leaky = MOE.replace("* top_w[..., None], axis=-2)", "* top_w[..., None], axis=-2) + 0.01")
    task = reference_task(tmp_path, "leaky", leaky, description="every expert counts")
    with pytest.raises(NotRecognised, match="not zero outside each token's top-k"):
        analyse(read_tasks([task], settings)[task.digest], V5E)
