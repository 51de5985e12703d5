"""The offline brain's parameter space ends at the problem's own sizes: a block larger than its dimension is
clamped to it, so a plan or a search step there would only evaluate the same kernel again."""

from __future__ import annotations

from pathlib import Path

from agents.offline.brain import OfflineBrain
from agents.offline.emit import space_of
from agents.offline.families import Matmul
from agents.offline.reading import read_task
from storage.settings import Settings
from tests.support.reference_tasks import reference_task
from tpu_runner.hardware import get_chip

SMALL_LINEAR = '''import jax
import jax.numpy as jnp


def computation(x, w):
    return jax.nn.relu(x @ w)


def get_inputs():
    kx, kw = jax.random.split(jax.random.key(0))
    return [jax.random.normal(kx, (512, 256), jnp.bfloat16), jax.random.normal(kw, (256, 384), jnp.bfloat16)], []
'''


def test_no_two_plans_are_the_same_kernel_at_the_problem_sizes(tmp_path: Path, settings: Settings) -> None:
    task = reference_task(tmp_path, "small_linear", SMALL_LINEAR, description="linear relu")
    chip = get_chip("v5e")
    brain = OfflineBrain(task=task, chip=chip, reading=read_task(task, settings))
    spec = brain.spec
    assert isinstance(spec, Matmul) and (spec.m, spec.k, spec.n) == (512, 256, 384)
    space = space_of(spec)
    assert space["BLOCK_M"][-1] == 512 and space["BLOCK_K"][-1] == 256 and space["BLOCK_N"][-1] == 512
    dims = {"BLOCK_M": spec.m, "BLOCK_K": spec.k, "BLOCK_N": spec.n}
    plans = brain._order()
    assert len(plans) > 2
    effective = [tuple(sorted((k, min(v, dims[k]) if k in dims else v) for k, v in p.items())) for p in plans]
    assert len(set(effective)) == len(effective), plans
