"""A convolution ported from PyTorch in channels-last form - NCHW transposed to NHWC, convolved with dimension numbers
("NHWC", "HWOI", "NHWC") - in the jaxpr
((0, 3, 1, 2), (2, 3, 0, 1), (0, 3, 1, 2)) - and transposed back - is the NCHW convolution the family writes: the
transposes compose to nothing, and the real evaluator finds the kernel ok."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.offline.brain import analyse
from agents.offline.emit import source
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
