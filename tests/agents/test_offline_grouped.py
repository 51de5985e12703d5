"""Grouped (ragged) matmuls as a reference writes them with `lax.ragged_dot`: recognised, their weights in either
layout, and written as one kernel that walks (group, row tile) visits; the outputs match the reference for any
group sizes (empty groups, a group in one row, every row in one group), checked in interpret mode. Forms the
kernel does not serve are refused with what they are. (tasks/grouped_matmul is evaluated `ok` with the other
recognised suite tasks, in test_offline_brain.)"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents.offline.brain import analyse
from agents.offline.emit import source
from agents.offline.expr import NotRecognised
from agents.offline.grouped import Grouped
from agents.offline.params import choose
from agents.offline.reading import read_tasks
from storage.settings import Settings
from tests.support.reference_tasks import load_module, reference_task
from tpu_runner.checking.correctness import interpret_mode
from tpu_runner.hardware import get_chip
from tpu_runner.tasks import Task

V5E = get_chip("v5e")

RAGGED = """import jax
import jax.numpy as jnp

GROUPS, M, K, N = 4, 512, 256, 384


def computation(lhs, rhs, group_sizes):
  return jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=jnp.float32).astype(lhs.dtype)


def get_inputs():
  kl, kr = jax.random.split(jax.random.PRNGKey(0))
  lhs = jax.random.normal(kl, (M, K), dtype=jnp.bfloat16)
  rhs = (jax.random.normal(kr, (GROUPS, K, N), dtype=jnp.float32) / 16.0).astype(jnp.bfloat16)
  return [lhs, rhs, jnp.array([100, 0, 300, 112], jnp.int32)], []
"""

# The weights as [groups, n, k] (a PyTorch Linear's layout), contracted over their last axis.
TRANSPOSED = RAGGED.replace(
    "return jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=jnp.float32).astype(lhs.dtype)",
    """numbers = jax.lax.RaggedDotDimensionNumbers((((1,), (2,)), ((), ())), (0,), (0,))
  out = jax.lax.ragged_dot_general(lhs, rhs, group_sizes, numbers, preferred_element_type=jnp.float32)
  return out.astype(lhs.dtype)""").replace("(GROUPS, K, N)", "(GROUPS, N, K)")


def _task(root: Path, name: str, code: str) -> Task:
    return reference_task(root, name, code, description="a grouped matmul as a reference writes it")


@pytest.mark.parametrize("name, code, transposed", [("ragged", RAGGED, False), ("transposed", TRANSPOSED, True)])
def test_a_grouped_matmul_matches_for_any_group_sizes(name: str, code: str, transposed: bool, tmp_path: Path,
                                                       settings: Settings) -> None:
    assert code != RAGGED or not transposed
    task = _task(tmp_path, name, code)
    spec = analyse(read_tasks([task], settings)[task.digest], V5E)
    assert isinstance(spec, Grouped)
    assert (spec.lhs, spec.rhs, spec.sizes, spec.m, spec.k, spec.n, spec.groups, spec.transposed) == \
        (0, 1, 2, 512, 256, 384, 4, transposed)
    params, reasons = choose(spec, V5E)
    # 512 rows: one tile of the first choice's 512, visited once per group.
    assert "at most 5 row-tile visits per column block where a dense matmul takes 1" in reasons[0]
    # Tiles of 128 rows and k in two steps, so visits share boundary tiles and accumulate across k.
    kernel = tmp_path / f"{name}_kernel.py"
    kernel.write_text(source(spec, {**params, "BLOCK_M": 128, "BLOCK_N": 384, "BLOCK_K": 128}))
    reference, written = load_module(task.path / "reference.py"), load_module(kernel)
    (lhs, rhs, _), _ = reference.get_inputs()
    # Sizes that leave rows to no group (ragged_dot gives them zeros) too.
    for sizes in ([100, 0, 300, 112], [512, 0, 0, 0], [0, 0, 0, 512], [1, 1, 1, 509], [100, 0, 200, 12], [0] * 4):
        group_sizes = jnp.array(sizes, jnp.int32)
        expected = np.asarray(jax.jit(reference.computation)(lhs, rhs, group_sizes), np.float32)
        with interpret_mode(True):
            got = np.asarray(jax.jit(written.computation)(lhs, rhs, group_sizes), np.float32)
        assert np.abs(got - expected).max() <= 2e-2 + 2e-2 * np.abs(expected).max(), (sizes, got, expected)
    # Blocks that divide none of the sizes (as a search's values may, at another shape): still every row.
    kernel.write_text(source(spec, {**params, "BLOCK_M": 192, "BLOCK_N": 256, "BLOCK_K": 200}))
    with interpret_mode(True):
        got = np.asarray(jax.jit(load_module(kernel).computation)(lhs, rhs, group_sizes), np.float32)
    assert np.abs(got - expected).max() <= 2e-2 + 2e-2 * np.abs(expected).max()


def test_grouped_matmuls_the_kernel_does_not_serve(tmp_path: Path, settings: Settings) -> None:
    followed = RAGGED.replace(".astype(lhs.dtype)", ".astype(lhs.dtype) * 2.0")
    two = RAGGED.replace("  return jax.lax.ragged_dot(lhs, rhs, group_sizes,",
                         "  lhs = jax.lax.ragged_dot(lhs, rhs[:, :, :K], group_sizes).astype(lhs.dtype)\n"
                         "  return jax.lax.ragged_dot(lhs, rhs, group_sizes,")
    assert followed != RAGGED and two != RAGGED
    tasks = [_task(tmp_path, "followed", followed), _task(tmp_path, "two", two)]
    readings = read_tasks(tasks, settings)
    with pytest.raises(NotRecognised, match="followed by mul"):
        analyse(readings[tasks[0].digest], V5E)
    with pytest.raises(NotRecognised, match="2 grouped matmuls"):
        analyse(readings[tasks[1].digest], V5E)
