"""The offline self-debugger answers each kind of evaluator error with a repair of that kind, moves on to the next
repair when one did not help, says what it changed, and a kernel broken the way the evaluator reports is ok again
after its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents import subagents, tunable
from agents.offline.brain import offline_brain
from agents.offline.debugger import CannotRepair, conform, repair
from agents.offline.emit import source
from agents.offline.params import choose
from agents.offline.program import Value
from agents.task_context import task_context
from storage.settings import Settings
from tpu_runner.evaluation import EvalRequest, evaluate_many
from tpu_runner.hardware import get_chip
from tpu_runner.tasks import load_task

V6E = get_chip("v6e")
KERNEL = '''import jax.numpy as jnp

TUNABLE = {
    "BLOCK_M": (128, 256, 512),
    "VMEM_LIMIT_BYTES": (16777216, 33554432, 67108864),
    "ACC_DTYPE": ("float32", "bfloat16"),
    "FUSE_EPILOGUE": (True, False),
    "ELEMENTWISE_DTYPES": ("reference", "float32"),
}
BLOCK_M = 512
VMEM_LIMIT_BYTES = 16777216
ACC_DTYPE = 'bfloat16'
FUSE_EPILOGUE = True
ELEMENTWISE_DTYPES = 'reference'


def computation(a0, a1, s0):
    return jnp.sum(a0 @ a1, axis=-1)
'''
INPUTS = [Value(1, (256, 512), "bfloat16"), Value(2, (512, 384), "bfloat16")]
OUTPUT = Value(9, (256, 1), "float32")


def _prompt(stage: str, kind: str, detail: str = "details") -> str:
    return f"The evaluator rejected this candidate in the {stage} stage ({kind}):\n{detail}\n"


def test_a_wrong_shape_or_dtype_is_conformed_to_the_references_at_any_size() -> None:
    fixed, what = repair(KERNEL, _prompt("correctness", "shape_mismatch"), OUTPUT, INPUTS, V6E.vmem_bytes)
    assert "reshaped to [256, 1] and cast to float32" in what
    assert "jnp.reshape(out, (a0.shape[0], 1, )).astype(jnp.float32)" in fixed  # the rows follow the input
    namespace: dict = {}
    exec(compile(fixed, "fixed", "exec"), namespace)  # noqa: S102 - our own module, checked it runs
    import numpy as np

    out = namespace["computation"](np.ones((8, 4), np.float32), np.ones((4, 3), np.float32), 0)
    assert out.shape == (8, 1) and out.dtype == np.float32 and float(out[0, 0]) == 12.0
    # Already conformed: the next repair of a shape error is smaller blocks.
    again, what = repair(fixed, _prompt("correctness", "dtype_mismatch"), OUTPUT, INPUTS, V6E.vmem_bytes)
    assert "smaller blocks" in what and tunable.current(again)["BLOCK_M"] == 256
    with pytest.raises(CannotRepair):
        conform(fixed, OUTPUT, INPUTS)


def test_wrong_values_get_f32_work_then_an_f32_accumulator_then_xla_for_the_epilogue() -> None:
    code, seen = KERNEL, []
    for _ in range(4):
        code, what = repair(code, _prompt("correctness", "mismatch"), OUTPUT, INPUTS, V6E.vmem_bytes)
        seen.append(what.split(": ", 1)[1])
    assert seen == ["the elementwise work computed in f32.", "the running sum kept in f32.",
                    "the epilogue left to XLA after the kernel.", "smaller blocks."]
    assert tunable.current(code) == {"BLOCK_M": 256, "VMEM_LIMIT_BYTES": 33554432, "ACC_DTYPE": "float32",
                                     "FUSE_EPILOGUE": False, "ELEMENTWISE_DTYPES": "float32"}


def test_vmem_a_partial_output_and_a_refused_block_have_their_own_repairs() -> None:
    oom = _prompt("compile", "vmem_oom", "Scoped allocation with size 30.00M and limit 16.00M")
    fixed, what = repair(KERNEL, oom, OUTPUT, INPUTS, V6E.vmem_bytes)
    assert "VMEM limit raised" in what and tunable.current(fixed)["VMEM_LIMIT_BYTES"] == 33554432
    # libtpu's words compiling a row-wise kernel for v5e at a 64 MiB limit (60 and 65 MiB compiled it).
    idle = _prompt("compile", "vmem_oom", "Ran out of memory in memory space vmem. Used 131.74M of 128.00M vmem.\n"
                   "Program vmem requirement 131.74M:\n    scoped            3.74M\n    HLO temp        128.00M "
                   "(0.0% utilization: Unpadded (0B) Padded (0B), 100.0% fragmentation (128.00M))")
    at_32 = tunable.with_params(KERNEL, {"VMEM_LIMIT_BYTES": 33554432})
    fixed, what = repair(at_32, idle, OUTPUT, INPUTS, V6E.vmem_bytes)
    assert "next declared VMEM limit" in what
    assert tunable.current(fixed) == {**tunable.current(at_32), "VMEM_LIMIT_BYTES": 67108864}  # the blocks kept
    top = tunable.with_params(KERNEL, {"VMEM_LIMIT_BYTES": 67108864})  # no larger value declared: the next one down
    assert tunable.current(repair(top, idle, OUTPUT, INPUTS, V6E.vmem_bytes)[0])["VMEM_LIMIT_BYTES"] == 33554432
    for kind in ("partial_output", "block_shape", "nan"):
        fixed, what = repair(KERNEL if kind != "nan" else tunable.with_params(
            KERNEL, {"ELEMENTWISE_DTYPES": "float32", "ACC_DTYPE": "float32", "FUSE_EPILOGUE": False}),
            _prompt("lower", kind), OUTPUT, INPUTS, V6E.vmem_bytes)
        assert kind in what and "smaller blocks" in what
    smallest = tunable.with_params(KERNEL, {"BLOCK_M": 128})
    with pytest.raises(CannotRepair, match="no repair left for this kernel's block_shape"):
        repair(smallest, _prompt("lower", "block_shape"), OUTPUT, INPUTS, V6E.vmem_bytes)


KEPT_SUM = """import jax
import jax.numpy as jnp


