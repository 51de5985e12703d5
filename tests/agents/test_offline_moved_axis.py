"""Row-wise work along an axis other than the last (KernelBench's reductions over dim 1, a softmax or an RMS norm over
NCHW's channels): the program read with that axis moved last, the kernel reading the reference's own layout and
transposing in VMEM; and along several trailing axes (an instance norm over H and W, a layer norm over C, H and W):
those axes merged into one. Each gets an ok kernel from the real evaluator on libtpu; a program that would need more
than that keeps the refusal it had."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.offline.brain import analyse
from agents.offline.emit import source
from agents.offline.expr import NotRecognised
from agents.offline.params import choose
from agents.offline.reading import read_task, read_tasks
from storage.settings import Settings
from tests.support.reference_tasks import reference_task
from tpu_runner.evaluation import EvalRequest, evaluate_many
from tpu_runner.hardware import get_chip

V5E = get_chip("v5e")


def _reference(body: str, inputs: str) -> str:
    return (f"import jax\nimport jax.numpy as jnp\n\n\ndef computation(x, g):\n    {body}\n\n\n"
            f"def get_inputs():\n    k = jax.random.split(jax.random.key(2), 2)\n    return [{inputs}], []\n")


X4 = "jax.random.normal(k[0], (2, 64, 16, 32), jnp.float32), 1 + 0.1 * jax.random.normal(k[1], (64,))"
X3 = "jax.random.normal(k[0], (4, 256, 384), jnp.bfloat16), jax.random.normal(k[1], (1,))"
X2 = "jax.random.normal(k[0], (512, 384), jnp.float32), jax.random.normal(k[1], (1,))"
XCHW = "jax.random.normal(k[0], (2, 64, 16, 32), jnp.float32), 1 + 0.1 * jax.random.normal(k[1], (64, 16, 32))"
NORM = "(x - jnp.mean(x, axis={a}, keepdims=True)) * jax.lax.rsqrt(jnp.var(x, axis={a}, keepdims=True) + 1e-5)"
CASES = {  # name: (body, inputs, the axis moved, the first axis merged, the output's kind)
    "sum_over_dim1": ("return jnp.sum(x, axis=1, keepdims=True) * g[0]", X3, 1, None, "row"),
    "softmax_over_channels": ("return jax.nn.softmax(x, axis=1) * g[None, :, None, None]", X4, 1, None, "full"),
    "rms_norm_over_channels": ("return x * jax.lax.rsqrt(jnp.mean(x * x, axis=1, keepdims=True) + 1e-5)"
                               " * g[None, :, None, None]", X4, 1, None, "full"),
    "column_max": ("return jnp.max(x * g[0], axis=0)", X2, 0, None, "row"),
    "instance_norm": ("return " + NORM.format(a="(2, 3)") + " * g[0]", X3.replace("(4, 256, 384)", "(2, 8, 16, 32)"),
                      None, 2, "full"),
    "layer_norm_chw": ("return " + NORM.format(a="(1, 2, 3)") + " * g", XCHW, None, 1, "full"),
}


@pytest.mark.slow
def test_reductions_along_another_axis_get_ok_kernels(tmp_path: Path, settings: Settings) -> None:
    tasks = [reference_task(tmp_path, name, _reference(body, inputs), description=name.replace("_", " "),
                            atol=1e-2, rtol=1e-2) for name, (body, inputs, _, _, _) in CASES.items()]
    readings = read_tasks(tasks, settings)  # one sandboxed child reads them all
    specs = [analyse(readings[t.digest], V5E) for t in tasks]
    assert [(s.family, s.moved_axis, s.merged_from, s.out_kind) for s in specs] == [
        ("rowwise", moved, merged, kind) for _, _, moved, merged, kind in CASES.values()]
    requests = []
    for task, spec in zip(tasks, specs, strict=True):
        params, reasons = choose(spec, V5E)
        said = "transposed in VMEM" if spec.moved_axis is not None else "merged into one"
        assert any(said in r for r in reasons)
        kernel = tmp_path / f"{task.task_id}.py"
        kernel.write_text(source(spec, params))
        # The reference's layout read as stored, no transpose in HBM.
        assert ("_rows(" in kernel.read_text()) == (spec.moved_axis is not None)
        requests.append(EvalRequest(task.path, kernel, "v5e"))
    results = evaluate_many(requests, settings)
    assert [getattr(r, "verdict", None) for r in results] == ["ok"] * len(CASES), [
        getattr(r, "message", repr(r)) for r in results]


def test_a_reduction_that_needs_more_than_moving_its_axis_keeps_its_refusal(tmp_path: Path,
                                                                             settings: Settings) -> None:
    # The reduced axis is merged with another by a reshape first: no permutation describes that.
    task = reference_task(tmp_path, "merged", _reference(
        "return jnp.sum(x.reshape(2, 64 * 16, 32), axis=1) * g[0]", X4.replace("(64,)", "(1,)")),
        description="merged axes")
    with pytest.raises(NotRecognised, match="reduces over axes"):
        analyse(read_task(task, settings), V5E)
