"""A convolution ported from PyTorch in channels-last form - NCHW transposed to NHWC, convolved with dimension numbers
("NHWC", "HWOI", "NHWC") - in the jaxpr
((0, 3, 1, 2), (2, 3, 0, 1), (0, 3, 1, 2)) - and transposed back - is the NCHW convolution the family writes: the
transposes compose to nothing, and the real evaluator finds the kernel ok."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.offline.brain import analyse
from agents.offline.emit import source
from agents.offline.expr import NotRecognised
from agents.offline.layout import canonical_convolutions
from agents.offline.params import choose
from agents.offline.program import Op, Program, Value
from agents.offline.reading import read_task
from storage.settings import Settings
from tests.support.reference_tasks import reference_task
from tpu_runner.evaluation import EvalRequest, evaluate_many
from tpu_runner.hardware import get_chip

V6E = get_chip("v6e")

CHANNELS_LAST_PORT = '''import jax
import jax.numpy as jnp


def computation(x, w, b):
    y = jax.lax.conv_general_dilated(jnp.transpose(x, (0, 2, 3, 1)), jnp.transpose(w, (2, 3, 0, 1)), (1, 1),
                                     ((1, 1), (1, 1)), dimension_numbers=("NHWC", "HWOI", "NHWC"))
    y = jnp.transpose(y, (0, 3, 1, 2))
    return jax.nn.relu(y + b[None, :, None, None])


def get_inputs():
    k = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(k[0], (4, 16, 40, 40), jnp.bfloat16)
    w = (jax.random.normal(k[1], (32, 16, 3, 3)) / 12.0).astype(jnp.bfloat16)
    b = (0.1 * jax.random.normal(k[2], (32,))).astype(jnp.bfloat16)
    return [x, w, b], []
'''


def test_a_convolution_of_a_transposed_image_reads_the_image() -> None:
    x, w = Value(1, (2, 3, 8), "float32"), Value(2, (5, 3, 1), "float32")  # N C W, O I W
    nwc = Op("transpose", (x,), {"permutation": (0, 2, 1)}, Value(3, (2, 8, 3), "float32"))
    conv = Op("conv_general_dilated", (nwc.out, w), {"dimension_numbers": ((0, 2, 1), (0, 1, 2), (0, 1, 2))},
              Value(4, (2, 5, 8), "float32"))
    relu = Op("max", (conv.out, 0.0), {}, Value(5, (2, 5, 8), "float32"))
    program = Program(inputs=[x, w], ops=[nwc, conv, relu], outputs=[relu.out])
    done = canonical_convolutions(program)
    assert [op.prim for op in done.ops] == ["conv_general_dilated", "max"]
    assert done.ops[0].args[:2] == (x, w) and done.ops[0].params["dimension_numbers"] == ((0, 1, 2),) * 3
    assert done.ops[1].args[0] == conv.out  # the result keeps its id: its users read it as before
    assert canonical_convolutions(done) is done  # nothing left to do


@pytest.mark.slow
def test_a_channels_last_port_gets_the_convolution_kernel(tmp_path: Path, settings: Settings,
                                                          verdict_settings: Settings) -> None:
    task = reference_task(tmp_path, "conv_channels_last", CHANNELS_LAST_PORT, description="a convolution",
                          atol=3.0e-2, rtol=3.0e-2)
    spec = analyse(read_task(task, settings), V6E)
    assert spec.family == "convolution"
    kernel = tmp_path / "kernel.py"
    kernel.write_text(source(spec, choose(spec, V6E)[0]))
    result = evaluate_many([EvalRequest(task.path, kernel, "v6e")], verdict_settings)[0]
    assert getattr(result, "verdict", None) == "ok", getattr(result, "message", result)


DILATED_BY_HAND = '''import jax
import jax.numpy as jnp


def computation(x, w):
    n, c, h, wd = x.shape
    dilated = jnp.zeros((n, c, 2 * h - 1, 2 * wd - 1), x.dtype).at[:, :, ::2, ::2].set(x)
    rhs = jnp.flip(w, axis=(2, 3)).transpose(1, 0, 2, 3)
    y = jax.lax.conv_general_dilated(dilated, rhs, (1, 1), [(2, 2), (2, 2)],
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"))
    return jax.nn.gelu(y)


def get_inputs():
    k = jax.random.split(jax.random.key(0), 2)
    x = jax.random.normal(k[0], (2, 8, 12, 16), jnp.bfloat16)
    w = (jax.random.normal(k[1], (8, 16, 4, 4)) / 8.0).astype(jnp.bfloat16)
    return [x, w], []
'''


@pytest.mark.slow
def test_a_transposed_convolution_over_an_input_dilated_by_hand_reads_the_scatter_as_a_pad(
        tmp_path: Path, settings: Settings, verdict_settings: Settings) -> None:
    """benchmarks/measured/28k's form: the input scattered into zeros at every second position, then a dense
    convolution with the flipped, in/out-swapped kernel. The scatter is the lax.pad with interior padding it is
    (what the convolution family reads, computing the output phases of that dilation), and the kernel is ok; a
    scatter at positions that are not strided stays a prologue."""
    task = reference_task(tmp_path, "dilated", DILATED_BY_HAND, description="by hand")
    spec = analyse(read_task(task, settings), V6E)
    assert spec.family == "convolution", spec
    text = source(spec, choose(spec, V6E)[0])
    # the scatter's dilation and the convolution's padding as one, computed as the 4 output phases
    assert "x, w = _stride_phases(x, w, ((2, 2, 24), (2, 2, 32)))" in text
    kernel = tmp_path / "dilated_kernel.py"
    kernel.write_text(text)
    [result] = evaluate_many([EvalRequest(task.path, kernel, "v6e")], verdict_settings)
    assert result.verdict == "ok", result.message
    uneven = DILATED_BY_HAND.replace(".at[:, :, ::2, ::2].set(x)", ".at[:, :, jnp.array([0, 3, 4, 6, 8, 10, 12, 14, "
                                     "16, 18, 20, 22]), ::2].set(x)")
    task = reference_task(tmp_path, "uneven", uneven, description="not strided")
    with pytest.raises(NotRecognised, match="scatter: a prologue"):
        analyse(read_task(task, settings), V6E)
