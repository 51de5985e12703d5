"""KernelBench-style JAX modules as they are: one file with `class Model`, `get_inputs()` and
`get_init_inputs()` is a task, and a `ModelNew` in the same form is a candidate evaluated against it."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.settings import Settings
from tests.conftest import CORPUS
from tpu_runner.candidate import StaticViolation, check_source
from tpu_runner.evaluation import EvalRequest, evaluate_many
from tpu_runner.tasks import discover_tasks, load_task

KB = CORPUS / "kernelbench"
TASK = KB / "suite" / "19_Gemm_ReLU.py"


def test_a_module_is_a_task_and_a_suite_lists_it(tmp_path: Path) -> None:
    task = load_task(TASK)
    assert task.task_id == "19_Gemm_ReLU" and task.is_module and task.reference_path == TASK
    assert task.param_count == 2 and "linear layer" in task.description
    (tmp_path / "dir_task").mkdir()
    (tmp_path / "dir_task" / "kernel_task.yaml").write_text("task_id: t\natol: 0.1\nrtol: 0.1\n")
    (tmp_path / "notes.py").write_text("x = 1\n")  # a module that is not a task
    (tmp_path / "20_copy.py").write_text(TASK.read_text())
    assert [p.name for p in discover_tasks(tmp_path)] == ["20_copy.py", "dir_task"]
    assert discover_tasks(KB / "suite") == [TASK]


def test_a_model_new_is_checked_like_any_candidate() -> None:
    source = (KB / "gemm_relu_new.py").read_text()
    assert check_source(source, expected_params=2, allow_pure_jax=False).entry_point_params == 2
    with pytest.raises(StaticViolation, match="forward takes|computation takes"):
        check_source(source, expected_params=3, allow_pure_jax=False)
    with pytest.raises(StaticViolation) as missing:
        check_source(source.replace("def forward(", "def run("), expected_params=2, allow_pure_jax=False)
    assert missing.value.error.kind == "missing_entry_point"


@pytest.mark.slow
def test_a_kernelbench_pair_is_evaluated_as_it_is(settings: Settings) -> None:
    requests = [EvalRequest(TASK, KB / f"{name}.py", "v6e") for name in ("gemm_relu_new", "gemm_relu_other_weights")]
    good, other = evaluate_many(requests, settings, workers=2)
    assert not isinstance(good, Exception) and good.verdict == "ok", good
    assert good.correctness is not None and good.correctness.cases[0].name.startswith("production[0]/")
    assert not isinstance(other, Exception) and other.verdict == "incorrect", other
    assert other.error is not None and other.error.kind == "mismatch"


def test_the_budget_counts_the_work_that_runs_not_what_xla_folds() -> None:
    """A model's fixed weights multiplied together are constants XLA folds away: their matmul is no work of the
    program, and would otherwise push a small task past the interpret-mode budget."""
    import jax
    import jax.numpy as jnp

    from tpu_runner.checking import dot_flops

    w1, w2 = jnp.ones((512, 512)), jnp.ones((512, 512))
    folded = jax.make_jaxpr(lambda x: x @ (w1 @ w2))(jnp.ones((64, 512)))
    assert dot_flops(folded) == 2 * 64 * 512 * 512
    nested = jax.make_jaxpr(jax.jit(lambda x, y: jnp.tanh(x @ y) @ y))(jnp.ones((64, 512)), jnp.ones((512, 512)))
    assert dot_flops(nested) == 2 * 2 * 64 * 512 * 512
