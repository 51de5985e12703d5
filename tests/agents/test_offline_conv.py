"""The offline brain's convolution family on its own tasks: an ok kernel for a padded 2-D convolution with an
instance norm after it, a 3-D one with a global pool, one writing rows a lane tile wide, a transposed one (input
dilation, flipped and swapped kernel), a strided one (a stride-1 convolution of its space-to-depth image) and one
whose max pool and normalisation over channels XLA finishes (a tail), each checked and timed by the real evaluator
on libtpu."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.offline.brain import analyse
from agents.offline.conv import writes_planes
from agents.offline.emit import source
from agents.offline.expr import NotRecognised
from agents.offline.params import choose
from agents.offline.reading import read_task, read_tasks
from storage.settings import Settings
from tests.support.reference_tasks import reference_task
from tpu_runner.evaluation import EvalRequest, evaluate_many
from tpu_runner.hardware import get_chip
from tpu_runner.tasks import Task

V6E = get_chip("v6e")


def _task(root: Path, name: str, reference: str) -> Task:
    return reference_task(root, name, reference, description="a convolution")

CONV2D_INSTANCE_NORM = '''import jax
import jax.numpy as jnp


def computation(x, w, b, gamma, beta):
    # PyTorch's Conv2d(padding=1), as a port writes it
    y = jax.lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW"))
    y = y + b[None, :, None, None]
    mean = jnp.mean(y, axis=(2, 3), keepdims=True)
    var = jnp.mean(jnp.square(y - mean), axis=(2, 3), keepdims=True)
    y = (y - mean) * jax.lax.rsqrt(var + 1e-5)
    return y * gamma[None, :, None, None] + beta[None, :, None, None]


def get_inputs():
    k = jax.random.split(jax.random.PRNGKey(0), 5)
    x = jax.random.normal(k[0], (4, 16, 40, 40), jnp.bfloat16)
    w = (jax.random.normal(k[1], (32, 16, 3, 3)) / 12.0).astype(jnp.bfloat16)
    b, gamma, beta = tuple((0.1 * jax.random.normal(key, (32,))).astype(jnp.bfloat16) for key in k[2:])
    return [x, w, b, 1.0 + gamma, beta], []
'''

CONV3D_GELU_POOL = '''import jax
import jax.numpy as jnp


def computation(x, w, b):
    y = jax.lax.conv_general_dilated(x, w, (1, 1, 1), "VALID",
                                     dimension_numbers=("NCDHW", "OIDHW", "NCDHW"))
    y = jax.nn.gelu(y + b[None, :, None, None, None])
    return jnp.mean(y, axis=(2, 3, 4))


def get_inputs():
    k = jax.random.split(jax.random.PRNGKey(1), 3)
    x = jax.random.normal(k[0], (2, 8, 10, 20, 20), jnp.float32)
    w = jax.random.normal(k[1], (16, 8, 3, 3, 3), jnp.float32) / 15.0
    return [x, w, 0.1 * jax.random.normal(k[2], (16,), jnp.float32)], []
'''

# Rows a lane tile long: the kernel writes (N, C, H_out, W_out) itself, with no crop by XLA.
CONV2D_MISH_WIDE_ROWS = '''import jax
import jax.numpy as jnp


def computation(x, w, b):
    y = jax.lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW"))
    y = y + b[None, :, None, None]
    return jnp.tanh(y * jnp.tanh(jax.nn.softplus(y)))


def get_inputs():
    k = jax.random.split(jax.random.PRNGKey(2), 3)
    x = jax.random.normal(k[0], (2, 8, 34, 128), jnp.bfloat16)
    w = (jax.random.normal(k[1], (16, 8, 3, 3)) / 9.0).astype(jnp.bfloat16)
    return [x, w, (0.1 * jax.random.normal(k[2], (16,))).astype(jnp.bfloat16)], []
'''

# PyTorch's ConvTranspose2d(16, 24, 4, stride=2, padding=1) + bias + ReLU: lax.conv_transpose dilates the input
# and flips the kernel (its weights in PyTorch's (in, out, kH, kW) layout).
# Its phases' rows are 126 + 2 = 128 wide: the kernel writes them as planes.
CONV_TRANSPOSE_RELU = '''import jax
import jax.numpy as jnp


def computation(x, w, b):
    y = jax.lax.conv_transpose(x, w, (2, 2), ((2, 2), (2, 2)), dimension_numbers=("NCHW", "OIHW", "NCHW"),
                               transpose_kernel=True)
    return jax.nn.relu(y + b[None, :, None, None])


def get_inputs():
    k = jax.random.split(jax.random.PRNGKey(3), 3)
    x = jax.random.normal(k[0], (2, 16, 12, 126), jnp.float32)
    w = jax.random.normal(k[1], (16, 24, 4, 4), jnp.float32) / 8.0
    return [x, w, 0.1 * jax.random.normal(k[2], (24,), jnp.float32)], []
'''

# Stride 2 with padding 1 over an odd-sized image: the phases cut it unevenly, the kernel's 3 taps pad to 4.
STRIDED_CONV_GELU = '''import jax
import jax.numpy as jnp


def computation(x, w, b):
    y = jax.lax.conv_general_dilated(x, w, (2, 2), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW"))
    return jax.nn.gelu(y + b[None, :, None, None])


def get_inputs():
    k = jax.random.split(jax.random.PRNGKey(4), 3)
    return [jax.random.normal(k[0], (4, 16, 33, 40), jnp.float32), jax.random.normal(k[1], (32, 16, 3, 3)) / 12,
            jax.random.normal(k[2], (32,))], []
'''

# A 2 x 2 max pool, then a norm over the channels (jnp.var): work no channel block holds, XLA's after the kernel.
CONV_MAXPOOL_CHANNEL_NORM = '''import jax
import jax.numpy as jnp


def computation(x, w, b):
    y = jax.lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW"))
    y = jnp.tanh(y + b[None, :, None, None])
    p = jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
    return (p - jnp.mean(p, axis=1, keepdims=True)) / jnp.sqrt(jnp.var(p, axis=1, keepdims=True) + 1e-5)


def get_inputs():
    k = jax.random.split(jax.random.PRNGKey(5), 3)
    x = jax.random.normal(k[0], (4, 16, 34, 34), jnp.bfloat16)
    w = (jax.random.normal(k[1], (32, 16, 3, 3)) / 12.0).astype(jnp.bfloat16)
    return [x, w, (0.1 * jax.random.normal(k[2], (32,))).astype(jnp.bfloat16)], []
'''

DILATED_KERNEL = '''import jax
import jax.numpy as jnp


def computation(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "VALID", rhs_dilation=(2, 2),
                                        dimension_numbers=("NCHW", "OIHW", "NCHW"))


def get_inputs():
    return [jnp.ones((2, 8, 32, 32), jnp.bfloat16), jnp.ones((16, 8, 3, 3), jnp.bfloat16)], []
'''


@pytest.mark.slow
def test_convolutions_get_ok_kernels(tmp_path: Path, settings: Settings, verdict_settings: Settings) -> None:
    tasks = [_task(tmp_path, "conv2d_instance_norm", CONV2D_INSTANCE_NORM),
             _task(tmp_path, "conv3d_gelu_pool", CONV3D_GELU_POOL),
             _task(tmp_path, "conv2d_mish_wide_rows", CONV2D_MISH_WIDE_ROWS),
             _task(tmp_path, "conv_transpose_relu", CONV_TRANSPOSE_RELU),
             _task(tmp_path, "strided_conv_gelu", STRIDED_CONV_GELU),
             _task(tmp_path, "conv_maxpool_channel_norm", CONV_MAXPOOL_CHANNEL_NORM)]
    readings = read_tasks(tasks, settings)
    specs = [analyse(readings[t.digest], V6E) for t in tasks]
    assert [s.family for s in specs] == ["convolution"] * 6
    assert [writes_planes(s) for s in specs] == [False, False, True, True, False, False]
    assert [bool(s.tail) for s in specs] == [False] * 5 + [True]
    assert specs[5].tail[0].prim == "reduce_window_max" and "XLA ops on whole arrays" in specs[5].describe()
    assert "per-plane statistics" in specs[0].describe() and "global pool" in specs[1].describe()
    assert "padded to this" in specs[0].describe() and "input dilation 2x2" in specs[3].describe()
    # The transposed one's 4 output phases of 12 x 12 as channel groups of a stride-1 3 x 3 convolution of the
    # undilated image padded by one (not the dense 4 x 4 one over the 27 x 27 dilated image: 4x the MXU work)
    assert (specs[3].in_spatial, specs[3].window, specs[3].c_out) == ((14, 128), (3, 3), 4 * 24)
    assert specs[3].phases == ((2, 2, 24), (2, 2, 252)) and not specs[3].x_pads
    # 35 x 42 padded, 17 x 20 outputs: four phases of 16 channels, 2 x 2 taps, an 18 x 21 image
    assert (specs[4].c_in, specs[4].window, specs[4].in_spatial) == (64, (2, 2), (18, 21))
    # Planes whose blocks end in 126-wide rows: a v5e's plan says what their writes cost there (a rate measured on
    # that chip, `untiled_dma_bandwidth`); a v6e's, where none is measured, says nothing of it
    untiled = "not whole (16, 128) tiles of bfloat16: v5e moves such blocks at ~"
    assert any(untiled in line for line in choose(specs[2], get_chip("v5e"))[1])
    assert not any("not whole (" in line for line in choose(specs[2], V6E)[1] + choose(specs[1], get_chip("v5e"))[1])
    plan = choose(specs[1], V6E)[1]
    assert any("rounded to bf16 for the MXU with f32 accumulation" in line for line in plan)  # XLA's default
    requests = []
    for task, spec in zip(tasks, specs, strict=True):
        kernel = tmp_path / f"{task.task_id}.py"
        kernel.write_text(source(spec, choose(spec, V6E)[0]))
        requests.append(EvalRequest(task.path, kernel, "v6e"))
    results = evaluate_many(requests, verdict_settings)
    messages = [getattr(r, "message", repr(r)) for r in results]
    assert [getattr(r, "verdict", None) for r in results] == ["ok"] * 6, messages


def test_a_dilated_kernel_is_refused_with_the_reason(tmp_path: Path, settings: Settings) -> None:
    task = _task(tmp_path, "dilated", DILATED_KERNEL)
    with pytest.raises(NotRecognised, match="kernel dilation"):
        analyse(read_task(task, settings), V6E)
