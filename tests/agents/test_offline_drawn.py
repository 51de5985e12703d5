"""References that make arrays themselves (weights drawn with new-style `jax.random` keys inside the computation, a
table closed over): the offline brain reads them once, its kernel takes them as inputs, and its wrapper makes them
as the reference does (a draw of jax.random and the ops on it) or carries them; the real evaluator finds the kernels
ok. Arrays that differ between the reference's configurations are made for each; arrays too large to carry and
not drawn again are refused with what to do instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.offline.brain import OfflineBrain, analyse
from agents.offline.expr import NotRecognised
from agents.offline.params import choose
from agents.offline.reading import read_tasks
from storage.settings import Settings
from tests.support.reference_tasks import reference_task
from tpu_runner.evaluation import EvalRequest, evaluate_many
from tpu_runner.hardware import get_chip

V6E = get_chip("v6e")

# The scale is drawn at the width of x: a different array for each configuration.
RMS_NORM_DRAWN_SCALE = '''import jax
import jax.numpy as jnp


def computation(x, eps):
    scale = 1.0 + 0.1 * jax.random.normal(jax.random.key(7), (x.shape[-1],), jnp.float32)
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps) * scale
    return y.astype(x.dtype)


def get_inputs():
    return [jax.random.normal(jax.random.key(0), (512, 256), jnp.bfloat16)], [1e-6]


def get_test_inputs():
    return [jax.random.normal(jax.random.key(1), (64, 128), jnp.bfloat16)], [1e-6]
'''

# The weight and bias have fixed shapes: one set serves every number of rows. The bias is a table closed over.
LINEAR_DRAWN_WEIGHT = '''import jax
import jax.numpy as jnp
import numpy as np

BIAS = np.linspace(-0.5, 0.5, 128, dtype=np.float32)


def computation(x):
    kw, _ = jax.random.split(jax.random.key(3))
    w = jax.random.uniform(kw, (256, 128), jnp.float32, -1.0, 1.0) / 16.0
    return jax.nn.relu(x @ w + BIAS)


def get_inputs():
    return [jax.random.normal(jax.random.key(0), (512, 256), jnp.float32)], []
'''

TOO_LARGE = '''import jax
import jax.numpy as jnp


def computation(x):
    return x @ jax.random.truncated_normal(jax.random.key(3), -2.0, 2.0, (1024, 1024), jnp.float32)


def get_inputs():
    return [jax.random.normal(jax.random.key(0), (256, 1024), jnp.float32)], []
'''


@pytest.mark.slow
def test_arrays_the_reference_draws_itself_travel_with_the_kernel(tmp_path: Path, settings: Settings,
                                                                 verdict_settings: Settings) -> None:
    rms = reference_task(tmp_path, "rms_norm_drawn_scale", RMS_NORM_DRAWN_SCALE, description="rms norm")
    linear = reference_task(tmp_path, "linear_drawn_weight", LINEAR_DRAWN_WEIGHT, description="linear relu",
                            atol=3.0e-2, rtol=3.0e-2)
    large = reference_task(tmp_path, "too_large", TOO_LARGE, description="matmul")
    readings = read_tasks([rms, linear], settings)
    assert [a.shape for a in readings[rms.digest].programs[0].drawn] == [(1, 256)]  # broadcast ahead of use
    assert [a.shape for a in readings[linear.digest].programs[0].drawn] == [(128,), (256, 128)]  # table first
    assert [d.fn for d in readings[linear.digest].programs[0].draws.values()] == ["uniform"]
    with pytest.raises(NotRecognised, match="MiB of arrays itself.*pass them to the reference as inputs"):
        read_tasks([large], settings)

    requests, sources = [], []
    for task in (rms, linear):
        reading = readings[task.digest]
        brain = OfflineBrain(task=task, chip=V6E, reading=reading, spec=analyse(reading, V6E))
        assert brain.spec is not None
        code = brain.source(choose(brain.spec, V6E)[0])
        sources.append(code)
        kernel = tmp_path / f"{task.task_id}.py"
        kernel.write_text(code)
        requests.append(EvalRequest(task.path, kernel, "v6e"))
    # Made for each configuration where they differ, once where they do not; drawn again, or carried (the table).
    assert "(((512, 256),), (1e-06,))" in sources[0] and "(((64, 128),), (1e-06,))" in sources[0]
    assert "jax.random.normal(jax.random.wrap_key_data(" in sources[0] and "_carried('" not in sources[0]
    assert "key = repr(" not in sources[1] and "jax.random.uniform(" in sources[1]
    assert "_carried('float32', (128,)" in sources[1]
    assert brain.spec.family == "matmul"
    results = evaluate_many(requests, verdict_settings)
    messages = [getattr(r, "message", repr(r)) for r in results]
    assert [getattr(r, "verdict", None) for r in results] == ["ok", "ok"], messages
    # Checked where it counts: the rms kernel at its production shape, against the reference's own draw there.
    assert any(c.name.startswith("production") for c in results[0].correctness.cases), messages
