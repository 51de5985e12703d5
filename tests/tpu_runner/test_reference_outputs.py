"""The reference's outputs for many tasks are computed in one child (on a TPU host: one opening of the chip); a
child that dies on one task keeps what it finished for the others and names the task it died on."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from storage.settings import load_settings
from tests.support.reference_tasks import reference_task
from tpu_runner.checking import CandidateFailed, CandidateRun, Judge, OutputSet, ReferenceRun, load_outputs
from tpu_runner.compiler import compile_service
from tpu_runner.reference import ReferenceStopped, ReferenceStore, reference_store
from tpu_runner.reports import Budget
from tpu_runner.tasks import EVALUATOR_CASES, config_from_json

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
    store = reference_store(settings)
    good = reference_task(tmp_path, "scale_rows", SCALE, description="2x+1")
    dying = reference_task(tmp_path, "dies_at_outputs", DIES, description="tanh, whose get_inputs exits")
    assert store.prefetch([good, dying]) == {}  # both describe fine: their values are only traced there

    why = store.prefetch_outputs([good, dying])

    assert list(why) == ["dies_at_outputs"]
    assert "the reference's process of task dies_at_outputs exited with status 3" in why["dies_at_outputs"]
    kept = settings.cache_dir / "reference_outputs"
    jobs = store.production_jobs(good)
    assert jobs and all((kept / f"{job.key}.json").is_file() for job in jobs)
    files = store.outputs(good, jobs)[jobs[0].key]  # from the cache: no child runs for them again
    assert set(files) == {"task", "normal", "uniform", "large"}
    assert all(parts["expected"] is not None and parts["expected"].is_file() for parts in files.values())
    assert all(parts["truth"] is not None and parts["truth"].is_file() for parts in files.values())



def test_a_task_after_the_one_a_reference_child_died_on_gets_its_outputs_from_a_new_child(tmp_path: Path) -> None:
    settings = load_settings({"KERNELBOT_HOME": str(tmp_path / "home")})
    store = reference_store(settings)
    dying = reference_task(tmp_path, "dies_at_outputs", DIES, description="tanh, whose get_inputs exits")
    good = reference_task(tmp_path, "scale_rows", SCALE, description="2x+1")
    assert store.prefetch([dying, good]) == {}

    why = store.prefetch_outputs([dying, good])

    assert list(why) == ["dies_at_outputs"]  # the task after it is not blamed for the child it did not reach
    jobs = store.production_jobs(good)
    assert all((settings.cache_dir / "reference_outputs" / f"{job.key}.json").is_file() for job in jobs)
    files = store.outputs(good, jobs)[jobs[0].key]
    assert all(parts["expected"] is not None and parts["expected"].is_file() for parts in files.values())


# Values for real take ~2.4 GB of host memory: more than the limit the test gives the reference's child.
HUGE = """
import jax
import jax.numpy as jnp
import numpy as np


def get_inputs():
    x = jnp.ones((8, 128), jnp.float32)
    if not isinstance(x, jax.core.Tracer):
        np.ones(300_000_000).sum()
    return [x], []


def computation(x):
    return x + 1.0
"""


def test_a_reference_stopped_at_the_memory_limit_is_remembered_until_the_limit_is_raised(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings({"KERNELBOT_HOME": str(tmp_path / "home")})
    small = replace(settings.limits, memory_mib=1536)
    store = ReferenceStore(cache_dir=settings.cache_dir, sandbox_dir=settings.sandbox_dir, limits=small)
    huge = reference_task(tmp_path, "huge_inputs", HUGE, description="x+1 after a large host allocation")
    assert store.prefetch([huge]) == {}

    why = store.prefetch_outputs([huge])

    assert "the reference of task huge_inputs used more than 1536 MiB of memory" in why["huge_inputs"]
    stopped = store.reference_stopped(huge)
    assert stopped is not None and stopped.kind == "memory_limit" and str(stopped) == why["huge_inputs"]
    import tpu_runner.reference.store as store_module

    def no_child(*args: object, **kwargs: object) -> None:
        raise AssertionError("the reference's child ran again under the limit it stopped at")

    monkeypatch.setattr(store_module, "run_child", no_child)
    with pytest.raises(ReferenceStopped, match="used more than 1536 MiB"):
        store.outputs(huge, store.production_jobs(huge))
    raised = ReferenceStore(cache_dir=settings.cache_dir, sandbox_dir=settings.sandbox_dir,
                            limits=replace(small, memory_mib=8192))
    assert raised.reference_stopped(huge) is None  # a larger limit is worth trying


# Raises as XLA does on a chip whose HBM the reference's program does not fit, when values are made for real.
BEYOND_HBM = """
import jax
import jax.numpy as jnp


def get_inputs():
    x = jnp.ones((8, 128), jnp.float32)
    if not isinstance(x, jax.core.Tracer):
        raise RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
                           "temporaries (17.56G) exceeds available HBM (15.75G)")
    return [x], []


def computation(x):
    return x + 1.0
