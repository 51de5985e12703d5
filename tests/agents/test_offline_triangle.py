"""The triangle multiplicative update (AlphaFold's outgoing edges) as a reference writes it: recognised by structure
(the projections, their gates and mask, the per-channel contraction, the RMS norm, the gated output projection),
given three kernels the evaluator calls ok, and written without the parts a variant leaves out, for outgoing and
incoming edges. A contraction over unlike axes, a norm of another kind or residues that are not whole lane tiles
leave the program to the matmul family, which writes its first projection."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

from agents.offline.brain import analyse
from agents.offline.emit import source
from agents.offline.params import choose
from agents.offline.reading import read_tasks
from agents.offline.triangle import Projection, Triangle
from storage.settings import Settings
from tests.support.reference_tasks import load_module, reference_task
from tpu_runner.checking.correctness import interpret_mode
from tpu_runner.evaluation import EvalRequest, evaluate_many
from tpu_runner.hardware import get_chip
from tpu_runner.tasks import Task

V5E = get_chip("v5e")

TRIANGLE = """import jax
import jax.numpy as jnp

N, C = 128, 128


def computation(x, mask, w_left, w_right, w_left_gate, w_right_gate, norm_scale, w_out, w_out_gate):
  left = mask * (x @ w_left) * jax.nn.sigmoid(x @ w_left_gate)
  right = mask * (x @ w_right) * jax.nn.sigmoid(x @ w_right_gate)
  t = jnp.einsum("ikc,jkc->ijc", left, right)
  t32 = t.astype(jnp.float32)
  t = (t32 * jax.lax.rsqrt(jnp.mean(jnp.square(t32), axis=-1, keepdims=True) + 1e-5)).astype(x.dtype) * norm_scale
  return (t @ w_out) * jax.nn.sigmoid(x @ w_out_gate)


def get_inputs():
  keys = jax.random.split(jax.random.PRNGKey(0), 9)
  x = jax.random.normal(keys[0], (N, N, C), dtype=jnp.bfloat16)
  mask = (jax.random.uniform(keys[1], (N, N, 1)) > 0.1).astype(jnp.bfloat16)
  w = [(jax.random.normal(k, (C, C), dtype=jnp.float32) / jnp.sqrt(jnp.float32(C))).astype(jnp.bfloat16)
       for k in [*keys[2:6], *keys[7:9]]]
  scale = (1.0 + 0.1 * jax.random.normal(keys[6], (C,), dtype=jnp.float32)).astype(jnp.bfloat16)
  return [x, mask, *w[:4], scale, *w[4:]], []
"""

# No mask, no gates, no scale, no output gate: projections and the norm only.
PLAIN = """import jax
import jax.numpy as jnp

N, C = 256, 128


def computation(x, w_left, w_right, w_out):
  t = jnp.einsum("ikc,jkc->ijc", x @ w_left, x @ w_right)
  t32 = t.astype(jnp.float32)
  t = t32 * jax.lax.rsqrt(jnp.mean(t32 * t32, axis=-1, keepdims=True) + 1e-6)
  return t.astype(x.dtype) @ w_out


def get_inputs():
  keys = jax.random.split(jax.random.PRNGKey(1), 4)
  x = jax.random.normal(keys[0], (N, N, C), dtype=jnp.bfloat16)
  w = [(jax.random.normal(k, (C, C), dtype=jnp.float32) / jnp.sqrt(jnp.float32(C))).astype(jnp.bfloat16)
       for k in keys[1:]]
  return [x, *w], []
"""


def _task(root: Path, name: str, code: str) -> Task:
    return reference_task(root, name, code, description="a triangle update as a reference writes it")


@pytest.mark.slow
def test_the_triangle_update_gets_an_ok_kernel(tmp_path: Path, settings: Settings,
                                               verdict_settings: Settings) -> None:
    task = _task(tmp_path, "triangle", TRIANGLE)
    spec = analyse(read_tasks([task], settings)[task.digest], V5E)
    assert isinstance(spec, Triangle)
    # The einsum's operands in the program are (right, left): the transpose after it says which is which.
    assert (spec.x, spec.mask, spec.left, spec.right, spec.scale) == \
        (0, 1, Projection(2, 4, True), Projection(3, 5, True), 6)
    assert spec.out == Projection(7, 8, False) and (spec.residues, spec.channels, spec.c_out) == (128, 128, 128)
    assert spec.eps == pytest.approx(1e-5)
    params, reasons = choose(spec, V5E)
    assert (params["BLOCK_I"], params["BLOCK_J"], params["BLOCK_ROWS"]) == (128, 128, 4096)
    assert "channel-major" in reasons[1]
    kernel = tmp_path / "triangle_kernel.py"
    kernel.write_text(source(spec, params))
    (result,) = evaluate_many([EvalRequest(task.path, kernel, "v5e")], verdict_settings)
    assert result.verdict == "ok", result.message


@pytest.mark.parametrize("einsum, incoming", [("ikc,jkc->ijc", False), ("kic,kjc->ijc", True)])
def test_a_triangle_update_without_gates_mask_or_scale(einsum: str, incoming: bool, tmp_path: Path,
                                                      settings: Settings) -> None:
    task = _task(tmp_path, "plain", PLAIN.replace('"ikc,jkc->ijc"', f'"{einsum}"'))
    spec = analyse(read_tasks([task], settings)[task.digest], V5E)
    assert isinstance(spec, Triangle) and spec.incoming == incoming
    assert (spec.mask, spec.left, spec.right, spec.scale, spec.out) == \
        (None, Projection(1, None, False), Projection(2, None, False), None, Projection(3, None, False))
    params, _ = choose(spec, V5E)
    # Blocks of half the residues, so the contraction's grid walks rows and columns of blocks.
    kernel = tmp_path / "plain_kernel.py"
    kernel.write_text(source(spec, {**params, "BLOCK_I": 128, "BLOCK_J": 128, "BLOCK_ROWS": 8192}))
    reference = load_module(task.path / "reference.py")
    inputs, _ = reference.get_inputs()
    expected = np.asarray(jax.jit(reference.computation)(*inputs), np.float32)
    with interpret_mode(True):
        got = np.asarray(jax.jit(load_module(kernel).computation)(*inputs), np.float32)
    assert got.shape == expected.shape == (256, 256, 128)
    assert np.abs(got - expected).max() <= 2e-2 + 2e-2 * np.abs(expected).max(), np.abs(got - expected).max()


@pytest.mark.parametrize("name, old, new", [
    ("unlike_axes", '"ikc,jkc->ijc"', '"ikc,kjc->ijc"'),
    ("layer_norm", "t = (t32 * jax.lax.rsqrt(jnp.mean(jnp.square(t32), axis=-1, keepdims=True) + 1e-5))",
     "t = ((t32 - t32.mean(-1, keepdims=True)) * jax.lax.rsqrt(jnp.var(t32, axis=-1, keepdims=True) + 1e-5))"),
    ("residues", "N, C = 128, 128", "N, C = 96, 128"),
])
def test_updates_the_kernel_does_not_compute_are_left_to_the_matmul_family(name: str, old: str, new: str,
                                                                            tmp_path: Path,
                                                                            settings: Settings) -> None:
    assert old in TRIANGLE
    task = _task(tmp_path, name, TRIANGLE.replace(old, new))
    spec = analyse(read_tasks([task], settings)[task.digest], V5E)
    assert not isinstance(spec, Triangle) and "later matmuls" in spec.describe(), spec.describe()
