"""The offline brain: families recognised by structure, kernels the evaluator calls ok, plans with reasons,
redirects in its vocabulary, and a clear refusal for what it does not know."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agents import subagents, tunable
from agents.brain import Budget
from agents.brains import BrainUnavailable, make_brain
from agents.offline.brain import analyse, offline_brain, parse_redirect
from agents.offline.emit import source
from agents.offline.expr import NotRecognised
from agents.offline.families import Spec
from agents.offline.params import choose, raised_vmem_limit
from agents.offline.reading import read_task, read_tasks
from agents.plan_parameters import plan_parameters, without_parameters
from agents.task_context import task_context
from storage.settings import Settings
from tests.conftest import TASKS
from tests.support.epilogue_tasks import EPILOGUE, chain_task
from tests.support.reference_tasks import reference_task
from tpu_runner.candidate import SparePool
from tpu_runner.evaluation import EvalRequest, evaluate_many
from tpu_runner.evaluation.evaluate import evaluate
from tpu_runner.hardware import get_chip
from tpu_runner.tasks import Task, load_task

V6E = get_chip("v6e")
RECOGNISED = ["fused_elementwise", "softmax", "layer_norm", "rms_norm", "matmul_bf16", "matmul_bias_gelu",
              "matmul_softmax", "batched_matmul", "causal_attention", "gqa_attention", "cumsum_rows", "cross_entropy",
              "grouped_matmul"]


def _analyse(task, settings: Settings):  # the task's program is read in a sandboxed child, as a runner does
    return analyse(read_task(task, settings), V6E)


def _write(tmp: Path, name: str, code: str) -> Path:
    path = tmp / f"{name}.py"
    path.write_text(code)
    return path


@pytest.mark.slow
def test_every_recognised_suite_task_gets_an_ok_kernel(tmp_path: Path, settings: Settings,
                                                       verdict_settings: Settings) -> None:
    requests = []
    tasks = [load_task(TASKS / name) for name in RECOGNISED]
    readings = read_tasks(tasks, settings)  # one child reads them all
    for name, task in zip(RECOGNISED, tasks, strict=True):
        spec = analyse(readings[task.digest], V6E)
        requests.append(EvalRequest(task.path, _write(tmp_path, name, source(spec, choose(spec, V6E)[0])), "v6e"))
    results = evaluate_many(requests, verdict_settings)
    verdicts = {name: getattr(r, "message", repr(r)) for name, r in zip(RECOGNISED, results, strict=True)}
    assert all(getattr(r, "verdict", None) == "ok" for r in results), verdicts
    # Without the static profile (KERNELBOT_STATIC_PROFILE=off) each estimate says what it went on without.
    assert all(any("the static profile is off (KERNELBOT_STATIC_PROFILE=off)" in n for n in r.notes) for r in results)


@pytest.mark.parametrize("name, what", [("conv1d_depthwise", "neither per element")])
def test_a_reference_outside_the_families_gets_a_clear_message(name: str, what: str, settings: Settings) -> None:
    with pytest.raises(NotRecognised) as raised:
        _analyse(load_task(TASKS / name), settings)
    assert what in str(raised.value)


FAKE_ATTENTION = """import jax
import jax.numpy as jnp


def computation(q, k, v):
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) * 0.125
    p = PROBABILITIES
    return jnp.einsum("bhqk,bhkd->bhqd", p, v)


def _inputs(seed):
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(seed), 3)
    shape = (1, 2, 256, 64)
    return [jax.random.normal(kq, shape), jax.random.normal(kk, shape), jax.random.normal(kv, shape)], []


def get_inputs():
    return _inputs(0)


def get_test_inputs():
    return _inputs(1)
