"""The offline brain's families that had no task of their own, each on one written here: a matmul followed by a group
norm (group sums as exact 0/1 matmuls), by an average pool over groups of columns, by a batch norm over its rows
(work no block holds, left to XLA as a tail), an f32 Linear written `x @ w.T` with a ReLU, a sum and a log-sum-exp
over the batch, a gated (SwiGLU) MLP whose later matmuls are XLA's, the linear recurrence scan, and `a.T @ w.T`
read as stored. Each gets an ok kernel from the real evaluator on libtpu, checked on shapes that span several
blocks."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.offline.brain import analyse
from agents.offline.emit import source
from agents.offline.params import choose
from agents.offline.reading import read_tasks
from storage.settings import Settings
from tests.support.reference_tasks import reference_task
from tpu_runner.evaluation import EvalRequest, evaluate_many
from tpu_runner.hardware import get_chip

V6E = get_chip("v6e")

GEMM_INPUTS = '''

def get_inputs():
    k = jax.random.split(jax.random.PRNGKey(3), 4)
    x = jax.random.normal(k[0], (512, 256), jnp.bfloat16)
    w = (jax.random.normal(k[1], (256, 1024)) / 16.0).astype(jnp.bfloat16)
    b = (0.1 * jax.random.normal(k[2], (1024,))).astype(jnp.bfloat16)
    gamma = (1.0 + 0.1 * jax.random.normal(k[3], (1024,))).astype(jnp.bfloat16)
    return [x, w, b, gamma], []
'''

GEMM_GROUP_NORM_SWISH = '''import jax
import jax.numpy as jnp


def computation(x, w, b, gamma):
    h = x @ w + b
    g = h.reshape(h.shape[0], h.shape[1] // 32, 32)
    mean = jnp.mean(g, axis=2, keepdims=True)
    var = jnp.mean(jnp.square(g - mean), axis=2, keepdims=True)
    h = ((g - mean) * jax.lax.rsqrt(var + 1e-5)).reshape(h.shape) * gamma
    return h * jax.nn.sigmoid(h)
''' + GEMM_INPUTS

GEMM_AVG_POOL_MAX = '''import jax
import jax.numpy as jnp


def computation(x, w, b, gamma):
    h = (x @ w + b) * gamma
    h = jax.lax.reduce_window(h, 0.0, jax.lax.add, (1, 8), (1, 8), "VALID") / 8
    return jnp.max(jnp.tanh(h), axis=1)
''' + GEMM_INPUTS

GEMM_BATCH_NORM_RELU = '''import jax
import jax.numpy as jnp


def computation(x, w, b, gamma):
    h = x @ w + b
    mean = jnp.mean(h, axis=0, keepdims=True)
    var = jnp.mean(jnp.square(h - mean), axis=0, keepdims=True)
    return jax.nn.relu((h - mean) * jax.lax.rsqrt(var + 1e-5) * gamma)
''' + GEMM_INPUTS

# PyTorch's Linear as JAX code writes it (the weight (out, in), transposed by .T), in f32: the dot runs as XLA runs
# it on the TPU (bf16 operands), and jax.nn.relu is a custom_jvp call the reference's numerics run goes through.
LINEAR_RELU_SUM_LOGSUMEXP = '''import jax
import jax.numpy as jnp


def computation(x, w, b):
    y = jnp.sum(jax.nn.relu(x @ w.T + b), axis=1, keepdims=True)
    return jax.nn.logsumexp(y, axis=0, keepdims=True)


def get_inputs():
    k = jax.random.split(jax.random.PRNGKey(5), 3)
    x = jax.random.normal(k[0], (512, 256), jnp.float32)
    w = jax.random.normal(k[1], (1024, 256), jnp.float32) / 16.0
    return [x, w, 0.1 * jax.random.normal(k[2], (1024,), jnp.float32)], []
'''

SWIGLU_MLP = '''import jax
import jax.numpy as jnp


def computation(x, w_gate, w_up, w_down):
    return (jax.nn.silu(x @ w_gate) * (x @ w_up)) @ w_down


def get_inputs():
    k = jax.random.split(jax.random.PRNGKey(6), 4)
    x = jax.random.normal(k[0], (256, 256), jnp.bfloat16)
    w_gate, w_up = ((jax.random.normal(key, (256, 512)) / 16.0).astype(jnp.bfloat16) for key in k[1:3])
    return [x, w_gate, w_up, (jax.random.normal(k[3], (512, 256)) / 22.0).astype(jnp.bfloat16)], []
'''

LINEAR_RECURRENCE = '''import jax
import jax.numpy as jnp


def _combine(left, right):
    a1, x1 = left
    a2, x2 = right
    return a1 * a2, a2 * x1 + x2


def computation(a, x):
    return jax.lax.associative_scan(_combine, (a, x), axis=1)[1]


def get_inputs():
    k = jax.random.split(jax.random.PRNGKey(4), 2)
    a = jax.nn.sigmoid(jax.random.normal(k[0], (8, 512, 256), jnp.float32))
    return [a, jax.random.normal(k[1], (8, 512, 256), jnp.float32)], []
'''

# KernelBench's "matmul with transposed A and B" with an epilogue: both operands read as stored, (K, M) and (N, K).
TRANSPOSED_OPERANDS = '''import jax
import jax.numpy as jnp


def computation(a, w, b):
    return jax.nn.relu(a.T @ w.T + b)


def get_inputs():
    k = jax.random.split(jax.random.PRNGKey(7), 3)
    a = jax.random.normal(k[0], (256, 512), jnp.bfloat16)
    w = (jax.random.normal(k[1], (1024, 256)) / 16.0).astype(jnp.bfloat16)
    return [a, w, (0.1 * jax.random.normal(k[2], (1024,))).astype(jnp.bfloat16)], []
'''

CASES = {  # name: (reference, family, what its description says)
    "gemm_group_norm_swish": (GEMM_GROUP_NORM_SWISH, "matmul", "epilogue"),
    "gemm_avg_pool_max": (GEMM_AVG_POOL_MAX, "matmul", "epilogue with row reductions"),
    "gemm_batch_norm_relu": (GEMM_BATCH_NORM_RELU, "matmul", "epilogue"),
    "linear_relu_sum_logsumexp": (LINEAR_RELU_SUM_LOGSUMEXP, "matmul", "epilogue with row reductions"),
    "swiglu_mlp": (SWIGLU_MLP, "matmul", "then XLA's 2 later matmuls"),
    "linear_recurrence": (LINEAR_RECURRENCE, "scan", "linear recurrence"),
    "transposed_operands": (TRANSPOSED_OPERANDS, "matmul", "epilogue"),
}


@pytest.mark.slow
def test_each_family_without_a_suite_task_gets_an_ok_kernel(tmp_path: Path, settings: Settings,
                                                            verdict_settings: Settings) -> None:
    tasks = [reference_task(tmp_path, name, reference, description=name.replace("_", " "), atol=3.0e-2, rtol=3.0e-2)
             for name, (reference, _, _) in CASES.items()]
    readings = read_tasks(tasks, settings)  # one sandboxed child reads them all
    specs = [analyse(readings[t.digest], V6E) for t in tasks]
    assert [s.family for s in specs] == [family for _, family, _ in CASES.values()]
    for spec, (_, _, said) in zip(specs, CASES.values(), strict=True):
        assert said in spec.describe()
    # The batch norm's statistics over rows are the tail, the rest of it stays in the kernel; nothing else has one.
    assert [bool(getattr(s, "tail", ())) for s in specs] == [False, False, True, True, True, False, False]
    assert specs[3].rhs_transposed and specs[3].n == 1024  # the weight read as it is stored, (out, in)
    assert specs[6].lhs_transposed and specs[6].rhs_transposed and (specs[6].m, specs[6].k) == (512, 256)
    assert not any(op.prim == "dot_general" for op in specs[2].tail)
    assert sum(op.prim == "dot_general" for op in specs[4].tail) == 2  # the kernel writes silu(x @ w_gate)
    requests, sources = [], []
    for task, spec in zip(tasks, specs, strict=True):
        kernel = tmp_path / f"{task.task_id}.py"
        kernel.write_text(source(spec, choose(spec, V6E)[0]))
        sources.append(kernel.read_text())
        requests.append(EvalRequest(task.path, kernel, "v6e"))
    # Group statistics and the pool's window sums are computed in the kernel as exact 0/1 matmuls over the groups.
    assert ["_seg_sum(" in code for code in sources] == [True, True, False, False, False, False, False]
    results = evaluate_many(requests, verdict_settings)
    messages = [getattr(r, "message", repr(r)) for r in results]
    assert [getattr(r, "verdict", None) for r in results] == ["ok"] * len(CASES), messages