"""


def test_a_reference_beyond_the_devices_memory_is_a_stop_of_its_own_kind_remembered_with_its_next_step(
        tmp_path: Path) -> None:
    from tpu_runner.evaluation.evaluate import reference_beyond_host

    settings = load_settings({"KERNELBOT_HOME": str(tmp_path / "home")})
    store = reference_store(settings)
    big = reference_task(tmp_path, "beyond_hbm", BEYOND_HBM, description="x+1 whose outputs exceed the HBM")
    good = reference_task(tmp_path, "scale_rows", SCALE, description="2x+1")
    assert store.prefetch([big, good]) == {}

    why = store.prefetch_outputs([big, good])

    assert list(why) == ["beyond_hbm"]
    assert why["beyond_hbm"].startswith("the reference of task beyond_hbm does not fit this device's memory")
    stopped = store.reference_stopped(big)
    assert stopped is not None and stopped.kind == "hbm_oom" and "17.56G" in str(stopped)
    assert "more HBM" in stopped.next_step
    with pytest.raises(ReferenceStopped, match="does not fit this device's memory"):
        store.outputs(big, store.production_jobs(big))  # remembered: judged without running the reference again
    error = reference_beyond_host(stopped)
    assert (error.kind, error.stage) == ("hbm_oom", "correctness")
    assert "the kernel was not checked" in error.detail and "more HBM" in error.detail


MATMUL = """
import jax
import jax.numpy as jnp


def get_inputs():
    return [jnp.ones((128, 256), jnp.float32), jnp.ones((256, 128), jnp.float32)], []


def computation(a, b):
    return jnp.tanh(a @ b / 16.0)
"""


def test_a_truth_not_made_with_the_outputs_is_made_once_when_a_near_miss_asks_for_it(tmp_path: Path) -> None:
    settings = load_settings({"KERNELBOT_HOME": str(tmp_path / "home")})
    # No float64 truth with the outputs for any dot (as for a large GEMM at production shapes on a chip).
    store = ReferenceStore(cache_dir=settings.cache_dir, sandbox_dir=settings.sandbox_dir,
                           limits=replace(settings.limits, full_check_gflops=0.0))
    task = reference_task(tmp_path, "tanh_matmul", MATMUL, description="tanh(a @ b / 16)")
    job = store.production_jobs(task)[0]
    files = store.outputs(task, [job])[job.key]["normal"]
    assert set(files) == {"expected"}  # the truth is not made yet
    children: list[str] = []
    run_child = store._run
    store._run = lambda tasks, **kw: children.append(kw["jobs"][0].float64) or run_child(tasks, **kw)  # type: ignore

    def reference() -> ReferenceRun:
        def later() -> OutputSet | None:
            path, _ = store.float64(task, job, "normal", "truth")
            return load_outputs(path) if path else None
        return ReferenceRun(case, expected, None, later=later)

    case = next(c for c in EVALUATOR_CASES if c.name == "normal")
    expected = load_outputs(files["expected"])
    config = config_from_json(job.config)
    judge = Judge("production[0]", config, 1e-5, 1e-5)
    assert judge.case(CandidateRun(case, outputs=expected), reference()).status == "passed"
    assert children == []  # a kernel that matches never costs the float64 run

    off = OutputSet(expected.tree, tuple(x + np.float32(0.5) for x in expected.leaves))
    with pytest.raises(CandidateFailed, match="differs"):
        judge.case(CandidateRun(case, outputs=off), reference())
    assert children == ["truth"]  # a near miss: the truth is made, once
    path, why = store.float64(task, job, "normal", "truth")
    assert path is not None and why == ""
    truth = load_outputs(path)
    assert truth.leaves[0].dtype == np.float64
    np.testing.assert_allclose(truth.leaves[0], expected.leaves[0], rtol=1e-3, atol=1e-3)
    made = len(children)
    store.float64(task, job, "normal", "truth")
    assert len(children) == made  # kept: asked again, no child runs
    # A float64 run whose child is stopped (here by a wall limit no child meets) is judged without, and says why,
    # also when asked again (kept, no second child).
    store.limits = replace(store.limits, wall_seconds=0.01)
    path, why = store.float64(task, job, "normal", "perturbed")
    assert path is None and why.startswith("its float64 run on this host's CPU stopped: ")
    assert "did not finish within" in why
    assert store.float64(task, job, "normal", "perturbed") == (None, why) and len(children) == made + 1


def test_a_chip_hosts_float64_run_gets_the_memory_of_a_chip_child(tmp_path: Path, monkeypatch) -> None:
    # A chip host checks production shapes: their float64 truth on its CPU is as large as the chip's outputs, and
    # at the evaluation's own limit 15p's was never made (its child stopped at 8192 MiB on a v5e host).
    import tpu_runner.reference.store as store_module
    from tpu_runner.hardware import with_chip_memory

    settings = load_settings({"KERNELBOT_HOME": str(tmp_path / "home")})
    task = reference_task(tmp_path, "tanh_matmul", MATMUL, description="tanh(a @ b / 16)")
    seen = []

    def no_child(**kwargs):
        seen.append(kwargs["limits"].memory_mib)
        raise RuntimeError("not run")

    job = ReferenceStore(cache_dir=settings.cache_dir, sandbox_dir=settings.sandbox_dir,
                         limits=settings.limits).production_jobs(task)[0]  # (its reference's child runs here)
    monkeypatch.setattr(store_module, "run_child", no_child)
    for device_kind, want in ((None, settings.limits.memory_mib),
                              ("TPU v5 lite", with_chip_memory(settings.limits).memory_mib)):
        store = ReferenceStore(cache_dir=settings.cache_dir, sandbox_dir=settings.sandbox_dir, limits=settings.limits,
                               device_kind=device_kind)
        with pytest.raises(RuntimeError, match="not run"):
            store._run([task], export=False, jobs=[replace(job, float64="truth")], cpu_only=True)
        assert seen[-1] == want
    assert seen[-1] > seen[0]


UNSEEDED = """
import numpy as np


