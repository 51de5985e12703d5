"""The tail (a reference's last steps as XLA ops in the written module) names its sizes where they come from, so the
module computes the reference's work at shapes other than the one it was read at, where sizes that were equal there
differ."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from agents.offline.program import Op, Value
from agents.offline.tail import tail_lines, wrapper_tail


def _layer_norm_over_the_last_axis() -> tuple[tuple[Op, ...], Value, Value]:
    """out [2, 4, 2] -> (out - mean over the last axis) * 0.5: the batch and the last axis are both 2 here, and 0.5
    is 1 / 2 (a GELU's constant, not a size)."""
    out, weight = Value(1, (2, 4, 2), "float32"), Value(2, (2,), "float32")
    f32 = Value(3, (2, 4, 2), "float32")
    total = Value(4, (2, 4), "float32")
    wide = Value(5, (2, 4, 1), "float32")
    mean = Value(6, (2, 4, 1), "float32")
    centred = Value(7, (2, 4, 2), "float32")
    half = Value(8, (2, 4, 2), "float32")
    scale = Value(9, (1, 1, 2), "float32")
    scaled = Value(10, (2, 4, 2), "float32")
    ops = (Op("convert_element_type", (out,), {"new_dtype": "float32"}, f32),
           Op("reduce_sum", (f32,), {"axes": (2,)}, total),
           Op("broadcast_in_dim", (total,), {"shape": (2, 4, 1), "broadcast_dimensions": (0, 1)}, wide),
           Op("div", (wide, 2.0), {}, mean),
           Op("sub", (f32, mean), {}, centred),
           Op("mul", (centred, 0.5), {}, half),
           Op("broadcast_in_dim", (weight,), {"shape": (1, 1, 2), "broadcast_dimensions": (2,)}, scale),
           Op("mul", (half, scale), {}, scaled))
    return ops, out, weight


def test_sizes_are_named_by_the_axes_they_come_from() -> None:
    ops, out, weight = _layer_norm_over_the_last_axis()
    lines, result = wrapper_tail(ops, out, (weight,), ((1, "1"), (2, "batch"), (4, "c_out")))
    text = "\n".join(lines)
    assert "float(out.shape[2])" in text  # the mean's divisor: the count its sum reduced, not `batch`
    assert "* 0.5)" in text and "1.0 / batch" not in text  # a constant stays a constant
    assert "(out.shape[0], out.shape[1], 1, )" in text and "(1, 1, a0.shape[0], )" in text
    # Run at another shape, where the batch is 3, the channels 5 and the last axis 6: the reference's work.
    x = np.random.default_rng(0).standard_normal((3, 5, 6)).astype(np.float32)
    w = np.arange(6, dtype=np.float32)
    scope = {"out": jnp.asarray(x), "a0": jnp.asarray(w), "batch": 3, "c_out": 5, "jnp": jnp, "lax": lax}
    for line in lines:
        exec(line, scope)  # noqa: S102 - the module's own lines, as the written kernel runs them
    want = (x - x.mean(axis=2, keepdims=True)) * 0.5 * w
    np.testing.assert_allclose(np.asarray(scope[result]), want, rtol=1e-5, atol=1e-5)


def test_a_size_with_no_source_is_named_by_its_value() -> None:
    """An iota's shape has no operand to take its sizes from: the wrapper's own size of that value names it."""
    iota = Op("iota", (), {"dtype": np.int32, "shape": (4, 2), "dimension": 0, "sharding": None},
              Value(11, (4, 2), "int32"))
    lines, _ = tail_lines((iota,), {}, {4: "m"})
    assert lines == ["t11 = lax.broadcasted_iota(jnp.int32, (m, 2, ), 0)"]
