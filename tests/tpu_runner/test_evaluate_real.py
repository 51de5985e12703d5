"""The evaluator on real work: JAX's own hand-optimised Pallas TPU kernels get `ok` at the shapes they are built
for, and the tricks that hide behind the production size get the verdict they deserve.

`tests/corpus/real/` wraps the kernels shipped in `jax.experimental.pallas.ops.tpu` (see its README); each runs
against a task of `tasks/` at production shapes of real models.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from storage.settings import Settings
from tests.conftest import CORPUS, TASKS
from tpu_runner.candidate import SparePool
from tpu_runner.evaluation import EvalRequest, evaluate_many
from tpu_runner.evaluation.evaluate import evaluate
from tpu_runner.reports import EvalResult

REAL = {
    "flash_attention_causal": "causal_attention",
    "splash_gqa_attention": "gqa_attention",
    "splash_causal_gqa_attention": "causal_gqa_attention",
    "paged_attention_decode": "paged_attention_decode",
    "megablox_gmm": "grouped_matmul",
    "matmul_tuned": "matmul_bf16",
    "ragged_paged_attention": "ragged_paged_attention",
}
# TPU interpret mode cannot simulate this one (it loads from a reshaped VMEM ref): only a TPU can check it.
NOT_SIMULATED = {"ragged_paged_attention"}


@pytest.fixture(scope="module")
def real_results(verdict_settings: Settings) -> dict[str, EvalResult]:
    requests = [EvalRequest(TASKS / task, CORPUS / "real" / f"{name}.py", "v6e") for name, task in REAL.items()]
    results = evaluate_many(requests, verdict_settings, workers=2)  # verdicts and an estimate: no static profile
    out = {}
    for name, result in zip(REAL, results, strict=True):
        assert isinstance(result, EvalResult), f"{name}: {result!r}"
        out[name] = result
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in REAL if n not in NOT_SIMULATED])
def test_a_real_kernel_is_ok_and_says_which_shapes_were_checked(real_results: dict[str, EvalResult],
                                                                 name: str) -> None:
    result = real_results[name]
    assert result.verdict == "ok", result.message
    assert result.correctness is not None and result.correctness.status == "passed"
    assert sum(c.status == "passed" for c in result.correctness.cases) >= 3
    checked = [n for n in result.notes if n.startswith(("production[", "test[", "derived["))]
    assert checked and "checked" in checked[0], result.notes
    assert result.performance is not None and result.performance.speedup > 0


@pytest.mark.slow
def test_a_kernel_interpret_mode_cannot_simulate_is_unverified_not_incorrect(
        real_results: dict[str, EvalResult]) -> None:
    result = real_results["ragged_paged_attention"]
    assert result.verdict == "unverified", result.message
    assert result.correctness is not None and result.correctness.status == "not_checked"
    assert any("interpret mode cannot simulate" in n for n in result.correctness.notes), result.correctness.notes
    assert result.performance is not None  # still compiled and estimated


@pytest.mark.slow
def test_fixed_blocks_larger_than_the_test_shapes_are_checked_where_they_fit(verdict_settings: Settings,
                                                                            spares: SparePool) -> None:
    # The verdict and the shapes checked only: no static cycle profile of the 4096-sized program.
    result = evaluate(EvalRequest(TASKS / "matmul_bf16", CORPUS / "bad" / "fixed_large_blocks.py", "v6e"),
                      verdict_settings, spares=spares)
    assert result.verdict == "ok", result.message
    assert all(c.name.startswith("derived[0]") for c in result.correctness.cases)
    derived = next(n for n in result.notes if n.startswith("derived[0]"))
    assert "bfloat16[1024,1024], bfloat16[1024,2048]" in derived  # every block fits, and no more
    assert any("get_test_inputs() (bfloat16[256,1024], bfloat16[1024,512]) cannot check" in n for n in result.notes)


@pytest.mark.slow
def test_a_kernel_that_branches_on_the_input_size_is_unverified_naming_the_difference(settings: Settings,
                                                                                     spares: SparePool) -> None:
    result = evaluate(EvalRequest(TASKS / "softmax", CORPUS / "bad" / "size_branch.py", "v6e"), settings, spares=spares)
    assert result.verdict == "unverified", result.message
    assert result.correctness is not None and result.correctness.status == "not_checked"
    differs = " ".join(result.correctness.notes)
    assert "the program checked is not the program timed" in differs
    assert "reduce_max" in differs and "exp" in differs  # the step the production body skips


BF16_SOFTMAX_REFERENCE = '''
import jax
import jax.numpy as jnp


def computation(x):
  return jax.nn.softmax(x.astype(jnp.float32), axis=-1).astype(x.dtype)


def get_inputs():
  return [jax.random.normal(jax.random.PRNGKey(0), (2048, 2048), jnp.bfloat16)], []
'''


@pytest.mark.slow
def test_a_bf16_softmax_the_static_profiler_aborts_on_is_not_a_compile_error(tmp_path: Path, settings: Settings,
                                                                             spares: SparePool) -> None:
    """libtpu's static profiler aborts on the kernel's bf16 arithmetic for v6e; libtpu compiles it, so it is
    evaluated like any other kernel, with the estimate made without cycles and saying so."""
    task = tmp_path / "softmax_bf16"
    task.mkdir()
    (task / "reference.py").write_text(textwrap.dedent(BF16_SOFTMAX_REFERENCE))
    (task / "kernel_task.yaml").write_text("task_id: softmax_bf16\ndescription: bf16 softmax\natol: 2.0e-2\n"
                                           "rtol: 2.0e-2\n")
    result = evaluate(EvalRequest(task, CORPUS / "bad" / "bf16_math_softmax.py", "v6e"), settings, spares=spares)
    assert result.verdict == "ok", result.message
    perf = result.performance
    # Its kernel has no cycles: estimated from the task's FLOPs and its BlockSpec traffic, and said so.
    assert perf is not None and "from FLOPs and bytes" in perf.detail["cycle_model"].split("; ")[0]
    note = next(n for n in perf.detail["notes"] if "candidate's program" in n)
    assert "static profiler aborted" in note and "BlockSpec traffic" in note
