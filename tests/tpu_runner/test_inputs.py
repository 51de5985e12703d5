"""Evaluator-owned inputs: shapes and dtypes from the task, values from fixed seeds."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from tpu_runner.tasks import (
    EVALUATOR_CASES,
    LARGE_SCALE,
    ArgSpec,
    Case,
    Configuration,
    abstract_configurations,
    case_inputs,
    config_from_json,
    config_to_json,
    input_bounds,
    load_task,
    with_input_bounds,
)
from tpu_runner.tasks import inputs as inputs_module

CASES = {case.name: case for case in EVALUATOR_CASES}
BF16 = np.dtype(jnp.bfloat16).name


def _one(spec: ArgSpec, case: str = "normal") -> np.ndarray:
    (array,) = case_inputs(Configuration(dynamic=(spec,), static=()), CASES[case])
    return array


def test_the_four_evaluator_cases():
    assert [(c.name, c.distribution) for c in EVALUATOR_CASES] == [
        ("task", "task"), ("normal", "normal"), ("uniform", "uniform"), ("large", "large")]
    assert len({c.seed for c in EVALUATOR_CASES}) == 4


def test_task_case_without_values_is_none():
    config = Configuration(dynamic=(ArgSpec((4,), "float32"),), static=())
    assert case_inputs(config, CASES["task"]) is None


def test_task_case_with_values_returns_copies():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    config = Configuration(dynamic=(ArgSpec((2, 3), "float32"),), static=(), values=(x,))
    (got,) = case_inputs(config, CASES["task"])
    assert np.array_equal(got, x)
    got[0, 0] = 100.0
    assert x[0, 0] == 0.0


@pytest.mark.parametrize("case", ["normal", "uniform", "large"])
def test_integer_args_respect_int_range(case):
    got = _one(ArgSpec((4096,), "int32", (3, 9)), case)
    assert got.dtype == np.int32
    assert got.min() == 3 and got.max() == 9  # both ends are reachable


def test_integer_args_without_a_range_stay_small_and_non_negative():
    got = _one(ArgSpec((4096,), "int8"))
    assert got.dtype == np.int8
    assert got.min() >= 0 and got.max() <= 127
    assert got.max() > 100


def test_bool_args():
    got = _one(ArgSpec((1000,), "bool"))
    assert got.dtype == np.bool_
    assert 300 < got.sum() < 700


def test_uniform_is_within_minus_one_and_one():
    got = _one(ArgSpec((4096,), "float32"), "uniform")
    assert got.min() >= -1.0 and got.max() <= 1.0
    assert got.min() < -0.9 and got.max() > 0.9


def test_large_case_is_scaled():
    spec = ArgSpec((4096,), "float32")
    normal, large = _one(spec, "normal"), _one(spec, "large")
    assert np.std(normal) == pytest.approx(1.0, rel=0.1)
    assert np.std(large) == pytest.approx(LARGE_SCALE, rel=0.1)


def test_same_seed_gives_the_same_arrays():
    specs = (ArgSpec((8, 128), "float32"), ArgSpec((16,), "int32", (0, 7)))
    config = Configuration(dynamic=specs, static=(1,))
    first = case_inputs(config, Case("again", "normal", 42))
    second = case_inputs(config, Case("again", "normal", 42))
    other = case_inputs(config, Case("other", "normal", 43))
    assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))
    assert not np.array_equal(first[0], other[0])


def test_cases_draw_different_values():
    spec = ArgSpec((64,), "float32")
    assert not np.array_equal(_one(spec, "normal"), _one(spec, "uniform"))


@pytest.mark.parametrize("dtype", ["float32", "float16", BF16, "int32", "uint8", "bool"])
def test_dtypes_and_shapes_preserved(dtype):
    got = _one(ArgSpec((2, 3, 5), dtype))
    assert got.shape == (2, 3, 5)
    assert got.dtype.name == dtype


def test_bfloat16_is_the_jax_bfloat16():
    assert BF16 == "bfloat16"
    got = _one(ArgSpec((8,), "bfloat16"), "large")
    assert got.dtype == jnp.bfloat16
    assert np.abs(got.astype(np.float32)).max() > 10.0


def test_one_array_per_dynamic_arg_and_statics_are_not_drawn():
    config = Configuration(dynamic=(ArgSpec((2,), "float32"), ArgSpec((3,), "int32")), static=(1e-5, 4))
    got = case_inputs(config, CASES["uniform"])
    assert [a.shape for a in got] == [(2,), (3,)]


@pytest.mark.parametrize("case", ["normal", "uniform", "large"])
def test_a_nonnegative_input_is_drawn_nonnegative(case: str) -> None:
    got = _one(ArgSpec((4096,), "bfloat16", nonnegative=True), case)
    assert got.astype(np.float32).min() >= 0.0 and got.astype(np.float32).max() > 0.5


def test_small_float_inputs_say_whether_the_tasks_values_are_nonnegative(tmp_path: Path) -> None:
    (tmp_path / "reference.py").write_text(
        "import jax\nimport jax.numpy as jnp\n\n\ndef computation(x, var):\n"
        "    return x * jax.lax.rsqrt(var + 1e-5)\n\n\ndef get_inputs():\n"
        "    k = jax.random.PRNGKey(0)\n"
        "    var = jax.random.uniform(k, (128,), minval=0.5, maxval=1.5).astype(jnp.bfloat16)\n"  # not np.floating
        "    return [jax.random.normal(k, (8, 128)), var], []\n")
    (tmp_path / "kernel_task.yaml").write_text("task_id: nonneg\ndescription: x\natol: 1.0e-3\nrtol: 1.0e-3\n")
    task = load_task(tmp_path)
    config = with_input_bounds(abstract_configurations(task), input_bounds(task))[0]
    assert [a.nonnegative for a in config.dynamic] == [False, True]
    assert config_from_json(config_to_json(config)) == config


@pytest.mark.parametrize("case", ["normal", "uniform", "large"])
def test_a_large_input_is_drawn_without_float64_copies(case, monkeypatch):
    # At production shapes an input can be GiBs (an LM head's weight, 1 GiB in bf16): a float64 draw and its
    # copies took ~7x that at once and stopped evaluations at the memory limit. float32, scaled in place, a chunk
    # at a time into the result.
    import tracemalloc

    spec = ArgSpec((2048, 4096), BF16)
    f32_bytes = 2048 * 4096 * 4
    chunk = 1 << 20  # a quarter of the draw's values: float32 only a chunk at a time
    monkeypatch.setattr(inputs_module, "DRAW_CHUNK", chunk)
    tracemalloc.start()
    try:
        got = _one(spec, case)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got.dtype == np.dtype(BF16)
    assert peak < 0.5 * f32_bytes + 1.1 * chunk * 4  # the bf16 result and one chunk's float32 draw
    values = got.astype(np.float32)
    scale = {"normal": 1.0, "uniform": 1 / np.sqrt(3), "large": LARGE_SCALE}[case]
    assert abs(float(values.std()) / scale - 1) < 0.01 and abs(float(values.mean())) < 0.01 * scale
    if case == "uniform":
        assert values.min() >= -1.0 and values.max() <= 1.0


@pytest.mark.parametrize("case", ["normal", "uniform", "large"])
def test_chunks_draw_the_values_of_one_draw(case, monkeypatch):
    # The reference's outputs are kept per draw (DRAW): drawing chunk by chunk must give the values of one call.
    spec = ArgSpec((3, 1000), BF16)
    whole = _one(spec, case)
    monkeypatch.setattr(inputs_module, "DRAW_CHUNK", 128)  # 3000 elements: 24 chunks, the last one short
    np.testing.assert_array_equal(_one(spec, case), whole)
