"""The reference's outputs for many tasks are computed in one child (on a TPU host: one opening of the chip); a
child that dies on one task keeps what it finished for the others and names the task it died on."""

from __future__ import annotations

from pathlib import Path

from storage.settings import load_settings
from tests.support.reference_tasks import reference_task
from tpu_runner.reference_data import ReferenceStore

SCALE = """
import jax
import jax.numpy as jnp


def get_inputs():
    return [jnp.linspace(-1.0, 1.0, 8 * 128, dtype=jnp.float32).reshape(8, 128)], []


def computation(x):
    return x * 2.0 + 1.0
"""

# Its get_inputs ends the process when it makes values for real (the outputs stage), not while traced (describing
# the task): a reference that takes its child down at the outputs of one task among several.
DIES = """
import os

import jax
import jax.numpy as jnp


def get_inputs():
    x = jnp.ones((8, 128), jnp.float32)
    if not isinstance(x, jax.core.Tracer):
        os._exit(3)
    return [x], []


def computation(x):
    return jnp.tanh(x)
"""


def test_a_reference_child_that_dies_keeps_the_tasks_it_finished_and_names_the_one_it_died_on(tmp_path: Path) -> None:
    settings = load_settings({"KERNELBOT_HOME": str(tmp_path / "home")})
    store = ReferenceStore(cache_dir=settings.cache_dir, sandbox_dir=settings.home / "sandbox", limits=settings.limits)
    good = reference_task(tmp_path, "scale_rows", SCALE, description="2x+1")
    dying = reference_task(tmp_path, "dies_at_outputs", DIES, description="tanh, whose get_inputs exits")
    assert store.prefetch([good, dying]) == {}  # both describe fine: their values are only traced there

    why = store.prefetch_outputs([good, dying])

    assert list(why) == ["dies_at_outputs"]
    assert "the reference's process of task dies_at_outputs exited with 3" in why["dies_at_outputs"]
    kept = settings.cache_dir / "reference_outputs"
    jobs = store.production_jobs(good)
    assert jobs and all((kept / f"{job.key}.json").is_file() for job in jobs)
    files = store.outputs(good, jobs)[jobs[0].key]  # from the cache: no child runs for them again
    assert set(files) == {"task", "normal", "uniform", "large"}
    assert all(parts["expected"] is not None and parts["expected"].is_file() for parts in files.values())
    assert all(parts["truth"] is not None and parts["truth"].is_file() for parts in files.values())
