"""Retention (RetNet's parallel form) as a reference writes it: a per-head decay made from positions, the scores in
f32, rows divided by their floored absolute sums. Recognised by its structure, its decay read off the positions,
and given a kernel the evaluator calls ok after checking it across several blocks; decays the kernel cannot serve
(not causal, growing with distance) are refused with what they are."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agents.offline.brain import analyse
from agents.offline.emit import source
from agents.offline.expr import NotRecognised
from agents.offline.params import choose
from agents.offline.reading import read_tasks
from agents.offline.retention import Retention
from storage.settings import Settings
from tests.support.reference_tasks import reference_task
from tpu_runner.evaluation import EvalRequest, evaluate_many
from tpu_runner.hardware import get_chip
from tpu_runner.tasks import Task

V5E = get_chip("v5e")

RETNET = """import jax
import jax.numpy as jnp


def computation(q, k, v):
    heads, seq = q.shape[1], q.shape[2]
    log_gamma = jnp.log(1.0 - 2.0 ** (-5.0 - jnp.arange(heads, dtype=jnp.float32)))
    n = jnp.arange(seq)
    distance = n[:, None] - n[None, :]
    decay = jnp.where(distance >= 0, jnp.exp(log_gamma[:, None, None] * distance.astype(jnp.float32)), 0.0)
    s = jnp.einsum("bhnd,bhmd->bhnm", q, k, preferred_element_type=jnp.float32)
    s = s * decay[None]
    s = s / jnp.maximum(jnp.sum(jnp.abs(s), axis=-1, keepdims=True), 1.0)
    return jnp.einsum("bhnm,bhmd->bhnd", s.astype(v.dtype), v)


def get_inputs():
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(key, (2, 2, 1024, 128), dtype=jnp.bfloat16) for key in (kq, kk, kv))
    return [q, k, v], []
"""


def _task(root: Path, name: str, code: str) -> Task:
    return reference_task(root, name, code, description="retention as a reference writes it")


@pytest.mark.slow
def test_retention_gets_an_ok_kernel_checked_across_blocks(tmp_path: Path, settings: Settings,
                                                           verdict_settings: Settings) -> None:
    task = _task(tmp_path, "retnet", RETNET)
    spec = analyse(read_tasks([task], settings)[task.digest], V5E)
    assert isinstance(spec, Retention)
    assert (spec.batch_dims, spec.seq, spec.head_dim, spec.eps) == ((2, 2), 1024, 128, 1.0)
    # One rate per head (the same for every batch entry), the reference's own float32 values.
    assert spec.rate_shape == (1, 2)
    expected = np.log(np.float32(1.0) - np.float32(2.0) ** (-5.0 - np.arange(2, dtype=np.float32)))
    np.testing.assert_allclose(spec.rates, expected, rtol=1e-6)
    params, reasons = choose(spec, V5E)
    assert params["BLOCK"] == 512 and "factored" in reasons[2]
    kernel = tmp_path / "retnet_kernel.py"
    kernel.write_text(source(spec, params))
    (result,) = evaluate_many([EvalRequest(task.path, kernel, "v5e")], verdict_settings)
    assert result.verdict == "ok", result.message
    # Checked at the production shapes in interpret mode: two query blocks (12 steps a pass: both on the diagonal,
    # one below it, for each of 4 batch x heads), so the steps across blocks (and the decay's factors) ran.
    notes = " ".join(result.correctness.notes)
    assert "checked at the production shapes" in notes and "24 grid steps" in notes, notes


# The same retention as public code also writes it: gamma ** distance, clamped at the diagonal, times a 0/1 mask.
POWER_FORM = RETNET.replace(
    """    log_gamma = jnp.log(1.0 - 2.0 ** (-5.0 - jnp.arange(heads, dtype=jnp.float32)))
    n = jnp.arange(seq)
    distance = n[:, None] - n[None, :]
    decay = jnp.where(distance >= 0, jnp.exp(log_gamma[:, None, None] * distance.astype(jnp.float32)), 0.0)
""", """    gamma = 1.0 - 2.0 ** (-5.0 - jnp.arange(heads, dtype=jnp.float32))
    n = jnp.arange(seq)
    distance = jnp.maximum(n[:, None] - n[None, :], 0).astype(jnp.float32)
    decay = gamma[:, None, None] ** distance * jnp.tril(jnp.ones((seq, seq), jnp.float32))
""")


def test_a_decay_written_as_a_power_times_a_mask_is_the_same_retention(tmp_path: Path, settings: Settings) -> None:
    assert POWER_FORM != RETNET
    tasks = [_task(tmp_path, "exp_form", RETNET), _task(tmp_path, "power_form", POWER_FORM)]
    readings = read_tasks(tasks, settings)
    written, power = (analyse(readings[t.digest], V5E) for t in tasks)
    assert isinstance(power, Retention) and power.rate_shape == written.rate_shape == (1, 2)
    np.testing.assert_allclose(power.rates, written.rates, rtol=1e-6)
    assert (power.eps, power.seq, power.head_dim) == (written.eps, written.seq, written.head_dim)


def test_decays_the_kernel_cannot_serve_are_refused(tmp_path: Path, settings: Settings) -> None:
    both_ways = RETNET.replace("jnp.where(distance >= 0, jnp.exp(log_gamma[:, None, None] * distance.astype(",
                               "jnp.where(distance >= -4, jnp.exp(log_gamma[:, None, None] * distance.astype(")
    growing = RETNET.replace("log_gamma[:, None, None] * distance", "-log_gamma[:, None, None] * distance")
    shared_by_rows = RETNET.replace("s = s * decay[None]", "s = s * decay[None]\n    s = s + s[..., :1]")
    tasks = [_task(tmp_path, n, c) for n, c in (("both_ways", both_ways), ("growing", growing),
                                                   ("shared_by_rows", shared_by_rows))]
    readings = read_tasks(tasks, settings)
    with pytest.raises(NotRecognised, match="causal decays"):
        analyse(readings[tasks[0].digest], V5E)
    with pytest.raises(NotRecognised, match="rates grow"):
        analyse(readings[tasks[1].digest], V5E)
    with pytest.raises(NotRecognised, match="retention's"):
        analyse(readings[tasks[2].digest], V5E)