"""


@pytest.mark.parametrize("probabilities, why", [
    ("jax.nn.softmax(s, axis=-2)", "does not contract the keys"),  # over the queries: refused by its structure
    ("jax.nn.softmax(s, axis=-1) * 2.0", "looks like attention .* but does not compute it"),  # by its numbers
])
def test_something_that_only_looks_like_attention_is_refused(probabilities: str, why: str, tmp_path: Path,
                                                             settings: Settings) -> None:
    (tmp_path / "reference.py").write_text(FAKE_ATTENTION.replace("PROBABILITIES", probabilities))
    (tmp_path / "kernel_task.yaml").write_text("task_id: fake\ndescription: not attention\natol: 1.0e-3\n"
                                               "rtol: 1.0e-3\n")
    with pytest.raises(NotRecognised, match=why):
        _analyse(load_task(tmp_path), settings)


def test_make_brain_says_which_families_it_writes(settings: Settings) -> None:
    task = load_task(TASKS / "conv1d_depthwise")
    with pytest.raises(BrainUnavailable,
                       match="cannot write a kernel for conv1d_depthwise.*matmul.*convolutions.*scans"):
        make_brain("offline", settings, Budget(), task=task, chip=V6E)


def test_plans_have_the_fixed_sections_reasons_and_revisions(settings: Settings) -> None:
    task = load_task(TASKS / "matmul_bias_gelu")
    brain = offline_brain(task, V6E, settings)
    ctx = task_context(task, V6E, settings)
    plan = subagents.plan(brain, ctx)  # parsed strictly: every section present
    assert "arithmetic intensity" in plan.sections["analysis"] and "ridge point" in plan.sections["analysis"]
    assert "Parameters:" in plan.sections["tiling and memory"]
    code = subagents.implement(brain, ctx, plan)
    assert tunable.current(code)["BLOCK_M"] == choose(brain.spec, V6E)[0]["BLOCK_M"]  # type: ignore[arg-type]
    revised = subagents.plan(brain, ctx, previous="ok: x0.9 vs reference")
    assert revised.sections["tiling and memory"] != plan.sections["tiling and memory"]


def test_a_redirect_is_applied_and_what_was_not_understood_is_said(settings: Settings) -> None:
    task = load_task(TASKS / "softmax")
    brain = offline_brain(task, V6E, settings)
    ctx = task_context(task, V6E, settings)
    plan = subagents.plan(brain, ctx, redirect="rows 64, vmem 32 MiB, make it sing")
    impact = plan.sections["expected impact"]
    assert "BLOCK_ROWS = 64" in impact and "VMEM_LIMIT_BYTES = 33554432" in impact
    assert "Not understood: 'make it sing'" in impact
    code = subagents.implement(brain, ctx, plan)
    assert tunable.current(code)["BLOCK_ROWS"] == 64


def test_a_plans_parameters_line_reads_back_as_the_kernel_gets_them_and_leaves_a_readable_plan(
        settings: Settings) -> None:
    task = load_task(TASKS / "matmul_bias_gelu")
    brain = offline_brain(task, V6E, settings)
    ctx = task_context(task, V6E, settings)
    plan = subagents.plan(brain, ctx, redirect="vmem 32, single buffering")
    params = plan_parameters(plan.render())
    assert params is not None and params["VMEM_LIMIT_BYTES"] == 32 * 2**20 and params["BUFFERS"] == 1
    current = tunable.current(subagents.implement(brain, ctx, plan))
    assert {k: current[k] for k in params} == params
    shown = without_parameters(plan.render())
    assert "Parameters:" not in shown and plan_parameters(shown) is None
    assert subagents.parse_plan(shown).sections["risks"] == plan.sections["risks"]  # every section still there
    assert plan_parameters("Parameters: {not json}") is None and plan_parameters("Parameters: [1, 2]") is None


def test_redirect_vocabulary() -> None:
    space = {"BLOCK_M": (128, 256, 512), "BLOCK_N": (128, 256, 512), "BLOCK_K": (256, 512),
             "VMEM_LIMIT_BYTES": (2**25, 2**26)}
    params = {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 512, "VMEM_LIMIT_BYTES": 2**26}
    out, done, unknown = parse_redirect("block 512x128; block_k 256 and smaller blocks, use cuda", params, space)
    assert out["BLOCK_N"] == 128 and out["BLOCK_M"] == 256 and out["BLOCK_K"] == 256  # 512 -> 256 after "smaller"
    assert unknown == ["use cuda"] and len(done) == 4


# --- property test: random epilogue chains after a matmul ------------------------------------------------------

@pytest.mark.slow
def test_random_epilogue_chains_get_ok_or_a_clear_refusal(tmp_path: Path, settings: Settings,
                                                          verdict_settings: Settings) -> None:
    rng = random.Random(20261130)
    shapes = [(256, 512, 384), (200, 384, 640), (512, 256, 1000), (136, 128, 256)]  # multiples and not
    requests, chains, tasks = [], [], []
    for i, (m, k, n) in enumerate(shapes):
        chain = rng.sample(sorted(EPILOGUE), rng.randint(1, 5))
        dtype = "bfloat16" if i % 2 else "float32"
        tasks.append((chain, dtype, load_task(chain_task(tmp_path, f"chain{i}", chain, dtype, m, k, n))))
    readings = read_tasks([task for _, _, task in tasks], settings)  # one child reads them all
    for i, ((m, k, n), (chain, dtype, task)) in enumerate(zip(shapes, tasks, strict=True)):
        spec = analyse(readings[task.digest], V6E)
        # Half of them with the epilogue outside the kernel, one with single-buffered inputs.
        params = {**choose(spec, V6E)[0], "FUSE_EPILOGUE": i % 2 == 0, "BUFFERS": 1 if i == 2 else 2}
        requests.append(EvalRequest(task.path, _write(tmp_path, f"k{i}", source(spec, params)), "v6e"))
        chains.append((chain, dtype, (m, k, n), params))
    results = evaluate_many(requests, verdict_settings)
    failures = [(c, getattr(r, "message", repr(r))) for c, r in zip(chains, results, strict=True)
                if getattr(r, "verdict", None) != "ok"]
    assert not failures, failures


def test_the_epilogue_fusion_and_accumulation_are_parameters_a_person_can_redirect(settings: Settings) -> None:
    task = load_task(TASKS / "matmul_bias_gelu")
    brain = offline_brain(task, V6E, settings)
    ctx = task_context(task, V6E, settings)
    plan = subagents.plan(brain, ctx, redirect="no epilogue fusion, single buffering, bf16 accumulation")
    impact = plan.sections["expected impact"]
    assert "FUSE_EPILOGUE = False" in impact and "BUFFERS = 1" in impact
    assert "bf16 accumulation (this kernel has no ACC_DTYPE = 'bfloat16')" in impact  # f32 operands
    code = subagents.implement(brain, ctx, plan)
    assert tunable.current(code)["FUSE_EPILOGUE"] is False
    assert "GFLOP" in plan.sections["analysis"] and "compute-bound" in plan.sections["analysis"]


def _one_input_task(tmp: Path, name: str, expression: str, shape: tuple[int, int]) -> Task:
    """A task computing `expression` of one f32 input x of `shape`."""
    return reference_task(tmp, name, "import jax\nimport jax.numpy as jnp\n\n\ndef computation(x):\n"
                          f"    return {expression}\n\n\ndef get_inputs():\n"
                          f"    return [jax.random.normal(jax.random.key(0), {shape}, jnp.float32)], []\n",
                          description=name.replace("_", " "), atol=1e-3, rtol=1e-3)


def _first_kernel_result(tmp: Path, task: Task, spec: Spec, settings: Settings) -> object:
    kernel = _write(tmp, task.task_id, source(spec, choose(spec, V6E)[0]))
    (result,) = evaluate_many([EvalRequest(task.path, kernel, "v6e")], settings)
    return result


def test_a_row_reduction_that_keeps_its_dimension_gets_the_reference_s_shape(tmp_path: Path, settings: Settings
                                                                             ) -> None:
    """sum(..., keepdims=True), as torch.sum(x, dim=-1, keepdim=True) ports: one value per row, still 2-D."""
    task = _one_input_task(tmp_path, "keepdims_sum", "jnp.sum(jnp.exp(x), axis=-1, keepdims=True)", (256, 512))
    result = _first_kernel_result(tmp_path, task, _analyse(task, settings), settings)
    assert getattr(result, "verdict", None) == "ok", getattr(result, "message", result)


def test_a_suffix_sum_written_with_flips_is_the_reverse_scan(tmp_path: Path, settings: Settings) -> None:
    """flip(cumsum(flip(x))), as KernelBench's reverse cumsum ports: the scan kernel run backwards, not a refusal of
    the flips; scaled after, so the work around it still fuses."""
    task = _one_input_task(tmp_path, "reverse_cumsum", "0.5 * jnp.flip(jnp.cumsum(jnp.flip(x, 1), axis=1), 1)",
                           (64, 1024))
    spec = _analyse(task, settings)
    assert spec.family == "scan" and spec.reverse and "reverse prefix sum" in spec.describe()
    result = _first_kernel_result(tmp_path, task, spec, settings)
    assert getattr(result, "verdict", None) == "ok", getattr(result, "message", result)


# --- the self-debugger on a scoped-VMEM overflow ----------------------------------------------------------------

OOM = ("RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom: Ran out of memory in memory space vmem while allocating "
       "on stack for %computation.1 = f32[4096,4096]. Scoped allocation with size 68.00M and limit 64.00M exceeded "
       "scoped vmem limit by 4.00M.")


def test_the_limit_is_raised_to_the_smallest_declared_value_that_holds_what_the_compiler_needs() -> None:
    space = {"BLOCK_M": (512, 1024), "VMEM_LIMIT_BYTES": (16 * 2**20, 64 * 2**20, 100 * 2**20, 120 * 2**20)}
    params = {"BLOCK_M": 1024, "VMEM_LIMIT_BYTES": 64 * 2**20}
    assert raised_vmem_limit(params, space, OOM, V6E.vmem_bytes) == {"BLOCK_M": 1024, "VMEM_LIMIT_BYTES": 100 * 2**20}
    assert raised_vmem_limit(params, space, OOM, 90 * 2**20) is None  # a chip with less VMEM: shrink instead
    assert raised_vmem_limit(params, space, OOM.replace("68.00M", "130.00M"), V6E.vmem_bytes) is None
    assert raised_vmem_limit(params, space, "vmem_oom: no sizes named", V6E.vmem_bytes) is None
    assert raised_vmem_limit(params, {"BLOCK_M": (512, 1024)}, OOM, V6E.vmem_bytes) is None  # no such tunable


@pytest.mark.slow
def test_a_tile_that_only_lacked_scoped_vmem_keeps_its_size_and_gets_the_limit(tmp_path: Path, settings: Settings,
                                                                               verdict_settings: Settings,
                                                                               spares: SparePool) -> None:
    """What the demo's search ran into on matmul_softmax (BLOCK_M 1024 needing 68 MiB under a 64 MiB limit), at a
    size that compiles quickly: 1024x512 @ 512x2048 with 512-row tiles under a 16 MiB limit needs about 22 MiB.
    The offline self-debugger raises the limit rather than shrink the tile, and the kernel is ok."""
    reference = (TASKS / "matmul_softmax" / "reference.py").read_text()
    task_dir = tmp_path / "small_matmul_softmax"
    task_dir.mkdir()
    (task_dir / "reference.py").write_text(reference.replace("M, K, N = 4096, 2048, 4096", "M, K, N = 1024, 512, 2048"))
    yaml = (TASKS / "matmul_softmax" / "kernel_task.yaml").read_text()
    (task_dir / "kernel_task.yaml").write_text(yaml.replace("task_id: matmul_softmax", f"task_id: {task_dir.name}"))
    task = load_task(task_dir)
    brain = offline_brain(task, V6E, settings)
    ctx = task_context(task, V6E, settings)
    code = subagents.implement(brain, ctx, subagents.plan(brain, ctx))
    tight = {**tunable.current(code), "BLOCK_M": 512, "VMEM_LIMIT_BYTES": 16 * 2**20}
    rejected = evaluate(EvalRequest(task.path, _write(tmp_path, "tight", tunable.with_params(code, tight)), "v6e"),
                        verdict_settings, spares=spares)
    assert (rejected.verdict, rejected.error and rejected.error.kind) == ("compile_error", "vmem_oom"), rejected.message
    fixed = subagents.self_debug(brain, ctx, tunable.with_params(code, tight), rejected.error)
    assert tunable.current(fixed) == {**tight, "VMEM_LIMIT_BYTES": 32 * 2**20}
    result = evaluate(EvalRequest(task.path, _write(tmp_path, "fixed", fixed), "v6e"), verdict_settings, spares=spares)
    assert result.verdict == "ok", result.message
