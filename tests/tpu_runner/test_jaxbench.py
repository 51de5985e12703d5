"""JAXBench's own workload format (baseline.py with CONFIG, create_inputs(dtype=...), workload(*inputs)) read
unchanged as a task, and a candidate exporting `workload` evaluated against it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from storage.settings import Settings
from tpu_runner.candidate import SparePool
from tpu_runner.evaluation import EvalRequest
from tpu_runner.evaluation.evaluate import evaluate
from tpu_runner.tasks import TaskError, abstract_configurations, discover_tasks, import_reference, load_task

BASELINE = '''
"""A GEMM, a scale and a GELU."""
import jax
import jax.numpy as jnp

CONFIG = {"name": "gemm_scale_gelu", "M": 256, "K": 512, "N": 256, "atol": 3e-2}


def create_inputs(dtype=jnp.bfloat16):
    kx, kw = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.normal(kx, (CONFIG["M"], CONFIG["K"]), dtype=dtype)
    w = (jax.random.normal(kw, (CONFIG["K"], CONFIG["N"]), dtype=jnp.float32) / 24).astype(dtype)
    return x, 0.5, w


def workload(x, scale, w):
    return jax.nn.gelu((x @ w) * scale)


def get_flops():
    return 2 * CONFIG["M"] * CONFIG["K"] * CONFIG["N"]
'''

OPTIMIZED = '''
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _kernel(x_ref, w_ref, o_ref, *, scale):
    acc = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)
    o_ref[...] = jax.nn.gelu(acc.astype(o_ref.dtype) * scale)


def workload(x, scale, w):
    import functools

    m, k = x.shape
    n = w.shape[1]
    return pl.pallas_call(
        functools.partial(_kernel, scale=scale), grid=(m // 128,),
        in_specs=[pl.BlockSpec((128, k), lambda i: (i, 0)), pl.BlockSpec((k, n), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((128, n), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype))(x, w)
'''


def _workload(root: Path) -> Path:
    task = root / "level2" / "gemm_scale_gelu"
    task.mkdir(parents=True)
    (task / "baseline.py").write_text(textwrap.dedent(BASELINE))
    (task / "optimized.py").write_text(textwrap.dedent(OPTIMIZED))
    return task


def test_a_jaxbench_directory_is_a_suite_of_tasks_read_without_running_them(tmp_path: Path) -> None:
    task_dir = _workload(tmp_path)
    assert discover_tasks(tmp_path) == [task_dir]  # grouped one level down, as JAXBench groups its workloads
    task = load_task(task_dir)
    assert task.task_id == "gemm_scale_gelu" and task.reference_path.name == "baseline.py"
    assert task.atol == (3e-2,) and task.rtol == (2e-2,)  # CONFIG's tolerance, else bf16's default
    assert "GEMM, a scale and a GELU" in task.description and "M=256" in task.description
    assert task.param_count == 3


def test_the_workload_runs_as_a_reference_with_bf16_inputs_and_its_scalars_static(tmp_path: Path) -> None:
    task = load_task(_workload(tmp_path))
    (config,) = abstract_configurations(task)
    assert [a.describe() for a in config.dynamic] == ["bfloat16[256,512]", "bfloat16[512,256]"]
    assert config.static == (0.5,)
    module = import_reference(task)
    import jax

    out = jax.eval_shape(lambda x, w: module.computation(x, w, 0.5),
                         *[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in config.dynamic])
    assert out.shape == (256, 256)


def test_a_workload_with_a_syntax_error_is_a_clear_task_error(tmp_path: Path) -> None:
    task_dir = tmp_path / "broken"
    task_dir.mkdir()
    (task_dir / "baseline.py").write_text("def workload(x):\n  return x +\n")
    with pytest.raises(TaskError, match="baseline.py:2: syntax error in the workload"):
        load_task(task_dir)


@pytest.mark.slow
def test_jaxbenchs_optimized_kernel_is_evaluated_against_its_baseline(tmp_path: Path, settings: Settings,
                                                                       spares: SparePool) -> None:
    task_dir = _workload(tmp_path)
    result = evaluate(EvalRequest(task_dir, task_dir / "optimized.py", "v6e"), settings, spares=spares)
    assert result.verdict == "ok", result.message
    assert result.performance is not None and result.performance.band is not None
    low, high = result.performance.band
    assert low < result.performance.speedup < high
    assert "likely x" in result.message