def computation(x):
    return jnp.sum(jnp.tanh(x), axis=-1, keepdims=True)


def get_inputs():
    return [jax.random.normal(jax.random.PRNGKey(0), (512, 1024), jnp.float32)], []
"""


@pytest.mark.slow
def test_a_kernel_that_lost_the_kept_dimension_is_ok_after_the_offline_fix(tmp_path: Path,
                                                                          settings: Settings) -> None:
    task_dir = tmp_path / "kept_sum"
    task_dir.mkdir()
    (task_dir / "reference.py").write_text(KEPT_SUM)
    (task_dir / "kernel_task.yaml").write_text("task_id: kept_sum\ndescription: a kept row sum\n"
                                               "atol: 1.0e-3\nrtol: 1.0e-3\n")
    task = load_task(task_dir)
    brain = offline_brain(task, V6E, settings)
    good = source(brain.spec, choose(brain.spec, V6E)[0])
    broken = good.replace(".reshape(main[:-1] + (1,))", ".reshape(main[:-1])")
    assert broken != good
    (tmp_path / "broken.py").write_text(broken)
    rejected = evaluate_many([EvalRequest(task.path, tmp_path / "broken.py", "v6e")], settings)[0]
    assert rejected.verdict == "incorrect" and rejected.error.kind == "shape_mismatch", rejected.message
    fixed = subagents.self_debug(brain, task_context(task, V6E, settings), broken, rejected.error)
    (tmp_path / "fixed.py").write_text(fixed)
    result = evaluate_many([EvalRequest(task.path, tmp_path / "fixed.py", "v6e")], settings)[0]
    assert result.verdict == "ok", result.message