def get_inputs():
    return [np.random.default_rng().standard_normal((64, 128)).astype(np.float32)], []  # other values each call


def computation(x):
    return x * 2.0
"""


def test_the_task_values_are_kept_with_the_outputs_and_a_float64_run_judges_those(tmp_path: Path) -> None:
    """The reference's child keeps the task's own values its outputs were computed on; a float64 run made later,
    in a child of its own, runs on those (it called get_inputs() again: with one that is not deterministic, the
    truth of other values)."""
    settings = load_settings({"KERNELBOT_HOME": str(tmp_path / "home")})
    store = reference_store(settings)
    task = reference_task(tmp_path, "unseeded", UNSEEDED, description="2x on values drawn anew each call")
    assert store.prefetch_outputs([task]) == {}
    job = store.production_jobs(task)[0]
    kept = store.task_values(job)
    assert kept is not None
    values = load_outputs(kept).leaves[0]
    expected = load_outputs(store.outputs(task, [job])[job.key]["task"]["expected"]).leaves[0]
    np.testing.assert_array_equal(expected, values * 2)  # the values the expected outputs were computed on
    moved, why = store.float64(task, job, "task", "perturbed")  # made on request, in a child of its own
    assert moved is not None, why
    # The task's sensitivity: those same values moved by one unit roundoff of float32, then doubled.
    np.testing.assert_allclose(load_outputs(moved).leaves[0], values.astype(np.float64) * 2, rtol=2**-23, atol=0)


def test_outputs_made_ahead_for_interpret_mode_checks_leave_out_configurations_beyond_its_budget(
        tmp_path: Path) -> None:
    """Where candidates are checked in interpret mode, the production outputs are made ahead only for the
    configurations a check runs at (the budget's elements and dot GFLOPs): their task values spare each candidate's
    child a get_inputs() of its own. One beyond the budget is left out before any of its values are drawn (this
    one's get_inputs() would end the child), and is neither an error nor cached."""
    settings = load_settings({"KERNELBOT_HOME": str(tmp_path / "home")})
    store = reference_store(settings)
    small = reference_task(tmp_path, "scale_rows", SCALE, description="2x+1, 2048 elements with its output")
    large = reference_task(tmp_path, "dies_at_outputs", DIES.replace("(8, 128)", "(64, 128)"),
                           description="tanh of 8192 elements, whose get_inputs exits")
    assert store.prefetch([small, large]) == {}

    assert store.prefetch_outputs([small, large], interpret_budget=Budget(4096, 20e9, 4096)) == {}

    kept = settings.cache_dir / "reference_outputs"
    job = store.production_jobs(small)[0]
    assert (kept / f"{job.key}.json").is_file() and store.task_values(job) is not None
    assert not any((kept / f"{j.key}.json").is_file() for j in store.production_jobs(large))
    # Without the budget (a chip host's) the large one is computed too, and its get_inputs() ends the child.
    assert "exited with status 3" in store.prefetch_outputs([large])["dies_at_outputs"]


def test_without_a_static_profile_one_plain_compile_serves_the_reference_s_figures_both_ways(tmp_path: Path) -> None:
    """With the profile off, the evaluation's reference costs (a profile asked for) are the plain compile the task's
    unprofiled figures already are: one compile, one cache file, and the answers say why they have no cycles."""
    settings = load_settings({"KERNELBOT_HOME": str(tmp_path / "home"), "KERNELBOT_STATIC_PROFILE": "off"})
    store = reference_store(settings)
    task = reference_task(tmp_path, "scale_rows", SCALE, description="2x+1")
    with compile_service(root=tmp_path / "compile", limits=settings.limits, static_profile="off") as compilers:
        plain = store.costs(task, target="v6e", mode="off", compilers=compilers, profile=False)
        asked = store.costs(task, target="v6e", mode="off", compilers=compilers)
    assert [p.name for p in settings.cache_dir.rglob("costs4-*.json")] == ["costs4-v6e-unprofiled.json"]
    assert [a.hlo_ops for a in asked] == [p.hlo_ops for p in plain] and plain[0].ok
    assert plain[0].profile_failure is None
    assert asked[0].profile_failure == compilers.no_profile and "off" in asked[0].profile_failure
